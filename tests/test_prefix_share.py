"""The rows of a micro-batch forwarded as a tree (harnessrl.train.prefix_share): which segments a
plan makes, the budget of its micro-batches, and, on real episodes of three harnesses played by
the tiny model, the same per-token log-probs, loss and LoRA gradient as every row forwarded whole,
for every loss the update computes."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from helpers import shrunk
from test_trainer import BASE, _set_up

from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.train.grpo import TrainingUnit, pad_units, token_logprobs, units_from_trajectories
from harnessrl.train.lora import enable_gradient_checkpointing
from harnessrl.train.packing import pad_packed
from harnessrl.train.prefix_share import (
    plan_of,
    share_plan,
    shared_micro_batches,
    shared_token_logprobs,
    supports,
)
from harnessrl.train.update import accumulate_gradient, micro_batches, recompute_old_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(5, 900) for _ in range(n)]


def _joined(plan, row: int) -> list[int]:
    return [t for s in plan.paths[row] for t in plan.segments[s].tokens]


# ------------------------------------------------------------------ plans


def test_a_system_prompt_and_task_prompts_become_a_tree():
    rng = random.Random(0)
    system = _ids(rng, 50)
    tasks = [system + _ids(rng, 40) for _ in range(2)]
    rows = [task + _ids(rng, 20) for task in tasks for _ in range(3)]
    plan = share_plan(rows)
    shape = sorted((s.depth, s.start, len(s.tokens), s.rows) for s in plan.segments)
    assert shape == [(0, 0, 50, 6), (1, 50, 40, 3), (1, 50, 40, 3)] + [(2, 90, 20, 1)] * 6
    for r, row in enumerate(rows):
        assert _joined(plan, r) == row
    assert plan.unique == 50 + 2 * 40 + 6 * 20
    assert plan.forwarded == plan.unique  # equal lengths at every depth: no padding
    assert [len(call) for call in plan.calls] == [1, 2, 6]


def test_nothing_shared_gives_each_row_one_segment():
    rng = random.Random(1)
    rows = [[first] + _ids(rng, n) for first, n in ((1, 30), (2, 31), (3, 5))]
    plan = share_plan(rows)
    assert sorted(map(len, plan.paths)) == [1, 1, 1]
    assert all(s.depth == 0 and s.start == 0 for s in plan.segments)
    assert plan.unique == sum(map(len, rows))
    # the short row is not padded to the long ones' width
    assert plan.forwarded <= plan.unique * 1.125 and plan.forwarded < 3 * 32


def test_a_short_common_run_stays_in_the_rows_and_a_row_that_ends_early_ends_at_a_boundary():
    rng = random.Random(2)
    prompt = _ids(rng, 60)
    rows = [prompt + [7, 8] + _ids(rng, 10), prompt + [7, 8] + _ids(rng, 12), prompt]
    plan = share_plan(rows)
    # the two-token run [7, 8] saves 2 tokens: not a segment of its own (MIN_SAVED)
    assert sorted((s.start, len(s.tokens)) for s in plan.segments) == [(0, 60), (60, 12), (60, 14)]
    assert plan.paths[2] == [plan.paths[0][0]]  # the prompt alone: the shared segment
    for r, row in enumerate(rows):
        assert _joined(plan, r) == row
    assert share_plan(rows, min_saved=1).unique == 60 + 2 + 10 + 12


def test_identical_rows_share_one_path():
    rows = [[5, 6, 7, 8] * 20] * 3
    plan = share_plan(rows)
    assert len(plan.segments) == 1 and plan.paths == [[0], [0], [0]]


def test_random_rows_always_rebuild_and_locate():
    rng = random.Random(3)
    for _ in range(20):
        stems = [_ids(rng, rng.randrange(1, 40)) for _ in range(3)]
        rows = []
        for _ in range(rng.randrange(1, 9)):
            row = list(rng.choice(stems))
            for _ in range(rng.randrange(0, 3)):
                row += rng.choice(stems)[: rng.randrange(0, 30)] + _ids(rng, rng.randrange(0, 30))
            rows.append(row)
        plan = share_plan(rows, min_saved=rng.choice([1, 8, 32]))
        for r, row in enumerate(rows):
            assert _joined(plan, r) == row
            for position in rng.sample(range(len(row)), min(5, len(row))):
                s, offset = plan.locate(r, position)
                assert plan.segments[s].tokens[offset] == row[position]
        seen: set[int] = set()
        for call in plan.calls:  # every segment after its parent, once
            for s in call:
                assert plan.segments[s].parent in seen | {-1}
            seen |= set(call)
        assert seen == set(range(len(plan.segments)))


def _unit(prompt: list[int], completion: list[int], episode: str, advantage: float = 1.0) -> TrainingUnit:
    return TrainingUnit(prompt, completion, [-1.0] * len(completion), advantage, "react", episode)


def _step_units(seed: int, tasks: int = 3, group: int = 4, calls: int = 2) -> list[TrainingUnit]:
    """A harness's step in token ids: one system prompt, a task prompt per task, `group` episodes
    of `calls` calls each, each call's prompt the previous call's tokens and a tool result."""
    rng = random.Random(seed)
    system = _ids(rng, 60)
    units = []
    for t in range(tasks):
        task = system + _ids(rng, 40)
        for e in range(group):
            prompt = task
            for _ in range(calls):
                completion = _ids(rng, rng.randrange(3, 12))
                units.append(_unit(prompt, completion, f"t{t}e{e}", 1.0 if e % 2 else -1.0))
                prompt = prompt + completion + _ids(rng, 8)
    return units


@pytest.mark.parametrize("pack", [True, False])
def test_shared_micro_batches_keep_the_budget_and_put_sharing_rows_together(pack):
    units = _step_units(0)
    for budget in (1, 200, 400, 100_000):
        batches = shared_micro_batches(units, budget, pack)
        assert sorted(id(u) for mb in batches for u in mb) == sorted(id(u) for u in units)
        for mb in batches:
            plan = plan_of(pad_packed(mb, 0) if pack else pad_units(mb, 0))
            rows = len(pad_packed(mb, 0)["input_ids"]) if pack else len(mb)
            assert plan.forwarded <= budget or rows == 1
    whole = shared_micro_batches(units, 100_000, pack)
    assert len(whole) == 1
    plan = plan_of(pad_packed(units, 0) if pack else pad_units(units, 0))
    assert plan.forwarded < pad_units(units, 0)["input_ids"].numel() / 3
    # in the order of their tokens, a task's rows are neighbours: each batch boundary splits at most one task
    batches = shared_micro_batches(units, 200, pack)
    assert len(batches) >= 3
    assert sum(len({u.episode_id[:2] for u in mb}) for mb in batches) <= len(batches) + 3 - 1
    assert micro_batches(units, 400, pack, share=True) == shared_micro_batches(units, 400, pack)


# ------------------------------------------------------------------ on the tiny model

HARNESSES = ("react", "json-tools", "xml-tags")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model's trainer (LoRA B off zero, so that LoRA A gets gradient too) and real
    units: 2 toolcalc train tasks x 2 attempts through each of three harnesses, each episode up to
    3 calls (the harnesses' own system prompts and tool definitions; the random model's malformed
    replies get the harness's feedback, so later calls extend the history)."""
    t = _set_up(tmp_path_factory.mktemp("share") / "out", BASE.replace(micro_batch=100_000))
    suite = get_suite("toolcalc")
    units: list[TrainingUnit] = []
    for h, name in enumerate(HARNESSES):
        spec = shrunk(name, max_steps=3, max_new_tokens=12)
        jobs = make_jobs(suite.tasks("train", 2), [spec], 2)
        sampling = SamplingParams(temperature=1.0, top_p=1.0, seed=h)
        trajectories = Runner(t.policy, sampling, max_in_flight=8, progress=False).run(jobs)
        advantages = {traj.episode_id: (0.5 + i) * (-1) ** i for i, traj in enumerate(trajectories)}
        units += units_from_trajectories(trajectories, advantages)
    return t, units


def test_real_episodes_share_their_prompts(tiny):
    t, units = tiny
    assert {u.harness for u in units} == set(HARNESSES)
    assert max(len(u.prompt_ids) for u in units) > 150  # the harnesses' real prompts
    plan = plan_of(pad_units(units, 0))
    # every harness's system prompt: one segment through all of its units and only those
    for name in HARNESSES:
        mine = {r for r, u in enumerate(units) if u.harness == name}
        through = [{r for r, path in enumerate(plan.paths) if s in path} for s in range(len(plan.segments))]
        assert any(rows == mine and len(plan.segments[s].tokens) > 50 for s, rows in enumerate(through)), name
    assert plan.forwarded < plan_of(pad_packed(units, 0)).forwarded < pad_packed(units, 0)["input_ids"].numel()
    assert plan.forwarded < pad_units(units, 0)["input_ids"].numel() / 4


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> bool:
    return float((a - b).abs().max()) <= rel * max(1.0, float(b.abs().max()))


def test_each_unit_gets_its_own_logprobs(tiny):
    t, units = tiny
    ctx = t.update_context()
    assert supports(ctx.model) and ctx.shares
    for batch in (pad_units(units, ctx.pad_id), pad_packed(units, ctx.pad_id)):
        with torch.no_grad():
            plain = token_logprobs(ctx.model, batch, t.config.temperature)
            shared = shared_token_logprobs(ctx.model, batch, t.config.temperature)
        assert _close(shared, plain)
        assert shared[batch["completion_mask"] == 0].abs().max() == 0


def _lora_gradient(ctx, units):
    ctx.optimizer.zero_grad(set_to_none=True)
    stats, n, tokens, padded = accumulate_gradient(ctx, units)
    grads = torch.cat([p.grad.reshape(-1) for p in ctx.trainable])
    ctx.optimizer.zero_grad(set_to_none=True)
    return stats, grads, padded


def _with_old_logprobs(units: list[TrainingUnit]) -> list[TrainingUnit]:
    """The units with old log-probs a little off the model's (the ratio then moves from 1)."""
    rng = random.Random(5)
    return [dataclasses.replace(u, old_logprobs=[x + rng.uniform(-0.3, 0.3) for x in u.old_logprobs]) for u in units]


@pytest.mark.parametrize(
    "loss, micro_batch",
    [
        ({}, 100_000),
        ({}, 600),
        ({"aggregation": "seq-mean"}, 100_000),
        ({"aggregation": "seq-mean"}, 600),
        ({"rollout_correction": "tis", "tis_level": "sequence"}, 100_000),
        ({"rollout_correction": "tis", "tis_level": "token", "kl_coef": 0.1}, 100_000),
    ],
    ids=["token-mean", "token-mean-600", "seq-mean", "seq-mean-600", "sequence-tis", "token-tis-kl"],
)
def test_the_update_has_the_same_loss_and_gradient(tiny, loss, micro_batch):
    """With and without sharing, the whole batch in one micro-batch or in micro-batches of 600
    tokens: the same old log-probs, mismatch, loss, clip fraction and LoRA gradient."""
    t, units = tiny
    units = _with_old_logprobs(units)
    saved = t.config
    results = {}
    try:
        for share in (False, True):
            t.config = saved.replace(share_prefixes=share, micro_batch=micro_batch, **loss)
            ctx = t.update_context()
            assert ctx.shares is share
            fresh, mismatch = recompute_old_logprobs(ctx, units)
            results[share] = (fresh, mismatch, *_lora_gradient(ctx, units))
    finally:
        t.config = saved
    (fresh_a, mismatch_a, stats_a, grads_a, padded_a), (fresh_b, mismatch_b, stats_b, grads_b, padded_b) = (
        results[False],
        results[True],
    )
    for x, y in zip(fresh_a, fresh_b):
        assert y.old_logprobs == pytest.approx(x.old_logprobs, rel=1e-5, abs=1e-5)
    assert mismatch_b.logprob_diff_mean == pytest.approx(mismatch_a.logprob_diff_mean, rel=1e-5)
    assert stats_b["loss"] == pytest.approx(stats_a["loss"], rel=1e-5, abs=1e-8)
    assert stats_b["clip_fraction"] == pytest.approx(stats_a["clip_fraction"], abs=1e-9)
    assert float((grads_b - grads_a).norm()) <= 1e-5 * float(grads_a.norm())
    assert float(grads_a.norm()) > 0
    # forwarded tokens: fewer, most where a micro-batch holds many rows
    assert padded_b < padded_a * (0.5 if micro_batch > 10_000 else 0.8)


def test_nothing_shared_and_the_whole_prompt_shared(tiny):
    t, units = tiny
    ctx = t.update_context()
    first = [u for u in units if u.prompt_ids == units[0].prompt_ids][:1]
    # nothing shared: every row begins with its own token
    alone = [dataclasses.replace(u, prompt_ids=[100 + i, *u.prompt_ids]) for i, u in enumerate(units[:6])]
    # the whole prompt shared: one prompt, several completions
    whole = [dataclasses.replace(first[0], completion_ids=u.completion_ids, old_logprobs=u.old_logprobs) for u in units]
    for case, depth in ((alone, 0), (whole, 1)):
        batch = pad_units(case, ctx.pad_id)
        plan = plan_of(batch)
        assert max(s.depth for s in plan.segments) == depth
        if depth:
            assert plan.segments[0].tokens == first[0].prompt_ids and plan.segments[0].rows == len(case)
        with torch.no_grad():
            assert _close(
                shared_token_logprobs(ctx.model, batch, 1.0, plan=plan), token_logprobs(ctx.model, batch, 1.0)
            )
        _, shared, _ = _lora_gradient(ctx, case)
        saved = t.config
        try:
            t.config = saved.replace(share_prefixes=False)
            _, plain, _ = _lora_gradient(t.update_context(), case)
        finally:
            t.config = saved
        assert float((shared - plain).norm()) <= 1e-5 * float(plain.norm())


def test_gradient_checkpointing_gives_the_same_gradient(tmp_path, tiny):
    _, units = tiny
    t = _set_up(tmp_path / "out", BASE.replace(micro_batch=100_000, gradient_checkpointing=True))
    enable_gradient_checkpointing(t.peft_model, RuntimeError)
    ctx = t.update_context()
    assert ctx.shares
    batch = pad_units(units, ctx.pad_id)
    weights = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(0))
    grads = []
    calls = []  # forwards of a layer's attention: the backward replays each checkpointed layer
    layer = t.peft_model.get_base_model().get_decoder().layers[0]
    hook = layer.self_attn.o_proj.register_forward_hook(lambda *_: calls.append(1))
    try:
        for fn in (token_logprobs, shared_token_logprobs):
            ctx.optimizer.zero_grad(set_to_none=True)
            calls.clear()
            (fn(ctx.model, batch, 1.0) * weights).sum().backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in ctx.trainable]))
    finally:
        hook.remove()
        ctx.optimizer.zero_grad(set_to_none=True)
    assert len(calls) == 2 * len(plan_of(batch).calls)  # each forward of the plan, then its replay
    assert float((grads[1] - grads[0]).norm()) <= 1e-5 * float(grads[0].norm())


def test_the_switch_turns_it_off(tiny):
    t, units = tiny
    saved = t.config
    try:
        t.config = saved.replace(share_prefixes=False)
        ctx = t.update_context()
        assert not ctx.shares
        _, _, padded = _lora_gradient(ctx, units)
    finally:
        t.config = saved
    assert padded == sum(
        pad_packed(mb, ctx.pad_id)["input_ids"].numel() for mb in micro_batches(units, saved.micro_batch, True)
    )


# ------------------------------------------------------------------ other decoders


def _small(model_type: str, attn: str = "sdpa", **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=1000,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()


@pytest.mark.parametrize(
    "model_type, attn",
    [("llama", "eager"), ("qwen2", "sdpa"), ("qwen3", "sdpa"), ("mistral", "sdpa")],
)
def test_other_decoders_give_the_same_logprobs_and_gradient(model_type, attn):
    model = _small(model_type, attn, **({"sliding_window": None} if model_type == "mistral" else {}))
    assert supports(model)
    units = _step_units(1, tasks=2, group=3)
    batch = pad_units(units, 0)
    weights = torch.randn(batch["input_ids"].shape, generator=torch.Generator().manual_seed(0))
    out = []
    for fn in (token_logprobs, shared_token_logprobs):
        model.zero_grad(set_to_none=True)
        logprobs = fn(model, batch, 0.7)
        (logprobs * weights).sum().backward()
        out.append((logprobs.detach(), torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
    assert _close(out[1][0], out[0][0])
    assert float((out[1][1] - out[0][1]).norm()) <= 1e-5 * float(out[0][1].norm())


def test_models_it_cannot_run_are_forwarded_whole():
    model = _small("llama")
    assert supports(model)
    model.config._attn_implementation = "flash_attention_2"  # takes no 4D mask
    assert not supports(model)
    assert not supports(_small("mistral", sliding_window=64))  # the mask would hide what the window hides
    model = _small("llama")
    model.config.final_logit_softcapping = 30.0  # the output head is not plain
    assert not supports(model)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=16, n_layer=1, n_head=2, n_positions=64))
    assert not supports(gpt2)  # an architecture the tests do not check
