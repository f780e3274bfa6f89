"""An episode's model calls packed into shared rows for the update.

The calls of a multi-turn episode usually extend one another: call k+1's prompt begins with call
k's prompt and completion, because the chat template renders the history as it was sampled
(21 of 24 consecutive calls of the embedded model's demo run). One row per call forwards that
shared prefix again for every call; packed, one row holds the tokens of the episode's longest call
and the completion positions of each call of the same episode whose prompt + completion is a
prefix of them. Under causal attention a position's log-prob depends only on the tokens before
it, at the same positions, so each call's completion log-probs are those of its own row (up to
float rounding) while the row is forwarded once.

    packed_rows(units)           which units share a row (indices; the longest unit leads)
    pad_packed(units, pad_id)    the batch pad_units makes, with the rows shared (grpo.pad_rows)

A unit joins a row only when it is from the same episode (so the same advantage), its tokens are
a prefix of the row's, and its completion positions are not taken already by another unit of the
row. Anything else (a harness whose history window dropped turns, a re-tokenized reply) gets a
row of its own: packing never changes what a unit is trained on.

Packing is for losses that are sums over tokens (token-mean, with or without token-level TIS):
the per-token terms are the same wherever the token sits. seq-mean and sequence-level TIS weigh
each unit as a whole, row by row, so the update does not pack then.

What different episodes share (the harness's prompt, a group's task prompt) is not a matter of
rows: `harnessrl.train.prefix_share` forwards it once per micro-batch, packed rows or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from harnessrl.train.grpo import TrainingUnit, check_units, pad_rows


@dataclass
class _Row:
    ids: list[int]  # the leading unit's prompt + completion
    episode_id: str
    advantage: float
    members: list[int] = field(default_factory=list)
    taken: list[bool] = field(default_factory=list)  # completion positions already used

    def admits(self, unit: TrainingUnit, ids: list[int]) -> bool:
        p, c = len(unit.prompt_ids), len(unit.completion_ids)
        return (
            unit.episode_id == self.episode_id
            and unit.advantage == self.advantage
            and len(ids) <= len(self.ids)
            and self.ids[: len(ids)] == ids
            and not any(self.taken[p : p + c])
        )

    def add(self, index: int, unit: TrainingUnit) -> None:
        p, c = len(unit.prompt_ids), len(unit.completion_ids)
        self.members.append(index)
        self.taken[p : p + c] = [True] * c


def packed_rows(units: list[TrainingUnit]) -> list[list[int]]:
    """The units (by index) in rows: each row's first index is its longest unit, whose tokens the
    row holds; the others are units of the same episode that are prefixes of it. Longest first,
    then in the given order; deterministic for a given list."""
    order = sorted(
        range(len(units)), key=lambda i: len(units[i].prompt_ids) + len(units[i].completion_ids), reverse=True
    )
    rows: list[_Row] = []
    by_episode: dict[str, list[_Row]] = {}
    for i in order:
        u = units[i]
        ids = list(u.prompt_ids) + list(u.completion_ids)
        row = next((r for r in by_episode.get(u.episode_id, []) if r.admits(u, ids)), None)
        if row is None:
            row = _Row(ids=ids, episode_id=u.episode_id, advantage=u.advantage, taken=[False] * len(ids))
            rows.append(row)
            by_episode.setdefault(u.episode_id, []).append(row)
        row.add(i, u)
    return [r.members for r in rows]


def pad_packed(units: list[TrainingUnit], pad_id: int) -> dict[str, Tensor]:
    """`pad_units` with the rows of `packed_rows`: the same keys, [R, T] per-token tensors with R
    <= len(units) rows, advantages [R] (one episode per row), and unit_rows [len(units)], the row
    of each unit in the given order (a unit's completion sits at the same columns as in a row of
    its own: prompt length onwards)."""
    check_units(units)
    return pad_rows(units, packed_rows(units), pad_id)
