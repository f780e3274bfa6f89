"""What the formats share: argument values and their types, the tool block and results,
and linear scanners for JSON-ish objects in free text. The names in `__all__` are for any
format, built in or a plugin, to reuse; the rest are details of these."""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any, NamedTuple

from pydantic import ValidationError

from harnessrl.harness.protocols.base import MAX_NESTING, MalformedCall
from harnessrl.types import ToolCall, ToolResult, ToolSchema

__all__ = [
    "Span",
    "arg_schema",
    "convert_text",
    "example_call",
    "find_tool",
    "lenient_call",
    "make_call",
    "object_end",
    "only_argument",
    "plain_result",
    "read_json",
    "result_marker",
    "scan_braces",
    "shorten",
    "text_outside",
    "to_json_value",
    "tool_properties",
    "tools_block",
]

# --------------------------------------------------------------------------------------------
# shared helpers: argument values, tool schemas, type conversion
# --------------------------------------------------------------------------------------------


def shorten(text: str, n: int = 60) -> str:
    """`text` (any value, as str) cut to at most `n` characters, ending in "..." when cut: for
    quoting a reply's text in an error message."""
    text = str(text)
    return text if len(text) <= n else text[: n - 3] + "..."


def _fix_surrogates(s: str) -> str:
    """Lone surrogates (from JSON escapes like \\ud800) cannot be stored as UTF-8: replace them."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def to_json_value(value: Any, depth: int = 0) -> Any:
    """A parsed value as plain JSON data (tuples become lists); anything else is malformed."""
    if depth > MAX_NESTING:
        raise MalformedCall("arguments are nested too deeply")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        return _fix_surrogates(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedCall("numbers must be finite (no NaN or Infinity)")
        return value
    if isinstance(value, (list, tuple)):
        return [to_json_value(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise MalformedCall(f"argument names and object keys must be strings, got {shorten(repr(k))}")
            out[_fix_surrogates(k)] = to_json_value(v, depth + 1)
        return out
    raise MalformedCall(
        f"argument values must be strings, numbers, booleans, null, lists or objects, got {type(value).__name__}"
    )


def make_call(name: Any, arguments: Any, raw: str) -> ToolCall:
    """The ToolCall of a parsed name and arguments object, `raw` its source text; MalformedCall
    for an empty or non-string name, arguments that are not an object, or values that are not
    plain JSON data (see `to_json_value`)."""
    if not isinstance(name, str) or not name.strip():
        raise MalformedCall("the tool name must be a non-empty string")
    if not isinstance(arguments, dict):
        raise MalformedCall(f"the arguments must be an object, got {type(arguments).__name__}")
    try:
        return ToolCall(name=_fix_surrogates(name.strip()), arguments=to_json_value(arguments), raw=raw)
    except ValidationError as exc:  # defensive: to_json_value already guarantees the shape
        raise MalformedCall(f"invalid call: {exc.errors()[0].get('msg', 'invalid')}") from None


# keys of a call object that are never arguments of the flat form {"tool": "add", "a": 1}
_META_KEYS = {"type", "id", "thought", "reasoning"}


def lenient_call(
    value: dict[str, Any], name_key: str, args_key: str | None, raw: str, tools: list[ToolSchema] | None, no_object: str
) -> ToolCall:
    """The call of a JSON object read leniently: the tool name under `name_key`; the arguments
    under `args_key` (null: none; a string: `_string_arguments`) or, when it is None, every other
    key but the meta keys (the flat form). `no_object`: the format's message for string arguments
    that are neither JSON nor the value of a tool's only argument."""
    name = value[name_key]
    if not isinstance(name, str) or not name.strip():
        raise MalformedCall(f'"{name_key}" must be the tool name as a string')
    if args_key is None:
        args: Any = {k: v for k, v in value.items() if k != name_key and k not in _META_KEYS}
    else:
        args = value[args_key]
        if args is None:
            args = {}
        elif isinstance(args, str):
            args = _string_arguments(args, name, tools, no_object)
    if not isinstance(args, dict):
        raise MalformedCall(f'"{args_key}" must be a JSON object of argument names and values')
    return make_call(name, args, raw)


def _string_arguments(args: str, name: str, tools: list[ToolSchema] | None, no_object: str) -> Any:
    """Arguments given as a string: JSON text, or the value of a tool's only argument."""
    if not args.strip():
        return {}
    if args.lstrip().startswith("{"):
        try:
            return read_json(args.strip(), True)
        except MalformedCall as exc:
            raise MalformedCall(f"could not parse the arguments string as JSON: {exc}") from None
    tool = find_tool(tools, name)
    only = only_argument(tool)
    if only is not None:
        return {only: convert_text(args, tool_properties(tool).get(only), True)}
    raise MalformedCall(no_object)


def find_tool(tools: list[ToolSchema] | None, name: str) -> ToolSchema | None:
    """The tool called `name` among `tools` (None, or no such tool: None)."""
    for tool in tools or []:
        if tool.name == name:
            return tool
    return None


def tool_properties(tool: ToolSchema | None) -> dict[str, Any]:
    """A tool's arguments: its JSON schema's `properties` (name -> schema); {} for no tool or
    no properties object."""
    if tool is None:
        return {}
    props = tool.parameters.get("properties") or {}
    return props if isinstance(props, dict) else {}


def _required(tool: ToolSchema | None) -> list[str]:
    req = tool.parameters.get("required") if tool is not None else None
    return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []


def arg_schema(tools: list[ToolSchema] | None, tool_name: str, arg: str) -> dict[str, Any] | None:
    """The JSON schema of argument `arg` of the tool `tool_name`, or None when the tool or the
    argument is unknown (then a value given as text stays a string, see `convert_text`)."""
    schema = tool_properties(find_tool(tools, tool_name)).get(arg)
    return schema if isinstance(schema, dict) else None


def only_argument(tool: ToolSchema | None) -> str | None:
    """The argument a bare value belongs to: the only required one, else the only one."""
    req = _required(tool)
    props = tool_properties(tool)
    if len(req) == 1:
        return req[0]
    if not req and len(props) == 1:
        return next(iter(props))
    return None


def convert_text(text: str, schema: dict[str, Any] | None, lenient: bool = True) -> Any:
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
            v = read_json(s, lenient)
        except MalformedCall:
            return False, None
        if isinstance(v, list if type_name == "array" else dict):
            try:
                return True, to_json_value(v)
            except MalformedCall:
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
    args = [f"{arg}{'' if arg in req else '?'}: {_type_label(s, python)}" for arg, s in tool_properties(tool).items()]
    return f"{name or tool.name}({', '.join(args)})"


def tools_block(tools: list[ToolSchema], python: bool = False, name_of=None) -> str:
    """Every tool: signature (arg? = optional), description, and argument descriptions if any."""
    if not tools:
        return "Tools: (none)"
    lines = ["Tools (arg? = optional):"]
    for tool in tools:
        sig = _signature(tool, python, name_of(tool.name) if name_of else None)
        desc = " ".join(tool.description.split())
        lines.append(f"- {sig}: {desc}" if desc else f"- {sig}")
        for arg, s in tool_properties(tool).items():
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
    examples: dict[Any, Any] = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}
    return examples.get(t, "text")


def example_call(tools: list[ToolSchema]) -> ToolCall:
    """The example used in the tool block and the format reminder: the first tool with
    placeholder values for its required arguments (a made-up tool name would teach a tiny model
    to call a tool that does not exist)."""
    if not tools:
        return ToolCall(name="tool_name", arguments={"argument": "value"})
    tool = tools[0]
    props = tool_properties(tool)
    names = [r for r in _required(tool) if r in props] or list(props)[:1]
    return ToolCall(name=tool.name, arguments={n: _placeholder(props[n]) for n in names})


def result_marker(result: ToolResult) -> str:
    """The prefix of a result's text: "[blocked] " for a refused call, "[error] " for a failed
    one, "" otherwise."""
    if result.blocked is not None:
        return "[blocked] "
    if not result.ok:
        return "[error] "
    return ""


def plain_result(result: ToolResult) -> str:
    """A result as "Result of NAME: [marker]OUTPUT" (the output on its own lines when it has
    several; "(no output)" when it is empty)."""
    out = result.output if result.output.strip() else "(no output)"
    sep = "\n" if "\n" in out else " "
    return f"Result of {result.name}:{sep}{result_marker(result)}{out}"


# --------------------------------------------------------------------------------------------
# shared helpers: JSON-ish objects in free text
# --------------------------------------------------------------------------------------------

# the rest of a quoted string after its opening quote (unrolled loop: linear, no backtracking)
_STRING_REST = {
    '"': re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S),
    "'": re.compile(r"[^'\\]*(?:\\.[^'\\]*)*'", re.S),
}
_BRACE_SPECIALS = {'"': re.compile(r'[{}"]'), "\"'": re.compile(r"""[{}"']""")}


class Span(NamedTuple):
    """A balanced {...} span found by `scan_braces`."""

    start: int
    end: int  # exclusive
    depth: int  # nesting depth of braces inside


def scan_braces(text: str, quotes: str = "\"'") -> tuple[list[Span], int | None]:
    """Balanced {...} spans of `text` that are not inside another one, and where the first
    unclosed '{' starts (None when all closed). Quotes only count inside braces (apostrophes in
    prose are not strings). Linear time; an unterminated string ends the scan."""
    special = _BRACE_SPECIALS[quotes]
    spans: list[Span] = []
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
                spans.append(Span(start, i + 1, depth))
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
    outer: list[Span] = []
    for s in spans:
        if not outer or s.start >= outer[-1].end:
            outer.append(s)
    return outer, (stack[0][0] if stack else None)


def object_end(text: str, start: int, quotes: str = "\"'") -> tuple[int, int] | None:
    """The end (exclusive) and brace depth of the object whose '{' is at `start`, or None when
    it is not closed. Braces inside strings do not count. Linear in the object's length."""
    special = _BRACE_SPECIALS[quotes]
    depth = deepest = 0
    pos = start
    while True:
        m = special.search(text, pos)
        if m is None:
            return None
        c, i = m.group(), m.start()
        if c == "{":
            depth += 1
            deepest = max(deepest, depth)
            pos = i + 1
        elif c == "}":
            depth -= 1
            pos = i + 1
            if depth == 0:
                return i + 1, deepest
        else:
            end = _STRING_REST[c].match(text, i + 1)
            if end is None:
                return None  # an unterminated string: the object never closes
            pos = end.end()


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
    return shorten(str(exc), 120) or type(exc).__name__


def read_json(s: str, lenient: bool) -> Any:
    """Decode a JSON value; lenient also takes trailing commas, raw newlines in strings and
    single-quoted Python-ish literals (ast.literal_eval, never eval)."""
    try:
        return json.loads(s, strict=not lenient)
    except (ValueError, RecursionError) as exc:
        first = exc
    if not lenient:
        raise MalformedCall(_json_error(first))
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
        raise MalformedCall(_json_error(first)) from None


def text_outside(text: str, spans: list[tuple[int, int]]) -> list[str]:
    """The text segments around sorted, non-overlapping spans (len(spans) + 1 of them)."""
    segs, pos = [], 0
    for s, e in spans:
        segs.append(text[pos:s])
        pos = e
    segs.append(text[pos:])
    return segs
