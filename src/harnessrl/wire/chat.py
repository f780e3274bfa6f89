"""The OpenAI chat completions wire format: request bodies in, response bodies out.

Requests are validated here and turned into our GenerationRequest + SamplingParams; a request
asking for something the local engine cannot do exactly (n > 1, top_logprobs, beam search,
logit_bias, ...) is refused with a 400 naming the parameter, never silently served differently.
vLLM's sampling fields the engine applies are served with vLLM's meaning and ranges (a value out
of range is a 400 naming the field): temperature, top_p, top_k (0 or -1: off), min_p,
repetition_penalty, frequency_penalty, presence_penalty, seed, stop (strings) and stop_token_ids.
Native tools are taken when the caller says it takes them (`tools=True`: the recording endpoint of
external harnesses, and `harnessrl serve` with --enable-auto-tool-choice; harness/prompt_tools.py
then shows them to the model); the conversation's tool turns are then kept as data on the
Messages. Without, they are refused as vLLM refuses them without its auto tool choice.
Fields neither OpenAI nor vLLM defines are ignored, as vLLM 0.33 does (its request models allow
extra fields and only log them: entrypoints/serve/engine/protocol.py, OpenAIBaseModel); vLLM's
own sampling fields the engine has no equivalent for (min_tokens, ignore_eos, bad_words,
allowed_token_ids, use_beam_search, ...) are declared here, so that one set to anything but its
neutral value is refused rather than ignored. `reasoning_effort` is accepted when it asks for no
reasoning ("none", what these models do) and refused by name otherwise. Responses carry what the
official `openai` client and vLLM clients read, including vLLM's extras: `prompt_token_ids` on
the response and `token_ids` on the choice (`return_token_ids`), and logprob tokens written
`token_id:N` (`return_tokens_as_token_ids`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.types import Message, ModelCall, ToolCall, ToolSchema

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default when a request names none
# a request with tools to a server without native tool calls: vLLM 0.33's words (its chat serving
# answers them to `tools` without auto tool choice), then what this server needs
NO_NATIVE_TOOLS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set: native tool calls are '
    "not supported by this server without them (harnessrl serve --enable-auto-tool-choice --tool-call-parser hermes, "
    "or describe the tools in the prompt)"
)
SEED_RANGE = 2**64
# vLLM's ranges for its sampling fields (SamplingParams._verify_args), as pydantic constraints: a
# value outside is a 400 naming the field; the wire fronts that carry these fields declare the same
TopK = Annotated[int, Field(ge=-1)]  # 0 or -1: off; else keep the k most probable tokens
MinP = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]  # finite, as vLLM's engine needs
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]  # frequency_penalty, presence_penalty
TokenId = Annotated[int, Field(ge=0)]
# what `reasoning_effort` may ask of a model that does not reason: nothing
NO_REASONING = ("none",)


class ServeError(Exception):
    """A request the server answers with an error: HTTP `status`, OpenAI's error shape."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 500: "server_error"}

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
    setting them to anything but their neutral value is refused (see `to_generation`); the
    sampling fields it applies carry vLLM's ranges."""

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
    # vLLM's sampling fields, applied by the engine (vLLM's ranges)
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    stop_token_ids: list[TokenId] | None = None
    # accepted when it asks for no reasoning ("none"), else refused
    reasoning_effort: str | None = None
    # refused unless neutral
    tools: list[Any] | None = None
    tool_choice: Any = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's other sampling fields: refused unless neutral (vLLM would honour them)
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    prompt_logprobs: int | None = None
    structured_outputs: dict[str, Any] | None = None


_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def content_text(message: ChatMessageIn, index: int) -> str:
    """The text of a chat message's content (a string, or its text parts joined); `index`: the
    message's place in the request, for the error a part we cannot read raises."""
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


def _history_call(call: Any, where: str) -> ToolCall:
    """One entry of an assistant message's `tool_calls`, as a ToolCall with its id."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ServeError(400, f"{where}: a tool call needs function.name", param="messages")
    raw = fn.get("arguments")
    args: Any = {} if raw is None or (isinstance(raw, str) and not raw.strip()) else raw
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            raise ServeError(400, f"{where}: function.arguments is not valid JSON", param="messages") from None
    if not isinstance(args, dict):
        raise ServeError(400, f"{where}: function.arguments must be a JSON object", param="messages")
    call_id = call.get("id")
    return ToolCall(name=fn["name"], arguments=args, id=call_id if isinstance(call_id, str) else None)


def to_messages(messages: list[ChatMessageIn], tools: bool = False) -> list[Message]:
    """OpenAI chat messages -> our Messages ("developer" is a system message). With `tools`, the
    tool turns are kept as data: an assistant message's `tool_calls` as its Message's tool_calls
    (with their ids), a `tool` message's `tool_call_id` as its own, and its name found through
    that id when it names none. Without, messages holding `tool_calls` are refused."""
    if not messages:
        raise ServeError(400, "messages must hold at least one message", param="messages")
    out = []
    names: dict[str, str] = {}  # tool_call_id -> the name of the tool it called
    for i, m in enumerate(messages):
        role = _ROLES.get(m.role)
        if role is None:
            raise ServeError(400, f"messages[{i}].role {m.role!r} is not one of {', '.join(_ROLES)}", param="messages")
        content = content_text(m, i)
        if m.tool_calls and not tools:
            raise ServeError(400, f"messages[{i}] holds tool_calls: {NO_NATIVE_TOOLS}", param="messages")
        calls = None
        if m.tool_calls and role == "assistant":
            calls = [_history_call(entry, f"messages[{i}].tool_calls[{k}]") for k, entry in enumerate(m.tool_calls)]
            names.update((c.id, c.name) for c in calls if c.id is not None)
        name = m.name if role == "tool" else None
        call_id = None
        if role == "tool" and tools:
            call_id = m.tool_call_id
            name = name or names.get(call_id or "")
        out.append(Message(role=role, content=content, name=name, tool_calls=calls, tool_call_id=call_id))
    return out


def tool_schemas(body: ChatCompletionRequest) -> list[ToolSchema]:
    """The request's `tools` (OpenAI function definitions) as ToolSchemas; 400 for a malformed one."""
    out = []
    for k, tool in enumerate(body.tools or []):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ServeError(
                400, f"tools[{k}]: expected {{'type': 'function', 'function': {{'name': ...}}}}", param="tools"
            )
        parameters = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ServeError(400, f"tools[{k}].function.parameters must be a JSON schema object", param="tools")
        description = fn.get("description") if isinstance(fn.get("description"), str) else ""
        out.append(ToolSchema(name=fn["name"], description=description, parameters=parameters))
    return out


def _refuse_unless_neutral(body: ChatCompletionRequest, tools: bool = False) -> None:
    if body.n not in (None, 1):
        raise ServeError(400, f"n must be 1 (one choice per request), got {body.n}", param="n")
    if body.tools and not tools:
        raise ServeError(400, f"tools: {NO_NATIVE_TOOLS}", param="tools")
    if body.tool_choice not in (None, "none") and not tools:
        raise ServeError(400, f"tool_choice: {NO_NATIVE_TOOLS}", param="tool_choice")
    if body.top_logprobs:
        raise ServeError(
            400,
            "top_logprobs is not supported: logprobs gives the sampled token's log-probability",
            param="top_logprobs",
        )
    if body.reasoning_effort is not None and body.reasoning_effort not in NO_REASONING:
        raise ServeError(
            400,
            f"Unsupported value: 'reasoning_effort' = {body.reasoning_effort!r} is not supported with this model: it "
            "does not reason (send 'none', or no reasoning_effort)",
            param="reasoning_effort",
        )
    neutral = {
        "use_beam_search": (None, False),
        "length_penalty": (None, 1, 1.0),
        "min_tokens": (None, 0),
        "ignore_eos": (None, False),
        "include_stop_str_in_output": (None, False),
        "prompt_logprobs": (None,),
    }
    for field, allowed in neutral.items():
        if getattr(body, field) not in allowed:
            raise ServeError(400, f"{field} is not supported by this server (only its neutral value)", param=field)
    for field in ("bad_words", "allowed_token_ids", "structured_outputs"):
        if getattr(body, field):
            raise ServeError(400, f"{field} is not supported by this server", param=field)
    if body.logit_bias:
        raise ServeError(400, "logit_bias is not supported by this server", param="logit_bias")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise ServeError(400, "response_format: only plain text responses are supported", param="response_format")


# the fields vLLM's chat completions take from the model's generation_config.json when a request
# does not send them (--generation-config auto), and their values otherwise (OpenAI's and vLLM's);
# presence_penalty and frequency_penalty are not among them: vLLM's chat request has its own 0
OPENAI_DEFAULTS = {"temperature": DEFAULT_TEMPERATURE, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
OPENAI_DEFAULTS["repetition_penalty"] = 1.0


def sampling_params(body: ChatCompletionRequest, defaults: dict[str, float] | None = None) -> SamplingParams:
    """The SamplingParams `body` asks for: each field it sends, else `defaults` (vLLM's
    --generation-config auto) for the fields vLLM defaults from there (OPENAI_DEFAULTS), else
    the neutral value. A default outside the field's range is a 500 naming it (a server setting)."""
    defaults = defaults or {}
    values: dict[str, Any] = {}
    for field, neutral in OPENAI_DEFAULTS.items():
        sent = getattr(body, field)
        values[field] = sent if sent is not None else defaults.get(field, neutral)
    values["frequency_penalty"] = body.frequency_penalty or 0.0
    values["presence_penalty"] = body.presence_penalty or 0.0
    try:
        return SamplingParams(**values)
    except ValueError as exc:  # only a default can be out of range here: the body's were checked
        raise ServeError(500, f"the model's generation config gives a sampling default out of range: {exc}") from None


def check_stop_token_ids(ids: list[int], vocab: int) -> None:
    """ServeError 400 naming stop_token_ids for an id outside a vocabulary of `vocab` tokens (the
    engine would fail the request: a server error, where the request is the client's mistake)."""
    for token in ids:
        if token >= vocab:
            raise ServeError(
                400,
                f"stop_token_ids: {token} is not a token id of this model's vocabulary (0..{vocab - 1})",
                param="stop_token_ids",
            )


def to_generation(
    body: ChatCompletionRequest,
    max_new_tokens: int,
    tools: bool = False,
    defaults: dict[str, float] | None = None,
) -> tuple[GenerationRequest, SamplingParams]:
    """The request as our GenerationRequest + SamplingParams (ServeError 400 when it cannot be
    served exactly). `max_new_tokens` applies when the body sets neither max token field.
    With `tools`, `tools` and `tool_choice` are accepted and the conversation's tool turns kept
    as data on its Messages (the caller shows the tools to the model and writes those turns as
    the model reads them: harness/prompt_tools.py). `defaults`: the values of fields the body does not
    send (vLLM's --generation-config auto; ServedModels's `sampling_defaults`), else OpenAI's
    (`sampling_params`)."""
    _refuse_unless_neutral(body, tools=tools)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    seed = None if body.seed is None else body.seed % SEED_RANGE  # negative seeds wrap, as 64-bit integers do
    request = GenerationRequest(
        messages=to_messages(body.messages, tools),
        max_new_tokens=body.max_completion_tokens or body.max_tokens or max_new_tokens,
        stop=[s for s in stop if s],
        stop_token_ids=list(body.stop_token_ids or []),
        seed=seed,
    )
    return request, sampling_params(body, defaults)


# ----------------------------------------------------------------------------------- responses


def token_string(tokenizer, token_id: int, as_id: bool) -> str:
    if as_id or tokenizer is None:  # no tokenizer (a policy behind an HTTP API): the id is the token
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
    prompt, completion = call.prompt_tokens, call.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def tool_call_entries(calls: list[ToolCall], ids: list[str]) -> list[dict]:
    """`message.tool_calls` of a response: OpenAI's shape, arguments as a JSON string."""
    return [
        {
            "id": call_id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for call_id, c in zip(ids, calls)
    ]


def completion_body(
    body: ChatCompletionRequest,
    call: ModelCall,
    tokenizer,
    *,
    model: str,
    request_id: str,
    created: int,
    message: dict | None = None,
) -> dict:
    """A `chat.completion` object for one finished call. `message` replaces the plain assistant
    message (content and `tool_calls`; its finish reason is then "tool_calls")."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": message if message is not None else {"role": "assistant", "content": call.text},
        "logprobs": {"content": logprobs_content(tokenizer, call, bool(body.return_tokens_as_token_ids))}
        if body.logprobs
        else None,
        "finish_reason": "tool_calls" if message is not None and message.get("tool_calls") else call.finish_reason,
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
