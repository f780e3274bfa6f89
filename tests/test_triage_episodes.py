"""Triage of episodes run through the real loop, where the harness's own evidence fixes act:
the submit checkpoint and helper tools. Each episode is recorded, stored, exported and shown."""

from __future__ import annotations

import json

import pytest
from helpers import replies_policy
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.base import SamplingParams
from harnessrl.report import build_report, read_data_file
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.triage import first_failure_signal
from harnessrl.types import InnerCall, ToolCall, Trajectory

READ_IT = {
    "name": "read_it",
    "description": "Read a file.",
    "parameters": {"path": "the file"},
    "calls": [{"tool": "read_file", "arguments": {"path": "{path}"}}],
}


@pytest.fixture(scope="module")
def task():
    """A workspace task whose answer is in a file: read_file is a required observation."""
    t = next(t for t in get_suite("workspace").tasks("dev", 16) if t.family == "answer_from_file")
    assert t.required_observations == ["read_file"]
    return t


def react(name: str, **args) -> str:
    return f"Thought: go\nAction: {name}\nAction Input: {json.dumps(args)}"


def episode(tokenizer, task, replies, capabilities=None, **rules) -> Trajectory:
    data = load_harness("react").to_dict()
    data["rules"].update(max_steps=6, **rules)
    data["capabilities"].update(capabilities or {})
    spec = HarnessSpec.model_validate(data)
    runner = Runner(replies_policy(replies, tokenizer), SamplingParams(), progress=False)
    (traj,) = runner.run(make_jobs([task], [spec], 1))
    return traj


def test_submit_held_back_by_the_checkpoint_is_not_the_submission(tokenizer, task):
    path = task.solution[0]["arguments"]["path"]
    replies = [react("submit", answer="Paris"), react("read_file", path=path), react("submit", answer="Paris")]
    t = episode(tokenizer, task, replies, submit_checkpoint={"enabled": True})
    assert t.submitted and len(t.steps) == 3 and not t.grade.passed
    held = t.steps[0]
    assert [(iv.kind, iv.message) for iv in held.interventions] == [("submit_checkpoint", held.tool_results[0].output)]
    assert all(iv.kind != "submit_checkpoint" for s in t.steps[1:] for iv in s.interventions)
    # the file was read before the real submit: a wrong answer is a content failure
    v = first_failure_signal(t)
    assert (v.cls, v.step) == ("content", 2)
    # submitting twice without reading is judged at the real (second) submit
    twice = episode(tokenizer, task, [react("submit", answer="Paris")], submit_checkpoint={"enabled": True})
    v = first_failure_signal(twice)
    assert (v.cls, v.step) == ("insufficient_evidence", 1) and "read_file" in v.evidence


def test_helper_tool_calls_count_as_the_observations_they_are(tokenizer, task):
    path = task.solution[0]["arguments"]["path"]
    replies = [react("read_it", path=path), react("submit", answer="Paris")]
    t = episode(tokenizer, task, replies, capabilities={"helper_tools": [READ_IT]})
    (res,) = t.steps[0].tool_results
    assert res.name == "read_it" and res.ok
    (inner,) = res.inner_calls
    assert inner.call == ToolCall(name="read_file", arguments={"path": path})
    assert inner.result.ok and inner.result.output in res.output and inner.result.inner_calls == []
    assert t.steps[1].tool_results[0].inner_calls == []  # only helpers record inner calls
    v = first_failure_signal(t)
    assert (v.cls, v.step) == ("content", 1)


def test_inner_calls_of_a_failed_helper_are_recorded_but_not_observed(tokenizer, task):
    """The model sees only a failed helper's error, not the outputs of its earlier calls."""
    path = task.solution[0]["arguments"]["path"]
    calls = [
        {"tool": "read_file", "arguments": {"path": "{path}"}},
        {"tool": "read_file", "arguments": {"path": "{other}"}},
    ]
    helper = {**READ_IT, "name": "read_two", "parameters": {"path": "a file", "other": "another file"}, "calls": calls}
    replies = [react("read_two", path=path, other="missing.txt"), react("submit", answer="Paris")]
    t = episode(tokenizer, task, replies, capabilities={"helper_tools": [helper]})
    (res,) = t.steps[0].tool_results
    assert not res.ok and res.blocked is None
    assert [(c.call.arguments["path"], c.result.ok) for c in res.inner_calls] == [(path, True), ("missing.txt", False)]
    v = first_failure_signal(t)
    assert (v.cls, v.step) == ("insufficient_evidence", 1)


def test_new_fields_survive_the_store_the_export_and_the_report(tokenizer, task, tmp_path):
    path = task.solution[0]["arguments"]["path"]
    replies = [react("submit", answer="Paris"), react("read_file", path=path), react("submit", answer="x")]
    checkpoint = episode(tokenizer, task, replies, submit_checkpoint={"enabled": True})
    replies = [react("read_it", path=path), react("submit", answer="x")]
    helper = episode(tokenizer, task, replies, capabilities={"helper_tools": [READ_IT]})
    helper = helper.model_copy(update={"harness": "react-helper", "episode_id": "ep-helper"})
    run = tmp_path / "run"
    with RunStore(run) as store:
        harnesses = {"react": {}, "react-helper": {}}
        config = {"suite": "workspace", "split": "dev", "model": "scripted", "task_ids": [task.id], "attempts": 1}
        store.set_meta("config", {**config, "harnesses": harnesses})
        store.add(checkpoint)
        store.add(helper)
        back = {t.harness: t for t in store.trajectories()}
    assert back == {"react": checkpoint, "react-helper": helper}
    r = CliRunner().invoke(app, ["export", str(run), "--format", "jsonl"])
    assert r.exit_code == 0, r.output
    exported = {t.harness: t for t in (Trajectory.model_validate_json(x) for x in r.output.splitlines() if x.strip())}
    assert exported == back
    assert exported["react"].steps[0].interventions[0].kind == "submit_checkpoint"
    assert isinstance(exported["react-helper"].steps[0].tool_results[0].inner_calls[0], InnerCall)
    # the episode viewer shows the checkpoint among the interventions
    index = build_report([run], tmp_path / "report")
    _, ep = read_data_file(index.parent / "episodes" / f"{checkpoint.episode_id}.js")
    assert ep["steps"][0]["interventions"][0]["kind"] == "submit_checkpoint"
    _, ep = read_data_file(index.parent / "episodes" / "ep-helper.js")
    assert ep["steps"][0]["tool_results"][0]["name"] == "read_it"


def test_records_without_the_new_fields_still_load(tokenizer, task, tmp_path):
    """A run database written before inner calls were recorded loads with them empty."""
    t = episode(tokenizer, task, [react("read_file", path="nope.txt"), react("submit", answer="x")])
    with RunStore(tmp_path / "run") as store:
        store.add(t)
        body = json.loads(store.db.execute("SELECT trajectory FROM episodes").fetchone()[0])
        for step in body["steps"]:
            for res in step["tool_results"]:
                del res["inner_calls"]
        store.db.execute("UPDATE episodes SET trajectory = ?", (json.dumps(body),))
        store.db.commit()
        (back,) = store.trajectories()
    assert back == t
