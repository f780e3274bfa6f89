"""A minimal agent program, usable as a harnessrl external harness (see minimal.yaml).

It is an ordinary OpenAI-client agent: it reads its task, offers the model four tools of its
own (list_dir, read_file, write_file, submit) as native `tools`, runs the calls the model makes
on the files of its working folder, and sends the results back, until the model calls submit
or answers without a tool call. Nothing in it knows harnessrl beyond the environment variables
of the contract (docs/external-harness.md):

    OPENAI_BASE_URL, OPENAI_API_KEY  read by the openai client itself
    OPENAI_MODEL                     the model name to send
    HARNESSRL_TASK_FILE              the task, as text
    HARNESSRL_WORKSPACE              the folder to work in (also the current folder)
    HARNESSRL_ANSWER_FILE            where the final answer goes
    HARNESSRL_MAX_MODEL_CALLS        the episode's budget of model calls
    HARNESSRL_MCP_URL                where the episode serves its task's own tools over MCP
                                     (Streamable HTTP), when it has any

With HARNESSRL_MCP_URL set, the tools listed there are offered to the model beside the four
own ones, and a call of one of them goes to the server (`tools/call`): a few lines of JSON-RPC
over HTTP with the standard library. AGENT_MAX_TOKENS (set in minimal.yaml's env) bounds each reply.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

from openai import OpenAI

SYSTEM = (
    "You solve tasks on the files of a workspace with the tools you are given. "
    "Call one tool at a time; paths are relative to the workspace. "
    "When the task is done, call submit with your final answer (empty if the task asks for none)."
)
PATH = {"type": "string", "description": "path relative to the workspace"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_dir",
            "description": "List the files in a directory of the workspace.",
            "parameters": {"type": "object", "properties": {"path": PATH}, "required": []},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file.",
            "parameters": {"type": "object", "properties": {"path": PATH}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a text file.",
            "parameters": {
                "type": "object",
                "properties": {"path": PATH, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish the task with your final answer.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": []},
        },
    },
]
WORKSPACE = Path(os.environ["HARNESSRL_WORKSPACE"]).resolve()


class ToolError(Exception):
    pass


def inside(path: str) -> Path:
    """A workspace path; refuses anything that leaves the workspace."""
    target = (WORKSPACE / (path or ".")).resolve()
    if target != WORKSPACE and WORKSPACE not in target.parents:
        raise ToolError(f"{path!r} is outside the workspace")
    return target


def run_tool(name: str, args: dict) -> str:
    if name == "list_dir":
        folder = inside(args.get("path", "."))
        if not folder.is_dir():
            raise ToolError(f"no such directory: {args.get('path')}")
        return "\n".join(p.name + ("/" if p.is_dir() else "") for p in sorted(folder.iterdir())) or "(empty)"
    if name == "read_file":
        target = inside(args["path"])
        if not target.is_file():
            raise ToolError(f"no such file: {args['path']}")
        return target.read_text(errors="replace")[:8000]
    if name == "write_file":
        target = inside(args["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(args["content"])
        return f"Wrote {len(args['content'])} characters to {args['path']}."
    raise ToolError(f"unknown tool {name!r}")


class TaskTools:
    """The task's own tools, served over MCP at `url`: listed once, each call a JSON-RPC request."""

    def __init__(self, url: str):
        self.url = url
        self.next_id = 0
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "minimal"}})
        self.rpc("notifications/initialized")
        self.tools = self.rpc("tools/list")["tools"]
        self.names = {t["name"] for t in self.tools}

    def rpc(self, method: str, params: dict | None = None) -> dict:
        message: dict = {"jsonrpc": "2.0", "method": method, "params": params or {}}
        if not method.startswith("notifications/"):
            self.next_id += 1
            message["id"] = self.next_id
        request = urllib.request.Request(
            self.url,
            data=json.dumps(message).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            body = response.read()
        if "id" not in message:
            return {}
        answer = json.loads(body)
        if "error" in answer:
            raise ToolError(answer["error"]["message"])
        return answer["result"]

    def offered(self) -> list[dict]:
        """The tools as the model is offered them (OpenAI's function tools)."""
        return [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t["inputSchema"],
                },
            }
            for t in self.tools
        ]

    def call(self, name: str, args: dict) -> str:
        result = self.rpc("tools/call", {"name": name, "arguments": args})
        text = "\n".join(part.get("text", "") for part in result.get("content", []) if part.get("type") == "text")
        return f"error: {text}" if result.get("isError") else text


def submit(answer: str) -> int:
    Path(os.environ["HARNESSRL_ANSWER_FILE"]).write_text(answer)
    return 0


def main() -> int:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    model = os.environ.get("OPENAI_MODEL", "model")
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
    task = Path(os.environ["HARNESSRL_TASK_FILE"]).read_text()
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    served = TaskTools(os.environ["HARNESSRL_MCP_URL"]) if os.environ.get("HARNESSRL_MCP_URL") else None
    # a served tool of the same name as an own one (mcp_tools: all) takes its place
    tools = [t for t in TOOLS if not served or t["function"]["name"] not in served.names]
    tools += served.offered() if served else []
    for _ in range(int(os.environ.get("HARNESSRL_MAX_MODEL_CALLS", "20"))):
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=max_tokens)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:  # a reply without a tool call is the final answer
            return submit(message.content or "")
        for call in message.tool_calls:
            try:
                args = json.loads(call.function.arguments or "{}")
                if call.function.name == "submit":
                    return submit(str(args.get("answer", "")))
                if served is not None and call.function.name in served.names:
                    output = served.call(call.function.name, args)
                else:
                    output = run_tool(call.function.name, args)
            except (ToolError, KeyError, TypeError, ValueError, OSError) as exc:
                output = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print("minimal agent: out of model calls without an answer", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
