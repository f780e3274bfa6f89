"""Cline's CLI (npm `cline`), unmodified, as an external harness (examples/agents/cline.yaml).

A one-shot yolo run (`cline --yolo --json TASK`) with the episode's recording endpoint as its
OpenAI-compatible provider (set with Cline's own `cline auth`, chat completions) runs two
`workspace` tasks (a file read and answered, a file copied) on the embedded-size tiny random
model (8,192 positions; Cline's first request in yolo mode is ~3,330 tokens): the endpoint serves
Cline's real prompt to a real (random) model, and whatever it writes the episode is Cline's,
recorded and triaged, never an infrastructure error.

A scripted policy, answering Cline's conversation with each task's solution in its own tools
(`run_commands`, `submit_and_exit`), solves both tasks; another solves the Claw-Eval notes task
through the episode's MCP tools.

Skipped, saying why, where Cline is not installed (examples/agents/install_cline.sh).
"""

from __future__ import annotations

import platform
import shlex
from pathlib import Path

import pytest
from helpers import check_recorded_and_triaged, solution_policy, workspace_tasks

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec, load_spec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.types import Termination, ToolCall

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "agents" / "cline.yaml"
PREFIX = ROOT / ".agents"  # where install_cline.sh puts Cline by default
FAMILIES = ("answer_from_file", "copy_content")
TOOLS = ("read_files", "run_commands", "editor", "submit_and_exit")  # yolo mode's tools


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed() -> ExternalHarnessSpec:
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    cline = PREFIX / "cline" / "node_modules" / "@cline" / f"cli-linux-{arch}" / "bin" / "cline"
    if not cline.exists():
        pytest.skip(f"Cline is not installed under {PREFIX} (sh examples/agents/install_cline.sh)")
    spec = load_spec(SPEC)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cline_on_the_tiny_random_model_is_recorded_and_triaged(tokenizer, tmp_path):
    """Cline's real prompt on a real (random) model of the embedded model's context."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    spec = installed()
    # a short reply keeps the random model's turn cheap
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_new_tokens": 16})})
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    trajectories = runner.run(make_jobs(workspace_tasks(FAMILIES), [spec], 1))
    policy.close()
    assert len(trajectories) == 2
    for traj in check_recorded_and_triaged(trajectories, tmp_path / "run"):
        # its real prompt, served: its system prompt and yolo mode's four tools in the hermes
        # block, within the embedded model's context
        first = traj.steps[0].model_call
        assert 2500 < len(first.prompt_ids) < 8192
        assert first.messages[0].role == "system" and "You are Cline" in first.messages[0].content
        for name in TOOLS:
            assert f'"name": "{name}"' in first.messages[0].content
        # every 16-token reply is cut at the episode's limit and holds no call: Cline asks again
        # and, after a few, stops with its error ("Model reached the maximum output token limit
        # before completing the turn", exit 1): no answer, the episode ends `exited`
        assert all(step.model_call.finish_reason == "length" for step in traj.steps)
        assert traj.termination == Termination.exited and traj.meta["agent"]["exit_code"] == 1
        assert "maximum output token limit" in traj.meta["agent"]["stdout"]


def notes_submitter():
    """The notes task's solution as Cline's model makes it: the two served tools called as
    harnessrl__<tool>, then yolo mode's `submit_and_exit` with the answer as its summary (a plain
    reply does not end a yolo run: Cline asks again)."""
    from helpers import NOTES_ANSWER, NOTES_CALLS

    from harnessrl.harness.protocols import get_protocol
    from harnessrl.models.scripted import ScriptedPolicy
    from harnessrl.types import ToolCall

    def reply(messages) -> str:
        turn = sum(m.role == "assistant" for m in messages)
        if turn < len(NOTES_CALLS):
            name, arguments = NOTES_CALLS[turn]
            call = ToolCall(name="harnessrl__" + name, arguments=arguments)
        else:
            call = ToolCall(name="submit_and_exit", arguments={"summary": NOTES_ANSWER, "verified": True})
        return get_protocol("hermes").render_call(call)

    return ScriptedPolicy(reply, name="solver")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cline_solves_a_claweval_service_task_through_the_mcp_tools():
    """Cline lists the episode's MCP server (the task's notes tools, in the MCP settings cline.py
    writes into its data folder, shown as harnessrl__<tool>), the scripted model calls two of
    them, Cline runs them over MCP, harnessrl runs them in the episode against the task's notes
    service, and the task's own grader passes it; the summary of its submit_and_exit is the
    answer."""
    from helpers import check_notes_solved, claweval_notes_task

    spec = installed()
    task = claweval_notes_task()
    runner = Runner(notes_submitter(), SamplingParams(temperature=0.0), progress=False)
    [traj] = runner.run(make_jobs([task], [spec], 1))
    check_notes_solved(traj, "harnessrl__")
    assert [c.name for c in traj.steps[-1].tool_calls] == ["submit_and_exit"]


def as_cline(call: dict) -> str:
    """One solution call in Cline's yolo tools, written in the spec's tool_protocol (hermes): a
    read or write is a shell command in `run_commands`, submit is `submit_and_exit` (its summary
    is the answer; at least 10 characters, so a short answer is put in a sentence)."""
    args = call["arguments"]
    if call["name"] == "submit":
        answer = args.get("answer")
        summary = f"The answer is {answer}." if answer else "Done as the task asked."
        made = ToolCall(name="submit_and_exit", arguments={"summary": summary, "verified": True})
    elif call["name"] == "read_file":
        made = ToolCall(name="run_commands", arguments={"commands": [f"cat {shlex.quote(args['path'])}"]})
    else:
        path = shlex.quote(args["path"])
        command = f'mkdir -p "$(dirname {path})" && printf %s {shlex.quote(args["content"])} > {path}'
        made = ToolCall(name="run_commands", arguments={"commands": [command]})
    return get_protocol("hermes").render_call(made)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cline_solves_two_workspace_tasks_through_its_tools():
    """A scripted policy answers Cline's conversation with each task's solution in its own tools
    (`run_commands`, then `submit_and_exit`): Cline runs the commands, sends their output back,
    ends on the submission, and both tasks pass, one recorded call per solution call."""
    spec = installed()
    tasks = workspace_tasks(FAMILIES)
    runner = Runner(solution_policy(tasks, as_cline), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        agent = traj.meta["agent"]
        assert not traj.is_infra_error and not traj.refused_requests, traj.termination_detail
        assert traj.termination == Termination.submitted and agent["exit_code"] == 0, traj.termination_detail
        assert traj.grade.passed, (traj.grade, traj.answer)
        assert len(traj.steps) == len(task.solution)
        for step in traj.steps[:-1]:
            [made] = step.tool_calls
            assert made.name == "run_commands" and step.tool_results and step.tool_results[0].output
        assert [c.name for c in traj.steps[-1].tool_calls] == ["submit_and_exit"]
        if task.family == "answer_from_file":
            expected = task.solution[-1]["arguments"]["answer"]
            assert traj.answer == f"The answer is {expected}."
            assert expected in traj.steps[0].tool_results[0].output
