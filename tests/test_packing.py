"""An episode's model calls packed into shared rows (harnessrl.train.packing): which calls share a
row, the batch they make, and, on the tiny model, the same log-probs, loss and gradient as one row
per call, with fewer tokens forwarded."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_trainer import BASE, _set_up

from harnessrl.train.grpo import TrainingUnit, pad_units, token_logprobs
from harnessrl.train.packing import packed_rows, pad_packed
from harnessrl.train.update import UpdateContext, accumulate_gradient, micro_batches, recompute_old_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def unit(prompt: list[int], completion: list[int], episode: str = "e0", advantage: float = 1.0) -> TrainingUnit:
    return TrainingUnit(prompt, completion, [-1.0] * len(completion), advantage, "react", episode)


def episode(episode_id: str, advantage: float, seed: int, calls: int = 3) -> list[TrainingUnit]:
    """`calls` calls, each prompt the previous prompt + completion + a tool result (as a chat
    template renders a history), random token ids."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(5, 900, (n,), generator=g).tolist()  # noqa: E731
    units, prompt = [], ids(12)
    for _ in range(calls):
        completion = ids(4)
        units.append(unit(list(prompt), completion, episode_id, advantage))
        prompt = prompt + completion + ids(5)
    return units


def test_the_calls_of_one_episode_share_a_row_led_by_the_longest():
    calls = episode("e0", 1.0, seed=0)
    assert packed_rows(calls) == [[2, 1, 0]]
    assert packed_rows(list(reversed(calls))) == [[0, 1, 2]]


def test_what_does_not_extend_the_row_gets_its_own():
    calls = episode("e0", 1.0, seed=0)
    other = [dataclasses.replace(u, episode_id="e1") for u in calls]  # the same tokens, another episode
    dropped = unit([7] + calls[2].prompt_ids[1:], [3, 4])  # a history window changed the start
    again = dataclasses.replace(calls[1])  # the same call twice: its positions are taken
    rows = packed_rows([*calls, *other, dropped, again])
    assert sorted(map(sorted, rows)) == [[0, 1, 2], [3, 4, 5], [6], [7]]
    flipped = dataclasses.replace(calls[0], advantage=-1.0)  # never mixed, whatever the episode id says
    assert sorted(map(sorted, packed_rows([calls[2], flipped]))) == [[0], [1]]


def test_the_packed_batch_puts_each_completion_where_its_own_row_would():
    calls = episode("e0", 0.5, seed=1) + episode("e1", -0.5, seed=2, calls=2)
    for i, u in enumerate(calls):
        u.old_logprobs = [-0.1 * (i + 1)] * len(u.completion_ids)
    packed, plain = pad_packed(calls, pad_id=0), pad_units(calls, pad_id=0)
    assert packed["input_ids"].shape[0] == 2 and plain["input_ids"].shape[0] == 5
    assert packed["advantages"].tolist() == [0.5, -0.5]
    assert (
        packed["completion_mask"].sum() == plain["completion_mask"].sum() == sum(len(u.completion_ids) for u in calls)
    )
    for i, u in enumerate(calls):
        r = int(packed["unit_rows"][i])
        p, c = len(u.prompt_ids), len(u.completion_ids)
        width = p + c
        assert torch.equal(packed["input_ids"][r, :width], plain["input_ids"][i, :width])
        assert packed["old_logprobs"][r, p : p + c].tolist() == pytest.approx(u.old_logprobs)
        assert packed["completion_mask"][r, p : p + c].tolist() == [1.0] * c


def test_micro_batches_keep_a_row_together():
    calls = episode("e0", 1.0, seed=0) + episode("e1", 1.0, seed=3)
    width = len(calls[2].prompt_ids) + len(calls[2].completion_ids)
    batches = micro_batches(calls, max_tokens=width, pack=True)  # room for one row each
    assert sorted(sorted(u.episode_id for u in mb) for mb in batches) == [["e0"] * 3, ["e1"] * 3]
    assert len(micro_batches(calls, max_tokens=width, pack=False)) > 2  # one row per call: more batches


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # rows forwarded whole (no prefix sharing): what packing alone saves
    return _set_up(tmp_path_factory.mktemp("packing") / "out", BASE.replace(micro_batch=100_000, share_prefixes=False))


def test_packed_rows_give_each_call_its_own_logprobs_loss_and_gradient(tiny, monkeypatch):
    ctx = tiny.update_context()
    assert ctx.packs  # token-mean, no sequence-level TIS: the default packs
    calls = episode("e0", 1.0, seed=4) + episode("e1", -1.0, seed=5) + episode("e2", 1.0, seed=6, calls=2)
    with torch.no_grad():
        plain = token_logprobs(ctx.model, pad_units(calls, ctx.pad_id), tiny.config.temperature)
        packed_batch = pad_packed(calls, ctx.pad_id)
        packed = token_logprobs(ctx.model, packed_batch, tiny.config.temperature)
    assert packed_batch["input_ids"].numel() < pad_units(calls, ctx.pad_id)["input_ids"].numel() / 2
    for i, u in enumerate(calls):
        p, c, r = len(u.prompt_ids), len(u.completion_ids), int(packed_batch["unit_rows"][i])
        assert packed[r, p : p + c].tolist() == pytest.approx(plain[i, p : p + c].tolist(), abs=1e-5)

    def update(packs: bool):
        monkeypatch.setattr(UpdateContext, "packs", property(lambda self: packs))
        fresh, mismatch = recompute_old_logprobs(ctx, calls)
        ctx.optimizer.zero_grad(set_to_none=True)
        stats, n_active, tokens, padded = accumulate_gradient(ctx, fresh)
        grads = [p.grad.clone() for p in ctx.trainable]
        ctx.optimizer.zero_grad(set_to_none=True)
        return fresh, mismatch, stats, grads, padded

    a, b = update(True), update(False)
    for x, y in zip(a[0], b[0]):
        assert x.old_logprobs == pytest.approx(y.old_logprobs, abs=1e-5)
    assert a[1].logprob_diff_mean == pytest.approx(b[1].logprob_diff_mean, rel=1e-4)
    assert a[2]["loss"] == pytest.approx(b[2]["loss"], rel=1e-5, abs=1e-7)
    for x, y in zip(a[3], b[3]):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6)
    assert a[4] < b[4] / 2  # padded tokens forwarded
