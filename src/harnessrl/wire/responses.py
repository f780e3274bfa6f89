"""OpenAI's Responses API (POST /v1/responses) as a front of the chat completions path.

A Responses request is turned into the ChatCompletionRequest it means (`to_chat`): `instructions`
become the system message, the stored conversation of `previous_response_id` comes next, then
the `input` items: messages (role + text content; a `developer` message is a system message),
`function_call` and `custom_tool_call` items (an assistant message's `tool_calls`) and their
`*_output` items (`tool` messages). Function tools take the chat shape. A custom (freeform) tool,
whose input is raw text rather than JSON arguments (Codex's `apply_patch`), is shown as a function
with one string argument, `input`, described by the tool's grammar when it has one; a call of it
comes back as a `custom_tool_call` item holding that text. A tool namespace (a group of function
and custom tools under one name, as Codex sends an MCP server's tools) is shown as its tools,
each named `<namespace>__<tool>`; a call of one comes back with its own `name` and the
`namespace`, and such items in the input are read back the same way. Everything after that (rendering,
limits, recording, tool-call parsing) is the chat path's, so a Responses call is served, recorded
and refused exactly as a chat completion is. Besides OpenAI's `temperature` and `top_p`, vLLM's
sampling extras of its Responses API (`top_k`, `repetition_penalty`, `frequency_penalty`,
`presence_penalty`, `seed`, `stop`; `min_p` and `stop_token_ids` too, as chat completions take
them) are served with chat's meaning and ranges.

What cannot be served exactly is refused with a 400 naming it: built-in tools (web_search,
file_search, computer use, code interpreter, MCP, ...), reasoning (`reasoning` settings
that ask for any, and reasoning input items: the local models do not reason; `effort: "none"` and
a `summary` setting, which ask for nothing more than such a model does, are accepted), `background` mode,
server-side `conversation`s, prompt templates (`prompt`), structured output (`text.format` other
than text), `text.verbosity` other than medium, non-text input (images, files, audio),
`item_reference` items. `truncation: "auto"` is served as OpenAI serves it while the prompt fits
the context (nothing is dropped); a prompt past the context is a 400 either way (no input item is
dropped to make it fit). Asking to include encrypted reasoning is answered as
OpenAI answers it for a model without reasoning: accepted, and no reasoning item is returned.

The reply (`response_body`) holds a `message` item with one `output_text` part and/or one
`function_call` (or `custom_tool_call`) item per tool call; `status` is "incomplete" (incomplete_details.reason
"max_output_tokens") when the completion hit its limit, as OpenAI answers. `stream_events`
writes the server-sent event sequence the official client's `responses.stream` reads.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.types import ModelCall
from harnessrl.wire.chat import (
    SEED_RANGE,
    ChatCompletionRequest,
    MinP,
    Penalty,
    RepetitionPenalty,
    ServeError,
    TokenId,
    TopK,
    logprobs_content,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# `include` values with nothing to include here (no reasoning, no tools that run on the server):
# accepted because agents send them by default (Codex asks for encrypted reasoning)
VACUOUS_INCLUDES = {"reasoning.encrypted_content", "message.input_image.image_url"}
REASONING_SUMMARIES = ("auto", "concise", "detailed", "none")  # of no reasoning: nothing
STORED_RESPONSES = 4096  # conversations kept for previous_response_id on `harnessrl serve` (LRU)
TEXT_PARTS = {"input_text", "output_text", "text"}
# vLLM's sampling extras of its Responses API, and chat's min_p and stop_token_ids (`to_chat`)
SAMPLING_EXTRAS: tuple[str, ...] = ("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
SAMPLING_EXTRAS += ("seed", "stop", "stop_token_ids")
CUSTOM_INPUT = "input"  # the one string argument a custom tool takes in the tool-call format


class ResponsesRequest(BaseModel):
    """POST /v1/responses. Fields this server cannot honour are declared so that a request
    setting them is refused (`check`), never silently served differently."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    store: bool | None = True
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    # vLLM's sampling extras of its Responses API (sent through the openai client's extra_body),
    # with chat completions' meaning and ranges (min_p and stop_token_ids as well, as chat has them)
    top_k: TopK | None = None
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=SEED_RANGE)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    # refused unless absent / neutral
    top_logprobs: int | None = Field(None, ge=0)
    reasoning: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    text: dict[str, Any] | None = None
    truncation: str | None = None
    max_tool_calls: int | None = None


def check(body: ResponsesRequest) -> None:
    """400 for what this server does not do (see the module docstring)."""
    if body.background:
        raise ServeError(400, "background: background mode is not supported by this server", param="background")
    if body.conversation is not None:
        raise ServeError(
            400,
            "conversation: server-side conversations are not supported; use previous_response_id",
            param="conversation",
        )
    if body.prompt is not None:
        raise ServeError(400, "prompt: prompt templates are not supported by this server", param="prompt")
    # settings that ask for what a model without reasoning does anyway are accepted: no reasoning
    # (`effort: "none"`), and a summary of whatever reasoning there is (none: nothing to summarise),
    # which agent programs send by default in their Responses mode; any other is refused by name
    asked = {k: v for k, v in (body.reasoning or {}).items() if v is not None}
    vacuous = {"effort": ("none",), "summary": REASONING_SUMMARIES, "generate_summary": REASONING_SUMMARIES}
    for key in sorted(asked):
        if asked[key] not in vacuous.get(key, ()):
            raise ServeError(
                400,
                f"Unsupported parameter: 'reasoning.{key}' = {asked[key]!r} is not supported with this model: it "
                "does not reason (send effort 'none', or no reasoning settings)",
                param=f"reasoning.{key}",
            )
    fmt = ((body.text or {}).get("format") or {}).get("type", "text")
    if fmt != "text":
        raise ServeError(400, f"text.format: only plain text output is supported, got {fmt!r}", param="text")
    verbosity = (body.text or {}).get("verbosity")
    if verbosity not in (None, "medium"):
        raise ServeError(
            400,
            f"text.verbosity: only 'medium' is supported (this model has no verbosity control), got {verbosity!r}",
            param="text",
        )
    if body.truncation not in (None, "disabled", "auto"):
        raise ServeError(400, f"truncation must be 'auto' or 'disabled', got {body.truncation!r}", param="truncation")
    if body.top_logprobs:
        raise ServeError(
            400,
            "top_logprobs is not supported: include message.output_text.logprobs gives the sampled token's",
            param="top_logprobs",
        )
    if body.max_tool_calls is not None:
        raise ServeError(400, "max_tool_calls is not supported by this server", param="max_tool_calls")
    for value in body.include or []:
        if value != LOGPROBS_INCLUDE and value not in VACUOUS_INCLUDES:
            raise ServeError(400, f"include: {value!r} is not supported by this server", param="include")


# ------------------------------------------------------------------------------- the request


def _text(content: Any, where: str) -> str:
    """The text of a message item's content: a string, or text parts (joined with newlines, as
    the chat path joins them)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ServeError(400, f"{where}.content must be a string or a list of content parts", param="input")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise ServeError(
                400,
                f"{where}.content[{k}]: only text parts are supported (input_text, output_text), got a "
                f"{kind or 'untyped'!r} part",
                param="input",
            )
    return "\n".join(texts)


def _arguments(raw: Any, where: str) -> str:
    if raw is None or raw == "":
        return "{}"
    if isinstance(raw, dict):
        return json.dumps(raw, ensure_ascii=False)
    if not isinstance(raw, str):
        raise ServeError(400, f"{where}.arguments must be a JSON string", param="input")
    return raw


def input_messages(items: str | list[Any]) -> list[dict]:
    """The `input` as chat messages (dicts of ChatCompletionRequest.messages)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ServeError(400, f"{where} must be an object", param="input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ServeError(
                    400, f"{where}.role must be user, system, developer or assistant, got {role!r}", param="input"
                )
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind in ("function_call", "custom_tool_call"):
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
                raise ServeError(400, f"{where}: a {kind} item needs name and call_id", param="input")
            if isinstance(item.get("namespace"), str) and item["namespace"]:
                name = namespaced(item["namespace"], name)
            if kind == "function_call":
                arguments = _arguments(item.get("arguments"), where)
            elif isinstance(item.get("input"), str):
                arguments = json.dumps({CUSTOM_INPUT: item["input"]}, ensure_ascii=False)
            else:
                raise ServeError(400, f"{where}.input must be a string (a custom tool's raw input)", param="input")
            entry = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                # calls that follow an assistant message (or each other) are that turn's calls
                last.setdefault("tool_calls", []).append(entry)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [entry]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str) or not call_id:
                raise ServeError(400, f"{where}: a {kind} item needs call_id", param="input")
            text = output if isinstance(output, str) else _text(output, where)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            raise ServeError(
                400, f"{where}: reasoning items are not supported: this model does not reason", param="input"
            )
        elif kind == "item_reference":
            raise ServeError(
                400,
                f"{where}: item references are not supported; send the item or use previous_response_id",
                param="input",
            )
        else:
            raise ServeError(
                400,
                f"{where}: {kind or 'untyped'!r} items are not supported (only message, function_call, "
                "custom_tool_call and their outputs: built-in tools are not served)",
                param="input",
            )
    return out


def custom_as_function(tool: dict, where: str) -> dict:
    """A custom (freeform) tool as the function the model is shown: one string argument, `input`,
    which must follow the tool's grammar when it has one (the grammar is shown, not enforced: this
    engine has no constrained decoding)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ServeError(400, f"{where}: a custom tool needs a name", param="tools")
    fmt = tool.get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        about = "The tool's input, as raw text."
    elif kind == "grammar" and isinstance(fmt.get("definition"), str) and fmt.get("syntax") in ("lark", "regex"):
        about = (
            f"The tool's input, as raw text (not JSON) that matches this {fmt['syntax']} grammar:\n{fmt['definition']}"
        )
    else:
        raise ServeError(
            400,
            f"{where}.format: a custom tool's format is text or a grammar (syntax lark or regex, with a definition)",
            param="tools",
        )
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": about}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    fn = {"name": name, "description": tool.get("description"), "parameters": parameters}
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def namespaced(namespace: str, name: str) -> str:
    """The name the model is shown for the tool `name` of a tool namespace."""
    return f"{namespace}__{name}"


def flat_tools(body: ResponsesRequest) -> list[tuple[Any, str | None, str]]:
    """The request's tools with each namespace's tools in its place: (tool, its namespace or
    None, where it is in the request)."""
    out: list[tuple[Any, str | None, str]] = []
    for k, tool in enumerate(body.tools or []):
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            inner = tool.get("tools")
            out += [
                (t, tool["name"], f"tools[{k}].tools[{j}]")
                for j, t in enumerate(inner if isinstance(inner, list) else [])
            ]
        else:
            out.append((tool, None, f"tools[{k}]"))
    return out


def _shown_name(tool: dict, namespace: str | None) -> Any:
    name = tool.get("name")
    return namespaced(namespace, name) if namespace is not None and isinstance(name, str) else name


def custom_tool_names(body: ResponsesRequest) -> set[str]:
    tools = [(t, ns) for t, ns, _ in flat_tools(body) if isinstance(t, dict) and t.get("type") == "custom"]
    return {_shown_name(t, ns) for t, ns in tools if isinstance(t.get("name"), str)}


def namespaced_tools(body: ResponsesRequest) -> dict[str, tuple[str, str]]:
    """{the name the model is shown: (namespace, the tool's own name)} for the tools of namespaces."""
    return {
        _shown_name(t, ns): (ns, t["name"])
        for t, ns, _ in flat_tools(body)
        if ns is not None and isinstance(t, dict) and isinstance(t.get("name"), str)
    }


def chat_tools(body: ResponsesRequest) -> tuple[list[dict] | None, Any]:
    """(tools, tool_choice) in the chat shape; 400 for built-in tools."""
    tools = []
    for tool, namespace, where in flat_tools(body):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if namespace is not None and kind in ("function", "custom"):
            tool = {**tool, "name": _shown_name(tool, namespace)}
        if kind == "custom":
            tools.append(custom_as_function(tool, where))
            continue
        if kind != "function":
            name = tool.get("name") if isinstance(tool, dict) else None
            named = f" ({name})" if isinstance(name, str) else ""
            raise ServeError(
                400,
                f"{where}{named}: {kind or 'untyped'!r} tools are not supported by this server: only function "
                "and custom tools, alone or in a namespace (built-in tools such as web_search, file_search, "
                "code_interpreter or mcp are not served)",
                param="tools",
            )
        fn = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        tools.append({"type": "function", "function": fn})
    choice = body.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") not in ("function", "custom") or not isinstance(choice.get("name"), str):
            raise ServeError(
                400,
                "tool_choice: only none, auto, required or a function or custom tool {'type', 'name'}",
                param="tool_choice",
            )
        choice = {"type": "function", "function": {"name": choice["name"]}}
    elif choice not in (None, "none", "auto", "required"):
        raise ServeError(400, f"tool_choice: {choice!r} is not one of none, auto, required", param="tool_choice")
    return (tools or None), choice


def to_chat(body: ResponsesRequest, history: list[dict]) -> tuple[ChatCompletionRequest, list[dict]]:
    """(the chat request this Responses request means, its conversation without instructions:
    `history` + the new input), after `check`."""
    check(body)
    conversation = [*history, *input_messages(body.input)]
    messages = ([{"role": "system", "content": body.instructions}] if body.instructions else []) + conversation
    if not messages:
        raise ServeError(400, "input must hold at least one item", param="input")
    tools, choice = chat_tools(body)
    chat = ChatCompletionRequest.model_validate(
        {
            "model": body.model,
            "messages": messages,
            "temperature": body.temperature,
            "top_p": body.top_p,
            **{field: getattr(body, field) for field in SAMPLING_EXTRAS},
            "max_completion_tokens": body.max_output_tokens,
            "tools": tools,
            "tool_choice": choice,
            "logprobs": LOGPROBS_INCLUDE in (body.include or []),
            "stream": bool(body.stream),
        }
    )
    return chat, conversation


class ConversationStore:
    """The conversation after each stored response, by response id (for previous_response_id);
    at most `size` kept, the least recently used dropped first. Thread-safe."""

    def __init__(self, size: int = STORED_RESPONSES):
        self.size = size
        self._items: OrderedDict[str, list[dict]] = OrderedDict()
        self._lock = threading.Lock()

    def history(self, response_id: str | None) -> list[dict]:
        if response_id is None:
            return []
        with self._lock:
            found = self._items.get(response_id)
            if found is not None:
                self._items.move_to_end(response_id)
        if found is None:
            raise ServeError(400, f"Previous response with id '{response_id}' not found.", param="previous_response_id")
        return list(found)

    def keep(self, response_id: str, conversation: list[dict]) -> None:
        with self._lock:
            self._items[response_id] = conversation
            while len(self._items) > self.size:
                self._items.popitem(last=False)


# ------------------------------------------------------------------------------ the response


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(call: ModelCall) -> dict:
    prompt, completion = call.prompt_tokens, call.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def assistant_turn(call: ModelCall, message: dict | None) -> tuple[str | None, list[dict]]:
    """(the reply's text, its chat tool_calls) from the chat path's assistant message."""
    if message is None:
        return call.text, []
    return message.get("content"), list(message.get("tool_calls") or [])


def read_custom_input(arguments: str) -> str | None:
    """The raw input of a custom tool's call in the arguments the tool-call format parsed: its
    `input`, or the one string the model gave; None where they hold neither (or are not JSON)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if isinstance(value.get(CUSTOM_INPUT), str):
            return value[CUSTOM_INPUT]
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
    return None


def custom_input(arguments: str) -> str:
    """The raw input of a custom tool's call as handed out: `read_custom_input`, or (neither) the
    arguments as written."""
    raw = read_custom_input(arguments)
    return arguments if raw is None else raw


def output_items(
    body: ResponsesRequest, text: str | None, tool_calls: list[dict], *, message_id: str, logprobs: list | None
) -> list[dict]:
    """`output`: a message item (when there is text, or nothing else) and one item per tool call:
    `custom_tool_call` (its raw `input`) for a custom tool, else `function_call` (its call_id is
    the chat tool call id the agent sends back)."""
    items = []
    if text or not tool_calls:
        part = {"type": "output_text", "text": text or "", "annotations": [], "logprobs": logprobs or []}
        items.append(
            {"id": message_id, "type": "message", "role": "assistant", "status": "completed", "content": [part]}
        )
    custom, grouped = custom_tool_names(body), namespaced_tools(body)
    for entry in tool_calls:
        name, arguments = entry["function"]["name"], entry["function"]["arguments"]
        item = {"call_id": entry["id"], "name": name, "status": "completed"}
        if name in grouped:  # a tool of a namespace: its own name, and the namespace
            item.update(namespace=grouped[name][0], name=grouped[name][1])
        if name in custom:
            items.append(
                {"id": "ctc_" + entry["id"], "type": "custom_tool_call", **item, "input": custom_input(arguments)}
            )
        else:
            items.append({"id": "fc_" + entry["id"], "type": "function_call", **item, "arguments": arguments})
    return items


def response_body(
    body: ResponsesRequest,
    *,
    response_id: str,
    model: str,
    created: float,
    status: str = "completed",
    output: list[dict] | None = None,
    call: ModelCall | None = None,
) -> dict:
    """A `response` object; `call` None: one still in progress (no usage yet)."""
    incomplete = status == "incomplete"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "model": model,
        "output": output or [],
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        # what OpenAI answers for a model without reasoning, whatever `include` asked for
        "reasoning": {"effort": None, "summary": None},
        "store": body.store is not False,
        "temperature": body.temperature,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": list(body.tools or []),
        "top_p": body.top_p,
        "truncation": body.truncation or "disabled",
        "usage": usage(call) if call is not None else None,
        "completed_at": time.time() if call is not None and not incomplete else None,
    }


def final_status(call: ModelCall) -> str:
    return "incomplete" if call.finish_reason == "length" else "completed"


def text_logprobs(body: ResponsesRequest, tokenizer, call: ModelCall) -> list | None:
    if LOGPROBS_INCLUDE not in (body.include or []):
        return None
    return logprobs_content(tokenizer, call, False)


def conversation_after(conversation: list[dict], text: str | None, tool_calls: list[dict]) -> list[dict]:
    """The conversation a follow-up with previous_response_id continues: this reply appended."""
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        turn["tool_calls"] = tool_calls
    return [*conversation, turn]


class EventWriter:
    """Server-sent events of one streamed response, numbered in order (`sequence_number`)."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def tool_call_events(write: EventWriter, items: list[dict], first_index: int) -> list[str]:
    """The events of finished function_call / custom_tool_call items: added, the arguments (or
    the custom input) as one delta, done."""
    out = []
    for k, item in enumerate(items):
        index = first_index + k
        custom = item["type"] == "custom_tool_call"
        field, kind = (
            ("input", "response.custom_tool_call_input")
            if custom
            else ("arguments", "response.function_call_arguments")
        )
        opened = {**item, field: "", "status": "in_progress"}
        out.append(write("response.output_item.added", output_index=index, item=opened))
        out.append(write(f"{kind}.delta", item_id=item["id"], output_index=index, delta=item[field]))
        named = {} if custom else {"name": item["name"]}
        out.append(write(f"{kind}.done", item_id=item["id"], output_index=index, **named, **{field: item[field]}))
        out.append(write("response.output_item.done", output_index=index, item=item))
    return out
