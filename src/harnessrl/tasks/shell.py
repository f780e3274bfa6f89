"""The sandboxed `shell(command)` tool: `bash -c command` inside the episode's workspace.

Offered only when a task says its environment supports it (`Task.offers_shell`) and the harness
turns it on (`capabilities.shell.enabled`): see docs/suites.md, "Sandboxed shell". The command
runs through `run_sandboxed`, so it sees only the system folders, a fresh /tmp and the workspace
(no task folder, grader, checkout or home: docs/suites.md, "What a sandboxed command sees"), can
write only in the workspace and /tmp, and is stopped by the limits.
The model sees the head and tail of a long output around a "[... N characters cut ...]" marker;
the run store keeps all of it (up to the runner's per-stream cap) as `ToolResult.full_output`.
A command killed by a limit is an ordinary failed call whose output says why.

A task written for a fixed workspace path (`Task.workspace_mount`, e.g. `/app` for a Harbor task)
gets the live workspace mounted read-write at that path and its commands start there, so
`cat /app/x` and `echo y > /app/z` act on the files the file tools and the grader see.
"""

from __future__ import annotations

import shutil

from harnessrl.tasks.base import Environment, Tool, ToolOutput
from harnessrl.tasks.sandbox_exec import ExecLimits, ExecResult, run_sandboxed

SHELL_DESCRIPTION = (
    "Run a bash command in the workspace folder and return its output. The rest of the file "
    "system is read-only and there is no network; long-running commands are stopped."
)


def shell_tool(limits: ExecLimits, shown_chars: int) -> Tool:
    """A `shell` tool that runs each command under `limits` and shows at most `shown_chars`."""

    def shell(env: Environment, command: str) -> ToolOutput:
        if env.workspace is None:
            raise RuntimeError("the shell tool needs a workspace, and the task has none")
        argv = ["bash", "-c", command] if shutil.which("bash") else ["sh", "-c", command]
        root = env.workspace.root
        mount = env.workspace_mount
        try:
            result = run_sandboxed(
                argv, workdir=root, limits=limits, mounts={mount: root} if mount else None, cwd_in_sandbox=mount
            )
        except ValueError as e:  # the sandbox cannot show the workspace where the task expects it
            raise RuntimeError(f"the shell cannot run this task's commands: {e}") from None
        full = render_result(result)
        return ToolOutput(shown=head_and_tail(full, shown_chars), full=full, ok=result.returncode == 0)

    parameters = {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "a bash command line"}},
        "required": ["command"],
    }
    return Tool("shell", SHELL_DESCRIPTION, parameters, shell)


def render_result(result: ExecResult) -> str:
    """The command's output as the model reads it: stdout, then stderr, then how it ended."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.timed_out:
        parts.append(f"[killed: {result.reason}]")
    elif result.reason:
        parts.append(f"[exit code {result.returncode}: {result.reason}]")
    else:
        parts.append(f"[exit code {result.returncode}]")
    return "\n".join(parts)


def head_and_tail(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its head and tail around a cut marker."""
    if len(text) <= limit:
        return text
    tail = limit // 3  # errors and the exit status are at the end: keep a good part of it
    head = limit - tail
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"
