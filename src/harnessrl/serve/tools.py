"""What `harnessrl serve` adds to native tool calls (harness/prompt_tools.py renders and parses
them, as on the recording endpoint): its two options, vLLM's --enable-auto-tool-choice and
--tool-call-parser, and the tools a request's `tool_choice` shows the model."""

from __future__ import annotations

from typing import Any

from harnessrl.harness.protocols import protocol_names
from harnessrl.types import ToolSchema
from harnessrl.wire.chat import ChatCompletionRequest, ServeError, tool_schemas


def check_tool_parser(enable_auto_tool_choice: bool, tool_call_parser: str | None) -> str | None:
    """The tool-call format a server parses replies with (None: no native tools), from vLLM's two
    options; ValueError when only one is given or the format is not registered. Only one alone is
    refused because each does nothing without the other here (vLLM serves `required` and named
    tool choices with a parser alone, through constrained decoding this engine does not have)."""
    if not enable_auto_tool_choice and tool_call_parser is None:
        return None
    if not enable_auto_tool_choice:
        raise ValueError("--tool-call-parser needs --enable-auto-tool-choice (this server has no other use for it)")
    choices = protocol_names()
    if tool_call_parser is None:
        raise ValueError(f"--enable-auto-tool-choice needs --tool-call-parser, one of: {', '.join(choices)}")
    if tool_call_parser not in choices:
        raise ValueError(f"--tool-call-parser must be one of {', '.join(choices)}, got {tool_call_parser!r}")
    return tool_call_parser


def offered_tools(body: ChatCompletionRequest) -> list[ToolSchema]:
    """The tools `harnessrl serve` shows the model for `body`, by its `tool_choice`: every tool for
    "auto" (the default), none for "none". "required" and a named function are refused (400):
    nothing here can make the model call a tool, and serving them as "auto" would answer
    something else than what was asked."""
    tools = tool_schemas(body)
    choice: Any = body.tool_choice
    if choice in (None, "auto"):
        return tools
    if choice == "none":
        return []
    if choice == "required" or isinstance(choice, dict):
        what = "'required'" if choice == "required" else "a named function"
        raise ServeError(
            400,
            f"tool_choice {what} cannot be enforced by this server (its engine has no constrained decoding, which "
            "vLLM uses for it): send tool_choice 'auto' (the model chooses) or 'none'",
            param="tool_choice",
        )
    raise ServeError(
        400, f"tool_choice: {choice!r} is not one of none, auto, required or a function", param="tool_choice"
    )
