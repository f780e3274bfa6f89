"""The pieces of one GRPO step around the update, each a function of typed values:

    plan_step          the scheduler's choice, the step's tasks (seeded), each to one harness
    refill_plan        dynamic sampling: more groups for the same step and selection, fresh tasks
    attempt_base       the first attempt number of a step's round (unique episode ids)
    group_batch        per (task, harness) group: advantages from grade.score, training units
    batch_stats        the step's statistics over every process's groups
    observe            the scheduler learns from the update (advantages, rewards, sketch)

`harnessrl.train.pipeline.RolloutPipeline` composes the plans and the groups with the rollouts;
`Trainer.train_step` joins them to `harnessrl.train.update.update_policy` and `observe`.
Nothing here loads a model or runs an episode.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from harnessrl.train.grpo import TrainingUnit, group_advantages, units_from_trajectories
from harnessrl.train.schedulers import Selection
from harnessrl.train.sketch import cosine


def allocate_tasks(shares: dict[str, float], n: int, step: int) -> dict[str, int]:
    """How many of the step's n tasks each harness gets: shares * n by largest remainder.

    Ties between equal remainders rotate with the step, so with 6 equal shares and 8 tasks the
    two extra tasks go to different harnesses from step to step (not always the first two).
    """
    names = list(shares)
    exact = [shares[h] * n for h in names]
    counts = [int(math.floor(x + 1e-9)) for x in exact]
    left = n - sum(counts)
    K = len(names)
    order = sorted(range(K), key=lambda i: (-round(exact[i] - counts[i], 9), (i - step) % K))
    for i in order[:left]:
        counts[i] += 1
    return dict(zip(names, counts))


def sampling_seed(seed: int, step: int, purpose: str) -> int:
    """The SamplingParams.seed of the rollouts of step `step` (purpose "train") or of the
    evaluation after `step` optimizer steps ("eval").

    A function of the run seed and the step only: every step samples afresh (the same task and
    attempt number never replay one random stream) and a resumed step samples what the
    uninterrupted run would have.
    """
    digest = hashlib.sha256(f"harnessrl-train-{purpose}:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # a non-negative 63-bit integer


@dataclass
class StepPlan:
    """Who collects step `step` and on which tasks: `assignment[g]` is group g's (task, harness
    spec); every process computes the same plan from the same seeded state."""

    step: int
    selection: Selection
    probabilities: dict[str, float]
    counts: dict[str, int]  # harness -> tasks
    assignment: list[tuple[Any, Any]]  # (Task, HarnessSpec) per group

    def fingerprint(self) -> tuple:
        """What every process must agree on (checked with several processes)."""
        return (self.step, self.selection.shares, [t.id for t, _ in self.assignment])

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON data (a checkpoint holds the plans already made for later steps)."""
        return {
            "step": self.step,
            "shares": dict(self.selection.shares),
            "probabilities": dict(self.probabilities),
            "counts": dict(self.counts),
            "assignment": [[task.id, spec.name] for task, spec in self.assignment],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], tasks_by_id: dict[str, Any], spec_by_name: dict) -> StepPlan:
        return cls(
            int(data["step"]),
            Selection(dict(data["shares"])),
            dict(data["probabilities"]),
            dict(data["counts"]),
            [(tasks_by_id[task_id], spec_by_name[name]) for task_id, name in data["assignment"]],
        )


def _assign(
    shares: dict[str, float], task_rng: random.Random, train_tasks: list, spec_by_name: dict, n: int, step: int
) -> tuple[dict[str, int], list[tuple[Any, Any]]]:
    counts = allocate_tasks(shares, n, step)
    picked = iter(task_rng.sample(range(len(train_tasks)), n))
    assignment = [(train_tasks[next(picked)], spec_by_name[h]) for h, c in counts.items() for _ in range(c)]
    return counts, assignment


def plan_step(
    scheduler, task_rng: random.Random, train_tasks: list, spec_by_name: dict, tasks_per_step: int, step: int
) -> StepPlan:
    """The scheduler selects (harness or mixture), the task RNG samples `tasks_per_step` distinct
    train tasks, and each goes to one harness in the selection's shares (`allocate_tasks`)."""
    probabilities = scheduler.probabilities()
    selection = scheduler.select(step)
    counts, assignment = _assign(selection.shares, task_rng, train_tasks, spec_by_name, tasks_per_step, step)
    return StepPlan(step, selection, probabilities, counts, assignment)


def refill_plan(plan: StepPlan, task_rng: random.Random, train_tasks: list, spec_by_name: dict, n: int) -> StepPlan:
    """Dynamic sampling: `n` more groups for `plan`'s step, under the same selection (no new
    scheduler decision), on `n` distinct tasks drawn afresh from the task RNG (a task may come
    back from an earlier round: its new group gets new attempt numbers, `attempt_base`)."""
    counts, assignment = _assign(plan.selection.shares, task_rng, train_tasks, spec_by_name, n, plan.step)
    return StepPlan(plan.step, plan.selection, plan.probabilities, counts, assignment)


def attempt_base(step: int, round_: int, group_size: int, rounds: int) -> int:
    """The attempt number of the first episode of round `round_` of `step` (each group takes
    group_size consecutive numbers from there): `rounds` rounds per step at most (1 without
    dynamic sampling: step * group_size, as always), so attempt numbers, and with them episode
    ids and sampling streams, are unique over the run, and the episodes of the steps from
    `step` on are exactly those with attempt >= attempt_base(step, 0, ...)."""
    return (step * rounds + round_) * group_size


@dataclass
class GroupOutcome:
    """One group (a task under a harness, group_size attempts): how many episodes ran, the scores
    of the valid ones (no infrastructure error, graded), and their advantages (None when fewer
    than 2 were valid: no comparison, no units)."""

    size: int
    scores: list[float]
    advantages: list[float] | None


def group_batch(
    plan: StepPlan, groups: range, trajectories: list, scale_advantages: bool, drop_flat: bool = False
) -> tuple[list[TrainingUnit], dict[int, GroupOutcome]]:
    """The training units of this process's `groups` (one per model call, each with its episode's
    group-relative advantage) and each group's outcome. `drop_flat` (dynamic sampling): a group
    whose advantages are all 0 gives no units (its outcome is still returned)."""
    by_group: dict[tuple[str, str], list] = defaultdict(list)
    for traj in trajectories:
        by_group[(traj.task_id, traj.harness)].append(traj)
    advantage_of: dict[str, float] = {}
    trained = []
    outcomes: dict[int, GroupOutcome] = {}
    for g in groups:
        task, spec = plan.assignment[g]
        group = sorted(by_group[(task.id, spec.name)], key=lambda t: t.attempt)
        valid = [t for t in group if not t.is_infra_error and t.grade is not None]
        scores = [t.grade.score for t in valid]
        advantages = None
        if len(valid) >= 2:
            A = group_advantages(torch.tensor([scores], dtype=torch.float64), scale=scale_advantages)
            advantages = A[0].tolist()
            if not (drop_flat and all(a == 0 for a in advantages)):
                for traj, a in zip(valid, advantages):
                    advantage_of[traj.episode_id] = a
                    trained.append(traj)
        outcomes[g] = GroupOutcome(len(group), scores, advantages)
    return units_from_trajectories(trained, advantage_of), outcomes


@dataclass
class LocalBatch:
    """What one process tells the others about its share of the step."""

    groups: dict[int, GroupOutcome]
    units: int
    tokens: int  # completion tokens
    signal: bool  # some unit has a nonzero advantage

    @classmethod
    def of(cls, units: list[TrainingUnit], groups: dict[int, GroupOutcome]) -> LocalBatch:
        return cls(groups, len(units), sum(len(u.completion_ids) for u in units), any(u.advantage != 0 for u in units))


@dataclass
class BatchStats:
    """The step's statistics over every group of every process, in assignment order."""

    advantages_by_harness: dict[str, list[float]] = field(default_factory=dict)
    rewards_by_harness: dict[str, list[float]] = field(default_factory=dict)
    groups: int = 0  # groups with advantages
    flat_groups: int = 0  # of those, every advantage 0
    groups_too_small: int = 0
    infra_errors: int = 0
    episodes: int = 0
    units: int = 0
    completion_tokens: int = 0
    signal: bool = False

    @property
    def advantages(self) -> list[float]:
        return [a for values in self.advantages_by_harness.values() for a in values]

    @property
    def rewards(self) -> list[float]:
        return [r for values in self.rewards_by_harness.values() for r in values]

    @property
    def signal_groups(self) -> int:
        """Groups whose advantages are not all 0 (the ones that carry a gradient)."""
        return self.groups - self.flat_groups


def batch_stats(plan: StepPlan, parts: list[LocalBatch]) -> BatchStats:
    """Every process's `LocalBatch` of the step (one in one process) as the step's statistics."""
    outcomes = {g: o for part in parts for g, o in part.groups.items()}
    stats = BatchStats(
        advantages_by_harness=defaultdict(list),
        rewards_by_harness=defaultdict(list),
        units=sum(p.units for p in parts),
        completion_tokens=sum(p.tokens for p in parts),
        signal=any(p.signal for p in parts),
    )
    for g, (_, spec) in enumerate(plan.assignment):
        o = outcomes[g]
        stats.episodes += o.size
        stats.infra_errors += o.size - len(o.scores)
        stats.rewards_by_harness[spec.name].extend(o.scores)
        if o.advantages is None:
            stats.groups_too_small += 1
            continue
        stats.groups += 1
        stats.flat_groups += all(a == 0 for a in o.advantages)
        stats.advantages_by_harness[spec.name].extend(o.advantages)
    return stats


def observe(scheduler, plan: StepPlan, stats: BatchStats, sketch: torch.Tensor | None) -> dict[str, float]:
    """The scheduler learns from the step: every harness of the plan that has advantages reports
    them with its rewards and the update's sketch (None when no update was taken: zero advantages
    are what tells HarnessBandit that a harness is not learnable now). Returns the cosine of the
    sketch with each other harness's average sketch (taken before this observation)."""
    transfer: dict[str, float] = {}
    sketch_avg = getattr(scheduler, "sketch_avg", None)
    harness = plan.selection.harness
    if sketch is not None and harness is not None and sketch_avg is not None:
        transfer = {o: cosine(sketch, avg) for o, avg in sketch_avg.items() if o != harness}
    for h in plan.counts:
        if stats.advantages_by_harness.get(h):  # a harness whose groups were all too small reports nothing
            scheduler.observe(h, stats.advantages_by_harness[h], sketch, rewards=stats.rewards_by_harness[h])
    return transfer
