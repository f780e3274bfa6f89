"""The OpenAI Agents SDK (pip `openai-agents`) as a harnessrl external harness (openai_agents_sdk.yaml).

The SDK runs unmodified in its default mode: a model given by name goes to its OpenAI provider,
whose model is `OpenAIResponsesModel` (the Responses API, POST /v1/responses), on an AsyncOpenAI
client that reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment, so its requests reach
the episode's recording endpoint without any configuration. This file is only the glue the SDK
needs to be an agent at all: an `Agent` with function tools that act on the workspace, and
`Runner.run_sync` on the task. The tools are named and shaped like the `workspace` suite's
(list_dir, read_file, write_file, submit), so triage counts the files the agent read.

Tracing is off: the spec sets OPENAI_AGENTS_DISABLE_TRACING=1 (the SDK's documented switch), so
the SDK never posts traces to api.openai.com (its exporter does not use OPENAI_BASE_URL).

AGENT_MAX_TOKENS (set in the spec's env) bounds each reply.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agents import Agent, ModelSettings, Runner, StopAtTools, function_tool
from agents.exceptions import AgentsException

WORKSPACE = Path(os.environ["HARNESSRL_WORKSPACE"]).resolve()
INSTRUCTIONS = (
    "You solve tasks on the files of a workspace with the tools you are given. "
    "Call one tool at a time; paths are relative to the workspace. "
    "When the task is done, call submit with your final answer (empty if the task asks for none)."
)


def inside(path: str) -> Path:
    """A workspace path; refuses anything that leaves the workspace (the error goes to the model)."""
    target = (WORKSPACE / (path or ".")).resolve()
    if target != WORKSPACE and WORKSPACE not in target.parents:
        raise ValueError(f"{path!r} is outside the workspace")
    return target


@function_tool
def list_dir(path: str = ".") -> str:
    """List the files in a directory of the workspace.

    Args:
        path: the directory, relative to the workspace.
    """
    folder = inside(path)
    if not folder.is_dir():
        raise ValueError(f"no such directory: {path}")
    return "\n".join(p.name + ("/" if p.is_dir() else "") for p in sorted(folder.iterdir())) or "(empty)"


@function_tool
def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: the file, relative to the workspace.
    """
    target = inside(path)
    if not target.is_file():
        raise ValueError(f"no such file: {path}")
    return target.read_text(errors="replace")[:8000]


@function_tool
def write_file(path: str, content: str) -> str:
    """Create or overwrite a text file.

    Args:
        path: the file, relative to the workspace.
        content: the whole new content of the file.
    """
    target = inside(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    return f"Wrote {len(content)} characters to {path}."


@function_tool
def submit(answer: str = "") -> str:
    """Finish the task with your final answer.

    Args:
        answer: the final answer (empty if the task asks for none).
    """
    return answer


def main() -> int:
    agent = Agent(
        name="workspace agent",
        instructions=INSTRUCTIONS,
        model=os.environ["OPENAI_MODEL"],  # any name: the endpoint serves the run's model
        tools=[list_dir, read_file, write_file, submit],
        # submit ends the run with its argument as the final output; a reply without a tool call
        # is the final output too (the SDK's own rule)
        tool_use_behavior=StopAtTools(stop_at_tool_names=["submit"]),
        model_settings=ModelSettings(max_tokens=int(os.environ.get("AGENT_MAX_TOKENS", "256"))),
    )
    task = Path(os.environ["HARNESSRL_TASK_FILE"]).read_text()
    try:
        result = Runner.run_sync(agent, task, max_turns=int(os.environ.get("HARNESSRL_MAX_MODEL_CALLS", "20")))
    except AgentsException as exc:  # out of turns, a reply the SDK rejects: no answer
        print(f"openai-agents: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    # which API answered: Responses API replies carry ids (resp_...), chat completions none
    print("responses:", " ".join(str(r.response_id) for r in result.raw_responses))
    Path(os.environ["HARNESSRL_ANSWER_FILE"]).write_text(str(result.final_output or ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
