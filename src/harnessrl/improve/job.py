"""The job: Improve checks its options and sets up the job's state (ImproveState), then runs the
phases in order (harness, weights, content, final), each a function of its own module over that
state, each phase's result handed to the next; run_improve is the library call."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from harnessrl.improve.config import PHASES, ImproveConfig, ImproveError
from harnessrl.improve.content import content_phase
from harnessrl.improve.final import final_phase
from harnessrl.improve.harness import harness_phase
from harnessrl.improve.record import ImproveState, begin, cell, release
from harnessrl.improve.weights import weights_phase
from harnessrl.results import ImproveResult, ImproveStopped
from harnessrl.rundir import RunFolder

if TYPE_CHECKING:
    from rich.console import Console

    from harnessrl.models.choice import ModelChoice


class Improve:
    """`Improve(config, out, resume=...)` checks everything cheap and raises ImproveError (nothing
    is written); `run(stop_after=PHASE)` runs the phases and returns improve.json's content (or,
    stopped after a phase, what is decided so far). `state`: the job's ImproveState; `record`: what
    OUT/config.json records."""

    def __init__(
        self,
        config: ImproveConfig,
        out: str | Path,
        *,
        resume: bool = False,
        progress: bool = True,
        log: Callable[[str], None] = lambda message: None,
        console: Console | None = None,
        models: Mapping[str, ModelChoice] | None = None,
    ):
        from harnessrl.kernel import (
            choose_models,
            config_models,
            job_harness,
            job_record,
            job_split,
            job_suite,
            job_tasks,
        )
        from harnessrl.train import lora
        from harnessrl.train.distill import check_protocols

        c = config
        out = Path(out)
        chosen = choose_models(config_models(c)) if models is None else models
        model = lora.trained_model(c, ImproveError, chosen["--model"])  # it is fine-tuned
        assert model.device is not None and model.dtype is not None  # a local model's choice is resolved
        device, dtype = model.device, model.dtype
        purpose = "improve (evolve, then distil into the seed harness)"
        seed_spec = job_harness(c.seed_harness, "--seed-harness", ImproveError, loop_for=purpose)
        given = job_harness(c.evolved, "--evolved", ImproveError, loop_for=purpose) if c.evolved is not None else None
        if given is not None:
            check_protocols(seed_spec, given)
        suite = job_suite(c.suite, ImproveError)
        for split in ("train", "dev", "test"):
            if not suite.split_sizes.get(split):
                raise ImproveError(
                    f"suite '{suite.name}' has no {split} split (improve needs train tasks to train on, dev tasks "
                    "to decide on and test tasks to judge)"
                )
        dev_tasks = job_tasks(suite, "dev", c.dev_tasks, "--dev-tasks", ImproveError)
        test_tasks = job_tasks(suite, "test", c.test_tasks, "--test-tasks", ImproveError)
        job_tasks(suite, "train", c.collect_tasks, "--collect-tasks", ImproveError)  # a count the split cannot give
        content_pool = job_tasks(suite, "train", c.content_tasks, "--content-tasks", ImproveError)
        job_split(suite, "train", c.distill_tasks_per_step, "--distill-tasks-per-step", ImproveError)
        evolved_spec = None if given is None else given.to_dict()
        self.record = job_record(c.model_dump(), model, seed_spec=seed_spec.to_dict(), evolved_spec=evolved_spec)
        folder = RunFolder.open(out, "improvement", self.record, resume=resume, may_differ=("device",))
        self.state = ImproveState(
            config=c,
            out=out,
            progress=progress,
            log=log,
            console=console,
            device=device,
            dtype=dtype,
            seed_spec=seed_spec,
            given=given,
            suite=suite,
            dev_tasks=dev_tasks,
            test_tasks=test_tasks,
            content_pool=content_pool,
            folder=folder,
        )

    # -- the phases -----------------------------------------------------------------------------------
    def run(self, stop_after: str | None = None) -> ImproveResult | ImproveStopped:
        """Run the phases in order (each reading what the previous one returned), or stop after
        `stop_after` (harness, weights or content) with the decisions taken so far."""
        if stop_after is not None and stop_after not in PHASES[:-1]:
            raise ImproveError(f"--stop-after must be one of {', '.join(PHASES[:-1])}, got {stop_after!r}")
        state = self.state
        begin(state)
        try:
            base = cell(state, "harness/seed-dev", "dev", state.dev_tasks, state.seed_spec, state.config.model)
            evolved = harness_phase(state, base)
            if stop_after == "harness":
                return self._partial("harness")
            weights = weights_phase(state, base, evolved)
            if stop_after == "weights":
                return self._partial("weights")
            content = content_phase(state, evolved, weights)
            if stop_after == "content":
                return self._partial("content")
            return final_phase(state, evolved, weights, content)
        finally:
            release(state)

    def _partial(self, phase: str) -> ImproveStopped:
        return ImproveStopped(stopped_after=phase, decisions=self.state.decisions, folder=str(self.state.out))


def run_improve(
    config: ImproveConfig,
    out: str | Path,
    *,
    resume: bool = False,
    stop_after: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
    console: Console | None = None,
    models: Mapping[str, ModelChoice] | None = None,
) -> ImproveResult | ImproveStopped:
    """`harnessrl improve` as a library call; returns improve.json's content (or the decisions so
    far, with `stop_after`). `models`: the models the job kernel chose (chosen here when None)."""
    job = Improve(config, out, resume=resume, progress=progress, log=log, console=console, models=models)
    return job.run(stop_after=stop_after)
