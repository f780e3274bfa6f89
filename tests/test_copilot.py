"""GitHub Copilot CLI (npm `@github/copilot`), unmodified, as an external harness
(examples/agents/copilot.yaml).

Its non-interactive mode (`copilot -p`), offline, with the episode's recording endpoint as its own
model provider (BYOK: COPILOT_PROVIDER_BASE_URL), runs two `workspace` tasks (a file read and
answered, a file copied) on the embedded-size tiny random model (8,192 positions: the spec's four
tools keep Copilot's first request within it, ~4,760 tokens): the endpoint serves Copilot's real
prompt to a real (random) model, and whatever it writes the episode is Copilot's, recorded and
triaged, never an infrastructure error. Copilot speaks chat completions by default and the
Responses API with COPILOT_PROVIDER_WIRE_API=responses: both are run.

A scripted policy, answering Copilot's conversation with each task's solution in its own `bash` tool,
solves both tasks in both dialects (the tiny random model would never write a valid call).

Skipped, saying why, where Copilot CLI is not installed (examples/agents/install_copilot.sh).
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from helpers import (
    check_recorded_and_triaged,
    check_solved_through_bash,
    dialects_used,
    solve_notes_through,
    workspace_tasks,
)

from harnessrl.harness.spec import ExternalHarnessSpec, load_spec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "agents" / "copilot.yaml"
PREFIX = ROOT / ".agents"  # where install_copilot.sh puts Copilot by default
FAMILIES = ("answer_from_file", "copy_content")
TOOLS = ("bash", "view", "create", "edit")  # the spec's COPILOT_TOOLS


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed(**env: str) -> ExternalHarnessSpec:
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    copilot = PREFIX / "copilot" / "node_modules" / "@github" / f"copilot-linux-{arch}" / "copilot"
    if not copilot.exists():
        pytest.skip(f"Copilot CLI is not installed under {PREFIX} (sh examples/agents/install_copilot.sh)")
    spec = load_spec(SPEC)
    assert isinstance(spec, ExternalHarnessSpec)
    # a short reply keeps the random model's turn cheap
    limits = spec.limits.model_copy(update={"max_new_tokens": 16})
    return spec.model_copy(update={"env": {**spec.env, **env}, "limits": limits})


def run_on_the_tiny_random_model(spec: ExternalHarnessSpec, tokenizer, run_dir: Path, dialect: str) -> list:
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    with dialects_used() as used:
        trajectories = runner.run(make_jobs(workspace_tasks(FAMILIES), [spec], 1))
    policy.close()
    # every model call took `dialect`'s route: COPILOT_PROVIDER_WIRE_API chose the API
    assert used and set(used) == {dialect}, used
    assert len(trajectories) == 2
    stored = check_recorded_and_triaged(trajectories, run_dir)
    for traj in stored:
        # its real prompt, served: its system prompt with the four tools in the hermes block,
        # within the embedded model's context
        first = traj.steps[0].model_call
        assert 3000 < len(first.prompt_ids) < 8192
        system = first.messages[0]
        assert system.role == "system"
        for name in TOOLS:
            assert f'"name": "{name}"' in system.content
        # the 16-token replies hold no call: Copilot takes the text as its reply and exits 0
        # (after asking again, up to 3 calls here), and the glue hands it in as the answer
        assert traj.meta["agent"]["exit_code"] == 0 and traj.answer.strip()
    return stored


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_copilot_on_chat_completions_is_recorded_and_triaged(tokenizer, tmp_path):
    run_on_the_tiny_random_model(installed(), tokenizer, tmp_path / "run", "chat")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_copilot_on_the_responses_api_is_recorded_and_triaged(tokenizer, tmp_path):
    spec = installed(COPILOT_PROVIDER_WIRE_API="responses")
    run_on_the_tiny_random_model(spec, tokenizer, tmp_path / "run", "responses")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_copilot_solves_a_claweval_service_task_through_the_mcp_tools():
    """Copilot lists the episode's MCP server (the task's notes tools, added by the glue with
    --additional-mcp-config and offered beside its four tools as harnessrl-<tool>), the scripted
    model calls two of them, Copilot runs them over MCP, harnessrl runs them in the episode
    against the task's notes service, and the task's own grader passes it."""
    installed()  # skips where Copilot is not installed
    spec = load_spec(SPEC)
    solve_notes_through(spec, "harnessrl-")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ["completions", "responses"])
def test_copilot_solves_two_workspace_tasks_through_its_bash_tool(api):
    """A scripted policy answers Copilot's conversation with each task's solution in its own `bash`
    tool, in both of its dialects: Copilot runs the commands, sends their output back, and both
    tasks pass, one recorded call per solution call."""
    installed()  # skips where Copilot is not installed
    spec = load_spec(SPEC)
    spec = spec.model_copy(update={"env": {**spec.env, "COPILOT_PROVIDER_WIRE_API": api}})
    check_solved_through_bash(spec, FAMILIES)
