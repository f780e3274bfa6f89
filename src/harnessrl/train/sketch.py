"""GradientSketch: a seeded linear projection of a model's gradient to `dim` numbers.

HarnessBandit's transferability signal compares the direction of one harness's update with the
others'. Full gradients are far too big to keep per harness, so each is projected:

    sketch(g) = sum over parameter tensors p of  S_p @ vec(g_p)          S_p: [dim, numel(p)]

A random linear map roughly preserves inner products (Johnson-Lindenstrauss), so
cosine(sketch(a), sketch(b)) ~ cosine(a, b). Because the map is linear and computed per tensor,
workers holding different parameters (or different dim-0 slices of one parameter, as FSDP2
shards it) sketch their part and the parts are summed: sketch(a + b) = sketch(a) + sketch(b).

S_p is never stored. It is regenerated from torch.Generators seeded with a stable hash of
(seed, parameter name, block index), where a block is a fixed run of flat element positions.
So the projection of a parameter depends only on the seed, its name and each element's flat
position: not on which other parameters exist, their order, the device, or how the tensor is
sharded. (Names must be the same on every worker: use the unwrapped model's names.)

Two kinds:
  "countsketch" (default)  each element j goes to one bucket h(j) in [0, dim) with a sign
                           s(j) = +-1: sketch[h(j)] += s(j) * g[j]. One pass over the gradient;
                           the draws are cached per (name, offset, numel), costing 8 bytes per
                           trainable element (fine for LoRA; pass cache=False for a full model
                           to redraw them each call). E[<Sa, Sb>] = <a, b>.
  "gaussian"               S has i.i.d. N(0, 1/dim) entries, generated on the fly in blocks of
                           1024 columns on the CPU and discarded: dim random numbers per gradient
                           element per call (512 x 1M LoRA parameters = 5e8 draws, seconds; a
                           full 135M model: minutes, use countsketch). Exact JL, no cache.

Tolerance (dense random gradients of a few thousand elements or more, dim=512): the sketched
cosine is within about 0.05 of the true one on average (standard error ~ (1 - cos^2)/sqrt(dim));
tests/test_sketch.py checks mean |error| < 0.05 and max |error| < 0.12 over pairs with true
cosines from -0.9 to 0.9 for both kinds. CountSketch is worse when a few elements dominate the
gradient (they may share a bucket); gradients of neural networks are rarely that concentrated.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

COUNT_BLOCK = 1 << 16  # elements per seeded block of bucket/sign draws
GAUSS_BLOCK = 1024  # columns per seeded block of the Gaussian matrix (dim x 1024 floats at a time)


def _stable_seed(*parts: object) -> int:
    """A 63-bit seed from the parts, identical across processes and machines (unlike hash())."""
    digest = hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class GradientSketch:
    """sketch(named_grads) / sketch_model(model) -> float32 [dim]; same (dim, seed, kind) = same projection."""

    def __init__(self, dim: int = 512, seed: int = 0, kind: str = "countsketch", cache: bool = True):
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if kind not in ("countsketch", "gaussian"):
            raise ValueError(f"kind must be 'countsketch' or 'gaussian', got {kind!r}")
        self.dim, self.seed, self.kind, self.cache = dim, seed, kind, cache
        self._draws: dict[tuple[str, int, int], Tensor] = {}  # countsketch cache

    def _generator(self, name: str, block: int) -> torch.Generator:
        return torch.Generator().manual_seed(_stable_seed(self.kind, self.seed, name, block))

    def _count_draws(self, name: str, offset: int, numel: int) -> Tensor:
        """One draw v in [0, 2 * dim) per flat element offset .. offset + numel - 1:
        bucket = v // 2, sign = +1 if v is even else -1."""
        key = (name, offset, numel)
        if key in self._draws:
            return self._draws[key]
        end = offset + numel
        parts = []
        for block in range(offset // COUNT_BLOCK, (end - 1) // COUNT_BLOCK + 1):
            lo, hi = max(offset, block * COUNT_BLOCK), min(end, (block + 1) * COUNT_BLOCK)
            # Draw only up to the last element needed. torch's CPU randint draws element by element,
            # so n draws are the first n of any longer draw (tests check slices against the whole).
            draws = torch.randint(0, 2 * self.dim, (hi - block * COUNT_BLOCK,), generator=self._generator(name, block))
            parts.append(draws[lo - block * COUNT_BLOCK :])
        draws = torch.cat(parts)
        if self.cache:
            self._draws[key] = draws
        return draws

    def _sketch_tensor(self, name: str, grad: Tensor, offset: int) -> Tensor:
        flat = grad.detach().reshape(-1).float()
        if self.kind == "countsketch":
            draws = self._count_draws(name, offset, flat.numel()).to(flat.device)
            sign = 1.0 - 2.0 * (draws & 1).float()
            out = torch.zeros(self.dim, device=flat.device)
            out.index_add_(0, draws >> 1, flat * sign)
            return out.cpu()
        flat = flat.cpu()  # Gaussian blocks come from CPU generators (device-independent numbers)
        out = torch.zeros(self.dim)
        end = offset + flat.numel()
        for block in range(offset // GAUSS_BLOCK, (end - 1) // GAUSS_BLOCK + 1):
            lo, hi = max(offset, block * GAUSS_BLOCK), min(end, (block + 1) * GAUSS_BLOCK)
            matrix = torch.randn(self.dim, GAUSS_BLOCK, generator=self._generator(name, block))
            cols = slice(lo - block * GAUSS_BLOCK, hi - block * GAUSS_BLOCK)
            out += matrix[:, cols] @ flat[lo - offset : hi - offset]
        return out / math.sqrt(self.dim)  # entries N(0, 1/dim)

    def sketch(self, named_grads: Iterable[tuple[str, Tensor]], offsets: Mapping[str, int] | None = None) -> Tensor:
        """Sketch of the gradient given as (parameter name, gradient tensor) pairs: float32 [dim] on CPU.

        offsets[name]: flat index of this tensor's first element within the full parameter, for
        a worker holding a contiguous slice (e.g. rows a..b of a dim-0 sharded weight:
        offset = a * row numel). Default 0 (the whole parameter).
        """
        offsets = offsets or {}
        out = torch.zeros(self.dim)
        for name, grad in named_grads:
            if grad.numel():
                out += self._sketch_tensor(name, grad, int(offsets.get(name, 0)))
        return out

    def sketch_model(self, model: torch.nn.Module) -> Tensor:
        """Sketch of the .grad of every trainable parameter (requires_grad and grad is not None)."""
        return self.sketch(
            (name, p.grad) for name, p in model.named_parameters() if p.requires_grad and p.grad is not None
        )


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity of two vectors; 0.0 when either is all zeros (no direction to compare)."""
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    norms = a.norm() * b.norm()
    return float(a @ b / norms) if norms > 0 else 0.0
