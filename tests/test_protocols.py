"""Tool-call protocols: round trips, lenient vs strict, malformed and adversarial replies."""

from __future__ import annotations

import json
import random
import time

import pytest

from harnessrl.harness.protocols import (
    MAX_CALLS_PER_REPLY,
    PROTOCOLS,
    ParseResult,
    Protocol,
    get_protocol,
)
from harnessrl.types import BlockReason, ToolCall, ToolResult, ToolSchema

ADD = ToolSchema(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer", "description": "first number"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
SUBMIT = ToolSchema(
    name="submit",
    description="Submit the final answer.",
    parameters={"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
SEARCH = ToolSchema(
    name="search",
    description="Search the notes.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "filters": {"type": "object"},
            "mode": {"enum": ["fast", "slow"]},
        },
        "required": ["query"],
    },
)
TOOLS = [ADD, SUBMIT, SEARCH]

ALL = [(name, lenient) for name in PROTOCOLS for lenient in (True, False)]
ALL_IDS = [f"{n}-{'lenient' if lenient else 'strict'}" for n, lenient in ALL]


def canon(args: dict) -> str:
    """Type-exact comparison (1 != 1.0 != True)."""
    return json.dumps(args, sort_keys=True)


def same_calls(got: list[ToolCall], want: list[ToolCall]) -> bool:
    return [(c.name, canon(c.arguments)) for c in got] == [(c.name, canon(c.arguments)) for c in want]


def schema_for(value) -> dict:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if value is None:
        return {"type": "null"}
    if isinstance(value, list):
        return {"type": "array"}
    return {"type": "object"}


def tool_for(call: ToolCall) -> ToolSchema:
    props = {k: schema_for(v) for k, v in call.arguments.items()}
    return ToolSchema(
        name=call.name,
        description="test tool",
        parameters={"type": "object", "properties": props, "required": list(props)},
    )


def check_round_trip(proto: Protocol, call: ToolCall, thought: str = "") -> None:
    text = proto.render_call(call, thought=thought)
    res = proto.parse(text, [tool_for(call)] + TOOLS)
    assert res.error is None, (text, res)
    assert same_calls(res.calls, [call]), (text, res.calls, call)
    assert res.calls[0].raw and res.calls[0].raw in text
    if thought:
        assert res.thought == thought.strip()


# ----------------------------------------------------------------------------- round trips

FIXED_CALLS = [
    ToolCall(name="add", arguments={"a": 17, "b": 25}),
    ToolCall(name="add", arguments={"a": -3, "b": 10**15}),
    ToolCall(name="submit", arguments={"answer": "42"}),
    ToolCall(name="submit", arguments={"answer": "say \"hi\" 'there' {braces} [x] <tag> & &amp; `tick`"}),
    ToolCall(name="submit", arguments={"answer": "line 1\nline 2\n\n  indented\ttab\n"}),
    ToolCall(name="submit", arguments={"answer": "\nstarts with newline"}),
    ToolCall(name="submit", arguments={"answer": "unicode: é ñ 中文 🙂 \u200b"}),
    ToolCall(name="submit", arguments={"answer": ""}),
    ToolCall(name="submit", arguments={"answer": "```\ncode fence ``` inside\n```"}),
    ToolCall(name="submit", arguments={"answer": "Observation: fake\nAction: nope\n</tool> <tool_result>"}),
    ToolCall(name="submit", arguments={"answer": "back\\slash \\n not a newline \x00 null"}),
    ToolCall(name="search", arguments={"query": "cats", "limit": 3, "exact": False, "score": 0.25}),
    ToolCall(
        name="search", arguments={"query": "x", "tags": ["a", "b c", ""], "filters": {"k": [1, {"n": None}], "t": True}}
    ),
    ToolCall(name="search", arguments={"query": "true", "score": 2.0}),
    ToolCall(name="noargs", arguments={}),
    ToolCall(name="weird_keys", arguments={"my-arg": 1, "class": "c", "with space": 2.5, "arg": "x", "tool": "t"}),
]


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
def test_round_trip_fixed_calls(name, lenient):
    proto = get_protocol(name, lenient=lenient)
    for call in FIXED_CALLS:
        check_round_trip(proto, call)
        check_round_trip(proto, call, thought="I should call a tool now.")


def random_string(rng: random.Random) -> str:
    alphabet = list("abcxyz ABC0129_-.,:;!?") + [
        '"',
        "'",
        "\\",
        "\n",
        "\t",
        "{",
        "}",
        "[",
        "]",
        "<",
        ">",
        "&",
        "`",
        "=",
        "(",
        ")",
        "#",
        "é",
        "中",
        "🙂",
        "\x00",
    ]
    chunks = ["&lt;", "</a>", "```", "Observation:", "<tool ", "null", "true", "'''", '\\"', "&amp;"]
    out = []
    for _ in range(rng.randint(0, 12)):
        out.append(rng.choice(chunks) if rng.random() < 0.15 else rng.choice(alphabet))
    return "".join(out)


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.choice(
        ["str", "str", "int", "float", "bool", "none", "list", "dict"]
        if depth < 3
        else ["str", "int", "float", "bool", "none"]
    )
    if kind == "str":
        return random_string(rng)
    if kind == "int":
        return rng.choice([0, 1, -1, rng.randint(-(10**12), 10**12)])
    if kind == "float":
        return rng.choice([0.5, -2.25, 1e-5, 3.0, round(rng.uniform(-1000, 1000), rng.randint(0, 8))])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def random_key(rng: random.Random) -> str:
    if rng.random() < 0.8:
        return rng.choice(["a", "b", "path", "content", "x1", "_private", "Query", "n_items", "value"])
    return rng.choice(["my-arg", "class", "with space", "1st", "é", "arg", "tool", "x.y", ""])


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
def test_round_trip_random_arguments(name, lenient):
    rng = random.Random(1234 + PROTOCOLS.index(name))
    proto = get_protocol(name, lenient=lenient)
    for i in range(250):
        args = {random_key(rng): random_value(rng) for _ in range(rng.randint(0, 4))}
        tool_name = rng.choice(["add", "write_file", "search", "t", "Tool2"])
        call = ToolCall(name=tool_name, arguments=args)
        check_round_trip(proto, call, thought="thinking..." if i % 3 == 0 else "")


def test_code_round_trip_of_non_identifier_tool_name_needs_tools():
    proto = get_protocol("code")
    call = ToolCall(name="web-search", arguments={"q": "x"})
    text = proto.render_call(call)
    assert "web_search(" in text
    res = proto.parse(text, [tool_for(call)])
    assert same_calls(res.calls, [call])


# ----------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("name", PROTOCOLS)
def test_render_tools_mentions_every_tool_and_argument(name):
    block = get_protocol(name).render_tools(TOOLS)
    for tool in TOOLS:
        assert tool.name in block
        assert tool.description in block
        for arg in tool.parameters["properties"]:
            assert arg in block
    assert "first number" in block  # argument descriptions are shown
    if name == "hermes":  # JSON signatures: the schema's own "required" list marks the others optional
        assert '"required": ["query"]' in block
    else:
        assert "limit?" in block and "query?" not in block  # optional arguments are marked
    assert len(block) < 1500  # the model is tiny: keep it short


@pytest.mark.parametrize("name", PROTOCOLS)
def test_render_tools_without_tools(name):
    assert get_protocol(name).render_tools([])


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
def test_format_reminder_is_short_and_parses(name, lenient):
    proto = get_protocol(name, lenient=lenient)
    reminder = proto.format_reminder(TOOLS)
    assert 2 <= len(reminder.splitlines()) <= 4
    assert "add" in reminder
    example = reminder.split("\n", 1)[1]  # the lines after the instruction are a valid call
    res = proto.parse(example, TOOLS)
    assert res.error is None and [c.name for c in res.calls] == ["add"]
    assert res.calls[0].arguments == {"a": 1, "b": 1}


@pytest.mark.parametrize("name", PROTOCOLS)
def test_render_result_markers(name):
    proto = get_protocol(name)
    ok = proto.render_result(ToolResult(name="add", output="42"))
    err = proto.render_result(ToolResult(name="add", output="division by zero", ok=False))
    blocked = proto.render_result(
        ToolResult(name="nope", output="unknown tool", ok=False, blocked=BlockReason.unknown_tool)
    )
    assert "42" in ok and "[error]" not in ok and "[blocked]" not in ok
    assert "[error]" in err and "division by zero" in err
    assert "[blocked]" in blocked and "unknown tool" in blocked
    assert proto.render_result(ToolResult(name="add", output=""))


def test_render_result_shapes():
    assert get_protocol("react").render_result(ToolResult(name="add", output="42")) == "Observation: 42"
    assert (
        get_protocol("xml").render_result(ToolResult(name="add", output="42"))
        == '<tool_result name="add">42</tool_result>'
    )
    assert (
        get_protocol("hermes").render_result(ToolResult(name="add", output="42"))
        == "<tool_response>\n42\n</tool_response>"
    )


def test_stop_strings():
    assert get_protocol("react").stop_strings() == ["Observation:"]
    for name in ("json", "xml", "code", "hermes"):
        assert get_protocol(name).stop_strings() == []


def test_get_protocol():
    assert PROTOCOLS == ("json", "xml", "react", "code", "hermes")
    for name in PROTOCOLS:
        p = get_protocol(name, lenient=False)
        assert p.name == name and p.lenient is False
    assert get_protocol("JSON").name == "json"
    assert get_protocol(" Hermes ").name == "hermes"
    with pytest.raises(ValueError, match="json, xml, react, code, hermes"):
        get_protocol("yaml")


# ----------------------------------------------------------------------------- no call / empty

PROSE = "The answer is 42. I think {x} is a set, and add(17, 25) would be nice; tools are fun."


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
def test_prose_only_is_no_call_and_no_error(name, lenient):
    res = get_protocol(name, lenient=lenient).parse("I don't know. The answer is 42, I'm sure.", TOOLS)
    assert res == ParseResult(calls=[], error=None, empty=False, thought="I don't know. The answer is 42, I'm sure.")


@pytest.mark.parametrize("name", ["json", "xml", "react", "hermes"])
def test_prose_with_braces_and_parens_is_no_call(name):
    res = get_protocol(name).parse(PROSE, TOOLS)
    assert res.calls == [] and res.error is None and res.thought == PROSE


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
@pytest.mark.parametrize("text", ["", "   ", "\n\n\t  \n"])
def test_whitespace_is_empty(name, lenient, text):
    res = get_protocol(name, lenient=lenient).parse(text, TOOLS)
    assert res.empty and res.calls == [] and res.error is None


# ----------------------------------------------------------------------------- malformed

HALF_FINISHED = {
    "json": [
        '{"tool": "add", "arguments": {"a": 17, "b": ',
        '{"tool": "add", "arguments": {"a": 17 "b": 25}}',
        'Sure: {"tool": "submit", "arguments": {"answer": "4',
    ],
    "xml": ['<tool name="add"><a>17</a><b>2', '<tool name="add"', "<tool><a>1</a></tool>"],
    "react": [
        'Thought: add them\nAction: add\nAction Input: {"a": 17, ',
        'Action Input: {"a": 1}',
        "Action: add the numbers\nAction Input: {}",
    ],
    "code": ["```python\nadd(a=17, b=\n```", "```python\nadd(a=17, b=25\n```", "```python\nx = 5\n```"],
    "hermes": [
        '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": ',
        '<tool_call>\n{"name": "add", "arguments": {"a": 17 "b": 25}}\n</tool_call>',
        'Sure:\n<tool_call>\n{"name": "submit", "arguments": {"answer": "4',
        "<tool_call>\n</tool_call>",
        "<tool_call>",
        '<tool_call>\n{"arguments": {"a": 1, "b": 2}}\n</tool_call>',
        "<tool_call>\nadd(a=1, b=2)\n</tool_call>",
    ],
}


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
def test_half_finished_call_is_an_error(name, lenient):
    proto = get_protocol(name, lenient=lenient)
    for text in HALF_FINISHED[name]:
        res = proto.parse(text, TOOLS)
        assert res.error, (text, res)
        assert not res.empty


def test_error_messages_are_specific():
    res = get_protocol("react").parse('Action: add\nAction Input: {"a": 17 "b": 25}', TOOLS)
    assert res.error == "could not parse JSON after 'Action Input:': Expecting ',' delimiter at char 9"
    res = get_protocol("json", lenient=False).parse('{"tool": "add", "arguments": {"a": 17 "b": 25}}')
    assert "Expecting ',' delimiter" in res.error
    res = get_protocol("xml").parse("<tool><a>1</a></tool>")
    assert "name" in res.error
    res = get_protocol("code").parse("```python\nadd(a=x)\n```", TOOLS)
    assert "literal" in res.error and "'x'" in res.error


# ----------------------------------------------------------------------------- json specifics


def test_json_lenient_accepts_near_misses():
    p = get_protocol("json")
    cases = {
        '{"name": "add", "args": {"a": 1, "b": 2}}': {"a": 1, "b": 2},
        '{"function": "add", "parameters": {"a": 1, "b": 2}}': {"a": 1, "b": 2},
        '{"tool_name": "add", "input": {"a": 1, "b": 2}}': {"a": 1, "b": 2},
        '{"tool": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}': {"a": 1, "b": 2},
        '{"tool": "add", "arguments": {"a": 1, "b": 2,},}': {"a": 1, "b": 2},
        "{'tool': 'add', 'arguments': {'a': 1, 'b': 2}}": {"a": 1, "b": 2},
        "{'tool': 'add', 'arguments': {'a': 1, 'b': 2, 'c': true, 'd': null}}": {"a": 1, "b": 2, "c": True, "d": None},
        '{"tool": "add", "arguments": {"a": 1, "b": 2}, "thought": "easy", "confidence": 0.9}': {"a": 1, "b": 2},
        'I will add them.\n```json\n{"tool": "add", "arguments": {"a": 1, "b": 2}}\n```\nThen I submit.': {
            "a": 1,
            "b": 2,
        },
        '{"type": "function", "function": {"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}}': {"a": 1, "b": 2},
        '{"tool": "add", "a": 1, "b": 2}': {"a": 1, "b": 2},
        '{"tool": "add", "arguments": null}': {},
        '{"tool": "add"}': {},
    }
    for text, args in cases.items():
        res = p.parse(text, TOOLS)
        assert res.error is None, (text, res)
        assert [c.name for c in res.calls] == ["add"], (text, res)
        assert canon(res.calls[0].arguments) == canon(args), text


def test_json_strict_rejects_near_misses():
    p = get_protocol("json", lenient=False)
    for text in [
        '{"name": "add", "arguments": {"a": 1, "b": 2}}',
        '{"tool": "add", "arguments": "{\\"a\\": 1}"}',
        '{"tool": "add", "arguments": {"a": 1, "b": 2,}}',
        "{'tool': 'add', 'arguments': {'a': 1}}",
        '{"tool": "add", "arguments": {"a": 1}, "thought": "x"}',
        '{"tool": "add"}',
        '{"tool": "add", "arguments": {"a": 1}}\nNow I wait for the result.',
    ]:
        res = p.parse(text, TOOLS)
        assert res.error, (text, res)
    # prose before the call (reasoning) and a fence are part of the documented format
    res = p.parse('Let me add.\n```json\n{"tool": "add", "arguments": {"a": 1, "b": 2}}\n```', TOOLS)
    assert res.error is None and res.calls[0].arguments == {"a": 1, "b": 2} and res.thought == "Let me add."


def test_json_data_objects_are_not_calls():
    p = get_protocol("json")
    res = p.parse('The record is {"name": "Bob", "age": 3} and {"x": [1, 2]}.', TOOLS)
    assert res.calls == [] and res.error is None
    # but {"name": ...} naming a known tool is a call
    res = p.parse('{"name": "submit", "answer": "7"}', TOOLS)
    assert [c.name for c in res.calls] == ["submit"] and res.calls[0].arguments == {"answer": "7"}


@pytest.mark.parametrize("lenient", [True, False])
def test_json_multiple_calls(lenient):
    p = get_protocol("json", lenient=lenient)
    want = [ToolCall(name="add", arguments={"a": 1, "b": 2}), ToolCall(name="submit", arguments={"answer": "3"})]
    for text in [
        '{"tool": "add", "arguments": {"a": 1, "b": 2}}\n{"tool": "submit", "arguments": {"answer": "3"}}',
        '[{"tool": "add", "arguments": {"a": 1, "b": 2}}, {"tool": "submit", "arguments": {"answer": "3"}}]',
        '```json\n[\n  {"tool": "add", "arguments": {"a": 1, "b": 2}},\n'
        '  {"tool": "submit", "arguments": {"answer": "3"}}\n]\n```',
    ]:
        res = p.parse(text, TOOLS)
        assert res.error is None, (text, res)
        assert same_calls(res.calls, want)
        assert res.thought == ""
    if lenient:
        res = p.parse(
            '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
            '{"name": "submit", "arguments": {"answer": "3"}}]}',
            TOOLS,
        )
        assert same_calls(res.calls, want)


def test_json_lenient_keeps_calls_next_to_a_cut_off_fragment():
    text = '{"tool": "add", "arguments": {"a": 1, "b": 2}}\n{"tool": "submit", "argu'
    res = get_protocol("json").parse(text, TOOLS)
    assert [c.name for c in res.calls] == ["add"] and res.error is None
    res = get_protocol("json", lenient=False).parse(text, TOOLS)
    assert res.error


def test_json_stray_unclosed_brace_before_a_call():
    res = get_protocol("json").parse('Hmm { not json. {"tool": "add", "arguments": {"a": 1, "b": 2}}', TOOLS)
    assert [c.arguments for c in res.calls] == [{"a": 1, "b": 2}] and res.error is None


def test_json_arguments_string_for_single_argument_tool():
    res = get_protocol("json").parse('{"tool": "submit", "arguments": "42"}', TOOLS)
    assert res.calls[0].arguments == {"answer": "42"}
    res = get_protocol("json").parse('{"tool": "add", "arguments": "42"}', TOOLS)
    assert res.error


# ----------------------------------------------------------------------------- xml specifics


def test_xml_type_conversion_with_schema():
    p = get_protocol("xml")
    text = (
        '<tool name="search"><query> 42 </query><limit>7</limit><exact>true</exact><score>0.5</score>'
        '<tags>["a", "b"]</tags><filters>{"k": 1}</filters><mode>fast</mode><extra>9</extra></tool>'
    )
    res = p.parse(text, TOOLS)
    assert res.error is None
    assert canon(res.calls[0].arguments) == canon(
        {
            "query": " 42 ",
            "limit": 7,
            "exact": True,
            "score": 0.5,
            "tags": ["a", "b"],
            "filters": {"k": 1},
            "mode": "fast",
            "extra": "9",
        }
    )
    # without a schema every value stays text
    res = p.parse(text)
    assert all(isinstance(v, str) for v in res.calls[0].arguments.values())
    # a value that does not convert stays a string (the runner's argument check reports it)
    res = p.parse('<tool name="add"><a>seventeen</a><b>25</b></tool>', TOOLS)
    assert res.calls[0].arguments == {"a": "seventeen", "b": 25}
    # union types and lenient conversions
    tool = ToolSchema(
        name="t",
        description="",
        parameters={"properties": {"n": {"type": ["integer", "null"]}, "f": {"type": "boolean"}}},
    )
    assert p.parse('<tool name="t"><n>null</n><f>Yes</f></tool>', [tool]).calls[0].arguments == {"n": None, "f": True}
    assert p.parse('<tool name="t"><n>3.0</n></tool>', [tool]).calls[0].arguments == {"n": 3}
    strict = get_protocol("xml", lenient=False)
    assert strict.parse('<tool name="t"><n>3.0</n><f>Yes</f></tool>', [tool]).calls[0].arguments == {
        "n": "3.0",
        "f": "Yes",
    }


def test_xml_entities_only_the_five_are_unescaped():
    res = get_protocol("xml").parse(
        '<tool name="submit"><answer>&lt;b&gt; &amp;amp; &quot;&apos; &#65; &nbsp;</answer></tool>', TOOLS
    )
    assert res.calls[0].arguments == {"answer": "<b> &amp; \"' &#65; &nbsp;"}


def test_xml_lenient_variants():
    p = get_protocol("xml")
    for text in [
        "<tool name='add'><a>1</a><b>2</b></tool>",
        "<tool name=add><a>1</a><b>2</b></tool>",
        '<tool  name = "add" >\n  <a> 1 </a>\n  <b>2</b >\n</tool >',
        '<TOOL name="add"><a>1</a><b>2</b></TOOL>',
        'Adding.\n<tool name="add"><a>1</a><b>2</b>',  # missing </tool> at the end
        '<tool name="add">{"a": 1, "b": 2}</tool>',
        '<tool name="add"><a>1</a> and <b>2</b></tool>',
    ]:
        res = p.parse(text, TOOLS)
        assert res.error is None, (text, res)
        assert [c.name for c in res.calls] == ["add"] and canon(res.calls[0].arguments) == canon({"a": 1, "b": 2}), text


def test_xml_strict_rejects_variants():
    p = get_protocol("xml", lenient=False)
    for text in [
        "<tool name='add'><a>1</a><b>2</b></tool>",
        "<tool name=add><a>1</a><b>2</b></tool>",
        '<tool name="add"><a>1</a><b>2</b>',
        '<tool name="add">{"a": 1, "b": 2}</tool>',
        '<tool name="add"><a>1</a> and <b>2</b></tool>',
    ]:
        res = p.parse(text, TOOLS)
        assert res.error, (text, res)


@pytest.mark.parametrize("lenient", [True, False])
def test_xml_multiple_calls_and_self_closing(lenient):
    p = get_protocol("xml", lenient=lenient)
    text = 'First add:\n<tool name="add"><a>1</a><b>2</b></tool>\nthen\n<tool name="finish"/>'
    res = p.parse(text, TOOLS)
    assert res.error is None
    assert same_calls(res.calls, [ToolCall(name="add", arguments={"a": 1, "b": 2}), ToolCall(name="finish")])
    assert res.thought == "First add:\nthen"


def test_xml_ignores_a_hallucinated_result():
    text = (
        '<tool name="add"><a>1</a><b>2</b></tool>\n<tool_result name="add">3</tool_result>\n'
        '<tool name="submit"><answer>3</answer></tool>'
    )
    res = get_protocol("xml").parse(text, TOOLS)
    assert [c.name for c in res.calls] == ["add"]


# ----------------------------------------------------------------------------- react specifics


@pytest.mark.parametrize("lenient", [True, False])
def test_react_ignores_text_after_observation(lenient):
    text = (
        'Thought: add\nAction: add\nAction Input: {"a": 1, "b": 2}\nObservation: 3\n'
        'Thought: done\nAction: submit\nAction Input: {"answer": "3"}'
    )
    res = get_protocol("react", lenient=lenient).parse(text, TOOLS)
    assert same_calls(res.calls, [ToolCall(name="add", arguments={"a": 1, "b": 2})])
    assert res.thought == "add" and res.error is None


def test_react_lenient_variants():
    p = get_protocol("react")
    want = {"a": 1, "b": 2}
    for text in [
        'thought: hmm\naction: add\naction input: {"a": 1, "b": 2}',
        'Action:   `add`  \nAction Input:   {"a": 1, "b": 2}  ',
        'Action: "add"\nAction Input: {"a": 1, "b": 2}',
        'Action: add()\nAction Input: {"a": 1, "b": 2}',
        '**Action:** add\n**Action Input:** {"a": 1, "b": 2}',
        "Action: add\nAction Input: {'a': 1, 'b': 2,}",
        "Action: add\nAction Input: a=1, b=2",
        "Action: add\nAction Input: a = 1\nb = 2",
        'Action: add\nAction Input: "a": 1, "b": 2',
        'Action: add\nAction Input: ```json\n{"a": 1, "b": 2}\n```',
        'Action: add\nAction Input: {\n  "a": 1,\n  "b": 2\n}\nI will wait.',
    ]:
        res = p.parse(text, TOOLS)
        assert res.error is None, (text, res)
        assert [c.name for c in res.calls] == ["add"] and canon(res.calls[0].arguments) == canon(want), (text, res)


def test_react_lenient_bare_scalar_for_single_required_argument():
    p = get_protocol("react")
    assert p.parse("Action: submit\nAction Input: 42", TOOLS).calls[0].arguments == {"answer": "42"}
    assert p.parse('Action: submit\nAction Input: "it is 42"', TOOLS).calls[0].arguments == {"answer": "it is 42"}
    assert p.parse("Action: search\nAction Input: cute cats", TOOLS).calls[0].arguments == {"query": "cute cats"}
    one_int = ToolSchema(
        name="square", description="", parameters={"properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    assert p.parse("Action: square\nAction Input: 7", [one_int]).calls[0].arguments == {"n": 7}
    assert p.parse("Action: add\nAction Input: 17 25", TOOLS).error  # two required arguments: ambiguous
    assert p.parse("Action: submit\nAction Input: 42").error  # unknown schema: ambiguous


def test_react_strict_rejects_variants():
    p = get_protocol("react", lenient=False)
    for text in [
        'action: add\naction input: {"a": 1, "b": 2}',
        'Action: `add`\nAction Input: {"a": 1, "b": 2}',
        "Action: add\nAction Input: a=1, b=2",
        "Action: submit\nAction Input: 42",
        "Action: add",
        'Action: add\nAction Input: {"a": 1, "b": 2} extra',
    ]:
        res = p.parse(text, TOOLS)
        assert res.error, (text, res)


def test_react_missing_input_lenient_means_no_arguments():
    res = get_protocol("react").parse("Thought: list\nAction: list_files", TOOLS)
    assert same_calls(res.calls, [ToolCall(name="list_files")]) and res.error is None


def test_react_multiple_actions_and_final_answer_prose():
    p = get_protocol("react")
    text = 'Action: add\nAction Input: {"a": 1, "b": 2}\nAction: submit\nAction Input: {"answer": "3"}'
    res = p.parse(text, TOOLS)
    assert [c.name for c in res.calls] == ["add", "submit"]
    assert res.calls[0].raw == 'Action: add\nAction Input: {"a": 1, "b": 2}'
    res = p.parse("Thought: I know it.\nFinal Answer: 3", TOOLS)
    assert res.calls == [] and res.error is None


# ----------------------------------------------------------------------------- hermes specifics

HERMES_ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
HERMES_NEAR_MISSES = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}',  # no </tool_call> at the end
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\nI will wait for the sum.',
    '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>',
    '<tool_call>\n{"name": "add", "parameters": {"a": 1, "b": 2}}\n</tool_call>',
    '<tool_call>\n{"tool": "add", "args": {"a": 1, "b": 2}}\n</tool_call>',
    "<tool_call>\n{'name': 'add', 'arguments': {'a': 1, 'b': 2}}\n</tool_call>",
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2,},}\n</tool_call>',
    '<TOOL_CALL >{"name": "add", "arguments": {"a": 1, "b": 2}}</ tool_call>',
    '<tool_call>\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```\n</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}}\n</tool_call>',  # a stray brace
    '<tool_call>\n{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}\n</tool_call>',
    '<tool_call>{"name": "add", "a": 1, "b": 2}</tool_call>',
    'I will add them.\n```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',  # no tag at all
]


def test_hermes_results_are_wrapped_once_by_a_template_that_wraps_tool_messages(tokenizer):
    """The hermes protocol wraps each result in <tool_response> tags; a template that wraps every
    tool message in the same tags (Qwen's) gets each result unwrapped, as a tool message of its
    own, so the prompt holds each inside one pair; other content passes as it is."""
    from helpers import TOOL_RESPONSE_TEMPLATE, with_template

    from harnessrl.models import chat
    from harnessrl.types import Message

    qwen_like = with_template(tokenizer, TOOL_RESPONSE_TEMPLATE)
    assert chat.default_tool_role(qwen_like) == "tool"
    assert chat.template_wraps_tool_results(qwen_like, "tool")
    assert not chat.template_wraps_tool_results(qwen_like, "user")
    assert not chat.template_wraps_tool_results(tokenizer, chat.default_tool_role(tokenizer))  # SmolLM2

    p = get_protocol("hermes")
    results = [ToolResult(name="add", output="3"), ToolResult(name="mul", output="no such tool", ok=False)]
    observation = "\n".join([*(p.render_result(r) for r in results), "2 steps left."])
    messages = [Message(role="user", content="1+2?"), Message(role="assistant", content=HERMES_ADD)]
    prompt = chat.render_prompt(qwen_like, [*messages, Message(role="tool", content=observation)], "tool")
    assert prompt.endswith(
        "<|im_start|>user\n<tool_response>\n3\n</tool_response>\n<tool_response>\n[error] no such tool\n"
        "</tool_response>\n<tool_response>\n2 steps left.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<tool_response>\n<tool_response>" not in prompt
    # what the SFT export writes renders into the same prompt
    exported = chat.to_template_messages([*messages, Message(role="tool", content=observation)], "tool", True)
    assert qwen_like.apply_chat_template(exported, tokenize=False, add_generation_prompt=True) == prompt

    for content in (
        '{"result": 3}',  # another protocol's result: wrapped by the template, once
        p.render_result(ToolResult(name="cat", output="a </tool_response> in a file")),  # tags inside: kept whole
    ):
        assert chat.split_tool_responses(content) == [content]
        rendered = chat.render_prompt(qwen_like, [*messages, Message(role="tool", content=content)], "tool")
        assert f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>" in rendered


def test_hermes_lenient_accepts_near_misses():
    p = get_protocol("hermes")
    for text in HERMES_NEAR_MISSES:
        res = p.parse(text, TOOLS)
        assert res.error is None, (text, res)
        assert [c.name for c in res.calls] == ["add"], (text, res)
        assert canon(res.calls[0].arguments) == canon({"a": 1, "b": 2}), text
        assert res.calls[0].raw in text
        assert "<tool_call>" not in res.thought.lower() and "```" not in res.thought, (text, res.thought)


def test_hermes_strict_rejects_near_misses():
    p = get_protocol("hermes", lenient=False)
    for text in HERMES_NEAR_MISSES:
        res = p.parse(text, TOOLS)
        assert res.error and not res.calls, (text, res)
    res = p.parse("Let me add.\n" + HERMES_ADD, TOOLS)  # reasoning before the call is the documented shape
    assert res.error is None and res.calls[0].arguments == {"a": 1, "b": 2} and res.thought == "Let me add."
    assert "not in the exact format" in p.parse(HERMES_NEAR_MISSES[-1], TOOLS).error
    assert "missing </tool_call>" in p.parse(HERMES_NEAR_MISSES[0], TOOLS).error


def test_hermes_arguments_string_for_single_argument_tool():
    p = get_protocol("hermes")
    res = p.parse('<tool_call>{"name": "submit", "arguments": "42"}</tool_call>', TOOLS)
    assert res.calls[0].arguments == {"answer": "42"}
    assert p.parse('<tool_call>{"name": "add", "arguments": "42"}</tool_call>', TOOLS).error


@pytest.mark.parametrize("lenient", [True, False])
def test_hermes_multiple_calls(lenient):
    p = get_protocol("hermes", lenient=lenient)
    want = [ToolCall(name="add", arguments={"a": 1, "b": 2}), ToolCall(name="submit", arguments={"answer": "3"})]
    text = (
        "First the sum.\n"
        + HERMES_ADD
        + '\n<tool_call>\n{"name": "submit", "arguments": {"answer": "3"}}\n</tool_call>'
    )
    res = p.parse(text, TOOLS)
    assert res.error is None and same_calls(res.calls, want) and res.thought == "First the sum."
    assert res.calls[0].raw == HERMES_ADD
    if lenient:  # a missing </tool_call> before the next call
        res = p.parse(text.replace("}}\n</tool_call>\n<tool", "}}\n<tool", 1), TOOLS)
        assert res.error is None and same_calls(res.calls, want)
    else:  # strict: nothing but whitespace after the first call
        assert "text after the tool call" in p.parse(HERMES_ADD + "\nDone.", TOOLS).error


def test_hermes_lenient_keeps_calls_next_to_a_broken_attempt():
    cut_off = HERMES_ADD + '\n<tool_call>\n{"name": "submit", "argu'
    mention = "I write calls in <tool_call> tags.\n" + HERMES_ADD
    for text in (cut_off, mention):
        res = get_protocol("hermes").parse(text, TOOLS)
        assert [c.name for c in res.calls] == ["add"] and res.error is None, (text, res)
        res = get_protocol("hermes", lenient=False).parse(text, TOOLS)
        assert res.error, (text, res)


@pytest.mark.parametrize("lenient", [True, False])
def test_hermes_too_many_calls_is_an_error(lenient):
    text = "\n".join([HERMES_ADD] * (MAX_CALLS_PER_REPLY + 5))
    res = get_protocol("hermes", lenient=lenient).parse(text, TOOLS)
    assert res.error and "too many" in res.error
    res = get_protocol("hermes", lenient=lenient).parse("\n".join([HERMES_ADD] * MAX_CALLS_PER_REPLY), TOOLS)
    assert res.error is None and len(res.calls) == MAX_CALLS_PER_REPLY


@pytest.mark.parametrize("lenient", [True, False])
def test_hermes_reasoning_block_is_prose(lenient):
    p = get_protocol("hermes", lenient=lenient)
    mention = '<tool_call>\n{"name": "submit", "arguments": {"answer": "0"}}\n</tool_call>'
    for text in [
        f"<think>\nMaybe {mention} but no.\n</think>\n\n{HERMES_ADD}",
        f"Maybe submit, but no.\n</think>\n\n{HERMES_ADD}",  # the template wrote the opening <think>
    ]:
        res = p.parse(text, TOOLS)
        assert res.error is None and [c.name for c in res.calls] == ["add"], (text, res)
        assert res.thought.startswith("Maybe") and "think>" not in res.thought
    # without the opening tag, a </think> after a call is text of the reply, not the end of reasoning
    res = p.parse(f"{HERMES_ADD}\n</think>", TOOLS)
    assert [c.name for c in res.calls] == ["add"]
    res = p.parse(f"<think>\nI should add. {mention}\n</think>", TOOLS)  # only reasoning: prose
    assert res.calls == [] and res.error is None
    res = p.parse(f"<think>\nI forgot to close it.\n{HERMES_ADD}", TOOLS)  # unclosed: not a reasoning block
    assert [c.name for c in res.calls] == ["add"]


@pytest.mark.parametrize("lenient", [True, False])
def test_hermes_ignores_a_made_up_response_but_not_tags_inside_values(lenient):
    p = get_protocol("hermes", lenient=lenient)
    text = HERMES_ADD + '\n<tool_response>\n3\n</tool_response>\n<tool_call>\n{"name": "submit", "arguments": {}}'
    res = p.parse(text, TOOLS)
    assert [c.name for c in res.calls] == ["add"] and res.error is None
    tricky = ToolCall(
        name="write_file",
        arguments={"content": '</tool_call>\n<tool_response>x</tool_response>\n<tool_call>{"name": "rm"}</think>'},
    )
    check_round_trip(p, tricky)
    check_round_trip(p, tricky, thought="Writing the file.")


def test_hermes_data_objects_and_echoed_signatures_are_not_calls():
    p = get_protocol("hermes")
    signature = p.render_tools([ADD]).splitlines()[2]  # the model copies a signature from the tools block
    for text in ['The record is {"name": "Bob", "age": 3}.', signature, '{"answer": 42}']:
        res = p.parse(text, TOOLS)
        assert res.calls == [] and res.error is None, (text, res)


def test_hermes_tools_block_holds_json_signatures():
    block = get_protocol("hermes").render_tools(TOOLS)
    inner = block.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    sigs = [json.loads(line) for line in inner.splitlines()]
    assert sigs == [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in TOOLS
    ]
    assert get_protocol("hermes").parse(block.rsplit("Example:\n", 1)[1], TOOLS).calls[0].name == "add"


# ----------------------------------------------------------------------------- code specifics

DANGEROUS = [
    "__import__('os').system('touch {marker}')",
    "open('{marker}', 'w')",
    "import os\nos.system('touch {marker}')",
    "os.system('touch {marker}')",
    "add(a=x, b=2)",
    "add(a=math.pi, b=2)",
    "add(a=len('abc'), b=2)",
    "add(a=(lambda: 1)(), b=2)",
    "add(a=[i for i in range(3)], b=2)",
    "x = add(a=1, b=2)",
    "add(a=1, b=2).real",
    "add(**kwargs)",
    "add(*[1, 2])",
    "add(a=1 + 2, b=2)",
    "add(a=f'{{1}}', b=2)",
    'exec(\'open("{marker}", "w")\')',
    "eval('1')",
    "def f():\n    pass",
    "submit(answer=open('{marker}', 'w'))",
    "getattr(__builtins__, 'open')('{marker}', 'w')",
]


@pytest.mark.parametrize("lenient", [True, False])
@pytest.mark.parametrize("source", DANGEROUS)
def test_code_refuses_anything_but_literal_calls_and_runs_nothing(source, lenient, tmp_path):
    marker = tmp_path / "executed"
    code = source.format(marker=marker)
    for text in [f"```python\n{code}\n```", code]:
        res = get_protocol("code", lenient=lenient).parse(text, TOOLS)
        if text == code:
            assert res.calls == []  # unfenced: strict never takes it; lenient reports or ignores it
            continue
        assert res.error, (text, res)
        assert "allowed" in res.error or "literal" in res.error or "arguments" in res.error
    assert not marker.exists()


def test_code_positional_arguments_map_onto_the_schema():
    p = get_protocol("code")
    res = p.parse("```python\nadd(17, b=25)\n```", TOOLS)
    assert res.calls[0].arguments == {"a": 17, "b": 25}
    assert p.parse("```python\nadd(1, 2, 3)\n```", TOOLS).error
    assert p.parse("```python\nadd(1, a=2)\n```", TOOLS).error
    assert "names" in p.parse("```python\nadd(17, 25)\n```").error  # no schema: names are needed


def test_code_literals():
    res = get_protocol("code").parse(
        '```python\nsearch(query="q", tags=("a", "b"), score=-1.5, exact=None)\n```', TOOLS
    )
    assert canon(res.calls[0].arguments) == canon({"query": "q", "tags": ["a", "b"], "score": -1.5, "exact": None})
    for bad in [
        "search(query={1, 2})",
        "search(query=b'x')",
        "search(query=1j)",
        "search(query=...)",
        "search(**{1: 2})",
    ]:
        assert get_protocol("code").parse(f"```python\n{bad}\n```", TOOLS).error, bad


@pytest.mark.parametrize("lenient", [True, False])
def test_code_multiple_calls(lenient):
    text = (
        'I add then submit.\n```python\nadd(a=1, b=2)\nsubmit(answer="3")\n```\n'
        'and one more:\n```py\nsubmit(answer="4")\n```'
    )
    res = get_protocol("code", lenient=lenient).parse(text, TOOLS)
    assert res.error is None
    assert [c.raw for c in res.calls] == ["add(a=1, b=2)", 'submit(answer="3")', 'submit(answer="4")']
    assert res.thought == "I add then submit.\nand one more:"


def test_code_lenient_vs_strict():
    lenient, strict = get_protocol("code"), get_protocol("code", lenient=False)
    for text in [
        'submit(answer="3")',
        'Sure.\nsubmit(answer="3")\nDone.',
        '```\nsubmit(answer="3")\n```',
        '```python\nsubmit(answer="3")',
    ]:
        res = lenient.parse(text, TOOLS)
        assert res.error is None and [c.arguments for c in res.calls] == [{"answer": "3"}], text
        res = strict.parse(text, TOOLS)
        assert res.error and not (res.calls and res.error is None), text
    # a non-python block is prose
    res = lenient.parse('```json\n{"a": 1}\n```', TOOLS)
    assert res.calls == [] and res.error is None


def test_code_ignores_comments_docstrings_and_pass():
    res = get_protocol("code").parse('```python\n# add them\n"note"\npass\nadd(a=1, b=2)  # done\n```', TOOLS)
    assert res.error is None and res.calls[0].arguments == {"a": 1, "b": 2}


# ----------------------------------------------------------------------------- adversarial


def adversarial_texts() -> list[str]:
    rng = random.Random(7)
    return [
        "{" * 200_000,
        "}" * 200_000,
        "[" * 200_000,
        "(" * 200_000,
        "<" * 200_000,
        '"' * 200_000,
        "\\" * 200_000,
        '{"' + "\\" * 150_000,
        "{'" * 100_000,
        '{"tool": "a", "arguments": ' * 20_000,
        '{"tool": "add", "arguments": {"a": ' + '{"x": ' * 2000 + "1" + "}" * 2000 + "}}",
        '{"tool": "add", "arguments": {"a": ' + "[" * 150 + "]" * 150 + "}}",
        '{"tool": "add", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}",
        "x" * 300_000 + '{"tool": "add", "arguments": {}}',
        "\x00" * 1000 + '{"tool": "add"\x00, "arguments": {"a": "\x00"}}' + "\x00" * 1000,
        '{"tool": "submit", "arguments": {"answer": "\\ud800 lone surrogate"}}',
        "".join(
            chr(rng.randint(0, 0x10FFFF)) if rng.random() < 0.5 else chr(rng.randint(0, 127)) for _ in range(20_000)
        )
        .encode("utf-8", "replace")
        .decode("utf-8", "replace"),
        bytes(rng.randrange(256) for _ in range(50_000)).decode("latin-1"),
        "<tool " * 50_000,
        "<tool name='a'>" * 20_000,
        '<tool name="add">' + "<a>" * 30_000,
        '<tool name="add"><a>' + "x" * 150_000,
        "Action: " * 50_000,
        "Action: x\n" * 50_000,
        "Action: add\nAction Input: " + "{" * 100_000,
        "Action: add\nAction Input: " + "a=" * 100_000,
        "Action: add\nAction Input: " + 'a="' * 50_000,
        "Action Input: " * 30_000,
        "```python\n" + "(" * 100_000 + "\n```",
        "```python\n" + "-" * 100_000 + "1\n```",
        "```python\n" + "a." * 50_000 + "b()\n```",
        "```python\n" + "add(a=1)\n" * 20_000 + "```",
        "```" * 50_000,
        "add(" * 50_000,
        "f" + "(1)" * 30_000,
        "not " * 50_000 + "1",
        "```python\nadd(a='" + "\\" * 100_000 + "')\n```",
        "```python\nadd(a=" + "1" * 10_000 + ")\n```",
        'Thought: é 中文 🙂\u202e\ufeff\nAction: 🙂\nAction Input: {"ü": "中"}',
        "<tool_call>" * 50_000,
        "<tool_call>{" * 30_000,
        "<tool_call>{}" * 30_000,
        "<tool_call>{}</tool_call>" * 20_000,
        '<tool_call>{"name": "a", "arguments": {}}' * 10_000,
        '<tool_call>\n{"name": "add", "arguments": ' + "{" * 100_000,
        '<tool_call>\n{"name": "add", "arguments": {"a": ' + '{"x": ' * 2000 + "1" + "}" * 2000 + "}}\n</tool_call>",
        '<tool_call>\n{"name": "add", "arguments": {"a": "' + "\\" * 100_000,
        "</tool_call>" * 50_000,
        "<tool_response>" * 50_000,
        "<think>" * 50_000,
        "</think>" * 50_000,
        "<think>" + "<tool_call>{" * 20_000 + "</think>",
        '{"name": "add", "arguments": {}}' * 10_000,
    ]


@pytest.mark.parametrize("name,lenient", ALL, ids=ALL_IDS)
def test_adversarial_texts_never_raise_or_hang(name, lenient):
    proto = get_protocol(name, lenient=lenient)
    for i, text in enumerate(adversarial_texts()):
        for tools in (None, TOOLS):
            t0 = time.perf_counter()
            res = proto.parse(text, tools)
            elapsed = time.perf_counter() - t0
            assert isinstance(res, ParseResult)
            # A guard against super-linear parsing (a hang), not a speed test: each parse takes
            # well under a second on an idle machine, but a starved CI runner can stretch that.
            assert elapsed < 15.0, (i, elapsed)
            assert len(res.calls) <= MAX_CALLS_PER_REPLY + 1
            assert not (res.calls and res.empty)
            for call in res.calls:  # every parsed call serialises
                assert ToolCall.model_validate_json(call.model_dump_json()) == call


def test_too_many_calls_is_an_error():
    text = "\n".join('{"tool": "add", "arguments": {"a": 1, "b": 2}}' for _ in range(MAX_CALLS_PER_REPLY + 5))
    res = get_protocol("json").parse(text, TOOLS)
    assert res.error and "too many" in res.error


def test_lone_surrogates_are_replaced():
    res = get_protocol("json").parse('{"tool": "submit", "arguments": {"answer": "\\ud800x"}}', TOOLS)
    assert res.calls[0].arguments["answer"] == "\ufffdx"
    res.calls[0].model_dump_json()


def test_nothing_beyond_the_scan_cap_is_parsed():
    text = "x" * 200_000 + '{"tool": "add", "arguments": {"a": 1, "b": 2}}'
    res = get_protocol("json").parse(text, TOOLS)
    assert res.calls == [] and res.error is None


def test_parse_accepts_none_text():
    assert get_protocol("json").parse(None).empty  # type: ignore[arg-type]
