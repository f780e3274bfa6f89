"""The runner: many episodes in flight, one batched generation per turn.

At every turn the runner gathers the pending model call of every episode in flight and issues
ONE batched `Policy.complete_each`, then steps each episode with its reply. Finished episodes are
graded, written to the store at once, and replaced by new ones up to `max_in_flight`.

Seeds: every request carries its own sampling seed, `request_seed(sampling.seed, task id,
attempt, turn)`, so an episode's samples do not depend on its batch neighbours or on how many
calls came before (a resumed run replays them), and the same task/attempt/turn under two
harnesses shares its random numbers.

Time: an episode's own time is the latency of the generation calls that served its turns plus
the time its own steps took (tools); time spent waiting while other episodes of the batch run
their tools is not its own. `rules.timeout_s` limits own time; the trajectory records both own
time (`own_s`) and wall time (`duration_s`).

Failures:
- per-episode limits (steps, tokens, own time) end an episode with a termination reason;
- a crash inside a tool, the environment setup or the grader, or a failed model request, is an
  infrastructure error of that episode alone: it is re-run from scratch up to `max_retries`
  times, then recorded with termination `error` (excluded from metric denominators). The other
  episodes of the batch and the run go on.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harnessrl.harness.loops import Episode, InfraError, _short_tb, episode_id
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.base import Policy, PolicyError, SamplingParams, request_seed
from harnessrl.tasks.base import Task
from harnessrl.types import ModelCall, Termination, Trajectory


@dataclass
class Job:
    task: Task
    harness: HarnessSpec
    attempt: int
    retries: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.task.id, self.harness.name, self.attempt)


def make_jobs(tasks: list[Task], harnesses: list[HarnessSpec], attempts: int) -> list[Job]:
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
    the completion tokens of that call over its own elapsed time."""

    episodes: int = 0
    passed: int = 0
    graded: int = 0
    infra_errors: int = 0
    completion_tokens: int = 0
    generate_s: float = 0.0
    batches: int = 0

    @property
    def pass_rate(self) -> float:
        return self.passed / self.graded if self.graded else 0.0


class Runner:
    def __init__(
        self,
        policy: Policy,
        sampling: SamplingParams | None = None,
        max_in_flight: int = 16,
        max_retries: int = 2,
        on_episode: Callable[[Trajectory], None] | None = None,
        progress: bool = True,
    ):
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.policy = policy
        self.sampling = sampling or SamplingParams()
        self.max_in_flight = max_in_flight
        self.max_retries = max_retries
        self.on_episode = on_episode
        self.progress = progress
        self.stats = RunStats()

    def run(self, jobs: Iterable[Job]) -> list[Trajectory]:
        self.stats = RunStats()
        pending = deque(jobs)
        total = len(pending)
        results: list[Trajectory] = []
        in_flight: list[Episode] = []
        t_start = time.monotonic()
        console = Console(stderr=True)
        # Not a terminal (CI logs, `make demo | tee`): no live bar, a plain line every ~10 %.
        log_every = 0 if console.is_terminal or not self.progress else max(1, total // 10)
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

            def record(traj: Trajectory, job: Job) -> None:
                if traj.is_infra_error and job.retries < self.max_retries:
                    pending.appendleft(Job(job.task, job.harness, job.attempt, job.retries + 1))
                    return
                self.stats.episodes += 1
                if traj.is_infra_error:
                    self.stats.infra_errors += 1
                elif traj.grade is not None:
                    self.stats.graded += 1
                    self.stats.passed += int(traj.grade.passed)
                if self.on_episode is not None:
                    self.on_episode(traj)  # the store commits here, before anything else happens
                results.append(traj)
                elapsed = max(time.monotonic() - t_start, 1e-9)
                tok_s = self.stats.completion_tokens / elapsed
                bar.update(
                    task_bar, advance=1, pass_rate=self.stats.pass_rate, tok_s=tok_s, infra=self.stats.infra_errors
                )
                if log_every and (self.stats.episodes % log_every == 0 or self.stats.episodes == total):
                    console.print(
                        f"episodes {self.stats.episodes}/{total}  pass {self.stats.pass_rate:.0%}  "
                        f"{tok_s:.0f} tok/s  infra {self.stats.infra_errors}  {elapsed:.0f} s",
                        highlight=False,
                    )

            jobs_of: dict[int, Job] = {}
            while pending or in_flight:
                while pending and len(in_flight) < self.max_in_flight:
                    job = pending.popleft()
                    try:
                        ep = Episode(job.task, job.harness, job.attempt, retries=job.retries)
                    except InfraError as e:
                        record(_infra_trajectory(job, str(e)), job)
                        continue
                    in_flight.append(ep)
                    jobs_of[id(ep)] = job

                for ep in in_flight:
                    t = ep.rules.timeout_s
                    if not ep.done and t is not None and ep.elapsed() > t:
                        ep.terminate(Termination.timeout, f"own time (model + tools) over {t:g} s")
                active = [ep for ep in in_flight if not ep.done]
                if active:
                    self._turn(active)
                still: list[Episode] = []
                for ep in in_flight:
                    if ep.done:
                        record(ep.finish(), jobs_of.pop(id(ep)))
                    else:
                        still.append(ep)
                in_flight = still
        return results

    def _turn(self, active: list[Episode]) -> None:
        """One batched generation for every active episode, then each episode's own step."""
        requests = []
        for ep in active:
            request = ep.request()
            request.seed = request_seed(self.sampling.seed, ep.task.id, ep.attempt, len(ep.steps))
            requests.append(request)
        t0 = time.monotonic()
        try:
            outcomes = self.policy.complete_each(requests, self.sampling)
            if len(outcomes) != len(requests):
                raise PolicyError(f"backend returned {len(outcomes)} outcomes for {len(requests)} requests")
        except PolicyError as e:  # the backend could not say which request failed: all of them did
            outcomes = [e] * len(requests)
        latency = time.monotonic() - t0
        self.stats.generate_s += latency
        self.stats.batches += 1
        for ep, outcome in zip(active, outcomes):
            ep.add_model_time(latency)  # lock-step: the call that served this turn took this long
            if not isinstance(outcome, ModelCall):
                ep.infra_error = f"model backend failed: {outcome}"
                ep.terminate(Termination.error, "model backend failed")
                continue
            self.stats.completion_tokens += outcome.completion_tokens
            try:
                ep.consume(outcome)
            except InfraError as e:
                ep.infra_error = str(e)
                ep.terminate(Termination.error, "infrastructure error")
            except Exception as e:  # a bug in a harness hook must not kill the run
                ep.infra_error = f"episode crashed: {_short_tb(e)}"
                ep.terminate(Termination.error, "infrastructure error")


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
