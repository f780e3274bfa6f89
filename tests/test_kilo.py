"""Kilo Code's CLI (npm `@kilocode/cli`), unmodified, as an external harness
(examples/agents/kilo.yaml).

`kilo run --auto`, with the episode's recording endpoint as a custom provider in the config file
kilo.py writes (its only provider enabled, no telemetry), runs two `workspace` tasks (a file read
and answered, a file copied) on the embedded-size tiny random model (8,192 positions: the
spec's four tools keep Kilo's first request within it, ~5,500 tokens): the endpoint serves
Kilo's real prompt to a real (random) model, and whatever it writes the episode is Kilo's,
recorded and triaged, never an infrastructure error. Kilo speaks chat completions through the
AI SDK's OpenAI-compatible package and the Responses API through its OpenAI package
(KILO_PROVIDER_PACKAGE): both are run.

A scripted policy, answering Kilo's conversation with each task's solution in its own `bash` tool,
solves both tasks in both dialects (the tiny random model would never write a valid call).

Skipped, saying why, where Kilo is not installed (examples/agents/install_kilo.sh).
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
from harnessrl.types import Termination

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "agents" / "kilo.yaml"
PREFIX = ROOT / ".agents"  # where install_kilo.sh puts Kilo by default
FAMILIES = ("answer_from_file", "copy_content")
TOOLS = ("bash", "read", "write", "edit")  # what the spec's KILO_DISABLED_TOOLS leaves


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed(**env: str) -> ExternalHarnessSpec:
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    kilo = PREFIX / "kilo" / "node_modules" / "@kilocode" / f"cli-linux-{arch}" / "bin" / "kilo"
    if not kilo.exists():
        pytest.skip(f"Kilo is not installed under {PREFIX} (sh examples/agents/install_kilo.sh)")
    spec = load_spec(SPEC)
    assert isinstance(spec, ExternalHarnessSpec)
    # a short reply keeps the random model's turn cheap
    limits = spec.limits.model_copy(update={"max_new_tokens": 16})
    return spec.model_copy(update={"env": {**spec.env, **env}, "limits": limits})


def run_on_the_tiny_random_model(spec: ExternalHarnessSpec, tokenizer, run_dir: Path, dialect: str) -> None:
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    # both episodes at once: most of a Kilo run (~12 s here) is Kilo starting, not the model
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    with dialects_used() as used:
        trajectories = runner.run(make_jobs(workspace_tasks(FAMILIES), [spec], 1))
    policy.close()
    # every model call took `dialect`'s route: the provider package chose the API
    assert used and set(used) == {dialect}, used
    assert len(trajectories) == 2
    for traj in check_recorded_and_triaged(trajectories, run_dir):
        # its real prompt, served: its system prompt with the four tools in the hermes block,
        # within the embedded model's context
        first = traj.steps[0].model_call
        assert 4000 < len(first.prompt_ids) < 8192
        assert first.messages[0].role == "system"
        for name in TOOLS:
            assert f'"name": "{name}"' in first.messages[0].content
        # the 16-token reply is cut at the episode's limit and holds no call: Kilo ends its run
        # with that text (exit 0), which the glue hands in as the answer
        [step] = traj.steps
        assert step.model_call.finish_reason == "length" and not step.tool_calls
        assert traj.termination == Termination.submitted and traj.meta["agent"]["exit_code"] == 0
        assert traj.answer.strip() == step.model_call.text.strip()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kilo_on_chat_completions_is_recorded_and_triaged(tokenizer, tmp_path):
    run_on_the_tiny_random_model(installed(), tokenizer, tmp_path / "run", "chat")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kilo_on_the_responses_api_is_recorded_and_triaged(tokenizer, tmp_path):
    spec = installed(KILO_PROVIDER_PACKAGE="@ai-sdk/openai")
    run_on_the_tiny_random_model(spec, tokenizer, tmp_path / "run", "responses")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kilo_solves_a_claweval_service_task_through_the_mcp_tools():
    """Kilo lists the episode's MCP server (the task's notes tools, a remote MCP server in the
    config kilo.py writes, shown as harnessrl_<tool>), the scripted model calls two of them, Kilo
    runs them over MCP, harnessrl runs them in the episode against the task's notes service, and
    the task's own grader passes it."""
    installed()  # skips where Kilo is not installed
    spec = load_spec(SPEC)
    solve_notes_through(spec, "harnessrl_")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ["@ai-sdk/openai-compatible", "@ai-sdk/openai"])
def test_kilo_solves_two_workspace_tasks_through_its_bash_tool(api):
    """A scripted policy answers Kilo's conversation with each task's solution in its own `bash`
    tool, in both of its dialects: Kilo runs the commands, sends their output back, and both
    tasks pass, one recorded call per solution call."""
    installed()  # skips where Kilo is not installed
    spec = load_spec(SPEC)
    spec = spec.model_copy(update={"env": {**spec.env, "KILO_PROVIDER_PACKAGE": api}})
    check_solved_through_bash(spec, FAMILIES)
