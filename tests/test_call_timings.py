"""Every model call's time accounted: queue, prefill, decode, ttft and latency on each ModelCall,
through the store, in summary.json and in the report's episode viewer (docs/engine.md, "Timings")."""

from __future__ import annotations

import json
import time

import pytest
from helpers import shrunk_file
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.metrics import episode_model_time, model_time
from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.models.embedded import load_tokenizer, tiny_random_model
from harnessrl.models.engine import Engine
from harnessrl.models.hf import HFPolicy
from harnessrl.report import build_report, read_data_file
from harnessrl.report.episodes import file_stem, time_breakdown
from harnessrl.store import RunStore
from harnessrl.types import Message, ModelCall, Step, Trajectory

SLACK_S = 0.005  # perf_counter stamps taken a few statements apart


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return tiny_random_model(), load_tokenizer()


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """One small in-process evaluation (tiny-random through two harnesses), its report built."""
    root = tmp_path_factory.mktemp("timings")
    out = root / "run"
    # each harness cut to a few short calls: a tiny random model's episodes end fast, timed alike
    harnesses = ",".join(str(shrunk_file(root, h, max_steps=3, max_new_tokens=48)) for h in ("json-tools", "react"))
    args = ["eval", "--model", "tiny-random", "--suite", "toolcalc", "--tasks", "1", "--attempts", "2"]
    args += ["--harness", harnesses, "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    build_report([out])
    return out


def _timings_hold(call: ModelCall) -> None:
    parts = (call.queue_s, call.prefill_s, call.decode_s, call.ttft_s, call.latency_s)
    assert all(v is not None and v >= 0 for v in parts), parts
    assert call.queue_s + call.prefill_s + call.decode_s <= call.latency_s + SLACK_S
    assert call.queue_s + call.prefill_s <= call.ttft_s + SLACK_S  # (ttft adds the prompt's rendering)
    assert call.ttft_s <= call.latency_s + SLACK_S
    assert call.prefill_s > 0  # every call prefills at least its prompt's last token
    if call.completion_tokens > 1:  # the prefill samples the first token, decode steps the rest
        assert call.decode_s > 0


def test_every_call_of_an_in_process_episode_is_timed_and_the_store_keeps_it(eval_run):
    trajectories = list(RunStore(eval_run).trajectories())
    calls = [s.model_call for t in trajectories for s in t.steps]
    assert len(trajectories) == 4 and calls
    for call in calls:
        _timings_hold(call)
    assert any(c.completion_tokens > 1 for c in calls)  # so decode_s > 0 was checked
    # the token-free read (what summaries and reports use) keeps them too
    light = [s.model_call for t in RunStore(eval_run).trajectories(with_tokens=False) for s in t.steps]
    assert [c.decode_s for c in light] == [c.decode_s for c in calls]


def test_summary_json_has_each_harness_model_time(eval_run):
    summary = json.loads((eval_run / "summary.json").read_text())
    store = RunStore(eval_run)
    for harness in ("json-tools", "react"):
        entry = summary["harnesses"][harness]["model_time_s"]
        episodes = list(store.trajectories(harness=harness, with_tokens=False))
        assert set(entry) == {"queue", "prefill", "decode", "latency"}
        for part, numbers in entry.items():
            total = sum(getattr(s.model_call, f"{part}_s") for t in episodes for s in t.steps)
            assert numbers["n_episodes"] == 2
            assert numbers["sum"] == pytest.approx(total) and numbers["sum"] > 0
            assert numbers["mean_per_episode"] == pytest.approx(total / 2)


def test_the_episode_viewer_shows_where_the_time_went(eval_run):
    t = next(iter(RunStore(eval_run).trajectories(with_tokens=False)))
    _, detail = read_data_file(eval_run / "report" / "episodes" / f"{file_stem(t.episode_id)}.js")
    parts = {p["part"]: p["s"] for p in detail["time"]["parts"]}
    assert {"queue", "prefill", "decode", "model, other", "tools, setup, grading"} <= set(parts)
    assert parts["decode"] == pytest.approx(sum(s.model_call.decode_s for s in t.steps), abs=1e-3)
    assert sum(parts.values()) == pytest.approx(max(t.duration_s, t.own_s), abs=2e-3)
    step = detail["steps"][0]["timings"]
    assert set(step) == {"latency", "queue", "prefill", "decode", "ttft"}
    assert step["latency"] == pytest.approx(t.steps[0].model_call.latency_s, abs=1e-3)


def test_batched_decode_steps_count_whole_for_every_row_in_them(model_and_tokenizer):
    """Four rows decoding together: each row's decode_s is the wall time of the steps it was in,
    so rows that ran the same steps report the same decode_s, their sum is n_rows times the
    engine's decode time, and a longer row has more."""
    model, tokenizer = model_and_tokenizer
    with Engine(model, tokenizer, max_batch=4, overlap_prefill=False) as engine:
        same = [engine.submit(list(range(20, 40 + i)), 12, stop_ids=[]) for i in range(3)]
        longer = engine.submit(list(range(20, 45)), 24, stop_ids=[])
        engine.run_until_done()
        stats = engine.stats()
    done = [f.result() for f in same]
    long_done = longer.result()
    assert all(len(c.ids) == 12 for c in done) and len(long_done.ids) == 24
    # the three short rows joined in one step and left in one step: the same steps exactly
    assert done[0].decode_s == pytest.approx(done[1].decode_s, rel=0, abs=1e-9)
    assert done[1].decode_s == pytest.approx(done[2].decode_s, rel=0, abs=1e-9)
    assert long_done.decode_s > done[0].decode_s > 0
    # the engine's own counter times each step's forward only; the rows' time adds sampling
    assert sum(c.decode_s for c in done) + long_done.decode_s >= stats.decode_seconds
    for c in done + [long_done]:
        assert c.ttft_s == pytest.approx(c.queue_s + c.prefill_s, abs=1e-9)
        assert c.queue_s >= 0 and c.prefill_s > 0


def test_a_request_queued_behind_a_full_batch_waits_in_queue_s(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with Engine(model, tokenizer, max_batch=1, overlap_prefill=False) as engine:
        first = engine.submit(list(range(20, 40)), 16, stop_ids=[])
        second = engine.submit(list(range(50, 70)), 4, stop_ids=[])
        engine.run_until_done()
    a, b = first.result(), second.result()
    # the second was scheduled only after the first left the only row
    assert b.queue_s >= a.prefill_s + a.decode_s - SLACK_S
    assert a.queue_s < b.queue_s


def test_overlapped_prefill_is_timed_from_scheduling_to_joining_the_batch(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    with Engine(model, tokenizer, max_batch=4, overlap_prefill=True) as engine:
        running = engine.submit(list(range(20, 40)), 30, stop_ids=[])
        engine.step()  # the first request decodes; the next one is prefilled beside it
        joining = engine.submit(list(range(100, 300)), 5, stop_ids=[])
        engine.run_until_done()
        assert engine.stats().prefills_overlapped >= 1
    c = joining.result()
    assert c.prefill_s > 0 and c.decode_s > 0 and len(c.ids) == 5
    assert running.result().decode_s > c.decode_s


def test_hf_policy_complete_and_submit_time_every_call(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    policy = HFPolicy(model, tokenizer, name="tiny")
    request = GenerationRequest(messages=[Message(role="user", content="what is 2 + 2?")], max_new_tokens=6)
    greedy = SamplingParams(temperature=0.0)
    try:
        t0 = time.perf_counter()
        submitted = policy.submit(request, greedy).result()
        waited = time.perf_counter() - t0
        batch = policy.complete([request, request], greedy)
    finally:
        policy.close()
    for call in [submitted, *batch]:
        _timings_hold(call)
    assert submitted.latency_s <= waited
    # timings are measurements, not content: equal calls stay equal (a copy with other timings;
    # the batch's own calls may differ from the lone one by float rounding of a 2-row step)
    retimed = submitted.model_copy(update={"latency_s": 9.0, "queue_s": 1.0, "decode_s": 2.0, "ttft_s": 3.0})
    assert retimed == submitted and retimed.latency_s != submitted.latency_s
    assert batch[0].completion_ids == submitted.completion_ids


def test_timings_round_trip_through_the_store_and_old_records_load(tmp_path):
    call = ModelCall(
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        logprobs=[-0.1, -0.2],
        text="hi",
        latency_s=0.5,
        queue_s=0.1,
        prefill_s=0.15,
        decode_s=0.2,
        ttft_s=0.26,
    )
    t = Trajectory(
        episode_id="e1",
        task_id="t1",
        suite="s",
        family="f",
        split="dev",
        harness="h",
        attempt=0,
        instruction="do it",
        steps=[Step(index=0, model_call=call, action="text")],
        own_s=0.7,
        duration_s=1.0,
    )
    store = RunStore(tmp_path)
    store.add(t)
    back = next(iter(store.trajectories())).steps[0].model_call
    assert (back.latency_s, back.queue_s, back.prefill_s, back.decode_s, back.ttft_s) == (0.5, 0.1, 0.15, 0.2, 0.26)
    # a record written before timings existed: no such keys at all
    old = json.loads(t.model_dump_json())
    for key in ("latency_s", "queue_s", "prefill_s", "decode_s", "ttft_s"):
        del old["steps"][0]["model_call"][key]
    loaded = Trajectory.model_validate(old)
    assert loaded.steps[0].model_call.latency_s is None and loaded.steps[0].model_call.decode_s is None
    assert episode_model_time(loaded) == dict.fromkeys(("queue", "prefill", "decode", "latency"))
    assert time_breakdown(loaded) is None
    totals = model_time([loaded, t])
    assert totals["decode"] == {"sum": 0.2, "mean_per_episode": 0.2, "n_episodes": 1}
    # the breakdown adds up to the wall clock: 0.45 inside the engine, 0.05 other model time,
    # 0.2 tools/setup/grading, 0.3 waiting
    parts = {p["part"]: p["s"] for p in time_breakdown(t)["parts"]}
    assert parts == pytest.approx(
        {
            "queue": 0.1,
            "prefill": 0.15,
            "decode": 0.2,
            "model, other": 0.05,
            "tools, setup, grading": 0.2,
            "waiting": 0.3,
        }
    )


def test_a_backend_that_measures_latency_only_shows_one_model_part():
    call = ModelCall(prompt_ids=[], completion_ids=[], logprobs=[], text="x", latency_s=0.4, n_completion_tokens=3)
    t = Trajectory(
        episode_id="e",
        task_id="t",
        suite="s",
        family="f",
        split="dev",
        harness="h",
        attempt=0,
        instruction="i",
        steps=[Step(index=0, model_call=call, action="text")],
        own_s=0.5,
        duration_s=0.5,
    )
    parts = {p["part"]: p["s"] for p in time_breakdown(t)["parts"]}
    assert parts == pytest.approx({"model": 0.4, "tools, setup, grading": 0.1})
    assert model_time([t])["queue"] == {"sum": None, "mean_per_episode": None, "n_episodes": 0}
