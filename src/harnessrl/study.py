"""The harness x weights study as one resumable job: `Study(StudyConfig(...), out).run()`.

The question it answers: of what an evolved harness gains, what belongs in the harness (it fixes
process failures at run time), what can be trained into the weights (content the model learns
from the evolved harness's passing episodes), and what does not distil (gains that vanish when
the weights trained on them run under the seed harness again).

    seed-eval   the seed harness on dev tasks (context for the reader; --seed-eval-tasks 0 skips it)
    evolve      `run_evolve` from the seed harness (skipped with --evolved SPEC): its best spec
                is the evolved harness
    collect     the evolved harness on TRAIN tasks with the base model, --collect-attempts per
                task (rejection sampling: SFT keeps the passing episodes)
    sft         `run_sft` on those episodes re-rendered into the SEED harness: the distilled adapter
    placebo     the same with the final answers shuffled across tasks: the placebo adapter
    cells       TEST tasks x --attempts in 5 cells: {seed, evolved} x {base, distilled} and
                seed x placebo
    study.json  the cells, paired differences by task, failure-class effects, the recommendation

Every stage is a run folder of its own under OUT (OUT/seed-eval, OUT/evolve, OUT/collect, OUT/sft,
OUT/placebo, OUT/cells/<cell>); the evaluation stages are ordinary evaluation run folders
(`harnessrl summary`, `report`, `triage` read them). OUT/config.json holds the study's
configuration (and the harness specs it resolved), OUT/stages.json the stages that finished.
`--resume` skips finished stages and resumes the interrupted one with its own resume; a changed
configuration is refused, except that --collect-tasks and --collect-attempts may grow while no
adapter has been trained (the way out when nothing passed on the train tasks), and that with
--evolved the evolution's options are not recorded (they play no part).
"""

from __future__ import annotations

import gc
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import Field, model_validator

from harnessrl.config import Device, FloatDtype, Options, cli
from harnessrl.rundir import RunFolder, RunFolderError, holds_run, write_json

STUDY_JSON = "study.json"
STAGES_JSON = "stages.json"

# cell -> (harness side, weights)
CELLS: dict[str, tuple[str, str]] = {
    "seed-base": ("seed", "base"),
    "evolved-base": ("evolved", "base"),
    "seed-distilled": ("seed", "distilled"),
    "evolved-distilled": ("evolved", "distilled"),
    "seed-placebo": ("seed", "placebo"),
}
# name -> (cell a, cell b): every difference is b - a, paired by task
COMPARISONS: dict[str, tuple[str, str]] = {
    "distilled_vs_base_under_seed": ("seed-base", "seed-distilled"),
    "evolved_vs_seed_under_base": ("seed-base", "evolved-base"),
    "placebo_vs_base_under_seed": ("seed-base", "seed-placebo"),
    "evolved_distilled_vs_seed_base": ("seed-base", "evolved-distilled"),
    "distilled_vs_placebo_under_seed": ("seed-placebo", "seed-distilled"),
}
# how the text of the recommendation names them
LABELS: dict[str, str] = {
    "distilled_vs_base_under_seed": "distilled vs base weights, under the seed harness",
    "evolved_vs_seed_under_base": "evolved vs seed harness, with the base weights",
    "placebo_vs_base_under_seed": "placebo vs base weights, under the seed harness",
    "evolved_distilled_vs_seed_base": "evolved harness + distilled weights vs seed harness + base weights",
    "distilled_vs_placebo_under_seed": "distilled vs placebo weights, under the seed harness",
}
# The options only the evolution stage uses.
EVOLVE_OPTIONS = ("dev_tasks", "rollouts", "iterations", "candidates")
# Keys of the study's configuration that may grow on --resume while no adapter has been trained.
GROWABLE = ("collect_tasks", "collect_attempts")

# A factory for tests and embedding: (stage, model spec) -> the policy to run that evaluation
# stage with, or None to load the model spec as usual. Stages: seed-eval, collect, cells/<cell>.
PolicyFactory = Callable[[str, str], Optional[Any]]


class StudyError(ValueError):
    """A study cannot go on as asked (bad options, a refused resume, nothing to distil); the CLI
    exits 2 with the message."""


class StudyConfig(Options):
    """`harnessrl study`: every option, declared once (OUT/config.json records them)."""

    suite: str = Field("toolcalc", description="suite: dev tasks evolve, train tasks are distilled, test tasks judge")
    seed_harness: str = Field("react", description="built-in harness name or spec path to start from")
    evolved: Optional[str] = Field(
        None,
        description="the evolved harness (name or spec path): skips the evolution (default: evolve the seed)",
    )
    model: str = Field(
        "smollm2-135m", description="the base model (a local one, it is fine-tuned): tiny-random, smollm2-135m, hf:PATH"
    )
    device: Device = "auto"
    dtype: FloatDtype = "auto"
    seed_eval_tasks: int = Field(4, ge=0, description="first N dev tasks the seed harness is evaluated on (0 = skip)")
    dev_tasks: int = Field(4, ge=2, description="evolve: first N dev tasks (decision tasks)")
    rollouts: int = Field(2, ge=1, description="evolve: attempts per task in every measurement")
    iterations: int = Field(2, ge=1, description="evolve: search iterations")
    candidates: int = Field(2, ge=1, description="evolve: candidates proposed and measured per iteration")
    collect_model: Optional[str] = Field(
        None,
        description="the model that collects the train episodes (default: --model; `oracle` replays each task's "
        "known solution; any spec `harnessrl eval` takes, e.g. a stronger openai:MODEL@URL)",
    )
    collect_tasks: int = Field(8, ge=1, description="first N train tasks the evolved harness collects episodes on")
    collect_attempts: int = Field(
        4, ge=1, description="attempts per train task (rejection sampling: the passing ones are distilled)"
    )
    epochs: int = Field(3, ge=1, description="SFT: passes over the examples (distilled and placebo adapters)")
    lr: float = Field(2e-4, gt=0, allow_inf_nan=False, description="SFT: AdamW learning rate of the LoRA weights")
    test_tasks: int = Field(
        8, ge=1, description="first N test tasks (held out): the cells, and evolve's confirmation run"
    )
    attempts: int = Field(
        2,
        ge=1,
        description="attempts per task in the cells and the seed evaluation",
        json_schema_extra=cli("--attempts", "-k"),
    )
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="the agent's sampling temperature (0 = greedy)")
    seed: int = Field(0, description="seed of sampling, evolution, LoRA init and example order")
    max_in_flight: int = Field(16, ge=1, description="episodes in flight (generation batch size)")
    retries: int = Field(2, ge=0, description="re-runs of an episode after an infrastructure error")

    @model_validator(mode="after")
    def _local_model(self) -> StudyConfig:
        from harnessrl.models import MODEL_NAMES

        if self.model not in MODEL_NAMES and not self.model.startswith("hf:"):
            raise ValueError(
                f"'{self.model}' cannot be fine-tuned: the study needs a local model "
                f"({', '.join(MODEL_NAMES)} or hf:PATH)"
            )
        return self


# ------------------------------------------------------------------------------------ the numbers


def verdict(diff: dict[str, Any] | None) -> str:
    """What a paired difference allows to claim: "lower" or "higher" when its 95% interval
    excludes 0, "no claim" when the interval includes 0, "no data" without one."""
    ci = (diff or {}).get("ci95")
    if not ci or ci[0] is None or ci[1] is None:
        return "no data"
    if ci[1] < 0:
        return "lower"
    if ci[0] > 0:
        return "higher"
    return "no claim"


def cell_analysis(trajectories: list, attempts: int) -> dict[str, Any]:
    """One cell's record (summary metrics and triage) and, kept apart for the paired comparisons,
    its per-task score and per-task share of valid episodes ending in each failure class."""
    from harnessrl.metrics import summarize_harness, task_scores
    from harnessrl.triage import CONTENT, PROCESS, first_failure_signal, triage

    summary = summarize_harness(trajectories, attempts)
    tri = next(iter(triage(trajectories).values()), None) or {}
    n_valid = tri.get("n_valid", 0)
    counts = tri.get("counts", {})
    process = sum(counts.get(c, 0) for c in PROCESS)
    content = sum(counts.get(c, 0) for c in CONTENT)
    record = {
        "n_tasks": summary["n_tasks"],
        "n_episodes": summary["n_episodes"],
        "n_infra_errors": summary["n_infra_errors"],
        "attempts": attempts,
        "mean_score": summary["mean_score"],
        "mean_score_ci95": summary["mean_score_ci95"],
        "pass_at_k": summary["pass_at_k"],
        "pass_hat_k": summary["pass_hat_k"],
        "k_notes": summary["k_notes"],
        "delivery_rate": summary["delivery_rate"],
        "triage": {
            "n_valid": n_valid,
            "n_failed": tri.get("n_failed", 0),
            "counts": {c: counts.get(c, 0) for c in PROCESS + CONTENT},
            "process_share": tri.get("process_share"),
            "content_share": tri.get("content_share"),
            "process_rate": process / n_valid if n_valid else None,
            "content_rate": content / n_valid if n_valid else None,
        },
    }
    # per task: the share of its valid episodes whose first failure signal is each class (or kind)
    valid: dict[str, int] = defaultdict(int)
    hits: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in trajectories:
        if t.is_infra_error:
            continue
        valid[t.task_id] += 1
        v = first_failure_signal(t)
        if v is not None and v.kind != "infra":
            for key in {v.cls, v.kind}:  # the content class shares its name with its kind: count it once
                hits[t.task_id][key] += 1
    rates = {
        key: {task: hits[task][key] / n for task, n in valid.items()}
        for key in (*PROCESS, *CONTENT, "process", "content")
    }
    return {"record": record, "scores": task_scores(trajectories), "rates": rates}


def class_effects(analyses: dict[str, dict[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Per failure class seen in any cell: the paired difference (by task) of its rate (share of
    valid episodes) between seed-base and evolved-base (`harness`), seed-distilled (`weights`)
    and seed-placebo (`placebo`). Negative = the class is rarer."""
    from harnessrl.metrics import paired_difference
    from harnessrl.triage import CONTENT, PROCESS

    base = analyses["seed-base"]["rates"]
    effects = {}
    for cls in (*PROCESS, *CONTENT):
        if not any(any(a["rates"][cls].values()) for a in analyses.values()):
            continue
        entry: dict[str, Any] = {"kind": "process" if cls in PROCESS else "content"}
        for name, cell in (("harness", "evolved-base"), ("weights", "seed-distilled"), ("placebo", "seed-placebo")):
            diff = paired_difference(base[cls], analyses[cell]["rates"][cls], seed=seed)
            entry[name] = {**diff, "verdict": verdict(diff)}
        effects[cls] = entry
    return effects


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _fmt_diff(diff: dict[str, Any]) -> str:
    ci = diff.get("ci95") or [None, None]
    if diff.get("mean_difference") is None:
        return "no shared task"
    return f"{diff['mean_difference']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def recommend(
    differences: dict[str, dict[str, Any]],
    effects: dict[str, Any],
    evolved_is_seed: bool = False,
    content: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The recommendation, computed from the paired differences and the failure-class effects.

    fix_in_harness       process classes the evolved harness makes rarer (interval below 0)
    train_into_weights   content classes the distilled weights make rarer, where the placebo
                         adapter does not (a placebo that helps as much means the gain is not
                         from what the episodes showed)
    distils              classes the evolved harness removes AND the distilled weights reduce
                         under the seed harness: the weights learned what the harness enforced
    runtime_only         classes the evolved harness removes that the distilled weights do not
                         reduce (interval includes 0 or above): keep them in the harness; and the
                         score gain itself, when the harness raises the score and the weights do not
    no_claim             every effect and difference whose interval includes 0
    text                 the same, as sentences (with the content-failure rate before and after,
                         `content` as study.json's content_failures, when given)
    """
    fix, train, distils, runtime, no_claim, text = [], [], [], [], [], []

    def item(cls: str, *keys: str) -> dict[str, Any]:
        e = effects[cls]
        return {"class": cls, "kind": e["kind"], **{k: {x: e[k][x] for x in ("mean_difference", "ci95")} for k in keys}}

    for cls, e in effects.items():
        h, w, p = e["harness"]["verdict"], e["weights"]["verdict"], e["placebo"]["verdict"]
        if e["kind"] == "process" and h == "lower":
            fix.append(item(cls, "harness"))
            (distils if w == "lower" else runtime).append(item(cls, "harness", "weights"))
        if e["kind"] == "content" and w == "lower":
            if p == "lower":
                no_claim.append(
                    {
                        "what": f"{cls} rate, distilled vs base under seed",
                        "ci95": e["weights"]["ci95"],
                        "why": "the placebo adapter reduces it too: not attributable to the distilled content",
                    }
                )
            else:
                train.append(item(cls, "weights", "placebo"))
        for key, label in (("harness", "evolved vs seed under base"), ("weights", "distilled vs base under seed")):
            if e[key]["verdict"] == "no claim":
                no_claim.append(
                    {"what": f"{cls} rate, {label}", "ci95": e[key]["ci95"], "why": "the 95% interval includes 0"}
                )
    for name, diff in differences.items():
        if diff["verdict"] == "no claim":
            no_claim.append(
                {"what": f"score, {LABELS[name]}", "ci95": diff["ci95"], "why": "the 95% interval includes 0"}
            )

    harness_gain = differences["evolved_vs_seed_under_base"]
    weights_gain = differences["distilled_vs_base_under_seed"]
    placebo_gain = differences["placebo_vs_base_under_seed"]
    score = {
        "harness": harness_gain["verdict"],
        "weights": weights_gain["verdict"],
        "placebo": placebo_gain["verdict"],
        "combined": differences["evolved_distilled_vs_seed_base"]["verdict"],
        "runtime_only": harness_gain["verdict"] == "higher" and weights_gain["verdict"] != "higher",
    }

    if evolved_is_seed:
        text.append(
            "The evolved harness is the seed harness (no edit accepted, or the same spec given): every harness "
            "effect is noise."
        )
    if fix:
        text.append(
            "Fix in the harness: "
            + "; ".join(f"{x['class']} ({_fmt_diff(x['harness'])})" for x in fix)
            + " (process failures the evolved harness makes rarer)."
        )
    else:
        text.append("Fix in the harness: no process failure class is significantly rarer under the evolved harness.")
    if train:
        text.append(
            "Train into the weights: "
            + "; ".join(f"{x['class']} ({_fmt_diff(x['weights'])}; placebo {_fmt_diff(x['placebo'])})" for x in train)
            + " (content failures the distilled weights make rarer under the seed harness, the placebo does not)."
        )
    else:
        text.append(
            "Train into the weights: no content failure class is significantly rarer with the distilled weights."
        )
    if distils:
        text.append(
            "Distils: " + ", ".join(x["class"] for x in distils) + " (removed by the harness and by the weights)."
        )
    if runtime:
        text.append(
            "Runtime-only (keep in the harness, it does not distil): "
            + "; ".join(
                f"{x['class']} (distilled weights under the seed harness: {_fmt_diff(x['weights'])})" for x in runtime
            )
            + ". Where that interval includes 0 there is no claim either way: the weights did not measurably learn it."
        )
    also = [
        cls
        for cls, e in effects.items()
        if e["kind"] == "process" and e["weights"]["verdict"] == "lower" and e["harness"]["verdict"] != "lower"
    ]
    if also:
        text.append(
            "The distilled weights also make these process failures rarer under the seed harness, which the evolved "
            "harness did not: " + "; ".join(f"{cls} ({_fmt_diff(effects[cls]['weights'])})" for cls in also) + "."
        )
    if content is not None:
        before, after, diff = content["before"], content["after"], content["rate_difference"]
        claim = {"lower": "fewer", "higher": "more"}.get(diff["verdict"], "the interval includes 0, no claim")
        text.append(
            f"Content failures, as a share of episodes: {_pct(before['content_rate'])} with the base weights, "
            f"{_pct(after['content_rate'])} with the distilled weights (seed harness); paired by task "
            f"{_fmt_diff(diff)}: {claim}."
        )
    if score["runtime_only"]:
        text.append(
            f"The evolved harness's score gain ({_fmt_diff(harness_gain)}) is runtime-only: the distilled weights "
            f"under the seed harness show {_fmt_diff(weights_gain)}."
        )
    for name, diff in differences.items():
        if diff["verdict"] in ("higher", "lower"):
            text.append(f"Score, {LABELS[name]}: {_fmt_diff(diff)} ({diff['verdict']}).")
        elif diff["verdict"] == "no claim":
            text.append(f"Score, {LABELS[name]}: {_fmt_diff(diff)}: the interval includes 0, no claim.")
    if placebo_gain["verdict"] == "higher":
        text.append(
            "The placebo adapter raises the score too: part of any distilled gain is not from the answers shown."
        )
    return {
        "fix_in_harness": fix,
        "train_into_weights": train,
        "distils": distils,
        "runtime_only": runtime,
        "score": score,
        "no_claim": no_claim,
        "text": text,
    }


def study_result(
    config: StudyConfig,
    analyses: dict[str, dict[str, Any]],
    cells_meta: dict[str, dict[str, Any]],
    context: dict[str, Any],
) -> dict[str, Any]:
    """study.json: the cells, the paired differences, the content-failure share before and after,
    the failure-class effects and the recommendation."""
    from harnessrl.metrics import paired_difference

    differences = {}
    for name, (a, b) in COMPARISONS.items():
        diff = paired_difference(analyses[a]["scores"], analyses[b]["scores"], seed=config.seed)
        differences[name] = {"a": a, "b": b, **diff, "verdict": verdict(diff)}
    before, after = analyses["seed-base"], analyses["seed-distilled"]
    content_diff = paired_difference(before["rates"]["content"], after["rates"]["content"], seed=config.seed)
    content = {
        "before": {"cell": "seed-base", **_shares(before["record"])},
        "after": {"cell": "seed-distilled", **_shares(after["record"])},
        "rate_difference": {**content_diff, "verdict": verdict(content_diff)},
    }
    effects = class_effects(analyses, seed=config.seed)
    return {
        "suite": config.suite,
        "model": config.model,
        "config": config.model_dump(),
        **context,
        "cells": {name: {**cells_meta[name], **analyses[name]["record"]} for name in CELLS},
        "paired_differences": differences,
        "content_failures": content,
        "class_effects": effects,
        "recommendation": recommend(differences, effects, context.get("evolved_is_seed", False), content),
    }


def _shares(record: dict[str, Any]) -> dict[str, Any]:
    t = record["triage"]
    return {"content_rate": t["content_rate"], "content_share": t["content_share"]}


# ------------------------------------------------------------------------------------ the job


class Study:
    """`Study(config, out, resume=...)` checks everything cheap and raises StudyError (nothing is
    written); `run()` runs the stages that have not finished and returns study.json's content.

    `policy_factory(stage, model)` may hand a policy to an evaluation stage (tests use scripted
    policies); None loads `model` as usual."""

    def __init__(
        self,
        config: StudyConfig,
        out: str | Path,
        *,
        resume: bool = False,
        policy_factory: PolicyFactory | None = None,
        progress: bool = True,
        log: Callable[[str], None] = lambda message: None,
        console=None,
    ):
        from harnessrl.evolve.config import EvolveConfig
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError, require_loop_harness
        from harnessrl.models import check_spec
        from harnessrl.tasks import get_suite

        self.config = config
        self.out = Path(out)
        self.resume = resume
        self.policy_factory = policy_factory
        self.progress = progress
        self.log = log
        self.console = console
        c = config
        try:
            from harnessrl.models.device import resolve_device, resolve_dtype

            # a device this machine lacks: refused before any work; auto resolved once, for every stage
            self.device = resolve_device(c.device)
            self.dtype = resolve_dtype(c.dtype, self.device)
            check_spec(c.model, option="--model")
            if c.collect_model is not None:
                check_spec(c.collect_model, option="--collect-model", oracle=True)
            purpose = "the study (evolve, then re-render conversations)"
            self.seed_spec = require_loop_harness(load_harness(c.seed_harness), purpose)
            self.given_evolved = (
                require_loop_harness(load_harness(c.evolved), purpose) if c.evolved is not None else None
            )
            suite = get_suite(c.suite)
            self.seed_eval_tasks = suite.tasks("dev", c.seed_eval_tasks) if c.seed_eval_tasks else []
            self.train_tasks = suite.tasks("train", c.collect_tasks)
            self.test_tasks = suite.tasks("test", c.test_tasks)
            if c.evolved is None:
                suite.tasks("dev", c.dev_tasks)
                self.evolve_config = EvolveConfig(
                    suite=c.suite,
                    seed_harness=c.seed_harness,
                    model=c.model,
                    device=c.device,
                    dtype=self.dtype,
                    dev_tasks=c.dev_tasks,
                    test_tasks=c.test_tasks,
                    rollouts=c.rollouts,
                    iterations=c.iterations,
                    candidates=c.candidates,
                    seed=c.seed,
                    temperature=c.temperature,
                    max_in_flight=c.max_in_flight,
                    retries=c.retries,
                )
        except (SpecError, ValueError) as e:
            raise StudyError(str(e)) from None
        # with --evolved the evolution's options play no part: left out, so they may change on --resume
        unused = EVOLVE_OPTIONS if c.evolved is not None else ()
        # the device is recorded as it resolved and may differ on resume (float rounding only);
        # the dtype as it resolved, only when it is not float32 (studies from before the option
        # resume as they were, and a float32 study is not continued in bfloat16 unnoticed)
        unused = (*unused, "device", "dtype")
        self.record = {
            **{k: v for k, v in config.model_dump().items() if k not in unused},
            "device": str(self.device),
            **({"dtype": self.dtype} if self.dtype != "float32" else {}),
            "seed_spec": self.seed_spec.to_dict(),
            "evolved_spec": None if self.given_evolved is None else self.given_evolved.to_dict(),
        }
        growable = resume and not self._training_started()
        try:
            self.folder = RunFolder.open(
                self.out,
                "study",
                self.record,
                resume=resume,
                may_differ=(*GROWABLE, "device") if growable else ("device",),
            )
            if growable:
                old = self.folder.stored_config()
                for key in GROWABLE:
                    if old.get(key) is not None and self.record[key] < old[key]:
                        raise StudyError(
                            f"--{key.replace('_', '-')} may only grow on --resume ({old[key]} -> {self.record[key]}): "
                            "the episodes already collected stay in the collection; start a new --out to use fewer"
                        )
        except RunFolderError as e:
            raise StudyError(str(e)) from None
        self._policy: tuple[str, Any] | None = None
        self.stages: dict[str, Any] = {}

    # -- the folder ------------------------------------------------------------------------------
    def _training_started(self) -> bool:
        stages = self._read_stages()
        return any(s in stages or holds_run(self.out / s) for s in ("sft", "placebo"))

    def _read_stages(self) -> dict[str, Any]:
        import json

        path = self.out / STAGES_JSON
        if not path.is_file():
            return {}
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise StudyError(f"{path} is not valid JSON ({e}); remove it to re-check every stage") from None
        return value if isinstance(value, dict) else {}

    def _done(self, stage: str, **facts: Any) -> None:
        self.stages[stage] = facts
        write_json(self.out / STAGES_JSON, self.stages)

    # -- policies ----------------------------------------------------------------------------------
    def _load(self, stage: str, model: str):
        """`model` loaded once (the last one loaded is kept for the next stage that needs it); the
        policy factory, when there is one, is asked first by `_measure`."""
        if self._policy is not None and self._policy[0] == model:
            return self._policy[1]
        self._release()
        from harnessrl.models import MODEL_NAMES, load_policy

        local = model in MODEL_NAMES or model.startswith("hf:")  # (a --collect-model may be a server)
        try:
            policy = load_policy(model, dtype=self.dtype, device=str(self.device)) if local else load_policy(model)
        except (ValueError, RuntimeError, OSError) as e:
            raise StudyError(f"{stage}: cannot load model '{model}': {e}") from None
        self._policy = (model, policy)
        return policy

    def _release(self) -> None:
        if self._policy is not None:
            close = getattr(self._policy[1], "close", None)
            if close is not None:
                close()
            self._policy = None
            gc.collect()

    # -- evaluation stages ---------------------------------------------------------------------------
    def _measure(self, stage: str, split: str, tasks: list, spec, model: str, attempts: int, may_differ=()) -> list:
        """Evaluate `spec` with `model` on `tasks` x `attempts` in the run folder OUT/<stage> (an
        ordinary evaluation run folder, resumed when it holds one); returns its trajectories."""
        from harnessrl.evaluate import _run_oracle, evaluation_record, run_into_store, write_summary
        from harnessrl.models import ORACLE
        from harnessrl.models.base import SamplingParams
        from harnessrl.rollout import make_jobs

        c = self.config
        sampling = SamplingParams(temperature=c.temperature, seed=c.seed)
        record = evaluation_record(c.suite, split, model, tasks, [spec], attempts, sampling, c.retries)
        path = self.out / stage
        try:
            folder = RunFolder.open(path, "evaluation", record, resume=holds_run(path), may_differ=may_differ).start()
            store = folder.store(meta_config=folder.config)
            folder.record_shell_isolation([spec], any(t.offers_shell for t in tasks))
        except RunFolderError as e:
            raise StudyError(f"{stage}: {e}") from None
        with folder:
            jobs = make_jobs(tasks, [spec], attempts)
            todo = folder.todo(jobs)
            if todo:
                self.log(
                    f"{stage}: {spec.name} x {model}, {len(todo)} episodes"
                    + (f" ({len(jobs) - len(todo)} already done)" if len(todo) < len(jobs) else "")
                )
                policy = self.policy_factory(stage, model) if self.policy_factory is not None else None
                if policy is None and model.strip() == ORACLE:
                    _run_oracle([spec], todo, store, c.retries, self.progress)
                else:
                    policy = policy if policy is not None else self._load(stage, model)
                    run_into_store(store, todo, policy, sampling, c.max_in_flight, c.retries, self.progress)
            write_summary(store, folder.config, path)
            wanted = {j.key for j in jobs}
            return [t for t in store.trajectories(with_tokens=False) if t.key in wanted]

    def _stored(self, stage: str) -> list:
        """The trajectories of a finished evaluation stage, read without opening it as a run."""
        from harnessrl.store import RunStore, StoreError

        try:
            with RunStore(self.out / stage) as store:
                return list(store.trajectories(with_tokens=False))
        except (StoreError, OSError) as e:
            raise StudyError(f"{stage}: cannot read its run database ({e})") from None

    # -- the stages ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        c = self.config
        try:
            self.folder.start()
        except OSError as e:
            raise StudyError(f"cannot write {self.out}: {e}") from None
        self.stages = self._read_stages()
        try:
            context: dict[str, Any] = {"seed_harness": self.seed_spec.name}
            if c.seed_eval_tasks and "seed-eval" not in self.stages:
                trajs = self._measure("seed-eval", "dev", self.seed_eval_tasks, self.seed_spec, c.model, c.attempts)
                self._done("seed-eval", episodes=len(trajs))
            evolved, evolution = self._evolve()
            context.update(evolved_harness=evolved.name, evolution=evolution)
            context["evolved_is_seed"] = _same_harness(evolved, self.seed_spec)
            context["collect"] = self._collect(evolved)
            context["training"] = {stage: self._sft(stage) for stage in ("sft", "placebo")}
            analyses, meta = {}, {}
            for cell, (side, weights) in CELLS.items():
                spec = self.seed_spec if side == "seed" else evolved
                model = self._cell_model(weights)
                stage = f"cells/{cell}"
                if stage in self.stages and holds_run(self.out / stage):  # finished: only read
                    trajs = self._stored(stage)
                else:
                    trajs = self._measure(stage, "test", self.test_tasks, spec, model, c.attempts)
                    self._done(stage, episodes=len(trajs))
                analyses[cell] = cell_analysis(trajs, c.attempts)
                meta[cell] = {
                    "harness": side,
                    "harness_name": spec.name,
                    "weights": weights,
                    "model": model,
                    "folder": f"cells/{cell}",
                }
        finally:
            self._release()
        context["seed_eval"] = (
            {"split": "dev", "folder": "seed-eval", **cell_analysis(self._stored("seed-eval"), c.attempts)["record"]}
            if "seed-eval" in self.stages and holds_run(self.out / "seed-eval")
            else None
        )
        result = study_result(c, analyses, meta, context)
        write_json(self.out / STUDY_JSON, result)
        return result

    def _evolve(self):
        """The evolved harness (the given one, or evolution's best) and evolution's summary."""
        import json

        from harnessrl.evolve.loop import BEST, FINAL, EvolveError
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError
        from harnessrl.rundir import LOCK

        if self.given_evolved is not None:
            return self.given_evolved, {"given": self.config.evolved}
        path = self.out / "evolve"
        finished = (path / FINAL).is_file() and (path / LOCK).is_file()
        if "evolve" not in self.stages and not finished:
            from harnessrl.evolve.run import run_evolve

            self._release()  # evolution loads its own copy of the model
            try:
                run_evolve(self.evolve_config, path, resume=holds_run(path), progress=self.progress, log=self.log)
            except EvolveError as e:
                raise StudyError(f"evolve: {e}") from None
        try:
            final = json.loads((path / FINAL).read_text(encoding="utf-8"))
            spec = load_harness(str(path / BEST))
        except (OSError, ValueError, SpecError) as e:
            raise StudyError(f"evolve: {path} holds no finished evolution ({e})") from None
        evolution = {
            "folder": "evolve",
            "best": final["best"],
            "accepted_edits": final["accepted_edits"],
            "best_diff_vs_seed": final["best_diff_vs_seed"],
            "iterations_run": final["iterations_run"],
            "threshold": final["threshold"],
            "held_out_difference": final["paired_difference"],
        }
        if "evolve" not in self.stages:
            self._done("evolve", best=final["best"], accepted_edits=final["accepted_edits"])
        return spec, evolution

    def _collect(self, evolved) -> dict[str, Any]:
        """The evolved harness's episodes on the train tasks; refuses to go on when fewer than two
        tasks have a passing one (nothing to distil, or no placebo: it swaps answers across tasks)."""
        c = self.config
        grown = self.stages.get("collect", {})
        if grown.get("tasks") == c.collect_tasks and grown.get("attempts") == c.collect_attempts:
            return grown
        collector = c.collect_model or c.model
        trajs = self._measure(
            "collect",
            "train",
            self.train_tasks,
            evolved,
            collector,
            c.collect_attempts,
            may_differ=("tasks", "task_ids", "attempts"),
        )
        passed = [t for t in trajs if not t.is_infra_error and t.grade is not None and t.grade.passed]
        tasks = sorted({t.task_id for t in passed})
        facts = {
            "tasks": c.collect_tasks,
            "attempts": c.collect_attempts,
            "episodes": len(trajs),
            "passed": len(passed),
            "passed_tasks": len(tasks),
        }
        more = (
            f"resume with more attempts or tasks to collect more (the finished episodes are kept): --resume "
            f"--collect-attempts {c.collect_attempts * 2} or --collect-tasks {c.collect_tasks * 2}; or use a model "
            "that solves some train tasks (a new --out)"
        )
        where = (
            f"{len(trajs)} episodes of {evolved.name} with {collector} on {c.collect_tasks} {c.suite} train tasks "
            f"({c.collect_attempts} attempts each)"
        )
        if not passed:
            raise StudyError(f"nothing to distil: none of the {where} passed; {more}")
        if len(tasks) < 2:
            raise StudyError(
                f"only one task ({tasks[0]}) has a passing episode among the {where}; the placebo adapter swaps "
                f"answers across tasks and needs two; {more}"
            )
        self._done("collect", **facts)
        return facts

    def _sft(self, stage: str) -> dict[str, Any]:
        """The distilled (stage sft) or placebo adapter: SFT on the collected episodes, re-rendered
        into the seed harness."""
        from harnessrl.train.config import SFTConfig
        from harnessrl.train.sft import SFTError, run_sft

        if stage in self.stages:
            return self.stages[stage]
        c = self.config
        sft_config = SFTConfig(
            from_runs=[str(self.out / "collect")],
            as_harness=c.seed_harness,
            model=c.model,
            device=c.device,
            dtype=self.dtype,
            placebo="shuffle-answers" if stage == "placebo" else "none",
            epochs=c.epochs,
            lr=c.lr,
            seed=c.seed,
        )
        self._release()
        self.log(f"{stage}: training the {'placebo' if stage == 'placebo' else 'distilled'} adapter")
        path = self.out / stage
        try:
            summary = run_sft(
                sft_config,
                path,
                resume=holds_run(path),
                spec=self.seed_spec,
                progress=self.progress,
                console=self.console,
            )
        except SFTError as e:
            raise StudyError(f"{stage}: {e}") from None
        finally:
            gc.collect()
        data = summary["data"]
        facts = {
            "folder": stage,
            "adapter": f"{stage}/adapter",
            "steps": summary["steps"],
            "examples": data["examples"],
            "episodes_replayed": data["replayed"],
            "episodes_dropped": sum(data["dropped"].values()),
            "final_loss": (summary.get("last") or {}).get("loss"),
        }
        self._done(stage, **facts)
        return facts

    def _cell_model(self, weights: str) -> str:
        if weights == "base":
            return self.config.model
        return "hf:" + str(self.out / ("sft" if weights == "distilled" else "placebo") / "adapter")


def _same_harness(a, b) -> bool:
    from harnessrl.evolve.edits import spec_fingerprint

    return spec_fingerprint(a) == spec_fingerprint(b)


def run_study(
    config: StudyConfig,
    out: str | Path,
    *,
    resume: bool = False,
    policy_factory: PolicyFactory | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
    console=None,
) -> dict[str, Any]:
    """`harnessrl study` as a library call; returns study.json's content."""
    study = Study(
        config, out, resume=resume, policy_factory=policy_factory, progress=progress, log=log, console=console
    )
    return study.run()


__all__ = [
    "CELLS",
    "COMPARISONS",
    "Study",
    "StudyConfig",
    "StudyError",
    "class_effects",
    "recommend",
    "run_study",
    "verdict",
]
