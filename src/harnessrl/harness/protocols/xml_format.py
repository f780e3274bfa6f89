"""The xml format: one <tool> tag per call and one child tag per argument.

    <tool name="add"><a>17</a><b>25</b></tool>

Values are text (lists and objects as JSON, < and & escaped) converted with the tool's
JSON-schema types; an argument whose name is not a valid tag name is <arg name="ARG">value</arg>.
Anything after a <tool_result the model wrote itself is ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any

from harnessrl.harness.protocols.base import MAX_CALLS_PER_REPLY, MalformedCall, ParseResult, Protocol
from harnessrl.harness.protocols.shared import (
    arg_schema,
    convert_text,
    example_call,
    make_call,
    read_json,
    result_marker,
    shorten,
    text_outside,
    tools_block,
)
from harnessrl.types import ToolCall, ToolResult, ToolSchema

_XML_ESCAPES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_XML_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos);")
_XML_TAG_NAME = re.compile(r"[A-Za-z_][\w.-]*")


def _xml_unescape(s: str) -> str:
    return _XML_ENTITY.sub(lambda m: _XML_ESCAPES[m.group(1)], s)


def _xml_text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml_attr(s: str) -> str:
    return _xml_text(s).replace('"', "&quot;")


class XmlProtocol(Protocol):
    """<tool name="NAME"><ARG>value</ARG>...</tool>; arguments whose names are not valid tag
    names are written <arg name="ARG">value</arg>. Values are text (lists/objects as JSON) and
    are converted with the tool's JSON-schema types."""

    name = "xml"
    shape = '<tool name="NAME"><ARG>value</ARG></tool>'

    def __init__(self, lenient: bool = True):
        super().__init__(lenient)
        flags = re.I if lenient else 0
        self._start = re.compile(r"<tool(?=[\s/>]|$)", flags)
        self._open = re.compile(r"<tool([^<>]{0,2000})>", flags)
        self._end_or_next = re.compile(r"</tool\s*>|<tool(?=[\s/>])" if lenient else r"</tool>|<tool(?=[\s/>])", flags)
        self._result = re.compile(r"<tool_result\b", flags)
        if lenient:
            self._name_attr = re.compile(r"""(?:^|\s)name\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>/`]+))""")
        else:
            self._name_attr = re.compile(r'(?:^|\s)name="([^"]*)"')
        self._arg_open = re.compile(r"<([A-Za-z_][\w.:-]{0,200})([^<>]{0,500})>")

    def render_tools(self, tools: list[ToolSchema]) -> str:
        example = self.render_call(example_call(tools)).replace("\n", "")
        return "\n".join(
            [
                "To call a tool, reply with a tool tag holding one tag per argument:",
                '<tool name="TOOL"><ARGUMENT>value</ARGUMENT></tool>',
                f"Example: {example}",
                "Write lists and objects as JSON; write < and & as &lt; and &amp;.",
                tools_block(tools),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        lines = [f'<tool name="{_xml_attr(call.name)}">']
        for key, value in call.arguments.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            text = _xml_text(text)
            if text.startswith("\n") or text.endswith("\n"):
                text = f"\n{text}\n"  # parse drops one newline at each edge of a value
            if _XML_TAG_NAME.fullmatch(key) and key != "arg" and not key.lower().startswith("tool"):
                lines.append(f"<{key}>{text}</{key}>")
            else:
                lines.append(f'<arg name="{_xml_attr(key)}">{text}</arg>')
        lines.append("</tool>")
        body = "\n".join(lines)
        return f"{thought.strip()}\n{body}" if thought.strip() else body

    def render_result(self, result: ToolResult) -> str:
        out = result.output if result.output.strip() else "(no output)"
        return f'<tool_result name="{_xml_attr(result.name)}">{result_marker(result)}{out}</tool_result>'

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        example = self.render_call(example_call(tools)).replace("\n", "")
        return f"Call a tool with a tool tag, one tag per argument, exactly like:\n{example}"

    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult:
        hallucinated = self._result.search(text)  # the model wrote its own result: ignore the rest
        if hallucinated:
            text = text[: hallucinated.start()]
        calls: list[ToolCall] = []
        errors: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        while len(calls) <= MAX_CALLS_PER_REPLY:
            start = self._start.search(text, pos)
            if start is None:
                break
            i = start.start()
            m = self._open.match(text, i)
            if m is None:
                errors.append('the <tool ...> tag is not finished: write <tool name="NAME">')
                spans.append((i, len(text)))
                break
            attrs = m.group(1)
            self_closing = attrs.rstrip().endswith("/")
            end, body = m.end(), ""
            if not self_closing:
                close = self._end_or_next.search(text, m.end())
                if close is not None and close.group().startswith("</"):
                    body, end = text[m.end() : close.start()], close.end()
                elif self.lenient:  # missing </tool>: the call runs to the next <tool> or the end
                    stop = close.start() if close is not None else len(text)
                    body, end = text[m.end() : stop], stop
                else:
                    errors.append("missing </tool> after the arguments")
                    spans.append((i, len(text)))
                    break
            spans.append((i, end))
            pos = max(end, i + 1)
            raw = text[i:end]
            try:
                name = self._tool_name(attrs.rstrip().rstrip("/"))
                calls.append(make_call(name, self._arguments(body, name, tools), raw))
            except MalformedCall as exc:
                errors.append(str(exc))
        thought = "\n".join(s.strip() for s in text_outside(text, spans) if s.strip())
        if errors:
            return ParseResult(calls=calls, error="; ".join(dict.fromkeys(errors)), thought=thought)
        return ParseResult(calls=calls, thought=thought)

    def _tool_name(self, attrs: str) -> str:
        m = self._name_attr.search(attrs)
        if m is None:
            raise MalformedCall('the <tool> tag needs the tool name: <tool name="NAME">')
        name = _xml_unescape(next(g for g in m.groups() if g is not None)).strip()
        if not name:
            raise MalformedCall('the tool name is empty: <tool name="NAME">')
        return name

    def _arguments(self, body: str, tool_name: str, tools: list[ToolSchema] | None) -> dict[str, Any]:
        args: dict[str, Any] = {}
        pos, n = 0, len(body)
        stray: list[str] = []
        while pos < n:
            lt = body.find("<", pos)
            if lt < 0:
                stray.append(body[pos:])
                break
            stray.append(body[pos:lt])
            m = self._arg_open.match(body, lt)
            if m is None:
                if not self.lenient:
                    raise MalformedCall(f"unexpected text inside <tool>: {shorten(body[lt:], 40)!r}")
                stray.append("<")
                pos = lt + 1
                continue
            tag, attrs = m.group(1), m.group(2)
            key = tag
            if tag == "arg":
                am = self._name_attr.search(attrs.rstrip().rstrip("/"))
                if am is not None:
                    key = _xml_unescape(next(g for g in am.groups() if g is not None))
            if attrs.rstrip().endswith("/"):  # <flag/>: empty value
                value, pos = "", m.end()
            else:
                closer = re.compile(rf"</{re.escape(tag)}\s*>" if self.lenient else rf"</{re.escape(tag)}>")
                c = closer.search(body, m.end())
                if c is None:  # even lenient: the value may have been cut off
                    raise MalformedCall(f"missing </{tag}> after the value of '{shorten(key, 40)}'")
                else:
                    value, pos = body[m.end() : c.start()], c.end()
            args[key] = self._value(value, arg_schema(tools, tool_name, key))
        leftover = "".join(stray).strip()
        if leftover and not args:
            if self.lenient and leftover.startswith("{"):  # <tool name="add">{"a": 1}</tool>
                try:
                    obj = read_json(leftover, True)
                except MalformedCall as exc:
                    raise MalformedCall(f"could not parse the arguments: {exc}") from None
                if isinstance(obj, dict):
                    return obj
            if not self.lenient:
                raise MalformedCall(f"write each argument as <NAME>value</NAME>, found {shorten(leftover, 40)!r}")
        elif leftover and not self.lenient:
            raise MalformedCall(f"unexpected text between argument tags: {shorten(leftover, 40)!r}")
        return args

    def _value(self, text: str, schema: dict[str, Any] | None) -> Any:
        text = _xml_unescape(text)
        if text.startswith("\n"):
            text = text[1:]
        if text.endswith("\n"):
            text = text[:-1]
        return convert_text(text, schema, self.lenient)
