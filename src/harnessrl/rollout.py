"""The runner: many episodes in flight, each advancing on its own.

Every episode runs in a worker thread of its own (at most `max_in_flight` at once): it sets up its
environment, then asks the model (`Policy.submit`, one request at a time), waits for that reply
only, runs its tools, and asks again, until it ends; then it is graded. Where the environment,
tools and grader live is the executor's choice (executors.py: in this thread by default, or in a
Ray actor on a cluster node, driven from this thread); the model calls always stay here. An
episode never waits for another one: a slow tool or a long completion holds up its own episode
alone, and the backend batches whatever requests are in flight at the moment (the local engine
joins them into its running batch, an HTTP backend sends them concurrently). Finished episodes
go back to the thread that called `run`, which alone records them (`on_episode`: the store
commits there), re-queues infrastructure failures, keeps the counters and draws the progress.

Seeds: every request carries its own sampling seed, `request_seed(sampling.seed, task id,
attempt, turn)`, so an episode's samples depend on the episode alone, not on what else was in
flight, on the order replies came back, or on how many calls came before (a resumed run replays
them), and the same task/attempt/turn under two harnesses shares its random numbers.

Time: an episode's own time is its setup and grading, the latency of each of its model requests
(from submission to reply, queueing in the backend included) and its own steps (tools).
`rules.timeout_s` limits own time and is checked before each request; the trajectory records
both own time (`own_s`) and wall time (`duration_s`).

Failures:
- per-episode limits (steps, tokens, own time) end an episode with a termination reason;
- a crash inside a tool, the environment setup, a harness hook or the grader, or a failed model
  request (the request's future holds a PolicyError), is an infrastructure error of that episode
  alone: it is re-run from scratch up to `max_retries` times, then recorded with termination
  `error` (excluded from metric denominators). The other episodes and the run go on. So is the
  loss of the worker that held an episode (a remote executor's process or node dying).
- Ctrl-C (and SIGTERM, which the command line turns into the same KeyboardInterrupt): no new
  episode starts; every episode recorded before is already stored. Episodes still running stop
  at their next turn and are not recorded: an agent program is killed, a request waiting for
  the model is withdrawn, the environment is closed (its workspace removed, its services
  stopped). `run` gives them STOP_GRACE_S to get there, then raises KeyboardInterrupt; an
  episode stuck longer (a tool that does not return) is left behind in its daemon thread, so the
  process can still exit. A second Ctrl-C cuts the wait short.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harnessrl.executors import EpisodeHandle, EpisodeLost, Executor, LocalExecutor
from harnessrl.harness.loops import InfraError, episode_id
from harnessrl.harness.spec import AnyHarnessSpec, ExternalHarnessSpec
from harnessrl.models.base import Policy, PolicyError, SamplingParams
from harnessrl.tasks.base import Task
from harnessrl.types import ModelCall, Termination, Trajectory

if TYPE_CHECKING:
    from harnessrl.harness.external import ExternalEpisodes

# how often an episode waiting for its reply looks whether the run was interrupted (seconds)
_STOP_POLL_S = 0.2
# how long an interrupted run waits for its running episodes to wind down (seconds)
STOP_GRACE_S = 10.0


@dataclass
class Job:
    task: Task
    harness: AnyHarnessSpec
    attempt: int
    retries: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.task.id, self.harness.name, self.attempt)


class EpisodePolicies(Protocol):
    """Where every episode gets a policy of its own, made for its task when it starts (the oracle:
    harness/oracle.py), rather than one model serving them all."""

    name: str

    def for_episode(self, task: Task, spec: AnyHarnessSpec) -> Policy:
        """The policy of one episode (of one try of it: a retried episode gets a fresh one)."""
        ...

    def describe(self) -> dict: ...


def make_jobs(tasks: list[Task], harnesses: Sequence[AnyHarnessSpec], attempts: int) -> list[Job]:
    """tasks x harnesses x attempts, harness-major so early results cover every harness."""
    jobs = []
    for a in range(attempts):
        for t in tasks:
            for h in harnesses:
                jobs.append(Job(t, h, a))
    return jobs


@dataclass
class RunStats:
    """Counters of one `Runner.run` call (reset at the start of each), so tokens per second is
    the completion tokens of that call over its own wall time. Requests and their tokens count
    as they are served, those of episodes later retried included."""

    episodes: int = 0
    passed: int = 0
    graded: int = 0
    infra_errors: int = 0
    requests: int = 0
    completion_tokens: int = 0
    model_s: float = 0.0  # the sum of request latencies (requests overlap: it can exceed wall_s)
    wall_s: float = 0.0

    @property
    def pass_rate(self) -> float:
        return self.passed / self.graded if self.graded else 0.0

    @property
    def tok_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0


class _Stopped(Exception):
    """The run was interrupted while this episode waited for its reply."""


class Runner:
    """Runs jobs with `policy`: one model for every episode, or EpisodePolicies (a policy per episode)."""

    def __init__(
        self,
        policy: Policy | EpisodePolicies,
        sampling: SamplingParams | None = None,
        max_in_flight: int = 16,
        max_retries: int = 2,
        on_episode: Callable[[Trajectory], None] | None = None,
        progress: bool = True,
        executor: Executor | None = None,
    ):
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.policy = policy
        self.sampling = sampling or SamplingParams()
        self.max_in_flight = max_in_flight
        self.max_retries = max_retries
        self.on_episode = on_episode
        self.progress = progress
        self.executor = executor if executor is not None else LocalExecutor()  # the caller closes it
        self.stats = RunStats()
        self._stats_lock = threading.Lock()  # workers count requests and tokens as they come
        # the external harnesses' episodes of the current run (harness/external.py)
        self._external: ExternalEpisodes | None = None
        self._external_lock = threading.Lock()

    def run(self, jobs: Iterable[Job]) -> list[Trajectory]:
        """Run every job (and the retries of its infrastructure failures); returns the recorded
        trajectories in job order, whatever order they finished in (`on_episode` sees them as they
        finish, from this thread only)."""
        self.stats = RunStats()
        sampling = self.sampling  # fixed for this call, whatever is assigned meanwhile
        pending = deque(enumerate(jobs))  # (position in `jobs`, job): results come back in job order
        total = len(pending)
        # every task and harness must be able to go where the episodes run: a clear error before any runs
        self.executor.prepare([job.task for _, job in pending], [job.harness for _, job in pending])
        results: dict[int, Trajectory] = {}
        finished: queue.SimpleQueue[tuple[int, Job, Trajectory | BaseException | None]] = queue.SimpleQueue()
        stop = threading.Event()
        t_start = time.monotonic()
        console = Console(stderr=True)
        # Not a terminal (CI logs, `make demo | tee`): no live bar, a plain line every ~10 %.
        log_every = 0 if console.is_terminal or not self.progress else max(1, total // 10)
        running = 0  # episodes handed to a worker thread and not handed back yet
        try:
            with Progress(
                TextColumn("[bold]episodes"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("pass {task.fields[pass_rate]:.0%}"),
                TextColumn("{task.fields[tok_s]:.0f} tok/s"),
                TextColumn("infra {task.fields[infra]}"),
                TimeElapsedColumn(),
                console=console,
                disable=not self.progress or not console.is_terminal,
                transient=False,
            ) as bar:
                task_bar = bar.add_task("run", total=total, pass_rate=0.0, tok_s=0.0, infra=0)

                def record(position: int, traj: Trajectory, job: Job) -> None:
                    if traj.is_infra_error and job.retries < self.max_retries:
                        pending.appendleft((position, Job(job.task, job.harness, job.attempt, job.retries + 1)))
                        return
                    self.stats.episodes += 1
                    if traj.is_infra_error:
                        self.stats.infra_errors += 1
                    elif traj.grade is not None:
                        self.stats.graded += 1
                        self.stats.passed += int(traj.grade.passed)
                    if self.on_episode is not None:
                        self.on_episode(traj)  # the store commits here, before anything else happens
                    results[position] = traj
                    self.stats.wall_s = max(time.monotonic() - t_start, 1e-9)
                    tok_s = self.stats.tok_s
                    bar.update(
                        task_bar, advance=1, pass_rate=self.stats.pass_rate, tok_s=tok_s, infra=self.stats.infra_errors
                    )
                    if log_every and (self.stats.episodes % log_every == 0 or self.stats.episodes == total):
                        console.print(
                            f"episodes {self.stats.episodes}/{total}  pass {self.stats.pass_rate:.0%}  "
                            f"{tok_s:.0f} tok/s  infra {self.stats.infra_errors}  {self.stats.wall_s:.0f} s",
                            highlight=False,
                        )

                while pending or running:
                    while pending and running < self.max_in_flight:
                        position, job = pending.popleft()
                        # a daemon thread per episode: one stuck in a tool never holds the process's exit
                        worker = threading.Thread(
                            target=self._worker,
                            args=(position, job, sampling, stop, finished),
                            name=f"episode-{position}",
                            daemon=True,
                        )
                        running += 1  # (first: Ctrl-C may come while it starts)
                        worker.start()
                    position, job, outcome = finished.get()  # Ctrl-C interrupts this wait
                    running -= 1
                    if isinstance(outcome, BaseException):
                        raise outcome  # a bug outside every episode hook: the run cannot go on
                    if outcome is not None:
                        record(position, outcome, job)
        finally:
            self.stats.wall_s = max(time.monotonic() - t_start, 1e-9)
            # on an interruption or error the running episodes see `stop` at their next turn
            stop.set()
            if running:
                _wind_down(finished, running, STOP_GRACE_S)
            if self._external is not None:  # the recording endpoint lives as long as the run
                self._external.close()
                self._external = None
        return [results[k] for k in sorted(results)]

    # -- one episode, in a worker thread -----------------------------------------------------------
    def _worker(
        self,
        position: int,
        job: Job,
        sampling: SamplingParams,
        stop: threading.Event,
        finished: queue.SimpleQueue,
    ) -> None:
        """Plays one job and hands its trajectory (None when interrupted), or the exception that
        escaped every hook, to the run's thread. Always hands something: the run waits for it."""
        try:
            outcome: Trajectory | BaseException | None = self._play(job, sampling, stop)
        except BaseException as e:  # noqa: BLE001 - re-raised by the run's thread
            outcome = e
        finished.put((position, job, outcome))

    def _play(self, job: Job, sampling: SamplingParams, stop: threading.Event) -> Trajectory | None:
        if stop.is_set():
            return None
        policy = self.policy if isinstance(self.policy, Policy) else self.policy.for_episode(job.task, job.harness)
        if isinstance(job.harness, ExternalHarnessSpec):  # an agent program of its own: harness/external.py
            from harnessrl.harness.external import ExternalEpisodes

            with self._external_lock:
                external = self._external = self._external or ExternalEpisodes(self._count)
            return external.play(job, policy, sampling, stop)
        try:
            handle = self.executor.open(job.task, job.harness, job.attempt, job.retries, sampling.seed)
        except InfraError as e:  # the environment could not be set up, or its worker was lost
            return _infra_trajectory(job, str(e))
        try:
            if not self._advance(handle, policy, sampling, stop):
                handle.close()
                return None
            return handle.finish()  # grading, where the episode lives
        except EpisodeLost as e:  # its worker is gone, and its progress with it: re-run from scratch
            return _infra_trajectory(job, str(e))
        except BaseException:
            handle.close()
            raise

    def _advance(self, handle: EpisodeHandle, policy: Policy, sampling: SamplingParams, stop: threading.Event) -> bool:
        """Turns until the episode ends; False if the run was interrupted first."""
        request = handle.start()
        while request is not None:
            if stop.is_set():
                return False
            t0 = time.monotonic()
            try:
                call = _wait(policy.submit(request, sampling), stop)
            except _Stopped:
                return False
            except (PolicyError, CancelledError) as e:  # this request failed: this episode alone does
                latency = time.monotonic() - t0
                self._count(latency, None)
                handle.model_failed(latency, f"model backend failed: {str(e) or type(e).__name__}")
                break
            latency = time.monotonic() - t0
            self._count(latency, call)
            request = handle.reply(call, latency)  # the tools run there, where the episode lives
        return True

    def _count(self, latency: float, call: ModelCall | None) -> None:
        with self._stats_lock:
            self.stats.requests += 1
            self.stats.model_s += latency
            if call is not None:
                self.stats.completion_tokens += call.completion_tokens


def _wind_down(finished: queue.SimpleQueue, running: int, grace_s: float) -> None:
    """Wait (at most `grace_s`, less if Ctrl-C comes again) until the `running` episodes of an
    interrupted run have handed back what they hold: their programs killed, environments closed."""
    deadline = time.monotonic() + grace_s
    try:
        while running and (left := deadline - time.monotonic()) > 0:
            finished.get(timeout=left)
            running -= 1
    except (queue.Empty, KeyboardInterrupt):
        pass


def _wait(future: Future[ModelCall], stop: threading.Event) -> ModelCall:
    """The future's ModelCall (or its exception); raises _Stopped, cancelling the request if it
    has not started, once the run is interrupted."""
    while True:
        try:
            return future.result(timeout=_STOP_POLL_S)
        except FutureTimeout:
            if future.done():  # the request itself failed with a timeout
                raise
            if stop.is_set():
                future.cancel()
                raise _Stopped from None


def _infra_trajectory(job: Job, error: str) -> Trajectory:
    t = job.task
    return Trajectory(
        episode_id=episode_id(t.id, job.harness.name, job.attempt),
        task_id=t.id,
        suite=t.suite,
        family=t.family,
        split=t.split,
        harness=job.harness.name,
        attempt=job.attempt,
        instruction=t.instruction,
        termination=Termination.error,
        termination_detail="infrastructure error",
        infra_error=error,
        retries=job.retries,
        started_at=time.time(),
    )
