"""A compiled CPU kernel for the engine's decode attention over the rows' own cache slots.

In a decode step each row's few queries (the query heads of one key/value head) attend over that
row's own slots. torch's fused CPU attention kernel does this in tiny matrix products (3 queries
against a few hundred keys) and reads the keys and values at a fraction of the memory's rate;
rows of different lengths also have to be padded to a common width or split into several calls.
This kernel walks each row's slots once, exactly as many as the row has, scoring all the row's
queries of a key/value head against each key as it goes (float32 throughout, numba-compiled).
It returns each query's output and log-sum-exp, what the shared-prefix merge in
harnessrl.models.attention needs. Every (row, head) is computed on its own, so a row's result
never depends on which other rows share the step.

Compiled on first use (about a second; numba keeps the machine code in its on-disk cache, so
later processes load it) and checked on one tiny case. `available()` says whether that worked;
without numba, or if it did not, the engine uses torch's fused kernel instead (with a warning
where numba imports but the kernel fails).
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import torch

# float reassociation (vectorised dot products); no assumptions about NaN / inf
_FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@functools.cache
def _compiled():
    """The numba kernel, compiled (or loaded from numba's cache) on first call; None without numba."""
    try:
        from numba import njit
    except Exception:  # noqa: BLE001 - missing or broken numba: the engine falls back
        return None

    @njit(fastmath=_FASTMATH, cache=True, boundscheck=False, nogil=True)
    def attend(q, k, v, counts, start, scale, out, lse):  # pragma: no cover - compiled
        rows, heads, group, dim = q.shape
        widest = 1
        for b in range(rows):
            widest = max(widest, counts[b])
        scores = np.empty((group, widest), dtype=np.float32)
        for b in range(rows):
            n = counts[b]
            for h in range(heads):
                for w in range(n):
                    for g in range(group):
                        acc = np.float32(0.0)
                        for d in range(dim):
                            acc += q[b, h, g, d] * k[b, h, start + w, d]
                        scores[g, w] = acc * scale
                for g in range(group):
                    top = scores[g, 0]
                    for w in range(1, n):
                        top = max(top, scores[g, w])
                    total = np.float32(0.0)
                    for w in range(n):
                        p = np.float32(math.exp(scores[g, w] - top))
                        scores[g, w] = p
                        total += p
                    inv = np.float32(1.0) / total
                    for w in range(n):
                        scores[g, w] *= inv
                    lse[b, h, g] = top + np.float32(math.log(total))
                    for d in range(dim):
                        out[b, h, g, d] = 0.0
                for w in range(n):
                    for g in range(group):
                        p = scores[g, w]
                        for d in range(dim):
                            out[b, h, g, d] += p * v[b, h, start + w, d]

    try:  # compile (or load) now, on one tiny case checked against numpy, not in a decode step
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal(shape, dtype=np.float32) for shape in ((1, 1, 2, 4), (1, 1, 3, 4), (1, 1, 3, 4)))
        out, lse = np.empty((1, 1, 2, 4), np.float32), np.empty((1, 1, 2), np.float32)
        attend(q, k, v, np.array([2], np.int64), 1, np.float32(0.5), out, lse)
        scores = q[0, 0] @ k[0, 0, 1:].T * 0.5
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        expected = (weights / weights.sum(axis=1, keepdims=True)) @ v[0, 0, 1:]
        if not np.allclose(out[0, 0], expected, atol=1e-5):
            raise RuntimeError("the compiled kernel gave wrong results")
    except Exception as exc:  # noqa: BLE001 - the engine falls back to torch's fused kernel
        warnings.warn(f"harnessrl: the compiled decode attention kernel is not used: {exc}", stacklevel=2)
        return None
    return attend


def raw_kernel():
    """The compiled kernel itself, for a caller that checked its inputs (C-contiguous float32
    numpy arrays: q (rows, kv_heads, group, dim), k and v (rows, kv_heads, slots, dim), counts
    int64 >= 1 within the slots; it writes out and lse), or None where it is not available."""
    return _compiled()


def available() -> bool:
    """Whether the kernel can run here: numba imports and the kernel compiles and computes."""
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


def own_attention(
    q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, counts: np.ndarray, start: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b's queries q[b] (rows, kv_heads, group, dim) over its slots start..start+counts[b]-1
    of key/value (rows, kv_heads, slots, dim), float32 on the CPU. Returns (output (rows,
    kv_heads, group, dim), log-sum-exp (rows, kv_heads, group)). Every count must be >= 1."""
    kernel = _compiled()
    if kernel is None:
        raise RuntimeError(
            "the compiled decode attention kernel is not available here: numba is missing (pip install numba) "
            "or the kernel failed its check when first compiled (see the warning then)"
        )
    rows, heads, group, dim = q.shape
    if counts.shape != (rows,):
        raise ValueError(f"{counts.size} counts for {rows} rows")
    if rows and (counts.min() < 1 or start + counts.max() > key.shape[2]):
        raise ValueError(f"counts {counts.tolist()} from slot {start} do not fit {key.shape[2]} cache slots")
    counts = counts.astype(np.int64, copy=False)
    out = torch.empty((rows, heads, group, dim), dtype=torch.float32)
    lse = torch.empty((rows, heads, group), dtype=torch.float32)
    kernel(
        q.contiguous().numpy(),
        _whole_rows(key).numpy(),
        _whole_rows(value).numpy(),
        counts,
        start,
        np.float32(scale),
        out.numpy(),
        lse.numpy(),
    )
    return out, lse
