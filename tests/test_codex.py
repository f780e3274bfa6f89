"""Codex CLI (npm `@openai/codex`), unmodified, as an external harness (examples/agents/codex.yaml).

`codex exec`, with the episode's recording endpoint as a Responses API model provider, solves
two `workspace` tasks (a file read and answered, a file copied). The policy is scripted: it
answers Codex's conversation with the task's solution in Codex's own tools (`exec_command` to
read, the custom freeform `apply_patch` to write; its last message is the answer), because no
model here can act on Codex's prompt (7,673 tokens for its first request, within the embedded
model's 8,192 but leaving it ~500 for the episode). Then the same two tasks on a tiny random
model with a 32,768-token context: the endpoint serves Codex's real prompt to a real (random)
model, and whatever it writes the episode is Codex's, recorded and triaged, never an
infrastructure error.

Skipped, saying why, where Codex is not installed (examples/agents/install_codex.sh).
"""

from __future__ import annotations

import platform
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
from harnessrl.types import Termination, ToolCall

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "agents" / "codex.yaml"
PREFIX = ROOT / ".agents"  # where install_codex.sh puts Codex by default
FAMILIES = ("answer_from_file", "copy_content")


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed() -> ExternalHarnessSpec:
    arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    package = PREFIX / "codex" / "node_modules" / "@openai" / f"codex-linux-{arch}" / "package.json"
    if not package.exists():
        pytest.skip(f"Codex is not installed under {PREFIX} (sh examples/agents/install_codex.sh)")
    spec = load_spec(SPEC)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def patch_adding(path: str, content: str) -> str:
    """apply_patch's input that creates `path` holding `content` (whole lines)."""
    lines = "".join(f"+{line}\n" for line in content.splitlines())
    return f"*** Begin Patch\n*** Add File: {path}\n{lines}*** End Patch\n"


def as_codex(call: dict) -> str:
    """One solution call in Codex's tools, written in the spec's tool_protocol (hermes): read_file
    is a shell `cat`, write_file an apply_patch (a custom tool: its one argument is the patch
    text), submit the plain last message that Codex writes as the answer."""
    args = call["arguments"]
    if call["name"] == "submit":
        return args.get("answer") or "Done."
    if call["name"] == "read_file":
        made = ToolCall(name="exec_command", arguments={"cmd": f"cat {args['path']}"})
    else:
        made = ToolCall(name="apply_patch", arguments={"input": patch_adding(args["path"], args["content"])})
    return get_protocol("hermes").render_call(made)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_codex_solves_two_workspace_tasks_through_the_recording_endpoint():
    spec = installed()
    tasks = workspace_tasks(FAMILIES)
    runner = Runner(solution_policy(tasks, as_codex), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        check_solved_step_by_step(traj, task)
        for step, call in zip(traj.steps[:-1], task.solution):
            [made] = step.tool_calls
            # Codex ran the tool itself and sent its result back (custom_tool_call_output for apply_patch)
            assert step.tool_results and step.tool_results[0].output
            if call["name"] == "read_file":
                assert made.name == "exec_command" and call["arguments"]["path"] in made.arguments["cmd"]
            else:
                assert made.name == "apply_patch" and made.arguments["input"].startswith("*** Begin Patch")
        # Codex's own prompt reached the model: developer messages (system here), its tools with
        # apply_patch shown as a function taking the grammar's text, the task in a user turn
        first = traj.steps[0].model_call
        system = "\n".join(m.content or "" for m in first.messages if m.role == "system")
        assert "apply_patch" in system and "*** Begin Patch" in system and "exec_command" in system
        assert any(task.instruction in (m.content or "") for m in first.messages if m.role == "user")
        # measured here: 7,673 tokens for the first request (the gpt-5.5 family's prompt and tools)
        assert len(first.prompt_ids) > 6000
        if task.family == "answer_from_file":
            assert traj.answer == task.solution[-1]["arguments"]["answer"]
            # the file's content came back as the result of Codex's own shell
            assert traj.answer in traj.steps[0].tool_results[0].output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_codex_on_a_long_context_tiny_random_model_is_recorded_and_triaged(tokenizer, tmp_path):
    """Codex's real prompt on a real (random) model: 32,768 positions, so nothing is refused."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    spec = installed()
    model = tiny_random_model()
    model.config.max_position_embeddings = 32768  # rotary positions are computed, not learned
    # a short reply keeps the random model's turn cheap
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_new_tokens": 16})})
    policy = HFPolicy(model, tokenizer, name="tiny-random-32k")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    trajectories = runner.run(make_jobs(workspace_tasks(FAMILIES), [spec], 1))
    assert len(trajectories) == 2
    for traj in check_recorded_and_triaged(trajectories, tmp_path / "run"):
        # Codex's real prompt (measured here: 7,673 tokens) reached the model
        assert all(len(step.model_call.prompt_ids) > 6000 for step in traj.steps)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_codex_is_served_by_harnessrl_serve_with_a_tool_call_parser(tokenizer, tmp_path):
    """`harnessrl serve --enable-auto-tool-choice --tool-call-parser hermes` takes Codex's requests
    (developer messages, its custom apply_patch tool, encrypted reasoning asked for) as the
    recording endpoint does. Codex sets no output limit, so the random model, which never stops,
    writes to the end of its context and the response is `incomplete`, which Codex reports as
    its error: the request was served, not refused. A context just past Codex's first prompt
    (7,676 tokens here) keeps that reply short."""
    import os
    import re
    import subprocess
    import sys

    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy
    from harnessrl.serve import serving

    spec = installed()
    model = tiny_random_model()
    model.config.max_position_embeddings = 7800
    policy = HFPolicy(model, tokenizer, name="tiny-random")
    (tmp_path / "home").mkdir()
    (tmp_path / "workspace").mkdir()
    (tmp_path / "task.txt").write_text("Say hello.", encoding="utf-8")
    with serving(policy, enable_auto_tool_choice=True, tool_call_parser="hermes") as url:
        env = {
            **{k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
            **spec.env,
            "HOME": str(tmp_path / "home"),
            "OPENAI_BASE_URL": url,
            "OPENAI_API_KEY": "EMPTY",
            "OPENAI_MODEL": "tiny-random",
            "HARNESSRL_TASK_FILE": str(tmp_path / "task.txt"),
            "HARNESSRL_WORKSPACE": str(tmp_path / "workspace"),
            "HARNESSRL_ANSWER_FILE": str(tmp_path / "answer.txt"),
        }
        ran = subprocess.run(
            [sys.executable, spec.argv()[1], str(PREFIX)], env=env, capture_output=True, text=True, timeout=240
        )
    policy.close()
    assert "Incomplete response returned, reason: max_output_tokens" in ran.stderr, ran.stderr[-3000:]
    # no 400 from the server (a bare "400" would also match inside Codex's random session id)
    assert "invalid_request_error" not in ran.stderr and not re.search(r"\b400\b", ran.stderr), ran.stderr[-3000:]
    assert ran.returncode == 1 and not (tmp_path / "answer.txt").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_model_family_codex_does_not_know_ends_the_episode_saying_so():
    spec = installed()
    spec = spec.model_copy(update={"env": {**spec.env, "CODEX_MODEL_FAMILY": "gpt-none"}})
    [task] = workspace_tasks(("answer_from_file",))
    runner = Runner(solution_policy([task], as_codex), SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    [traj] = runner.run(make_jobs([task], [spec], 1))
    # it never reached the model: an infrastructure error saying why, never a scored 0
    assert traj.termination == Termination.error and not traj.steps and traj.is_infra_error
    assert "CODEX_MODEL_FAMILY 'gpt-none' is not in Codex's bundled catalog: " in traj.infra_error
    assert "gpt-5.5" in traj.infra_error  # the families it has are named


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_codex_solves_a_claweval_service_task_through_the_mcp_tools():
    """Codex lists the episode's MCP server from the config.toml codex.py writes (the task's notes
    tools, a namespace mcp__harnessrl shown as mcp__harnessrl__<tool>), the scripted model calls
    two of them, Codex runs them over MCP, harnessrl runs them in the episode against the task's
    notes service, and the task's own grader, reading their dispatches and the service's audit,
    passes it."""
    spec = installed()
    solve_notes_through(spec, "mcp__harnessrl__")
