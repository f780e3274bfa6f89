"""The json format: one JSON object per call.

    {"tool": "add", "arguments": {"a": 17, "b": 25}}

Several objects, or a JSON list of them, are several calls; prose may come before the call.
Lenient mode also reads alias keys (name / function / tool_name, args / parameters / input /
params), the flat form {"tool": "add", "a": 1}, OpenAI-style nesting and {"tool_calls": [...]},
arguments given as a string, trailing commas and single-quoted Python-ish dicts.
"""

from __future__ import annotations

import json
import re
from typing import Any

from harnessrl.harness.protocols.base import MAX_CALLS_PER_REPLY, MAX_NESTING, MalformedCall, ParseResult, Protocol
from harnessrl.harness.protocols.shared import (
    example_call,
    find_tool,
    lenient_call,
    make_call,
    plain_result,
    read_json,
    scan_braces,
    text_outside,
    tools_block,
)
from harnessrl.types import ToolCall, ToolResult, ToolSchema

_NAME_KEYS = ("tool", "tool_name", "function", "name")
_ARGS_KEYS = ("arguments", "args", "parameters", "input", "params")
_NO_OBJECT = "the arguments must be a JSON object of argument names and values"
_WRAPPER_KEYS = ("tool_calls", "calls", "actions")
# does a fragment that failed to decode look like a call attempt?
_JSON_HINT = re.compile(r"""["']?\b(?:tool|tool_name|name|function)\b["']?\s*:""")
_FENCE_MARK = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*")


class JsonProtocol(Protocol):
    """{"tool": "name", "arguments": {...}}; several objects (or a JSON list) = several calls."""

    name = "json"
    shape = '{"tool": "NAME", "arguments": {...}}'

    def render_tools(self, tools: list[ToolSchema]) -> str:
        example = self.render_call(example_call(tools))
        return "\n".join(
            [
                "To call a tool, reply with a JSON object:",
                '{"tool": "<tool name>", "arguments": {"<argument>": <value>}}',
                f"Example: {example}",
                tools_block(tools),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        obj = json.dumps({"tool": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{thought.strip()}\n{obj}" if thought.strip() else obj

    def render_result(self, result: ToolResult) -> str:
        return plain_result(result)

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        return "Call a tool by replying with one JSON object, exactly like:\n" + self.render_call(example_call(tools))

    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult:
        spans, unclosed = scan_braces(text, "\"'" if self.lenient else '"')
        calls: list[ToolCall] = []
        errors: list[str] = []
        used: list[tuple[int, int]] = []
        for span in spans:
            if len(calls) > MAX_CALLS_PER_REPLY:
                break
            chunk = text[span.start : span.end]
            looks_like_call = _JSON_HINT.search(chunk) is not None
            if span.depth > MAX_NESTING:
                if looks_like_call:
                    errors.append("the JSON object is nested too deeply")
                continue
            try:
                value = read_json(chunk, self.lenient)
            except MalformedCall as exc:
                if looks_like_call:
                    errors.append(f"could not parse JSON: {exc}")
                continue
            try:
                found = self._calls_from_value(value, chunk, tools, 0)
            except MalformedCall as exc:
                errors.append(str(exc))
                continue
            if found:
                calls.extend(found)
                used.append((span.start, span.end))
        if unclosed is not None:
            # the unfinished object, without the complete objects nested in it
            inner = [(s.start - unclosed, s.end - unclosed) for s in spans if s.start >= unclosed]
            tail = "".join(text_outside(text[unclosed:], inner))
            if _JSON_HINT.search(tail):
                errors.append("the JSON object is not finished (a closing '}' or quote is missing)")

        segs = text_outside(text, used)
        cleaned = []
        for i, seg in enumerate(segs):
            seg = _FENCE_MARK.sub("", seg)
            if i > 0:
                seg = seg.lstrip(" \t\r\n],")
            if i < len(segs) - 1:
                seg = seg.rstrip(" \t\r\n[,")
            cleaned.append(seg.strip())
        if not self.lenient and calls and any(cleaned[1:]):
            errors.append("text after the JSON call: end your reply with the call")
        thought = "\n".join(c for c in cleaned if c).strip()
        if errors and (not calls or not self.lenient):
            # lenient: a broken fragment next to good calls is usually a cut-off repeat; keep the calls
            return ParseResult(calls=calls, error="; ".join(dict.fromkeys(errors)), thought=thought)
        return ParseResult(calls=calls, thought=thought)

    def _calls_from_value(self, value: Any, raw: str, tools: list[ToolSchema] | None, depth: int) -> list[ToolCall]:
        if not isinstance(value, dict) or depth > 3:
            return []
        if not self.lenient:
            if "tool" not in value:
                if any(k in value for k in _NAME_KEYS) and any(k in value for k in _ARGS_KEYS):
                    raise MalformedCall(f'use exactly the keys "tool" and "arguments": {self.shape}')
                return []
            extra = sorted(set(value) - {"tool", "arguments"})
            if extra:
                raise MalformedCall(f'unexpected keys {extra}: use exactly {{"tool": "name", "arguments": {{...}}}}')
            if "arguments" not in value:
                raise MalformedCall('missing "arguments": give an object, {} when the tool takes none')
            if not isinstance(value["tool"], str):
                raise MalformedCall('"tool" must be the tool name as a string')
            if not isinstance(value["arguments"], dict):
                raise MalformedCall('"arguments" must be a JSON object')
            return [make_call(value["tool"], value["arguments"], raw)]

        for key in _WRAPPER_KEYS:  # {"tool_calls": [{...}, {...}]}
            if isinstance(value.get(key), list) and not any(k in value for k in _NAME_KEYS):
                out: list[ToolCall] = []
                for item in value[key]:
                    out.extend(self._calls_from_value(item, raw, tools, depth + 1))
                return out
        name_key = next((k for k in _NAME_KEYS if k in value), None)
        if name_key is None:
            return []
        name = value[name_key]
        if isinstance(name, dict) and name_key in ("tool", "function"):  # OpenAI style nesting
            return self._calls_from_value(name, raw, tools, depth + 1)
        args_key = next((k for k in _ARGS_KEYS if k in value), None)
        if name_key == "name" and args_key is None and find_tool(tools, name if isinstance(name, str) else "") is None:
            return []  # {"name": "Bob", ...} is data, not a call
        return [lenient_call(value, name_key, args_key, raw, tools, _NO_OBJECT)]
