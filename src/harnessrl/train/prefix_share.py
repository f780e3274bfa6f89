"""The rows of a micro-batch forwarded as a tree: the tokens several rows share, forwarded once.

One harness plays a whole training step, so every episode of the step begins with the same
system prompt and tool definitions, and the attempts of one group share the whole task prompt.
`harnessrl.train.packing` already lets the calls of one episode share a row; what different
episodes share is forwarded again in every row. Here the rows of a micro-batch become a tree of
segments (a radix tree of their token sequences): a segment holds tokens at the same positions in
every row that passes through it, each segment is forwarded once, and its tokens attend to the
keys and values of the segments before it (its ancestors), handed to the model's own attention
through a cache that holds them. Under causal attention a token's hidden state depends only on
the tokens before it at their positions, so every row's log-probs are those of its own row (up to
float rounding), and the gradient reaches the shared segments through their keys and values.

    share_plan(rows)                   the segments, and the forwards that run them (depth by depth)
    plan_of(batch)                     the plan of a padded batch's rows
    shared_token_logprobs(model, batch, temperature)
                                       `harnessrl.train.grpo.token_logprobs`, the shared tokens once
    shared_micro_batches(units, max_tokens, pack)
                                       micro-batches of rows that share, within the token budget
    supports(model)                    whether the model's forward can run a plan

A segment is forwarded apart from its rows only when that saves at least `MIN_SAVED` tokens;
shorter common runs (two attempts that happen to begin with the same word) stay in each row's own
segment. Segments of the same depth are forwarded together, longest first, in batches whose
padding stays under `PAD_SLACK` of their tokens; a batch's queries see their own tokens causally
and their ancestors' keys in full, through a 4D mask.

Rows never change: the loss reads each unit's log-probs at the same [row, column] as without
sharing, so sharing is exact for every loss (token-mean or seq-mean, with or without TIS at
either level), unlike packing, which changes rows.

Where it runs: sdpa or eager attention, no sliding window, a plain output head, and the decoder
architectures in `ARCHITECTURES`, whose attention layers hand their new keys and values to the
cache and attend to what it returns. Anything else (flash attention, which takes no 4D mask; a
model this was not checked on) forwards rows as `token_logprobs` does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from harnessrl.train.grpo import TrainingUnit, checkpointing_forward, plain_output_head
from harnessrl.train.packing import packed_rows

# Decoder architectures (transformers' model_type) whose attention reads and writes the cache
# passed to it and nothing else, with rotary positions from position_ids: the tests compare their
# log-probs with and without sharing on small random models.
ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
MIN_SAVED = 32  # tokens a shared segment must save to be forwarded apart from its rows
PAD_SLACK = 0.125  # padding a batch of segments may add, as a share of its tokens


@dataclass
class Segment:
    """Tokens at positions start .. start + len(tokens) - 1 of every row through it."""

    start: int
    tokens: list[int]
    parent: int  # the segment before it (-1: none, it starts the rows)
    depth: int
    rows: int  # rows that pass through it

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class SharePlan:
    """The rows of a batch as segments: `paths[r]` are row r's segments in order (their tokens,
    one after the other, are the row's); `calls` the forwards, each a list of segments of one
    depth, in an order where every segment's ancestors ran before it."""

    segments: list[Segment]
    paths: list[list[int]]
    calls: list[list[int]]

    @property
    def forwarded(self) -> int:
        """Tokens the forwards run, padding included (each call: segments x longest)."""
        return sum(len(call) * max(len(self.segments[s].tokens) for s in call) for call in self.calls)

    @property
    def unique(self) -> int:
        """Tokens of the segments: each shared token once."""
        return sum(len(s.tokens) for s in self.segments)

    def locate(self, row: int, position: int) -> tuple[int, int]:
        """(segment, offset in it) of a row's token at `position`."""
        for s in self.paths[row]:
            seg = self.segments[s]
            if position < seg.end:
                return s, position - seg.start
        raise IndexError(f"row {row} has no position {position}")


def _common_end(rows: list[list[int]], members: list[int], start: int) -> int:
    """The first position from `start` at which the member rows differ or one of them ends."""
    first = rows[members[0]]
    end = min(len(rows[r]) for r in members)
    for r in members[1:]:
        other = rows[r]
        k = start
        while k < end and other[k] == first[k]:
            k += 1
        end = k
    return end


def share_plan(rows: list[list[int]], min_saved: int = MIN_SAVED, pad_slack: float = PAD_SLACK) -> SharePlan:
    """The segments of `rows` (token lists) and the forwards that run them. Deterministic.

    A run of tokens that several rows have at the same positions after the same tokens becomes a
    segment of its own when (rows - 1) x its length >= min_saved; otherwise its tokens go to each
    row's next segment. A row that ends where others go on ends at a segment boundary."""
    segments: list[Segment] = []
    paths: list[list[int]] = [[] for _ in rows]

    def add(start: int, end: int, parent: int, members: list[int]) -> int:
        depth = segments[parent].depth + 1 if parent >= 0 else 0
        segments.append(Segment(start, rows[members[0]][start:end], parent, depth, len(members)))
        index = len(segments) - 1
        for r in members:
            paths[r].append(index)
        return index

    # (members, split, pending, parent): the members share tokens [:split]; tokens [pending:split]
    # are in no segment yet, the ones before are in parent's chain
    stack: list[tuple[list[int], int, int, int]] = [(list(range(len(rows))), 0, 0, -1)]
    while stack:
        members, split, pending, parent = stack.pop()
        ended = [r for r in members if len(rows[r]) == split]
        if ended and pending < split:  # a row ends here: a segment ends here
            parent = add(pending, split, parent, members)
            pending = split
        groups: dict[int, list[int]] = {}
        for r in members:
            if len(rows[r]) > split:
                groups.setdefault(rows[r][split], []).append(r)
        for group in reversed(list(groups.values())):  # popped in first-token order of appearance
            if len(group) == 1:
                add(pending, len(rows[group[0]]), parent, group)
                continue
            end = _common_end(rows, group, split + 1)
            if (len(group) - 1) * (end - pending) >= min_saved:
                stack.append((group, end, end, add(pending, end, parent, group)))
            else:
                stack.append((group, end, pending, parent))
    calls: list[list[int]] = []
    for depth in range(max((s.depth for s in segments), default=-1) + 1):
        level = sorted(
            (i for i, s in enumerate(segments) if s.depth == depth), key=lambda i: (-len(segments[i].tokens), i)
        )
        call: list[int] = []
        tokens = 0
        for i in level:
            n = len(segments[i].tokens)
            width = len(segments[call[0]].tokens) if call else n
            if call and (len(call) + 1) * width > (1 + pad_slack) * (tokens + n):
                calls.append(call)
                call, tokens = [], 0
            call.append(i)
            tokens += n
        if call:
            calls.append(call)
    return SharePlan(segments, paths, calls)


def plan_of(batch: dict[str, Tensor], min_saved: int = MIN_SAVED) -> SharePlan:
    """The plan of a padded batch's rows (input_ids up to each row's attention_mask length; the
    rows are right-padded)."""
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    ids = batch["input_ids"].tolist()
    return share_plan([row[: int(n)] for row, n in zip(ids, lengths)], min_saved)


def supports(model: Any) -> bool:
    """Whether `shared_token_logprobs` can run on this (peft-wrapped) model: see the module docstring."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "model_type", None) not in ARCHITECTURES:
        return False
    if (getattr(config, "_attn_implementation", None) or "eager") not in ("sdpa", "eager"):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return False
    if not plain_output_head(base) or _cache_argument(base.get_decoder()) is None:
        return False
    if not any(getattr(m, "gradient_checkpointing", False) is True for m in base.modules()):
        return True
    # a checkpointed layer keeps its cache argument only where transformers lets it
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return False
    return hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache")


def _cache_argument(decoder: Any) -> str | None:
    try:
        params = inspect.signature(decoder.forward).parameters
    except (TypeError, ValueError):
        return None
    if "position_ids" not in params:
        return None
    return "cache" if "cache" in params else "past_key_values" if "past_key_values" in params else None


@functools.cache
def _cache_class() -> type:
    from transformers import DynamicCache

    class TreeCache(DynamicCache):
        """What one forward of a plan's segments sees as its cache. Each attention layer hands over
        the keys/values of the segments' own tokens and gets back, per segment, its ancestors'
        (padded to the longest) followed by its own; the keys/values of the segments that others
        extend are kept, ancestors' included, for the forwards after this one."""

        def __init__(self, plan: SharePlan, call: list[int], kept: dict[int, list[tuple[Tensor, Tensor]]]):
            super().__init__()
            self.plan, self.call, self.kept = plan, call, kept
            self.past = max(plan.segments[s].start for s in call)
            self.extended = {seg.parent for seg in plan.segments}
            self.recorded = False  # a checkpointed layer's backward replays update: record once

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            segments = self.plan.segments
            keys, values = [], []
            for b, s in enumerate(self.call):
                seg = segments[s]
                if seg.parent >= 0:
                    k_past, v_past = self.kept[seg.parent][layer_idx]
                else:
                    k_past = v_past = key_states[b : b + 1, :, :0]
                pad = (0, 0, 0, self.past - seg.start)
                keys.append(F.pad(k_past, pad))
                values.append(F.pad(v_past, pad))
                if s in self.extended and not self.recorded:
                    n = len(seg.tokens)
                    own = (key_states[b : b + 1, :, :n], value_states[b : b + 1, :, :n])
                    chain = self.kept.setdefault(s, [])
                    chain.append(
                        (torch.cat([k_past, own[0]], dim=2), torch.cat([v_past, own[1]], dim=2))
                        if seg.parent >= 0
                        else own
                    )
            return (
                torch.cat([torch.cat(keys), key_states], dim=2),
                torch.cat([torch.cat(values), value_states], dim=2),
            )

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.past

    return TreeCache


@contextlib.contextmanager
def _cache_through_checkpoints(model: Any):
    """Checkpointed layers (`harnessrl.train.lora.enable_gradient_checkpointing`) keep the cache
    argument for the duration: the plan's cache only reads what earlier forwards kept and records
    once, so the backward's replay of a layer computes the same keys and values."""
    flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    for m in flagged:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in flagged:
            del m._can_checkpoint_with_cache


def shared_token_logprobs(
    model: Any, batch: dict[str, Tensor], temperature: float = 1.0, plan: SharePlan | None = None
) -> Tensor:
    """`token_logprobs(model, batch, temperature)` with the batch's rows forwarded as `plan`
    (`plan_of(batch)` by default): [B, T], aligned with completion_mask, gradients flowing into
    every segment, shared ones included. The model must be one `supports` accepts."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use 1.0 for greedy rollouts), got {temperature}")
    plan = plan if plan is not None else plan_of(batch)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    argument = _cache_argument(decoder)
    if argument is None or not plain_output_head(base):
        raise ValueError("this model's forward cannot share prefixes (harnessrl.train.prefix_share.supports)")
    device = next(model.parameters()).device
    completion_mask = batch["completion_mask"].to(device)
    B, T = completion_mask.shape
    rows, cols = completion_mask[:, 1:].nonzero(as_tuple=True)  # hidden state at cols predicts cols + 1
    # where each needed hidden state is computed: (segment, offset), grouped by segment
    wanted: dict[int, list[tuple[int, int]]] = {}
    for i, (r, c) in enumerate(zip(rows.tolist(), cols.tolist())):
        s, offset = plan.locate(r, c)
        wanted.setdefault(s, []).append((offset, i))
    eager = (getattr(base.config, "_attn_implementation", None) or "eager") == "eager"
    dtype = next(base.parameters()).dtype
    cache_class = _cache_class()
    kept: dict[int, list[tuple[Tensor, Tensor]]] = {}
    pieces: list[Tensor] = []
    order: list[int] = []
    with checkpointing_forward(base), _cache_through_checkpoints(base):
        for call in plan.calls:
            segs = [plan.segments[s] for s in call]
            width = max(len(s.tokens) for s in segs)
            past = max(s.start for s in segs)
            ids = torch.zeros((len(segs), width), dtype=torch.long)
            positions = torch.zeros((len(segs), width), dtype=torch.long)
            mask = torch.zeros((len(segs), 1, width, past + width), dtype=torch.bool)
            causal = torch.ones((width, width), dtype=torch.bool).tril()
            for b, seg in enumerate(segs):
                ids[b, : len(seg.tokens)] = torch.tensor(seg.tokens, dtype=torch.long)
                positions[b] = torch.arange(seg.start, seg.start + width)
                mask[b, 0, :, : seg.start] = True  # every ancestor token (the rest of the past is padding)
                mask[b, 0, :, past:] = causal  # its own tokens, causally (padded queries see only their own)
            mask = mask.to(device)
            if eager:  # eager attention adds the mask to the scores
                mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
            cache = cache_class(plan, call, kept)
            hidden = decoder(
                input_ids=ids.to(device),
                attention_mask=mask,
                position_ids=positions.to(device),
                use_cache=False,
                **{argument: cache},
            ).last_hidden_state
            cache.recorded = True
            for b, s in enumerate(call):
                if s in wanted:
                    offsets = torch.tensor([o for o, _ in wanted[s]], device=device)
                    pieces.append(hidden[b, offsets])
                    order.extend(i for _, i in wanted[s])
    targets = batch["input_ids"].to(device)[rows, cols + 1]
    logp = torch.zeros((B, T), dtype=torch.float32, device=device)
    if not order:
        return logp * completion_mask
    gathered = torch.cat(pieces)
    inverse = torch.empty(len(order), dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)
    logits = base.get_output_embeddings()(gathered[inverse]).float() / temperature
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    logp = logp.to(picked.dtype).index_put((rows, cols + 1), picked)
    return logp * completion_mask


def shared_micro_batches(
    units: list[TrainingUnit], max_tokens: int, pack: bool = False, min_saved: int = MIN_SAVED
) -> list[list[TrainingUnit]]:
    """Micro-batches whose plans forward at most `max_tokens` tokens (padding included, each
    shared token once): the budget of `harnessrl.train.update.micro_batches`, counted as the
    forwards run it. Rows (a unit each, or with `pack` the units `packed_rows` puts in one) in the
    order of their tokens, so rows that share a prefix are neighbours; a row whose plan alone is
    over the budget goes alone. Deterministic for a given list."""
    if pack:
        rows = [[units[i] for i in members] for members in packed_rows(units)]
    else:
        rows = [[u] for u in units]
    tokens = [list(row[0].prompt_ids) + list(row[0].completion_ids) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: (tokens[i], i))
    batches: list[list[TrainingUnit]] = []
    current: list[int] = []
    for i in order:
        if current and share_plan([tokens[j] for j in [*current, i]], min_saved).forwarded > max_tokens:
            batches.append([u for j in current for u in rows[j]])
            current = []
        current.append(i)
    if current:
        batches.append([u for j in current for u in rows[j]])
    return batches
