"""The engine's decode attention: a prefix shared by the whole batch is read once per step.

In a decode step every running row attends over its whole cache, and on a CPU that is a memory
read: rows x context x (keys + values) per layer, as many bytes as the weights themselves at
~12 rows of ~800 tokens. When the rows share a prefix (every episode of a harness starts with
the same system prompt and demonstrations), the prefix's keys and values are the same for all
of them, so they are read once: the queries of all rows (and all heads of a key/value group)
score that block in one matrix product, each row scores its own remaining slots, and the two
softmax parts are merged with their maxima and sums (the two-level "cascade" that vLLM and
FlashInfer use for shared prefixes). The result equals one softmax over the whole row up to
float rounding. In float32 on a CPU the shared block runs in torch's fused CPU attention kernel,
which returns the log-sum-exp the merge needs, and the rows' own slots in a compiled kernel that
reads each row exactly as far as it reaches (harnessrl.models.decode_kernel; without numba, the
fused kernel in runs of rows of similar length, `plan_runs`); other dtypes and devices use
plain matrix products.

The engine turns this on for its decode forwards only, by naming `ENGINE_ATTENTION` as the
model's attention implementation for the duration of the forward and handing the step's plan
(rows' lengths, shared prefix length) through `decode_plan`. Anything this function does not
handle (more than one query token, soft-capping, attention sinks, dropout) goes to the model's
own implementation, and so does a forward on another thread that runs meanwhile (the plan is
per thread).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from harnessrl.models import decode_kernel

ENGINE_ATTENTION = "harnessrl-engine"
MIN_SHARED = 32  # a shared prefix shorter than this is not worth the extra products


@dataclass(frozen=True)
class DecodePlan:
    """One decode step: row r attends to its slots 0..lengths[r] (the new token's slot included);
    slots 0..shared-1 hold the same tokens in every row. `mask`: (rows, 1, 1, kv_len - shared),
    True where a row may attend among its own slots from `shared` on. `fallback`: the model's own
    attention implementation. `runs`: how the fused kernel reads the rows' own slots, as
    (first row, end row, end slot, bias or None) of consecutive rows read together up to that
    slot (the longest of them), so a short row is not read at the longest row's width (see
    `plan_runs`); the bias is None where every row of the run reaches its end slot. `own`: how
    many own slots (from `shared` on) each row reads, for the compiled kernel (None: not used)."""

    shared: int
    mask: torch.Tensor | None  # None with `own`
    fallback: str
    bias: torch.Tensor | None  # the mask as float32 0 / -inf, for the fused kernel; None with `own`
    runs: tuple[tuple[int, int, int, torch.Tensor | None], ...] = ()
    own: np.ndarray | None = None


_plan: contextvars.ContextVar[DecodePlan | None] = contextvars.ContextVar("harnessrl_decode_plan", default=None)
# the model's own implementation, by id(config): a forward on another thread (the engine's
# prefill thread) can run while a decode forward has the config pointing here
_fallbacks: dict[int, str] = {}

RUN_COST_SLOTS = 200
"""What one more kernel call costs, in row-slots read (smollm2-135m, 1 thread, step timings: of
0, 16, 64, 100, 200 and 400, 200 gave the fastest steps at 8 and 12 rows; at 5 rows 400 did,
by 5%). bench/decode_steps.py measures the runs on and off."""


def plan_runs(own: list[int], call_cost: int = RUN_COST_SLOTS) -> tuple[tuple[int, int], ...]:
    """Split rows with `own[r]` slots each (in row order) into runs of consecutive rows, each run
    read at its longest row's width: the split that reads the fewest slots, counting
    `call_cost` slots per run. Returns (first row, end row) pairs."""
    n = len(own)
    best = [0] * (n + 1)
    start = [0] * (n + 1)
    for end in range(1, n + 1):
        widest, cheapest = 0, None
        for first in range(end - 1, -1, -1):
            widest = max(widest, own[first])
            cost = best[first] + (end - first) * widest + call_cost
            if cheapest is None or cost < cheapest:
                cheapest, start[end] = cost, first
        best[end] = cheapest if cheapest is not None else 0
    runs, end = [], n
    while end:
        runs.append((start[end], end))
        end = start[end]
    return tuple(reversed(runs))


def uses_fused_kernel(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether decode attention over keys/values of this dtype and device runs in torch's fused
    CPU kernel (float32 on a CPU); anything else takes the plain matrix products."""
    return _FUSED is not None and dtype == torch.float32 and torch.device(device).type == "cpu"


def uses_compiled_kernel(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the rows' own slots go to the compiled kernel (float32 on a CPU, numba present)."""
    return uses_fused_kernel(dtype, device) and decode_kernel.available()


def make_plan(
    lengths: torch.Tensor,
    kv_len: int,
    shared: int,
    fallback: str,
    *,
    runs: bool = True,
    kernel: bool = False,
    device=None,
) -> DecodePlan:
    """The plan of a decode step whose rows hold `lengths` tokens (the new one goes at slot
    `lengths[r]`) in a cache read up to `kv_len` slots, `shared` of them common to every row.
    `kernel`: the rows' own slots go to the compiled kernel (`DecodePlan.own`; see
    `uses_compiled_kernel`); else `runs`: split the rows into runs for the fused kernel
    (`DecodePlan.runs`). `device`: where the keys and values are (the masks are made there;
    default the CPU)."""
    shared = shared if shared >= MIN_SHARED else 0
    if kernel:
        return DecodePlan(shared, None, fallback, None, own=(lengths.cpu() + 1 - shared).numpy().astype(np.int64))
    own = (lengths + 1 - shared).tolist() if runs else []
    lengths = lengths.to(device) if device is not None else lengths
    slots = torch.arange(shared, kv_len, device=lengths.device)
    mask = (slots.unsqueeze(0) <= lengths.unsqueeze(1)).view(lengths.numel(), 1, 1, kv_len - shared)
    bias = torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, float("-inf"))
    if not runs:
        return DecodePlan(shared, mask, fallback, bias)
    split = []
    for first, end in plan_runs(own):
        width = max(own[first:end])
        ragged = min(own[first:end]) < width
        split.append((first, end, shared + width, bias[first:end, :, :, :width] if ragged else None))
    return DecodePlan(shared, mask, fallback, bias, tuple(split))


@contextlib.contextmanager
def decode_plan(model, plan: DecodePlan) -> Iterator[None]:
    """Run the model's forwards inside this block with the engine's decode attention."""
    config = model.config
    _fallbacks[id(config)] = plan.fallback
    token = _plan.set(plan)
    config._attn_implementation = ENGINE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = plan.fallback
        _plan.reset(token)


def attention_function(name: str):
    """transformers' attention function of the implementation `name` (sdpa, eager, ...)."""
    if name == "eager" or name not in ALL_ATTENTION_FUNCTIONS:
        from transformers.models.llama.modeling_llama import eager_attention_forward

        return eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


# torch's fused CPU attention kernel, which also returns each query's log-sum-exp: what merging
# the two softmax parts needs (float32 only here; other dtypes take the plain products)
_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _softmax_part(scores: torch.Tensor, values: torch.Tensor):
    """(normalised output, log-sum-exp) of one block of scores (..., queries, slots) over values."""
    top = scores.amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    return torch.matmul(weights / total, values), (top + total.log()).squeeze(-1)


def _own_fused(q, key, value, plan: DecodePlan, scale: float):
    """The fused kernel over the rows' own slots, run by run (`DecodePlan.runs`)."""
    assert _FUSED is not None, "the fused CPU kernel is only called where torch has it"
    shared = plan.shared
    runs = plan.runs or ((0, q.shape[0], key.shape[2], plan.bias),)
    parts = [
        _FUSED(
            q[first:end],
            key[first:end, :, shared:width],
            value[first:end, :, shared:width],
            0.0,
            False,
            attn_mask=bias,
            scale=scale,
        )[:2]
        for first, end, width, bias in runs
    ]
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def engine_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query (rows, heads, 1, dim); key/value (rows, kv_heads, kv_len, dim), the rows' cache
    slots; returns (rows, 1, heads, dim) as transformers' attention functions do."""
    plan = _plan.get()
    fused = uses_fused_kernel(query.dtype, query.device)
    if (
        plan is None
        or (plan.own is not None and not fused)  # a plan for the compiled kernel, which needs float32 on a CPU
        or query.shape[2] != 1
        or dropout
        or kwargs.get("softcap") is not None
        or kwargs.get("s_aux") is not None
        or kwargs.get("sliding_window") is not None
    ):
        name = plan.fallback if plan is not None else _fallbacks.get(id(getattr(module, "config", None)), "sdpa")
        fallback = attention_function(name)
        return fallback(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return decode_attention(query, key, value, plan, scale), None


def decode_attention(query, key, value, plan: DecodePlan, scale: float) -> torch.Tensor:
    """One decode step's attention by `plan`: query (rows, heads, 1, dim), key/value (rows,
    kv_heads, kv_len, dim), the rows' cache slots; returns (rows, 1, heads, dim)."""
    fused = uses_fused_kernel(query.dtype, query.device)
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    # a row's query heads of one kv head go where a prompt's query tokens would (rows, kv_heads,
    # group, dim): one key/value head then serves its whole group without being repeated
    q = query.reshape(rows, kv_heads, group, dim)
    shared = plan.shared
    if plan.own is not None:
        out2, lse2 = decode_kernel.own_attention(q, key, value, plan.own, shared, scale)
    elif fused:
        out2, lse2 = _own_fused(q, key, value, plan, scale)
    else:
        own_k, own_v = key[:, :, shared:], value[:, :, shared:]
        assert plan.mask is not None, "a plan without `own` carries its mask"
        scores = torch.matmul(q * scale, own_k.transpose(-1, -2)).masked_fill_(~plan.mask, float("-inf"))
        if not shared:
            out2 = torch.matmul(torch.softmax(scores, dim=-1), own_v)
        else:
            out2, lse2 = _softmax_part(scores, own_v)
    if not shared:
        return out2.reshape(rows, heads, 1, dim).transpose(1, 2)
    # the shared block: every row's queries of a kv head against one copy of its keys
    qs = q.permute(1, 0, 2, 3).reshape(1, kv_heads, rows * group, dim)
    shared_k, shared_v = key[:1, :, :shared], value[:1, :, :shared]
    if fused:
        assert _FUSED is not None, "the fused CPU kernel is only called where torch has it"
        out1, lse1 = _FUSED(qs, shared_k, shared_v, 0.0, False, scale=scale)[:2]
    else:
        out1, lse1 = _softmax_part(torch.matmul(qs * scale, shared_k.transpose(-1, -2)), shared_v)
    out1 = out1.reshape(kv_heads, rows, group, dim).permute(1, 0, 2, 3)
    lse1 = lse1.reshape(kv_heads, rows, group).permute(1, 0, 2).unsqueeze(-1)
    lse2 = lse2.unsqueeze(-1)
    top = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - top), torch.exp(lse2 - top)
    out = (out1 * w1 + out2 * w2) / (w1 + w2)
    return out.reshape(rows, heads, 1, dim).transpose(1, 2)


AttentionInterface.register(ENGINE_ATTENTION, engine_attention)
