"""The weights phase: the evolved harness distilled into LoRA weights that run under the seed
harness, by imitation and by on-policy distillation; the adapter with the higher dev mean is kept."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from harnessrl.improve.record import Cell, ImproveState, adapter_model, cell, decide, release, running, stage_runner

if TYPE_CHECKING:
    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.improve.harness import EvolvedHarness
    from harnessrl.results import CollectFacts, DistillFacts


class KeptWeights(TypedDict):
    """The weights phase's result, as improve.json's `weights` holds it: the variant kept (base,
    imitation or on-policy), its adapter folder under OUT (None for the base weights) and its model."""

    variant: str
    adapter: str | None
    model: str


def weights_phase(state: ImproveState, base: Cell, evolved: EvolvedHarness) -> KeptWeights:
    """The kept adapter, or the base weights when there is nothing to distil; `base` is the seed
    harness with the base weights on the dev tasks (harness/seed-dev)."""
    c = state.config
    if evolved.is_seed:
        decide(
            state,
            "weights.choice",
            "weights",
            "base",
            {"reason": "the evolved harness is the seed harness: there is no harness behaviour to distil"},
        )
        return KeptWeights(variant="base", adapter=None, model=c.model)
    from harnessrl.jobs.stages import NothingToDistil

    # the collection and imitation stages (`harnessrl.jobs.stages`), rooted at OUT/weights (its stages.json there)
    imitation = stage_runner(
        state, state.out.resolve() / "weights", str(state.out.resolve() / "harness" / "evolved.yaml")
    )
    variants: dict[str, dict[str, Any]] = {}
    steps = c.distill_steps
    reason: str | None = None
    collect: CollectFacts | None = None
    release(state)
    try:
        collect = imitation.collect(evolved.spec)
        sft = imitation.sft("sft")
        imitation.sft("placebo")
    except NothingToDistil as e:  # nothing to imitate: recorded, the on-policy variant goes on alone
        reason = str(e)
    else:
        steps = int(sft.steps or 0)
        variants["imitation"] = {"adapter": "weights/sft/adapter", "steps": steps}
        variants["placebo"] = {"adapter": "weights/placebo/adapter", "steps": steps}
    finally:
        imitation.release()
    decide(
        state,
        "weights.imitation",
        "weights",
        "skip" if reason else "train",
        {
            "collector": c.collect_model or c.model,
            **{k: getattr(collect, k, None) for k in ("episodes", "passed", "passed_tasks")},
            "reason": reason,
            "steps": steps,
            "folder": "weights/collect",
        },
    )
    from harnessrl.train.distill import DistillError, check_protocols

    try:
        check_protocols(state.seed_spec, evolved.spec)
    except DistillError as e:  # an edit changed the protocol: the teacher cannot read the student's replies
        decide(state, "weights.on_policy", "weights", "skip", {"reason": str(e)})
    else:
        _distill(state, "weights/distill", evolved.spec, steps)
        variants["on-policy"] = {"adapter": "weights/distill/adapter", "steps": steps}
    from harnessrl.jobs.study_analysis import verdict
    from harnessrl.metrics import paired_difference

    evidence: dict[str, Any] = {"base": {"folder": "harness/seed-dev", **base.record}}
    cells: dict[str, Cell] = {}
    for name, v in variants.items():
        cells[name] = measured = cell(
            state, f"weights/dev-{name}", "dev", state.dev_tasks, state.seed_spec, adapter_model(state, v["adapter"])
        )
        diff = paired_difference(base.scores, measured.scores, seed=c.seed)
        evidence[name] = {
            "folder": measured.folder,
            "adapter": v["adapter"],
            "steps": v["steps"],
            **measured.record,
            "vs_base": {**diff.model_dump(), "verdict": verdict(diff)},
        }
    candidates = [n for n in ("imitation", "on-policy") if n in variants]
    if not candidates:
        decide(state, "weights.choice", "weights", "base", {**evidence, "reason": "neither variant could be trained"})
        return KeptWeights(variant="base", adapter=None, model=c.model)
    if len(candidates) == 2:
        diff = paired_difference(cells["imitation"].scores, cells["on-policy"].scores)
        evidence["on_policy_vs_imitation"] = {**diff.model_dump(), "verdict": verdict(diff)}
    means = {n: cells[n].record["mean_score"] or 0.0 for n in candidates}
    # the higher dev mean; a tie keeps on-policy distillation (trained on the student's own states)
    choice = max(candidates, key=lambda n: (means[n], n == "on-policy"))
    evidence["rule"] = "the higher dev mean score under the seed harness; a tie keeps on-policy"
    decide(state, "weights.choice", "weights", choice, evidence)
    adapter = variants[choice]["adapter"]
    return KeptWeights(variant=choice, adapter=adapter, model=adapter_model(state, adapter))


def _distill(state: ImproveState, stage: str, evolved: HarnessSpec, steps: int) -> DistillFacts:
    """On-policy distillation (`train distill`) of the evolved harness into the seed harness, as
    the stage OUT/`stage` (read when it finished)."""
    from harnessrl.kernel import enter
    from harnessrl.results import DistillFacts, TrainResult
    from harnessrl.train.config import DistillConfig
    from harnessrl.train.distill import DistillError, run_distill

    runner = running(state)
    if stage in runner.stages:
        return DistillFacts.model_validate(runner.stages[stage])
    c = state.config
    config = DistillConfig(
        teacher_harness=evolved.name,
        student_harness=state.seed_spec.name,
        model=c.model,
        device=c.device,
        dtype=state.dtype,
        suite=c.suite,
        steps=steps,
        tasks_per_step=c.distill_tasks_per_step,
        attempts=c.attempts,
        temperature=c.temperature,
        lr=c.lr,
        seed=c.seed,
        max_in_flight=c.max_in_flight,
        retries=c.retries,
    )

    def train(path: Path, resume: bool) -> TrainResult:
        objects = {"suite": state.suite, "teacher_harness": evolved, "student_harness": state.seed_spec}
        return run_distill(
            enter(
                "train distill", config, path, resume=resume, error=DistillError, objects=objects,
                progress=state.progress, console=state.console,
            )
        )  # fmt: skip

    def facts(summary: TrainResult) -> DistillFacts:
        return DistillFacts(steps=summary.steps, final_kl=summary.last.get("kl"))

    what = f"on-policy distillation, {steps} steps"
    return runner.trained(stage, what, train, DistillError, facts, DistillFacts)
