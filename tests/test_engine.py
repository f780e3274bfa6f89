"""The inference engine: continuous batching, prefix reuse, exact sampling and logprobs."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from harnessrl.models import packed
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineClosed, EngineRequest
from harnessrl.models.prefix_cache import PrefixCache


@pytest.fixture(scope="module")
def model():
    return tiny_random_model()


def _prompts(tokenizer, n: int, base: str = "Task") -> list[list[int]]:
    return [tokenizer.encode(f"{base} {k}: " + "count the apples " * (1 + 2 * k)) for k in range(n)]


def _generate_alone(model, prompt: list[int], max_new: int, stops: list[int]) -> list[int]:
    """model.generate, greedy, one request, cut after the first stop id."""
    config = GenerationConfig(
        max_new_tokens=max_new, do_sample=False, num_beams=1, eos_token_id=stops or None, pad_token_id=0
    )
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            generation_config=config,
        )
    ids = out[0, len(prompt) :].tolist()
    for i, t in enumerate(ids):
        if t in stops:
            return ids[: i + 1]
    return ids


def _teacher_forced(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    z = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    if temperature > 0:
        z = z / temperature
    return torch.log_softmax(z, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_greedy_batch_matches_generate_one_at_a_time(model, tokenizer, overlap):
    prompts = _prompts(tokenizer, 5)
    limits = [6, 14, 9, 3, 11]
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=3)  # 5 requests, 3 rows: two join mid-flight
    results = engine.generate([EngineRequest(p, n) for p, n in zip(prompts, limits)])
    stops = sorted(engine.stop_ids)
    for prompt, limit, result in zip(prompts, limits, results):
        assert result.ids == _generate_alone(model, prompt, limit, stops)
        assert result.finish_reason == "length" and len(result.ids) == limit
        assert result.prompt_tokens == len(prompt)
    stats = engine.stats()
    # each request: its first token comes from the prefill, every later one from one decode row,
    # and no decode row is spent on a request that already finished
    assert stats.decode_rows == sum(n - 1 for n in limits)
    assert stats.peak_batch == 3
    assert stats.completion_tokens == sum(limits)
    # with overlap, the first request is prefilled inline (nothing to decode beside it); later ones
    # go to the prefill thread while rows decode, except that while it is busy and few rows
    # decode the engine thread prefills the next waiting one itself (here the third, at once)
    assert stats.prefills_overlapped == (3 if overlap else 0)


def test_stop_token_ends_only_its_row_and_is_kept(model, tokenizer):
    prompts = _prompts(tokenizer, 3)
    free = Engine(model, [], max_batch=4, cache_budget_tokens=0).generate([EngineRequest(p, 10) for p in prompts])
    stop = free[1].ids[3]  # the 4th greedy token of request 1
    first = free[1].ids.index(stop)
    engine = Engine(model, [], max_batch=4, cache_budget_tokens=0)
    requests = [EngineRequest(p, 10, stop_ids=[stop] if i == 1 else None) for i, p in enumerate(prompts)]
    results = engine.generate(requests)
    assert results[1].ids == free[1].ids[: first + 1]
    assert results[1].finish_reason == "stop"
    assert results[1].ids == _generate_alone(model, prompts[1], 10, [stop])
    assert [r.ids for i, r in enumerate(results) if i != 1] == [free[0].ids, free[2].ids]
    assert engine.stats().decode_rows == 9 + first + 9


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_requests_joining_mid_flight_match_running_alone(model, tokenizer, overlap):
    prompts = _prompts(tokenizer, 4, base="Join")
    alone = []
    for p in prompts:
        alone.append(
            Engine(model, tokenizer, overlap_prefill=overlap, cache_budget_tokens=0).generate([EngineRequest(p, 8)])[0]
        )
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=4, cache_budget_tokens=0)
    first = engine.submit(prompts[0], 8)
    engine.step()
    engine.step()
    later = [engine.submit(p, 8) for p in prompts[1:3]]
    engine.step()
    last = engine.submit(prompts[3], 8)
    engine.run_until_done()
    got = [f.result() for f in [first, *later, last]]
    for a, b in zip(alone, got):
        assert a.ids == b.ids
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_same_seed_same_sample_alone_or_beside_others(model, tokenizer):
    prompts = _prompts(tokenizer, 4, base="Sample")
    target = EngineRequest(prompts[0], 16, temperature=1.0, top_p=0.9, seed=1234)
    alone = Engine(model, tokenizer, cache_budget_tokens=0).generate([target])[0]
    others = [EngineRequest(p, 5 + 4 * i, temperature=0.8, seed=i) for i, p in enumerate(prompts[1:])]
    crowded = Engine(model, tokenizer, max_batch=4).generate([others[0], target, *others[1:]])[1]
    assert crowded.ids == alone.ids
    assert crowded.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other_seed = Engine(model, tokenizer).generate([EngineRequest(prompts[0], 16, temperature=1.0, top_p=0.9, seed=7)])
    assert other_seed[0].ids != alone.ids  # the seed, not something global, drives the draw


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (0.7, 0.8), (1.3, 1.0)])
@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_logprobs_match_teacher_forced_forward(model, tokenizer, temperature, top_p, overlap):
    prompts = _prompts(tokenizer, 3, base="Logprob")
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=2)
    results = engine.generate(
        [EngineRequest(p, 12, temperature=temperature, top_p=top_p, seed=i) for i, p in enumerate(prompts)]
    )
    for prompt, result in zip(prompts, results):
        expected = _teacher_forced(model, prompt, result.ids, temperature)
        assert result.logprobs == pytest.approx(expected, abs=1e-4)


def test_top_p_keeps_samples_inside_the_nucleus(model, tokenizer):
    prompt = _prompts(tokenizer, 1, base="Nucleus")[0]
    engine = Engine(model, [], cache_budget_tokens=0)
    results = engine.generate([EngineRequest(prompt, 1, temperature=1.0, top_p=0.5, seed=s) for s in range(30)])
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].float(), dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True)
    nucleus = order[: int((torch.cumsum(sorted_probs, 0) < 0.5).sum()) + 1].tolist()
    assert {r.ids[0] for r in results} <= set(nucleus)


def _multi_turn(engine, tokenizer, system: list[int], tasks: list[str], turns: int = 3):
    """Episodes whose next prompt is the previous prompt + completion + an observation."""
    prompts = [system + tokenizer.encode(t) for t in tasks]
    history = []
    for turn in range(turns):
        requests = [EngineRequest(p, 6, temperature=0.9, seed=10 * turn + i) for i, p in enumerate(prompts)]
        results = engine.generate(requests)
        history.append((prompts, results))
        prompts = [p + r.ids + tokenizer.encode(f" observation {turn}: ok.") for p, r in zip(prompts, results)]
    return history


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_prefix_cache_skips_prefill_and_gives_the_same_results(model, tokenizer, overlap):
    system = tokenizer.encode("You are an agent. Tools: add, sub. Example: add(1, 2) -> 3. " * 3)
    tasks = ["Add 2 and 3.", "Subtract 4 from 9.", "Add 7 and 8."]
    cached = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=3)
    uncached = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=3, cache_budget_tokens=0)
    with_cache = _multi_turn(cached, tokenizer, system, tasks)
    without = _multi_turn(uncached, tokenizer, system, tasks)
    for (prompts, a), (prompts_b, b) in zip(with_cache, without):
        assert prompts == prompts_b
        for x, y in zip(a, b):
            assert x.ids == y.ids
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    # turn 1: the second and third episode reuse the system prompt the first one prefilled
    first_turn = with_cache[0][1]
    assert first_turn[0].cached_tokens == 0
    assert all(r.cached_tokens >= len(system) for r in first_turn[1:])
    # later turns: everything up to the previous completion's last fed token is reused
    for turn in (1, 2):
        previous_prompts, previous = with_cache[turn - 1]
        for prev_prompt, prev, result in zip(previous_prompts, previous, with_cache[turn][1]):
            assert result.cached_tokens == len(prev_prompt) + len(prev.ids) - 1
    s, u = cached.stats(), uncached.stats()
    assert s.prompt_tokens == u.prompt_tokens == s.prefilled_tokens + s.cached_tokens
    assert u.cached_tokens == 0 and u.prefilled_tokens == u.prompt_tokens
    assert s.prefilled_tokens < u.prefilled_tokens / 2


def test_prompt_fully_cached_still_prefills_its_last_token(model, tokenizer):
    prompt = _prompts(tokenizer, 1, base="Again")[0]
    engine = Engine(model, tokenizer)
    first, second = engine.generate([EngineRequest(prompt, 5)]), engine.generate([EngineRequest(prompt, 5)])
    assert second[0].ids == first[0].ids
    assert second[0].cached_tokens == len(prompt) - 1
    assert engine.stats().prefilled_tokens == len(prompt) + 1


def _shared_prompts(tokenizer, n: int) -> tuple[list[int], list[list[int]]]:
    system = tokenizer.encode("You are an agent with tools add and mul. Reply with one JSON call. " * 3)
    return system, [system + tokenizer.encode(f"Task {k}: " + "add the numbers " * (1 + 3 * k)) for k in range(n)]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_shared_prefix_attention_equals_full_attention(model, tokenizer, temperature, overlap):
    system, prompts = _shared_prompts(tokenizer, 4)
    assert len(system) >= 32  # long enough for the decode steps to read it once
    requests = [EngineRequest(p, 12, temperature=temperature, seed=i) for i, p in enumerate(prompts)]
    shared = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=4).generate(requests)
    full = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=4, shared_prefix_attention=False).generate(
        requests
    )
    for prompt, a, b in zip(prompts, shared, full):
        # the two differ by float rounding only: the same greedy tokens; sampled ones can part at a
        # token whose probability sits on a draw's boundary (the tiny model's are nearly flat)
        if temperature == 0:
            assert a.ids == b.ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        for result in (a, b):
            assert result.logprobs == pytest.approx(_teacher_forced(model, prompt, result.ids, temperature), abs=1e-4)
    assert model.config._attn_implementation == "sdpa"  # the engine's decode attention was only borrowed


def _assert_each_row_attends_its_own_slots(out, query, key, value, lengths) -> None:
    """`out` (rows, 1, heads, dim) is each row's query against its slots 0..lengths[r], one plain softmax."""
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[-1]
    for r in range(query.shape[0]):
        k = key[r, :, : lengths[r] + 1].repeat_interleave(heads // kv_heads, dim=0)
        v = value[r, :, : lengths[r] + 1].repeat_interleave(heads // kv_heads, dim=0)
        weights = torch.softmax(query[r] @ k.transpose(-1, -2) / dim**0.5, dim=-1)
        assert torch.allclose(out[r, 0], (weights @ v)[:, 0], atol=1e-5)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "fused-runs"])
def test_decode_attention_kernels_give_the_greedy_tokens_of_the_full_attention(model, tokenizer, compiled):
    from harnessrl.models import decode_kernel

    if compiled and not decode_kernel.available():
        pytest.skip("numba is not installed")
    system, prompts = _shared_prompts(tokenizer, 4)
    prompts[2] = prompts[2] + tokenizer.encode(" and then the rest" * 30)  # rows far apart in length
    requests = [EngineRequest(p, 10, temperature=0.0, seed=i) for i, p in enumerate(prompts)]
    engine = Engine(model, tokenizer, overlap_prefill=False, max_batch=4)
    engine.compiled_attention = compiled
    full = Engine(model, tokenizer, overlap_prefill=False, max_batch=4, shared_prefix_attention=False)
    for a, b in zip(engine.generate(requests), full.generate(requests)):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_compiled_kernel_that_computes_wrong_is_not_used(monkeypatch):
    numba = pytest.importorskip("numba")
    from harnessrl.models import decode_kernel

    def wrong(*args, **kwargs):  # compiles to a kernel that leaves its outputs at zero
        def compile(fn):
            return lambda q, k, v, counts, start, scale, out, lse: (out.fill(0), lse.fill(0))

        return compile

    monkeypatch.setattr(numba, "njit", wrong)
    with pytest.warns(UserWarning, match="not used: the compiled kernel gave wrong results"):
        assert decode_kernel._compiled.__wrapped__() is None


def test_a_plan_for_the_compiled_kernel_leaves_other_dtypes_to_the_models_own_attention():
    from harnessrl.models.attention import decode_plan, engine_attention, make_plan

    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([5, 9])
    query = torch.randn(2, 4, 1, 8, generator=gen, dtype=torch.bfloat16)
    key, value = torch.randn(2, 2, 2, 10, 8, generator=gen, dtype=torch.bfloat16)
    mask = (torch.arange(10) <= lengths.unsqueeze(1)).view(2, 1, 1, 10)
    module = SimpleNamespace(num_key_value_groups=2, training=False)
    holder = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    additive = torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))
    with decode_plan(holder, make_plan(lengths, 10, 0, "eager", kernel=True)):
        out, _ = engine_attention(module, query, key, value, additive, scaling=8**-0.5)
    for r in range(2):  # the model's eager attention over the row's slots
        k = key[r, :, : lengths[r] + 1].repeat_interleave(2, dim=0).float()
        v = value[r, :, : lengths[r] + 1].repeat_interleave(2, dim=0).float()
        weights = torch.softmax(query[r].float() @ k.transpose(-1, -2) / 8**0.5, dim=-1)
        assert torch.allclose(out[r, 0].float(), (weights @ v)[:, 0], atol=2e-2)


def test_rows_of_very_different_lengths_are_read_in_runs_of_their_own_width():
    from harnessrl.models.attention import plan_runs

    assert plan_runs([100, 100, 100]) == ((0, 3),)  # equal rows: one call, nothing padded
    assert plan_runs([10, 12, 9]) == ((0, 3),)  # padding cheaper than another call
    assert plan_runs([20, 600, 30]) == ((0, 1), (1, 2), (2, 3))  # the long row alone
    assert plan_runs([20, 25, 600, 590]) == ((0, 2), (2, 4))
    runs = plan_runs([40, 900, 35, 880, 50], call_cost=0)
    assert runs == tuple((r, r + 1) for r in range(5))  # free calls: every row its own


@pytest.mark.parametrize("shared", [0, 40])
def test_decode_attention_in_runs_equals_one_padded_softmax(shared):
    from harnessrl.models.attention import _FUSED, decode_plan, engine_attention, make_plan

    if _FUSED is None:
        pytest.skip("this torch has no fused CPU attention kernel")
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([60, 700, 75, 690, 64])  # row r attends to slots 0..lengths[r]
    rows, heads, kv_heads, dim, kv_len = 5, 6, 2, 16, int(lengths.max()) + 1
    key = torch.randn(rows, kv_heads, kv_len, dim, generator=gen)
    value = torch.randn(rows, kv_heads, kv_len, dim, generator=gen)
    key[:, :, :shared], value[:, :, :shared] = key[:1, :, :shared], value[:1, :, :shared]
    query = torch.randn(rows, heads, 1, dim, generator=gen)
    plan = make_plan(lengths, kv_len, shared, "sdpa")
    assert len(plan.runs) > 1  # the short rows are not read at the long rows' width
    holder = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))
    with decode_plan(holder, plan):
        out, _ = engine_attention(None, query, key, value, None)
    _assert_each_row_attends_its_own_slots(out, query, key, value, lengths)


@pytest.mark.parametrize("shared", [0, 40])
def test_compiled_decode_attention_equals_a_softmax_over_each_rows_own_slots(shared):
    from harnessrl.models import decode_kernel
    from harnessrl.models.attention import decode_plan, engine_attention, make_plan

    if not decode_kernel.available():
        pytest.skip("numba is not installed")
    gen = torch.Generator().manual_seed(1)
    lengths = torch.tensor([60, 700, 75, 690, 64])  # row r attends to slots 0..lengths[r]
    rows, heads, kv_heads, dim, capacity = 5, 6, 2, 16, 768
    # slots of a batch cache: a slice of a wider buffer, as the engine hands them over
    buf = torch.randn(2, rows, kv_heads, capacity, dim, generator=gen)
    buf[:, :, :, :shared] = buf[:, :1, :, :shared].clone()
    key, value = buf[0, :, :, : int(lengths.max()) + 1], buf[1, :, :, : int(lengths.max()) + 1]
    query = torch.randn(rows, heads, 1, dim, generator=gen)
    plan = make_plan(lengths, key.shape[2], shared, "sdpa", kernel=True)
    assert plan.own.tolist() == (lengths + 1 - shared).tolist() and plan.runs == ()
    holder = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))
    with decode_plan(holder, plan):
        out, _ = engine_attention(None, query, key, value, None)
    _assert_each_row_attends_its_own_slots(out, query, key, value, lengths)


def test_the_compiled_kernel_gives_a_row_the_same_floats_whatever_else_is_in_the_batch():
    from harnessrl.models import decode_kernel

    if not decode_kernel.available():
        pytest.skip("numba is not installed")
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(4, 3, 3, 64, generator=gen)
    key, value = torch.randn(2, 4, 3, 512, 64, generator=gen)
    counts = np.array([300, 20, 511, 7])
    out, lse = decode_kernel.own_attention(q, key, value, counts, 1, 0.125)
    for r in range(4):
        alone, alone_lse = decode_kernel.own_attention(
            q[r : r + 1], key[r : r + 1], value[r : r + 1], counts[r : r + 1], 1, 0.125
        )
        assert torch.equal(alone[0], out[r]) and torch.equal(alone_lse[0], lse[r])
    reference = torch.logsumexp(q[3] @ key[3, :, 1:8].transpose(-1, -2) * 0.125, dim=-1)
    assert torch.allclose(lse[3], reference, atol=1e-5)
    for bad in ([300, 20, 512, 7], [300, 0, 5, 7]):  # past the cache's slots; a row of none
        with pytest.raises(ValueError, match="cache slots"):
            decode_kernel.own_attention(q, key, value, np.array(bad), 1, 0.125)
    with pytest.raises(ValueError, match="3 counts for 4 rows"):
        decode_kernel.own_attention(q, key, value, np.array([1, 2, 3]), 1, 0.125)


def test_decode_plans_are_made_where_the_keys_are_and_only_a_cpu_takes_the_fused_kernel():
    from harnessrl.models.attention import _FUSED, make_plan, uses_compiled_kernel, uses_fused_kernel

    lengths = torch.tensor([40, 90])
    plan = make_plan(lengths, 91, 0, "sdpa", device=torch.device("meta"))  # stands in for a GPU
    assert plan.mask.device.type == "meta" and plan.bias.device.type == "meta"
    assert all(bias is None or bias.device.type == "meta" for *_, bias in plan.runs)
    assert make_plan(lengths, 91, 0, "sdpa", runs=False).runs == ()
    assert not uses_fused_kernel(torch.float32, torch.device("cuda"))  # a CPU-only kernel
    assert not uses_fused_kernel(torch.bfloat16, torch.device("cpu"))
    assert uses_fused_kernel(torch.float32, torch.device("cpu")) == (_FUSED is not None)
    assert not uses_compiled_kernel(torch.float32, torch.device("cuda"))
    assert not uses_compiled_kernel(torch.bfloat16, torch.device("cpu"))


def test_a_request_on_the_prefill_thread_can_be_cancelled_and_waits_for_pauses(model, tokenizer):
    prompts = _prompts(tokenizer, 3, base="Beside")
    prompts[1] = tokenizer.encode("a long task statement " * 40)  # > 64 tokens: a few steps of prefill
    engine = Engine(model, tokenizer, max_batch=4, overlap_prefill=True)
    first = engine.submit(prompts[0], 12)
    engine.step()  # prefilled inline: nothing was decoding
    second, third = engine.submit(prompts[1], 12), engine.submit(prompts[2], 4)
    engine.step()  # second goes to the prefill thread while first decodes; third, with so few rows
    # decoding, is prefilled on the engine thread meanwhile
    assert engine._inflight is not None and engine._inflight.req.future is second
    assert [r.future for r in engine._rows] == [first, third]
    with engine.paused():  # training may use the model now: no prefill is running
        assert engine._inflight.future.done()
    assert engine.cancel(second)
    engine.run_until_done()
    with pytest.raises(CancelledError):
        second.result()
    assert len(first.result().ids) == 12 and len(third.result().ids) == 4
    assert engine.stats().prefills_overlapped == 1 and engine.stats().cancelled == 1


def test_closing_with_a_prefill_in_flight_fails_it(model, tokenizer):
    prompts = [_prompts(tokenizer, 1, base="Closing")[0], tokenizer.encode("a long task statement " * 40)]
    engine = Engine(model, tokenizer, max_batch=4, overlap_prefill=True)
    first = engine.submit(prompts[0], 30)
    engine.step()
    second = engine.submit(prompts[1], 30)
    engine.step()
    assert engine._inflight is not None
    engine.close()
    for future in (first, second):
        with pytest.raises(EngineClosed):
            future.result()
    assert not engine.has_work()


def test_the_prefill_thread_default_follows_the_environment(model, tokenizer, monkeypatch):
    monkeypatch.setenv("HARNESSRL_PREFILL_THREAD", "0")
    assert Engine(model, tokenizer).overlap_prefill is False
    monkeypatch.setenv("HARNESSRL_PREFILL_THREAD", "1")
    assert Engine(model, tokenizer).overlap_prefill is True
    assert Engine(model, tokenizer, overlap_prefill=False).overlap_prefill is False  # the argument wins
    monkeypatch.setenv("HARNESSRL_PREFILL_THREAD", "yes")
    with pytest.raises(ValueError, match="HARNESSRL_PREFILL_THREAD must be 0 or 1"):
        Engine(model, tokenizer)


@pytest.mark.skipif(not packed.available(), reason="this torch build has no oneDNN prepacked linear")
def test_packed_forwards_stay_while_any_engine_forward_holds_them_and_only_engine_forwards_use_them():
    """A prefill on the prefill thread and a decode step overlap: the packed forwards stay until
    the last of them releases; a forward outside the engine meanwhile gets the plain product."""
    model = tiny_random_model()
    layers = packed.PackedLinears(model, rows=4)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        plain = model(ids).logits
        layers.acquire()  # a prefill launched on the other thread
        with layers.swapped_in():  # a decode step meanwhile
            assert all("forward" in m.__dict__ for m in layers.linears)
        assert all("forward" in m.__dict__ for m in layers.linears)  # the prefill still runs
        assert torch.equal(model(ids).logits, plain)  # not an engine forward: the plain products
        with packed.engine_forward():
            assert torch.allclose(model(ids).logits, plain, atol=1e-5)
        layers.release()
    assert all("forward" not in m.__dict__ for m in layers.linears)


@pytest.mark.skipif(not packed.available(), reason="this torch build has no oneDNN prepacked linear")
def test_packed_decode_weights_match_the_plain_products_and_follow_weight_changes(tokenizer):
    model = tiny_random_model()
    system, prompts = _shared_prompts(tokenizer, 3)
    requests = [EngineRequest(p, 10, temperature=0.8, seed=i) for i, p in enumerate(prompts)]
    on = Engine(model, tokenizer, max_batch=4, packed_decode=True)
    off = Engine(model, tokenizer, max_batch=4, packed_decode=False)
    assert on._packed is not None and off._packed is None
    for prompt, result in zip(prompts, on.generate(requests)):
        assert result.logprobs == pytest.approx(_teacher_forced(model, prompt, result.ids, 0.8), abs=1e-4)
    greedy = [EngineRequest(p, 10) for p in prompts]
    assert [r.ids for r in on.generate(greedy)] == [r.ids for r in off.generate(greedy)]
    made = on._packed.packs_made
    assert made == len(on._packed.linears)  # packed once, reused by every later step
    assert all("forward" not in m.__dict__ for m in on._packed.linears)  # swapped in only during a step
    with torch.no_grad():  # an optimizer step: the packed copies must follow
        for p in model.parameters():
            p.mul_(1.5)
    for prompt, result in zip(prompts, on.generate(requests)):
        assert result.logprobs == pytest.approx(_teacher_forced(model, prompt, result.ids, 0.8), abs=1e-4)
    assert on._packed.packs_made == 2 * made
    # a `.data` assignment keeps the weight's identity and version: clear_cache() repacks
    for p in model.parameters():
        p.data = p.data * 0.5
    on.clear_cache()
    for prompt, result in zip(prompts, on.generate(requests)):
        assert result.logprobs == pytest.approx(_teacher_forced(model, prompt, result.ids, 0.8), abs=1e-4)


def test_packed_decode_is_on_by_default_for_small_float32_cpu_models_only(tokenizer, monkeypatch):
    model = tiny_random_model()
    monkeypatch.delenv("HARNESSRL_PACKED_DECODE", raising=False)
    assert (Engine(model, tokenizer)._packed is not None) == packed.available()
    half = tiny_random_model().to(torch.bfloat16)
    assert Engine(half, tokenizer)._packed is None
    # a model whose packed copy would cost more than the default cap stays plain unless asked
    monkeypatch.setattr(packed, "DEFAULT_MAX_BYTES", packed.linear_bytes(model) - 1)
    assert Engine(model, tokenizer)._packed is None
    monkeypatch.setenv("HARNESSRL_PACKED_DECODE", "1")
    assert (Engine(model, tokenizer)._packed is not None) == packed.available()
    monkeypatch.setenv("HARNESSRL_PACKED_DECODE", "0")
    monkeypatch.setattr(packed, "DEFAULT_MAX_BYTES", 2 * 1024**3)
    assert Engine(model, tokenizer)._packed is None
    monkeypatch.setenv("HARNESSRL_PACKED_DECODE", "on")
    with pytest.raises(ValueError, match="HARNESSRL_PACKED_DECODE must be 0 or 1"):
        Engine(model, tokenizer)


def _kv(n: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((2, 2, 1, n, 3), fill)


def test_prefix_cache_lru_eviction_keeps_the_budget_and_locked_nodes():
    cache = PrefixCache(budget_tokens=10)
    a = cache.insert([1, 2, 3, 4], _kv(4, 1.0))
    cache.insert([5, 6, 7], _kv(3, 2.0))
    assert cache.tokens == 7
    cache.match([1, 2, 3, 4, 9])  # a is now more recent than [5, 6, 7]
    cache.insert([8, 9, 10, 11], _kv(4, 3.0))  # 11 > 10: the least recently used leaf goes
    assert cache.tokens == 8 and cache.evictions == 1 and cache.evicted_tokens == 3
    assert cache.match([5, 6, 7]).length == 0
    assert cache.match([1, 2, 3, 4]).length == 4
    cache.lock(a)
    cache.insert([20, 21, 22, 23, 24, 25, 26, 27, 28], _kv(9, 4.0))  # [8..11] evicted, a locked
    assert cache.match([1, 2, 3, 4]).length == 4
    assert cache.match([8, 9]).length == 0
    assert cache.tokens <= 10
    assert cache.match([20, 21, 22, 23, 24, 25, 26, 27, 28]).length == 6  # cut to what fits
    cache.unlock(a)
    cache.insert([30, 31, 32, 33, 34, 35, 36, 37], _kv(8, 5.0))
    assert cache.tokens <= 10 and cache.match([1, 2, 3, 4]).length == 0


def test_prefix_cache_shares_prefixes_and_splits_nodes():
    cache = PrefixCache(budget_tokens=100)
    kv = torch.arange(6, dtype=torch.float).view(1, 1, 1, 6, 1).expand(2, 2, 1, 6, 1).contiguous()
    cache.insert([1, 2, 3, 4, 5, 6], kv)
    cache.insert([1, 2, 3, 9], torch.full((2, 2, 1, 4, 1), -1.0))
    assert cache.tokens == 7  # [1,2,3] stored once, then [4,5,6] and [9]
    match = cache.match([1, 2, 3, 9, 9, 9])
    assert match.length == 4
    values = torch.cat([node.kv[:, :, :, :take] for node, take in match.pieces], dim=3)
    assert values[0, 0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, -1.0]
    assert cache.match([1, 2, 3, 4, 5, 6], limit=5).length == 5


def test_engine_cache_stays_within_budget_and_evicts(model, tokenizer):
    budget = 60
    engine = Engine(model, tokenizer, max_batch=2, cache_budget_tokens=budget)
    for k in range(6):
        engine.generate([EngineRequest(tokenizer.encode(f"Episode {k}: " + "walk the dog " * 6), 4)])
        assert engine.stats().cache_tokens <= budget
    stats = engine.stats()
    assert stats.evictions > 0 and stats.evicted_tokens > 0


def test_a_bad_request_fails_only_itself(model, tokenizer):
    engine = Engine(model, tokenizer, max_batch=4, max_context=40)
    good = _prompts(tokenizer, 2, base="Good")
    good = [p[:20] for p in good]
    requests = [
        EngineRequest(good[0], 5),
        EngineRequest([], 5),
        EngineRequest(list(range(200, 245)), 5),  # longer than the context of 40
        EngineRequest([engine.vocab_size + 3], 5),
        EngineRequest(good[1], 0),
        EngineRequest(good[1], 5, top_p=0.0),
        EngineRequest(good[1], 5, temperature=-1.0),
        EngineRequest(good[1], 5),
    ]
    results = engine.generate(requests, return_exceptions=True)
    assert [type(r).__name__ for r in results] == ["EngineCompletion"] + ["ValueError"] * 6 + ["EngineCompletion"]
    assert "empty prompt" in str(results[1])
    assert "context" in str(results[2])
    assert "vocabulary" in str(results[3])
    alone = Engine(model, tokenizer).generate([EngineRequest(good[1], 5)])[0]
    assert results[-1].ids == alone.ids
    assert engine.stats().failed == 6
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate(requests[:2])


def test_a_request_stops_at_the_model_context(model, tokenizer):
    engine = Engine(model, [], max_context=30)
    prompt = _prompts(tokenizer, 6)[5][:27]
    assert len(prompt) == 27
    result = engine.generate([EngineRequest(prompt, 10)])[0]
    assert len(result.ids) == 3 and result.finish_reason == "length"


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_failing_prefill_fails_only_that_request(model, tokenizer, monkeypatch, overlap):
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=4, cache_budget_tokens=0)
    prompts = _prompts(tokenizer, 3, base="Boom")
    real_forward = engine.runner.forward

    def forward(input_ids, positions, mask, cache):
        if input_ids.shape[1] == len(prompts[1]):
            raise RuntimeError("out of memory")
        return real_forward(input_ids, positions, mask, cache)

    monkeypatch.setattr(engine.runner, "forward", forward)
    results = engine.generate([EngineRequest(p, 4) for p in prompts], return_exceptions=True)
    assert isinstance(results[1], RuntimeError) and "out of memory" in str(results[1])
    assert [len(r.ids) for r in (results[0], results[2])] == [4, 4]
    assert not engine.has_work()


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_cancel_waiting_and_running_requests(model, tokenizer, overlap):
    prompts = _prompts(tokenizer, 3, base="Cancel")
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=1)
    running = engine.submit(prompts[0], 50)
    waiting = engine.submit(prompts[1], 5)
    kept = engine.submit(prompts[2], 5)
    engine.step()
    assert engine.cancel(waiting) and waiting.cancelled()
    assert engine.cancel(running)
    engine.run_until_done()
    with pytest.raises(CancelledError):
        running.result()
    assert len(kept.result().ids) == 5
    assert not engine.cancel(kept)
    assert engine.stats().cancelled == 2


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_weights_changed_in_place_drop_the_prefix_cache(tokenizer, overlap):
    model = tiny_random_model()
    prompt = _prompts(tokenizer, 1, base="Weights")[0]
    engine = Engine(model, tokenizer, overlap_prefill=overlap)
    first = engine.generate([EngineRequest(prompt, 6)])[0]
    follow_up = prompt + first.ids + tokenizer.encode(" next")
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.1)  # what an optimizer step does: in place
    after = engine.generate([EngineRequest(follow_up, 6)])[0]
    assert after.cached_tokens == 0
    assert engine.stats().cache_clears == 1
    fresh = Engine(model, tokenizer, overlap_prefill=overlap, cache_budget_tokens=0).generate(
        [EngineRequest(follow_up, 6)]
    )[0]
    assert after.ids == fresh.ids


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_background_thread_serves_many_callers(model, tokenizer, overlap):
    prompts = _prompts(tokenizer, 6, base="Thread")
    requests = [EngineRequest(p, 7, temperature=0.8, seed=i) for i, p in enumerate(prompts)]
    expected = [
        Engine(model, tokenizer, overlap_prefill=overlap, cache_budget_tokens=0).generate([r])[0].ids for r in requests
    ]
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=3).start()
    got: dict[int, list[int]] = {}

    def episode(i: int) -> None:
        got[i] = engine.submit_request(requests[i]).result(timeout=60).ids

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [got[i] for i in range(len(requests))] == expected
    assert engine.generate(requests[:2], timeout=60)[1].ids == expected[1]
    engine.run_until_done()
    engine.close()
    with pytest.raises(EngineClosed):
        engine.submit(prompts[0], 3).result()


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlap"])
def test_close_fails_pending_requests(model, tokenizer, overlap):
    engine = Engine(model, tokenizer, overlap_prefill=overlap, max_batch=1)
    running = engine.submit(_prompts(tokenizer, 1)[0], 30)
    waiting = engine.submit(_prompts(tokenizer, 1)[0], 30)
    engine.step()
    engine.close()
    for f in (running, waiting):
        with pytest.raises(EngineClosed):
            f.result(timeout=5)


def test_a_model_in_train_mode_generates_in_eval_mode_and_stays_in_train_mode(tokenizer):
    model = tiny_random_model()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5  # would change every forward if left on
    prompt = _prompts(tokenizer, 1, base="Mode")[0]
    expected = Engine(model, tokenizer).generate([EngineRequest(prompt, 8)])[0]
    model.train()
    got = Engine(model, tokenizer).generate([EngineRequest(prompt, 8)])[0]
    assert model.training
    # (up to float rounding: in train mode the engine runs every forward on its own thread, one
    # intra-op thread each, in eval mode it may prefill beside a step or borrow the idle core)
    assert got.ids == expected.ids and got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_sampler_draws_from_the_tempered_nucleus_distribution(top_p):
    """The exponential race is an exact draw: over many seeds each token comes up as often as
    its probability under softmax(z / T), restricted to the top_p nucleus and renormalised; the
    recorded log-probability is the untruncated one."""
    from harnessrl.models.sampling import generator, sample

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    temperature = 0.7
    logp = torch.log_softmax(logits / temperature, dim=-1)
    probs = logp.exp()
    keep = (torch.cumsum(probs, 0) - probs) < top_p  # sorted already: the nucleus is a prefix
    want = torch.where(keep, probs, 0.0) / probs[keep].sum()
    draws = 20000
    counts = torch.zeros(len(logits))
    for seed in range(draws):
        token, recorded = sample(logits, temperature, top_p, generator(seed, temperature))
        counts[token] += 1
        assert recorded == pytest.approx(float(logp[token]), abs=1e-6)
    assert counts[~keep].sum() == 0
    # 4 standard deviations of a binomial frequency (the seeds are fixed, so the test is too)
    tolerance = 4 * torch.sqrt(want * (1 - want) / draws) + 1e-9
    assert torch.all((counts / draws - want).abs() <= tolerance), (counts / draws, want)
