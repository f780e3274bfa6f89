"""Native tool calls for a model that reads its tools in the prompt: one tool-call format (a
protocol of harness/protocols) shows a request's `tools` to the model and turns its reply back
into OpenAI `tool_calls`.

Both servers use it: the recording endpoint of external harnesses (harness/external.py, in the
spec's `tool_protocol`) and `harnessrl serve` with `--enable-auto-tool-choice --tool-call-parser P`
(serve/app.py), so a request with tools is rendered and parsed the same way on both:

- the tools: the format's tool block at the end of the system message (a system message holding
  only the block is added when there is none), and the format's stop strings;
- the history: an assistant message's `tool_calls` written in the format's call syntax after its
  text, a `tool` message as the format's result text (the tool's name found through
  `tool_call_id`), whether or not the request offers tools;
- the reply: parsed with the format; the calls it found become the assistant message's
  `tool_calls` (arguments as a JSON string), the prose around them its `content`. A reply the
  format cannot parse, or one without a call, stays plain text.

The protocol's tool block is used rather than the chat template's `tools=` argument because the
format must be the one the parser reads: a template's own tool syntax (SmolLM2's has none) need
not match the chosen parser.
"""

from __future__ import annotations

from harnessrl.harness.protocols import ParseResult, Protocol, get_protocol, read_reply
from harnessrl.models.base import GenerationRequest
from harnessrl.types import Message, ModelCall, ToolCall, ToolResult, ToolSchema
from harnessrl.wire.chat import tool_call_entries


class PromptTools:
    """One tool-call format's way with a request's tools (see the module docstring).

    `native`: the backend takes tools natively (an `openai:` model on the recording endpoint):
    the tools are passed on as they are, and the tool turns of the history stay data (the
    backend sends them as its server's own tool calls and tool messages); its replies' calls come
    back as data too (`ModelCall.tool_calls`).
    """

    def __init__(self, protocol: Protocol, *, native: bool = False):
        self.protocol = protocol
        self.native = native

    @classmethod
    def named(cls, name: str) -> PromptTools:
        return cls(get_protocol(name, lenient=True))

    def calls_text(self, content: str, calls: list[ToolCall]) -> str:
        rendered = [self.protocol.render_call(c) for c in calls]
        return "\n".join([content.strip(), *rendered] if content.strip() else rendered)

    def as_text(self, message: Message) -> Message:
        """A message of the history as the model reads it: its tool turn in the format's text."""
        if message.role == "assistant" and message.tool_calls:
            return Message(role="assistant", content=self.calls_text(message.content, message.tool_calls))
        if message.role == "tool":
            result = ToolResult(name=message.name or "tool", output=message.content)
            return Message(role="tool", content=self.protocol.render_result(result), name=message.name)
        return message

    def with_tools(self, request: GenerationRequest, tools: list[ToolSchema]) -> GenerationRequest:
        """The request as the model gets it, `tools` shown: natively, or with the history's tool
        turns written as the format's text and the format's tool block at the end of the system
        message (one is added when the request has none)."""
        if self.native:
            return request.model_copy(update={"tools": tools, "native_tools": True}) if tools else request
        messages = [self.as_text(m) for m in request.messages]
        if not tools:
            return request.model_copy(update={"messages": messages})
        block = self.protocol.render_tools(tools)
        if messages[0].role == "system":
            messages[0] = Message(role="system", content=f"{messages[0].content.rstrip()}\n\n{block}")
        else:
            messages.insert(0, Message(role="system", content=block))
        stop = list(dict.fromkeys([*request.stop, *self.protocol.stop_strings()]))
        return request.model_copy(update={"messages": messages, "stop": stop})

    def parse(self, call: ModelCall, tools: list[ToolSchema]) -> ParseResult:
        """The calls of a reply: the backend's own when it returned them as data, else parsed."""
        return read_reply(self.protocol, call, tools)


def reply_message(parsed: ParseResult, ids: list[str]) -> dict | None:
    """The assistant message of a reply in which the format found calls (`ids`: one per call),
    None for a reply that stays plain text (no call, or one that could not be parsed)."""
    if parsed.error or not parsed.calls:
        return None
    return {"role": "assistant", "content": parsed.thought or None, "tool_calls": tool_call_entries(parsed.calls, ids)}
