"""Answering one admitted request on the wire, for both servers (`harnessrl serve`'s serve/app.py
and the recording endpoint of external harnesses, harness/recording.py): chat completions and Responses,
each as one JSON body or as a server-sent event stream.

A server admits a request its own way (a served model and its checks; an episode's limits) and
hands over an `Exchange`: how to start the generation, what to do with the finished call (the
recording endpoint records it and parses tool calls), and how to report a backend failure.

Streams carry the tokens as the engine samples them (wire/streaming.py) when the policy hands
them out one by one and nothing needs the whole reply first. Some cases wait for the whole reply
and then send it token by token: a request that offered tools (on the recording endpoint, or on
`harnessrl serve` with a tool-call parser: the text may turn out to be a tool call, which must
not reach the client as text), and, on `harnessrl serve`, logprobs under
`logprobs_mode="raw_logprobs"` (recomputed by a forward pass once the reply is done) or of a
request whose sampling shapes the distribution (the call's sampled_logprobs): the finished call
the server's `submit` future resolves to holds them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from harnessrl.models.base import PolicyError
from harnessrl.types import ModelCall
from harnessrl.wire import responses as rs
from harnessrl.wire.chat import ChatCompletionRequest, completion_body, error_body, token_string, usage
from harnessrl.wire.streaming import Done, OnToken, Piece, replay, stream_call

log = logging.getLogger(__name__)


@dataclass
class Exchange:
    """One admitted request, whichever server admitted it.

    `submit(on_token)` starts the generation (on_token None unless `live`) and returns its
    Future[ModelCall]; `finish(call)` (blocking: run in a thread) returns the call to report and
    the assistant message (None: the plain reply; else content + tool_calls); `failed(message)`
    is told of a backend failure and returns the error message to send; `release()` runs once
    the request is over, whatever happened."""

    submit: Callable[[OnToken | None], Future]
    finish: Callable[[ModelCall], tuple[ModelCall, dict | None]]
    failed: Callable[[str], str]
    release: Callable[[], None]
    tokenizer: Any
    model: str
    stop: list[str]
    live: bool = False
    buffered: bool = False  # the whole reply is needed before any of it is shown (tools offered)
    prompt_ids: list[int] | None = None  # known before generation (return_token_ids in a stream)
    headers: dict[str, str] | None = None


def failure_text(exc: BaseException) -> str:
    """What a backend failure says, for the error sent to the client."""
    return str(exc) or type(exc).__name__


async def complete(ex: Exchange) -> tuple[ModelCall, dict | None] | str:
    """The finished (call, message), or the error message of a backend failure."""
    try:
        future = await asyncio.to_thread(ex.submit, None)
        call = await asyncio.wrap_future(future)
    except (PolicyError, CancelledError) as exc:
        return ex.failed(failure_text(exc))
    return await asyncio.to_thread(ex.finish, call)


def _error_response(message: str) -> JSONResponse:
    return JSONResponse(error_body(500, message), status_code=500)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


# ------------------------------------------------------------------------ chat completions


async def chat_reply(ex: Exchange, body: ChatCompletionRequest, *, request_id: str, created: int) -> Any:
    if body.stream:
        return StreamingResponse(
            _chat_events(ex, body, request_id, created), media_type="text/event-stream", headers=ex.headers
        )
    try:
        done = await complete(ex)
    finally:
        ex.release()
    if isinstance(done, str):
        return _error_response(done)
    call, message = done
    return JSONResponse(
        completion_body(
            body, call, ex.tokenizer, model=ex.model, request_id=request_id, created=created, message=message
        )
    )


async def _chat_events(ex: Exchange, body: ChatCompletionRequest, request_id: str, created: int):
    as_ids = bool(body.return_tokens_as_token_ids)

    def chunk(delta: dict, *, finish: str | None = None, piece: Piece | None = None) -> dict:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if piece is not None and body.logprobs:
            choice["logprobs"] = {"content": _logprob_entries(ex.tokenizer, piece, as_ids)}
        if piece is not None and body.return_token_ids:
            choice["token_ids"] = list(piece.ids)
        return {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": ex.model,
            "choices": [choice],
        }

    wants_tokens = bool(body.logprobs or body.return_token_ids)
    try:
        first = chunk({"role": "assistant", "content": ""})
        if body.return_token_ids and ex.prompt_ids is not None:
            first["prompt_token_ids"] = list(ex.prompt_ids)
        yield _sse(first)
        carry = Piece("")  # tokens that showed no text yet: they ride on the next text chunk
        streamed: ModelCall | None = None
        try:
            async for item in stream_call(ex.submit, ex.tokenizer, ex.stop, ex.live):
                if isinstance(item, Done):
                    streamed = item.call
                elif not ex.buffered:
                    carry = join_pieces(carry, item)
                    if carry.text:
                        yield _sse(chunk({"content": carry.text}, piece=carry))
                        carry = Piece("")
        except (PolicyError, CancelledError) as exc:
            yield _sse(error_body(500, ex.failed(failure_text(exc))))
            return
        assert streamed is not None
        call, message = await asyncio.to_thread(ex.finish, streamed)
        tool_calls = (message or {}).get("tool_calls") or []
        if ex.buffered:
            if tool_calls:
                whole = Piece((message or {}).get("content") or "", list(call.completion_ids), list(call.logprobs))
                if whole.text or wants_tokens:
                    yield _sse(chunk({"content": whole.text}, piece=whole))
                for k, entry in enumerate(tool_calls):
                    fn = entry["function"]
                    opened = {
                        "index": k,
                        "id": entry["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                    yield _sse(chunk({"tool_calls": [opened]}))
                    yield _sse(chunk({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]}))
            else:
                for piece in replay(call, ex.tokenizer):
                    carry = join_pieces(carry, piece)
                    if carry.text:
                        yield _sse(chunk({"content": carry.text}, piece=carry))
                        carry = Piece("")
        if carry.ids and wants_tokens:  # e.g. the end-of-turn token: no text, but a logprob
            yield _sse(chunk({"content": ""}, piece=carry))
        last = chunk({}, finish="tool_calls" if tool_calls else call.finish_reason)
        if body.return_token_ids and ex.prompt_ids is None:
            last["prompt_token_ids"] = list(call.prompt_ids)
        yield _sse(last)
        if (body.stream_options or {}).get("include_usage"):
            yield _sse(
                {
                    "id": request_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": ex.model,
                    "choices": [],
                    "usage": usage(call),
                }
            )
        yield "data: [DONE]\n\n"
    finally:
        ex.release()


def join_pieces(a: Piece, b: Piece) -> Piece:
    """Two pieces as one (text, ids and logprobs in order)."""
    return Piece(a.text + b.text, a.ids + b.ids, a.logprobs + b.logprobs)


async def shown_pieces(ex: Exchange) -> AsyncIterator[Piece | Done]:
    """Run the exchange and yield what a stream shows as it comes: pieces that hold text (tokens
    that showed none ride on the next), nothing of a `buffered` reply; then Done. The policy's
    failure is raised from the iteration."""
    carry = Piece("")
    async for item in stream_call(ex.submit, ex.tokenizer, ex.stop, ex.live):
        if isinstance(item, Done):
            yield item
        elif not ex.buffered:
            carry = join_pieces(carry, item)
            if carry.text:
                yield carry
                carry = Piece("")


def _logprob_entries(tokenizer, piece: Piece, as_ids: bool) -> list[dict]:
    out = []
    for token_id, logprob in zip(piece.ids, piece.logprobs):
        text = token_string(tokenizer, token_id, as_ids)
        out.append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return out


# ------------------------------------------------------------------------------- Responses


@dataclass
class ResponseTurn:
    """What a Responses request adds to an Exchange: its body, the conversation it continues
    (with its new input), and where the conversation after it is kept."""

    body: rs.ResponsesRequest
    conversation: list[dict]
    store: rs.ConversationStore
    response_id: str
    created: float


async def responses_reply(ex: Exchange, turn: ResponseTurn) -> Any:
    if turn.body.stream:
        return StreamingResponse(_response_events(ex, turn), media_type="text/event-stream", headers=ex.headers)
    try:
        done = await complete(ex)
    finally:
        ex.release()
    if isinstance(done, str):
        return _error_response(done)
    call, message = done
    text, tool_calls = rs.assistant_turn(call, message)
    output = rs.output_items(
        turn.body,
        text,
        tool_calls,
        message_id=rs.new_id("msg"),
        logprobs=rs.text_logprobs(turn.body, ex.tokenizer, call),
    )
    _keep(turn, text, tool_calls)
    body = rs.response_body(
        turn.body,
        response_id=turn.response_id,
        model=ex.model,
        created=turn.created,
        status=rs.final_status(call),
        output=output,
        call=call,
    )
    return JSONResponse(body)


def _keep(turn: ResponseTurn, text: str | None, tool_calls: list[dict]) -> None:
    if turn.body.store is not False:
        turn.store.keep(turn.response_id, rs.conversation_after(turn.conversation, text, tool_calls))


async def _response_events(ex: Exchange, turn: ResponseTurn):
    write = rs.EventWriter()
    body = turn.body
    logprobs_on = rs.LOGPROBS_INCLUDE in (body.include or [])
    message_id = rs.new_id("msg")
    opened = False

    def response(status: str, output: list | None = None, call: ModelCall | None = None) -> dict:
        return rs.response_body(
            body,
            response_id=turn.response_id,
            model=ex.model,
            created=turn.created,
            status=status,
            output=output,
            call=call,
        )

    def open_message() -> list[str]:
        item = {"id": message_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            write("response.output_item.added", output_index=0, item=item),
            write("response.content_part.added", item_id=message_id, output_index=0, content_index=0, part=part),
        ]

    def delta(piece: Piece) -> str:
        entries = _logprob_entries(ex.tokenizer, piece, False) if logprobs_on else []
        return write(
            "response.output_text.delta",
            item_id=message_id,
            output_index=0,
            content_index=0,
            delta=piece.text,
            logprobs=[{"token": e["token"], "logprob": e["logprob"], "top_logprobs": []} for e in entries],
        )

    try:
        yield write("response.created", response=response("in_progress"))
        yield write("response.in_progress", response=response("in_progress"))
        streamed: ModelCall | None = None
        try:
            async for item in shown_pieces(ex):
                if isinstance(item, Done):
                    streamed = item.call
                else:
                    if not opened:
                        opened = True
                        for event in open_message():
                            yield event
                    yield delta(item)
        except (PolicyError, CancelledError) as exc:
            message = ex.failed(failure_text(exc))
            error = error_body(500, message)["error"]
            yield write("error", code="server_error", message=message, param=None, error=error)
            return
        assert streamed is not None
        call, reply = await asyncio.to_thread(ex.finish, streamed)
        text, tool_calls = rs.assistant_turn(call, reply)
        logprobs = rs.text_logprobs(body, ex.tokenizer, call)
        output = rs.output_items(body, text, tool_calls, message_id=message_id, logprobs=logprobs)
        if output and output[0]["type"] == "message":
            if not opened:
                for event in open_message():
                    yield event
                if ex.buffered and not tool_calls:
                    for piece in replay(call, ex.tokenizer):
                        if piece.text:
                            yield delta(piece)
                elif text:
                    yield delta(Piece(text, list(call.completion_ids), list(call.logprobs)))
            part = output[0]["content"][0]
            done_logprobs = [{"token": e["token"], "logprob": e["logprob"], "top_logprobs": []} for e in logprobs or []]
            yield write(
                "response.output_text.done",
                item_id=message_id,
                output_index=0,
                content_index=0,
                text=part["text"],
                logprobs=done_logprobs,
            )
            yield write("response.content_part.done", item_id=message_id, output_index=0, content_index=0, part=part)
            yield write("response.output_item.done", output_index=0, item=output[0])
        calls = [item for item in output if item["type"] != "message"]
        for event in rs.tool_call_events(write, calls, len(output) - len(calls)):
            yield event
        _keep(turn, text, tool_calls)
        status = rs.final_status(call)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield write(kind, response=response(status, output, call))
    finally:
        ex.release()
