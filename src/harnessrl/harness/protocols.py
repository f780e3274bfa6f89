"""Tool-call protocols: how tools are shown to the model and how its replies become ToolCalls.

A protocol is the text format of a tool call. Four are built in:

    json   {"tool": "add", "arguments": {"a": 17, "b": 25}}
    xml    <tool name="add"><a>17</a><b>25</b></tool>
    react  Thought: ...\\nAction: add\\nAction Input: {"a": 17, "b": 25}
    code   ```python\\nadd(a=17, b=25)\\n```          (parsed with `ast`, never executed)

Every protocol renders the tool block of the system prompt, renders a call (for demonstrations
and feedback), parses a completion and renders a tool result. `parse` never raises and never
hangs: the text is capped at MAX_SCAN_CHARS, scanners are linear and nesting is bounded.

What a parse means (the harness decides what to do with it):
- `empty`: the completion is whitespace only;
- `calls` non-empty, `error` None: the calls, in order;
- `error` set: the reply tried to call a tool and that attempt could not be parsed (malformed);
- neither: prose without any attempt at a call.

`lenient=True` accepts near-misses a small model produces (alias keys, Python-ish dicts, bare
tool names in backticks, unfenced code, ...); `lenient=False` accepts only the documented shape.
Tool names are not checked against `tools` here (the runner records unknown tools as blocked
calls); `tools` is only used to convert argument types and to map positional/bare arguments.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import textwrap
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from pydantic import ValidationError

from harnessrl.types import ToolCall, ToolResult, ToolSchema

MAX_SCAN_CHARS = 100_000  # text beyond this is ignored (calls that far out are never real)
MAX_NESTING = 64  # deeper JSON / literal nesting is refused rather than recursed into
MAX_CALLS_PER_REPLY = 32  # more calls than this in one completion is a malformed reply

PROTOCOLS = ("json", "xml", "react", "code")


@dataclass
class ParseResult:
    """What `Protocol.parse` found in one completion."""

    calls: list[ToolCall] = field(default_factory=list)  # in order; empty when none was found
    error: str | None = None  # a call was attempted but could not be parsed: a message for the model
    empty: bool = False  # the completion is empty / whitespace only
    thought: str = ""  # prose outside the calls (reasoning), stripped


class _Malformed(Exception):
    """A call attempt that cannot be parsed; its message becomes ParseResult.error."""


# --------------------------------------------------------------------------------------------
# shared helpers: argument values, tool schemas, type conversion
# --------------------------------------------------------------------------------------------


def _short(text: str, n: int = 60) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _fix_surrogates(s: str) -> str:
    """Lone surrogates (from JSON escapes like \\ud800) cannot be stored as UTF-8: replace them."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _to_json_value(value: Any, depth: int = 0) -> Any:
    """A parsed value as plain JSON data (tuples become lists); anything else is malformed."""
    if depth > MAX_NESTING:
        raise _Malformed("arguments are nested too deeply")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return _fix_surrogates(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Malformed("numbers must be finite (no NaN or Infinity)")
        return value
    if isinstance(value, (list, tuple)):
        return [_to_json_value(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Malformed(f"argument names and object keys must be strings, got {_short(repr(k))}")
            out[_fix_surrogates(k)] = _to_json_value(v, depth + 1)
        return out
    raise _Malformed(
        f"argument values must be strings, numbers, booleans, null, lists or objects, got {type(value).__name__}"
    )


def _make_call(name: Any, arguments: Any, raw: str) -> ToolCall:
    if not isinstance(name, str) or not name.strip():
        raise _Malformed("the tool name must be a non-empty string")
    if not isinstance(arguments, dict):
        raise _Malformed(f"the arguments must be an object, got {type(arguments).__name__}")
    try:
        return ToolCall(name=_fix_surrogates(name.strip()), arguments=_to_json_value(arguments), raw=raw)
    except ValidationError as exc:  # defensive: _to_json_value already guarantees the shape
        raise _Malformed(f"invalid call: {exc.errors()[0].get('msg', 'invalid')}") from None


def _find_tool(tools: list[ToolSchema] | None, name: str) -> ToolSchema | None:
    for tool in tools or []:
        if tool.name == name:
            return tool
    return None


def _props(tool: ToolSchema | None) -> dict[str, Any]:
    if tool is None:
        return {}
    props = tool.parameters.get("properties") or {}
    return props if isinstance(props, dict) else {}


def _required(tool: ToolSchema | None) -> list[str]:
    req = tool.parameters.get("required") if tool is not None else None
    return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


def _arg_schema(tools: list[ToolSchema] | None, tool_name: str, arg: str) -> dict[str, Any] | None:
    schema = _props(_find_tool(tools, tool_name)).get(arg)
    return schema if isinstance(schema, dict) else None


def _convert_text(text: str, schema: dict[str, Any] | None, lenient: bool = True) -> Any:
    """Convert an argument given as text using its JSON-schema type.

    Types are tried in order (a list like ["integer", "null"] is allowed). A value that does not
    convert stays a string: then the runner's argument check blocks the call with a clear reason
    instead of the protocol calling a well-formed call malformed. Unknown types stay strings.
    """
    if not schema:
        return text
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    for t in types:
        ok, value = _try_convert(text, t, lenient)
        if ok:
            return value
    return text


def _try_convert(text: str, type_name: Any, lenient: bool) -> tuple[bool, Any]:
    s = text.strip()
    if type_name == "string":
        return True, text
    if type_name == "integer":
        try:
            return True, int(s)
        except ValueError:
            pass
        if lenient:
            try:
                f = float(s)
                if math.isfinite(f) and f.is_integer():
                    return True, int(f)
            except (ValueError, OverflowError):
                pass
        return False, None
    if type_name == "number":
        try:
            v = json.loads(s)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                return True, v
        except (ValueError, RecursionError):
            pass
        if lenient:
            try:
                f = float(s)
                if math.isfinite(f):
                    return True, f
            except ValueError:
                pass
        return False, None
    if type_name == "boolean":
        truthy, falsy = ({"true", "yes", "1"}, {"false", "no", "0"}) if lenient else ({"true"}, {"false"})
        low = s.lower() if lenient else s
        if low in truthy:
            return True, True
        if low in falsy:
            return True, False
        return False, None
    if type_name == "null":
        if s in ("null", "None", "") if lenient else s == "null":
            return True, None
        return False, None
    if type_name in ("array", "object"):
        try:
            v = _loads(s, lenient)
        except _Malformed:
            return False, None
        if isinstance(v, list if type_name == "array" else dict):
            try:
                return True, _to_json_value(v)
            except _Malformed:
                return False, None
        return False, None
    return False, None


# --------------------------------------------------------------------------------------------
# shared helpers: rendering
# --------------------------------------------------------------------------------------------

_PY_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}


def _type_label(schema: Any, python: bool = False) -> str:
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "|".join(json.dumps(v, ensure_ascii=False) if not python else repr(v) for v in schema["enum"][:8])
    t = schema.get("type")
    types = t if isinstance(t, list) else [t] if t else []
    if not types:
        return "any"
    names = [(_PY_TYPES.get(x, str(x)) if python else str(x)) for x in types]
    label = "|".join(names)
    items = schema.get("items")
    if types == ["array"] and isinstance(items, dict) and items.get("type"):
        inner = _type_label(items, python)
        label = f"list[{inner}]" if python else f"array of {inner}"
    return label


def _signature(tool: ToolSchema, python: bool = False, name: str | None = None) -> str:
    req = set(_required(tool))
    args = [f"{arg}{'' if arg in req else '?'}: {_type_label(s, python)}" for arg, s in _props(tool).items()]
    return f"{name or tool.name}({', '.join(args)})"


def _tools_block(tools: list[ToolSchema], python: bool = False, name_of=None) -> str:
    """Every tool: signature (arg? = optional), description, and argument descriptions if any."""
    if not tools:
        return "Tools: (none)"
    lines = ["Tools (arg? = optional):"]
    for tool in tools:
        sig = _signature(tool, python, name_of(tool.name) if name_of else None)
        desc = " ".join(tool.description.split())
        lines.append(f"- {sig}: {desc}" if desc else f"- {sig}")
        for arg, s in _props(tool).items():
            d = s.get("description") if isinstance(s, dict) else None
            if isinstance(d, str) and d.strip():
                lines.append(f"    {arg}: {' '.join(d.split())}")
    return "\n".join(lines)


def _placeholder(schema: Any) -> Any:
    """A generic example value for an argument (for the format examples)."""
    if not isinstance(schema, dict):
        return "text"
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    t = schema.get("type")
    t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(t, "text")


def _example_call(tools: list[ToolSchema]) -> ToolCall:
    """The example used in the tool block and the format reminder: the first tool with
    placeholder values for its required arguments (a made-up tool name would teach a tiny model
    to call a tool that does not exist)."""
    if not tools:
        return ToolCall(name="tool_name", arguments={"argument": "value"})
    tool = tools[0]
    props = _props(tool)
    names = [r for r in _required(tool) if r in props] or list(props)[:1]
    return ToolCall(name=tool.name, arguments={n: _placeholder(props[n]) for n in names})


def _marker(result: ToolResult) -> str:
    if result.blocked is not None:
        return "[blocked] "
    if not result.ok:
        return "[error] "
    return ""


def _plain_result(result: ToolResult) -> str:
    out = result.output if result.output.strip() else "(no output)"
    sep = "\n" if "\n" in out else " "
    return f"Result of {result.name}:{sep}{_marker(result)}{out}"


# --------------------------------------------------------------------------------------------
# shared helpers: JSON-ish objects in free text
# --------------------------------------------------------------------------------------------

# the rest of a quoted string after its opening quote (unrolled loop: linear, no backtracking)
_STRING_REST = {
    '"': re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S),
    "'": re.compile(r"[^'\\]*(?:\\.[^'\\]*)*'", re.S),
}
_BRACE_SPECIALS = {'"': re.compile(r'[{}"]'), "\"'": re.compile(r"""[{}"']""")}


class _Span(NamedTuple):
    start: int
    end: int  # exclusive
    depth: int  # nesting depth of braces inside


def _scan_braces(text: str, quotes: str = "\"'") -> tuple[list[_Span], int | None]:
    """Balanced {...} spans of `text` that are not inside another one, and where the first
    unclosed '{' starts (None when all closed). Quotes only count inside braces (apostrophes in
    prose are not strings). Linear time; an unterminated string ends the scan."""
    special = _BRACE_SPECIALS[quotes]
    spans: list[_Span] = []
    stack: list[list[int]] = []  # [start, deepest child depth]
    pos = 0
    while True:
        m = special.search(text, pos)
        if m is None:
            break
        c, i = m.group(), m.start()
        if c == "{":
            stack.append([i, 0])
            pos = i + 1
        elif c == "}":
            if stack:
                start, child = stack.pop()
                depth = child + 1
                if stack:
                    stack[-1][1] = max(stack[-1][1], depth)
                spans.append(_Span(start, i + 1, depth))
            pos = i + 1
        else:
            if not stack:
                pos = i + 1
                continue
            end = _STRING_REST[c].match(text, i + 1)
            if end is None:
                break  # unterminated string: the enclosing objects stay unclosed
            pos = end.end()
    # keep the outermost balanced spans (spans are recorded in order of their end)
    spans.sort(key=lambda s: (s.start, -s.end))
    outer: list[_Span] = []
    for s in spans:
        if not outer or s.start >= outer[-1].end:
            outer.append(s)
    return outer, (stack[0][0] if stack else None)


def _split_strings(s: str) -> list[tuple[str, bool]]:
    """Split `s` into (segment, is_quoted_string) pieces, linearly."""
    out: list[tuple[str, bool]] = []
    pos, n = 0, len(s)
    quote = re.compile(r"""["']""")
    while pos < n:
        m = quote.search(s, pos)
        if m is None:
            out.append((s[pos:], False))
            break
        if m.start() > pos:
            out.append((s[pos : m.start()], False))
        end = _STRING_REST[m.group()].match(s, m.start() + 1)
        if end is None:
            out.append((s[m.start() :], True))
            break
        out.append((s[m.start() : end.end()], True))
        pos = end.end()
    return out


_TRAILING_COMMA = re.compile(r",(\s*)(?=[}\]])")
_JSON_WORDS = re.compile(r"\b(true|false|null)\b")
_PY_WORDS = {"true": "True", "false": "False", "null": "None"}


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return _short(str(exc), 120) or type(exc).__name__


def _loads(s: str, lenient: bool) -> Any:
    """Decode a JSON value; lenient also takes trailing commas, raw newlines in strings and
    single-quoted Python-ish literals (ast.literal_eval, never eval)."""
    try:
        return json.loads(s, strict=not lenient)
    except (ValueError, RecursionError) as exc:
        first = exc
    if not lenient:
        raise _Malformed(_json_error(first))
    pieces = _split_strings(s)
    no_commas = "".join(p if q else _TRAILING_COMMA.sub(r"\1", p) for p, q in pieces)
    if no_commas != s:
        try:
            return json.loads(no_commas, strict=False)
        except (ValueError, RecursionError):
            pass
    pythonish = "".join(
        p if q else _JSON_WORDS.sub(lambda m: _PY_WORDS[m.group(1)], _TRAILING_COMMA.sub(r"\1", p)) for p, q in pieces
    )
    try:
        return ast.literal_eval(pythonish.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _Malformed(_json_error(first)) from None


def _outside(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """The text segments around sorted, non-overlapping spans (len(spans) + 1 of them)."""
    segs, pos = [], 0
    for s, e in spans:
        segs.append(text[pos:s])
        pos = e
    segs.append(text[pos:])
    return segs


# --------------------------------------------------------------------------------------------
# the interface
# --------------------------------------------------------------------------------------------


class Protocol(ABC):
    """One tool-call text format. Subclasses implement `_parse` and the renderers."""

    name: ClassVar[str]
    shape: ClassVar[str]  # the call format in one line, for error messages

    def __init__(self, lenient: bool = True):
        self.lenient = lenient

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lenient={self.lenient})"

    @abstractmethod
    def render_tools(self, tools: list[ToolSchema]) -> str:
        """The system-prompt block: how to call a tool (with one example) and every tool."""

    @abstractmethod
    def render_call(self, call: ToolCall, thought: str = "") -> str:
        """Assistant text in this format that `parse` turns back into exactly [call]."""

    @abstractmethod
    def render_result(self, result: ToolResult) -> str:
        """The observation text for a tool result ([blocked] / [error] marked)."""

    @abstractmethod
    def format_reminder(self, tools: list[ToolSchema]) -> str:
        """A 2-4 line reminder of the exact call format, shown after a malformed reply."""

    def stop_strings(self) -> list[str]:
        """Strings after which generation should be cut."""
        return []

    def parse(self, text: str, tools: list[ToolSchema] | None = None) -> ParseResult:
        """Parse a completion. Never raises: anything unexpected becomes a parse error."""
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        if not text.strip():
            return ParseResult(calls=[], empty=True)
        text = text[:MAX_SCAN_CHARS]
        try:
            result = self._parse(text, tools)
        except _Malformed as exc:
            return ParseResult(calls=[], error=str(exc))
        except (Exception, RecursionError, MemoryError) as exc:  # never let model text crash a run
            return ParseResult(calls=[], error=f"could not parse the reply ({type(exc).__name__})")
        if not self.lenient and not result.calls and result.error is None:
            # a near miss (what lenient mode would accept) is a malformed call, not prose
            try:
                near = type(self)(lenient=True)._parse(text, tools)
            except (Exception, RecursionError, MemoryError):
                near = ParseResult()
            if near.calls:
                error = f"the tool call is not in the exact format; write {self.shape}"
                result = ParseResult(error=error, thought=result.thought)
        if len(result.calls) > MAX_CALLS_PER_REPLY:
            result.error = f"too many tool calls in one reply (at most {MAX_CALLS_PER_REPLY})"
        return result

    @abstractmethod
    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult: ...


# --------------------------------------------------------------------------------------------
# json
# --------------------------------------------------------------------------------------------

_NAME_KEYS = ("tool", "tool_name", "function", "name")
_ARGS_KEYS = ("arguments", "args", "parameters", "input", "params")
_META_KEYS = {"type", "id", "thought", "reasoning"}
_WRAPPER_KEYS = ("tool_calls", "calls", "actions")
# does a fragment that failed to decode look like a call attempt?
_JSON_HINT = re.compile(r"""["']?\b(?:tool|tool_name|name|function)\b["']?\s*:""")
_FENCE_MARK = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*")


class JsonProtocol(Protocol):
    """{"tool": "name", "arguments": {...}}; several objects (or a JSON list) = several calls."""

    name = "json"
    shape = '{"tool": "NAME", "arguments": {...}}'

    def render_tools(self, tools: list[ToolSchema]) -> str:
        example = self.render_call(_example_call(tools))
        return "\n".join(
            [
                "To call a tool, reply with a JSON object:",
                '{"tool": "<tool name>", "arguments": {"<argument>": <value>}}',
                f"Example: {example}",
                _tools_block(tools),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        obj = json.dumps({"tool": call.name, "arguments": call.arguments}, ensure_ascii=False)
        return f"{thought.strip()}\n{obj}" if thought.strip() else obj

    def render_result(self, result: ToolResult) -> str:
        return _plain_result(result)

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        return "Call a tool by replying with one JSON object, exactly like:\n" + self.render_call(
            _example_call(tools)
        )

    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult:
        spans, unclosed = _scan_braces(text, "\"'" if self.lenient else '"')
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
                value = _loads(chunk, self.lenient)
            except _Malformed as exc:
                if looks_like_call:
                    errors.append(f"could not parse JSON: {exc}")
                continue
            try:
                found = self._calls_from_value(value, chunk, tools, 0)
            except _Malformed as exc:
                errors.append(str(exc))
                continue
            if found:
                calls.extend(found)
                used.append((span.start, span.end))
        if unclosed is not None:
            # the unfinished object, without the complete objects nested in it
            inner = [(s.start - unclosed, s.end - unclosed) for s in spans if s.start >= unclosed]
            tail = "".join(_outside(text[unclosed:], inner))
            if _JSON_HINT.search(tail):
                errors.append("the JSON object is not finished (a closing '}' or quote is missing)")

        segs = _outside(text, used)
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
                    raise _Malformed(f'use exactly the keys "tool" and "arguments": {self.shape}')
                return []
            extra = sorted(set(value) - {"tool", "arguments"})
            if extra:
                raise _Malformed(f"unexpected keys {extra}: use exactly {{\"tool\": \"name\", \"arguments\": {{...}}}}")
            if "arguments" not in value:
                raise _Malformed('missing "arguments": give an object, {} when the tool takes none')
            if not isinstance(value["tool"], str):
                raise _Malformed('"tool" must be the tool name as a string')
            if not isinstance(value["arguments"], dict):
                raise _Malformed('"arguments" must be a JSON object')
            return [_make_call(value["tool"], value["arguments"], raw)]

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
        if name_key == "name" and args_key is None and _find_tool(tools, name if isinstance(name, str) else "") is None:
            return []  # {"name": "Bob", ...} is data, not a call
        if not isinstance(name, str) or not name.strip():
            raise _Malformed(f'"{name_key}" must be the tool name as a string')
        if args_key is None:  # flat form {"tool": "add", "a": 1, "b": 2}
            args: Any = {k: v for k, v in value.items() if k != name_key and k not in _META_KEYS}
        else:
            args = value[args_key]
            if args is None:
                args = {}
            elif isinstance(args, str):
                args = self._string_arguments(args, name, tools)
        if not isinstance(args, dict):
            raise _Malformed(f'"{args_key}" must be a JSON object of argument names and values')
        return [_make_call(name, args, raw)]

    def _string_arguments(self, args: str, name: str, tools: list[ToolSchema] | None) -> Any:
        """Arguments given as a string: JSON text, or the value of a tool's only argument."""
        if not args.strip():
            return {}
        if args.lstrip().startswith("{"):
            try:
                return _loads(args.strip(), True)
            except _Malformed as exc:
                raise _Malformed(f"could not parse the arguments string as JSON: {exc}") from None
        tool = _find_tool(tools, name)
        only = _only_argument(tool)
        if only is not None:
            return {only: _convert_text(args, _props(tool).get(only), True)}
        raise _Malformed("the arguments must be a JSON object of argument names and values")


def _only_argument(tool: ToolSchema | None) -> str | None:
    """The argument a bare value belongs to: the only required one, else the only one."""
    req = _required(tool)
    props = _props(tool)
    if len(req) == 1:
        return req[0]
    if not req and len(props) == 1:
        return next(iter(props))
    return None


# --------------------------------------------------------------------------------------------
# xml
# --------------------------------------------------------------------------------------------

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
        example = self.render_call(_example_call(tools)).replace("\n", "")
        return "\n".join(
            [
                "To call a tool, reply with a tool tag holding one tag per argument:",
                '<tool name="TOOL"><ARGUMENT>value</ARGUMENT></tool>',
                f"Example: {example}",
                "Write lists and objects as JSON; write < and & as &lt; and &amp;.",
                _tools_block(tools),
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
        return f'<tool_result name="{_xml_attr(result.name)}">{_marker(result)}{out}</tool_result>'

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        example = self.render_call(_example_call(tools)).replace("\n", "")
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
                errors.append("the <tool ...> tag is not finished: write <tool name=\"NAME\">")
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
                calls.append(_make_call(name, self._arguments(body, name, tools), raw))
            except _Malformed as exc:
                errors.append(str(exc))
        thought = "\n".join(s.strip() for s in _outside(text, spans) if s.strip())
        if errors:
            return ParseResult(calls=calls, error="; ".join(dict.fromkeys(errors)), thought=thought)
        return ParseResult(calls=calls, thought=thought)

    def _tool_name(self, attrs: str) -> str:
        m = self._name_attr.search(attrs)
        if m is None:
            raise _Malformed('the <tool> tag needs the tool name: <tool name="NAME">')
        name = _xml_unescape(next(g for g in m.groups() if g is not None)).strip()
        if not name:
            raise _Malformed('the tool name is empty: <tool name="NAME">')
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
                    raise _Malformed(f"unexpected text inside <tool>: {_short(body[lt:], 40)!r}")
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
                    raise _Malformed(f"missing </{tag}> after the value of '{_short(key, 40)}'")
                else:
                    value, pos = body[m.end() : c.start()], c.end()
            args[key] = self._value(value, _arg_schema(tools, tool_name, key))
        leftover = "".join(stray).strip()
        if leftover and not args:
            if self.lenient and leftover.startswith("{"):  # <tool name="add">{"a": 1}</tool>
                try:
                    obj = _loads(leftover, True)
                except _Malformed as exc:
                    raise _Malformed(f"could not parse the arguments: {exc}") from None
                if isinstance(obj, dict):
                    return obj
            if not self.lenient:
                raise _Malformed(f"write each argument as <NAME>value</NAME>, found {_short(leftover, 40)!r}")
        elif leftover and not self.lenient:
            raise _Malformed(f"unexpected text between argument tags: {_short(leftover, 40)!r}")
        return args

    def _value(self, text: str, schema: dict[str, Any] | None) -> Any:
        text = _xml_unescape(text)
        if text.startswith("\n"):
            text = text[1:]
        if text.endswith("\n"):
            text = text[:-1]
        return _convert_text(text, schema, self.lenient)


# --------------------------------------------------------------------------------------------
# react
# --------------------------------------------------------------------------------------------

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
                self.render_call(_example_call(tools), thought="I need this tool."),
                _tools_block(tools),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        lines = [f"Thought: {thought.strip()}"] if thought.strip() else []
        lines.append(f"Action: {call.name}")
        lines.append(f"Action Input: {json.dumps(call.arguments, ensure_ascii=False)}")
        return "\n".join(lines)

    def render_result(self, result: ToolResult) -> str:
        out = result.output if result.output.strip() else "(no output)"
        return f"Observation: {_marker(result)}{out}"

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        return "Call a tool with exactly these lines, then stop:\n" + self.render_call(_example_call(tools))

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
                        raise _Malformed(f"missing 'Action Input:' line after 'Action: {_short(name, 40)}'")
                    args: dict[str, Any] = {}
                else:
                    args = self._arguments(region[im.end() :].strip(), name, tools)
                calls.append(_make_call(name, args, raw))
            except _Malformed as exc:
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
            raise _Malformed("'Action:' must be followed by the tool name, e.g. 'Action: NAME'")
        if any(c.isspace() for c in name) or (not self.lenient and any(c in "`'\"()*" for c in name)):
            raise _Malformed(f"'Action:' must be just the tool name, got {_short(name, 40)!r}")
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
            spans, _ = _scan_braces(body, "\"'" if self.lenient else '"')
            if not spans or spans[0].start != 0:
                raise _Malformed("the Action Input JSON object is not finished (a closing '}' or quote is missing)")
            if spans[0].depth > MAX_NESTING:
                raise _Malformed("the Action Input JSON object is nested too deeply")
            try:
                obj = _loads(body[: spans[0].end], self.lenient)
            except _Malformed as exc:
                raise _Malformed(f"could not parse JSON after 'Action Input:': {exc}") from None
            if not self.lenient and body[spans[0].end :].strip():
                raise _Malformed("unexpected text after the Action Input JSON object")
            if not isinstance(obj, dict):
                raise _Malformed("the Action Input must be a JSON object")
            return obj
        if not self.lenient:
            raise _Malformed('the Action Input must be a JSON object, e.g. {"arg": "value"}')
        tool = _find_tool(tools, name)
        props = _props(tool)
        if body[0] in "\"'" and ":" in body:  # "a": 1, "b": 2 without the braces
            try:
                obj = _loads("{" + body + "}", True)
                if isinstance(obj, dict):
                    return obj
            except _Malformed:
                pass
        kv = self._key_values(body, props)
        if kv is not None:
            return kv
        only = _only_argument(tool)
        if only is not None:
            return {only: self._bare_value(body, props.get(only))}
        raise _Malformed('the Action Input must be a JSON object, e.g. {"arg": "value"}')

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
            return _convert_text(raw, schema, True)
        try:
            return _loads(raw, True)
        except _Malformed:
            return raw


# --------------------------------------------------------------------------------------------
# code
# --------------------------------------------------------------------------------------------


class _Block(NamedTuple):
    start: int
    end: int
    lang: str
    code: str
    closed: bool


def _fenced_blocks(text: str) -> list[_Block]:
    out: list[_Block] = []
    pos = 0
    while True:
        i = text.find("```", pos)
        if i < 0:
            break
        nl = text.find("\n", i + 3)
        line = text[i + 3 : nl if nl >= 0 else len(text)]
        inline_close = line.find("```")
        if inline_close >= 0:  # ```add(a=1)``` on one line
            end = i + 3 + inline_close + 3
            out.append(_Block(i, end, "", line[:inline_close], True))
            pos = end
            continue
        lang = (line.split() or [""])[0].lower()
        if nl < 0:
            out.append(_Block(i, len(text), lang, "", False))
            break
        j = text.find("```", nl + 1)
        if j < 0:
            out.append(_Block(i, len(text), lang, text[nl + 1 :], False))
            break
        out.append(_Block(i, j + 3, lang, text[nl + 1 : j], True))
        pos = j + 3
    return out


_CODE_LANGS_STRICT = {"python", "py"}
_CODE_LANGS_LENIENT = {"python", "py", "python3", "py3", "", "tool_code", "tool", "code"}
_CALL_LINE = re.compile(r"^[ \t]*[A-Za-z_][\w.]*\(.*\)[ \t;]*$", re.M)
_LITERAL_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.UnaryOp, ast.UAdd, ast.USub, ast.Load)


def _py_name(name: str) -> str:
    """A tool name as a Python identifier (tool names like 'web-search' become web_search)."""
    if name.isidentifier() and not keyword.iskeyword(name):
        return name
    ident = re.sub(r"\W", "_", name)
    if not ident or ident[0].isdigit() or keyword.iskeyword(ident):
        ident = "_" + ident
    return ident


def _describe_node(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name '{_short(node.id, 30)}'"
    if isinstance(node, ast.Attribute):
        return "attribute access"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.Lambda):
        return "a lambda"
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return "a comprehension"
    if isinstance(node, (ast.BinOp, ast.BoolOp, ast.Compare)):
        return "an expression"
    if isinstance(node, ast.JoinedStr):
        return "an f-string"
    return f"a {type(node).__name__}"


def _describe_stmt(stmt: ast.stmt) -> str:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return "imports are not allowed"
    if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return "assignments are not allowed: write the tool call itself"
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return "definitions are not allowed"
    if isinstance(stmt, ast.Expr):
        return f"only tool calls are allowed, found {_describe_node(stmt.value)}"
    return f"only tool calls are allowed, found a {type(stmt).__name__} statement"


class CodeProtocol(Protocol):
    """Python call statements with literal arguments in a ```python block. Parsed with `ast`
    and `ast.literal_eval` per argument: nothing is ever executed."""

    name = "code"
    shape = "a call like name(arg=\"value\") in a ```python block"

    def render_tools(self, tools: list[ToolSchema]) -> str:
        return "\n".join(
            [
                "To call a tool, write a Python call in a ```python block. Use literal values only",
                "(strings, numbers, True/False/None, lists, dicts): no variables or other code. Example:",
                self.render_call(_example_call(tools)),
                _tools_block(tools, python=True, name_of=_py_name),
            ]
        )

    def render_call(self, call: ToolCall, thought: str = "") -> str:
        def plain(key: str) -> bool:
            return key.isidentifier() and not keyword.iskeyword(key)

        named = [f"{k}={self._literal_src(v)}" for k, v in call.arguments.items() if plain(k)]
        other = {k: v for k, v in call.arguments.items() if not plain(k)}
        if other:
            named.append(f"**{self._literal_src(other)}")
        src = f"{_py_name(call.name)}({', '.join(named)})"
        block = f"```python\n{src}\n```"
        return f"{thought.strip()}\n{block}" if thought.strip() else block

    @staticmethod
    def _literal_src(value: Any) -> str:
        src = repr(value)
        # a backtick can only occur inside a string literal here; keep ``` from closing the fence
        return src.replace("`", "\\x60") if "```" in src else src

    def render_result(self, result: ToolResult) -> str:
        return _plain_result(result)

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        src = self.render_call(_example_call(tools))
        return f"Call a tool with a Python call with literal arguments in a python block, exactly like:\n{src}"

    def _parse(self, text: str, tools: list[ToolSchema] | None) -> ParseResult:
        langs = _CODE_LANGS_LENIENT if self.lenient else _CODE_LANGS_STRICT
        blocks = [b for b in _fenced_blocks(text) if b.lang in langs]
        calls: list[ToolCall] = []
        errors: list[str] = []
        spans: list[tuple[int, int]] = []
        if blocks:
            for b in blocks:
                if len(calls) > MAX_CALLS_PER_REPLY:
                    break
                spans.append((b.start, b.end))
                try:
                    if not b.closed and not self.lenient:
                        raise _Malformed("the ```python block is not closed with ```")
                    calls.extend(self._calls_from_source(b.code, tools))
                except _Malformed as exc:
                    errors.append(str(exc))
        elif self.lenient:
            calls, errors, spans = self._unfenced(text, tools)
        elif _CALL_LINE.search(text):
            errors.append("put the tool call in a ```python block")
        thought = "\n".join(s.strip() for s in _outside(text, sorted(spans)) if s.strip())
        if errors:
            return ParseResult(calls=calls, error="; ".join(dict.fromkeys(errors)), thought=thought)
        return ParseResult(calls=calls, thought=thought)

    def _unfenced(
        self, text: str, tools: list[ToolSchema] | None
    ) -> tuple[list[ToolCall], list[str], list[tuple[int, int]]]:
        """Lenient: the whole reply as code when it is only calls, else each line that is a call."""
        try:
            tree = ast.parse(textwrap.dedent(text))
            # the whole reply is Python with a call in it: treat it as code (errors included)
            if any(isinstance(node, ast.Call) for node in ast.walk(tree)):
                try:
                    return self._calls_from_source(text, tools), [], [(0, len(text))]
                except _Malformed as exc:
                    return [], [str(exc)], [(0, len(text))]
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            pass
        calls: list[ToolCall] = []
        errors: list[str] = []
        spans: list[tuple[int, int]] = []
        for m in _CALL_LINE.finditer(text):
            if len(calls) > MAX_CALLS_PER_REPLY:
                break
            spans.append((m.start(), m.end()))
            try:
                calls.extend(self._calls_from_source(m.group().strip(), tools))
            except _Malformed as exc:
                errors.append(str(exc))
        return calls, errors, spans

    def _calls_from_source(self, src: str, tools: list[ToolSchema] | None) -> list[ToolCall]:
        src = textwrap.dedent(src)
        try:
            tree = ast.parse(src)
        except SyntaxError as exc:
            raise _Malformed(f"invalid Python: {exc.msg} (line {exc.lineno})") from None
        except ValueError:
            raise _Malformed("invalid Python: the code contains null bytes") from None
        except (MemoryError, RecursionError):
            raise _Malformed("invalid Python: the code is nested too deeply") from None
        calls: list[ToolCall] = []
        for stmt in tree.body:
            if len(calls) > MAX_CALLS_PER_REPLY:
                break
            note = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
            if isinstance(stmt, ast.Pass) or note:
                continue  # pass / a docstring-like note
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
                raise _Malformed(f"{_describe_stmt(stmt)}; write only tool calls like name(arg=\"value\")")
            raw = ast.get_source_segment(src, stmt) or ""
            calls.append(self._call(stmt.value, raw, tools))
        return calls

    def _call(self, node: ast.Call, raw: str, tools: list[ToolSchema] | None) -> ToolCall:
        name = self._func_name(node.func)
        if name is None:
            found = _describe_node(node.func)
            raise _Malformed(f'only direct calls like name(arg="value") are allowed, found {found} as the function')
        tool = _find_tool(tools, name)
        if tool is None and tools:
            matches = [t for t in tools if _py_name(t.name) == name]
            if len(matches) == 1:
                tool = matches[0]
                name = tool.name
        if "." in name and tool is None:
            raise _Malformed(f"attribute access ('{_short(name, 40)}') is not allowed: call a tool by its name")
        args: dict[str, Any] = {}
        if node.args:
            order = list(_props(tool))
            if tool is None:
                raise _Malformed(
                    f'write arguments with their names, e.g. {_short(name, 30)}(arg="value"): '
                    "positional arguments need a known tool"
                )
            if len(node.args) > len(order):
                raise _Malformed(
                    f"{name} takes at most {len(order)} argument(s) ({', '.join(order)}), got {len(node.args)}"
                )
            for key, arg in zip(order, node.args):
                if isinstance(arg, ast.Starred):
                    raise _Malformed("*args is not allowed: write literal arguments")
                args[key] = self._literal(arg, key)
        for kw in node.keywords:
            if kw.arg is None:  # **{"odd-name": 1}: a literal dict only
                extra = self._literal(kw.value, "**")
                if not isinstance(extra, dict):
                    raise _Malformed("** must be followed by a literal dict")
                items = extra.items()
            else:
                items = [(kw.arg, self._literal(kw.value, kw.arg))]
            for key, value in items:
                if key in args:
                    raise _Malformed(f"argument '{_short(key, 40)}' given twice")
                args[key] = value
        return _make_call(name, args, raw)

    @staticmethod
    def _func_name(func: ast.expr) -> str | None:
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        parts.append(func.id)
        return ".".join(reversed(parts))

    @staticmethod
    def _literal(node: ast.expr, label: str) -> Any:
        for sub in ast.walk(node):
            if not isinstance(sub, _LITERAL_NODES):
                raise _Malformed(
                    f"argument '{_short(label, 40)}' is not a literal (found {_describe_node(sub)}): only literal "
                    "arguments are allowed (strings, numbers, True/False/None, lists, dicts)"
                )
        try:
            value = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise _Malformed(
                f"argument '{_short(label, 40)}' is not a literal: only literal arguments are allowed"
            ) from None
        return _to_json_value(value)


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[Protocol]] = {
    "json": JsonProtocol,
    "xml": XmlProtocol,
    "react": ReactProtocol,
    "code": CodeProtocol,
}
assert tuple(_REGISTRY) == PROTOCOLS


def get_protocol(name: str, lenient: bool = True) -> Protocol:
    """The protocol called `name` (one of PROTOCOLS)."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return _REGISTRY[key](lenient=lenient)


__all__ = [
    "MAX_SCAN_CHARS",
    "PROTOCOLS",
    "CodeProtocol",
    "JsonProtocol",
    "ParseResult",
    "Protocol",
    "ReactProtocol",
    "XmlProtocol",
    "get_protocol",
]
