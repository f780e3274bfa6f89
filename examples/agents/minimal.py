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

AGENT_MAX_TOKENS (set in minimal.yaml's env) bounds each reply.
"""

from __future__ import annotations

import json
import os
import sys
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


def submit(answer: str) -> int:
    Path(os.environ["HARNESSRL_ANSWER_FILE"]).write_text(answer)
    return 0


def main() -> int:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
    model = os.environ.get("OPENAI_MODEL", "model")
    max_tokens = int(os.environ.get("AGENT_MAX_TOKENS", "256"))
    task = Path(os.environ["HARNESSRL_TASK_FILE"]).read_text()
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for _ in range(int(os.environ.get("HARNESSRL_MAX_MODEL_CALLS", "20"))):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=max_tokens)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:  # a reply without a tool call is the final answer
            return submit(message.content or "")
        for call in message.tool_calls:
            try:
                args = json.loads(call.function.arguments or "{}")
                if call.function.name == "submit":
                    return submit(str(args.get("answer", "")))
                output = run_tool(call.function.name, args)
            except (ToolError, KeyError, TypeError, ValueError, OSError) as exc:
                output = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print("minimal agent: out of model calls without an answer", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
