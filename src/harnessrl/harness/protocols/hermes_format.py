"""The hermes format: the tool calls of the Qwen2.5 / Qwen3 and Hermes chat templates.

    <tool_call>
    {"name": "add", "arguments": {"a": 17, "b": 25}}
    </tool_call>

Tools are shown as JSON function signatures between <tools> and </tools>, as those templates
show them, and a result comes back between <tool_response> and </tool_response>. Several
<tool_call> blocks are several calls; prose may come before them. A reasoning block at the start
(<think>...</think>, as Qwen3 writes it) is prose: a call mentioned inside it is not made.
Anything after a <tool_response> the model wrote itself is ignored.

Lenient mode also reads a missing </tool_call> (the call ends with its JSON object), tags in any
case or with spaces, a ```json fence or a stray '}' inside the tag, `parameters` / `args` /
`input` / `params` for `arguments`, `tool` / `tool_name` / `function` for `name`, arguments
given as a JSON string, the OpenAI nesting {"type": "function", "function": {...}}, the flat form
{"name": "add", "a": 1} inside a tag, trailing commas and single-quoted Python-ish dicts, and, in
a reply without any <tool_call> tag, a JSON object that has both a tool name and arguments. A
broken attempt next to good calls (typically a cut-off repeat) is dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any

from harnessrl.harness.protocols.base import MAX_CALLS_PER_REPLY, MAX_NESTING, MalformedCall, ParseResult, Protocol
from harnessrl.harness.protocols.shared import (
    example_call,
    lenient_call,
    make_call,
    object_end,
    read_json,
    result_marker,
    scan_braces,
    text_outside,
)
from harnessrl.types import ToolCall, ToolResult, ToolSchema

_NAME_KEYS = ("name", "tool", "tool_name", "function")
_ARGS_KEYS = ("arguments", "parameters", "args", "input", "params")
_NO_OBJECT = '"arguments" must be a JSON object of argument names and values'
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_FENCE_OPEN = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n?")
_FENCE_MARK = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*")
_SPACE = re.compile(r"\s*")


def _after_space(text: str, pos: int) -> int:
    """Where the whitespace starting at `pos` ends (`pos` itself when there is none)."""
    found = _SPACE.match(text, pos)
    return found.end() if found is not None else pos


_JUNK_BEFORE_CLOSE = re.compile(r"[\s`}\]]*")  # lenient: a fence end or a stray '}' before </tool_call>


class HermesProtocol(Protocol):
    """<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>; one block per call."""

    name = "hermes"
    shape = '<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>'

    def __init__(self, lenient: bool = True):
        super().__init__(lenient)
        flags = re.I if lenient else 0
        sp = r"[ \t]*" if lenient else ""
        # an opening tag, or a result the model wrote itself (which ends what is parsed)
        self._tag = re.compile(rf"<{sp}(tool_call|tool_response){sp}>", flags)
        self._close = re.compile(rf"<{sp}/{sp}tool_call{sp}>", flags)
        self._quotes = "\"'" if lenient else '"'

    # -- rendering ----------------------------------------------------------------------------------

    def render_tools(self, tools: list[ToolSchema]) -> str:
        signatures = [
            json.dumps(
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                },
                ensure_ascii=False,
            )
            for t in tools
        ]
        return "\n".join(
            [
                "You can call the functions below. Each is given as a JSON signature between <tools> and </tools>:",
                "<tools>",
                *(signatures or ["(no functions)"]),
                "</tools>",
                "To call a function, write a JSON object with its name and arguments between <tool_call> tags:",
                "<tool_call>",
                '{"name": "<function name>", "arguments": {"<argument>": <value>}}',
                "</tool_call>",
                "Example:",
                self.render_call(example_call(tools)),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        obj = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        block = f"<tool_call>\n{obj}\n</tool_call>"
        return f"{thought.strip()}\n{block}" if thought.strip() else block

    def render_result(self, result: ToolResult) -> str:
        out = result.output if result.output.strip() else "(no output)"
        return f"<tool_response>\n{result_marker(result)}{out}\n</tool_response>"

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        return "Call a tool with a JSON object between <tool_call> tags, exactly like:\n" + self.render_call(
            example_call(tools)
        )

    # -- parsing ------------------------------------------------------------------------------------

    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult:
        start = self._reasoning_end(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        spans: list[tuple[int, int]] = []  # the text of each call attempt (not part of the thought)
        end_of_text = len(text)
        pos, attempts, tagged = start, 0, False
        too_many: str | None = None
        while True:
            m = self._tag.search(text, pos)
            if m is None:
                break
            if m.group(1).lower() == "tool_response":  # the model made up a result: ignore the rest
                end_of_text = m.start()
                break
            tagged = True
            attempts += 1
            if attempts > MAX_CALLS_PER_REPLY + 1:
                too_many = f"too many tool calls in one reply (at most {MAX_CALLS_PER_REPLY})"
                spans.append((m.start(), len(text)))
                break
            call, error, end = self._tagged_call(text, m.start(), m.end(), tools)
            spans.append((m.start(), end))
            if call is not None:
                calls.append(call)
            if error is not None:
                errors.append(error)
            pos = max(end, m.end())
        text = text[:end_of_text]
        if not tagged and self.lenient:
            found, used = self._untagged_calls(text, start, tools)
            calls.extend(found)
            spans.extend(used)
        segments = text_outside(text, sorted(spans))
        if not self.lenient and calls and any(s.strip() for s in segments[1:]):
            errors.append("text after the tool call: end your reply with </tool_call>")
        thought = self._thought(segments)
        if calls and self.lenient:
            errors = []  # a broken attempt next to good calls is usually a cut-off repeat: keep the calls
        if too_many is not None:
            errors.append(too_many)
        if errors:
            return ParseResult(calls=calls, error="; ".join(dict.fromkeys(errors)), thought=thought)
        return ParseResult(calls=calls, thought=thought)

    def _reasoning_end(self, text: str) -> int:
        """Where calls may start: after a closed reasoning block at the start of the reply (the
        opening <think> may be missing when the chat template wrote it), else 0."""
        close = text.find(_THINK_CLOSE)
        if close < 0:
            return 0
        if text.lstrip().startswith(_THINK_OPEN) or self._tag.search(text, 0, close) is None:
            return close + len(_THINK_CLOSE)
        return 0

    def _thought(self, segments: list[str]) -> str:
        parts = []
        for seg in segments:
            seg = seg.replace(_THINK_OPEN, "").replace(_THINK_CLOSE, "")
            seg = self._close.sub("", seg)  # a stray closing tag (no call of its own)
            if self.lenient:
                seg = _FENCE_MARK.sub("", seg)
            if seg.strip():
                parts.append(seg.strip())
        return "\n".join(parts)

    def _tagged_call(
        self, text: str, tag_start: int, body_start: int, tools: list[ToolSchema] | None
    ) -> tuple[ToolCall | None, str | None, int]:
        """The call in the <tool_call> at `tag_start`: (call, error, where its text ends)."""
        pos = _after_space(text, body_start)
        if self.lenient:
            fence = _FENCE_OPEN.match(text, pos)
            if fence is not None:
                pos = _after_space(text, fence.end())
        if pos >= len(text) or text[pos] != "{":
            nxt = self._tag.search(text, body_start)
            close = self._close.search(text, body_start, nxt.start() if nxt else len(text))
            end = close.end() if close else (nxt.start() if nxt else len(text))
            if not text[body_start : close.start() if close else end].strip():
                problem = "the <tool_call> tag is empty" if close else "the <tool_call> tag is not finished"
            else:
                problem = "write one JSON object inside <tool_call>"
            return None, f"{problem}: {self.shape}", end
        found = object_end(text, pos, self._quotes)
        if found is None:
            return None, "the JSON object in <tool_call> is not finished (a closing '}' or quote is missing)", len(text)
        obj_end, depth = found
        end, closed = self._call_end(text, obj_end)
        if not closed and not self.lenient:
            return None, "missing </tool_call> right after the JSON object", end
        if depth > MAX_NESTING:
            return None, "the JSON object in <tool_call> is nested too deeply", end
        try:
            value = read_json(text[pos:obj_end], self.lenient)
        except MalformedCall as exc:
            return None, f"could not parse the JSON in <tool_call>: {exc}", end
        try:
            call = self._call_from_value(value, text[tag_start:end], tools, in_tag=True)
        except MalformedCall as exc:
            return None, str(exc), end
        return call, None, end

    def _call_end(self, text: str, obj_end: int) -> tuple[int, bool]:
        """Where a call whose JSON object ends at `obj_end` ends, and whether </tool_call> closed it."""
        after = _after_space(text, obj_end)
        close = self._close.match(text, after)
        if close is not None:
            return close.end(), True
        if not self.lenient:
            return obj_end, False
        nxt = self._tag.search(text, obj_end)
        close = self._close.search(text, obj_end, nxt.start() if nxt else len(text))
        if close is not None and _JUNK_BEFORE_CLOSE.fullmatch(text, obj_end, close.start()):
            return close.end(), True
        return obj_end, False  # missing </tool_call>: what follows is prose or the next call

    def _untagged_calls(
        self, text: str, start: int, tools: list[ToolSchema] | None
    ) -> tuple[list[ToolCall], list[tuple[int, int]]]:
        """Lenient, in a reply without any <tool_call>: JSON objects with a tool name and arguments."""
        spans, _ = scan_braces(text[start:], self._quotes)
        calls: list[ToolCall] = []
        used: list[tuple[int, int]] = []
        for span in spans:
            if len(calls) > MAX_CALLS_PER_REPLY or span.depth > MAX_NESTING:
                break
            a, b = start + span.start, start + span.end
            try:
                call = self._call_from_value(read_json(text[a:b], True), text[a:b], tools, in_tag=False)
            except MalformedCall:
                continue  # not a call: data or prose with braces
            if call is not None:
                calls.append(call)
                used.append((a, b))
        return calls, used

    def _call_from_value(self, value: Any, raw: str, tools: list[ToolSchema] | None, in_tag: bool) -> ToolCall | None:
        """The call an object describes; None when an object outside a tag is not a call."""
        if not self.lenient:
            if not isinstance(value, dict):
                raise MalformedCall(f"the <tool_call> must hold a JSON object: {self.shape}")
            if set(value) != {"name", "arguments"}:
                raise MalformedCall(f'use exactly the keys "name" and "arguments": {self.shape}')
            if not isinstance(value["name"], str):
                raise MalformedCall('"name" must be the tool name as a string')
            if not isinstance(value["arguments"], dict):
                raise MalformedCall(_NO_OBJECT)
            return make_call(value["name"], value["arguments"], raw)

        for _ in range(3):  # {"type": "function", "function": {"name": ..., "arguments": ...}}
            if isinstance(value, dict) and isinstance(value.get("function"), dict):
                value = value["function"]
        if not isinstance(value, dict):
            if in_tag:
                raise MalformedCall(f"the <tool_call> must hold a JSON object: {self.shape}")
            return None
        name_key = next((k for k in _NAME_KEYS if k in value), None)
        args_key = next((k for k in _ARGS_KEYS if k in value), None)
        if not in_tag and (name_key is None or args_key is None or "description" in value):
            return None  # outside a tag only an object with both counts, and a signature is not a call
        if name_key is None:
            raise MalformedCall(f'the JSON object needs the tool name in "name": {self.shape}')
        return lenient_call(value, name_key, args_key, raw, tools, _NO_OBJECT)
