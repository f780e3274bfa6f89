"""Prepacked float32 weights for the engine's decode forwards (oneDNN).

A decode step multiplies a handful of rows by every weight matrix of the model. On a CPU that is
a small-M matrix product, and the general GEMM spends much of it re-laying out the weights it
reads. oneDNN can lay a weight out once for such products ("prepacking"): measured on the 90
layer matrices of smollm2-135m, 1 thread, weights cold in cache, 46.4 -> 27.5 ms at 12 rows and
52.4 -> 34.2 ms at 16 (docs/BENCHMARKS.md). The results equal the plain product up to float
rounding.

`PackedLinears` keeps a packed copy of every float32 `nn.Linear` of a CPU model (as many bytes
again as those weights), repacked when a weight changes (its identity or in-place version
counter, which optimizer steps bump). Inside `swapped_in()` each of those layers gets a forward
that uses its packed copy, but only in forwards run under `decoding()` on the same thread: a
forward on another thread meanwhile (the engine's prefill thread) keeps the plain product, so its
floats never depend on timing.

On by default where it pays and the copy is affordable (`default_on`): a float32 CPU model whose
linear weights take at most DEFAULT_MAX_BYTES. `HARNESSRL_PACKED_DECODE=0` or
`Engine(packed_decode=False)` turn it off, `=1` / `True` on for a larger model too. Batching
changes the floats no more than the plain product does: a row's product no longer depends on how
many rows share the step for most matrices (the plain product takes another kernel for one row
than for several), though not for all (smollm2's 1536-wide down projections still do).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Iterator

import torch
from torch import nn

_decoding: contextvars.ContextVar[bool] = contextvars.ContextVar("harnessrl_packed_decoding", default=False)


DEFAULT_MAX_BYTES = 2 * 1024**3
"""Packed by default only while the copy costs at most this much memory (2 GiB: a ~500M
parameter float32 model)."""


def default_on(model) -> bool:
    """Whether an engine over `model` packs its decode weights when not told: $HARNESSRL_PACKED_DECODE
    (0 off, 1 on wherever `packable`), unset: `packable` and the linear weights take at most
    DEFAULT_MAX_BYTES."""
    value = os.environ.get("HARNESSRL_PACKED_DECODE", "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"HARNESSRL_PACKED_DECODE must be 0 or 1, got {value!r}")
    if value == "0" or not packable(model):
        return False
    return value == "1" or linear_bytes(model) <= DEFAULT_MAX_BYTES


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

    def _packed(self, module: nn.Linear) -> torch.Tensor:
        key = (id(module.weight), module.weight._version)
        have = self._packs.get(id(module))
        if have is None or have[0] != key:
            with torch.no_grad():
                have = (key, torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), self.rows))
            self._packs[id(module)] = have
            self.packs_made += 1
        return have[1]

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Forwards under `decoding()` inside this block use the packed weights."""
        for module in self.linears:
            module.forward = functools.partial(_forward, module, self._packed(module))
        try:
            yield
        finally:
            for module in self.linears:
                module.__dict__.pop("forward", None)

    def clear(self) -> None:
        self._packs.clear()


@contextlib.contextmanager
def decoding() -> Iterator[None]:
    """Mark this thread's forwards inside the block as the engine's decode forwards."""
    token = _decoding.set(True)
    try:
        yield
    finally:
        _decoding.reset(token)


def _forward(module: nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if not _decoding.get():
        return nn.functional.linear(x, module.weight, module.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")
