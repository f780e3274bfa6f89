"""Prepacked float32 weights for the engine's own forwards (oneDNN).

A decode step multiplies a handful of rows by every weight matrix of the model. On a CPU that is
a small-M matrix product, and the general GEMM spends much of it re-laying out the weights it
reads. oneDNN can lay a weight out once for such products ("prepacking"): measured on the 90
layer matrices of smollm2-135m, 1 thread, weights cold in cache, 46.4 -> 27.5 ms at 12 rows and
52.4 -> 34.2 ms at 16 (docs/BENCHMARKS.md). The engine's prefills (tens to hundreds of new
tokens) gain too: 196 -> 146 ms at 64 tokens, 474 -> 408 ms at 200. The results equal the plain
product up to float rounding.

`PackedLinears` keeps a packed copy of every float32 `nn.Linear` of a CPU model (as many bytes
again as those weights), repacked when a weight changed (its identity or in-place version
counter, which optimizer steps bump). Its owner says when that may have happened
(`weights_changed()`: the engine does when its fingerprint of the parameters moves), so a step
does not check 200 weights again. While at least one user holds it (`acquire`/`release`, or
`swapped_in()`: a decode step, a prefill on the engine thread or on its prefill thread), each of
those layers has a forward that uses its packed copy in forwards run under `engine_forward()`,
and the plain product in any other forward (a training pass on another thread). A forward never
sees the packed forwards come or go midway, so its floats never depend on timing.

On by default where it pays and the copy is affordable (`default_on`): a float32 CPU model whose
linear weights take at most DEFAULT_MAX_BYTES. `EngineConfig(packed_decode=False)` turns it off,
`True` (or `packed_any_size`) on for a larger model too (harnessrl.models.engine_config). Batching
changes the floats no more than the plain product does: a row's product no longer depends on how
many rows share the step for most matrices (the plain product takes another kernel for one row
than for several), though not for all (smollm2's 1536-wide down projections still do).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Iterator

import torch
from torch import nn

_engine_forward: contextvars.ContextVar[bool] = contextvars.ContextVar("harnessrl_packed_forward", default=False)


DEFAULT_MAX_BYTES = 2 * 1024**3
"""Packed by default only while the copy costs at most this much memory (2 GiB: a ~500M
parameter float32 model)."""


def default_on(model, *, any_size: bool = False) -> bool:
    """Whether an engine over `model` packs its decode weights when not told: `packable` and the
    linear weights take at most DEFAULT_MAX_BYTES (any size with `any_size`)."""
    if not packable(model):
        return False
    return any_size or linear_bytes(model) <= DEFAULT_MAX_BYTES


def linear_bytes(model) -> int:
    """Bytes of the weights a `PackedLinears` would copy."""
    return sum(m.weight.numel() * m.weight.element_size() for m in _linears(model))


def _linears(model) -> list[nn.Linear]:
    return [
        m
        for m in model.modules()
        if type(m) is nn.Linear and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"
    ]


def available() -> bool:
    """Whether this torch build has oneDNN and its prepacked linear operators."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and ops is not None
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def packable(model) -> bool:
    """A CPU model with float32 weights, on a torch build that can pack them."""
    first = next(model.parameters(), None)
    return first is not None and first.device.type == "cpu" and first.dtype == torch.float32 and available()


class PackedLinears:
    """Packed copies of a model's float32 CPU `nn.Linear` weights (see the module docstring).
    `rows`: the batch size the packing is laid out for (any number of rows works)."""

    def __init__(self, model, rows: int):
        self.linears = _linears(model)
        self.rows = rows
        self._packs: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}
        self.packs_made = 0
        self._users = 0
        self._stale = True  # nothing packed yet
        self._lock = threading.Lock()

    def weights_changed(self) -> None:
        """Some weight may have changed: the next `acquire` repacks those that did."""
        self._stale = True

    def _refresh(self) -> None:
        """Repack every weight that changed (identity or in-place version) since it was packed."""
        self._stale = False
        for module in self.linears:
            key = (id(module.weight), module.weight._version)
            have = self._packs.get(id(module))
            if have is None or have[0] != key:
                with torch.no_grad():
                    packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), self.rows)
                self._packs[id(module)] = (key, packed)
                self.packs_made += 1

    def acquire(self) -> None:
        """Install the layers' packed forwards (repacking what changed, after `weights_changed`)
        for one more user: a decode step, or a prefill that may run on another thread meanwhile.
        They stay installed until every user has released them, so a forward never sees them come
        or go midway."""
        with self._lock:
            if self._stale:
                self._refresh()
            if self._users == 0:
                for module in self.linears:
                    # an instance attribute shadows the class method while packed (the checker forbids it in general)
                    module.forward = functools.partial(_forward, self._packs, module)  # type: ignore[method-assign]
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for module in self.linears:
                    module.__dict__.pop("forward", None)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Forwards under `engine_forward()` inside this block use the packed weights."""
        self.acquire()
        try:
            yield
        finally:
            self.release()

    def packed_weights(self) -> dict[int, tuple[tuple[int, int], torch.Tensor]]:
        """id(module) -> (its weight's identity and version, its packed weight), repacking what
        changed first (after `weights_changed`): for a forward that calls the packed products
        itself. Read it, never change it."""
        with self._lock:
            if self._stale:
                self._refresh()
            return self._packs

    def clear(self) -> None:
        with self._lock:
            self._packs.clear()
            self._stale = True


@contextlib.contextmanager
def engine_forward() -> Iterator[None]:
    """Mark this thread's forwards inside the block as the engine's own (decode or prefill)."""
    token = _engine_forward.set(True)
    try:
        yield
    finally:
        _engine_forward.reset(token)


def _forward(packs: dict, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not _engine_forward.get():
        return nn.functional.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packs[id(module)][1], module.bias, "none", [], "")
