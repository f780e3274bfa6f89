"""GRPO advantages, training units, padding, token log-probs and the loss, on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.train.grpo import (
    TrainingUnit,
    group_advantages,
    grpo_loss,
    pad_units,
    token_logprobs,
    units_from_trajectories,
)
from harnessrl.types import ActionKind, ModelCall, Step, Termination, Trajectory

# ---------------------------------------------------------------------------------- advantages


def test_group_advantages_known_group():
    # rewards 0, 1, 0, 1: mean 0.5, population std 0.5 -> advantages -1, 1, -1, 1 (up to eps)
    adv = group_advantages(torch.tensor([[0.0, 1.0, 0.0, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[-1.0, 1.0, -1.0, 1.0]]), atol=1e-5)
    # 1, 2, 3: mean 2, population std sqrt(2/3)
    adv = group_advantages(torch.tensor([[1.0, 2.0, 3.0]]), eps=0.0)
    s = math.sqrt(2 / 3)
    assert torch.allclose(adv, torch.tensor([[-1 / s, 0.0, 1 / s]]))


def test_group_advantages_zero_variance_is_exactly_zero():
    rewards = torch.tensor([[0.1, 0.1, 0.1], [0.0, 0.0, 1.0], [0.7, 0.7, 0.7]])
    adv = group_advantages(rewards)
    assert torch.equal(adv[0], torch.zeros(3)) and torch.equal(adv[2], torch.zeros(3))
    assert not torch.isnan(adv).any()
    assert adv[1, 2] > 0 > adv[1, 0]
    # a group of one: std 0, advantage 0
    assert torch.equal(group_advantages(torch.tensor([[0.5]])), torch.zeros(1, 1))


def test_group_advantages_no_scale():
    adv = group_advantages(torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.2, 0.2, 0.2, 0.2]]), scale=False)
    assert torch.allclose(adv, torch.tensor([[-0.5, 0.5, 0.5, -0.5], [0.0, 0.0, 0.0, 0.0]]))


# ---------------------------------------------------------------------------------- units


def _traj(episode_id, calls, termination=Termination.submitted, harness="react"):
    steps = [
        Step(
            index=i,
            model_call=ModelCall(prompt_ids=p, completion_ids=c, logprobs=lp, text="x"),
            action=ActionKind.text,
        )
        for i, (p, c, lp) in enumerate(calls)
    ]
    return Trajectory(
        episode_id=episode_id,
        task_id="t",
        suite="s",
        family="f",
        split="train",
        harness=harness,
        attempt=0,
        instruction="do it",
        steps=steps,
        termination=termination,
    )


def test_units_one_per_call_with_episode_advantage():
    a = _traj("a", [([1, 2], [3, 4], [-0.1, -0.2]), ([1, 2, 3, 4, 5], [6], [-0.3]), ([7], [], [])])
    b = _traj("b", [([9], [8], [-0.5])], harness="json")
    infra = _traj("c", [([1], [2], [-1.0])], termination=Termination.error)
    units = units_from_trajectories([a, b, infra], {"a": 1.5, "b": -0.5})  # no advantage needed for c
    assert [(u.episode_id, u.advantage, u.harness) for u in units] == [
        ("a", 1.5, "react"),
        ("a", 1.5, "react"),
        ("b", -0.5, "json"),
    ]
    assert units[1].prompt_ids == [1, 2, 3, 4, 5] and units[1].completion_ids == [6]
    assert units[1].old_logprobs == [-0.3]
    with pytest.raises(KeyError):
        units_from_trajectories([a], {})


def test_pad_units_layout():
    units = [
        TrainingUnit([1, 2], [3, 4, 5], [-0.1, -0.2, -0.3], 1.0, "h", "e1"),
        TrainingUnit([7], [8], [-0.4], -2.0, "h", "e2"),
    ]
    batch = pad_units(units, pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch["completion_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert torch.allclose(batch["old_logprobs"], torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, -0.4, 0, 0, 0]]))
    assert batch["advantages"].tolist() == [1.0, -2.0]
    with pytest.raises(ValueError):
        pad_units([TrainingUnit([], [1], [-0.1], 0.0, "h", "e")], pad_id=0)


# ---------------------------------------------------------------------------------- token log-probs


def _tiny_llama(vocab=40):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        initializer_range=0.5,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()


def test_token_logprobs_match_a_hand_loop():
    model = _tiny_llama()
    units = [
        TrainingUnit([5, 6, 7], [8, 9], [0.0, 0.0], 1.0, "h", "e1"),
        TrainingUnit([11], [12, 13, 14, 15], [0.0] * 4, 1.0, "h", "e2"),
    ]
    batch = pad_units(units, pad_id=0)
    temperature = 0.7
    got = token_logprobs(model, batch, temperature=temperature)
    assert got.shape == batch["input_ids"].shape
    with torch.no_grad():
        for row, u in enumerate(units):
            ids = u.prompt_ids + u.completion_ids
            for k, token in enumerate(u.completion_ids):
                pos = len(u.prompt_ids) + k
                # unpadded forward pass over the prefix only: the next-token distribution at pos - 1
                logits = model(input_ids=torch.tensor([ids[:pos]])).logits[0, -1]
                want = torch.log_softmax(logits / temperature, dim=-1)[token]
                assert got[row, pos].item() == pytest.approx(want.item(), abs=1e-5)
    assert torch.equal(got * (1 - batch["completion_mask"]), torch.zeros_like(got))  # 0 off completion
    got.sum().backward()  # differentiable
    assert model.model.embed_tokens.weight.grad is not None


def test_token_logprobs_head_only_path_equals_the_models_own_forward():
    # The fast path (decoder, then the output head on completion positions only) must give what
    # the model's full forward gives; a config flag that marks post-processed logits selects the
    # full forward (Llama ignores the flag itself, so both paths must agree exactly here).
    model = _tiny_llama()
    units = [
        TrainingUnit([5, 6, 7, 3, 4], [8, 9], [0.0, 0.0], 1.0, "h", "e1"),
        TrainingUnit([11], [12, 13, 14], [0.0] * 3, -1.0, "h", "e2"),
    ]
    batch = pad_units(units, pad_id=0)
    fast = token_logprobs(model, batch, temperature=0.9)
    model.config.final_logit_softcapping = 30.0
    full = token_logprobs(model, batch, temperature=0.9)
    assert torch.allclose(fast, full, atol=1e-6)
    assert (fast * batch["completion_mask"]).ne(0).sum() == 5


# ---------------------------------------------------------------------------------- loss


def _mask(lengths, T):
    return torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])


def test_ratio_one_loss_is_minus_token_mean_of_advantages():
    mask = _mask([3, 1], 4)
    logp = torch.full((2, 4), -1.0) * mask
    adv = torch.tensor([2.0, -1.0])
    loss, stats = grpo_loss(logp, logp.clone(), adv, mask)
    # token-mean: tokens carry 2, 2, 2, -1 -> -(2 + 2 + 2 - 1) / 4
    assert loss.item() == pytest.approx(-5 / 4)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_fraction"] == 0.0
    assert stats["adv_abs_mean"] == pytest.approx(1.5)
    assert stats["kl"] == 0.0


def test_token_mean_vs_seq_mean_on_unequal_lengths():
    mask = _mask([3, 1], 4)
    logp = torch.zeros(2, 4)
    adv = torch.tensor([1.0, -1.0])
    token_mean, _ = grpo_loss(logp, logp, adv, mask, aggregation="token-mean")
    seq_mean, _ = grpo_loss(logp, logp, adv, mask, aggregation="seq-mean")
    assert token_mean.item() == pytest.approx(-(1 + 1 + 1 - 1) / 4)  # -0.5
    assert seq_mean.item() == pytest.approx(-(1 + -1) / 2)  # 0.0
    with pytest.raises(ValueError):
        grpo_loss(logp, logp, adv, mask, aggregation="sum")


def _one_token_grad(ratio, advantage, clip_low=0.2, clip_high=0.28):
    """Loss and d loss / d logp for a single token with the given ratio and advantage."""
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    loss, stats = grpo_loss(logp, old, torch.tensor([advantage]), torch.ones(1, 1), clip_low, clip_high)
    loss.backward()
    return loss.item(), logp.grad.item(), stats


def test_clip_high_for_positive_advantage():
    # inside the range: loss = -ratio * A, d/dlogp = -ratio * A
    loss, grad, stats = _one_token_grad(1.2, 1.0)
    assert loss == pytest.approx(-1.2) and grad == pytest.approx(-1.2) and stats["clip_fraction"] == 0
    # above 1 + clip_high = 1.28: loss = -1.28 * A, no gradient
    loss, grad, stats = _one_token_grad(1.5, 1.0)
    assert loss == pytest.approx(-1.28) and grad == 0.0 and stats["clip_fraction"] == 1.0
    # below 1 - clip_low with A > 0 is NOT clipped (the min keeps the smaller, unclipped term)
    loss, grad, _ = _one_token_grad(0.5, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)


def test_clip_low_for_negative_advantage():
    # below 1 - clip_low = 0.8: loss = -(0.8 * A), no gradient
    loss, grad, stats = _one_token_grad(0.5, -2.0)
    assert loss == pytest.approx(1.6) and grad == 0.0 and stats["clip_fraction"] == 1.0
    # inside: loss = -ratio * A
    loss, grad, _ = _one_token_grad(0.9, -2.0)
    assert loss == pytest.approx(1.8) and grad == pytest.approx(1.8)
    # above 1 + clip_high with A < 0 is not clipped
    loss, grad, _ = _one_token_grad(1.5, -2.0)
    assert loss == pytest.approx(3.0) and grad == pytest.approx(3.0)


def test_kl_zero_when_reference_equals_policy_and_positive_otherwise():
    mask = _mask([2, 2], 2)
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    adv = torch.tensor([1.0, -1.0])
    base, _ = grpo_loss(logp, logp, adv, mask)
    with_kl, stats = grpo_loss(logp, logp, adv, mask, ref_logprobs=logp.clone(), kl_coef=0.5)
    assert stats["kl"] == 0.0 and with_kl.item() == pytest.approx(base.item())
    ref = logp + 0.3
    with_kl, stats = grpo_loss(logp, logp, adv, mask, ref_logprobs=ref, kl_coef=0.5)
    k3 = math.exp(0.3) - 0.3 - 1
    assert stats["kl"] == pytest.approx(k3, rel=1e-5)
    assert with_kl.item() == pytest.approx(base.item() + 0.5 * k3, rel=1e-5)


def test_zero_advantages_give_zero_loss_and_zero_gradient():
    mask = _mask([3, 1, 2], 3)
    logp = (torch.randn(3, 3, generator=torch.Generator().manual_seed(0)) * mask).requires_grad_()
    old = torch.zeros(3, 3)
    loss, _ = grpo_loss(logp, old, torch.zeros(3), mask)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logp.grad, torch.zeros(3, 3))


def test_padding_junk_never_leaks():
    mask = _mask([1], 3)
    logp = torch.tensor([[-1.0, 500.0, -500.0]], requires_grad=True)  # junk off the mask
    old = torch.tensor([[-1.0, -500.0, 500.0]])
    loss, stats = grpo_loss(logp, old, torch.tensor([1.0]), mask)
    loss.backward()
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(-1.0)
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1:].abs().sum() == 0
