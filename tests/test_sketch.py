"""GradientSketch: cosine preservation, seeding, linearity, shard additivity."""

from __future__ import annotations

import pytest
import torch

from harnessrl.train.sketch import GradientSketch, cosine

SHAPES = {"layer0.weight": (48, 64), "layer0.bias": (64,), "layer1.weight": (16, 64)}
N = sum(torch.Size(s).numel() for s in SHAPES.values())


def as_named(flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Cut one flat vector into the parameter tensors of SHAPES."""
    out, i = [], 0
    for name, shape in SHAPES.items():
        k = torch.Size(shape).numel()
        out.append((name, flat[i : i + k].reshape(shape)))
        i += k
    return out


def pair_with_cosine(c: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random vectors whose true cosine is exactly c (b = c * a_hat + sqrt(1 - c^2) * o_hat, o _|_ a)."""
    a = torch.randn(N, generator=gen, dtype=torch.float64)
    o = torch.randn(N, generator=gen, dtype=torch.float64)
    o = o - (o @ a) / (a @ a) * a
    b = 2.5 * (c * a / a.norm() + (1 - c * c) ** 0.5 * o / o.norm())
    return a.float(), b.float()


@pytest.mark.parametrize("kind", ["countsketch", "gaussian"])
def test_sketched_cosine_approximates_true_cosine(kind):
    gen = torch.Generator().manual_seed(1)
    sk = GradientSketch(dim=512, seed=0, kind=kind)
    errors = []
    for c in [-0.9, -0.5, -0.2, 0.0, 0.3, 0.6, 0.9]:
        a, b = pair_with_cosine(c, gen)
        assert cosine(a, b) == pytest.approx(c, abs=1e-5)
        errors.append(abs(cosine(sk.sketch(as_named(a)), sk.sketch(as_named(b))) - c))
    # the tolerance stated in sketch.py's docstring
    assert sum(errors) / len(errors) < 0.05
    assert max(errors) < 0.12


@pytest.mark.parametrize("kind", ["countsketch", "gaussian"])
def test_seeds(kind):
    g = torch.randn(N, generator=torch.Generator().manual_seed(2))
    one = GradientSketch(dim=64, seed=7, kind=kind).sketch(as_named(g))
    again = GradientSketch(dim=64, seed=7, kind=kind).sketch(as_named(g))
    other = GradientSketch(dim=64, seed=8, kind=kind).sketch(as_named(g))
    assert one.shape == (64,) and one.dtype == torch.float32
    assert torch.equal(one, again)
    assert not torch.allclose(one, other)


@pytest.mark.parametrize("kind", ["countsketch", "gaussian"])
def test_linear(kind):
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    sk = GradientSketch(dim=128, seed=0, kind=kind)
    assert torch.allclose(sk.sketch(as_named(a + b)), sk.sketch(as_named(a)) + sk.sketch(as_named(b)), atol=1e-4)
    assert torch.allclose(sk.sketch(as_named(-3.0 * a)), -3.0 * sk.sketch(as_named(a)), atol=1e-4)


@pytest.mark.parametrize("kind", ["countsketch", "gaussian"])
def test_shards_sketch_separately_and_sum(kind):
    g = as_named(torch.randn(N, generator=torch.Generator().manual_seed(4)))
    sk = GradientSketch(dim=128, seed=0, kind=kind)
    whole = sk.sketch(g)
    # parameters split across two workers, in any order, with fresh sketch objects
    shard_a = GradientSketch(dim=128, seed=0, kind=kind).sketch([g[2], g[0]])
    shard_b = GradientSketch(dim=128, seed=0, kind=kind).sketch([g[1]])
    assert torch.allclose(shard_a + shard_b, whole, atol=1e-4)
    # one weight split by rows (dim-0 sharding), slices sketched with their flat offsets
    name, w = g[0]
    rows = 31  # a cut inside a Gaussian block and inside a CountSketch block
    top = sk.sketch([(name, w[:rows])])
    bottom = sk.sketch([(name, w[rows:])], offsets={name: rows * w.shape[1]})
    assert torch.allclose(top + bottom, sk.sketch([(name, w)]), atol=1e-4)


def test_countsketch_slices_across_block_boundaries():
    from harnessrl.train import sketch as sketch_module

    sk = GradientSketch(dim=32, seed=0, cache=False)
    n = sketch_module.COUNT_BLOCK + 1000  # spans two blocks
    g = torch.randn(n, generator=torch.Generator().manual_seed(5))
    cut = sketch_module.COUNT_BLOCK - 10
    parts = sk.sketch([("w", g[:cut])]) + sk.sketch([("w", g[cut:])], offsets={"w": cut})
    assert torch.allclose(parts, sk.sketch([("w", g)]), atol=1e-3)


def test_projection_depends_on_name_not_on_other_parameters():
    g = torch.randn(64, generator=torch.Generator().manual_seed(6))
    sk = GradientSketch(dim=32, seed=0)
    alone = sk.sketch([("x", g)])
    with_zero_neighbour = GradientSketch(dim=32, seed=0).sketch([("y", torch.zeros(10)), ("x", g)])
    assert torch.allclose(alone, with_zero_neighbour)
    assert not torch.allclose(alone, sk.sketch([("z", g)]))


def test_sketch_model_uses_trainable_grads_only():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)
    model(torch.randn(3, 8)).sum().backward()
    model[0].bias.grad = None  # a trainable parameter without a gradient is skipped
    sk = GradientSketch(dim=16, seed=0)
    want = sk.sketch([("0.weight", model[0].weight.grad), ("1.weight", model[1].weight.grad)])
    assert torch.allclose(sk.sketch_model(model), want)


def test_cosine_edge_cases():
    assert cosine(torch.zeros(3), torch.ones(3)) == 0.0
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([-2.0, 0.0])) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        GradientSketch(kind="fourier")
