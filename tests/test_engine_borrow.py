"""Borrowing the idle prefill core (harnessrl.models.forward_runner.CoreGauge): decode steps measure
whether a second intra-op thread pays, prefills follow once a probe has confirmed it, and the
tokens never depend on the verdict."""

from __future__ import annotations

import time

import pytest

from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineRequest
from harnessrl.models.forward_runner import CoreGauge


def _steps(gauge: CoreGauge, count: int, rows: int, borrowed_s: float, alone_s: float) -> list[bool]:
    """`count` decode steps that may borrow, each taking `borrowed_s` borrowed and `alone_s` on
    one thread; which of them borrowed."""
    ways = []
    for _ in range(count):
        way = gauge.choose(rows)
        gauge.record(rows, way, borrowed_s if way else alone_s)
        ways.append(way)
    return ways


def test_a_core_that_slows_the_steps_is_given_up_after_one_probe():
    gauge = CoreGauge()
    assert gauge.verdict and not gauge.prefills_borrow()  # no prefill borrows before a probe compared
    ways = _steps(gauge, CoreGauge.FIRST_BACKOFF + CoreGauge.PROBE_STEPS, rows=5, borrowed_s=1.0, alone_s=0.2)
    assert ways == [True] * CoreGauge.FIRST_BACKOFF + [False] * CoreGauge.PROBE_STEPS
    assert not gauge.verdict and gauge.switches == 1 and gauge.probes == 1
    assert not gauge.prefills_borrow()
    # it asks again later: a borrowed probe that is now fast wins the core back
    ways = _steps(gauge, CoreGauge.FIRST_BACKOFF + CoreGauge.PROBE_STEPS, rows=5, borrowed_s=0.1, alone_s=0.2)
    assert ways == [False] * CoreGauge.FIRST_BACKOFF + [True] * CoreGauge.PROBE_STEPS
    assert gauge.verdict and gauge.switches == 2 and gauge.prefills_borrow()


def test_a_verdict_that_keeps_winning_is_asked_twice_as_late_each_time():
    gauge = CoreGauge()
    ways = _steps(gauge, 200, rows=3, borrowed_s=0.1, alone_s=0.2)
    probes = [i for i, way in enumerate(ways) if not way]
    # the probes' first steps: after 8 steps, then 16, then 32 ... steps of the verdict
    firsts = [p for p in probes if p - 1 not in probes]
    gaps = [b - a - CoreGauge.PROBE_STEPS for a, b in zip(firsts, firsts[1:])]
    assert firsts[0] == CoreGauge.FIRST_BACKOFF
    assert gaps == [2 * CoreGauge.FIRST_BACKOFF * 2**k for k in range(len(gaps))]
    assert gauge.verdict and gauge.switches == 0 and gauge.prefills_borrow()


def test_a_small_difference_does_not_move_the_verdict():
    gauge = CoreGauge()
    _steps(gauge, 40, rows=4, borrowed_s=0.2, alone_s=0.19)  # within the margin
    assert gauge.verdict and gauge.switches == 0 and gauge.probes >= 1


def test_a_probe_compares_steps_of_the_same_rows_only():
    gauge = CoreGauge()
    _steps(gauge, CoreGauge.FIRST_BACKOFF, rows=6, borrowed_s=1.0, alone_s=0.2)
    assert gauge.choose(6) is False  # the probe begins
    gauge.record(6, False, 0.2)
    # the rows change before its second step: that step runs the verdict's way and nothing is compared
    assert gauge.choose(7) is True
    gauge.record(7, True, 1.0)
    assert gauge.probes == 0 and gauge.verdict
    # tried again as soon as there are two steps of 7 rows to compare with: this one and the next
    ways = _steps(gauge, 1 + CoreGauge.PROBE_STEPS, rows=7, borrowed_s=1.0, alone_s=0.2)
    assert ways == [True] + [False] * CoreGauge.PROBE_STEPS
    assert not gauge.verdict and gauge.probes == 1


def test_borrowed_steps_that_run_slow_are_given_up_and_the_tokens_stay_the_same(tokenizer, monkeypatch):
    """On a machine whose cores are busy a borrowed step is slower (here: made so); the engine
    stops borrowing for its decode steps, and samples the same tokens as an engine that never
    borrows."""
    model = tiny_random_model()
    prompts = [tokenizer.encode(f"Task {k}: " + "count the apples " * (3 + k)) for k in range(3)]
    requests = [EngineRequest(p, 24, temperature=0.8, seed=k, stop_ids=[]) for k, p in enumerate(prompts)]
    engine = Engine(model, tokenizer, max_batch=3, overlap_prefill=True)
    runner = engine.runner
    real = runner._decode
    threads = []

    def slow_when_borrowed(lengths, last_tokens, shared, *, borrow):
        threads.append(borrow)
        if borrow:
            time.sleep(0.05)
        return real(lengths, last_tokens, shared, borrow=borrow)

    monkeypatch.setattr(runner, "_decode", slow_when_borrowed)
    results = engine.generate(requests)
    assert not runner.core.verdict and runner.core.switches == 1
    assert threads.count(True) <= CoreGauge.FIRST_BACKOFF + CoreGauge.PROBE_STEPS  # then on one thread
    alone = Engine(model, tokenizer, max_batch=3, overlap_prefill=False).generate(requests)
    for a, b in zip(results, alone):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
