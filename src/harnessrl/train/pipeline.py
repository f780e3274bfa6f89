"""The GRPO trainer's rollouts: the plans of the next steps, their collection, and the rounds of
one step, in a small class with explicit state (`RolloutPipeline`).

    sync       the current weights on the rollout servers (a new policy version), if not there yet
    plan       the plans up to step + N made (bound to the current version), this step's taken
    collect    the step's rounds: the first (collected ahead, or now), then dynamic sampling's refills
    version    the policy version of the weights as they are (steps that updated so far)

It is given its collaborators: the scheduler and the task RNG (the decisions), the rollout
servers and the runner (the episodes), the `Distributed` object (several processes), and two
callables of the trainer, one that publishes a policy version's weights to the servers and one
that copies the adapter's weights as they are. The trainer reads the result (`StepRollouts`),
updates the model, and counts the new version (`version += 1`).

Asynchronous collection (--max-off-policy-steps N > 0, only with --rollout-server; docs/training.md
"Asynchronous collection"). The loop keeps a pipeline of plans: at the start of step k (after the
current weights are published) the plan of step k + N is made — the scheduler selects with the
observations of steps 0 .. k-1 only (step k's batch has not been trained yet, let alone
observed), the task RNG draws its tasks — and it is bound to the current policy version V(k+N)
= the weights after step k-1's update. A collector thread runs the plans' first rounds one after
the other on the servers under their bound version (`RolloutServers.at_version`, pinned there
until every process has gathered the batch), so step k+1's episodes are sampled while step k
trains. A unit of step j is trained from the weights after the updates of steps < j: its lag is
the number of updates among steps j-N .. j-1, at most N by construction, so no episode ever has
to be re-sampled for staleness (every call is still checked before the update). Because every
decision and every sampling version is a function of the step alone, not of timing, a run is
reproducible and resumes exactly: the checkpoint holds the plans already made for the next
steps and the weights of the older versions they are bound to (pinned_adapters.pt); a resumed
run republishes those versions and collects the same episodes. A plan past --steps is made too
(a longer resumed run must see the same decisions) but not collected. With N = 0 nothing runs
ahead: the plan of step k is made at step k and collected in the training thread, as always. The
in-process engine samples with the very weights being trained, so the trainer refuses N > 0 with
it (not implemented).

Dynamic sampling (--dynamic-sampling, --max-sampling-rounds R): a group whose rewards are all
equal has no gradient. After the first round, while fewer than tasks_per_step groups of every
process carry signal (non-zero advantages) and fewer than R rounds ran, a refill round draws
that many fresh tasks from the task RNG under the same selection (no new scheduler decision),
with attempt numbers of its own (`attempt_base`), in the training thread under the current
weights. Only the groups with signal are trained; the scheduler observes every group of every
round, the flat ones' zeros included (they are what learnability measures). The decision is
taken from the all-gathered statistics, so every process refills alike.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from harnessrl.train.config import TrainConfig
from harnessrl.train.distributed import Distributed
from harnessrl.train.grpo import TrainingUnit
from harnessrl.train.step import (
    BatchStats,
    LocalBatch,
    StepPlan,
    attempt_base,
    batch_stats,
    group_batch,
    plan_step,
    refill_plan,
    sampling_seed,
)

Weights = dict[str, Any]  # a CPU copy of the adapter's weights (one policy version)


@dataclass
class PendingStep:
    """A planned step: its plan, the policy version its first round is sampled by, and (with
    --max-off-policy-steps) that round's collection, handed to the collector thread."""

    plan: StepPlan
    version: int
    future: Future | None = None
    pinned: bool = False


@dataclass
class Round:
    """One round of a step's rollouts, as this process ran it and every process's statistics."""

    trajectories: list
    units: list[TrainingUnit]
    parts: list[LocalBatch]
    started: float
    ended: float
    waited: float  # seconds the training thread waited for it


@dataclass
class StepRollouts:
    """A step's rollouts, every round of them, as the update and the step's record read them."""

    pending: PendingStep
    merged: StepPlan  # every round's groups, in order (advantages and statistics index them)
    rounds: list[Round]
    stats: BatchStats
    lags: Counter[int]  # model calls of every process by policy lag (empty without rollout servers)
    seed: int  # the step's sampling seed

    @property
    def units(self) -> list[TrainingUnit]:
        return [u for r in self.rounds for u in r.units]


def signal_groups(rounds: list[Round]) -> int:
    """Groups so far, of every process, whose advantages are not all 0."""
    return sum(
        o.advantages is not None and any(a != 0 for a in o.advantages)
        for r in rounds
        for part in r.parts
        for o in part.groups.values()
    )


class RolloutPipeline:
    """The plans made and not yet trained (in step order), the collector thread that runs them
    ahead, the rounds of each step, and the policy versions the servers keep for them."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        scheduler,
        task_rng: random.Random,
        train_tasks: list,
        spec_by_name: dict,
        servers,
        runner,
        dist: Distributed,
        executor,
        publish: Callable[[int, Weights | None], None],
        weights: Callable[[], Weights],
        error: type[Exception],
    ):
        self.config = config
        self.scheduler = scheduler
        self.task_rng = task_rng
        self.train_tasks = train_tasks
        self.spec_by_name = spec_by_name
        self.servers = servers  # RolloutServers, or None (the in-process engine)
        self.runner = runner  # the training thread's runner
        self.dist = dist
        self.executor = executor
        self._publish_weights = publish  # writes policy `version` to the servers (weights: None for the current)
        self._weights = weights  # a CPU copy of the adapter's weights as they are now
        self.error = error
        self.version = 0  # the policy version of the weights as they are: steps that updated so far
        self.pending: deque[PendingStep] = deque()
        self.next_plan = 0  # the next step to plan
        self.rounds = config.max_sampling_rounds if config.dynamic_sampling else 1  # per step (attempt numbers)
        self.collector: ThreadPoolExecutor | None = None  # runs plans ahead (--max-off-policy-steps)
        if servers is not None and config.max_off_policy_steps > 0:  # one thread: plans one after the other
            self.collector = ThreadPoolExecutor(max_workers=1, thread_name_prefix="collector")
        self.snapshots: dict[int, Weights] = {}  # rank 0: weights of versions plans are bound to
        self.store = None  # rank 0's RunStore of training episodes (`save_into`)

    def save_into(self, store) -> None:
        """Rank 0 keeps every training episode in `store`: the runner adds each as it ends, or,
        when plans are collected ahead, the training thread each round as its step takes it."""
        self.store = store
        if self.collector is None:
            self.runner.on_episode = store.add

    # -- policy versions on the servers ---------------------------------------------------------------
    def sync(self) -> float:
        """With --rollout-server: the adapter as it is now, published to every server under a name
        and from a folder never used before (vLLM keys its prefix cache by both: an in-place
        reload would keep serving keys and values of older weights), unless they hold it already.
        Before the run's first rollout the servers are also probed: their log-probs must be the
        trainer's own at the run's temperature (`RolloutServers.probe`, recorded in config.json
        as rollout_probe). Returns the seconds spent."""
        if self.servers is None or self.servers.version == self.version:
            return 0.0
        return self.publish(self.version)

    def publish(self, version: int, weights: Weights | None = None) -> float:
        """Policy `version` on the servers: the current weights, or `weights` (an older version a
        restored plan is bound to). Returns the seconds spent."""
        t0 = time.perf_counter()
        self._publish_weights(version, weights)
        if self.collector is not None and self.dist.is_main:  # a checkpoint may have to hold it
            self.snapshots[version] = weights if weights is not None else self._weights()
        self.servers.version = version
        bound = {p.version for p in self.pending} | {self.version}
        self.snapshots = {v: w for v, w in self.snapshots.items() if v in bound}
        return time.perf_counter() - t0

    # -- the plans --------------------------------------------------------------------------------------
    def plan(self, step: int) -> PendingStep:
        """Plan every step up to step + max_off_policy_steps that has no plan yet and take this
        step's plan: the scheduler decides with what it has observed now (steps before this one),
        the task RNG draws, and each plan is bound to the current policy version. With N > 0 the
        collection of each new plan is handed to the collector (it runs the plans in order, while
        the training thread trains); a plan past --steps is made (a longer resumed run must see
        the same decisions) but not collected: the checkpoint keeps it."""
        cfg = self.config
        while self.next_plan <= step + cfg.max_off_policy_steps:
            plan = plan_step(
                self.scheduler, self.task_rng, self.train_tasks, self.spec_by_name, cfg.tasks_per_step, self.next_plan
            )
            # Several processes take this decision each from the same seeded state: it must agree.
            self.dist.check_same(plan.fingerprint(), "the step's harnesses and tasks")
            self.pending.append(self._launch(PendingStep(plan, self.version)))
            self.next_plan += 1
        return self.pending.popleft()

    def _launch(self, pending: PendingStep) -> PendingStep:
        """Asynchronous runs: pin the plan's version on the servers and, if the step is one this
        run trains, hand its collection to the collector thread."""
        from harnessrl.rollout import Runner

        if self.collector is None:
            return pending
        if not pending.pinned:
            self.servers.pin(pending.version)
            pending.pinned = True
        if pending.future is None and pending.plan.step < self.config.steps:
            seed = sampling_seed(self.config.seed, pending.plan.step, "train")
            runner = Runner(
                self.servers.at_version(pending.version),
                self.runner.sampling.model_copy(update={"seed": seed}),
                max_in_flight=self.config.max_in_flight,
                max_retries=self.config.retries,
                progress=False,
                executor=self.executor,
            )
            pending.future = self.collector.submit(self._collect, pending.plan, 0, runner, seed)
        return pending

    # -- the rounds of a step ---------------------------------------------------------------------------
    def collect(self, pending: PendingStep) -> StepRollouts:
        """The step's rollouts: round 0 (collected ahead, or now), then dynamic sampling's refills,
        always now, under the current weights (their decision needs every process's groups)."""
        cfg = self.config
        plan, step = pending.plan, pending.plan.step
        seed = sampling_seed(cfg.seed, step, "train")
        rounds = [self._finish_round(plan, 0, *self._round_zero(pending))]
        merged = plan
        while cfg.dynamic_sampling and len(rounds) < cfg.max_sampling_rounds:
            need = cfg.tasks_per_step - signal_groups(rounds)
            if need <= 0:
                break
            refill = refill_plan(plan, self.task_rng, self.train_tasks, self.spec_by_name, need)
            self.dist.check_same(refill.fingerprint(), "the step's refill groups")
            offset = len(merged.assignment)
            merged = dataclasses.replace(merged, assignment=merged.assignment + refill.assignment)
            collected = self._collect(refill, len(rounds), self.runner, seed)
            rounds.append(self._finish_round(merged, offset, *collected))
        if self.servers is not None and pending.pinned:
            self.servers.unpin(pending.version)  # every process has gathered its batch: done with it
        stats = batch_stats(merged, [p for r in rounds for p in r.parts])
        lags = self._lag_histogram([t for r in rounds for t in r.trajectories])
        if lags and max(lags) > cfg.max_off_policy_steps:  # the pipeline's depth makes this impossible
            raise RuntimeError(
                f"step {step + 1}: a unit would be trained {max(lags)} policy versions after the one that sampled "
                f"it, more than --max-off-policy-steps {cfg.max_off_policy_steps} (a bug of the trainer's pipeline)"
            )
        return StepRollouts(pending, merged, rounds, stats, lags, seed)

    def _round_zero(self, pending: PendingStep) -> tuple[list, float, float, float]:
        """The step's first round: collected now (synchronous), or waited for (asynchronous)."""
        if self.collector is None:
            return self._collect(
                pending.plan, 0, self.runner, sampling_seed(self.config.seed, pending.plan.step, "train")
            )
        self._launch(pending)  # a plan restored from a checkpoint of a shorter run
        assert pending.future is not None  # _launch submits every step this run trains
        t0 = time.perf_counter()
        trajectories, started, ended, _ = pending.future.result()
        return trajectories, started, ended, time.perf_counter() - t0

    def _collect(self, plan: StepPlan, round_: int, runner, seed: int) -> tuple[list, float, float, float]:
        """This process's groups of `plan` (round `round_` of its step), G attempts each, sampled
        with the step's seed; returns (trajectories, started, ended, seconds waited)."""
        from harnessrl.rollout import Job

        G = self.config.group_size
        base = attempt_base(plan.step, round_, G, self.rounds)
        mine = self.dist.shard(len(plan.assignment))
        jobs = [Job(task, spec, base + i) for task, spec in (plan.assignment[g] for g in mine) for i in range(G)]
        if runner is self.runner:  # the training thread's runner: its sampling is the step's
            runner.sampling = runner.sampling.model_copy(update={"seed": seed})
        started = time.perf_counter()
        trajectories = runner.run(jobs)
        ended = time.perf_counter()
        return trajectories, started, ended, ended - started

    def _finish_round(
        self, merged: StepPlan, offset: int, trajectories: list, started: float, ended: float, waited: float
    ) -> Round:
        """Advantages of this process's groups of a round (indices offset.. of `merged`), every
        process's statistics of them, and the episodes into rank 0's store."""
        cfg = self.config
        n = len(merged.assignment) - offset
        mine = self.dist.shard(n)
        groups = range(offset + mine.start, offset + mine.stop)
        shuffle_seed = cfg.seed if cfg.advantage_control == "shuffled-rewards" else None
        units, outcomes = group_batch(
            merged, groups, trajectories, cfg.scale_advantages, cfg.dynamic_sampling, shuffle_seed
        )
        parts = self.dist.all_gather_object(LocalBatch.of(units, outcomes))  # on every process
        if cfg.save_rollouts and (self.dist.enabled or self.collector is not None):
            # rank 0 stored its own episodes as they ended, unless they were collected ahead
            own = [] if self.collector is None else trajectories
            others = self.dist.gather_object([] if self.dist.is_main else trajectories) if self.dist.enabled else [[]]
            if self.store is not None:
                for traj in [*own, *(t for part in others[1:] for t in part)]:
                    self.store.add(traj)
        return Round(trajectories, units, parts, started, ended, waited)

    def _lag_histogram(self, trajectories: list) -> Counter[int]:
        """Model calls of the step, of every process, by how many policy versions the weights they
        are trained from are past the version that sampled them (0: on-policy). Empty without
        --rollout-server (the in-process engine samples with the weights as they are)."""
        if self.servers is None:
            return Counter()
        local = Counter(
            self.version - s.model_call.policy_version
            for t in trajectories
            for s in t.steps
            if s.model_call is not None and s.model_call.policy_version is not None
        )
        return sum(self.dist.all_gather_object(local), Counter()) if self.dist.enabled else local

    # -- checkpoint, resume, end ----------------------------------------------------------------------
    def checkpoint(self) -> tuple[dict[str, Any], dict[str, Weights]]:
        """What the checkpoint holds of the pipeline (with --max-off-policy-steps): the plans already
        made for the next steps (their decisions are taken) as state entries, and the weights of
        every older version they are bound to: a resumed run samples them as this one would."""
        if self.config.max_off_policy_steps == 0:
            return {}, {}
        plans = [{"plan": p.plan.to_dict(), "version": p.version} for p in self.pending]
        pinned = {str(p.version): self.snapshots[p.version] for p in self.pending if p.version != self.version}
        return {"pipeline": plans}, pinned

    def restore(self, state: dict[str, Any], pinned: dict[str, Weights], step: int) -> None:
        """The plans and pinned weights of a checkpoint (`checkpoint`) taken after `step` steps."""
        tasks_by_id = {t.id: t for t in self.train_tasks}
        for item in state.get("pipeline", []):
            plan = StepPlan.from_dict(item["plan"], tasks_by_id, self.spec_by_name)
            self.pending.append(PendingStep(plan, int(item["version"])))
        self.next_plan = step + len(self.pending)
        self.snapshots = {int(v): w for v, w in pinned.items()}

    def resume(self) -> None:
        """A resumed asynchronous run: the older versions its restored plans are bound to go
        back on the servers (from the checkpoint's weights; the current one follows at the next
        step), and the plans' collections start again, exactly as the killed run had them."""
        if self.collector is None or not self.pending:
            return
        for pending in self.pending:  # pinned first: publishing the current version releases the others
            self.servers.pin(pending.version)
            pending.pinned = True
        for version in sorted({p.version for p in self.pending if p.version != self.version}):
            weights = self.snapshots.get(version)
            if weights is None and self.dist.is_main:
                raise self.error(f"the checkpoint lacks the weights of policy version {version} a planned step needs")
            self.publish(version, weights)
        self.sync()
        for pending in self.pending:
            self._launch(pending)

    def release(self) -> None:
        """The run ended: the plans past --steps unpinned (the checkpoint holds their weights);
        rank 0 releases the old versions still loaded and their folders (the last stays)."""
        if self.servers is None:
            return
        for pending in self.pending:
            if pending.pinned:
                self.servers.unpin(pending.version)
                pending.pinned = False
        if self.dist.is_main:
            self.servers.release()

    def close(self) -> None:
        """A stopped run: the collection under way ends, no other starts."""
        if self.collector is not None:
            self.collector.shutdown(wait=True, cancel_futures=True)
