"""Anthropic's Messages API on `harnessrl serve` and on the recording endpoint, through the
official `anthropic` client.

- serve answers messages.create as the chat completion it means (greedy: the same text, the
  same token counts), with system as a string or as blocks, stop_sequences (stop_reason
  stop_sequence naming it) and max_tokens (stop_reason max_tokens); count_tokens gives the prompt
  length the reply reports; messages.stream sends every event the SDK reads, token by token;
- with a tool-call parser, a tool the model calls comes back as a tool_use block (stop_reason
  tool_use) whose id, sent back in a tool_result, is rendered as the format's result text;
  streamed as an input_json_delta too;
- what cannot be served is a 400 in Anthropic's error shape naming it (images, thinking, server
  tools, ...), cache_control and the SDK's headers are accepted;
- the recording endpoint records each Messages call as a step (token ids and logprobs), hands
  out tool_use ids whose tool_result is recorded with the call that made it, streams, counts
  tokens without recording, and answers its errors in Anthropic's shape.
"""

from __future__ import annotations

import json

import anthropic
import pytest
from test_serve_tools import CALL_TEXT, ScriptedHF

from harnessrl.harness.external import ExternalEpisode
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import parse_spec
from harnessrl.models import SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job
from harnessrl.serve import serving
from harnessrl.tasks import get_suite
from harnessrl.types import ActionKind, ToolCall

SYSTEM, USER = "You are a terse assistant.", "Name three prime numbers."
ADD = {
    "name": "add",
    "description": "Add two integers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}
READ = {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object", "properties": {}}}
QUESTION = [{"role": "user", "content": "What is 17 plus 25?"}]
STREAM_EVENTS = {
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def root(url: str) -> str:
    """The base URL an Anthropic client takes: the server's, without /v1 (it adds /v1/messages)."""
    assert url.endswith("/v1")
    return url[: -len("/v1")]


@pytest.fixture(scope="module")
def served(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    with serving(policy) as url:
        yield url, policy
    policy.close()


@pytest.fixture
def client(served):
    return anthropic.Anthropic(base_url=root(served[0]), api_key="EMPTY", max_retries=0)


@pytest.fixture(scope="module")
def scripted(tokenizer):
    policy = ScriptedHF(tokenizer)
    with serving(policy, enable_auto_tool_choice=True, tool_call_parser="hermes") as url:
        yield anthropic.Anthropic(base_url=root(url), api_key="EMPTY", max_retries=0), policy
    policy.close()


def chat_reply(url: str, messages: list[dict], max_tokens: int, **fields):
    import openai

    client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    return client.chat.completions.create(
        model="tiny-random", messages=messages, temperature=0, max_tokens=max_tokens, **fields
    )


# ------------------------------------------------------------------------------------- serve


def test_messages_create_is_the_chat_completion_it_means(served, client):
    reply = client.messages.create(
        model="tiny-random",
        system=SYSTEM,
        messages=[{"role": "user", "content": USER}],
        max_tokens=8,
        extra_body={"temperature": 0},
        metadata={"user_id": "someone"},
    )
    expected = chat_reply(served[0], [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}], 8)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    [block] = reply.content
    assert block.type == "text" and block.text == expected.choices[0].message.content and block.text
    # the random model does not stop within 8 tokens
    assert reply.stop_reason == "max_tokens" and reply.stop_sequence is None
    assert reply.usage.output_tokens == 8 and reply.usage.input_tokens == expected.usage.prompt_tokens
    # system as blocks (with cache_control, ignored) is the same request
    blocks = client.messages.create(
        model="tiny-random",
        system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": USER}]}],
        max_tokens=8,
        extra_body={"temperature": 0},
    )
    assert blocks.content[0].text == block.text
    counted = client.messages.count_tokens(
        model="tiny-random", system=SYSTEM, messages=[{"role": "user", "content": USER}]
    )
    assert counted.input_tokens == reply.usage.input_tokens


def test_a_stop_sequence_ends_the_reply_and_is_named(served, client):
    whole = client.messages.create(
        model="tiny-random", messages=[{"role": "user", "content": USER}], max_tokens=12, extra_body={"temperature": 0}
    )
    text = whole.content[0].text
    # a stop sequence the greedy reply is known to reach: a piece of its own text past the start
    sequence = text[len(text) // 2 :][:3]
    assert sequence.strip(), text
    cut = client.messages.create(
        model="tiny-random",
        messages=[{"role": "user", "content": USER}],
        max_tokens=12,
        extra_body={"temperature": 0},
        stop_sequences=[sequence],
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == sequence
    assert cut.content[0].text == text[: text.index(sequence)]


def test_messages_stream_sends_every_event_token_by_token(client):
    whole = client.messages.create(
        model="tiny-random", messages=[{"role": "user", "content": USER}], max_tokens=10, extra_body={"temperature": 0}
    )
    with client.messages.stream(
        model="tiny-random", messages=[{"role": "user", "content": USER}], max_tokens=10, extra_body={"temperature": 0}
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert STREAM_EVENTS <= set(kinds) and kinds[0] == "message_start" and kinds[-1] == "message_stop"
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert len(deltas) > 1 and all(e.delta.type == "text_delta" for e in deltas)
    assert "".join(e.delta.text for e in deltas) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    assert final.usage.input_tokens == whole.usage.input_tokens


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
                        ],
                    }
                ]
            },
            "image",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"}]},
                    {"role": "user", "content": "go on"},
                ]
            },
            "thinking",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "MCP"),
        ({"top_k": -1}, "top_k"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ],
)
def test_what_serve_cannot_do_is_a_400_in_anthropics_shape(served, fields, named):
    import httpx

    body = {"model": "tiny-random", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **fields}
    answer = httpx.post(root(served[0]) + "/v1/messages", json=body, headers={"x-api-key": "k"})
    assert answer.status_code == 400
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert named in error["error"]["message"]


def test_the_sdk_reads_refusals_and_a_missing_max_tokens_as_bad_requests(served, client):
    import httpx

    with pytest.raises(anthropic.BadRequestError, match="thinking") as raised:
        client.messages.create(
            model="tiny-random",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    assert raised.value.body["error"]["type"] == "invalid_request_error"
    missing = httpx.post(root(served[0]) + "/v1/messages", json={"messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]
    malformed = httpx.post(root(served[0]) + "/v1/messages", content=b"{not json")
    assert malformed.status_code == 400 and malformed.json()["type"] == "error"
    # the chat routes keep OpenAI's shape
    chat = httpx.post(served[0] + "/chat/completions", json={"messages": []})
    assert chat.status_code == 400 and "type" not in chat.json() and chat.json()["error"]["code"] == 400
    # the SDK's own headers, and a beta header, are accepted
    beta = client.messages.create(
        model="tiny-random",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_headers={"anthropic-beta": "some-feature-2025-01-01"},
    )
    assert beta.usage.output_tokens == 2


def test_a_tool_use_block_and_its_tool_result_on_serve(scripted):
    client, policy = scripted
    reply = client.messages.create(model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=64)
    assert reply.stop_reason == "tool_use"
    text, use = reply.content
    assert text.type == "text" and text.text == "Let me add."
    assert use.type == "tool_use" and use.name == "add" and use.input == {"a": 17, "b": 25} and use.id
    system = policy.seen[-1][0]
    assert system.role == "system" and "<tools>" in system.content and '"name": "add"' in system.content
    follow = [
        *QUESTION,
        {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]},
    ]
    second = client.messages.create(model="tiny-random", messages=follow, tools=[ADD], max_tokens=64)
    assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["text"]
    assert second.content[0].text == "The sum is 42."
    assistant, result = policy.seen[-1][-2:]
    assert assistant.role == "assistant" and "<tool_call>" in assistant.content and '"a": 17' in assistant.content
    assert result.role == "tool" and result.content.startswith("<tool_response>") and "42" in result.content
    assert result.name == "add"
    # any / a named tool cannot be enforced here; none shows no tools and parses nothing
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        client.messages.create(
            model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=64, tool_choice={"type": "any"}
        )
    plain = client.messages.create(
        model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=64, tool_choice={"type": "none"}
    )
    assert plain.stop_reason == "end_turn" and plain.content[0].text == CALL_TEXT


def test_a_streamed_tool_use_is_an_input_json_delta(scripted):
    client, _ = scripted
    with client.messages.stream(model="tiny-random", messages=QUESTION, tools=[ADD], max_tokens=64) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["text", "tool_use"]
    kinds = {e.delta.type for e in events if e.type == "content_block_delta"}
    assert kinds == {"text_delta", "input_json_delta"}
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"] and final.content[1].input == {"a": 17, "b": 25}


# --------------------------------------------------------------------------- recording endpoint


def agent_spec():
    data = {
        "name": "messages-agent",
        "kind": "external",
        "command": ["true"],
        "limits": {"wall_s": 60, "max_model_calls": 4},
        "tool_protocol": "hermes",
    }
    return parse_spec(data)


def hermes(name: str, arguments: dict) -> str:
    return get_protocol("hermes").render_call(ToolCall(name=name, arguments=arguments))


def episode_for(endpoint, policy) -> tuple[ExternalEpisode, anthropic.Anthropic]:
    task = get_suite("workspace").tasks("dev", 1)[0]
    episode = ExternalEpisode(Job(task, agent_spec(), 0), policy, SamplingParams(), lambda *a: None)
    endpoint.register(episode)
    client = anthropic.Anthropic(base_url=root(endpoint.url(episode)), api_key="EMPTY", max_retries=0)
    return episode, client


def test_the_endpoint_records_tool_use_and_its_result(endpoint, tokenizer):
    replies = ["Let me look.\n" + hermes("read_file", {"path": "a.txt"}), "It says A."]
    episode, client = episode_for(endpoint, ScriptedPolicy(replies, tokenizer=tokenizer, name="replies"))
    first = client.messages.create(
        model="m", system=SYSTEM, messages=[{"role": "user", "content": "go"}], tools=[READ], max_tokens=64
    )
    assert first.stop_reason == "tool_use" and first.model == "m"
    text, use = first.content
    assert text.text == "Let me look." and use.name == "read_file" and use.input == {"path": "a.txt"}
    assert use.id == "call_0_0"  # the episode's own id, which its tool result is matched by
    follow = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "A"}]}],
        },
    ]
    with client.messages.stream(model="m", system=SYSTEM, messages=follow, tools=[READ], max_tokens=64) as stream:
        second = stream.get_final_message()
    assert second.stop_reason == "end_turn" and second.content[0].text == "It says A."
    steps = episode.steps()
    assert len(steps) == 2
    assert steps[0].action == ActionKind.tool_calls and steps[0].tool_calls[0].name == "read_file"
    assert [r.output for r in steps[0].tool_results] == ["A"]
    for step in steps:
        call = step.model_call
        assert call.prompt_ids and call.completion_ids and len(call.logprobs) == len(call.completion_ids)
        assert call.messages[0].role == "system" and call.messages[0].content.startswith(SYSTEM)
    assert second.usage.input_tokens == steps[1].model_call.prompt_tokens


def test_the_endpoint_streams_a_real_model_counts_tokens_and_answers_errors_in_anthropics_shape(endpoint, served):
    policy = served[1]
    episode, client = episode_for(endpoint, policy)
    counted = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": USER}])
    assert not episode.steps()  # counting is not a model call
    with client.messages.stream(model="m", messages=[{"role": "user", "content": USER}], max_tokens=6) as stream:
        deltas = [e for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    [step] = episode.steps()
    assert final.usage.input_tokens == counted.input_tokens == step.model_call.prompt_tokens
    assert final.usage.output_tokens == step.model_call.completion_tokens
    assert "".join(d.delta.text for d in deltas) == final.content[0].text == step.model_call.text
    with pytest.raises(anthropic.BadRequestError, match="image") as raised:
        client.messages.create(
            model="m",
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}],
        )
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": raised.value.body["error"]["message"]},
    }
    [refusal] = episode.refusals
    assert refusal.route == "/v1/messages" and refusal.status == 400
    gone = anthropic.Anthropic(
        base_url=root(endpoint.url(episode)).replace(episode.token, "nope"), api_key="x", max_retries=0
    )
    with pytest.raises(anthropic.NotFoundError):
        gone.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert json.dumps(raised.value.body)


def test_a_backend_failure_is_a_500_in_anthropics_shape_and_an_error_event(endpoint, tokenizer):
    """The policy fails (its script is exhausted): the request gets Anthropic's api_error, the
    stream an `error` event, and the episode records a backend failure."""
    episode, client = episode_for(endpoint, ScriptedPolicy([], tokenizer=tokenizer, name="empty"))
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert raised.value.body["type"] == "error" and raised.value.body["error"]["type"] == "api_error"
    assert "model backend failed" in raised.value.body["error"]["message"]
    episode2, client2 = episode_for(endpoint, ScriptedPolicy([], tokenizer=tokenizer, name="empty"))
    with pytest.raises(anthropic.APIStatusError, match="model backend failed"):
        with client2.messages.stream(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}]) as stream:
            list(stream)
    assert episode.infra_error and episode2.infra_error
