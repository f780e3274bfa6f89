"""The harness x weights study as one resumable job: `Study(enter("study", StudyConfig(...), out)).run()`.

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
                (computed in harnessrl.jobs.study_analysis, which this module re-exports)

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

from typing import TYPE_CHECKING, Annotated, Any, Optional

from pydantic import Field, model_validator

from harnessrl.config import Device, FloatDtype, Options, Reads, SuiteName, cli, option_name
from harnessrl.errors import JobError
from harnessrl.jobs.stages import PolicyFactory, Stages
from harnessrl.jobs.study_analysis import (
    CELLS,
    COMPARISONS,
    cell_analysis,
    class_effects,
    compare_cells,
    recommend,
    verdict,
)
from harnessrl.results import StudyResult
from harnessrl.rundir import STUDY_JSON, RunFolder, holds_run, write_json

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext

# The options only the evolution stage uses.
EVOLVE_OPTIONS = ("dev_tasks", "rollouts", "iterations", "candidates")
# Keys of the study's configuration that may grow on --resume while no adapter has been trained.
GROWABLE = ("collect_tasks", "collect_attempts")
LOOP = "the study (evolve, then re-render conversations)"  # what needs harnessrl's own control loop


class StudyError(JobError):
    """A study cannot go on as asked (bad options, a refused resume, nothing to distil); the CLI
    exits 2 with the message."""


class StudyConfig(Options):
    """`harnessrl study`: every option, declared once (OUT/config.json records them)."""

    suite: SuiteName = Field(
        "toolcalc", description="suite: dev tasks evolve, train tasks are distilled, test tasks judge"
    )
    seed_harness: Annotated[str, Reads("harness", loop_for=LOOP)] = Field(
        "react", description="built-in harness name or spec path to start from"
    )
    evolved: Annotated[Optional[str], Reads("harness", loop_for=LOOP)] = Field(
        None,
        description="the evolved harness (name or spec path): skips the evolution (default: evolve the seed)",
    )
    model: str = Field(
        "smollm2-135m", description="the base model (a local one, it is fine-tuned): tiny-random, smollm2-135m, hf:PATH"
    )
    device: Device = "auto"
    dtype: FloatDtype = "auto"
    seed_eval_tasks: Annotated[int, Reads("tasks", "dev")] = Field(
        4, ge=0, description="first N dev tasks the seed harness is evaluated on (0 = skip)"
    )
    dev_tasks: Annotated[int, Reads("count", "dev", unless="evolved")] = Field(
        4, ge=2, description="evolve: first N dev tasks (decision tasks)"
    )
    rollouts: int = Field(2, ge=1, description="evolve: attempts per task in every measurement")
    iterations: int = Field(2, ge=1, description="evolve: search iterations")
    candidates: int = Field(2, ge=1, description="evolve: candidates proposed and measured per iteration")
    collect_model: Optional[str] = Field(
        None,
        description="the model that collects the train episodes (default: --model; `oracle` replays each task's "
        "known solution; any spec `harnessrl eval` takes, e.g. a stronger openai:MODEL@URL)",
    )
    collect_tasks: Annotated[int, Reads("count", "train")] = Field(
        8, ge=1, description="first N train tasks the evolved harness collects episodes on"
    )
    collect_attempts: int = Field(
        4, ge=1, description="attempts per train task (rejection sampling: the passing ones are distilled)"
    )
    epochs: int = Field(3, ge=1, description="SFT: passes over the examples (distilled and placebo adapters)")
    lr: float = Field(2e-4, gt=0, allow_inf_nan=False, description="SFT: AdamW learning rate of the LoRA weights")
    pack: bool = Field(
        False,
        description="SFT: an episode's calls in shared rows, whole episodes shuffled per epoch (harnessrl train sft "
        "--pack: about half the time a step on multi-turn episodes, the same loss per batch)",
    )
    test_tasks: Annotated[int, Reads("tasks", "test")] = Field(
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
        from harnessrl.models.choice import is_local_spec

        if not is_local_spec(self.model):
            raise ValueError(
                f"'{self.model}' cannot be fine-tuned: the study needs a local model "
                f"({', '.join(MODEL_NAMES)} or hf:PATH)"
            )
        return self


def study_result(
    config: StudyConfig,
    analyses: dict[str, dict[str, Any]],
    cells_meta: dict[str, dict[str, Any]],
    context: dict[str, Any],
) -> StudyResult:
    """study.json: the study's configuration and context, the cells, and their analysis
    (`compare_cells`: the paired differences, the content-failure share before and after, the
    failure-class effects and the recommendation)."""
    return StudyResult(
        suite=config.suite,
        model=config.model,
        config=config.model_dump(),
        **context,
        cells={name: {**cells_meta[name], **analyses[name]["record"]} for name in CELLS},
        **dict(compare_cells(analyses, seed=config.seed, evolved_is_seed=context.get("evolved_is_seed", False))),
    )


# ------------------------------------------------------------------------------------ the job


class Study:
    """`Study(ctx)` (its context from the job kernel, which read the suite, tasks and harnesses its
    options name) checks what is left and raises StudyError (nothing is written); `run()` runs the
    stages that have not finished and returns study.json's content.

    `policy_factory(stage, model)` may hand a policy to an evaluation stage (tests use scripted
    policies); None loads `model` as usual."""

    def __init__(self, ctx: JobContext, policy_factory: PolicyFactory | None = None):
        from harnessrl.evolve.config import evolution_of
        from harnessrl.kernel import job_record

        self.config = c = ctx.config
        self.out, inputs = ctx.out, ctx.inputs
        model = ctx.model()  # a device this machine lacks was refused; auto is resolved, for every stage
        assert model.device is not None and model.dtype is not None  # the study's model is local
        self.seed_spec, self.given_evolved = inputs.harness["seed_harness"], inputs.harness["evolved"]
        self.seed_eval_tasks, self.test_tasks = inputs.tasks["seed_eval_tasks"], inputs.tasks["test_tasks"]
        if c.evolved is None:
            try:
                self.evolve_config = evolution_of(c, model.dtype)
            except ValueError as e:  # an evolution option its config refuses
                raise StudyError(str(e)) from None
        # with --evolved the evolution's options play no part: left out, so they may change on --resume;
        # pack recorded when on
        unused = (*(EVOLVE_OPTIONS if c.evolved is not None else ()), *(() if c.pack else ("pack",)))
        self.record = job_record(
            c.model_dump(), model, unused,
            seed_spec=self.seed_spec.to_dict(),
            evolved_spec=None if self.given_evolved is None else self.given_evolved.to_dict(),
        )  # fmt: skip
        self.runner = Stages(
            c, self.out, self.seed_spec, model.device, model.dtype,
            policy_factory=policy_factory, progress=ctx.progress, log=ctx.log, console=ctx.console,
        )  # fmt: skip
        growable = ctx.resume and not self.runner.training_started()
        may_differ = (*GROWABLE, "device") if growable else ("device",)
        self.folder = RunFolder.open(self.out, "study", self.record, resume=ctx.resume, may_differ=may_differ)
        if growable:
            old = self.folder.stored_config()
            for key in GROWABLE:
                if old.get(key) is not None and self.record[key] < old[key]:
                    raise StudyError(
                        f"{option_name(key)} may only grow on --resume ({old[key]} -> {self.record[key]}): "
                        "the episodes already collected stay in the collection; start a new --out to use fewer"
                    )

    # -- the stages ----------------------------------------------------------------------------------
    def run(self) -> StudyResult:
        c, runner = self.config, self.runner
        try:
            self.folder.start()
        except OSError as e:
            raise StudyError(f"cannot write {self.out}: {e}") from None
        runner.stages = runner.read()
        try:
            context: dict[str, Any] = {"seed_harness": self.seed_spec.name}
            if c.seed_eval_tasks:
                runner.measured("seed-eval", "dev", self.seed_eval_tasks, self.seed_spec, c.model, c.attempts)
            evolved, evolution = self._evolve()
            context.update(evolved_harness=evolved.name, evolution=evolution)
            context["evolved_is_seed"] = _same_harness(evolved, self.seed_spec)
            context["collect"] = runner.collect(evolved)
            context["training"] = {stage: runner.sft(stage) for stage in ("sft", "placebo")}
            analyses, meta = {}, {}
            for cell, (side, weights) in CELLS.items():
                spec = self.seed_spec if side == "seed" else evolved
                model = runner.adapter_model(weights)
                stage = f"cells/{cell}"
                trajs = runner.measured(stage, "test", self.test_tasks, spec, model, c.attempts)
                analyses[cell] = cell_analysis(trajs, c.attempts)
                meta[cell] = {
                    "harness": side,
                    "harness_name": spec.name,
                    "weights": weights,
                    "model": model,
                    "folder": f"cells/{cell}",
                }
        finally:
            runner.release()
        context["seed_eval"] = (
            {"split": "dev", "folder": "seed-eval", **cell_analysis(runner.stored("seed-eval"), c.attempts)["record"]}
            if "seed-eval" in runner.stages and holds_run(self.out / "seed-eval")
            else None
        )
        result = study_result(c, analyses, meta, context)
        write_json(self.out / STUDY_JSON, result.model_dump())
        return result

    def _evolve(self):
        """The evolved harness (the given one, or evolution's best) and evolution's summary."""
        if self.given_evolved is not None:
            return self.given_evolved, {"given": self.config.evolved}
        run = "evolve" not in self.runner.stages
        final, spec = self.runner.evolved("evolve", self.evolve_config, run=run)
        evolution = {
            "folder": "evolve",
            "best": final["best"],
            "accepted_edits": final["accepted_edits"],
            "best_diff_vs_seed": final["best_diff_vs_seed"],
            "iterations_run": final["iterations_run"],
            "threshold": final["threshold"],
            "held_out_difference": final["paired_difference"],
        }
        if "evolve" not in self.runner.stages:
            self.runner.done("evolve", best=final["best"], accepted_edits=final["accepted_edits"])
        return spec, evolution


def _same_harness(a, b) -> bool:
    from harnessrl.evolve.edits import spec_fingerprint

    return spec_fingerprint(a) == spec_fingerprint(b)


def run_study(ctx: JobContext, policy_factory: PolicyFactory | None = None) -> StudyResult:
    """`harnessrl study` over its job context (harnessrl.kernel.enter); returns study.json's content."""
    return Study(ctx, policy_factory).run()


__all__ = [
    "CELLS",
    "COMPARISONS",
    "Study",
    "StudyConfig",
    "StudyError",
    "cell_analysis",
    "class_effects",
    "recommend",
    "run_study",
    "verdict",
]
