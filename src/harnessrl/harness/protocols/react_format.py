"""The react format: a Thought, the tool name after Action: and a JSON object after Action Input:.

    Thought: I need the sum first.
    Action: add
    Action Input: {"a": 17, "b": 25}

The harness supplies the Observation: generation stops at "Observation:" and anything from such
a line on is ignored. Several Action / Action Input pairs are several calls.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from harnessrl.harness.protocols.base import MAX_CALLS_PER_REPLY, MAX_NESTING, MalformedCall, ParseResult, Protocol
from harnessrl.harness.protocols.shared import (
    convert_text,
    example_call,
    find_tool,
    make_call,
    only_argument,
    read_json,
    result_marker,
    scan_braces,
    shorten,
    tool_properties,
    tools_block,
)
from harnessrl.types import ToolCall, ToolResult, ToolSchema

_KV_PAIR = re.compile(
    r"""[ \t\n]*([A-Za-z_]\w*)[ \t]*=[ \t]*"""
    r"""("[^"\\\n]*(?:\\.[^"\\\n]*)*"|'[^'\\\n]*(?:\\.[^'\\\n]*)*'|\[[^\]\n]*\]|\{[^}\n]*\}|[^,\n]*)"""
    r"""[ \t]*(?:,|\n|$)[ \t\n]*"""
)


class ReactProtocol(Protocol):
    """Thought: ...\\nAction: NAME\\nAction Input: {json}. The harness supplies the Observation."""

    name = "react"
    shape = "'Action: NAME' then 'Action Input: {...}' (a JSON object)"

    def __init__(self, lenient: bool = True):
        super().__init__(lenient)
        if lenient:
            flags = re.I | re.M
            self._observation = re.compile(r"^[ \t>*_#]*observation[ \t*_]*:", flags)
            self._action = re.compile(r"^[ \t>*_#-]*action[ \t*_]*:[ \t*_]*(.*)$", flags)
            self._input = re.compile(r"^[ \t>*_#-]*action[ \t_-]*input[ \t*_]*:[ \t*_]*", flags)
            self._thought_label = re.compile(r"^[ \t>*_#]*thought[ \t*_]*:[ \t*_]*", re.I)
        else:
            self._observation = re.compile(r"^Observation:", re.M)
            self._action = re.compile(r"^Action:[ \t]*(.*)$", re.M)
            self._input = re.compile(r"^Action Input:[ \t]*", re.M)
            self._thought_label = re.compile(r"^Thought:[ \t]*")

    def render_tools(self, tools: list[ToolSchema]) -> str:
        return "\n".join(
            [
                "Use this format to call a tool:",
                "Thought: your reasoning",
                "Action: the tool name",
                "Action Input: the arguments as a JSON object",
                "then stop: the Observation (the tool's result) comes next. Example:",
                self.render_call(example_call(tools), thought="I need this tool."),
                tools_block(tools),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        lines = [f"Thought: {thought.strip()}"] if thought.strip() else []
        lines.append(f"Action: {call.name}")
        lines.append(f"Action Input: {json.dumps(call.arguments, ensure_ascii=False)}")
        return "\n".join(lines)

    def render_result(self, result: ToolResult) -> str:
        out = result.output if result.output.strip() else "(no output)"
        return f"Observation: {result_marker(result)}{out}"

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        return "Call a tool with exactly these lines, then stop:\n" + self.render_call(example_call(tools))

    def stop_strings(self) -> list[str]:
        return ["Observation:"]

    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult:
        obs = self._observation.search(text)  # a hallucinated observation: ignore it and the rest
        if obs:
            text = text[: obs.start()]
        actions = list(self._action.finditer(text))
        if not actions:
            thought = self._thought_label.sub("", text.strip()).strip()
            if self._input.search(text):
                return ParseResult(error="found 'Action Input:' but no 'Action:' line naming the tool", thought=thought)
            return ParseResult(thought=thought)
        thought = self._thought_label.sub("", text[: actions[0].start()].strip()).strip()
        calls: list[ToolCall] = []
        errors: list[str] = []
        for k, m in enumerate(actions):
            if len(calls) > MAX_CALLS_PER_REPLY:
                break
            region_end = actions[k + 1].start() if k + 1 < len(actions) else len(text)
            region = text[m.end() : region_end]
            raw = text[m.start() : region_end].rstrip()
            try:
                name = self._tool_name(m.group(1))
                im = self._input.search(region)
                if im is None:
                    if not self.lenient:
                        raise MalformedCall(f"missing 'Action Input:' line after 'Action: {shorten(name, 40)}'")
                    args: dict[str, Any] = {}
                else:
                    args = self._arguments(region[im.end() :].strip(), name, tools)
                calls.append(make_call(name, args, raw))
            except MalformedCall as exc:
                errors.append(str(exc))
        if errors:
            return ParseResult(calls=calls, error="; ".join(dict.fromkeys(errors)), thought=thought)
        return ParseResult(calls=calls, thought=thought)

    def _tool_name(self, raw: str) -> str:
        name = raw.strip()
        if self.lenient:
            name = name.strip("*`'\" \t")
            if name.endswith("()"):
                name = name[:-2].rstrip()
            name = name.strip("*`'\" \t")
        if not name:
            raise MalformedCall("'Action:' must be followed by the tool name, e.g. 'Action: NAME'")
        if any(c.isspace() for c in name) or (not self.lenient and any(c in "`'\"()*" for c in name)):
            raise MalformedCall(f"'Action:' must be just the tool name, got {shorten(name, 40)!r}")
        return name

    def _arguments(self, body: str, name: str, tools: list[ToolSchema] | None) -> dict[str, Any]:
        if self.lenient and body.startswith("```"):  # fenced input
            first_nl = body.find("\n")
            body = body[first_nl + 1 :] if first_nl >= 0 else body[3:]
            close = body.find("```")
            body = (body[:close] if close >= 0 else body).strip()
        if not body:
            return {}
        if body.startswith("{"):
            spans, _ = scan_braces(body, "\"'" if self.lenient else '"')
            if not spans or spans[0].start != 0:
                raise MalformedCall("the Action Input JSON object is not finished (a closing '}' or quote is missing)")
            if spans[0].depth > MAX_NESTING:
                raise MalformedCall("the Action Input JSON object is nested too deeply")
            try:
                obj = read_json(body[: spans[0].end], self.lenient)
            except MalformedCall as exc:
                raise MalformedCall(f"could not parse JSON after 'Action Input:': {exc}") from None
            if not self.lenient and body[spans[0].end :].strip():
                raise MalformedCall("unexpected text after the Action Input JSON object")
            if not isinstance(obj, dict):
                raise MalformedCall("the Action Input must be a JSON object")
            return obj
        if not self.lenient:
            raise MalformedCall('the Action Input must be a JSON object, e.g. {"arg": "value"}')
        tool = find_tool(tools, name)
        props = tool_properties(tool)
        if body[0] in "\"'" and ":" in body:  # "a": 1, "b": 2 without the braces
            try:
                obj = read_json("{" + body + "}", True)
                if isinstance(obj, dict):
                    return obj
            except MalformedCall:
                pass
        kv = self._key_values(body, props)
        if kv is not None:
            return kv
        only = only_argument(tool)
        if only is not None:
            return {only: self._bare_value(body, props.get(only))}
        raise MalformedCall('the Action Input must be a JSON object, e.g. {"arg": "value"}')

    def _key_values(self, body: str, props: dict[str, Any]) -> dict[str, Any] | None:
        """a=1, b="x" (or one pair per line); None when the input is not of that form."""
        out: dict[str, Any] = {}
        pos, n = 0, len(body)
        while pos < n:
            m = _KV_PAIR.match(body, pos)
            if m is None or m.end() == pos:
                return None
            out[m.group(1)] = self._bare_value(m.group(2).strip(), props.get(m.group(1)))
            pos = m.end()
        return out or None

    def _bare_value(self, raw: str, schema: Any) -> Any:
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
            try:
                value = ast.literal_eval(raw)  # a string literal only: safe
                if isinstance(value, str):
                    return value
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                pass
        if isinstance(schema, dict) and schema.get("type"):
            return convert_text(raw, schema, True)
        try:
            return read_json(raw, True)
        except MalformedCall:
            return raw
