"""Task tools over MCP (harness/mcp_tools.py): an external episode serves its task's tools at
/episodes/<token>/mcp on the recording endpoint. Plain JSON-RPC over HTTP (the handshake, the
tool list, a call run in the episode's environment and recorded as the result of the model's call
that asked for it, an unknown tool a JSON-RPC error and a blocked call, bad arguments, a tool that
crashes, the HTTP answers a client may meet) and the official `mcp` SDK's own client; then the
minimal example agent solving the Claw-Eval fixture's service task through the served tools."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import check_notes_solved, claweval_notes_task, notes_solver

from harnessrl.harness.external import ExternalEpisode
from harnessrl.harness.mcp_tools import PROTOCOL_VERSIONS, TaskToolServer, find_call, names_tool, served_tools
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.recording import RecordingEndpoint
from harnessrl.harness.spec import ExternalHarnessSpec, load_spec, parse_spec
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job, Runner, make_jobs
from harnessrl.tasks.base import SUBMIT_TOOL, Environment, Task, Tool, ToolFailed
from harnessrl.tasks.workspace import WORKSPACE_TOOLS
from harnessrl.triage import first_failure_signal
from harnessrl.types import ActionKind, BlockReason, Termination, ToolCall, Trajectory

ROOT = Path(__file__).resolve().parents[1]


def add_note(env: Environment, title: str) -> str:
    if not title.strip():
        raise ToolFailed("a note needs a title")
    env.state.setdefault("notes", []).append(title)
    return f"added {title!r}"


def explode(env: Environment) -> str:
    raise RuntimeError("the notes store is gone")


NOTE_TOOLS = [
    Tool(
        "add_note",
        "Add a note.",
        {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
        add_note,
    ),
    Tool("explode", "A tool whose code fails.", {"type": "object", "properties": {}}, explode),
]


def notes_task() -> Task:
    """A task with the workspace file tools, two tools of its own and submit."""
    return Task(
        id="notes/dev/00000",
        suite="notes",
        family="notes",
        split="dev",
        seed=0,
        instruction="Add a note titled 'milk'.",
        tools=[*WORKSPACE_TOOLS, *NOTE_TOOLS, SUBMIT_TOOL],
        setup=lambda env: None,
        check=lambda env: {"added": float("milk" in env.state.get("notes", []))},
    )


def spec(**fields) -> ExternalHarnessSpec:
    made = parse_spec({"name": "agent", "kind": "external", "command": ["true"], **fields})
    assert isinstance(made, ExternalHarnessSpec)
    return made


def hermes(name: str, **arguments) -> str:
    return get_protocol("hermes").render_call(ToolCall(name=name, arguments=arguments))


def post(url: str, body, raw: bytes | None = None, method: str = "POST") -> tuple[int, dict | list | None]:
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    req = urllib.request.Request(url, data=data if method == "POST" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text else None


def rpc(url: str, rid: int, method: str, params: dict | None = None) -> tuple[int, dict]:
    message = {"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params is not None else {})}
    status, body = post(url, message)
    assert isinstance(body, dict)
    return status, body


class Served:
    """An external episode of `notes_task` registered on a running endpoint, serving its tools."""

    def __init__(self, tokenizer, replies: list[str], choice: str = "auto"):
        self.task = notes_task()
        self.env = self.task.make_env()
        job = Job(self.task, spec(mcp_tools=choice), 0)
        policy = ScriptedPolicy(replies, tokenizer=tokenizer)
        self.episode = ExternalEpisode(job, policy, SamplingParams(), lambda latency, call: None)
        tools = served_tools(self.task, choice)
        self.episode.tool_server = TaskToolServer(tools, self.env, self.episode.tool_called, self.episode.tool_crashed)
        self.endpoint = RecordingEndpoint()
        self.endpoint.start()
        self.endpoint.register(self.episode)
        self.url = self.endpoint.mcp_url(self.episode)

    def chat(self, messages: list[dict], tools: list[str]) -> dict:
        offered = [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
            for n in tools
        ]
        status, body = post(
            self.endpoint.url(self.episode) + "/chat/completions",
            {"model": "m", "messages": messages, "tools": offered},
        )
        assert status == 200, body
        assert isinstance(body, dict)
        return body["choices"][0]["message"]

    def close(self) -> None:
        self.endpoint.stop()
        self.env.close()


@pytest.fixture
def served(tokenizer):
    made: list[Served] = []

    def make(replies: list[str], choice: str = "auto") -> Served:
        made.append(Served(tokenizer, replies, choice))
        return made[-1]

    yield make
    for s in made:
        s.close()


# ------------------------------------------------------------------------------- which tools, which call


def test_auto_serves_what_an_agent_has_no_own_tool_for_and_all_adds_the_file_tools():
    task = notes_task()
    assert [t.name for t in served_tools(task, "auto")] == ["add_note", "explode"]
    assert [t.name for t in served_tools(task, "all")] == [t.name for t in WORKSPACE_TOOLS] + ["add_note", "explode"]
    assert served_tools(task, "none") == []
    assert spec().mcp_tools == "auto"
    with pytest.raises(ValueError, match="mcp_tools"):
        parse_spec({"name": "a", "kind": "external", "command": ["true"], "mcp_tools": "some"})
    with pytest.raises(ValueError, match="HARNESSRL_MCP_URL is set by harnessrl"):
        parse_spec({"name": "a", "kind": "external", "command": ["true"], "env": {"HARNESSRL_MCP_URL": "x"}})


def test_an_agents_name_for_a_served_tool_is_matched_to_the_tool():
    assert names_tool("add_note", "add_note")
    for agent_name in ("mcp__harnessrl__add_note", "harnessrl__add_note", "harnessrl.add_note"):
        assert names_tool(agent_name, "add_note"), agent_name
    for agent_name in ("mcp__harnessrl__bad_note", "mcp__harnessrl__add_note2", "mcp__other__add_note", "xadd_note"):
        assert not names_tool(agent_name, "add_note"), agent_name
    assert not names_tool("mcp__harnessrl__add_note", "note")  # a tool whose name ends another's
    calls = [
        (0, 0, ToolCall(name="Bash", arguments={"command": "ls"})),
        (1, 0, ToolCall(name="mcp__harnessrl__add_note", arguments={"title": "a"})),
        (1, 1, ToolCall(name="mcp__harnessrl__add_note", arguments={"title": "b"})),
    ]
    assert find_call(calls, "add_note", {"title": "b"}) == (1, 1)  # the same arguments first
    assert find_call(calls, "add_note", {"title": "c"}) == (1, 0)  # else the first that names it
    assert find_call(calls, "explode", {}) is None


# ------------------------------------------------------------------------------- the protocol over HTTP


def test_handshake_tool_list_and_a_call_recorded_as_the_result_of_the_models_call(served):
    s = served([hermes("mcp__harnessrl__add_note", title="milk"), "Added."])
    status, body = rpc(s.url, 1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    assert status == 200 and body["id"] == 1
    result = body["result"]
    assert result["protocolVersion"] == "2025-06-18" and result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "harnessrl"
    # a version it does not know: the newest it speaks
    _, body = rpc(s.url, 2, "initialize", {"protocolVersion": "1999-01-01"})
    assert body["result"]["protocolVersion"] == PROTOCOL_VERSIONS[0] == "2025-11-25"
    assert post(s.url, {"jsonrpc": "2.0", "method": "notifications/initialized"}) == (202, None)
    assert rpc(s.url, 3, "ping")[1]["result"] == {}
    _, body = rpc(s.url, 4, "tools/list")
    listed = body["result"]["tools"]
    assert [t["name"] for t in listed] == ["add_note", "explode"]
    assert listed[0]["inputSchema"]["required"] == ["title"] and listed[0]["description"] == "Add a note."

    # the model asks for the tool under the agent's name for it; the agent calls it over MCP
    messages = [{"role": "user", "content": s.task.instruction}]
    reply = s.chat(messages, ["mcp__harnessrl__add_note", "Bash"])
    [made] = reply["tool_calls"]
    assert made["function"]["name"] == "mcp__harnessrl__add_note"
    _, body = rpc(s.url, 5, "tools/call", {"name": "add_note", "arguments": {"title": "milk"}})
    assert body["result"] == {"content": [{"type": "text", "text": "added 'milk'"}], "isError": False}
    assert s.env.state["notes"] == ["milk"] and s.env.calls == [("add_note", {"title": "milk"}, "added 'milk'")]
    # the agent sends its own rendering of the result back: the tool's own result stays recorded
    messages += [reply, {"role": "tool", "tool_call_id": made["id"], "content": "[MCP] added 'milk'"}]
    assert s.chat(messages, ["mcp__harnessrl__add_note"])["content"] == "Added."
    first, second = s.episode.steps()
    assert first.action == ActionKind.tool_calls and second.action == ActionKind.text
    [result] = first.tool_results
    assert result.name == "add_note" and result.output == "added 'milk'" and result.ok
    [kept] = s.episode.tool_calls
    assert kept["call"] == {"name": "add_note", "arguments": {"title": "milk"}, "raw": ""}
    assert kept["step"] == 0 and kept["position"] == 0 and kept["result"]["output"] == "added 'milk'"
    assert s.task.grade(s.env).passed


def test_an_unknown_tool_is_a_jsonrpc_error_and_a_blocked_call_triage_sees(served):
    s = served([hermes("mcp__harnessrl__add_notes", title="milk"), "Gave up."])
    messages = [{"role": "user", "content": s.task.instruction}]
    reply = s.chat(messages, ["mcp__harnessrl__add_notes"])  # the agent offers a name nothing serves
    status, body = rpc(s.url, 7, "tools/call", {"name": "add_notes", "arguments": {"title": "milk"}})
    assert status == 200 and body["id"] == 7 and "result" not in body
    assert body["error"]["code"] == -32602
    assert body["error"]["message"] == "unknown tool 'add_notes' (served over MCP: add_note, explode)"
    assert s.env.calls == []  # nothing ran
    messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "error"}]
    s.chat(messages, [])
    [step, _] = s.episode.steps()
    [result] = step.tool_results
    assert result.blocked == BlockReason.unknown_tool and not result.ok
    [kept] = s.episode.tool_calls
    assert kept["result"]["blocked"] == "unknown_tool" and kept["step"] == 0
    # what triage reads of it: the step's blocked call
    record = Trajectory(
        episode_id="e",
        task_id=s.task.id,
        suite="notes",
        family="notes",
        split="dev",
        harness="agent",
        attempt=0,
        instruction="",
        steps=s.episode.steps(),
        termination=Termination.exited,
    )
    verdict = first_failure_signal(record)
    assert verdict is not None and verdict.cls == "blocked_call" and "unknown_tool" in verdict.evidence


def test_bad_arguments_are_a_tool_error_the_model_can_correct(served):
    s = served(["x"])
    _, body = rpc(s.url, 1, "tools/call", {"name": "add_note", "arguments": {"title": 5}})
    assert body["result"]["isError"] is True
    assert (
        body["result"]["content"][0]["text"]
        == "invalid arguments for add_note: argument 'title' must be string, got int"
    )
    _, body = rpc(s.url, 2, "tools/call", {"name": "add_note", "arguments": ["milk"]})
    assert "arguments must be an object, got list" in body["result"]["content"][0]["text"]
    _, body = rpc(s.url, 3, "tools/call", {"name": "add_note", "arguments": {"title": " "}})
    assert body["result"] == {"content": [{"type": "text", "text": "error: a note needs a title"}], "isError": True}
    blocked = [c["result"].get("blocked") for c in s.episode.tool_calls]
    assert blocked == ["invalid_arguments", "invalid_arguments", None]  # the last one ran and failed
    assert [c[0] for c in s.env.calls] == []  # a failure raised by the tool records no call, as in the loops


def test_a_tool_that_crashes_makes_the_episode_an_infrastructure_error(served):
    s = served(["x"])
    _, body = rpc(s.url, 1, "tools/call", {"name": "explode"})
    assert body["error"]["code"] == -32603
    assert s.episode.termination == Termination.error and s.episode.kill.is_set()
    assert "tool 'explode' crashed: RuntimeError: the notes store is gone" in s.episode.infra_error


def test_http_answers_other_methods_wrong_addresses_and_bodies(served):
    s = served(["x"])
    _, body = rpc(s.url, 1, "resources/list")
    assert body["error"]["code"] == -32601 and "tools/call" in body["error"]["message"]
    status, body = post(s.url, None, method="GET")  # no stream to open: 405, as the transport allows
    assert status == 405 and body["error"]["code"] == -32601
    status, body = post(s.url, None, raw=b"{not json")
    assert status == 400 and body["error"]["code"] == -32700
    assert [(r.route, r.status) for r in s.episode.refusals] == [("/mcp", 400)]
    # a batch: answers for its requests, none for its notification
    status, body = post(
        s.url,
        [
            {"jsonrpc": "2.0", "id": 1, "method": "ping"},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        ],
    )
    assert status == 200 and isinstance(body, list) and [a["id"] for a in body] == [1, 2]
    forged = ("y" if s.episode.token[0] == "x" else "x") + s.episode.token[1:]
    status, _ = post(s.url.replace(s.episode.token, forged), {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert status == 404
    # an episode that serves no tool has no server
    s.episode.tool_server = None
    status, body = post(s.url, {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert status == 404 and "serves no task tools" in json.dumps(body)
    # the episode's end: nothing runs after it
    s.endpoint.unregister(s.episode)
    assert post(s.url, {"jsonrpc": "2.0", "id": 1, "method": "ping"})[0] == 404


def test_a_closed_server_runs_nothing(served):
    s = served(["x"])
    assert s.episode.tool_server is not None
    s.episode.tool_server.close()
    _, body = rpc(s.url, 1, "tools/call", {"name": "add_note", "arguments": {"title": "late"}})
    assert body["error"]["message"] == "the episode has ended" and "notes" not in s.env.state


def test_the_official_mcp_client_lists_and_calls_the_tools(served):
    mcp = pytest.importorskip("mcp")
    from mcp.shared.exceptions import MCPError

    s = served(["x"])

    async def session() -> tuple:
        async with mcp.Client(s.url) as client:
            listed = await client.list_tools()
            done = await client.call_tool("add_note", {"title": "milk"})
            failed = await client.call_tool("add_note", {"title": ""})
            with pytest.raises(MCPError, match="unknown tool 'nope'"):
                await client.call_tool("nope", {})
            return client.protocol_version, listed, done, failed

    version, listed, done, failed = asyncio.run(session())
    assert version in PROTOCOL_VERSIONS
    assert [t.name for t in listed.tools] == ["add_note", "explode"]
    assert listed.tools[0].input_schema["properties"] == {"title": {"type": "string"}}
    assert done.is_error is False and done.content[0].text == "added 'milk'"
    assert failed.is_error is True and failed.content[0].text == "error: a note needs a title"
    assert s.env.state["notes"] == ["milk"]
    assert [c["result"].get("blocked") for c in s.episode.tool_calls] == [None, None, "unknown_tool"]


# ------------------------------------------------------------------------------- an agent program through them


def test_the_minimal_agent_solves_the_claweval_service_task_through_the_served_tools():
    """The fixture's S01 (a notes service): the minimal agent finds the served tools at
    $HARNESSRL_MCP_URL, offers them to the model beside its own, and the model's calls run in
    the episode through MCP; the task's own grader reads their dispatches and passes it."""
    task = claweval_notes_task()
    agent = load_spec(ROOT / "examples" / "agents" / "minimal.yaml")
    runner = Runner(notes_solver(""), SamplingParams(temperature=0.0), progress=False)
    [traj] = runner.run(make_jobs([task], [agent], 1))
    check_notes_solved(traj, "")
    # beside its own four tools
    assert '"name": "read_file"' in traj.steps[0].model_call.messages[0].content
