"""Triage on hand-written trajectories: each class, and that the FIRST signal wins."""

from __future__ import annotations

import dataclasses

from harnessrl.triage import CLASSES, HarnessTriage, first_failure_signal, triage, triage_by_harness
from harnessrl.types import (
    ActionKind,
    BlockReason,
    Grade,
    InnerCall,
    Intervention,
    ModelCall,
    Step,
    Termination,
    ToolCall,
    ToolResult,
    Trajectory,
)


def mc(text="x"):
    return ModelCall(prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], text=text)


def call(name, output="ok", ok=True, blocked=None, **args):
    return (ToolCall(name=name, arguments=args), ToolResult(name=name, output=output, ok=ok, blocked=blocked))


def step(i, *calls, action=ActionKind.tool_calls, parse_error=None, interventions=(), text="x"):
    return Step(
        index=i,
        model_call=mc(text),
        action=action,
        tool_calls=[c for c, _ in calls],
        tool_results=[r for _, r in calls],
        parse_error=parse_error,
        interventions=list(interventions),
    )


def traj(steps, submitted=False, termination=Termination.max_steps, score=0.0, passed=False, required=(), harness="h"):
    return Trajectory(
        episode_id=f"e{len(steps)}{termination.value}{score}",
        task_id="s/dev/00000",
        suite="s",
        family="f",
        split="dev",
        harness=harness,
        attempt=0,
        instruction="do it",
        steps=steps,
        termination=termination,
        submitted=submitted,
        grade=Grade(score=score, passed=passed, threshold=1.0, subscores={"a": score}),
        meta={"required_observations": list(required)},
    )


def cls(t):
    v = first_failure_signal(t)
    return None if v is None else (v.cls, v.step)


def test_passed_episode_has_no_verdict():
    t = traj([step(0, call("submit"))], submitted=True, termination=Termination.submitted, score=1.0, passed=True)
    assert first_failure_signal(t) is None


def test_content_failure():
    t = traj(
        [step(0, call("read_file", path="a")), step(1, call("submit"))],
        submitted=True,
        termination=Termination.submitted,
        score=0.5,
        required=["read_file"],
    )
    v = first_failure_signal(t)
    assert (v.cls, v.step, v.kind) == ("content", 1, "content")
    assert "0.50" in v.evidence


def test_first_signal_wins_malformed_before_blocked():
    t = traj(
        [
            step(0, call("list_dir")),
            step(1, action=ActionKind.malformed, parse_error="could not parse JSON"),
            step(
                2,
                call(
                    "read_file",
                    output="'../x' leaves the workspace",
                    ok=False,
                    blocked=BlockReason.sandbox,
                    path="../x",
                ),
            ),
        ]
    )
    assert cls(t) == ("malformed_call", 1)
    t2 = traj(
        [
            step(0, call("read_file", output="refused", ok=False, blocked=BlockReason.sandbox, path="../x")),
            step(1, action=ActionKind.malformed),
        ]
    )
    v = first_failure_signal(t2)
    assert (v.cls, v.step) == ("blocked_call", 0) and "sandbox" in v.evidence


def test_blocked_kinds():
    for reason in BlockReason:
        t = traj([step(0, call("t", ok=False, blocked=reason))])
        assert cls(t) == ("blocked_call", 0)


def test_loop_same_action_and_observation_three_times():
    s = [step(i, call("list_dir", output="a.txt", path=".")) for i in range(4)]
    assert cls(traj(s)) == ("loop", 2)


def test_loop_same_failing_action_with_varying_output():
    s = [step(i, call("read_file", output=f"error {i}", ok=False, path="nope")) for i in range(3)]
    assert cls(traj(s)) == ("loop", 2)


def test_loop_alternation():
    s = []
    for i in range(6):
        s.append(
            step(i, call("list_dir", output=f"o{i}", path="."))
            if i % 2 == 0
            else step(i, call("read_file", output=f"r{i}", path="a"))
        )
    assert cls(traj(s)) == ("loop", 5)
    # five steps of alternation are not yet a loop: budget is the first signal
    assert cls(traj(s[:5])) == ("budget_exhausted", 4)


def test_empty_replies():
    two = [step(0, call("list_dir")), step(1, action=ActionKind.empty), step(2, action=ActionKind.empty)]
    assert cls(traj(two)) == ("loop", 2)
    one = [step(0, action=ActionKind.empty), step(1, call("list_dir"))]
    assert cls(traj(one)) == ("malformed_call", 0)


def test_loop_guard_intervention_and_termination():
    s = [
        step(0, call("list_dir")),
        step(1, call("read_file", path="a"), interventions=[Intervention(kind="loop_guard")]),
    ]
    assert cls(traj(s)) == ("loop", 1)
    assert cls(traj([step(0, call("list_dir"))], termination=Termination.loop_guard)) == ("loop", 0)


def test_budget_exhausted_variants():
    for term in (Termination.max_steps, Termination.max_tokens, Termination.timeout):
        v = first_failure_signal(
            traj([step(0, call("list_dir")), step(1, call("read_file", path="a"))], termination=term)
        )
        assert (v.cls, v.step) == ("budget_exhausted", 1) and term.value in v.evidence


def test_no_delivery():
    t = traj([step(0, call("list_dir"))], termination=Termination.submitted, submitted=False)
    assert cls(t) == ("no_delivery", 0)


def test_submission_the_grader_marks_undelivered_is_no_delivery():
    # a planning reply in prose with no itinerary: submitted, but nothing was delivered
    t = traj([step(0, call("submit", answer="a nice trip"))], submitted=True, termination=Termination.submitted)
    t.grade.subscores["delivered"] = 0.0
    assert cls(t) == ("no_delivery", 0)
    t.grade.subscores["delivered"] = 1.0
    assert cls(t) == ("content", 0)


def test_insufficient_evidence():
    t = traj(
        [step(0, call("submit", answer="42"))],
        submitted=True,
        termination=Termination.submitted,
        required=["read_file"],
    )
    v = first_failure_signal(t)
    assert (v.cls, v.step) == ("insufficient_evidence", 0) and "read_file" in v.evidence
    # a failed read is not evidence
    t = traj(
        [step(0, call("read_file", output="no such file", ok=False, path="x")), step(1, call("submit"))],
        submitted=True,
        termination=Termination.submitted,
        required=["read_file"],
    )
    assert cls(t) == ("insufficient_evidence", 1)


def test_a_submit_held_back_by_the_checkpoint_is_not_the_submission():
    checkpoint = Intervention(kind="submit_checkpoint", message="Check first.")
    held = step(0, call("submit", output="Check first.", answer="41"), interventions=[checkpoint])
    steps = [held, step(1, call("read_file", path="a")), step(2, call("submit", answer="41"))]
    t = traj(steps, submitted=True, termination=Termination.submitted, required=["read_file"])
    assert cls(t) == ("content", 2)
    # a record without the intervention (written before held-back submits were marked): the
    # episode went on after that submit, so it was not the submission either
    held.interventions = []
    assert cls(t) == ("content", 2)
    # evidence is judged at the submission that ended the episode
    t.steps[1] = step(1, call("list_dir"))
    assert cls(t) == ("insufficient_evidence", 2)


def test_calls_inside_a_successful_helper_are_observations():
    read = InnerCall(
        call=ToolCall(name="read_file", arguments={"path": "a"}), result=ToolResult(name="read_file", output="x")
    )
    helper_call, helper_result = call("read_it", output="[read_file]\nx", path="a")
    helper_result.inner_calls = [read]
    t = traj(
        [step(0, (helper_call, helper_result)), step(1, call("submit"))],
        submitted=True,
        termination=Termination.submitted,
        required=["read_file"],
    )
    assert cls(t) == ("content", 1)
    # a failed helper showed the model only its error, whatever its first calls returned
    helper_result.ok, helper_result.output = False, "error: list_dir: boom"
    assert cls(t) == ("insufficient_evidence", 1)


def test_plain_text_answer_counts_as_submission():
    t = traj([step(0, action=ActionKind.text, text="42")], submitted=True, termination=Termination.submitted, score=0.0)
    assert cls(t) == ("content", 0)


def test_plan_step_is_not_an_acting_step():
    s = [step(0, action=ActionKind.plan)] + [step(i, call("list_dir", output="same")) for i in range(1, 4)]
    assert cls(traj(s)) == ("loop", 3)


def test_infra_and_aggregate():
    infra = traj([], termination=Termination.error)
    infra.infra_error = "tool crashed"
    ok = traj([step(0, call("submit"))], submitted=True, termination=Termination.submitted, score=1.0, passed=True)
    content = traj([step(0, call("submit"))], submitted=True, termination=Termination.submitted, score=0.0)
    budget = traj([step(0, call("list_dir"))])
    res = triage([infra, ok, content, budget])["h"]
    assert res["n_episodes"] == 4 and res["n_valid"] == 3 and res["n_passed"] == 1 and res["n_failed"] == 2
    assert res["counts"]["infra"] == 1 and res["counts"]["content"] == 1 and res["counts"]["budget_exhausted"] == 1
    assert res["rates"]["content"] == 0.5 and res["process_share"] == 0.5 and res["content_share"] == 0.5
    assert set(res["counts"]) == set(CLASSES)
    assert {e["class"] for e in res["episodes"]} == {"infra", "content", "budget_exhausted"}
    assert all({"episode_id", "class", "step", "evidence"} <= set(e) for e in res["episodes"])


def test_the_typed_triage_is_what_triage_json_holds_and_a_harness_without_episodes_has_its_shape():
    ok = traj([step(0, call("submit"))], submitted=True, termination=Termination.submitted, score=1.0, passed=True)
    content = traj([step(0, call("submit"))], submitted=True, termination=Termination.submitted, score=0.0)
    typed = triage_by_harness([ok, content])["h"]
    assert isinstance(typed, HarnessTriage) and [v.cls for v in typed.episodes] == ["content"]
    as_json = triage([ok, content])["h"]
    assert as_json == typed.to_json() and list(as_json) == [f.name for f in dataclasses.fields(HarnessTriage)]
    # the report and the evolution fall back to the empty triage: the same keys, every count 0
    empty = HarnessTriage.empty().to_json()
    assert list(empty) == list(as_json) and set(empty["counts"]) == set(CLASSES)
    assert empty["n_episodes"] == empty["n_failed"] == sum(empty["counts"].values()) == 0
    assert empty["process_share"] is None and empty["rates"]["content"] is None and empty["episodes"] == []
