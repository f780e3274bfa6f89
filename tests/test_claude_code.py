"""Claude Code (npm `@anthropic-ai/claude-code`), unmodified, as an external harness
(examples/agents/claude_code.yaml).

Its headless `claude -p`, with the episode's recording endpoint as its Anthropic base URL (the
Messages API, streamed), solves two `workspace` tasks (a file read and answered, a file
copied). The policy is scripted: it answers Claude Code's conversation with the task's solution
in Claude Code's own tools (`Read`, `Write`; its final reply is the answer), because no model
here can act on its prompt. Then the same two tasks on the embedded-size tiny random model
(8,192 positions: the spec's four tools keep Claude Code's prompt within it): the endpoint serves
Claude Code's real prompt to a real (random) model, and whatever it writes the episode is Claude
Code's, recorded and triaged, never an infrastructure error.

Skipped, saying why, where Claude Code is not installed (examples/agents/install_claude_code.sh).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    check_recorded_and_triaged,
    check_solved_step_by_step,
    solution_policy,
    solve_notes_through,
    workspace_tasks,
)

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec, load_spec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.triage import first_failure_signal
from harnessrl.types import Termination, ToolCall

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "agents" / "claude_code.yaml"
PREFIX = ROOT / ".agents"  # where install_claude_code.sh puts Claude Code by default
FAMILIES = ("answer_from_file", "copy_content")
# the workspace suite's tools as Claude Code names them and their path argument
CLAUDE_TOOL = {"read_file": "Read", "write_file": "Write"}


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed() -> ExternalHarnessSpec:
    claude = PREFIX / "claude-code" / "node_modules" / ".bin" / "claude"
    if not claude.exists():
        pytest.skip(f"Claude Code is not installed under {PREFIX} (sh examples/agents/install_claude_code.sh)")
    spec = load_spec(SPEC)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def as_claude_code(call: dict) -> str:
    """One solution call in Claude Code's tools, written in the spec's tool_protocol (hermes):
    read_file is `Read`, write_file `Write` (a path relative to the workspace, where it starts),
    submit the plain final reply that `claude -p` prints and the glue writes as the answer."""
    args = call["arguments"]
    if call["name"] == "submit":
        return args.get("answer") or "Done."
    arguments = {"file_path": args["path"]}
    if call["name"] == "write_file":
        arguments["content"] = args["content"]
    return get_protocol("hermes").render_call(ToolCall(name=CLAUDE_TOOL[call["name"]], arguments=arguments))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_claude_code_solves_two_workspace_tasks_through_the_messages_api():
    spec = installed()
    tasks = workspace_tasks(FAMILIES)
    policy = solution_policy(tasks, as_claude_code)
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        check_solved_step_by_step(traj, task)
        for step, call in zip(traj.steps[:-1], task.solution):
            [made] = step.tool_calls
            assert made.name == CLAUDE_TOOL[call["name"]] and made.arguments["file_path"] == call["arguments"]["path"]
            # Claude Code ran the tool itself and sent its result back in a tool_result block
            assert step.tool_results and step.tool_results[0].output
        # Claude Code's own prompt reached the model: its system prompt, its four tools in the
        # hermes block, the task in a user turn
        first = traj.steps[0].model_call
        system = first.messages[0]
        assert system.role == "system" and "Claude" in system.content
        for name in ("Read", "Write", "Edit", "Bash"):
            assert f'"name": "{name}"' in system.content
        assert any(task.instruction in (m.content or "") for m in first.messages if m.role == "user")
        assert 2000 < len(first.prompt_ids) < 8192
        if task.family == "answer_from_file":
            assert traj.answer.strip() == task.solution[-1]["arguments"]["answer"]
            assert traj.answer.strip() in traj.steps[0].tool_results[0].output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_claude_code_on_the_tiny_random_model_is_recorded_and_triaged(tokenizer, tmp_path):
    """Claude Code's real prompt on a real (random) model of the embedded model's context."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    spec = installed()
    # a short reply keeps the random model's turn cheap
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_new_tokens": 16})})
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(workspace_tasks(FAMILIES), [spec], 1))
    policy.close()
    for traj in check_recorded_and_triaged(trajectories, tmp_path / "run"):
        # its real prompt, served: within the embedded model's context, its four tools shown
        first = traj.steps[0].model_call
        assert 2000 < len(first.prompt_ids) < 8192 and '"name": "Bash"' in first.messages[0].content
        # each 16-token reply hits the episode's limit: Claude Code asks the model to resume
        # (stop_reason max_tokens) a few times, then gives up with an error and no answer
        assert traj.termination == Termination.exited and "exit code 1" in traj.termination_detail
        assert "output token maximum" in traj.meta["agent"]["stdout"]
        assert first_failure_signal(traj).cls == "no_delivery"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_claude_code_solves_a_claweval_service_task_through_the_mcp_tools():
    """Claude Code lists the episode's MCP server (the task's notes tools, as
    mcp__harnessrl__<tool>), the scripted model calls two of them, Claude Code runs them over
    MCP, harnessrl runs them in the episode against the task's notes service, and the task's own
    grader, reading their dispatches and the service's audit, passes it."""
    spec = installed()
    solve_notes_through(spec, "mcp__harnessrl__")
