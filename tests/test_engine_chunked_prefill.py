"""Chunked prefill: a long prompt admitted while more than 4 rows decode is prefilled a chunk per
engine step, the running rows decoding between its chunks, with the tokens and log-probabilities
of a prefill in one piece."""

from __future__ import annotations

import math
from concurrent.futures import CancelledError

import pytest
import torch
from test_engine import _generate_alone, _prompts, _teacher_forced

from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineRequest
from harnessrl.models.engine_config import PREFILL_CHUNK_TOKENS, EngineConfig

CHUNK = 16
ROWS = 5  # running rows: more than the scheduler's few_rows (4), below which prompts are prefilled whole


@pytest.fixture(scope="module")
def model():
    return tiny_random_model()


def _long_prompt(tokenizer) -> list[int]:
    prompt = tokenizer.encode("a long task statement with many words " * 12)
    assert len(prompt) > 4 * CHUNK
    return prompt


def _engine(model, tokenizer, **kw) -> Engine:
    kw.setdefault("cache_budget_tokens", 0)
    return Engine(model, tokenizer, max_batch=8, overlap_prefill=False, prefill_chunk_tokens=CHUNK, **kw)


def _running(engine, tokenizer, max_new: int, base: str = "Running") -> list:
    """ROWS requests decoding (prefilled whole: they were admitted beside few rows)."""
    futures = [engine.submit(p, max_new) for p in _prompts(tokenizer, ROWS, base=base)]
    engine.step()
    assert len(engine._rows) == ROWS and engine.stats().prefills_chunked == 0
    return futures


def test_a_long_prompt_is_prefilled_a_chunk_per_step_while_the_rows_keep_decoding(model, tokenizer):
    short = _prompts(tokenizer, ROWS, base="Running")
    long = _long_prompt(tokenizer)
    chunks = math.ceil(len(long) / CHUNK)
    engine = _engine(model, tokenizer)
    tokens: dict[int, list[int]] = {i: [] for i in range(ROWS + 1)}

    def counter(i):
        return lambda token, logprob: tokens[i].append(token)

    running = [engine.submit(p, 40, on_token=counter(i)) for i, p in enumerate(short)]
    engine.step()  # all prefilled whole (at most few rows were decoding), one decode step
    assert engine.stats().prefills_chunked == 0
    c = engine.submit(long, 6, on_token=counter(ROWS))
    before = len(tokens[0])
    for k in range(1, chunks):  # the first chunks: the rows decode one token per step meanwhile
        engine.step()
        assert all(len(tokens[i]) == before + k for i in range(ROWS))
        assert tokens[ROWS] == [] and engine._chunked is not None
    engine.step()  # the last chunk: it joins and takes part in this step's decode
    assert engine._chunked is None and len(tokens[ROWS]) == 2
    engine.run_until_done()
    stops = sorted(engine.stop_ids)
    for prompt, future, limit in [*((p, f, 40) for p, f in zip(short, running)), (long, c, 6)]:
        result = future.result()
        assert result.ids == _generate_alone(model, prompt, limit, stops)
        assert result.logprobs == pytest.approx(_teacher_forced(model, prompt, result.ids, 0.0), abs=1e-4)
    stats = engine.stats()
    assert stats.prefills_chunked == 1 and stats.prefill_chunks == chunks
    assert stats.prefilled_tokens == len(long) + sum(map(len, short))


def test_beside_few_rows_a_long_prompt_is_prefilled_whole(model, tokenizer):
    engine = _engine(model, tokenizer)
    futures = [engine.submit(p, 10) for p in _prompts(tokenizer, 4, base="Few")]
    engine.step()
    long = engine.submit(_long_prompt(tokenizer), 4)
    engine.step()
    assert engine._chunked is None and len(engine._rows) == 5
    engine.run_until_done()
    assert all(len(f.result().ids) == 10 for f in futures) and len(long.result().ids) == 4
    assert engine.stats().prefills_chunked == 0


def test_a_prompt_with_nothing_decoding_beside_it_is_prefilled_whole(model, tokenizer):
    long = _long_prompt(tokenizer)
    engine = _engine(model, tokenizer)
    result = engine.generate([EngineRequest(long, 5)])[0]
    assert result.ids == _generate_alone(model, long, 5, sorted(engine.stop_ids))
    assert engine.stats().prefills_chunked == 0


def test_chunks_read_the_prefix_cache_and_sample_what_a_whole_prefill_samples(model, tokenizer):
    """The second episode turn shares the first one's prompt: its chunks start after the cached
    prefix, and a seeded sample is the one the engine draws without chunks."""
    long = _long_prompt(tokenizer)
    turn2 = long + tokenizer.encode(" and then some more words to read " * 4)
    sampled = EngineRequest(turn2, 8, temperature=0.9, seed=5)
    whole = Engine(model, tokenizer, overlap_prefill=False, prefill_chunk_tokens=0).generate([sampled])[0]
    engine = _engine(model, tokenizer, cache_budget_tokens=4096)
    engine.generate([EngineRequest(long, 2)])  # cached
    first = _running(engine, tokenizer, 30, base="Beside")
    second = engine.submit_request(sampled)
    engine.run_until_done()
    got = second.result()
    assert got.ids == whole.ids and got.logprobs == pytest.approx(whole.logprobs, abs=1e-4)
    assert got.cached_tokens >= len(long) - 1
    stats = engine.stats()
    assert stats.prefills_chunked == 1
    assert stats.prefill_chunks == math.ceil((len(turn2) - got.cached_tokens) / CHUNK)
    assert all(len(f.result().ids) == 30 for f in first)


def test_a_request_cancelled_between_its_chunks_leaves_and_the_rows_go_on(model, tokenizer):
    engine = _engine(model, tokenizer)
    running = _running(engine, tokenizer, 12)
    long = engine.submit(_long_prompt(tokenizer), 12)
    engine.step()
    assert engine._chunked is not None
    assert engine.cancel(long)
    engine.run_until_done()
    with pytest.raises(CancelledError):
        long.result()
    assert all(len(f.result().ids) == 12 for f in running)
    assert engine.stats().cancelled == 1 and not engine.has_work()


def test_weights_changed_between_chunks_start_the_prefill_again_with_the_new_weights(tokenizer):
    model = tiny_random_model()
    engine = _engine(model, tokenizer)
    running = _running(engine, tokenizer, 20)
    prompt = _long_prompt(tokenizer)
    long = engine.submit(prompt, 6)
    engine.step()
    assert engine._chunked is not None and engine._chunked.chunks == 1
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)  # in place: the engine sees new weights at its next step
    engine.run_until_done()
    assert long.result().ids == _generate_alone(model, prompt, 6, sorted(engine.stop_ids))
    assert all(len(f.result().ids) == 20 for f in running)


def test_a_failing_chunk_fails_only_its_request(model, tokenizer, monkeypatch):
    engine = _engine(model, tokenizer)
    running = _running(engine, tokenizer, 10)
    long = engine.submit(_long_prompt(tokenizer), 6)
    engine.step()
    real = engine.runner.prefill_chunk

    def broken(job, tokens, *, borrow):
        if job.chunks >= 2:
            raise RuntimeError("out of memory")
        return real(job, tokens, borrow=borrow)

    monkeypatch.setattr(engine.runner, "prefill_chunk", broken)
    engine.run_until_done()
    with pytest.raises(Exception, match="prefill failed: RuntimeError: out of memory"):
        long.result()
    assert all(len(f.result().ids) == 10 for f in running) and not engine.has_work()


def test_chunks_are_off_unless_asked_for(monkeypatch, model, tokenizer):
    monkeypatch.delenv("HARNESSRL_PREFILL_CHUNK", raising=False)
    assert EngineConfig.from_env().prefill_chunk_tokens == 0
    assert Engine(model, tokenizer, overlap_prefill=False).prefill_chunk_tokens == 0
    monkeypatch.setenv("HARNESSRL_PREFILL_CHUNK", "on")
    assert Engine(model, tokenizer, overlap_prefill=False).prefill_chunk_tokens == PREFILL_CHUNK_TOKENS
    monkeypatch.setenv("HARNESSRL_PREFILL_CHUNK", "64")
    assert Engine(model, tokenizer, overlap_prefill=True).prefill_chunk_tokens == 64
    assert Engine(model, tokenizer, prefill_chunk_tokens=0).prefill_chunk_tokens == 0  # the argument wins
    for bad in ("many", "-3"):
        monkeypatch.setenv("HARNESSRL_PREFILL_CHUNK", bad)
        with pytest.raises(ValueError, match="HARNESSRL_PREFILL_CHUNK"):
            Engine(model, tokenizer, overlap_prefill=False)
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        Engine(model, tokenizer, prefill_chunk_tokens=-1)
