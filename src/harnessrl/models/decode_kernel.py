"""Compiled CPU kernels for the engine's decode steps: the rotary embedding with the cache writes,
and the attention over each row's own cache slots merged with the shared block.

In a decode step each row's few queries (the query heads of one key/value head) attend over that
row's own slots. torch's fused CPU attention kernel does this in tiny matrix products (3 queries
against a few hundred keys) and reads the keys and values at a fraction of the memory's rate;
rows of different lengths also have to be padded to a common width or split into several calls.
`attend` walks each row's slots once, exactly as many as the row has, scoring all the row's
queries of a key/value head against each key as it goes (float32 throughout, numba-compiled),
and merges the row's part with the softmax part of the prefix every row shares (computed once
for all rows by torch's fused kernel, harnessrl.models.attention) in the same pass: what was a
dozen small tensor operations per layer and step is one call. Every (row, head) is computed on
its own, so a row's result never depends on which other rows share the step.

`rope_write` rotates a step's queries and keys (the model's `q * cos + rotate_half(q) * sin`,
each product and the sum rounded as torch rounds them, so the same floats) and writes the new
keys and values into each row's slot of the batch cache, one call per layer instead of a
rotation, a stack and an indexed copy.

Compiled on first use (seconds; numba keeps the machine code in its on-disk cache, so later
processes load it) and checked on one tiny case. `available()` says whether that worked;
without numba, or if it did not, the engine uses torch's fused kernel instead (with a warning
where numba imports but a kernel fails).
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, NamedTuple

import numpy as np
import torch

# float reassociation (vectorised dot products); no assumptions about NaN / inf
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


class Kernels(NamedTuple):
    """The compiled kernels (`kernels()`), called on C-contiguous float32 numpy arrays (int64 for
    positions and counts) without checks; `own_attention` is `attend` with them.

    `attend(q, k, v, counts, start, scale, shared_out, shared_lse, out)`: row b's queries q[b]
    (rows, kv_heads, group, dim) over its slots start..start+counts[b]-1 of k and v (rows,
    kv_heads, capacity, dim), and with start > 0 merged with the shared block's softmax part
    (shared_out (kv_heads, rows * group, dim) normalised, shared_lse (rows * group, kv_heads) its
    log-sum-exp; with start 0 they are not read), into out (rows, kv_heads, group, dim).

    `rope_write(qkv, cos, sin, positions, heads, q_rows, q_heads, k_cache, v_cache)`: each row's
    q/k/v projections qkv (rows, (heads + 2 * kv_heads) * dim) rotated by cos and sin (rows, dim;
    sin with its first half negated, so that x * cos + swap_halves(x) * sin is the rotation): the
    queries written twice, as (rows, kv_heads, group, dim) into q_rows and as (kv_heads, rows *
    group, dim) into q_heads (the shared block's layout), the key and the value into slot
    positions[b] of row b of k_cache and v_cache (rows, kv_heads, capacity, dim)."""

    attend: Any
    rope_write: Any


@functools.cache
def _compiled() -> Kernels | None:
    """The kernels, compiled (or loaded from numba's cache) and checked on first call; None
    without numba or when one fails its check."""
    try:
        from numba import njit
    except Exception:  # noqa: BLE001 - missing or broken numba: the engine falls back
        return None

    @njit(fastmath=_FASTMATH, cache=True, boundscheck=False, nogil=True)
    def attend(q, k, v, counts, start, scale, shared_out, shared_lse, out):  # pragma: no cover - compiled
        rows, heads, group, dim = q.shape
        widest = 1
        for b in range(rows):
            widest = max(widest, counts[b])
        scores = np.empty((group, widest), dtype=np.float32)
        acc = np.empty((group, dim), dtype=np.float32)
        top = np.empty(group, dtype=np.float32)
        total = np.empty(group, dtype=np.float32)
        for b in range(rows):
            n = counts[b]
            for h in range(heads):
                for w in range(n):
                    for g in range(group):
                        s = np.float32(0.0)
                        for d in range(dim):
                            s += q[b, h, g, d] * k[b, h, start + w, d]
                        scores[g, w] = s * scale
                for g in range(group):
                    m = scores[g, 0]
                    for w in range(1, n):
                        m = max(m, scores[g, w])
                    t = np.float32(0.0)
                    for w in range(n):
                        p = np.float32(math.exp(scores[g, w] - m))
                        scores[g, w] = p
                        t += p
                    top[g] = m
                    total[g] = t
                    for d in range(dim):
                        acc[g, d] = 0.0
                for w in range(n):
                    for g in range(group):
                        p = scores[g, w]
                        for d in range(dim):
                            acc[g, d] += p * v[b, h, start + w, d]
                for g in range(group):
                    if start > 0:  # (o1 e^lse1 + acc e^top) / (e^lse1 + total e^top), both scaled by e^-max
                        lse1 = shared_lse[b * group + g, h]
                        m = max(lse1, top[g])
                        a = np.float32(math.exp(lse1 - m))
                        c = np.float32(math.exp(top[g] - m))
                        inv = np.float32(1.0) / (a + c * total[g])
                        a *= inv
                        c *= inv
                        for d in range(dim):
                            out[b, h, g, d] = shared_out[h, b * group + g, d] * a + acc[g, d] * c
                    else:
                        inv = np.float32(1.0) / total[g]
                        for d in range(dim):
                            out[b, h, g, d] = acc[g, d] * inv

    # no fast-math: each product and the sum rounded on their own, as torch's three operations do
    @njit(cache=True, boundscheck=False, nogil=True)
    def rope_write(qkv, cos, sin, positions, heads, q_rows, q_heads, k_cache, v_cache):  # pragma: no cover - compiled
        rows, kv_heads, group, dim = q_rows.shape
        half = dim // 2
        for b in range(rows):
            slot = positions[b]
            for j in range(heads + kv_heads):
                base = j * dim
                if j < heads:
                    h, g = j // group, j % group
                    for d in range(dim):
                        other = base + d + half if d < half else base + d - half
                        x = qkv[b, base + d] * cos[b, d] + qkv[b, other] * sin[b, d]
                        q_rows[b, h, g, d] = x
                        q_heads[h, b * group + g, d] = x
                else:
                    h = j - heads
                    for d in range(dim):
                        other = base + d + half if d < half else base + d - half
                        k_cache[b, h, slot, d] = qkv[b, base + d] * cos[b, d] + qkv[b, other] * sin[b, d]
            values = (heads + kv_heads) * dim
            for h in range(kv_heads):
                for d in range(dim):
                    v_cache[b, h, slot, d] = qkv[b, values + h * dim + d]

    kernels = Kernels(attend, rope_write)
    try:  # compile (or load) now and check on a tiny case against numpy, not in a decode step
        _check(kernels)
    except Exception as exc:  # noqa: BLE001 - the engine falls back to torch's fused kernel
        warnings.warn(f"harnessrl: the compiled decode kernels are not used: {exc}", stacklevel=2)
        return None
    return kernels


def _check(kernels: Kernels) -> None:
    """Both kernels on a tiny case against numpy; a RuntimeError saying which is wrong."""
    rng = np.random.default_rng(0)
    rows, kv_heads, group, dim, slots, start = 2, 2, 2, 4, 6, 2
    heads = kv_heads * group
    qkv = rng.standard_normal((rows, (heads + 2 * kv_heads) * dim), dtype=np.float32)
    angle = rng.standard_normal((rows, dim // 2), dtype=np.float32)
    cos = np.concatenate([np.cos(angle)] * 2, axis=1)
    sin = np.concatenate([-np.sin(angle), np.sin(angle)], axis=1)
    positions = np.array([3, 5], np.int64)
    k = rng.standard_normal((rows, kv_heads, slots, dim), dtype=np.float32)
    v = rng.standard_normal((rows, kv_heads, slots, dim), dtype=np.float32)
    k[1, :, :start], v[1, :, :start] = k[0, :, :start], v[0, :, :start]  # the shared block
    q_rows = np.empty((rows, kv_heads, group, dim), np.float32)
    q_heads = np.empty((kv_heads, rows * group, dim), np.float32)
    kernels.rope_write(qkv, cos, sin, positions, heads, q_rows, q_heads, k, v)
    x = qkv.reshape(rows, heads + 2 * kv_heads, dim)
    half = dim // 2
    swapped = np.concatenate([x[..., half:], x[..., :half]], axis=-1)
    rotated = x * cos[:, None] + swapped * sin[:, None]
    written = np.arange(rows), slice(None), positions
    if not (
        np.array_equal(q_rows, rotated[:, :heads].reshape(rows, kv_heads, group, dim))
        and np.array_equal(q_heads, q_rows.transpose(1, 0, 2, 3).reshape(kv_heads, rows * group, dim))
        and np.array_equal(k[written], rotated[:, heads : heads + kv_heads])
        and np.array_equal(v[written], x[:, heads + kv_heads :])
    ):
        raise RuntimeError("the compiled rotary kernel gave wrong results")
    scale = np.float32(0.5)
    scores = np.einsum("hrd,hsd->hrs", q_heads, k[0, :, :start]) * scale
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    shared_out = (weights / weights.sum(-1, keepdims=True) @ v[0, :, :start]).astype(np.float32)
    shared_lse = (np.log(weights.sum(-1)) + scores.max(-1)).T.astype(np.float32).copy()
    for shared in (start, 0):
        out = np.empty((rows, kv_heads, group, dim), np.float32)
        kernels.attend(q_rows, k, v, positions + 1 - shared, shared, scale, shared_out, shared_lse, out)
        for b in range(rows):
            s = np.einsum("hgd,hsd->hgs", q_rows[b], k[b, :, : positions[b] + 1]) * scale
            w = np.exp(s - s.max(-1, keepdims=True))
            if not np.allclose(out[b], (w / w.sum(-1, keepdims=True)) @ v[b, :, : positions[b] + 1], atol=1e-5):
                raise RuntimeError("the compiled kernel gave wrong results")


def kernels() -> Kernels | None:
    """The compiled kernels, or None where numba is missing or they failed their check."""
    return _compiled()


def available() -> bool:
    """Whether the kernels can run here: numba imports and they compile and compute."""
    return _compiled() is not None


def _whole_rows(x: torch.Tensor) -> torch.Tensor:
    """(rows, heads, slots, dim) cache slots as a C-contiguous tensor the kernel can index fast:
    a slot slice of the engine's batch cache is widened back to the buffer's full capacity (a
    view, no copy); anything else is copied."""
    rows, heads, _, dim = x.shape
    s = x.stride()
    if s[3] == 1 and s[2] == dim and s[1] % dim == 0 and s[0] == heads * s[1]:
        return x.as_strided((rows, heads, s[1] // dim, dim), s)
    return x.contiguous()


# what `attend` is handed for the shared block's part when there is none (it reads none)
NO_SHARED = (np.empty((1, 1, 1), np.float32), np.empty((1, 1), np.float32))


def own_attention(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    counts: np.ndarray,
    start: int,
    scale: float,
    shared: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Row b's queries q[b] (rows, kv_heads, group, dim) over its slots start..start+counts[b]-1
    of key/value (rows, kv_heads, slots, dim), float32 on the CPU; with start > 0, merged with
    `shared`: the softmax part of slots 0..start-1 (harnessrl.models.attention.shared_block's
    output and log-sum-exp). Returns the attention output (rows, kv_heads, group, dim). Every
    count must be >= 1."""
    compiled = _compiled()
    if compiled is None:
        raise RuntimeError(
            "the compiled decode attention kernel is not available here: numba is missing (pip install numba) "
            "or the kernel failed its check when first compiled (see the warning then)"
        )
    rows, heads, group, dim = q.shape
    if counts.shape != (rows,):
        raise ValueError(f"{counts.size} counts for {rows} rows")
    if rows and (counts.min() < 1 or start + counts.max() > key.shape[2]):
        raise ValueError(f"counts {counts.tolist()} from slot {start} do not fit {key.shape[2]} cache slots")
    if (start > 0) != (shared is not None):
        raise ValueError("the shared block's part comes with slots before `start`, and only then")
    out = torch.empty((rows, heads, group, dim), dtype=torch.float32)
    shared_np = NO_SHARED if shared is None else (shared[0].contiguous().numpy(), shared[1].contiguous().numpy())
    compiled.attend(
        q.contiguous().numpy(),
        _whole_rows(key).numpy(),
        _whole_rows(value).numpy(),
        counts.astype(np.int64, copy=False),
        start,
        np.float32(scale),
        *shared_np,
        out.numpy(),
    )
    return out
