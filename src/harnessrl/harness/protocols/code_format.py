"""The code format: Python call statements with literal arguments in a ```python block.

    ```python
    add(a=17, b=25)
    ```

Parsed with `ast` and `ast.literal_eval` per argument: nothing is ever executed. Tool names that
are not Python identifiers are called with `_` in their place (web-search -> web_search(...)).
"""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from collections.abc import Iterable
from typing import Any, NamedTuple

from harnessrl.harness.protocols.base import MAX_CALLS_PER_REPLY, MalformedCall, ParseResult, Protocol
from harnessrl.harness.protocols.shared import (
    example_call,
    find_tool,
    make_call,
    plain_result,
    shorten,
    text_outside,
    to_json_value,
    tool_properties,
    tools_block,
)
from harnessrl.types import ToolCall, ToolResult, ToolSchema


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
        return f"the name '{shorten(node.id, 30)}'"
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
    shape = 'a call like name(arg="value") in a ```python block'

    def render_tools(self, tools: list[ToolSchema]) -> str:
        return "\n".join(
            [
                "To call a tool, write a Python call in a ```python block. Use literal values only",
                "(strings, numbers, True/False/None, lists, dicts): no variables or other code. Example:",
                self.render_call(example_call(tools)),
                tools_block(tools, python=True, name_of=_py_name),
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
        return plain_result(result)

    def format_reminder(self, tools: list[ToolSchema]) -> str:
        src = self.render_call(example_call(tools))
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
                        raise MalformedCall("the ```python block is not closed with ```")
                    calls.extend(self._calls_from_source(b.code, tools))
                except MalformedCall as exc:
                    errors.append(str(exc))
        elif self.lenient:
            calls, errors, spans = self._unfenced(text, tools)
        elif _CALL_LINE.search(text):
            errors.append("put the tool call in a ```python block")
        thought = "\n".join(s.strip() for s in text_outside(text, sorted(spans)) if s.strip())
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
                except MalformedCall as exc:
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
            except MalformedCall as exc:
                errors.append(str(exc))
        return calls, errors, spans

    def _calls_from_source(self, src: str, tools: list[ToolSchema] | None) -> list[ToolCall]:
        src = textwrap.dedent(src)
        try:
            tree = ast.parse(src)
        except SyntaxError as exc:
            raise MalformedCall(f"invalid Python: {exc.msg} (line {exc.lineno})") from None
        except ValueError:
            raise MalformedCall("invalid Python: the code contains null bytes") from None
        except (MemoryError, RecursionError):
            raise MalformedCall("invalid Python: the code is nested too deeply") from None
        calls: list[ToolCall] = []
        for stmt in tree.body:
            if len(calls) > MAX_CALLS_PER_REPLY:
                break
            note = (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            )
            if isinstance(stmt, ast.Pass) or note:
                continue  # pass / a docstring-like note
            if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
                raise MalformedCall(f'{_describe_stmt(stmt)}; write only tool calls like name(arg="value")')
            raw = ast.get_source_segment(src, stmt) or ""
            calls.append(self._call(stmt.value, raw, tools))
        return calls

    def _call(self, node: ast.Call, raw: str, tools: list[ToolSchema] | None) -> ToolCall:
        name = self._func_name(node.func)
        if name is None:
            found = _describe_node(node.func)
            raise MalformedCall(f'only direct calls like name(arg="value") are allowed, found {found} as the function')
        tool = find_tool(tools, name)
        if tool is None and tools:
            matches = [t for t in tools if _py_name(t.name) == name]
            if len(matches) == 1:
                tool = matches[0]
                name = tool.name
        if "." in name and tool is None:
            raise MalformedCall(f"attribute access ('{shorten(name, 40)}') is not allowed: call a tool by its name")
        args: dict[str, Any] = {}
        if node.args:
            order = list(tool_properties(tool))
            if tool is None:
                raise MalformedCall(
                    f'write arguments with their names, e.g. {shorten(name, 30)}(arg="value"): '
                    "positional arguments need a known tool"
                )
            if len(node.args) > len(order):
                raise MalformedCall(
                    f"{name} takes at most {len(order)} argument(s) ({', '.join(order)}), got {len(node.args)}"
                )
            for key, arg in zip(order, node.args):
                if isinstance(arg, ast.Starred):
                    raise MalformedCall("*args is not allowed: write literal arguments")
                args[key] = self._literal(arg, key)
        for kw in node.keywords:
            items: Iterable[tuple[Any, Any]]
            if kw.arg is None:  # **{"odd-name": 1}: a literal dict only
                extra = self._literal(kw.value, "**")
                if not isinstance(extra, dict):
                    raise MalformedCall("** must be followed by a literal dict")
                items = extra.items()
            else:
                items = [(kw.arg, self._literal(kw.value, kw.arg))]
            for key, value in items:
                if key in args:
                    raise MalformedCall(f"argument '{shorten(key, 40)}' given twice")
                args[key] = value
        return make_call(name, args, raw)

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
                raise MalformedCall(
                    f"argument '{shorten(label, 40)}' is not a literal (found {_describe_node(sub)}): only literal "
                    "arguments are allowed (strings, numbers, True/False/None, lists, dicts)"
                )
        try:
            value = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise MalformedCall(
                f"argument '{shorten(label, 40)}' is not a literal: only literal arguments are allowed"
            ) from None
        return to_json_value(value)
