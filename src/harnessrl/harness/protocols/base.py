"""The protocol interface: what every tool-call format renders and how a parse is reported.

What a parse means (the harness decides what to do with it):
- `empty`: the completion is whitespace only;
- `calls` non-empty, `error` None: the calls, in order;
- `error` set: the reply tried to call a tool and that attempt could not be parsed (malformed);
- neither: prose without any attempt at a call.

`Protocol.parse` never raises and never hangs: the text is capped at MAX_SCAN_CHARS, scanners
are linear and nesting is bounded. A format only implements `_parse` and the renderers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from harnessrl.types import ModelCall, ToolCall, ToolResult, ToolSchema

MAX_SCAN_CHARS = 100_000  # text beyond this is ignored (calls that far out are never real)
MAX_NESTING = 64  # deeper JSON / literal nesting is refused rather than recursed into
MAX_CALLS_PER_REPLY = 32  # more calls than this in one completion is a malformed reply
TOO_MANY_CALLS = f"too many tool calls in one reply (at most {MAX_CALLS_PER_REPLY})"


@dataclass
class ParseResult:
    """What `Protocol.parse` found in one completion."""

    calls: list[ToolCall] = field(default_factory=list)  # in order; empty when none was found
    error: str | None = None  # a call was attempted but could not be parsed: a message for the model
    empty: bool = False  # the completion is empty / whitespace only
    thought: str = ""  # prose outside the calls (reasoning), stripped


class MalformedCall(Exception):
    """A call attempt that cannot be parsed: raised from a format's `_parse` (or the shared
    helpers), its message becomes ParseResult.error, the text the model is shown."""


class Protocol(ABC):
    """One tool-call text format. Subclasses implement `_parse` and the renderers."""

    name: ClassVar[str]
    shape: ClassVar[str]  # the call format in one line, for error messages

    def __init__(self, lenient: bool = True):
        self.lenient = lenient

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lenient={self.lenient})"

    @abstractmethod
    def render_tools(self, tools: list[ToolSchema]) -> str:
        """The system-prompt block: how to call a tool (with one example) and every tool."""

    @abstractmethod
    def render_call(self, call: ToolCall, thought: str = "") -> str:
        """Assistant text in this format that `parse` turns back into exactly [call]."""

    @abstractmethod
    def render_result(self, result: ToolResult) -> str:
        """The observation text for a tool result ([blocked] / [error] marked)."""

    @abstractmethod
    def format_reminder(self, tools: list[ToolSchema]) -> str:
        """A 2-4 line reminder of the exact call format, shown after a malformed reply."""

    def stop_strings(self) -> list[str]:
        """Strings after which generation should be cut."""
        return []

    def parse(self, text: str, tools: list[ToolSchema] | None = None) -> ParseResult:
        """Parse a completion. Never raises: anything unexpected becomes a parse error."""
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        if not text.strip():
            return ParseResult(calls=[], empty=True)
        text = text[:MAX_SCAN_CHARS]
        try:
            result = self._parse(text, tools)
        except MalformedCall as exc:
            return ParseResult(calls=[], error=str(exc))
        except (Exception, RecursionError, MemoryError) as exc:  # never let model text crash a run
            return ParseResult(calls=[], error=f"could not parse the reply ({type(exc).__name__})")
        if not self.lenient and not result.calls and result.error is None:
            # a near miss (what lenient mode would accept) is a malformed call, not prose
            try:
                near = type(self)(lenient=True)._parse(text, tools)
            except (Exception, RecursionError, MemoryError):
                near = ParseResult()
            if near.calls:
                error = f"the tool call is not in the exact format; write {self.shape}"
                result = ParseResult(error=error, thought=result.thought)
        if len(result.calls) > MAX_CALLS_PER_REPLY:
            result.error = TOO_MANY_CALLS
        return result

    @abstractmethod
    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult: ...


def read_reply(protocol: Protocol, call: ModelCall, tools: list[ToolSchema] | None = None) -> ParseResult:
    """The calls of one model reply, read as a parse: the backend's own when it returned them as
    data (native function calling: `call.tool_calls`, the text then being the prose around them),
    else what `protocol` parses out of the reply's text."""
    if call.tool_call_error is not None:
        return ParseResult(error=call.tool_call_error, thought=call.text.strip())
    if not call.tool_calls:
        return protocol.parse(call.text, tools)
    result = ParseResult(calls=list(call.tool_calls), thought=call.text.strip())
    if len(result.calls) > MAX_CALLS_PER_REPLY:
        result.error = TOO_MANY_CALLS
    return result
