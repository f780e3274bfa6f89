"""The engine's batch planner on its own: counts in, a step's plan out, no model (and no torch)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from harnessrl.models.batch_planner import (
    CHUNKED,
    FINISH_LENGTH,
    FINISH_STOP,
    INLINE,
    OVERLAP,
    BatchPlanner,
    BatchView,
    RequestState,
    check_request,
    finish_reason,
    shared_prefix,
)


def test_an_idle_engine_admits_inline_up_to_the_batch_and_then_decodes():
    plan = BatchPlanner(3).plan(BatchView(running=0, waiting=5))
    assert plan.admit == (INLINE, INLINE, INLINE) and plan.decode
    assert plan.cancel == () and not plan.land


def test_nothing_waiting_and_nothing_running_is_an_idle_step():
    plan = BatchPlanner(4).plan(BatchView(running=0))
    assert plan.admit == () and not plan.decode and not plan.land


def test_a_full_batch_admits_nobody_but_frees_cancelled_rows_first():
    planner = BatchPlanner(2)
    assert planner.plan(BatchView(running=2, waiting=3)).admit == ()
    plan = planner.plan(BatchView(running=2, waiting=3, cancelled=(1,)))
    assert plan.cancel == (1,) and plan.admit == (INLINE,) and plan.decode


def test_with_overlap_the_first_request_beside_decoding_rows_goes_to_the_prefill_thread():
    planner = BatchPlanner(8, few_rows=4)
    # nothing decodes: prefilled inline (nothing to overlap with), then the next beside it
    assert planner.plan(BatchView(running=0, waiting=2, may_overlap=True)).admit == (INLINE, OVERLAP)
    # few rows decode: one to the prefill thread, the rest inline while rows stay few
    few = planner.plan(BatchView(running=2, waiting=6, may_overlap=True)).admit
    assert few == (OVERLAP, INLINE, INLINE, INLINE)
    # many rows: only the one on the prefill thread
    assert planner.plan(BatchView(running=6, waiting=3, may_overlap=True)).admit == (OVERLAP,)
    # the prefill thread counts as a row of the batch
    assert planner.plan(BatchView(running=7, waiting=3, inflight_due=100, may_overlap=True)).admit == ()


def test_without_overlap_every_admission_is_inline():
    plan = BatchPlanner(8).plan(BatchView(running=3, waiting=9, may_overlap=False))
    assert plan.admit == (INLINE,) * 5


def test_a_request_being_chunked_holds_a_slot_and_admits_more_only_beside_few_rows():
    planner = BatchPlanner(6, few_rows=2)
    # 5 rows + the one being chunked fill a batch of 6
    assert planner.plan(BatchView(running=5, waiting=3, chunking=True)).admit == ()
    # many rows decode: nobody else is admitted until its last chunk ran
    assert planner.plan(BatchView(running=3, waiting=3, chunking=True)).admit == ()
    # few rows: inline admissions until the rows outnumber few_rows
    assert planner.plan(BatchView(running=1, waiting=3, chunking=True)).admit == (INLINE, INLINE)
    assert planner.plan(BatchView(running=3, waiting=3)).admit == (INLINE, INLINE, INLINE)


def test_with_chunks_on_one_request_beside_more_than_few_rows_is_chunked_and_the_prefill_thread_comes_first():
    chunked = BatchPlanner(6, few_rows=2, chunks=True)
    assert chunked.plan(BatchView(running=3, waiting=3)).admit == (CHUNKED,)
    # beside few rows prompts are prefilled whole until the rows outnumber few_rows
    assert chunked.plan(BatchView(running=2, waiting=3)).admit == (INLINE, CHUNKED)
    assert chunked.plan(BatchView(running=0, waiting=2)).admit == (INLINE, INLINE)
    # one at a time
    assert chunked.plan(BatchView(running=3, waiting=3, chunking=True)).admit == ()
    # a free prefill thread is used first; then nothing more beside many rows
    assert chunked.plan(BatchView(running=3, waiting=3, may_overlap=True)).admit == (OVERLAP,)


def test_the_prefill_threads_request_joins_on_schedule_or_when_nothing_decodes():
    planner = BatchPlanner(8, tokens_per_step=64)
    due = planner.join_step(decode_steps=10, new_tokens=130)  # 3 steps of 64 tokens
    assert due == 13 and planner.join_step(10, 1) == 11
    early = BatchView(running=6, inflight_due=due, decode_steps=12, may_overlap=True)
    assert not planner.plan(early).land and not planner.lands_after_decode(early)
    on_time = BatchView(running=6, inflight_due=due, decode_steps=13, may_overlap=True)
    assert planner.plan(on_time).land and planner.lands_after_decode(on_time)
    # every row left: waiting for the prefill costs no decode step, so it joins now
    alone = BatchView(running=1, cancelled=(0,), inflight_due=due, decode_steps=11, may_overlap=True)
    plan = planner.plan(alone)
    assert plan.land and plan.decode


def test_after_a_failed_admission_the_rest_is_planned_from_the_batch_as_it_is():
    planner = BatchPlanner(4)
    planned = planner.plan(BatchView(running=0, waiting=3, may_overlap=True)).admit
    assert planned == (INLINE, OVERLAP, INLINE)
    # the inline prefill failed: still nothing decodes, so the next is inline too
    assert planner.admissions(BatchView(running=0, waiting=2, may_overlap=True)) == (INLINE, OVERLAP)


def _req(prompt=(1, 2, 3), max_new=4, stops=frozenset({9})):
    return RequestState(0, prompt, max_new=max_new, temperature=0.0, top_p=1.0, stops=stops, future=None)


def test_a_request_finishes_on_a_stop_id_its_own_limit_or_the_context():
    req = _req()
    req.out_ids = [5]
    assert finish_reason(5, req, None) is None
    req.out_ids = [5, 9]
    assert finish_reason(9, req, None) == FINISH_STOP
    req.out_ids = [5, 6, 7, 8]
    assert finish_reason(8, req, None) == FINISH_LENGTH
    req.out_ids = [5, 6]
    assert finish_reason(6, req, max_context=5) == FINISH_LENGTH and finish_reason(6, req, max_context=6) is None


def test_bad_requests_are_refused_with_what_is_wrong():
    good = SimpleNamespace(prompt_ids=[1, 2], max_new_tokens=3, temperature=0.5, top_p=1.0, seed=0, stop_ids=None)
    assert check_request(good, vocab=10, max_context=None) == ((1, 2), None)
    for change, message in [
        ({"prompt_ids": []}, "empty prompt"),
        ({"prompt_ids": [1, 12]}, "outside the vocabulary"),
        ({"prompt_ids": ["a"]}, "token ids"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"seed": 1.5}, "seed"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_request(SimpleNamespace(**{**vars(good), **change}), vocab=10, max_context=None)
    with pytest.raises(ValueError, match="context is 2"):
        check_request(good, vocab=10, max_context=2)


def test_the_shared_prefix_counts_only_rows_of_the_same_weights():
    prompts = [(1, 2, 3, 4), (1, 2, 3, 7), (1, 2, 5)]
    assert shared_prefix(prompts, [0, 0, 0]) == 2
    assert shared_prefix(prompts, [0, 1, 0]) == 0


def test_the_batch_planner_needs_no_torch():
    code = "import sys; import harnessrl.models.batch_planner; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
