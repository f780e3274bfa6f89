"""The executor interface, the local executor, and EpisodeRun: one episode's turn logic, the
same code wherever the episode lives (see the package's docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol

from harnessrl.errors import JobError
from harnessrl.harness.loops import Episode, InfraError, short_traceback
from harnessrl.models.base import GenerationRequest, request_seed
from harnessrl.types import ModelCall, Termination, Trajectory

if TYPE_CHECKING:
    from harnessrl.harness.spec import AnyHarnessSpec, HarnessSpec
    from harnessrl.tasks.base import Task


class ExecutorError(JobError):
    """The executor cannot run episodes as asked (Ray missing or unreachable, a task that cannot
    be sent to the workers, ...): a clear error for the whole run, before or instead of episodes."""


class EpisodeLost(InfraError):
    """The worker that held an episode is gone (its process or node died): the episode's progress
    is lost with it, and the Runner re-runs it from scratch."""


class EpisodeHandle(Protocol):
    def start(self) -> GenerationRequest | None: ...

    def reply(self, call: ModelCall, latency: float) -> GenerationRequest | None: ...

    def model_failed(self, latency: float, message: str) -> None: ...

    def finish(self) -> Trajectory: ...

    def close(self) -> None: ...


class EpisodeRun:
    """One episode and the part of each turn that runs beside its environment: the own-time limit
    and the request before each model call, applying the reply (the tools run here), grading.
    Every failure of a hook or a tool ends the episode with a recorded reason; nothing but a bug
    outside every hook escapes. `seed` is the run's sampling seed (each request gets its own,
    from it and the episode's task, attempt and turn)."""

    def __init__(self, task: Task, harness: HarnessSpec, attempt: int, retries: int, seed: int):
        self.episode = Episode(task, harness, attempt, retries=retries)  # InfraError: setup failed
        self.seed = seed

    def start(self) -> GenerationRequest | None:
        ep = self.episode
        if ep.done:
            return None
        t = ep.rules.timeout_s
        if t is not None and ep.elapsed() > t:
            ep.terminate(Termination.timeout, f"own time (model + tools) over {t:g} s")
            return None
        try:
            request = ep.request()
        except Exception as e:  # a bug in a harness hook must not kill the run
            _crashed(ep, e)
            return None
        request.seed = request_seed(self.seed, ep.task.id, ep.attempt, len(ep.steps))
        return request

    def reply(self, call: ModelCall, latency: float) -> GenerationRequest | None:
        """Apply the model's reply (its latency is the episode's own time); the next request."""
        ep = self.episode
        ep.add_model_time(latency)
        try:
            ep.consume(call)
        except InfraError as e:
            ep.infra_error = str(e)
            ep.terminate(Termination.error, "infrastructure error")
        except Exception as e:  # a bug in a harness hook must not kill the run
            _crashed(ep, e)
        return self.start()

    def model_failed(self, latency: float, message: str) -> None:
        """The request failed in the model backend: an infrastructure error of this episode."""
        ep = self.episode
        ep.add_model_time(latency)
        ep.infra_error = message
        ep.terminate(Termination.error, "model backend failed")

    def finish(self) -> Trajectory:
        return self.episode.finish()  # grading, here

    def close(self) -> None:
        """Remove the workspace of an episode that will not be graded; a failure to do so changes nothing."""
        try:
            self.episode.env.close()
        except Exception:  # noqa: BLE001
            pass


def _crashed(ep: Episode, e: Exception) -> None:
    ep.infra_error = f"episode crashed: {short_traceback(e)}"
    ep.terminate(Termination.error, "infrastructure error")


class Executor:
    """Where episodes live; the base is the local executor's behaviour. Use it as a context
    manager (or `close()` it): a remote executor holds workers until then."""

    kind = "local"

    def describe(self) -> dict[str, Any]:
        """What a run folder records about where its episodes ran (never compared on resume)."""
        return {"kind": self.kind}

    def start(self) -> None:
        """Get ready to run episodes (connect to a cluster); raises ExecutorError. Also done by the
        first `prepare`: call it early to report a connection problem before slow work."""

    def prepare(self, tasks: Iterable[Task], harnesses: Iterable[AnyHarnessSpec]) -> None:
        """Check, before any episode runs, that every task and harness can go where episodes run;
        raises ExecutorError naming the first that cannot."""

    def open(self, task: Task, harness: HarnessSpec, attempt: int, retries: int, seed: int) -> EpisodeHandle:
        """Set up one episode; raises InfraError when its environment cannot be set up."""
        return EpisodeRun(task, harness, attempt, retries, seed)

    def close(self) -> None:
        """Release the workers (a later `open` is refused by a remote executor)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalExecutor(Executor):
    """Every episode in this process, in the Runner's thread of that episode."""
