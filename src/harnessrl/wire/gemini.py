"""Google's Gemini API (POST /v1beta/models/{model}:generateContent, :streamGenerateContent and
:countTokens, and the same under /v1, the version google-genai asks by default) as a front of the
chat completions path.

A GenerateContentRequest is turned into the ChatCompletionRequest it means (`to_chat`):
`systemInstruction` becomes the system message; each `contents` entry a message by its role
(`user`, or `function` as older clients name a turn of function responses: user and tool
messages; `model`: an assistant message). A user turn's text parts are joined with newlines (as
the chat path joins text parts), a model turn's with nothing (they are the pieces of one reply, as
a stream hands them out and google-genai's `response.text` joins them). A `functionCall` part is
one of the assistant message's `tool_calls`, under its `id` when it has one, else under an id
minted from its place (`gemini-call-<content>-<part>`); a `functionResponse` part is a `tool`
message answering the call of its `id`, or without one the earliest unanswered call of its name.
Its `response` is the tool message's text: the string of `{"output": ...}`, else the JSON object.
`functionDeclarations` (with `parameters`, an OpenAPI schema whose upper-case types are written
the JSON-schema way, or `parametersJsonSchema`) take the chat function shape; `toolConfig`'s
function-calling mode AUTO / NONE / ANY (one allowed name: that function) the chat tool_choice.
`generationConfig`: temperature, topP, topK (0: off), maxOutputTokens, stopSequences,
presencePenalty, frequencyPenalty, seed and responseLogprobs become the chat fields they mean,
with chat's ranges (a value out of range is a 400 naming the field). From there on (rendering,
limits, token ids, logprobs, recording, tool-call parsing) everything is the chat path's, so a
Gemini call is served, recorded and refused exactly as a chat completion is.

Accepted and ignored, as they change nothing here: `safetySettings` (nothing is filtered),
`labels`, a part's `thoughtSignature`, `candidateCount` 1, and `thinkingConfig` (Google answers
a thinking model's request, whatever its thinking settings, with or without thought parts: a
reply with none answers any `thinkingBudget` of -1 or more, any `thinkingLevel` and
`includeThoughts`; Google's own API refuses thinkingConfig for its models that cannot think,
but agent programs send it by default for the Gemini model names they know: `_check_thinking`);
`mediaResolution`, a responseMimeType of text/plain and responseModalities of TEXT; the headers
x-goog-api-key and x-goog-api-client and the `key` query parameter. Refused with a 400 naming them,
in Google's error shape (`error_body`): inline and file data, executable code and any other
non-text part; thought parts; a thinkingBudget below -1, an unknown thinkingLevel, or both a
budget and a level; candidateCount above 1 and `logprobs` (top candidates); built-in tools
(googleSearch, codeExecution, urlContext, retrieval, computerUse, ...); `cachedContent`;
structured output (responseSchema, responseJsonSchema, a JSON mime type); other response
modalities, speech and image settings; the VALIDATED calling mode and several allowed names (no
constrained decoding).

The reply (`response_body`) is a GenerateContentResponse: one candidate whose content holds a
text part (when there is text, or nothing else) and one `functionCall` part per tool call (`args`
an object; `id` the chat tool call id, which a client may send back on its functionResponse);
finishReason MAX_TOKENS when the reply hit its limit, else STOP (for a stop sequence and a
function call too, as Google answers); usageMetadata (promptTokenCount, candidatesTokenCount,
totalTokenCount), modelVersion and responseId; `logprobsResult` with each token's id and log
probability when responseLogprobs asks. `gemini_reply` writes it as JSON, as the server-sent events
of `alt=sse` (`data: {GenerateContentResponse}` per chunk, as the tokens come; the last one with
finishReason and usage; a backend failure as a `data: {"error": ...}` chunk, which google-genai
raises), or, without `alt=sse`, as a JSON array of responses.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from concurrent.futures import CancelledError
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from harnessrl.models.base import PolicyError
from harnessrl.types import ModelCall
from harnessrl.wire.chat import ChatCompletionRequest, Penalty, ServeError, TopK, token_string
from harnessrl.wire.messages import error_for as other_error_for
from harnessrl.wire.replies import Exchange, complete, failure_text, join_pieces, shown_pieces
from harnessrl.wire.responses import assistant_turn
from harnessrl.wire.streaming import Done, Piece, replay

# the API versions served: v1beta (Gemini CLI's) and v1 (google-genai's default), the same routes
VERSIONS = ("v1beta", "v1")
# the paths (on `harnessrl serve` and under an episode's prefix) whose errors take Google's shape:
# anything under /v1beta, and a method of a model under /v1 (/v1/models itself is OpenAI's)
GEMINI_PATH = re.compile(r"/v1beta/|/v1/models/.+:[A-Za-z]+$")
# Google's canonical status names (google.rpc.Code) by HTTP status
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# part kinds that are not served, and what they are (for the 400)
NOT_SERVED_PARTS = {
    "inlineData": "inline data (images, audio, documents) is not supported: the model reads text only",
    "fileData": "file data is not supported: the model reads text only",
    "executableCode": "executable code parts are not supported: no code runs on this server",
    "codeExecutionResult": "code execution results are not supported: no code runs on this server",
    "toolCall": "server-side tool calls are not supported: only functionCall parts",
    "toolResponse": "server-side tool responses are not supported: only functionResponse parts",
}
# google.genai's ThinkingLevel values
THINKING_LEVELS = ("THINKING_LEVEL_UNSPECIFIED", "MINIMAL", "LOW", "MEDIUM", "HIGH")
FINISH_REASONS = {"length": "MAX_TOKENS"}  # a chat finish reason -> Google's; anything else is STOP


class _Fields(BaseModel):
    """Google's JSON names are camelCase; its API takes the proto's snake_case names as well."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)

    def unknown(self) -> list[str]:
        """The fields set that this model does not declare, by the name they were sent as."""
        return sorted(k for k, v in (self.model_extra or {}).items() if v is not None)


class FunctionCall(_Fields):
    name: str
    args: dict[str, Any] | None = None
    id: str | None = None


class FunctionResponse(_Fields):
    name: str
    response: dict[str, Any] | None = None
    id: str | None = None
    parts: list[Any] | None = None  # multimodal function responses: refused unless empty


class Part(_Fields):
    text: str | None = None
    thought: bool | None = None
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    # changes nothing for a text part (media are refused anyway)
    video_metadata: Any = None
    media_resolution: Any = None
    part_metadata: Any = None


class Content(_Fields):
    role: str | None = None
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(_Fields):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None
    # what the function returns: the model is not shown it (as in the chat shape)
    response: Any = None
    response_json_schema: Any = None
    behavior: str | None = None


class GeminiTool(_Fields):
    """A tool: function declarations, or one of Google's built-in tools (each a field of its own,
    all refused: an unknown field here is one too)."""

    function_declarations: list[FunctionDeclaration] | None = None


class GenerationConfig(_Fields):
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: TopK | None = None  # chat's top_k and range (0: off)
    candidate_count: int | None = Field(None, ge=1)  # 1 only (`check`)
    max_output_tokens: int | None = Field(None, ge=1)
    stop_sequences: list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    response_logprobs: bool | None = None
    logprobs: int | None = Field(None, ge=0)
    response_mime_type: str | None = None
    response_modalities: list[str] | None = None
    thinking_config: dict[str, Any] | None = None
    media_resolution: str | None = None
    # refused unless absent
    response_schema: Any = None
    response_json_schema: Any = None
    speech_config: Any = None
    image_config: Any = None


class GenerateContentRequest(_Fields):
    """The body of :generateContent and :streamGenerateContent. Fields this server cannot honour
    are declared so that a request setting them is refused (`check`); other unknown fields are
    ignored, as the chat path does."""

    model: str | None = None  # the path names the model; some clients repeat it here
    contents: list[Content] | None = None
    system_instruction: Content | str | None = None
    tools: list[GeminiTool] | None = None
    tool_config: dict[str, Any] | None = None
    generation_config: GenerationConfig | None = None
    safety_settings: list[Any] | None = None
    labels: dict[str, Any] | None = None
    cached_content: str | None = None


class CountTokensRequest(_Fields):
    """The body of :countTokens: `contents` alone, or a whole `generateContentRequest`."""

    contents: list[Content] | None = None
    generate_content_request: GenerateContentRequest | None = None

    def request(self) -> GenerateContentRequest:
        if self.generate_content_request is not None:
            return self.generate_content_request
        return GenerateContentRequest(contents=self.contents)


def error_body(status: int, message: str) -> dict:
    """{"error": {"code", "message", "status"}}: what Google's APIs answer on errors."""
    name = STATUS_NAMES.get(status, "INVALID_ARGUMENT" if status < 500 else "INTERNAL")
    return {"error": {"code": status, "message": message, "status": name}}


def error_for(path: str, status: int, message: str, param: str | None = None) -> dict:
    """The error body of a request to `path`: Google's shape on the Gemini routes, else Anthropic's
    on the Messages routes and OpenAI's (with `param`) on every other."""
    if GEMINI_PATH.search(path):
        return error_body(status, message)
    return other_error_for(path, status, message, param)


# ------------------------------------------------------------------------------- the request


def _refuse(message: str, param: str) -> ServeError:
    return ServeError(400, message, param=param)


def check(body: GenerateContentRequest) -> None:
    """400 for the request-level settings this server does not do (see the module docstring)."""
    if body.cached_content:
        raise _refuse("cachedContent: cached contents are not supported by this server", "cachedContent")
    config = body.generation_config or GenerationConfig()
    for name, value in (
        ("responseSchema", config.response_schema),
        ("responseJsonSchema", config.response_json_schema),
    ):
        if value is not None:
            raise _refuse(
                f"generationConfig.{name}: structured output needs constrained decoding, which this server does not "
                "have",
                f"generationConfig.{name}",
            )
    mime = config.response_mime_type
    if mime not in (None, "", "text/plain"):
        raise _refuse(
            f"generationConfig.responseMimeType {mime!r} is not supported: only text/plain (no constrained decoding)",
            "generationConfig.responseMimeType",
        )
    other = [m for m in config.response_modalities or [] if m.upper() != "TEXT"]
    if other:
        raise _refuse(
            f"generationConfig.responseModalities: {', '.join(other)} is not supported: the model writes text only",
            "generationConfig.responseModalities",
        )
    for name, value in (("speechConfig", config.speech_config), ("imageConfig", config.image_config)):
        if value is not None:
            raise _refuse(f"generationConfig.{name} is not supported: the model writes text only", name)
    if config.candidate_count not in (None, 1):
        raise _refuse(
            f"generationConfig.candidateCount must be 1 (one candidate per request), got {config.candidate_count}",
            "generationConfig.candidateCount",
        )
    if config.logprobs:
        raise _refuse(
            "generationConfig.logprobs (top candidates) is not supported: responseLogprobs gives the chosen token's",
            "generationConfig.logprobs",
        )
    _check_thinking(config.thinking_config or {})


def _check_thinking(thinking: dict[str, Any]) -> None:
    """Google answers any thinkingConfig of a thinking model with or without thought parts ("the
    model might respond to some requests without thinking", its documentation says): a budget is
    a ceiling (-1 lets the model choose), a thinkingLevel the maximum depth. So a reply with no
    thoughts answers every one, and each is accepted, as `includeThoughts` (no thoughts to
    include); refused by name, as Google refuses them: a budget below -1, a level Google does
    not define, and a budget sent with a level."""
    budget = thinking.get("thinkingBudget", thinking.get("thinking_budget"))
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < -1):
        raise _refuse(
            "generationConfig.thinkingConfig.thinkingBudget must be an integer of at least -1 (dynamic), got "
            f"{budget!r}",
            "generationConfig.thinkingConfig.thinkingBudget",
        )
    level = thinking.get("thinkingLevel", thinking.get("thinking_level"))
    if level is not None and level not in THINKING_LEVELS:
        raise _refuse(
            f"generationConfig.thinkingConfig.thinkingLevel must be one of {', '.join(THINKING_LEVELS)}, got {level!r}",
            "generationConfig.thinkingConfig.thinkingLevel",
        )
    if level not in (None, "THINKING_LEVEL_UNSPECIFIED") and budget is not None:
        raise _refuse(
            "generationConfig.thinkingConfig: send thinkingBudget or thinkingLevel, not both",
            "generationConfig.thinkingConfig",
        )


def _part_kind(part: Part) -> str:
    """What a part holds: text, functionCall, functionResponse, or the name of what it holds
    instead (for the 400)."""
    if part.function_call is not None:
        return "functionCall"
    if part.function_response is not None:
        return "functionResponse"
    if part.text is not None:
        return "thought" if part.thought else "text"
    held = part.unknown()
    return to_camel(held[0]) if held else "empty"  # the proto's snake_case names too


def _not_served(kind: str, where: str) -> ServeError:
    """The 400 for a part of `kind` where it cannot be: any that is not served, and a function
    call or response in the other role's turn."""
    if kind == "functionCall":
        return _refuse(f"{where}: a functionCall part belongs in a model turn", "contents")
    if kind == "functionResponse":
        return _refuse(f"{where}: a functionResponse part belongs in a user turn", "contents")
    if kind == "thought":
        reason = "thought parts are not supported: this model does not think"
    elif kind == "empty":
        reason = "a part must hold text, a functionCall or a functionResponse"
    else:
        reason = NOT_SERVED_PARTS.get(
            kind, f"{kind!r} parts are not supported by this server (only text, functionCall and functionResponse)"
        )
    return _refuse(f"{where}: {reason}", "contents")


def _system_text(instruction: Content | str | None) -> str | None:
    if instruction is None or isinstance(instruction, str):
        return instruction
    texts = []
    for k, part in enumerate(instruction.parts):
        kind = _part_kind(part)
        if kind != "text":
            raise _not_served(kind, f"systemInstruction.parts[{k}]")
        texts.append(part.text or "")
    return "\n".join(texts)


def _result_text(response: dict[str, Any] | None) -> str:
    """A function response as the tool message's text: its output string, or the JSON object."""
    if not response:
        return ""
    if set(response) == {"output"} and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False)


class _Calls:
    """The function calls of the conversation so far that no response has answered yet."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, str]] = []  # (id, name), in the order they were made

    def made(self, call_id: str, name: str) -> None:
        self.pending.append((call_id, name))

    def answer(self, response: FunctionResponse, where: str) -> str:
        """The id of the call `response` answers (and that call is no longer pending)."""
        for k, (call_id, name) in enumerate(self.pending):
            if (response.id is not None and call_id == response.id) or (response.id is None and name == response.name):
                del self.pending[k]
                return call_id
        if response.id is not None:
            return response.id  # a call made elsewhere (the client knows its id)
        raise _refuse(
            f"{where}: functionResponse {response.name!r} answers no functionCall of that name before it", "contents"
        )


def _user_messages(content: Content, where: str, calls: _Calls) -> list[dict]:
    """A user turn as chat messages: its function responses as `tool` messages and its text as
    user messages, in the order the parts come."""
    out: list[dict] = []
    texts: list[str] = []
    for k, part in enumerate(content.parts):
        at = f"{where}.parts[{k}]"
        kind = _part_kind(part)
        if kind == "text":
            texts.append(part.text or "")
            continue
        if kind != "functionResponse":
            raise _not_served(kind, at)
        response = part.function_response
        assert response is not None
        if response.parts:
            raise _refuse(f"{at}.functionResponse.parts: multimodal function responses are not supported", "contents")
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        call_id = calls.answer(response, at)
        out.append(
            {"role": "tool", "tool_call_id": call_id, "name": response.name, "content": _result_text(response.response)}
        )
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _model_message(content: Content, index: int, calls: _Calls) -> dict:
    """A model turn: its text parts as content, its functionCall parts as tool_calls."""
    where = f"contents[{index}]"
    texts, tool_calls = [], []
    for k, part in enumerate(content.parts):
        kind = _part_kind(part)
        if kind == "text":
            texts.append(part.text or "")
            continue
        if kind != "functionCall":
            raise _not_served(kind, f"{where}.parts[{k}]")
        call = part.function_call
        assert call is not None
        call_id = call.id or f"gemini-call-{index}-{k}"
        calls.made(call_id, call.name)
        function = {"name": call.name, "arguments": json.dumps(call.args or {}, ensure_ascii=False)}
        tool_calls.append({"id": call_id, "type": "function", "function": function})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def chat_messages(body: GenerateContentRequest) -> list[dict]:
    """`systemInstruction` and `contents` as chat messages (dicts of ChatCompletionRequest.messages)."""
    if not body.contents:
        raise _refuse("contents is not specified: send at least one content", "contents")
    out: list[dict] = []
    system = _system_text(body.system_instruction)
    if system:
        out.append({"role": "system", "content": system})
    calls = _Calls()
    for i, content in enumerate(body.contents):
        where = f"contents[{i}]"
        if not content.parts:
            raise _refuse(f"{where}.parts must not be empty", "contents")
        role = content.role or "user"
        if role in ("user", "function"):
            out += _user_messages(content, where, calls)
        elif role == "model":
            out.append(_model_message(content, i, calls))
        else:
            raise _refuse(f"{where}.role must be user or model, got {role!r}", "contents")
    return out


def _json_schema(schema: Any) -> Any:
    """An OpenAPI schema of Gemini's `parameters` as JSON schema: its types in lower case (Google
    writes OBJECT, STRING, ...), `nullable` as a null type, Google's propertyOrdering dropped."""
    if isinstance(schema, list):
        return [_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("propertyOrdering", "property_ordering", "nullable"):
            continue
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "any_of"):
            out["anyOf" if key == "any_of" else key] = _json_schema(value)
        else:
            out[key] = value
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def chat_tools(body: GenerateContentRequest) -> tuple[list[dict] | None, Any]:
    """(tools, tool_choice) in the chat shape; 400 for built-in tools."""
    tools = []
    for k, tool in enumerate(body.tools or []):
        where = f"tools[{k}]"
        builtin = tool.unknown()
        if builtin:
            raise _refuse(
                f"{where}: {', '.join(builtin)} is not supported by this server: only functionDeclarations "
                "(Google's built-in tools, such as googleSearch, codeExecution, urlContext and retrieval, are not "
                "served)",
                "tools",
            )
        for j, declaration in enumerate(tool.function_declarations or []):
            at = f"{where}.functionDeclarations[{j}]"
            if declaration.parameters is not None and declaration.parameters_json_schema is not None:
                raise _refuse(f"{at}: send parameters or parametersJsonSchema, not both", "tools")
            if declaration.behavior not in (None, "BLOCKING", "UNSPECIFIED"):
                raise _refuse(f"{at}.behavior {declaration.behavior!r} is not supported: only BLOCKING", "tools")
            schema = declaration.parameters_json_schema
            if declaration.parameters is not None:
                schema = _json_schema(declaration.parameters)
            function = {"name": declaration.name, "description": declaration.description or "", "parameters": schema}
            tools.append({"type": "function", "function": {key: v for key, v in function.items() if v is not None}})
    return (tools or None), _tool_choice(body.tool_config)


def _tool_choice(config: dict[str, Any] | None) -> Any:
    calling = (config or {}).get("functionCallingConfig", (config or {}).get("function_calling_config")) or {}
    mode = str(calling.get("mode") or "AUTO").upper()
    allowed = calling.get("allowedFunctionNames", calling.get("allowed_function_names")) or []
    if mode in ("AUTO", "MODE_UNSPECIFIED"):
        return None
    if mode == "NONE":
        return "none"
    if mode == "ANY" and not allowed:
        return "required"
    if mode == "ANY" and len(allowed) == 1:
        return {"type": "function", "function": {"name": allowed[0]}}
    if mode == "ANY":
        raise _refuse(
            "toolConfig.functionCallingConfig.allowedFunctionNames: several names cannot be enforced (no constrained "
            "decoding): name one function, or none",
            "toolConfig",
        )
    raise _refuse(
        f"toolConfig.functionCallingConfig.mode {mode!r} is not supported: AUTO, ANY or NONE "
        "(VALIDATED needs constrained decoding)",
        "toolConfig",
    )


def to_chat(
    body: GenerateContentRequest, model: str | None, *, stream: bool = False, counting: bool = False
) -> ChatCompletionRequest:
    """The chat request this Gemini request means, after `check`. `model`: the one the path
    names; `counting`: for countTokens (nothing is generated)."""
    check(body)
    config = body.generation_config or GenerationConfig()
    tools, choice = chat_tools(body)
    fields = {
        "model": model,
        "messages": chat_messages(body),
        "max_tokens": config.max_output_tokens,
        "stop": [s for s in config.stop_sequences or [] if s] or None,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": config.top_k,
        "presence_penalty": config.presence_penalty,
        "frequency_penalty": config.frequency_penalty,
        "seed": config.seed,
        "logprobs": bool(config.response_logprobs),
        "tools": tools,
        "tool_choice": choice,
        "stream": stream and not counting,
    }
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:  # a value Google takes that the chat path does not
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ()))
        raise _refuse(f"generationConfig: {where}: {first.get('msg', 'invalid')}", "generationConfig") from None


def model_name(target: str) -> str:
    """The model a route's `{model}` names (`models/` dropped when a client repeats it)."""
    return target.removeprefix("models/")


# ------------------------------------------------------------------------------ the response


def new_id() -> str:
    return uuid.uuid4().hex[:24]


def finish_reason(call: ModelCall) -> str:
    return FINISH_REASONS.get(call.finish_reason, "STOP")


def parts(text: str | None, tool_calls: list[dict]) -> list[dict]:
    """A candidate's parts: a text part (when there is text, or nothing else), then one
    functionCall part per chat tool call."""
    out: list[dict] = []
    if text or not tool_calls:
        out.append({"text": text or ""})
    for entry in tool_calls:
        fn = entry["function"]
        # the chat path's calls hold a JSON object (a reply whose arguments are not one is no call)
        args = json.loads(fn["arguments"] or "{}")
        out.append({"functionCall": {"id": entry["id"], "name": fn["name"], "args": args}})
    return out


def usage(prompt_tokens: int, completion_tokens: int | None = None) -> dict:
    """usageMetadata; `completion_tokens` None: a chunk before the reply is done (the prompt only)."""
    out = {"promptTokenCount": prompt_tokens}
    if completion_tokens is not None:
        out["candidatesTokenCount"] = completion_tokens
    out["totalTokenCount"] = prompt_tokens + (completion_tokens or 0)
    return out


def logprobs_result(tokenizer, ids: list[int], logprobs: list[float]) -> dict:
    """logprobsResult: the chosen token at each step, its id and log probability."""
    chosen = [
        {"token": token_string(tokenizer, token_id, False), "tokenId": token_id, "logProbability": logprob}
        for token_id, logprob in zip(ids, logprobs)
    ]
    return {"chosenCandidates": chosen, "topCandidates": []}


def response_body(
    response_id: str,
    model: str,
    content_parts: list[dict],
    *,
    usage_metadata: dict | None,
    finish: str | None = None,
    logprobs: dict | None = None,
) -> dict:
    """One GenerateContentResponse (a whole reply, or one chunk of a stream: no finishReason
    before the last)."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": content_parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    if logprobs is not None:
        candidate["logprobsResult"] = logprobs
        chosen = logprobs["chosenCandidates"]
        if finish is not None and chosen:
            candidate["avgLogprobs"] = sum(c["logProbability"] for c in chosen) / len(chosen)
    body: dict[str, Any] = {"candidates": [candidate]}
    if usage_metadata is not None:
        body["usageMetadata"] = usage_metadata
    return {**body, "modelVersion": model, "responseId": response_id}


def _whole(ex: Exchange, response_id: str, call: ModelCall, message: dict | None, want_logprobs: bool) -> dict:
    text, tool_calls = assistant_turn(call, message)
    logprobs = logprobs_result(ex.tokenizer, list(call.completion_ids), list(call.logprobs)) if want_logprobs else None
    return response_body(
        response_id,
        ex.model,
        parts(text, tool_calls),
        usage_metadata=usage(call.prompt_tokens, call.completion_tokens),
        finish=finish_reason(call),
        logprobs=logprobs,
    )


async def gemini_reply(ex: Exchange, body: GenerateContentRequest, *, stream: bool = False, sse: bool = False) -> Any:
    """The reply to an admitted Gemini request: JSON (`stream` False), the `alt=sse` event
    stream (`stream` and `sse`), or a JSON array of responses (`stream` without `sse`)."""
    response_id = new_id()
    want_logprobs = bool((body.generation_config or GenerationConfig()).response_logprobs)
    if stream and sse:
        events = _events(ex, response_id, want_logprobs)
        return StreamingResponse(events, media_type="text/event-stream", headers=ex.headers)
    try:
        done = await complete(ex)
    finally:
        ex.release()
    if isinstance(done, str):
        return JSONResponse(error_body(500, done), status_code=500)
    whole = _whole(ex, response_id, *done, want_logprobs)
    return JSONResponse([whole] if stream else whole)


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _events(ex: Exchange, response_id: str, want_logprobs: bool):
    known_prompt = len(ex.prompt_ids) if ex.prompt_ids is not None else None

    def chunk(piece: Piece, *, call: ModelCall | None = None, calls: list[dict] | None = None) -> str:
        content = [{"text": piece.text}] if piece.text or not calls else []
        if call is not None:
            metadata: dict | None = usage(call.prompt_tokens, call.completion_tokens)
        else:  # before the reply is done: the prompt's size where it is known yet
            metadata = usage(known_prompt) if known_prompt is not None else None
        body = response_body(
            response_id,
            ex.model,
            content + parts(None, calls) if calls else content,
            usage_metadata=metadata,
            finish=finish_reason(call) if call is not None else None,
            logprobs=logprobs_result(ex.tokenizer, piece.ids, piece.logprobs) if want_logprobs else None,
        )
        return _sse(body)

    try:
        streamed: ModelCall | None = None
        sent = 0  # tokens handed out so far
        try:
            async for item in shown_pieces(ex):
                if isinstance(item, Done):
                    streamed = item.call
                else:
                    sent += len(item.ids)
                    yield chunk(item)
        except (PolicyError, CancelledError) as exc:
            yield _sse(error_body(500, ex.failed(failure_text(exc))))
            return
        assert streamed is not None
        call, message = await asyncio.to_thread(ex.finish, streamed)
        text, tool_calls = assistant_turn(call, message)
        last = ""
        if ex.buffered and tool_calls:
            last = text or ""  # the whole text (if any) and its tokens come with the calls
        elif ex.buffered:  # a reply to a request with tools that made no call: its text token by token
            carry = Piece("")  # tokens that showed no text yet ride on the next piece
            for piece in replay(call, ex.tokenizer):
                carry = join_pieces(carry, piece)
                if carry.text:
                    sent += len(carry.ids)
                    yield chunk(carry)
                    carry = Piece("")
        # the last chunk: finishReason, usage, the calls, and the tokens that showed no text yet
        rest = Piece(last, list(call.completion_ids[sent:]), list(call.logprobs[sent:]))
        yield chunk(rest, call=call, calls=tool_calls)
    finally:
        ex.release()
