"""The GRPO trainer end to end with the tiny random model and tiny budgets: logs, adapter, skip
on flat batches, exact resume, refused resumes, NaN stop, CLI errors, the gradient itself, and
the optimizer steps of one batch (passes, mini-batches, the clip).

Reward signal from a random model: the test suite `textscore` asks for any text and grades its
length parity (harnesses shrunk to one plain-text step), so groups of 2 often disagree.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import typer
from helpers import grpo_trainer, shrunk
from typer.testing import CliRunner

from harnessrl.cli.train import train_app
from harnessrl.tasks.base import Suite
from harnessrl.train import update as update_module
from harnessrl.train.grpo import TrainingUnit, grpo_loss, pad_units, split_mini_batches, token_logprobs
from harnessrl.train.step import StepRecord, StepTimes
from harnessrl.train.trainer import (
    TrainConfig,
    Trainer,
    TrainError,
    TrainingDiverged,
    allocate_tasks,
    micro_batches,
    sampling_seed,
)
from harnessrl.train.update import accumulate_gradient

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class TextScore(Suite):
    """Test-only suite: any text is an answer; the score is its length parity (1 or 0)."""

    name = "textscore"
    split_sizes = {"train": 16, "dev": 4, "test": 4}
    needs_workspace = False

    def families(self):
        def say(rng):
            n = rng.randint(0, 10**6)
            return {
                "instruction": f"Say anything ({n}).",
                "setup": lambda env: None,
                "check": lambda env: {"answer": float(len(env.answer or "") % 2)},
                "data": {"n": n},
            }

        return {"say": say}

    def base_tools(self):
        return []


# Short prompts keep the full-vocabulary log-softmax of the backward pass cheap.
SPECS = [
    shrunk(
        n,
        system_prompt="Reply with any text.",
        max_steps=1,
        max_new_tokens=8,
        demonstrations=[],
        plain_text_answer=True,
    )
    for n in ("json-tools", "react")
]
# T=1.0 (not the default 0.7): the random model's groups then disagree at each of the 3 steps of seed 0,
# so every step of the reference run updates (the resume and NaN tests need updates after step 1).
BASE = TrainConfig(
    model="tiny-random",
    scheduler="harness-bandit",
    steps=3,
    tasks_per_step=2,
    group_size=2,
    lora_r=4,
    lora_alpha=8,
    temperature=1.0,
    checkpoint_every=5,
    eval_every=2,
    eval_tasks=2,
    device="cpu",  # every trainer test is a `train grpo --device cpu` run (auto would pick a GPU where one is)
)


def trainer(out, config=BASE, resume=False, suite=None, specs=SPECS) -> Trainer:
    return grpo_trainer(config, out, resume=resume, suite=suite or TextScore(), specs=specs, progress=False)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def adapter_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """3 uninterrupted steps (the reference for resume)."""
    out = tmp_path_factory.mktemp("train") / "full"
    t = trainer(out)
    t.run()
    return out, t


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory):
    """The same run, 2 steps then --resume to 3."""
    out = tmp_path_factory.mktemp("train") / "resumed"
    trainer(out, BASE.replace(steps=2)).run()
    first = lines(out / "metrics.jsonl")
    trainer(out, resume=True).run()
    return out, first


# --------------------------------------------------------------------------------- runs and files


def test_run_writes_metrics_eval_checkpoint_and_a_loadable_adapter(full_run, tokenizer):
    out, t = full_run
    records = lines(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert list(r) == StepRecord.keys()  # every key of the record, in order; no optional group
        assert r["harness"] in ("json-tools", "react") and r["episodes"] == 4
        assert set(r["probabilities"]) == {"json-tools", "react"} and math.isclose(
            sum(r["probabilities"].values()), 1.0
        )
        assert (
            list(r["time"]) == StepTimes.keys() == ["rollout", "backward", "sketch", "optimizer", "scheduler", "total"]
        )
    updated = [r for r in records if r["optimizer_step"]]
    assert updated, "no step had a nonzero advantage: pick another seed for this test"
    for r in updated:
        assert r["adv_abs_mean"] > 0 and r["units_trained"] > 0 and math.isfinite(r["loss"]) and r["grad_norm"] > 0
        # one pass, one mini-batch: one optimizer step at the sampling policy, nothing clipped
        assert r["optimizer_steps"] == 1 and r["clip_fraction_by_epoch"] == [0.0] and r["clip_fraction"] == 0.0
        # the engine's recorded log-probs agree with the trainer's teacher-forced recomputation
        assert 0 <= r["rollout_logprob_diff_mean"] <= r["rollout_logprob_diff_max"] < 1e-4
        # the engine samples with the very weights the trainer differentiates: no mismatch
        assert 0 <= r["rollout_kl_mean"] <= r["rollout_kl_max"] < 1e-6 and r["rollout_mismatch_frac"] == 0
        assert r["tis_weight_mean"] is None and r["tis_capped_frac"] is None  # --rollout-correction none
    for r in records:
        if not r["optimizer_step"]:
            assert r["optimizer_steps"] == 0 and r["clip_fraction_by_epoch"] is None
            assert r["rollout_logprob_diff_max"] is None
    assert [e["step"] for e in lines(out / "eval.jsonl")] == [0, 2, 3]
    assert set(lines(out / "eval.jsonl")[0]["mean_score"]) == {"json-tools", "react"}
    config = json.loads((out / "config.json").read_text())
    assert config["lr"] == BASE.lr and set(config["harness_specs"]) == {"json-tools", "react"}
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and state["scheduler"]["total"] >= 3
    from harnessrl.store import RunStore

    with RunStore(out / "rollouts") as store:  # every training episode is stored
        assert len(list(store.trajectories(with_tokens=False))) == 12

    # the adapter: a standard peft folder, LoRA B moved away from its zero init
    adapter = out / "adapter"
    assert json.loads((adapter / "harnessrl.json").read_text())["base_model"] == "tiny-random"
    weights = adapter_weights(adapter)
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in weights.items())
    from peft import PeftModel

    from harnessrl.models import load_policy
    from harnessrl.models.embedded import tiny_random_model

    peft_model = PeftModel.from_pretrained(tiny_random_model(), str(adapter))
    policy = load_policy(f"hf:{adapter}")  # what `harnessrl eval --model hf:OUT/adapter` does
    ids = torch.tensor([tokenizer.encode("Say anything (42).")])
    with torch.no_grad():
        trained, merged, reloaded = (m(input_ids=ids).logits for m in (t.peft_model, policy.model, peft_model))
        base = tiny_random_model()(input_ids=ids).logits
    assert torch.allclose(trained, reloaded, atol=1e-5) and torch.allclose(trained, merged, atol=1e-4)
    assert not torch.allclose(trained, base, atol=1e-6)


def test_docs_name_every_key_of_the_step_record():
    """docs/training.md explains metrics.jsonl: every key a step's line may hold is named there."""
    import re

    text = (Path(__file__).parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z_0-9]+)`", text))
    keys = StepRecord.keys(dynamic_sampling=True, rollout_servers=True) + StepTimes.keys(rollout_servers=True)
    assert not set(keys) - named, sorted(set(keys) - named)


def test_all_zero_advantages_skip_the_optimizer_step(tmp_path, tokenizer):
    """toolcalc through strict one-step harnesses: the random model never scores, every group is flat."""
    from harnessrl.tasks import get_suite

    specs = [shrunk(n, max_steps=1, max_new_tokens=8) for n in ("json-tools", "react")]
    config = BASE.replace(suite="toolcalc", steps=1, eval_every=0, save_rollouts=False)
    t = trainer(tmp_path / "flat", config, suite=get_suite("toolcalc"), specs=specs)
    t.run()
    (r,) = lines(tmp_path / "flat" / "metrics.jsonl")
    assert r["optimizer_step"] is False and r["skipped"] == "all advantages are zero"
    assert r["adv_abs_mean"] == 0.0 and r["zero_std_frac"] == 1.0 and r["loss"] is None
    assert not t.optimizer.state  # AdamW never stepped
    assert all(v.abs().max() == 0 for k, v in adapter_weights(tmp_path / "flat" / "adapter").items() if "lora_B" in k)
    # the scheduler still learned that this harness had no signal
    assert t.scheduler.total == 1 and list(t.scheduler.l_window) == [0.0]


def test_resume_continues_exactly_like_an_uninterrupted_run(full_run, resumed_run):
    full, _ = full_run
    resumed, first_part = resumed_run
    assert [r["step"] for r in first_part] == [1, 2]
    a, b = lines(full / "metrics.jsonl"), lines(resumed / "metrics.jsonl")
    keys = ("step", "harness", "probabilities", "reward_mean", "adv_abs_mean", "optimizer_step", "units", "transfer")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert [e["mean_score"] for e in lines(full / "eval.jsonl")] == [
        e["mean_score"] for e in lines(resumed / "eval.jsonl")
    ]
    sa = json.loads((full / "checkpoint" / "state.json").read_text())
    sb = json.loads((resumed / "checkpoint" / "state.json").read_text())
    assert sa == sb  # scheduler (incl. its RNG and sketch averages), task RNG, sampling counter
    wa, wb = adapter_weights(full / "adapter"), adapter_weights(resumed / "adapter")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((resumed / "config.json").read_text())["steps"] == 3


def _stored(out: Path) -> list[tuple]:
    from harnessrl.store import RunStore

    with RunStore(out / "rollouts") as store:
        episodes = store.trajectories(with_tokens=False)
        return sorted((t.task_id, t.harness, t.attempt, t.grade and t.grade.score) for t in episodes)


def test_a_resumed_run_keeps_no_episode_of_the_killed_attempt(full_run, tmp_path, monkeypatch):
    """Killed after step 3's rollouts were stored but before its checkpoint: resuming from step 2
    deletes them, so the store holds exactly the episodes the resumed run's updates used."""
    out = tmp_path / "killed"
    save = Trainer.save_checkpoint

    def killed_at_step_3(self):
        if self.step == 3:
            raise KeyboardInterrupt
        return save(self)

    monkeypatch.setattr(Trainer, "save_checkpoint", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        trainer(out, BASE.replace(checkpoint_every=1)).run()
    assert len(_stored(out)) == 12  # 3 steps x 2 tasks x 2 attempts, the third without a checkpoint
    monkeypatch.undo()

    trainer(out, BASE.replace(checkpoint_every=1, steps=2), resume=True).run()  # nothing to re-run
    stored = _stored(out)
    assert len(stored) == 8 and all(attempt < 2 * BASE.group_size for _, _, attempt, _ in stored)
    trainer(out, BASE.replace(checkpoint_every=1), resume=True).run()
    assert _stored(out) == _stored(full_run[0])


def test_each_step_samples_with_its_own_seed_and_every_evaluation_with_the_bases(full_run, tmp_path, monkeypatch):
    """A per-step seed, from the run seed and the step: the rollouts of the same task and attempt
    number at two steps never replay one random stream, and a resumed step samples the same. Every
    evaluation samples with the base's seed, so vs_base pairs the same random numbers."""
    from harnessrl.models.hf import HFPolicy

    seen: list[tuple[str, int]] = []
    complete, submit = HFPolicy.complete, HFPolicy.submit

    def spy(self, requests, sampling=None):
        seen.append(("eval" if "+lora" in self.name else "train", sampling.seed))
        return complete(self, requests, sampling)

    def submit_spy(self, request, sampling=None):
        seen.append(("eval" if "+lora" in self.name else "train", sampling.seed))
        return submit(self, request, sampling)

    monkeypatch.setattr(HFPolicy, "complete", spy)  # whichever of the two the runner uses
    monkeypatch.setattr(HFPolicy, "submit", submit_spy)
    trainer(tmp_path / "seeds", BASE.replace(steps=2, eval_every=1, seed=5)).run()
    assert {s for kind, s in seen if kind == "train"} == {sampling_seed(5, step, "train") for step in (0, 1)}
    assert {s for kind, s in seen if kind == "eval"} == {sampling_seed(5, 0, "eval")}
    assert len({sampling_seed(5, step, kind) for step in range(50) for kind in ("train", "eval")}) == 100
    assert sampling_seed(5, 1, "train") != sampling_seed(6, 1, "train")
    # the seeds are in the logs, and those of the uninterrupted and the resumed run agree (stateless)
    out, _ = full_run
    train_seeds = [r["sampling_seed"] for r in lines(out / "metrics.jsonl")]
    assert train_seeds == [sampling_seed(0, s, "train") for s in range(3)]
    assert [e["sampling_seed"] for e in lines(out / "eval.jsonl")] == [sampling_seed(0, 0, "eval")] * 3


def test_resume_with_other_options_and_restarts_into_a_used_folder_are_refused(full_run, tmp_path):
    out, _ = full_run
    with pytest.raises(TrainError, match=r"different configuration.*lr \(0.0001 -> 0.0002\)"):
        trainer(out, BASE.replace(lr=2e-4), resume=True)
    with pytest.raises(TrainError, match="harness_specs"):
        trainer(out, resume=True, specs=[shrunk("json-tools", max_steps=2), SPECS[1]])
    with pytest.raises(TrainError, match="already holds a run; use --resume"):
        trainer(out)
    with pytest.raises(TrainError, match="no training run to resume"):
        trainer(tmp_path / "nothing", resume=True)


def test_nan_loss_stops_cleanly_and_the_checkpoint_resumes(full_run, tmp_path, monkeypatch):
    out = tmp_path / "nan"
    t = trainer(out, BASE.replace(checkpoint_every=1, eval_every=0))

    def nan_after_step_one(*args, **kwargs):
        loss, stats = grpo_loss(*args, **kwargs)
        return (loss * math.nan if t.step >= 1 else loss), stats

    monkeypatch.setattr(update_module, "grpo_loss", nan_after_step_one)
    with pytest.raises(TrainingDiverged, match=r"loss is nan: training stopped; the last checkpoint .* is intact"):
        t.run()
    stopped = lines(out / "metrics.jsonl")[-1]
    assert "stopped" in stopped and stopped["step"] >= 2
    saved = json.loads((out / "checkpoint" / "state.json").read_text())["step"]
    assert saved == stopped["step"] - 1 and not (out / "adapter").exists()

    monkeypatch.undo()
    trainer(out, BASE.replace(checkpoint_every=1, eval_every=0), resume=True).run()
    records = lines(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and not any("stopped" in r for r in records)
    full = lines(full_run[0] / "metrics.jsonl")
    assert [r["harness"] for r in records] == [r["harness"] for r in full]


# ---------------------------------------------------------------------------- the gradient itself


def _units(t: Trainer, n: int = 6) -> list[TrainingUnit]:
    """Random prompts/completions with old log-probs from the current model (ratio 1)."""
    g = torch.Generator().manual_seed(0)
    units = []
    for i in range(n):
        prompt = torch.randint(0, 1000, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        completion = torch.randint(0, 1000, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        units.append(
            TrainingUnit(prompt, completion, [0.0] * len(completion), [1.0, -1.0, 0.0][i % 3], "json-tools", f"e{i}")
        )
    batch = pad_units(units, t.policy.pad_id)
    with torch.no_grad():
        old = token_logprobs(t.peft_model, batch, t.config.temperature)
    for row, u in enumerate(units):
        p = len(u.prompt_ids)
        u.old_logprobs = old[row, p : p + len(u.completion_ids)].tolist()
    return units


def _set_up(out: Path, config: TrainConfig = BASE) -> Trainer:
    t = trainer(out, config)
    t._setup()
    with torch.no_grad():  # move LoRA B off zero so that LoRA A gets gradient too
        g = torch.Generator().manual_seed(1)
        for name, p in t.peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return t


@pytest.fixture(scope="module")
def ready(tmp_path_factory):
    return _set_up(tmp_path_factory.mktemp("grad") / "out")


def _grads(t: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in t.peft_model.named_parameters() if p.grad is not None}


def test_grpo_gradient_flows_only_into_lora_parameters(ready):
    t = ready
    t.optimizer.zero_grad(set_to_none=True)
    accumulate_gradient(t.update_context(), _units(t))
    for name, p in t.peft_model.named_parameters():
        if "lora_" in name:
            assert p.requires_grad and p.grad is not None and p.grad.abs().max() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name
    t.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_micro_batches_and_skipped_zero_advantage_units_give_the_full_batch_gradient(ready, aggregation):
    t = ready
    units = _units(t)
    grads = []
    for micro_batch in (1, 10_000):  # one unit per micro-batch / everything at once
        t.config = t.config.replace(micro_batch=micro_batch, aggregation=aggregation)
        t.optimizer.zero_grad(set_to_none=True)
        accumulate_gradient(t.update_context(), units)
        grads.append(_grads(t))
    # reference: every unit (zero advantages included) in one batch, straight through grpo_loss
    t.optimizer.zero_grad(set_to_none=True)
    batch = pad_units(units, t.policy.pad_id)
    loss, _ = grpo_loss(
        token_logprobs(t.peft_model, batch, 1.0),
        batch["old_logprobs"],
        batch["advantages"],
        batch["completion_mask"],
        aggregation=aggregation,
    )
    loss.backward()
    reference = _grads(t)
    t.optimizer.zero_grad(set_to_none=True)
    for got in grads:
        assert got.keys() == reference.keys()
        for k in reference:
            assert (got[k] - reference[k]).abs().max() <= 1e-4 * reference[k].abs().max() + 1e-7, k


def _lora(t: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in t.peft_model.named_parameters() if p.requires_grad}


def test_one_pass_one_mini_batch_is_one_adamw_step_on_the_full_batch_gradient(tmp_path):
    config = BASE.replace(lr=1e-2)
    t, ref = _set_up(tmp_path / "a", config), _set_up(tmp_path / "b", config)
    units = _units(t)
    update = t._update(units, 0)
    assert update.optimizer_steps == 1 and update.clip_fraction_by_epoch == [0.0]
    assert update.units_trained == 4  # the two zero-advantage units are not forwarded
    # by hand: every unit in one batch through grpo_loss, backward, clip, AdamW
    batch = pad_units(units, ref.policy.pad_id)
    logprobs = token_logprobs(ref.peft_model, batch, ref.config.temperature)
    loss, _ = grpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["completion_mask"])
    loss.backward()
    sketch = ref.sketcher.sketch_model(ref.peft_model)
    norm = torch.nn.utils.clip_grad_norm_(ref.trainable, ref.config.max_grad_norm)
    ref.optimizer.step()
    assert math.isclose(update.loss, float(loss.detach()), rel_tol=1e-5)
    assert math.isclose(update.grad_norm, float(norm), rel_tol=1e-4)
    assert torch.allclose(update.sketch, sketch, rtol=1e-4, atol=1e-6)
    got, want = _lora(t), _lora(ref)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)


def test_old_logprobs_are_recomputed_before_the_first_update(tmp_path, monkeypatch):
    """Rollout log-probs off by 0.5 (as if the engine had mis-recorded them): the loss still sees
    ratio 1 at the first mini-step, and the gap is reported."""
    t = _set_up(tmp_path / "out")
    units = _units(t)
    for u in units:
        u.old_logprobs = [lp + 0.5 for lp in u.old_logprobs]
    ratios: list[torch.Tensor] = []

    def recording(logprobs, old_logprobs, advantages, completion_mask, **kwargs):
        ratios.append(torch.exp(logprobs.detach() - old_logprobs)[completion_mask > 0])
        return grpo_loss(logprobs, old_logprobs, advantages, completion_mask, **kwargs)

    monkeypatch.setattr(update_module, "grpo_loss", recording)
    update = t._update(units, 0)
    assert len(ratios) == 1 and torch.allclose(ratios[0], torch.ones_like(ratios[0]), atol=1e-6)
    assert update.rollout_logprob_diff_max == pytest.approx(0.5, abs=1e-4)
    assert update.rollout_logprob_diff_mean == pytest.approx(0.5, abs=1e-4)


def test_generation_after_an_update_uses_the_new_weights(tmp_path, tokenizer):
    """The engine's prefix cache holds keys/values of the old weights: after an optimizer step
    (and after a checkpoint restore) the policy generates what a cache-less engine over the new
    weights generates."""
    from harnessrl.models.base import GenerationRequest, SamplingParams
    from harnessrl.models.hf import HFPolicy
    from harnessrl.types import Message

    t = _set_up(tmp_path / "out", BASE.replace(lr=5e-2))
    greedy = SamplingParams(temperature=0.0)
    request = GenerationRequest(messages=[Message(role="user", content="Say anything (7).")], max_new_tokens=6)
    first = t.policy.complete([request], greedy)[0]
    follow_up = request.model_copy(
        update={"messages": [*request.messages, Message(role="assistant", content=first.text or "x")]}
    )
    t.policy.complete([follow_up], greedy)  # its prompt prefix is now cached

    def uncached():
        fresh = HFPolicy(t.policy.model, tokenizer, cache_budget_tokens=0)
        try:
            return fresh.complete([follow_up], greedy)[0]
        finally:
            fresh.close()

    clears = t.policy.engine_stats()["cache_clears"]
    with t.policy.paused():
        t._update(_units(t), 0)
    after = t.policy.complete([follow_up], greedy)[0]
    assert t.policy.engine_stats()["cache_clears"] > clears
    assert after.completion_ids == uncached().completion_ids
    assert after.logprobs == pytest.approx(uncached().logprobs, abs=1e-5)
    t.policy.complete([follow_up], greedy)
    t.out.mkdir(parents=True, exist_ok=True)
    t.save_checkpoint()
    with torch.no_grad():  # move the adapter away, then restore the checkpoint over it
        for p in t.trainable:
            p.add_(0.5)
    clears = t.policy.engine_stats()["cache_clears"]
    assert t.load_checkpoint()
    restored = t.policy.complete([follow_up], greedy)[0]
    assert t.policy.engine_stats()["cache_clears"] > clears
    assert restored.completion_ids == after.completion_ids
    assert restored.logprobs == pytest.approx(after.logprobs, abs=1e-5)
    t.policy.close()


@pytest.mark.parametrize("epochs, minis", [(2, 1), (1, 2), (2, 3)])
def test_later_mini_steps_see_ratios_away_from_1_and_the_clip_acts(tmp_path, monkeypatch, epochs, minis):
    """ppo_epochs > 1 or mini_batches > 1: the old log-probs stay those of the sampling weights, so
    from the second mini-step on the ratio differs from 1, and with a large step some tokens are clipped."""
    t = _set_up(tmp_path / "out", BASE.replace(lr=5e-2, ppo_epochs=epochs, mini_batches=minis))
    units = _units(t)
    ratios: list[torch.Tensor] = []

    def recording(logprobs, old_logprobs, advantages, completion_mask, **kwargs):
        ratios.append(torch.exp(logprobs.detach() - old_logprobs)[completion_mask > 0])
        return grpo_loss(logprobs, old_logprobs, advantages, completion_mask, **kwargs)

    monkeypatch.setattr(update_module, "grpo_loss", recording)
    before = _lora(t)
    update = t._update(units, 0)
    assert len(ratios) == update.optimizer_steps >= 2  # one micro-batch per mini-step here
    assert torch.allclose(ratios[0], torch.ones_like(ratios[0]), atol=1e-5)  # the sampling policy itself
    assert all((r - 1).abs().max() > 1e-3 for r in ratios[1:])
    assert len(update.clip_fraction_by_epoch) == epochs
    assert update.clip_fraction > 0 and max(update.clip_fraction_by_epoch) > 0
    if epochs > 1:
        assert update.clip_fraction_by_epoch[1] > 0
    assert update.units_trained == 4 and update.sketch.abs().max() > 0
    after = _lora(t)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_the_loss_is_computed_without_dropout(tmp_path):
    """A model with attention dropout and LoRA dropout configured: two loss computations on the
    same batch give the same loss and gradient (dropout would make the log-probs random)."""
    t = _set_up(tmp_path / "out")
    assert not t.peft_model.training
    for module in t.peft_model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
        if hasattr(module, "lora_dropout"):
            for key in module.lora_dropout:
                module.lora_dropout[key] = torch.nn.Dropout(0.5)  # a new module: in train mode
    units = _units(t)
    results = []
    for _ in range(2):
        t.optimizer.zero_grad(set_to_none=True)
        stats, *_ = accumulate_gradient(t.update_context(), units)
        results.append((stats, _grads(t)))
    (s1, g1), (s2, g2) = results
    assert s1 == s2 and g1.keys() == g2.keys() and all(torch.equal(g1[k], g2[k]) for k in g1)
    assert not t.peft_model.training


# ------------------------------------------------------------------------------------ pure pieces


def test_split_mini_batches_covers_every_unit_once_deterministically():
    units = [TrainingUnit([1], [2], [0.0], 1.0, "h", str(i)) for i in range(7)]
    assert split_mini_batches(units, 1, "s") == [units]  # one mini-batch: the batch as it is
    parts = split_mini_batches(units, 3, "s")
    assert sorted(len(p) for p in parts) == [2, 2, 3]
    assert sorted(u.episode_id for p in parts for u in p) == sorted(u.episode_id for u in units)
    assert parts == split_mini_batches(units, 3, "s")
    other_seed = split_mini_batches(units, 3, "t")
    assert [u.episode_id for p in other_seed for u in p] != [u.episode_id for p in parts for u in p]
    assert [len(p) for p in split_mini_batches(units, 20, "s")] == [1] * 7


def test_allocate_tasks_by_shares_rotates_the_remainder():
    six = {h: 1 / 6 for h in "abcdef"}
    assert allocate_tasks(six, 8, 0) == {"a": 2, "b": 2, "c": 1, "d": 1, "e": 1, "f": 1}
    assert allocate_tasks(six, 8, 1) == {"a": 1, "b": 2, "c": 2, "d": 1, "e": 1, "f": 1}
    assert allocate_tasks({"a": 1.0}, 8, 3) == {"a": 8}
    assert allocate_tasks({"a": 0.5, "b": 0.5}, 8, 0) == {"a": 4, "b": 4}
    assert sum(allocate_tasks(six, 2, 5).values()) == 2


def test_micro_batches_respect_the_token_budget():
    units = [TrainingUnit([1] * n, [2] * 2, [0.0] * 2, 1.0, "h", str(n)) for n in (10, 3, 7, 1, 30)]
    batches = micro_batches(units, 40)
    assert sorted(len(u.prompt_ids) for b in batches for u in b) == [1, 3, 7, 10, 30]
    for b in batches:
        width = max(len(u.prompt_ids) + len(u.completion_ids) for u in b)
        assert len(b) == 1 or width * len(b) <= 40
    assert [len(b) for b in micro_batches(units, 1)] == [1] * 5


# --------------------------------------------------------------------------------------------- CLI


def _cli():
    app = typer.Typer()
    app.add_typer(train_app, name="train")

    @app.command()
    def version() -> None:  # a second command, so that `train` stays a sub-command
        pass

    return app


@pytest.mark.parametrize(
    "args, message",
    [
        (["--harnesses", "json-tools,nope"], "unknown harness 'nope'"),
        (["--scheduler", "best"], "unknown scheduler 'best'"),
        (["--group-size", "1"], "--group-size must be >= 2"),
        (["--harnesses", "json-tools"], "needs at least 2 harnesses"),
        (["--tasks-per-step", "0"], "--tasks-per-step must be >= 1"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--ppo-epochs", "0"], "--ppo-epochs must be >= 1"),
        (["--mini-batches", "0"], "--mini-batches must be >= 1"),
        (["--scheduler-option", "floor"], "KEY=VALUE"),
        (["--scheduler-option", "speed=3"], "has no option(s) speed"),
        (["-H", "json-tools,react", "--scheduler", "ratio:json-tools=1"], "no weight for 'react'"),
        (["-H", "json-tools,react", "--scheduler", "ratio:json-tools=1,react=-2"], "weight of react"),
        (["--scheduler", "dump-ucb", "--scheduler-option", "window=0"], "window must be"),
        (["--scheduler", "lilo", "--scheduler-option", "floor=0.5"], "floor * number of harnesses"),
        (["--suite", "nope"], "unknown suite 'nope'"),
        (["--model", "hf:/no/such/folder"], "does not exist"),
        (["--resume"], "no training run to resume"),
        (["--tasks-per-step", "100000"], "--tasks-per-step: split 'train' of suite 'toolcalc' has "),
        (["--eval-every", "1", "--eval-tasks", "100000"], "--eval-tasks: split 'dev' of suite 'toolcalc' has "),
    ],
)
def test_cli_bad_input_exits_2_with_a_message(args, message, tmp_path):
    r = CliRunner().invoke(_cli(), ["train", "grpo", "--model", "tiny-random", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_cli_mixed_run_end_to_end_and_diverged_exit_code(tmp_path, monkeypatch):
    paths = []
    for spec in SPECS:
        strict = shrunk(spec.name, max_steps=1, max_new_tokens=4, demonstrations=[])
        paths.append(tmp_path / f"{spec.name}.yaml")
        paths[-1].write_text(strict.to_yaml())
    args = [
        "train",
        "grpo",
        "--model",
        "tiny-random",
        "--suite",
        "toolcalc",
        "--harnesses",
        ",".join(map(str, paths)),
        "--scheduler",
        "mixed",
        "--steps",
        "1",
        "--tasks-per-step",
        "2",
        "--group-size",
        "2",
        "--lora-r",
        "2",
        "--no-progress",
        "--out",
        str(tmp_path / "mixed"),
    ]
    r = CliRunner().invoke(_cli(), args)
    assert r.exit_code == 0, r.output
    assert "hf:" in r.output and "adapter" in r.output
    (rec,) = lines(tmp_path / "mixed" / "metrics.jsonl")
    assert rec["harness"] == "mixed" and rec["shares"] == {"json-tools": 0.5, "react": 0.5}

    def diverge(self):
        raise TrainingDiverged("step 1: the loss is nan: training stopped")

    monkeypatch.setattr(Trainer, "run", diverge)
    r = CliRunner().invoke(_cli(), [*args[:-1], str(tmp_path / "other")])
    assert r.exit_code == 1 and "loss is nan" in r.output and "Traceback" not in r.output


def test_adapter_folder_without_a_local_base_is_a_clear_error(tmp_path):
    from harnessrl.models import load_policy
    from harnessrl.models.base import ModelUnavailable

    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M"}))
    with pytest.raises(ModelUnavailable, match="not a local folder"):
        load_policy(f"hf:{tmp_path}")


def test_cli_options_match_the_config_defaults_and_the_docs():
    """Every TrainConfig field is a command-line option with the same default, and every option
    (and nothing else) is in the options table of docs/training.md."""
    import re

    command = typer.main.get_command(_cli()).commands["train"].commands["grpo"]
    options = {p.name: p for p in command.params}
    cli_only = {"out", "resume", "progress", "executor", "ray_address", "isolation", "allow_host_network", "preflight"}
    renamed = {"scheduler_option": "scheduler_options"}
    fields = set(TrainConfig.model_fields)
    assert {renamed.get(n, n) for n in options} - cli_only == set(fields)
    defaults = TrainConfig()
    for name, param in options.items():
        if name in cli_only:
            continue
        default = param.default
        if name in ("harnesses", "lora_targets"):  # comma-separated text on the command line
            default = [x for item in ([default] if isinstance(default, str) else default) for x in item.split(",")]
        elif name in ("scheduler_option", "scheduler_options"):  # repeated KEY=VALUE on the command line
            default = {}
        assert default == getattr(defaults, renamed.get(name, name)), name

    docs = (Path(__file__).parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    section = docs[docs.index("## The trainer") : docs.index("### The run folder")]
    table = [line for line in section.splitlines() if line.startswith("| `--")]
    documented = {flag for line in table for flag in re.findall(r"`(--[a-z-]+)", line.split("|")[1])}
    flags = {flag for p in command.params for flag in (*p.opts, *p.secondary_opts) if flag.startswith("--")}
    assert documented <= flags, documented - flags
    for name, param in options.items():
        assert documented & {*param.opts, *param.secondary_opts}, f"{param.opts[0]} is not in docs/training.md"


def test_one_of_several_processes_chooses_its_model_once_its_process_group_is_set_up(tmp_path, monkeypatch):
    """Under torchrun "auto" names each process's own GPU only once Distributed.from_env has set
    it: a choice made before (the job kernel's) is taken by a single process alone."""
    import torch

    from harnessrl.models.choice import choose_model
    from harnessrl.train import trainer as trainer_module
    from harnessrl.train.distributed import Distributed

    early = dataclasses.replace(choose_model("tiny-random", device="cpu"), device=torch.device("meta"))
    one = grpo_trainer(BASE, tmp_path / "one", suite=TextScore(), specs=SPECS, progress=False, model=early)
    assert one.model_choice is early  # one process: the kernel's choice as it is

    class RankZeroOfTwo(Distributed):  # the collectives as if the other process agreed
        def all_gather_object(self, obj):
            return [obj, obj]

        def gather_object(self, obj):
            return [obj, obj]

        def broadcast_object(self, obj):
            return obj

        def all_reduce_(self, tensor):
            return tensor

        def broadcast_tensors_(self, tensors):
            pass

        def barrier(self):
            pass

    monkeypatch.setattr(trainer_module.Distributed, "from_env", classmethod(lambda cls: RankZeroOfTwo(0, 2, 0)))
    several = grpo_trainer(BASE, tmp_path / "two", suite=TextScore(), specs=SPECS, progress=False, model=early)
    assert several.model_choice is not early and str(several.model_choice.device) == "cpu"
