"""The job: Improve checks its options and sets up the job's state (ImproveState), then runs the
phases in order (harness, weights, content, final), each a function of its own module over that
state, each phase's result handed to the next; run_improve is the library call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnessrl.improve.config import PHASES, ImproveError
from harnessrl.improve.content import content_phase
from harnessrl.improve.final import final_phase
from harnessrl.improve.harness import harness_phase
from harnessrl.improve.record import ImproveState, begin, cell, release
from harnessrl.improve.weights import weights_phase
from harnessrl.results import ImproveResult, ImproveStopped
from harnessrl.rundir import RunFolder

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext


class Improve:
    """`Improve(ctx)` (its context from the job kernel, which read the suite, tasks and harnesses
    its options name) checks what is left and raises ImproveError (nothing is written);
    `run(stop_after=PHASE)` runs the phases and returns improve.json's content (or, stopped after
    a phase, what is decided so far). `state`: the job's ImproveState; `record`: what
    OUT/config.json records."""

    def __init__(self, ctx: JobContext):
        from harnessrl.kernel import job_record
        from harnessrl.train import lora
        from harnessrl.train.distill import check_protocols

        c, inputs = ctx.config, ctx.inputs
        model = lora.trained_model(c, ImproveError, ctx.model())  # it is fine-tuned
        assert model.device is not None and model.dtype is not None  # a local model's choice is resolved
        seed_spec, given = inputs.harness["seed_harness"], inputs.harness["evolved"]
        if given is not None:
            check_protocols(seed_spec, given)
        evolved_spec = None if given is None else given.to_dict()
        self.record = job_record(c.model_dump(), model, seed_spec=seed_spec.to_dict(), evolved_spec=evolved_spec)
        folder = RunFolder.open(ctx.out, "improvement", self.record, resume=ctx.resume, may_differ=("device",))
        self.state = ImproveState(
            config=c,
            out=ctx.out,
            progress=ctx.progress,
            log=ctx.log,
            console=ctx.console,
            device=model.device,
            dtype=model.dtype,
            seed_spec=seed_spec,
            given=given,
            suite=inputs.suite,
            dev_tasks=inputs.tasks["dev_tasks"],
            test_tasks=inputs.tasks["test_tasks"],
            content_pool=inputs.tasks["content_tasks"],
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


def run_improve(ctx: JobContext, stop_after: str | None = None) -> ImproveResult | ImproveStopped:
    """`harnessrl improve` over its job context (harnessrl.kernel.enter); returns improve.json's
    content (or the decisions so far, with `stop_after`)."""
    return Improve(ctx).run(stop_after=stop_after)
