"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) as a front of
the chat completions path.

A Messages request is turned into the ChatCompletionRequest it means (`to_chat`): `system` (a
string or text blocks) becomes the system message; each message's text blocks its content; an
assistant's `tool_use` blocks its `tool_calls` (`input` as the JSON arguments); a user's
`tool_result` blocks `tool` messages (answering the call of the same id) in the order they come;
a `system` message inside `messages` (Claude Code sends one) stays a system message there.
Custom tools (name, description, input_schema) take the chat function shape; `tool_choice` auto /
any / tool / none becomes auto / required / the named function / none; `stop_sequences` the stop
strings, `max_tokens`, `temperature`, `top_p` and `top_k` the chat fields of those names (served
as there: `top_k` 0 is off). From there on (rendering, limits, token ids, logprobs, recording,
tool-call parsing) everything is the chat path's, so a Messages call is served, recorded and
refused exactly as a chat completion is: a tool_choice `any` or `tool` on `harnessrl serve` is
refused (nothing here can force a tool call).

Accepted and ignored, as they change nothing here: `cache_control` on any block or tool,
`metadata`, `service_tier`, a tool's `eager_input_streaming`, a tool result's `is_error` (its
text is what the model reads), and the headers x-api-key, anthropic-version and anthropic-beta.
Refused with a 400 naming them, in Anthropic's error shape (`error_body`): images, documents,
search results and any other non-text block; thinking blocks and a `thinking` setting that asks
for thinking (`enabled`: these models do not think; `disabled` and `adaptive`, as much thinking as
the model chooses, are accepted and answered with no thinking block); Anthropic-defined and
server tools (web_search, bash, text_editor, computer, code execution, ...), MCP servers,
containers, `context_management`, `output_config` / `output_format` (effort, structured output),
deferred tools (tool search) and strict tools (no constrained decoding).

The reply (`message_body`) holds a text block (when there is text, or nothing else) and one
`tool_use` block per tool call (its id is the chat tool call id the agent sends back in its
`tool_result`); `stop_reason` is tool_use, max_tokens, stop_sequence (with the sequence) or
end_turn. `messages_reply` writes it as JSON or as the server-sent events the official SDK reads:
message_start, ping, per block content_block_start / content_block_delta (text_delta or
input_json_delta) / content_block_stop, then message_delta (stop reason, usage) and message_stop.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from concurrent.futures import CancelledError
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from harnessrl.models.base import PolicyError
from harnessrl.models.chat import decode
from harnessrl.types import ModelCall
from harnessrl.wire.chat import ChatCompletionRequest, ServeError
from harnessrl.wire.chat import error_body as openai_error_body
from harnessrl.wire.replies import Exchange, complete, failure_text, shown_pieces
from harnessrl.wire.streaming import Done, replay

# the paths (on `harnessrl serve` and under an episode's prefix) whose errors take Anthropic's shape
MESSAGES_PATH = re.compile(r"/v1/messages(/count_tokens)?/?$")
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
# block types a message may hold that are not served, and what they are (for the 400)
NOT_SERVED_BLOCKS = {
    "image": "images are not supported: the model reads text only",
    "document": "documents are not supported: the model reads text only",
    "search_result": "search results are not supported: send their text in a text block",
    "thinking": "thinking blocks are not supported: this model does not think",
    "redacted_thinking": "thinking blocks are not supported: this model does not think",
    "container_upload": "container uploads are not supported: no code runs on this server",
}


# `thinking` types a model that does not think honours: none, and as much as the model chooses
# (adaptive: Claude may skip thinking where a request does not need it); `enabled` asks for thinking
UNTHINKING = ("disabled", "adaptive")


class MessagesRequest(BaseModel):
    """POST /v1/messages (and its count_tokens, which sends no max_tokens). Fields this server
    cannot honour are declared so that a request setting them is refused (`check`), never
    silently served differently; other unknown fields are ignored, as the chat path does."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[Any]
    system: str | list[Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    stream: bool | None = False
    service_tier: str | None = None
    # refused unless absent / neutral
    thinking: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    container: Any = None
    context_management: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None


def error_body(status: int, message: str) -> dict:
    """{"type": "error", "error": {"type", "message"}}: what Anthropic answers on errors."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_for(path: str, status: int, message: str, param: str | None = None) -> dict:
    """The error body of a request to `path`: Anthropic's shape on the Messages routes, OpenAI's
    (with `param`) on every other."""
    if MESSAGES_PATH.search(path):
        return error_body(status, message)
    return openai_error_body(status, message, param=param)


def check(body: MessagesRequest) -> None:
    """400 for the request-level settings this server does not do (see the module docstring)."""
    thinking = (body.thinking or {}).get("type", "disabled") if body.thinking is not None else "disabled"
    if thinking not in UNTHINKING:
        raise ServeError(
            400,
            f"thinking: {thinking!r} is not supported: this model does not think (send {{'type': 'disabled'}}, or "
            "omit thinking)",
            param="thinking",
        )
    if body.mcp_servers:
        raise ServeError(400, "mcp_servers: MCP servers are not supported by this server", param="mcp_servers")
    if body.container is not None:
        raise ServeError(400, "container: containers are not supported: no code runs on this server", param="container")
    for field in ("context_management", "output_config", "output_format"):
        settings = {k: v for k, v in (getattr(body, field) or {}).items() if v is not None}
        if settings:
            raise ServeError(
                400, f"{field}: {', '.join(sorted(settings))} is not supported by this server", param=field
            )


# ------------------------------------------------------------------------------- the request


def _text_of(blocks: Any, where: str) -> str:
    """The text of `content`: a string, or text blocks joined with newlines (as the chat path
    joins text parts); any other block is a 400 naming it."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise ServeError(400, f"{where} must be a string or a list of content blocks", param="messages")
    return "\n".join(_block_text(block, f"{where}[{k}]") for k, block in enumerate(blocks))


def _block_type(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise ServeError(400, f"{where}: a content block must be an object with a type", param="messages")
    return kind


def _block_text(block: Any, where: str) -> str:
    kind = _block_type(block, where)
    if kind == "text" and isinstance(block.get("text"), str):
        return block["text"]
    raise ServeError(400, f"{where}: {_not_served(kind)}", param="messages")


def _not_served(kind: str) -> str:
    reason = NOT_SERVED_BLOCKS.get(kind)
    if reason is not None:
        return f"{kind!r} blocks: {reason}"
    return f"{kind!r} blocks are not supported by this server (only text, tool_use and tool_result)"


def _user_messages(content: Any, where: str) -> list[dict]:
    """A user message as chat messages: its tool results as `tool` messages and its text as user
    messages, in the order the blocks come."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise ServeError(400, f"{where}.content must be a string or a list of content blocks", param="messages")
    out: list[dict] = []
    texts: list[str] = []
    for k, block in enumerate(content):
        at = f"{where}.content[{k}]"
        if _block_type(block, at) != "tool_result":
            texts.append(_block_text(block, at))
            continue
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str) or not call_id:
            raise ServeError(400, f"{at}: a tool_result block needs tool_use_id", param="messages")
        out.append(
            {"role": "tool", "tool_call_id": call_id, "content": _text_of(block.get("content"), f"{at}.content")}
        )
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(content: Any, where: str) -> dict:
    """An assistant message: its text blocks as content, its tool_use blocks as tool_calls."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise ServeError(400, f"{where}.content must be a string or a list of content blocks", param="messages")
    texts, calls = [], []
    for k, block in enumerate(content):
        at = f"{where}.content[{k}]"
        if _block_type(block, at) != "tool_use":
            texts.append(_block_text(block, at))
            continue
        name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
        if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
            raise ServeError(400, f"{at}: a tool_use block needs id and name", param="messages")
        if not isinstance(arguments, dict):
            raise ServeError(400, f"{at}.input must be an object", param="messages")
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        calls.append({"id": call_id, "type": "function", "function": function})
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(body: MessagesRequest) -> list[dict]:
    """`system` and `messages` as chat messages (dicts of ChatCompletionRequest.messages)."""
    out: list[dict] = []
    if body.system:
        out.append({"role": "system", "content": _text_of(body.system, "system")})
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            out += _user_messages(message.get("content"), where)
        elif role == "assistant":
            out.append(_assistant_message(message.get("content"), where))
        elif role == "system":
            out.append({"role": "system", "content": _text_of(message.get("content"), f"{where}.content")})
        else:
            raise ServeError(400, f"{where}.role must be user or assistant, got {role!r}", param="messages")
    if not body.messages:
        raise ServeError(400, "messages must hold at least one message", param="messages")
    return out


def chat_tools(body: MessagesRequest) -> tuple[list[dict] | None, Any]:
    """(tools, tool_choice) in the chat shape; 400 for Anthropic-defined and server tools."""
    tools = []
    for k, tool in enumerate(body.tools or []):
        where = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise ServeError(400, f"{where} must be an object", param="tools")
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise ServeError(
                400,
                f"{where}: {kind!r} tools are not supported by this server: only custom tools (name, description, "
                "input_schema); Anthropic-defined and server tools (web_search, bash, text_editor, computer, code "
                "execution, ...) are not served",
                param="tools",
            )
        if tool.get("defer_loading"):
            raise ServeError(400, f"{where}: deferred tools (defer_loading, tool search) are not served", param="tools")
        if tool.get("strict"):
            raise ServeError(
                400, f"{where}: strict tools need constrained decoding, which this server does not have", param="tools"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise ServeError(400, f"{where}: a tool needs a name", param="tools")
        schema = tool.get("input_schema")
        if schema is not None and not isinstance(schema, dict):
            raise ServeError(400, f"{where}.input_schema must be a JSON schema object", param="tools")
        fn = {"name": tool["name"], "description": tool.get("description") or "", "parameters": schema}
        tools.append({"type": "function", "function": {key: v for key, v in fn.items() if v is not None}})
    return (tools or None), _tool_choice(body.tool_choice)


def _tool_choice(choice: dict[str, Any] | None) -> Any:
    if choice is None:
        return None
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str) and choice["name"]:
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ServeError(
        400,
        "tool_choice: expected {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}",
        param="tool_choice",
    )


def to_chat(body: MessagesRequest, *, counting: bool = False) -> ChatCompletionRequest:
    """The chat request this Messages request means, after `check`. `counting`: for
    count_tokens, which sends no max_tokens."""
    check(body)
    if body.max_tokens is None and not counting:
        raise ServeError(400, "max_tokens: Field required", param="max_tokens")
    tools, choice = chat_tools(body)
    return ChatCompletionRequest.model_validate(
        {
            "model": body.model,
            "messages": chat_messages(body),
            "max_tokens": body.max_tokens,
            "stop": [s for s in body.stop_sequences or [] if s] or None,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "top_k": body.top_k,
            "tools": tools,
            "tool_choice": choice,
            "stream": bool(body.stream) and not counting,
        }
    )


# ------------------------------------------------------------------------------ the response


def new_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(call: ModelCall, tool_calls: list[dict], stop: list[str], tokenizer) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished reply: tool_use when it made calls, max_tokens
    when it hit its limit, stop_sequence when its text was cut at one of `stop` (the request's
    stop_sequences), else end_turn."""
    if tool_calls:
        return "tool_use", None
    if call.finish_reason == "length":
        return "max_tokens", None
    if stop and tokenizer is not None and call.completion_ids:
        full = decode(tokenizer, call.completion_ids)
        if full.startswith(call.text):
            rest = full[len(call.text) :]
            for sequence in stop:
                if rest.startswith(sequence):
                    return "stop_sequence", sequence
    return "end_turn", None


def content_blocks(text: str | None, tool_calls: list[dict]) -> list[dict]:
    """`content`: a text block (when there is text, or nothing else), then one tool_use block per
    chat tool call."""
    blocks: list[dict] = []
    if text or not tool_calls:
        blocks.append({"type": "text", "text": text or ""})
    for entry in tool_calls:
        fn = entry["function"]
        blocks.append({"type": "tool_use", "id": entry["id"], "name": fn["name"], "input": _arguments(fn["arguments"])})
    return blocks


def _arguments(raw: str) -> dict:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def usage(input_tokens: int, output_tokens: int) -> dict:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_body(
    message_id: str,
    model: str,
    *,
    content: list[dict] | None = None,
    reason: tuple[str | None, str | None] = (None, None),
    call: ModelCall | None = None,
    input_tokens: int = 0,
) -> dict:
    """A `message` object; `call` None: one just started (message_start: no content yet)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content or [],
        "stop_reason": reason[0],
        "stop_sequence": reason[1],
        "usage": usage(call.prompt_tokens, call.completion_tokens) if call is not None else usage(input_tokens, 0),
    }


def _event(kind: str, **fields: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"


def _block_events(index: int, block: dict) -> list[str]:
    """The events of one finished block: start (empty), its content as one delta, stop."""
    start: dict[str, Any]
    delta: dict[str, Any]
    if block["type"] == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    else:
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
    return [
        _event("content_block_start", index=index, content_block=start),
        _event("content_block_delta", index=index, delta=delta),
        _event("content_block_stop", index=index),
    ]


def _assistant(call: ModelCall, message: dict | None) -> tuple[str | None, list[dict]]:
    if message is None:
        return call.text, []
    return message.get("content"), list(message.get("tool_calls") or [])


async def messages_reply(ex: Exchange, body: MessagesRequest) -> Any:
    """The reply to an admitted Messages request: JSON, or the event stream when it streams."""
    message_id = new_id()
    stop = [s for s in body.stop_sequences or [] if s]
    if body.stream:
        return StreamingResponse(_events(ex, message_id, stop), media_type="text/event-stream", headers=ex.headers)
    try:
        done = await complete(ex)
    finally:
        ex.release()
    if isinstance(done, str):
        return JSONResponse(error_body(500, done), status_code=500)
    call, message = done
    text, tool_calls = _assistant(call, message)
    reason = stop_reason(call, tool_calls, stop, ex.tokenizer)
    content = content_blocks(text, tool_calls)
    return JSONResponse(message_body(message_id, ex.model, content=content, reason=reason, call=call))


async def _events(ex: Exchange, message_id: str, stop: list[str]):
    prompt_tokens = len(ex.prompt_ids) if ex.prompt_ids is not None else 0
    opened = False  # the text block (index 0) streamed as the tokens come
    try:
        yield _event("message_start", message=message_body(message_id, ex.model, input_tokens=prompt_tokens))
        yield _event("ping")
        streamed: ModelCall | None = None
        try:
            async for item in shown_pieces(ex):
                if isinstance(item, Done):
                    streamed = item.call
                else:
                    if not opened:
                        opened = True
                        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                    yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": item.text})
        except (PolicyError, CancelledError) as exc:
            yield _event("error", error=error_body(500, ex.failed(failure_text(exc)))["error"])
            return
        assert streamed is not None
        call, message = await asyncio.to_thread(ex.finish, streamed)
        text, tool_calls = _assistant(call, message)
        blocks = content_blocks(text, tool_calls)
        if opened or (ex.buffered and not tool_calls):
            if not opened:
                # a reply to a request with tools that made no call: its text token by token
                yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                for piece in replay(call, ex.tokenizer):
                    if piece.text:
                        yield _event("content_block_delta", index=0, delta={"type": "text_delta", "text": piece.text})
            yield _event("content_block_stop", index=0)
            blocks = blocks[1:]
            first = 1
        else:
            first = 0
        for k, block in enumerate(blocks):
            for event in _block_events(first + k, block):
                yield event
        kind, sequence = stop_reason(call, tool_calls, stop, ex.tokenizer)
        yield _event(
            "message_delta",
            delta={"stop_reason": kind, "stop_sequence": sequence},
            usage=usage(call.prompt_tokens, call.completion_tokens),
        )
        yield _event("message_stop")
    finally:
        ex.release()
