"""The rollout-trainer mismatch: the sampler's log-probs kept beside the trainer's recomputed ones,
the per-step mismatch figures (k3 KL, log-ratio, mismatched share) over every process, and
truncated importance sampling (TIS) in the loss, against hand-computed values and against real
samplers that differ from the float32 trainer (the int8 and bfloat16 engines)."""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest
import torch
from helpers import shrunk
from test_trainer import BASE, TextScore, _lora, _set_up, _units, trainer

from harnessrl.models import SamplingParams, load_policy
from harnessrl.models.int8 import Int8Unavailable
from harnessrl.rollout import Runner, make_jobs
from harnessrl.train.distributed import Distributed
from harnessrl.train.grpo import TrainingUnit, grpo_loss, pad_units, truncated_is_weights, units_from_trajectories
from harnessrl.train.update import MismatchSums, accumulate_gradient, recompute_old_logprobs, update_policy
from harnessrl.types import ActionKind, ModelCall, Step, Termination, Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# ---------------------------------------------------------------------- the loss, by hand

# Two sequences; row 0 has completion tokens at columns 1 and 2, row 1 at column 1.
MASK = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
OLD = torch.tensor([[0.0, -1.0, -0.5], [0.0, -2.0, 0.0]])  # the trainer's, recomputed
SAMPLER = torch.tensor([[0.0, -1.5, -2.0], [0.0, -1.0, 0.0]])  # log r = 0.5, 1.5 | -1.0
SHIFT = torch.tensor([[0.0, 0.1, -0.1], [0.0, 0.05, 0.0]])  # logp - old: ratios inside the clip
ADV = torch.tensor([1.0, -0.5])


def _hand_loss(weights: list[float]) -> float:
    """token-mean of -w * ratio * A over the 3 completion tokens (every ratio is inside the clip)."""
    terms = [(0.1, 1.0), (-0.1, 1.0), (0.05, -0.5)]  # (logp - old, A) per token, in mask order
    return -sum(w * math.exp(d) * a for w, (d, a) in zip(weights, terms)) / 3


@pytest.mark.parametrize(
    "level, expected",
    [
        ("token", [math.exp(0.5), 2.0, math.exp(-1.0)]),  # r = e^1.5 capped at 2
        ("sequence", [2.0, 2.0, math.exp(-1.0)]),  # row 0: e^(0.5 + 1.5) = e^2 capped at 2
    ],
)
def test_tis_loss_equals_the_hand_computed_value(level, expected):
    weights, capped = truncated_is_weights(OLD, SAMPLER, MASK, cap=2.0, level=level)
    assert torch.allclose(weights[MASK > 0], torch.tensor(expected), rtol=1e-6)
    assert torch.equal(weights[MASK == 0], torch.zeros(3))  # nothing off the completion tokens
    assert capped.tolist() == [[False, level == "sequence", True], [False, False, False]]

    logp = (OLD + SHIFT).requires_grad_(True)
    loss, _ = grpo_loss(logp, OLD, ADV, MASK, pg_weights=weights)
    assert float(loss) == pytest.approx(_hand_loss(expected), rel=1e-6)
    loss.backward()
    # d/dlogp of -w * exp(logp - old) * A / 3: the weight is a constant of the loss
    grads = [-w * math.exp(d) * a / 3 for w, (d, a) in zip(expected, [(0.1, 1.0), (-0.1, 1.0), (0.05, -0.5)])]
    assert torch.allclose(logp.grad[MASK > 0], torch.tensor(grads), rtol=1e-5)
    assert torch.equal(logp.grad[MASK == 0], torch.zeros(3))


def test_the_cap_acts_and_a_long_sequence_cannot_overflow():
    low, capped_low = truncated_is_weights(OLD, SAMPLER, MASK, cap=2.0)
    high, capped_high = truncated_is_weights(OLD, SAMPLER, MASK, cap=10.0)
    assert float(low[0, 2]) == pytest.approx(2.0) and float(high[0, 2]) == pytest.approx(math.exp(1.5))
    assert int(capped_low.sum()) == 1 and int(capped_high.sum()) == 0
    assert torch.equal(low[0, 1], high[0, 1]) and torch.equal(low[1, 1], high[1, 1])  # the others untouched
    # 300 tokens each 4 nats more likely under the trainer: the product is e^1200 (inf in float32)
    long_mask = torch.ones(1, 300)
    w, capped = truncated_is_weights(torch.zeros(1, 300), torch.full((1, 300), -4.0), long_mask, 3.0, "sequence")
    assert torch.allclose(w, torch.full((1, 300), 3.0)) and bool(capped.all())
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_is_weights(OLD, SAMPLER, MASK, cap=0.5)
    with pytest.raises(ValueError, match="'token' or 'sequence'"):
        truncated_is_weights(OLD, SAMPLER, MASK, level="episode")


def test_without_weights_the_loss_is_the_plain_clipped_loss():
    """pg_weights=None is the loss as it was: -min(ratio A, clip(ratio) A), token-mean, computed
    here independently, and with ratios on both sides of the clip."""
    logp = torch.tensor([[0.0, -0.5, -0.9], [0.0, -2.6, 0.0]])  # ratios e^0.5 (clipped), e^-0.4, e^-0.6 (clipped)
    loss, stats = grpo_loss(logp, OLD, ADV, MASK)
    ratios, advs = [math.exp(0.5), math.exp(-0.4), math.exp(-0.6)], [1.0, 1.0, -0.5]
    terms = [-min(r * a, min(max(r, 0.8), 1.28) * a) for r, a in zip(ratios, advs)]
    assert float(loss) == pytest.approx(sum(terms) / 3, rel=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)


# -------------------------------------------------------------- through the optimizer steps

# What the "sampler" recorded: the trainer's log-prob shifted by these, token after token. Shifts
# of -1.0 give ratio e^1 > 2 (capped at the default cap) and count as mismatched (|log r| > log 2).
SHIFTS = (0.3, -1.0, 0.1, -0.2)


def _sampled_by_another(units: list[TrainingUnit]) -> list[TrainingUnit]:
    return [
        dataclasses.replace(u, old_logprobs=[lp + SHIFTS[i % len(SHIFTS)] for i, lp in enumerate(u.old_logprobs)])
        for u in units
    ]


def test_the_sampler_logprobs_are_kept_and_pad_units_carries_both(tmp_path):
    t = _set_up(tmp_path / "out")
    exact = _units(t)
    fresh, mismatch = recompute_old_logprobs(t.update_context(), _sampled_by_another(exact))
    for before, sampled, after in zip(exact, _sampled_by_another(exact), fresh):
        if before.advantage == 0:  # not forwarded (KL off): left as the rollout gave it
            assert after.sampler_logprobs is None and after.old_logprobs == sampled.old_logprobs
            continue
        assert after.sampler_logprobs == sampled.old_logprobs
        assert after.old_logprobs == pytest.approx(before.old_logprobs, abs=1e-5)
    batch = pad_units(fresh, t.policy.pad_id)
    mask = batch["completion_mask"] > 0
    assert torch.equal(batch["sampler_logprobs"][mask], torch.tensor([x for u in fresh for x in u.sampled_logprobs()]))
    assert not torch.equal(batch["sampler_logprobs"], batch["old_logprobs"])
    assert mismatch.tis_weight_mean is None and mismatch.tis_capped_frac is None  # TIS off
    with pytest.raises(ValueError, match="one sampler logprob per completion token"):
        pad_units([dataclasses.replace(fresh[0], sampler_logprobs=[0.0])], t.policy.pad_id)


def _expected_figures(units: list[TrainingUnit], cap: float = 2.0) -> dict[str, float]:
    """The mismatch and TIS figures of the shifted units, by hand: log r = -shift on each token."""
    log_r = [-SHIFTS[i % len(SHIFTS)] for u in units if u.advantage != 0 for i in range(len(u.completion_ids))]
    n = len(log_r)
    return {
        "rollout_logprob_diff_max": max(abs(x) for x in log_r),
        "rollout_logprob_diff_mean": sum(abs(x) for x in log_r) / n,
        "rollout_log_ratio_mean": sum(log_r) / n,
        "rollout_kl_mean": sum(math.exp(x) - 1 - x for x in log_r) / n,
        "rollout_kl_max": max(math.exp(x) - 1 - x for x in log_r),
        "rollout_mismatch_frac": sum(abs(x) > math.log(2) for x in log_r) / n,
        "tis_weight_mean": sum(min(math.exp(x), cap) for x in log_r) / n,
        "tis_capped_frac": sum(math.exp(x) >= cap for x in log_r) / n,
    }


def test_tis_update_weights_each_token_and_reports_the_mismatch(tmp_path):
    """The first mini-step's ratio is 1, so the TIS loss is -sum(w A) / tokens with
    w = min(exp(-shift), 2) on every forwarded token (zero-advantage units count in the normaliser)."""
    t = _set_up(tmp_path / "out", BASE.replace(rollout_correction="tis"))
    units = _units(t)
    update = update_policy(t.update_context(), _sampled_by_another(units), 0)
    for key, value in _expected_figures(units).items():
        assert getattr(update, key) == pytest.approx(value, rel=1e-4, abs=1e-5), key
    weighted = [
        min(math.exp(-SHIFTS[i % len(SHIFTS)]), 2.0) * u.advantage for u in units for i in range(len(u.completion_ids))
    ]
    assert update.loss == pytest.approx(-sum(weighted) / sum(len(u.completion_ids) for u in units), rel=1e-4)


def _episodes_sampled_shaped(units: list[TrainingUnit]) -> list[Trajectory]:
    """One episode per unit whose model call records `logprobs` = the trainer's own (the tempered
    log-probs of the raw logits) and `sampled_logprobs` = those shifted by -SHIFTS: the log-probs
    of a shaped distribution (penalties, min_p, top_k, top_p) the tokens were drawn from."""
    episodes = []
    for u in units:
        call = ModelCall(
            prompt_ids=u.prompt_ids,
            completion_ids=u.completion_ids,
            logprobs=list(u.old_logprobs),
            sampled_logprobs=[lp + SHIFTS[i % len(SHIFTS)] for i, lp in enumerate(u.old_logprobs)],
            text="x",
        )
        episodes.append(
            Trajectory(
                episode_id=u.episode_id,
                task_id="t",
                suite="s",
                family="f",
                split="train",
                harness=u.harness,
                attempt=0,
                instruction="do it",
                steps=[Step(index=0, model_call=call, action=ActionKind.text)],
                termination=Termination.submitted,
            )
        )
    return episodes


@pytest.mark.parametrize("passes", [1, 2], ids=["fused", "separate-pass"])
def test_the_correction_divides_by_the_sampled_distributions_logprobs_where_a_call_has_them(tmp_path, passes):
    """A call whose sampling was shaped records both log-probs: the units carry its
    sampled_logprobs as the sampler's, and the mismatch figures and the TIS weights are those of
    trainer / sampled distribution (log r = -shift on every token), not trainer / tempered (log r
    = 0: the recorded `logprobs` ARE the trainer's here). Both update paths: one pass of one
    mini-batch (the loss's forward gives the old log-probs) and a separate recomputation."""
    config = BASE.replace(rollout_correction="tis", ppo_epochs=passes)
    t = _set_up(tmp_path / "out", config)
    units = _units(t)
    episodes = _episodes_sampled_shaped(units)
    from_episodes = units_from_trajectories(episodes, {u.episode_id: u.advantage for u in units})
    for u, got in zip(units, from_episodes):
        assert got.old_logprobs == u.old_logprobs
        assert got.sampler_logprobs == episodes[units.index(u)].steps[0].model_call.sampled_logprobs
    update = update_policy(t.update_context(), from_episodes, 0)
    for key, value in _expected_figures(units).items():
        assert getattr(update, key) == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert update.rollout_mismatch_frac > 0 and update.tis_capped_frac > 0
    # the same episodes without sampled_logprobs (unshaped sampling): the sampler is the trainer
    for episode in episodes:
        episode.steps[0].model_call.sampled_logprobs = None
    plain = units_from_trajectories(episodes, {u.episode_id: u.advantage for u in units})
    assert all(u.sampler_logprobs is None for u in plain)
    unshaped = update_policy(_set_up(tmp_path / "plain", config).update_context(), plain, 0)
    assert unshaped.rollout_kl_max < 1e-8 and unshaped.rollout_mismatch_frac == 0
    assert unshaped.tis_weight_mean == pytest.approx(1.0, abs=1e-5)


def test_a_call_with_sampled_logprobs_of_another_length_is_refused():
    episode = _episodes_sampled_shaped([TrainingUnit([1, 2], [3, 4], [-0.5, -0.25], 1.0, "json-tools", "e0")])[0]
    episode.steps[0].model_call.sampled_logprobs = [-0.5]
    with pytest.raises(ValueError, match="2 completion ids but 1 sampled_logprobs"):
        units_from_trajectories([episode], {"e0": 1.0})


def test_rollout_correction_none_trains_exactly_as_if_the_sampler_were_the_trainer(tmp_path):
    """With `none` the sampler's numbers are measured but never reach the loss: the same loss and
    the same LoRA weights, bit for bit, as units whose recorded log-probs are the trainer's. With
    `tis` (and `sequence`) they do."""
    results, weights = {}, {}
    for name, sampled, config in [
        ("exact", False, BASE),
        ("none", True, BASE),
        ("tis", True, BASE.replace(rollout_correction="tis")),
        ("sequence", True, BASE.replace(rollout_correction="tis", tis_level="sequence")),
    ]:
        t = _set_up(tmp_path / name, config)
        units = _units(t)
        results[name] = update_policy(t.update_context(), _sampled_by_another(units) if sampled else units, 0)
        weights[name] = _lora(t)
    assert results["none"].loss == results["exact"].loss and results["none"].grad_norm == results["exact"].grad_norm
    assert all(torch.equal(weights["none"][k], weights["exact"][k]) for k in weights["exact"])
    assert results["exact"].rollout_kl_max < 1e-8 and results["none"].rollout_kl_mean > 0.05
    for name in ("tis", "sequence"):
        assert results[name].loss != pytest.approx(results["none"].loss, rel=1e-3), name
        assert any(not torch.equal(weights[name][k], weights["none"][k]) for k in weights["none"]), name
    # sequence level, by hand: one weight per unit, min(exp(sum of its tokens' log r), 2)
    active = [u for u in _units(_set_up(tmp_path / "units")) if u.advantage != 0]
    seq_log_r = [sum(-SHIFTS[i % len(SHIFTS)] for i in range(len(u.completion_ids))) for u in active]
    n = sum(len(u.completion_ids) for u in active)
    sequence = results["sequence"]
    assert sequence.tis_weight_mean == pytest.approx(
        sum(len(u.completion_ids) * min(math.exp(x), 2.0) for u, x in zip(active, seq_log_r)) / n, rel=1e-4
    )
    capped_tokens = sum(len(u.completion_ids) for u, x in zip(active, seq_log_r) if x >= math.log(2.0))
    assert sequence.tis_capped_frac == pytest.approx(capped_tokens / n) and 0 < capped_tokens < n


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_one_step_takes_its_old_logprobs_from_the_loss_forward_as_a_separate_pass_would(tmp_path, correction):
    """With one pass of one mini-batch the update runs no no-grad pass: the loss's forward, on the
    same weights, gives the old log-probs. The gradient, the loss and the mismatch figures are
    those of the separate pass (`recompute_old_logprobs`) followed by the same loss."""
    t = _set_up(tmp_path / "out", BASE.replace(rollout_correction=correction))
    assert t.config.ppo_epochs == 1 and t.config.mini_batches == 1
    units = _sampled_by_another(_units(t))
    ctx = t.update_context()

    fresh, separate = recompute_old_logprobs(ctx, units)
    ctx.optimizer.zero_grad(set_to_none=True)
    stats_separate, *_ = accumulate_gradient(ctx, fresh)
    grads_separate = [p.grad.clone() for p in ctx.trainable]

    ctx.optimizer.zero_grad(set_to_none=True)
    running = MismatchSums(ctx.config)
    stats_fused, *_ = accumulate_gradient(ctx, units, mismatch=running)
    grads_fused = [p.grad.clone() for p in ctx.trainable]
    fused = running.result(ctx.dist)
    ctx.optimizer.zero_grad(set_to_none=True)

    assert stats_fused["loss"] == pytest.approx(stats_separate["loss"], rel=1e-6, abs=1e-9)
    assert stats_fused["ratio_mean"] == 1.0  # the old log-probs are the forward's own
    for a, b in zip(grads_fused, grads_separate):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-8)
    for key, value in dataclasses.asdict(separate).items():  # the tis_* figures are None without TIS
        assert getattr(fused, key) == (None if value is None else pytest.approx(value, rel=1e-6, abs=1e-9)), key
    if correction == "tis":
        assert fused.tis_weight_mean is not None and fused.tis_capped_frac > 0


# ------------------------------------------------------------------------ several processes


class _ThreadPair(Distributed):
    """One of two processes simulated by two threads: each collective waits for both and returns
    the real exchange (unlike a mirror, the two processes hold different units)."""

    def __init__(self, rank: int, shared: dict):
        super().__init__(rank=rank, world_size=2)
        self.shared = shared

    def _exchange(self, value):
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[self.rank] = value
        barrier.wait()
        both = list(slots)
        barrier.wait()  # nobody overwrites a slot before both have read it
        return both

    def all_gather_object(self, obj):
        return self._exchange(obj)

    def all_reduce_(self, tensor):
        # a copy goes out: the other thread's in-place result must not change what this one sums
        total = sum(self._exchange(tensor.clone()))
        return tensor.copy_(total)


def test_the_mismatch_figures_are_over_every_process(tmp_path):
    """Process 0 holds units sampled with one mismatch, process 1 the same units with none: each
    process reports the figures of the whole batch, those of one process training on both."""
    config = BASE.replace(rollout_correction="tis")
    one = _set_up(tmp_path / "one", config)
    shifted, exact = _sampled_by_another(_units(one)), _units(one)
    want = update_policy(one.update_context(), shifted + exact, 0)

    shared = {"slots": [None, None], "barrier": threading.Barrier(2, timeout=120)}
    got: dict[int, object] = {}
    errors: list[BaseException] = []
    trainers = [_set_up(tmp_path / f"rank{r}", config) for r in (0, 1)]

    def run(rank: int, units: list[TrainingUnit]) -> None:
        try:
            ctx = dataclasses.replace(trainers[rank].update_context(), dist=_ThreadPair(rank, shared))
            got[rank] = update_policy(ctx, units, 0)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread below
            errors.append(e)
            shared["barrier"].abort()

    threads = [threading.Thread(target=run, args=(0, shifted)), threading.Thread(target=run, args=(1, exact))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    keys = [f.name for f in dataclasses.fields(want) if f.name.startswith(("rollout_", "tis_"))]
    assert len(keys) == 8
    for rank in (0, 1):
        for key in keys:
            assert getattr(got[rank], key) == pytest.approx(getattr(want, key), rel=1e-4, abs=1e-6), (rank, key)
    assert got[1].rollout_kl_mean > 0.02  # process 1's own units have none: the figure is the batch's
    assert got[0].loss == pytest.approx(want.loss, rel=1e-4)


# ------------------------------------------------------------ a sampler that really differs

SPEC = shrunk(
    "json-tools",
    system_prompt="Reply with any text.",
    max_steps=1,
    max_new_tokens=16,
    demonstrations=[],
    plain_text_answer=True,
)


@pytest.fixture(scope="module")
def float_trainer(tmp_path_factory):
    """The float32 trainer with its LoRA at zero (peft's init): its policy is the tiny model itself,
    the model the int8 / bfloat16 engines quantize."""
    config = BASE.replace(scheduler="single:json-tools", harnesses=["json-tools"], rollout_correction="tis")
    t = trainer(tmp_path_factory.mktemp("mismatch") / "out", config, specs=[SPEC])
    t._setup()
    return t


def _sampled_units(policy) -> list[TrainingUnit]:
    jobs = make_jobs(TextScore().tasks("train", 8), [SPEC], 1)
    trajectories = Runner(policy, SamplingParams(temperature=1.0, top_p=1.0, seed=3), max_in_flight=8).run(jobs)
    advantages = {traj.episode_id: 1.0 if i % 2 else -1.0 for i, traj in enumerate(trajectories)}
    return units_from_trajectories(trajectories, advantages)


def _sampler(dtype: str):
    try:
        return load_policy("tiny-random", dtype=dtype, device="cpu")
    except Int8Unavailable as e:
        pytest.skip(f"int8 sampling is unavailable on this machine: {e}")


def test_the_mismatch_is_zero_when_the_trainer_samples_itself(float_trainer):
    _, mismatch = recompute_old_logprobs(float_trainer.update_context(), _sampled_units(float_trainer.policy))
    assert mismatch.logprob_diff_max < 1e-4 and mismatch.kl_max < 1e-4 and abs(mismatch.log_ratio_mean) < 1e-4
    assert mismatch.mismatch_frac == 0 and mismatch.tis_capped_frac == 0
    assert mismatch.tis_weight_mean == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_an_int8_or_bfloat16_sampler_is_measured_and_trained_on(float_trainer, dtype):
    """Episodes sampled by the int8 (or bfloat16) engine of the same model, trained by the float32
    trainer: the mismatch is clearly there (measured here: k3 KL ~1e-2 for int8, ~4e-3 for
    bfloat16, against ~1e-11 for the trainer's own samples), and the TIS update runs on it."""
    sampler = _sampler(dtype)
    try:
        units = _sampled_units(sampler)
    finally:
        sampler.close()
    ctx = float_trainer.update_context()
    _, mismatch = recompute_old_logprobs(ctx, units)
    assert mismatch.kl_mean > 1e-4 and mismatch.kl_max > mismatch.kl_mean
    assert mismatch.logprob_diff_mean > 1e-2
    assert mismatch.tis_weight_mean != pytest.approx(1.0, abs=1e-4)
    before = _lora(float_trainer)
    try:
        update = update_policy(ctx, units, 0)
    finally:  # the fixture's trainer stays the model the samplers quantize
        with torch.no_grad():
            for name, p in float_trainer.peft_model.named_parameters():
                if name in before:
                    p.copy_(before[name])
    assert update.optimizer_steps == 1 and math.isfinite(update.loss)
    assert update.rollout_kl_mean == pytest.approx(mismatch.kl_mean, rel=1e-6)
