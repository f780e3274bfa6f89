"""Native tool calls on `harnessrl serve` (--enable-auto-tool-choice --tool-call-parser P).

- with the flags, the official openai client's chat.completions.create(tools=...) and
  responses.create(tools=...) get the calls parsed from the model's hermes text (ids, finish
  reason "tool_calls", function_call items with call_id), streamed as tool-call deltas too;
- the tools are in the prompt as the format's tool block, and a follow-up's tool result (a
  `tool` message, a function_call_output item, previous_response_id) is rendered as the format's
  result text, the history's call in its call syntax;
- tool_choice "none" shows no tools and parses nothing; "required" and a named function are a 400;
- without the flags, a request with tools gets vLLM's 400 naming both flags;
- the CLI flags reach the server, the parser is one of the registered formats, and the trainer's
  start-up probe with native tools passes against serve with the flags and is refused without.

A scripted model (the tiny model's weights and the real tokenizer, with written replies) stands
where a well-formed call is needed: the tiny random model never writes one.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future

import openai
import pytest
from typer.testing import CliRunner

from harnessrl.models import GenerationRequest, SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.serve import ServedModels, serving
from harnessrl.types import Message, ModelCall

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
RESPONSES_ADD = {"type": "function", **ADD["function"]}
QUESTION = [{"role": "user", "content": "What is 17 plus 25?"}]
CALL_TEXT = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 25}}\n</tool_call>'


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


class ScriptedHF(HFPolicy):
    """The tiny model as `harnessrl serve` loads it, answering with written replies: a call of
    `add` until the conversation holds a tool result, then the sum. Every conversation it was
    asked (as the server rendered it) is kept in `seen`."""

    streams_tokens = False  # the scripted replies come whole

    def __init__(self, tokenizer):
        super().__init__(tiny_random_model(), tokenizer, name="tiny-random")
        self.seen: list[list[Message]] = []
        self._seen_lock = threading.Lock()
        self.script = ScriptedPolicy(self._reply, tokenizer=tokenizer, name="tiny-random")

    def _reply(self, messages: list[Message]) -> str:
        with self._seen_lock:
            self.seen.append(list(messages))
        return "The sum is 42." if messages[-1].role == "tool" else CALL_TEXT

    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None, **_) -> Future[ModelCall]:
        return self.script.submit(request, sampling)


@pytest.fixture(scope="module")
def scripted(tokenizer):
    policy = ScriptedHF(tokenizer)
    with serving(policy, enable_auto_tool_choice=True, tool_call_parser="hermes") as url:
        yield openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0), policy
    policy.close()


@pytest.fixture(scope="module")
def plain(tokenizer):
    """The tiny random model served without the flags."""
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    with serving(policy) as url:
        yield openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0), url
    policy.close()


def last_seen(policy: ScriptedHF) -> list[Message]:
    return policy.seen[-1]


# ------------------------------------------------------------------------------ chat completions


def test_chat_completions_get_parsed_tool_calls_and_the_result_is_rendered(scripted):
    client, policy = scripted
    reply = client.chat.completions.create(model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=64)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me add."
    [tc] = choice.message.tool_calls
    assert tc.type == "function" and tc.function.name == "add" and tc.id.startswith("chatcmpl-tool-")
    assert json.loads(tc.function.arguments) == {"a": 17, "b": 25}
    # the tools were in the prompt as hermes's tool block, in a system message added for it
    system = last_seen(policy)[0]
    assert system.role == "system" and "<tools>" in system.content and '"name": "add"' in system.content
    # the follow-up: the call in hermes's syntax, the result as hermes's result text
    follow = [
        *QUESTION,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": "42"},
    ]
    second = client.chat.completions.create(model="tiny-random", messages=follow, tools=[ADD], max_tokens=64)
    assert second.choices[0].message.content == "The sum is 42." and second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls
    assistant, result = last_seen(policy)[-2:]
    assert assistant.role == "assistant" and "<tool_call>" in assistant.content and '"a": 17' in assistant.content
    assert result.role == "tool" and result.content.startswith("<tool_response>") and "42" in result.content
    assert result.name == "add"  # the tool's name, found through tool_call_id
    assert second.usage.prompt_tokens > reply.usage.prompt_tokens


def test_a_system_message_of_the_request_gets_the_tool_block_appended(scripted):
    client, policy = scripted
    messages = [{"role": "system", "content": "You are terse."}, *QUESTION]
    client.chat.completions.create(model="tiny-random", messages=messages, tools=[ADD], max_tokens=64)
    system = last_seen(policy)[0]
    assert system.content.startswith("You are terse.\n\n") and "<tools>" in system.content
    assert [m.role for m in last_seen(policy)] == ["system", "user"]


def test_a_streamed_reply_with_tools_comes_as_tool_call_deltas(scripted):
    client, _ = scripted
    stream = client.chat.completions.create(
        model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=64, stream=True
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Let me add." and "<tool_call>" not in content  # the call text never reaches the client
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("chatcmpl-tool-") and deltas[0].function.name == "add"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"a": 17, "b": 25}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_shows_no_tools_and_parses_nothing(scripted):
    client, policy = scripted
    reply = client.chat.completions.create(
        model="tiny-random", messages=QUESTION, tools=[ADD], tool_choice="none", max_tokens=64
    )
    assert reply.choices[0].message.content == CALL_TEXT and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    assert all("<tools>" not in m.content for m in last_seen(policy))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_tool_choices_that_cannot_be_enforced_are_a_400(scripted, choice):
    client, _ = scripted
    with pytest.raises(openai.BadRequestError, match="cannot be enforced by this server") as refused:
        client.chat.completions.create(
            model="tiny-random", messages=QUESTION, tools=[ADD], tool_choice=choice, max_tokens=4
        )
    assert refused.value.body["param"] == "tool_choice"


# ------------------------------------------------------------------------------------- Responses


def test_responses_get_function_calls_and_the_output_is_rendered(scripted):
    client, policy = scripted
    response = client.responses.create(model="tiny-random", input="What is 17 plus 25?", tools=[RESPONSES_ADD])
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["add"] and json.loads(calls[0].arguments) == {"a": 17, "b": 25}
    assert calls[0].call_id.startswith("chatcmpl-tool-")
    assert "<tools>" in last_seen(policy)[0].content
    # the result through previous_response_id: only the new item is sent
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "42"}
    second = client.responses.create(
        model="tiny-random", previous_response_id=response.id, input=[output], tools=[RESPONSES_ADD]
    )
    assert second.output_text == "The sum is 42."
    assistant, result = last_seen(policy)[-2:]
    assert "<tool_call>" in assistant.content and result.content.startswith("<tool_response>")
    assert result.name == "add"


def test_a_streamed_response_with_tools_has_the_function_call_events(scripted):
    client, _ = scripted
    with client.responses.stream(model="tiny-random", input="What is 17 plus 25?", tools=[RESPONSES_ADD]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    [call] = [item for item in final.output if item.type == "function_call"]
    assert call.name == "add" and json.loads(call.arguments) == {"a": 17, "b": 25}


# ------------------------------------------------------------------------------ without the flags


@pytest.mark.parametrize("route", ["chat", "responses"])
def test_without_the_flags_tools_get_vllms_400_naming_both(plain, route):
    client, _ = plain
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            client.chat.completions.create(model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=2)
        else:
            client.responses.create(model="tiny-random", input="hi", tools=[RESPONSES_ADD], max_output_tokens=2)
    message = refused.value.body["message"]
    assert '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set' in message


def test_the_parser_is_a_registered_format_and_needs_both_flags(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    try:
        with pytest.raises(ValueError, match="must be one of json, xml, react, code, hermes"):
            ServedModels(policy, tool_call_parser="llama4_pythonic")
        for kwargs, needs in (
            ({"enable_auto_tool_choice": True}, "needs --tool-call-parser"),
            ({"tool_call_parser": "hermes"}, "needs --enable-auto-tool-choice"),
        ):
            with pytest.raises(ValueError, match=needs):
                with serving(policy, **kwargs):
                    pass
        assert ServedModels(policy, tool_call_parser="json").prompt_tools.protocol.name == "json"
    finally:
        policy.close()


def test_the_cli_flags_reach_the_server(monkeypatch):
    import harnessrl.serve as serve_module
    from harnessrl.cli import app

    seen = {}

    def capture(models, **kwargs):
        seen["parser"] = models.tool_call_parser
        seen["format"] = type(models.prompt_tools.protocol).__name__ if models.prompt_tools else None

    monkeypatch.setattr(serve_module, "run_server", capture)
    runner = CliRunner()
    on = runner.invoke(
        app, ["serve", "--model", "tiny-random", "--enable-auto-tool-choice", "--tool-call-parser", "xml"]
    )
    assert on.exit_code == 0, on.output
    assert seen == {"parser": "xml", "format": "XmlProtocol"}
    off = runner.invoke(app, ["serve", "--model", "tiny-random"])
    assert off.exit_code == 0 and seen == {"parser": None, "format": None}
    for args, message in (
        (["--enable-auto-tool-choice"], "needs --tool-call-parser, one of: json, xml, react, code, hermes"),
        (["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"], "must be one of json"),
        (["--tool-call-parser", "hermes"], "needs --enable-auto-tool-choice"),
    ):
        bad = runner.invoke(app, ["serve", "--model", "tiny-random", *args])
        assert bad.exit_code != 0 and message in bad.output, bad.output


# ------------------------------------------------------------------------------- the trainer's probe


def test_the_trainers_tool_probe_passes_with_the_flags_and_is_refused_without(tiny_policy, tmp_path):
    from helpers import ADMIN_KEY
    from test_rollout_vllm import tiny_peft

    from harnessrl.train.rollout_server import RolloutServerError, RolloutServers, teacher_forced

    trained = tiny_peft(tiny_policy)
    for flags, passes in (({"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}, True), ({}, False)):
        with serving(tiny_policy, served_model_name="tiny-random", admin_key=ADMIN_KEY, **flags) as url:
            servers = RolloutServers([url], run_id="tools", admin_key=ADMIN_KEY)
            servers.publish(lambda folder: trained.save_pretrained(str(folder)), tmp_path / str(passes), 0)
            if passes:
                report = servers.probe(teacher_forced(trained), temperature=0.7, native_tools=True)
                assert report.servers[0].native_tools is True
            else:
                with pytest.raises(RolloutServerError, match="--enable-auto-tool-choice --tool-call-parser"):
                    servers.probe(teacher_forced(trained), temperature=0.7, native_tools=True)
