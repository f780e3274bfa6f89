"""The entries of the jobs, all in one place: one short function per command (eval, evolve, study,
improve, train grpo / sft / distill), each over the job kernel (harnessrl.kernel).

Each entry enters the kernel (the resume rule, the models chosen once, what the options name read
once, one error type), then hands the job its context: `with enter(...) as ctx: job(ctx)`. The command line
calls these and prints; a library caller may too (`given=None`: its config is taken whole, see
the resume rule in harnessrl.kernel). The jobs themselves stay where their ideas live
(jobs/evaluate.py, evolve/, jobs/study.py, improve/, train/).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection

from harnessrl.jobs.measured import measuring
from harnessrl.kernel import Finished, JobContext, enter, option_values

if TYPE_CHECKING:
    from harnessrl.config import EvalConfig
    from harnessrl.evolve.config import EvolveConfig
    from harnessrl.executors import Executor
    from harnessrl.improve.config import ImproveConfig
    from harnessrl.jobs.study import StudyConfig
    from harnessrl.results import EvalSummary, EvolveResult, ImproveResult, ImproveStopped, StudyResult
    from harnessrl.train.config import DistillConfig, SFTConfig, TrainConfig

Log = Callable[[str], None]


def _quiet(message: str) -> None:
    """A log that says nothing (a library call's default)."""


def _context(
    job: str, config: Any, run: Any, given: Collection[str] | None, log: Log, **job_options: Any
) -> JobContext:
    """The kernel entered with a command's run options (`run.out`, `run.resume`, `run.progress`,
    `run.isolation`, `run.allow_host_network`) and the job's own (`error`, `models`, `earlier`,
    `console`, `executor`)."""
    isolation, preflight = getattr(run, "isolation", "auto"), bool(getattr(run, "preflight", False))
    return enter(
        job,
        config,
        run.out,
        resume=run.resume,
        given=given,
        isolation=isolation,
        allow_host_network=bool(getattr(run, "allow_host_network", False)),
        log=log,
        progress=run.progress,
        preflight=preflight,
        **job_options,
    )


def evaluate(
    config: EvalConfig,
    run: Any,
    *,
    given: Collection[str] | None = None,
    log: Log = _quiet,
    executor: Executor | None = None,
) -> Finished[EvalSummary]:
    """`harnessrl eval`: the model on the suite through every harness (jobs/evaluate.run_eval)."""
    from harnessrl.jobs.evaluate import EvalError, run_eval

    with _context("eval", config, run, given, log, error=EvalError, executor=executor) as ctx:
        with measuring(ctx.out, "eval"):
            return Finished(ctx.config, run_eval(ctx))


def evolve(
    config: EvolveConfig,
    run: Any,
    *,
    given: Collection[str] | None = None,
    log: Log = _quiet,
    executor: Executor | None = None,
) -> Finished[EvolveResult]:
    """`harnessrl evolve`: edits of the seed harness kept where they beat measured noise, then
    one held-out confirmation (evolve/run.run_evolve)."""
    from harnessrl.evolve.loop import EvolveError
    from harnessrl.evolve.run import evolve_models, run_evolve, stored_config

    key = getattr(run, "api_key_env", None)

    def earlier(out: Path) -> dict[str, Any]:  # a run from before options.json: its config.json holds them
        return option_values(stored_config(out))

    models = lambda c: evolve_models(c, key)  # noqa: E731
    with _context(
        "evolve", config, run, given, log, error=EvolveError, models=models, earlier=earlier, executor=executor
    ) as ctx:
        with measuring(ctx.out, "evolve"):
            return Finished(ctx.config, run_evolve(ctx))


def study(
    config: StudyConfig, run: Any, *, given: Collection[str] | None = None, log: Log = _quiet, console: Any = None
) -> Finished[StudyResult]:
    """`harnessrl study`: harness x weights, held-out cells (jobs/study.run_study)."""
    from harnessrl.jobs.study import StudyError, run_study

    with _context("study", config, run, given, log, error=StudyError, console=console) as ctx:
        with measuring(ctx.out, "study"):
            return Finished(ctx.config, run_study(ctx))


def improve(
    config: ImproveConfig, run: Any, *, given: Collection[str] | None = None, log: Log = _quiet, console: Any = None
) -> Finished[ImproveResult | ImproveStopped]:
    """`harnessrl improve`: harness, then weights, then content (improve/job.run_improve)."""
    from harnessrl.improve import ImproveError, run_improve

    with _context("improve", config, run, given, log, error=ImproveError, console=console) as ctx:
        with measuring(ctx.out, "improve"):
            return Finished(ctx.config, run_improve(ctx, getattr(run, "stop_after", None)))


def train_grpo(
    config: TrainConfig,
    run: Any,
    *,
    given: Collection[str] | None = None,
    log: Log = _quiet,
    console: Any = None,
    executor: Executor,
) -> Finished[Any]:
    """`harnessrl train grpo`: GRPO with LoRA across harnesses (train/trainer.Trainer). With the
    run option `preflight`, the kernel measures each harness's first request of the first train
    task against the model's context first (harnessrl.kernel.preflight_inputs)."""
    from harnessrl.train.trainer import Trainer, TrainError

    with _context("train grpo", config, run, given, log, error=TrainError, console=console, executor=executor) as ctx:
        trainer = Trainer(ctx)
        executor.start()  # connect before the model loads
        with measuring(ctx.out, "train grpo"):
            return Finished(ctx.config, trainer.run())


def train_sft(
    config: SFTConfig, run: Any, *, given: Collection[str] | None = None, log: Log = _quiet, console: Any = None
) -> Finished[Any]:
    """`harnessrl train sft`: supervised LoRA on stored episodes (train/sft.run_sft)."""
    from harnessrl.train.sft import SFTError, run_sft

    with _context("train sft", config, run, given, log, error=SFTError, console=console) as ctx:
        exports = {k: getattr(run, k, None) for k in ("export_jsonl", "export_hf")}
        with measuring(ctx.out, "train sft"):
            return Finished(ctx.config, run_sft(ctx, **exports, export_only=getattr(run, "export_only", False)))


def train_distill(
    config: DistillConfig,
    run: Any,
    *,
    given: Collection[str] | None = None,
    log: Log = _quiet,
    console: Any = None,
    executor: Executor,
) -> Finished[Any]:
    """`harnessrl train distill`: on-policy distillation across harnesses (train/distill.DistillRun)."""
    from harnessrl.train.distill import DistillError, DistillRun

    with _context(
        "train distill", config, run, given, log, error=DistillError, console=console, executor=executor
    ) as ctx:
        job = DistillRun(ctx)
        executor.start()  # connect before the model loads
        with measuring(ctx.out, "train distill"):
            return Finished(ctx.config, job.run())


# Every command's entry, by the command's name (tests check each enters the kernel).
ENTRIES: dict[str, Callable[..., Any]] = {
    "eval": evaluate,
    "evolve": evolve,
    "study": study,
    "improve": improve,
    "train grpo": train_grpo,
    "train sft": train_sft,
    "train distill": train_distill,
}
