"""HarnessSchedule: a harness scheduler as any trainer can drive it, one generation batch at a time.

A trainer that is not ours (TRL, verl, prime-rl) generates a batch of groups (a group: one prompt,
`group_size` attempts), scores it, takes one or more optimizer steps on it, and generates the
next. Around that loop the schedule asks four things, in this order, every batch:

    plan(batch, groups)              which harness plays each group of this batch (one harness for
                                     a single-harness scheduler; shares for `mixed` / `ratio:`)
    record(plan, scores)             the batch's episode scores (None: an infrastructure error, left
                                     out) -> group-relative advantages, kept until the update
    add_sketch(sketch)               the GradientSketch of each optimizer step on the batch (summed:
                                     the sketch is linear, so the sum is the sketch of the summed
                                     update), before the optimizer steps
    observe()                        the scheduler learns from the batch: each harness's advantages,
                                     scores and the sketch (None when the batch had no signal)

and `state_dict()` / `load_state_dict()` make it resumable with the trainer's checkpoints. The
observation is `harnessrl.train.step.observe_harnesses`, the very call our own trainer makes, so
the same advantages and sketches give the same choices in both (tests/test_trl.py checks it).

Advantages are harnessrl's (`harnessrl.train.grpo.group_advantages`, per group over its valid
episodes; a group with fewer than two valid episodes has none): `scale` "group" divides by the
group's standard deviation (GRPO), "none" does not (Dr. GRPO), "batch" divides by the standard
deviation of every valid score of the batch (TRL's scale_rewards="batch").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from harnessrl.train.grpo import group_advantages
from harnessrl.train.schedulers import Scheduler, Selection
from harnessrl.train.sketch import GradientSketch, cosine
from harnessrl.train.step import allocate_tasks, observe_harnesses

Scale = Literal["group", "batch", "none"]


class ScheduleError(ValueError):
    """The schedule was driven out of order (an observation without a batch, a batch twice)."""


@dataclass(frozen=True)
class GenerationPlan:
    """Who plays batch `batch`: `group_harness[g]` is group g's harness (groups in batch order)."""

    batch: int
    selection: Selection
    probabilities: dict[str, float]  # the scheduler's, at selection
    group_harness: list[str]

    @property
    def harness(self) -> str:
        """The selected harness, or "mixed" when the selection spreads the groups."""
        return self.selection.harness or "mixed"


@dataclass
class BatchObservation:
    """A recorded batch waiting for its update: per harness, its advantages and scores."""

    plan: GenerationPlan
    advantages: dict[str, list[float]]
    rewards: dict[str, list[float]]
    groups: int  # groups with advantages
    flat_groups: int  # of those, every advantage 0
    groups_too_small: int
    infra_errors: int
    sketch: torch.Tensor | None = None
    optimizer_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # what the trainer wants in the batch's record

    @property
    def signal(self) -> bool:
        return any(a != 0 for values in self.advantages.values() for a in values)

    @property
    def learnability(self) -> float | None:
        """mean |A| over the batch's groups with advantages (HarnessBandit's learnability)."""
        values = [abs(a) for v in self.advantages.values() for a in v]
        return math.fsum(values) / len(values) if values else None


def batch_advantages(scores: list[float | None], group_size: int, scale: Scale) -> list[list[float] | None]:
    """Per group (consecutive `group_size` scores), the advantages of its valid episodes in order
    (None entries left out), or None when fewer than two are valid."""
    if group_size < 1 or len(scores) % group_size:
        raise ValueError(f"{len(scores)} scores do not make groups of {group_size}")
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    valid_all = [s for s in scores if s is not None]
    batch_std = float(torch.tensor(valid_all, dtype=torch.float64).std(unbiased=False)) if valid_all else 0.0
    out: list[list[float] | None] = []
    for start in range(0, len(scores), group_size):
        valid = [s for s in scores[start : start + group_size] if s is not None]
        if len(valid) < 2:
            out.append(None)
            continue
        rewards = torch.tensor([valid], dtype=torch.float64)
        advantages = group_advantages(rewards, scale=scale == "group")[0]
        if scale == "batch":
            advantages = advantages / (batch_std + 1e-6)
        out.append([float(a) for a in advantages])
    return out


class HarnessSchedule:
    """A scheduler and a gradient sketch, driven one generation batch at a time (module docstring)."""

    def __init__(self, scheduler: Scheduler, sketcher: GradientSketch | None = None):
        self.scheduler = scheduler
        self.sketcher = sketcher if sketcher is not None else GradientSketch(seed=scheduler.seed)
        self.pending: BatchObservation | None = None
        self.batches_observed = 0

    @property
    def harnesses(self) -> list[str]:
        return self.scheduler.harnesses

    def plan(self, batch: int, groups: int) -> GenerationPlan:
        """The scheduler's choice for batch `batch` of `groups` groups. Call once per batch, in order."""
        if groups < 1:
            raise ValueError(f"a batch needs at least one group, got {groups}")
        if self.pending is not None:
            raise ScheduleError(
                f"batch {self.pending.plan.batch} was never observed: observe() it before planning batch {batch}"
            )
        probabilities = self.scheduler.probabilities()
        selection = self.scheduler.select(batch)
        counts = allocate_tasks(selection.shares, groups, batch)
        group_harness = [h for h, c in counts.items() for _ in range(c)]
        return GenerationPlan(batch, selection, probabilities, group_harness)

    def record(
        self, plan: GenerationPlan, scores: list[float | None], group_size: int, scale: Scale
    ) -> BatchObservation:
        """The batch's scores (every group's `group_size` rows in batch order; None: an
        infrastructure error) as its observation, kept until `observe`."""
        if len(scores) != len(plan.group_harness) * group_size:
            raise ValueError(
                f"batch {plan.batch}: {len(scores)} scores for {len(plan.group_harness)} groups of {group_size}"
            )
        obs = BatchObservation(plan, {}, {}, 0, 0, 0, sum(s is None for s in scores))
        for g, advantages in enumerate(batch_advantages(scores, group_size, scale)):
            h = plan.group_harness[g]
            valid = [s for s in scores[g * group_size : (g + 1) * group_size] if s is not None]
            obs.rewards.setdefault(h, []).extend(valid)
            if advantages is None:
                obs.groups_too_small += 1
                continue
            obs.groups += 1
            obs.flat_groups += all(a == 0 for a in advantages)
            obs.advantages.setdefault(h, []).extend(advantages)
        self.pending = obs
        return obs

    def add_sketch(self, sketch: torch.Tensor) -> None:
        """One optimizer step's gradient sketch on the pending batch (summed over its steps)."""
        if self.pending is None:
            raise ScheduleError("a gradient sketch came with no recorded batch (record() it first)")
        sketch = torch.as_tensor(sketch, dtype=torch.float32).reshape(-1).cpu()
        self.pending.sketch = sketch if self.pending.sketch is None else self.pending.sketch + sketch
        self.pending.optimizer_steps += 1

    def observe(self) -> tuple[BatchObservation, dict[str, float]]:
        """The scheduler learns from the pending batch. Returns it and the cosine of its sketch with
        each other harness's sketch average (before this observation), as our trainer logs it."""
        obs = self.pending
        if obs is None:
            raise ScheduleError("nothing to observe: no batch was recorded since the last observation")
        sketch = obs.sketch if obs.signal and obs.sketch is not None and bool(obs.sketch.any()) else None
        transfer: dict[str, float] = {}
        sketch_avg = getattr(self.scheduler, "sketch_avg", None)
        harness = obs.plan.selection.harness
        if sketch is not None and harness is not None and sketch_avg is not None:
            transfer = {o: cosine(sketch, avg) for o, avg in sketch_avg.items() if o != harness}
        harnesses = list(dict.fromkeys(obs.plan.group_harness))
        observe_harnesses(self.scheduler, harnesses, obs.advantages, obs.rewards, sketch)
        self.pending = None
        self.batches_observed += 1
        return obs, transfer

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (plain JSON) and the batches observed so far."""
        if self.pending is not None:
            raise ScheduleError(f"batch {self.pending.plan.batch} is recorded but not observed: save after observe()")
        return {"scheduler": self.scheduler.state_dict(), "batches_observed": self.batches_observed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.batches_observed = int(state["batches_observed"])
        self.pending = None
