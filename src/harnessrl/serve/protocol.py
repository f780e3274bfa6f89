"""The OpenAI chat completions wire format: request bodies in, response bodies out.

Requests are validated here and turned into our GenerationRequest + SamplingParams; a request
asking for something the local engine cannot do exactly (n > 1, native tools, penalties,
top_logprobs, ...) is refused with a 400 naming the parameter, never silently served differently.
Unknown extra fields are ignored, as vLLM does. Responses carry what the official `openai` client
and vLLM clients read, including vLLM's extras: `prompt_token_ids` on the response and
`token_ids` on the choice (`return_token_ids`), and logprob tokens written `token_id:N`
(`return_tokens_as_token_ids`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.types import Message, ModelCall

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when a request names none
SEED_RANGE = 2**64


class ServeError(Exception):
    """A request the server answers with an error: HTTP `status`, OpenAI's error shape."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 500: "server_error"}

    def __init__(self, status: int, message: str, *, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict:
        return error_body(self.status, self.message, param=self.param)


def error_body(status: int, message: str, *, param: str | None = None) -> dict:
    """{"error": {"message", "type", "param", "code"}}: what OpenAI and vLLM answer on errors."""
    kind = ServeError.TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


# ------------------------------------------------------------------------------------ requests


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions. Fields the engine cannot honour are declared so that a request
    setting them to anything but their neutral value is refused (see `to_generation`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # None: the base model (as vLLM)
    messages: list[ChatMessageIn]
    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=SEED_RANGE)
    n: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    # vLLM's extras
    return_token_ids: bool | None = False
    return_tokens_as_token_ids: bool | None = False
    # refused unless neutral
    tools: list[Any] | None = None
    tool_choice: Any = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    top_k: int | None = None
    min_p: float | None = None


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _content_text(message: ChatMessageIn, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type", "untyped")
            raise ServeError(
                400, f"messages[{index}].content: only text parts are supported, got a {kind!r} part", param="messages"
            )
        texts.append(part["text"])
    return "\n".join(texts)  # as vLLM joins text parts for a string chat template


def to_messages(messages: list[ChatMessageIn]) -> list[Message]:
    """OpenAI chat messages -> our Messages ("developer" is a system message)."""
    if not messages:
        raise ServeError(400, "messages must hold at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        role = _ROLES.get(m.role)
        if role is None:
            raise ServeError(400, f"messages[{i}].role {m.role!r} is not one of {', '.join(_ROLES)}", param="messages")
        if m.tool_calls:
            raise ServeError(
                400,
                f"messages[{i}] holds tool_calls: native tool calls are not supported by this server",
                param="messages",
            )
        out.append(Message(role=role, content=_content_text(m, i), name=m.name if role == "tool" else None))
    return out


def _refuse_unless_neutral(body: ChatCompletionRequest) -> None:
    if body.n not in (None, 1):
        raise ServeError(400, f"n must be 1 (one choice per request), got {body.n}", param="n")
    if body.tools:
        raise ServeError(
            400,
            "tools: native tool calls are not supported by this server; describe the tools in the prompt",
            param="tools",
        )
    if body.tool_choice not in (None, "none"):
        raise ServeError(400, "tool_choice: native tool calls are not supported by this server", param="tool_choice")
    if body.top_logprobs:
        raise ServeError(
            400,
            "top_logprobs is not supported: logprobs gives the sampled token's log-probability",
            param="top_logprobs",
        )
    neutral = {
        "frequency_penalty": (None, 0, 0.0),
        "presence_penalty": (None, 0, 0.0),
        "repetition_penalty": (None, 1, 1.0),
        "top_k": (None, 0, -1),
        "min_p": (None, 0, 0.0),
    }
    for field, allowed in neutral.items():
        if getattr(body, field) not in allowed:
            raise ServeError(400, f"{field} is not supported by this server (only its neutral value)", param=field)
    if body.logit_bias:
        raise ServeError(400, "logit_bias is not supported by this server", param="logit_bias")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise ServeError(400, "response_format: only plain text responses are supported", param="response_format")


def to_generation(body: ChatCompletionRequest, max_new_tokens: int) -> tuple[GenerationRequest, SamplingParams]:
    """The request as our GenerationRequest + SamplingParams (ServeError 400 when it cannot be
    served exactly). `max_new_tokens` applies when the body sets neither max token field."""
    _refuse_unless_neutral(body)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    seed = None if body.seed is None else body.seed % SEED_RANGE  # negative seeds wrap, as 64-bit integers do
    request = GenerationRequest(
        messages=to_messages(body.messages),
        max_new_tokens=body.max_completion_tokens or body.max_tokens or max_new_tokens,
        stop=[s for s in stop if s],
        seed=seed,
    )
    sampling = SamplingParams(
        temperature=DEFAULT_TEMPERATURE if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
    )
    return request, sampling


# ----------------------------------------------------------------------------------- responses


def token_string(tokenizer, token_id: int, as_id: bool) -> str:
    if as_id:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def logprobs_content(tokenizer, call: ModelCall, as_ids: bool) -> list[dict]:
    """One entry per completion token (the end-of-turn token included, as vLLM does)."""
    out = []
    for token_id, logprob in zip(call.completion_ids, call.logprobs):
        text = token_string(tokenizer, token_id, as_ids)
        out.append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return out


def usage(call: ModelCall) -> dict:
    prompt, completion = len(call.prompt_ids), len(call.completion_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(
    body: ChatCompletionRequest, call: ModelCall, tokenizer, *, model: str, request_id: str, created: int
) -> dict:
    """A `chat.completion` object for one finished call."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": call.text},
        "logprobs": {"content": logprobs_content(tokenizer, call, bool(body.return_tokens_as_token_ids))}
        if body.logprobs
        else None,
        "finish_reason": call.finish_reason,
    }
    response: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage(call),
        "system_fingerprint": None,
    }
    if body.return_token_ids:
        choice["token_ids"] = list(call.completion_ids)
        response["prompt_token_ids"] = list(call.prompt_ids)
    return response


def stream_chunks(
    body: ChatCompletionRequest, call: ModelCall, tokenizer, *, model: str, request_id: str, created: int
) -> list[dict]:
    """The `chat.completion.chunk` objects of one finished call: the role, the whole content in
    one chunk (with its logprobs and token ids when asked), the finish reason, and the usage
    when `stream_options.include_usage` is set."""

    def chunk(delta: dict, *, finish: str | None = None, logprobs: Any = None, **extra: Any) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish, **extra}
        return {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    first = chunk({"role": "assistant", "content": ""})
    if body.return_token_ids:
        first["prompt_token_ids"] = list(call.prompt_ids)
    logprobs = (
        {"content": logprobs_content(tokenizer, call, bool(body.return_tokens_as_token_ids))} if body.logprobs else None
    )
    extra = {"token_ids": list(call.completion_ids)} if body.return_token_ids else {}
    chunks = [first, chunk({"content": call.text}, logprobs=logprobs, **extra), chunk({}, finish=call.finish_reason)]
    if (body.stream_options or {}).get("include_usage"):
        chunks.append(
            {
                "id": request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage(call),
            }
        )
    return chunks
