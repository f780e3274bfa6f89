"""Task tools over MCP: an external episode serves its task's tools to the agent program as a
Model Context Protocol server, over MCP's Streamable HTTP transport, on the recording endpoint:

    http://127.0.0.1:PORT/episodes/<token>/mcp      ($HARNESSRL_MCP_URL in the program's environment)

Which tools: the spec's `mcp_tools` (`served_tools`). `auto`, the default, serves the task's
tools that an agent program has no stand-in of its own for: every tool but the workspace file
tools (an agent reads and writes the same workspace with its own) and `submit` (a program
submits by writing the answer file); `all` the file tools too; `none` no server at all. An
episode that serves no tool has no route and no $HARNESSRL_MCP_URL.

Every `tools/call` runs in the episode's environment through the code the built-in loops run
their calls with (`check_tool_call`, then `run_tool`: the same argument checks, the same
`env.calls`, so a Claw-Eval task's service tools add their dispatches). Its result is recorded
in the trajectory (ExternalEpisode.tool_called): as the result of the call the model's reply
made, where a recorded step named it (an agent shows the tool to its model under a name of its
own, such as Claude Code's and Codex's `mcp__harnessrl__<tool>`: `names_tool`), and in the
trajectory's meta (`mcp.calls`, every call in order). A call of a tool the server does not serve
is a JSON-RPC error and a blocked call (`unknown_tool`); arguments the tool's schema refuses are
a result with `isError` and a blocked call (`invalid_arguments`), so that the model can correct
them; a tool that crashes makes the episode an infrastructure error, as in the loops.

The protocol is implemented here rather than with the official `mcp` SDK: what the episode
serves is a handful of methods (`initialize`, `notifications/initialized`, `ping`,
`tools/list`, `tools/call`) answered with one JSON response each and no session, whereas the
SDK's Streamable HTTP server runs its own session manager, which must be started inside the
application's lifespan, and checks a call's arguments against the tool's schema itself before
the handler sees it (harnessrl's own check, and its record of a refused call, must decide). The
SDK is not a dependency of harnessrl's core either. Its client is what the tests talk to this
server with. Served: POST with one JSON-RPC message or a batch of them; a request is answered
200 with `application/json`, a notification or a response 202 with no body. GET (a stream the
server could push on) and DELETE (the end of a session) are 405, as the transport allows a
server without a stream or sessions to answer. Protocol versions: the client's when it is one of
PROTOCOL_VERSIONS, else the newest of them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from harnessrl.harness.loops import InfraError, check_tool_call, run_tool
from harnessrl.tasks.base import Environment, Tool
from harnessrl.tasks.workspace import WORKSPACE_TOOLS
from harnessrl.types import BlockReason, ToolCall, ToolResult

if TYPE_CHECKING:
    from harnessrl.tasks.base import Task

SERVER_NAME = "harnessrl"  # the name the example glue gives the server in each agent's config
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  # newest first
MCP_TOOL_CHOICES = ("auto", "all", "none")
METHODS = "initialize, ping, tools/list and tools/call"
# JSON-RPC error codes
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
ENDED = -32000  # the episode has ended: nothing more runs


def served_tools(task: Task, choice: str) -> list[Tool]:
    """The tools of `task` an episode serves over MCP under the spec's `mcp_tools` choice."""
    if choice not in MCP_TOOL_CHOICES:
        raise ValueError(f"mcp_tools must be one of {', '.join(MCP_TOOL_CHOICES)}, not {choice!r}")
    if choice == "none":
        return []
    own = {t.fn for t in WORKSPACE_TOOLS}  # the agent's own file tools stand in for these
    return [t for t in task.tools if t.name != "submit" and (choice == "all" or t.fn not in own)]


def names_tool(agent_name: str, tool: str) -> bool:
    """Whether the name under which an agent showed its model a tool is the served `tool`: the
    same name, or the name behind a prefix naming this server (`mcp__harnessrl__notes_add`,
    `harnessrl__notes_add`, `harnessrl.notes_add`)."""
    if agent_name == tool:
        return True
    if not agent_name.endswith(tool):
        return False
    prefix = agent_name[: -len(tool)]
    return prefix != prefix.rstrip("_.-/:") and prefix.rstrip("_.-/:").endswith(SERVER_NAME)


def find_call(open_calls: Iterable[tuple[int, int, ToolCall]], tool: str, arguments: Any) -> tuple[int, int] | None:
    """Which recorded call of the model an MCP call of `tool` carries out: among `open_calls`
    ((step, position, call) of the calls whose result has not come yet, in order), the first that
    names the tool with the same arguments, else the first that names it."""
    named = [(step, k, call) for step, k, call in open_calls if names_tool(call.name, tool)]
    same = [(step, k) for step, k, call in named if call.arguments == arguments]
    if same:
        return same[0]
    return (named[0][0], named[0][1]) if named else None


def _error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def _result(rid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


class TaskToolServer:
    """One episode's task tools as an MCP server: `handle` answers one JSON-RPC message. Calls run
    one at a time (the environment is the loops' single-threaded one), on the caller's thread.

    `on_call(call, result)` is told every call (the tool's own name and the arguments as sent)
    and its result, blocked ones included; `on_crash(message)` a tool that crashed."""

    def __init__(
        self,
        tools: list[Tool],
        env: Environment,
        on_call: Callable[[ToolCall, ToolResult], None],
        on_crash: Callable[[str], None],
    ):
        self.tools = tools
        self.env = env
        self._on_call = on_call
        self._on_crash = on_crash
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """The episode has ended: waits for a call still running; nothing runs after it."""
        with self._lock:
            self._closed = True

    def handle(self, message: Any) -> dict[str, Any] | None:
        """The response to one JSON-RPC message; None for a notification or a response."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(None, INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        if "method" not in message or "id" not in message:
            return None  # a notification (notifications/initialized, cancellations) or a response
        rid, method, params = message["id"], message["method"], message.get("params")
        if params is None:
            params = {}
        if not isinstance(method, str) or not isinstance(params, dict):
            return _error(rid, INVALID_REQUEST, "'method' must be a string and 'params' an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
            return _result(
                rid,
                {
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": SERVER_NAME, "version": _version()},
                },
            )
        if method == "ping":
            return _result(rid, {})
        if method == "tools/list":
            listed = [{"name": t.name, "description": t.description, "inputSchema": t.parameters} for t in self.tools]
            return _result(rid, {"tools": listed})
        if method == "tools/call":
            return self._call(rid, params)
        return _error(rid, METHOD_NOT_FOUND, f"method not served: {method!r} (this server serves {METHODS})")

    def _call(self, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str):
            return _error(rid, INVALID_PARAMS, "tools/call needs the tool's 'name'")
        if arguments is None:
            arguments = {}
        call = ToolCall(name=name, arguments=arguments if isinstance(arguments, dict) else {})
        with self._lock:
            if self._closed:
                return _error(rid, ENDED, "the episode has ended")
            tool, args, refusal = check_tool_call(call, self.tools, listed_as="served over MCP")
            if tool is not None and not isinstance(arguments, dict):
                call = call.model_copy(update={"raw": json.dumps(arguments)})
                output = f"invalid arguments for {name}: arguments must be an object, got {type(arguments).__name__}"
                refusal = ToolResult(name=name, output=output, ok=False, blocked=BlockReason.invalid_arguments)
            if refusal is not None:
                self._on_call(call, refusal)
                if tool is None:  # the request names nothing this server serves
                    return _error(rid, INVALID_PARAMS, refusal.output)
                return _result(rid, _content(refusal))
            assert tool is not None  # (check_tool_call refuses a call no tool takes)
            try:
                result = run_tool(self.env, tool, call, args)
            except InfraError as e:
                self._on_crash(str(e))
                return _error(rid, INTERNAL_ERROR, "the tool failed on harnessrl's side; the episode ends")
            self._on_call(call, result)
            return _result(rid, _content(result))


def _content(result: ToolResult) -> dict[str, Any]:
    """A tool result as MCP's CallToolResult: its text, and whether it is an error."""
    return {"content": [{"type": "text", "text": result.output}], "isError": not result.ok}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("harnessrl")
    except PackageNotFoundError:
        return "0"


async def serve(request: Request, server: TaskToolServer, refused: Callable[[int, str], None]) -> Response:
    """The HTTP side of the transport for one request to an episode's server; `refused(status,
    message)` is told a request that cannot be served (a body that is not JSON-RPC)."""
    if request.method != "POST":
        body = _error(None, METHOD_NOT_FOUND, f"{request.method} is not served: this server answers POST only")
        return JSONResponse(body, status_code=405, headers={"Allow": "POST"})
    raw = await request.body()
    try:
        message = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        text = f"the body is not JSON: {e}"
        refused(400, text)
        return JSONResponse(_error(None, PARSE_ERROR, text), status_code=400)
    if isinstance(message, list):  # a batch (protocol version 2025-03-26)
        if not message:
            refused(400, "an empty batch")
            return JSONResponse(_error(None, INVALID_REQUEST, "an empty batch"), status_code=400)
        answers = [a for a in [await asyncio.to_thread(server.handle, m) for m in message] if a is not None]
        return JSONResponse(answers) if answers else Response(status_code=202)
    answer = await asyncio.to_thread(server.handle, message)
    if answer is None:
        return Response(status_code=202)
    status = 400 if answer.get("id") is None and "error" in answer else 200
    if status == 400:
        refused(400, answer["error"]["message"])
    return JSONResponse(answer, status_code=status)
