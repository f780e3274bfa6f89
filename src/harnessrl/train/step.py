"""The pieces of one GRPO step around the update, each a function of typed values:

    plan_step          the scheduler's choice, the step's tasks (seeded), each to one harness
    refill_plan        dynamic sampling: more groups for the same step and selection, fresh tasks
    attempt_base       the first attempt number of a step's round (unique episode ids)
    group_batch        per (task, harness) group: advantages from grade.score, training units
    batch_stats        the step's statistics over every process's groups
    observe            the scheduler learns from the update (advantages, rewards, sketch)
    StepRecord         the step's record: one line of metrics.jsonl (`StepRecord.as_dict`)
    FlatSteps          steps in a row that updated nothing (every group flat): a warning, once a streak

`harnessrl.train.pipeline.RolloutPipeline` composes the plans and the groups with the rollouts;
`Trainer.train_step` joins them to `harnessrl.train.update.update_policy` and `observe`.
Nothing here loads a model or runs an episode.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import defaultdict
from dataclasses import asdict, dataclass, field, fields
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


def shuffled_rewards(scores: list[float], seed: int, step: int, group: int) -> list[float]:
    """The control run's rewards (TrainConfig.advantage_control "shuffled-rewards"): a group's
    scores in a uniformly random order, drawn from (seed, step, group) alone, so a resumed run
    draws the same. Each episode then gets any of its group's rewards with equal chance,
    whatever it did: the update keeps its size and loses its link to the outcome."""
    shuffled = list(scores)
    random.Random(f"shuffled-rewards:{seed}:{step}:{group}").shuffle(shuffled)
    return shuffled


def group_batch(
    plan: StepPlan,
    groups: range,
    trajectories: list,
    scale_advantages: bool,
    drop_flat: bool = False,
    shuffle_seed: int | None = None,
) -> tuple[list[TrainingUnit], dict[int, GroupOutcome]]:
    """The training units of this process's `groups` (one per model call, each with its episode's
    group-relative advantage) and each group's outcome. `drop_flat` (dynamic sampling): a group
    whose advantages are all 0 gives no units (its outcome is still returned). `shuffle_seed`
    (the shuffled-rewards control): the advantages come from the group's rewards shuffled among
    its episodes (shuffled_rewards); the outcome keeps the true scores."""
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
            rewards = scores if shuffle_seed is None else shuffled_rewards(scores, shuffle_seed, plan.step, g)
            A = group_advantages(torch.tensor([rewards], dtype=torch.float64), scale=scale_advantages)
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
    observe_harnesses(scheduler, list(plan.counts), stats.advantages_by_harness, stats.rewards_by_harness, sketch)
    return transfer


def observe_harnesses(
    scheduler,
    harnesses: list[str],
    advantages: dict[str, list[float]],
    rewards: dict[str, list[float]],
    sketch: torch.Tensor | None,
) -> None:
    """The one way every trainer reports a batch (ours, and the integrations with other trainers):
    each of the batch's `harnesses` in order that has advantages reports them, its episodes' scores
    and the update's sketch (None when no update was taken); a harness whose groups were all too
    small reports nothing. The same calls in the same order give the same scheduler state."""
    for h in harnesses:
        if advantages.get(h):
            scheduler.observe(h, advantages[h], sketch, rewards=rewards.get(h, []))


# ------------------------------------------------------------------------------------ the record

# Field metadata of StepRecord and StepTimes: OMIT_NONE, the key is absent (not null) when the
# value is None; FLATTEN, a group's keys stand at the top level of the line (absent when None).
OMIT_NONE, FLATTEN = "omit_none", "flatten"


@dataclass(frozen=True)
class DynamicSamplingRecord:
    """With --dynamic-sampling: the step's refill rounds (absent from the line otherwise)."""

    sampling_rounds: int  # rounds collected (1 = no refill)
    groups_sampled: int  # (task, harness) groups over every round
    groups_dropped_flat: int  # groups whose advantages are all 0
    groups_trained: int  # groups with signal
    sampling_budget_exhausted: bool  # fewer than --tasks-per-step groups with signal after the last round


@dataclass(frozen=True)
class RolloutServerRecord:
    """With --rollout-server: the policy versions and the servers (absent from the line otherwise)."""

    policy_lag_max: int  # the most versions a model call of the step lags behind `policy_version` (0 without calls)
    policy_lag_mean: float | None  # the mean lag over the step's model calls; None without calls
    policy_lag_hist: dict[str, int]  # model calls by lag (the lag as a string key, ascending)
    policy_version: int  # the weights the step trains from (how many steps had updated before)
    sampling_version: int  # the version the step's plan is bound to
    rollouts_overlapped: bool  # whether the first round ran during the previous step's update
    servers_idle: list[float]  # per server, seconds since the previous record with no request in flight
    rollout_requests: list[int]  # requests sent to each server so far
    time_adapter_sync: float  # seconds saving and reloading the adapter before the step's rollouts


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """Seconds of one step (`time`)."""

    rollout: float  # every round's rollouts, start to end, summed
    backward: float  # the old log-prob recomputation and every forward + backward; 0 on a skipped step
    sketch: float  # the gradient sketch; 0 on a skipped step
    optimizer: float  # clip and AdamW steps; 0 on a skipped step
    scheduler: float  # the scheduler's selection and observation
    # with --rollout-server only (absent otherwise): the training thread's wait for the step's
    # rollouts, and how long they ran during the previous update
    rollout_wait: float | None = field(default=None, metadata={OMIT_NONE: True})
    rollout_update_overlap: float | None = field(default=None, metadata={OMIT_NONE: True})
    total: float  # the whole step

    def as_dict(self) -> dict[str, float]:
        return _as_dict(self)

    @classmethod
    def keys(cls, *, rollout_servers: bool = False) -> list[str]:
        """The keys of `time`, in order (the waits come with --rollout-server)."""
        return [f.name for f in fields(cls) if rollout_servers or not f.metadata.get(OMIT_NONE)]


@dataclass(frozen=True, kw_only=True)
class StepRecord:
    """One GRPO step as recorded: `as_dict()` is its line of metrics.jsonl, keys in field order.

    Means over an empty list are None; the update's values (loss .. tis_capped_frac) are None on
    a step that took no optimizer step. docs/training.md ("The run folder") explains each key."""

    step: int  # optimizer steps taken so far, this one included (1 for the first step)
    harness: str  # the selected harness, or "mixed" when the selection spreads the tasks
    shares: dict[str, float]  # harness -> share of the step's tasks (harnesses with none left out)
    sampling_seed: int  # SamplingParams.seed of the step's rollouts (`sampling_seed`)
    episodes: int  # over every round
    infra_errors: int  # episodes without a grade (infrastructure errors)
    reward_mean: float | None  # mean score of the graded episodes
    reward_by_harness: dict[str, float | None]
    adv_abs_mean: float | None  # mean |advantage| over the groups with advantages
    groups: int  # groups with advantages (every round)
    groups_too_small: int  # groups with fewer than two graded episodes
    zero_std_frac: float | None  # share of `groups` whose advantages are all 0; None without groups
    probabilities: dict[str, float]  # the scheduler's, at selection
    transfer: dict[str, float]  # cosine of the step's sketch with every other harness's sketch average
    units: int  # training units (one per model call)
    units_trained: int  # units forwarded on the first pass
    completion_tokens: int
    padded_tokens: int  # over every pass
    loss: float | None  # mean over the optimizer steps
    clip_fraction: float | None  # over the trained tokens of every pass
    clip_fraction_by_epoch: list[float | None] | None  # one value per pass
    ratio_mean: float | None
    kl: float | None
    grad_norm: float | None  # mean of the optimizer steps' norms, before clipping
    rollout_logprob_diff_max: float | None  # |rollout log-prob - recomputed|, over the trained tokens
    rollout_logprob_diff_mean: float | None
    rollout_log_ratio_mean: float | None  # the sampler against the trainer (`RolloutMismatch`)
    rollout_kl_mean: float | None
    rollout_kl_max: float | None
    rollout_mismatch_frac: float | None
    tis_weight_mean: float | None  # --rollout-correction tis only
    tis_capped_frac: float | None  # --rollout-correction tis only
    optimizer_step: bool  # whether the step updated the weights
    optimizer_steps: int  # AdamW steps taken
    skipped: str | None  # why no update was taken; None when one was
    lr: float
    dynamic_sampling: DynamicSamplingRecord | None = field(default=None, metadata={FLATTEN: True})
    rollout_servers: RolloutServerRecord | None = field(default=None, metadata={FLATTEN: True})
    # with either group: every round's (task id, harness name)
    tasks: list[list[str]] | None = field(default=None, metadata={OMIT_NONE: True})
    time: StepTimes

    def as_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def keys(cls, *, dynamic_sampling: bool = False, rollout_servers: bool = False) -> list[str]:
        """The keys of a line, in order, with the groups named (`tasks` comes with either)."""
        groups = {"dynamic_sampling": DynamicSamplingRecord, "rollout_servers": RolloutServerRecord}
        wanted = {"dynamic_sampling": dynamic_sampling, "rollout_servers": rollout_servers}
        out: list[str] = []
        for f in fields(cls):
            if f.name in groups:
                out += [g.name for g in fields(groups[f.name])] if wanted[f.name] else []
            elif f.name != "tasks" or dynamic_sampling or rollout_servers:
                out.append(f.name)
        return out


def _as_dict(record: Any) -> dict[str, Any]:
    """A record's fields in order, with OMIT_NONE and FLATTEN applied and nested records as dicts."""
    out: dict[str, Any] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if value is None and (f.metadata.get(OMIT_NONE) or f.metadata.get(FLATTEN)):
            continue
        if f.metadata.get(FLATTEN):
            out.update(asdict(value))
        elif hasattr(value, "as_dict"):
            out[f.name] = value.as_dict()
        else:
            out[f.name] = value
    return out


FLAT = "all advantages are zero"  # StepRecord.skipped of a step whose every group scored alike


class FlatSteps:
    """Counts the steps in a row that updated nothing because every group was flat (its episodes
    all scored alike: every advantage 0) and returns a warning when a streak reaches `after`
    steps (once a streak; a step that updates starts counting again)."""

    def __init__(self, after: int = 3):
        self.after = after
        self.streak = 0

    def see(self, record: dict[str, Any], temperature: float, group_size: int, dynamic: bool) -> str | None:
        """The warning after the step whose `record` (a metrics.jsonl line) completes a streak, else None."""
        self.streak = self.streak + 1 if record.get("skipped") == FLAT else 0
        if self.streak != self.after:
            return None
        helps = [f"a higher --temperature (now {temperature:g})", f"a larger --group-size (now {group_size})"]
        if not dynamic:
            helps.append("--dynamic-sampling (refills each step with groups that disagree)")
        return (
            f"warning: steps {record['step'] - self.after + 1}-{record['step']} updated nothing: in every GRPO group "
            "the attempts scored alike (each task always passed or always failed), so every advantage was 0. "
            "The model's successes belong to tasks, not to samples; try " + ", ".join(helps) + ", or tasks the "
            'model passes sometimes (docs/training.md, "When every group is flat")'
        )
