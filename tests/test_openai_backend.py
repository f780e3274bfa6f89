"""The openai: backend against a real HTTP server on 127.0.0.1 (tests/openai_server.py, answering
with the tiny random model) through the official openai client: spec parsing, API keys,
request shape, logprobs and token ids, retries and infrastructure errors, native tools,
the concurrency cap, and an eval through the runner."""

from __future__ import annotations

import time

import pytest
from helpers import shrunk
from openai_server import OpenAITestServer, ServerOptions, closed_port

from harnessrl.harness.protocols import get_protocol, read_reply
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models import GenerationRequest, ModelSpec, PolicyError, SamplingParams, load_policy
from harnessrl.models.openai_compat import (
    ANSWERED_ABOVE,
    UNANSWERED,
    OpenAIPolicy,
    parse_completion,
    to_openai_messages,
)
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.types import ActionKind, Message, Termination, ToolCall, ToolSchema

GREEDY = SamplingParams(temperature=0.0)
ADD = ToolSchema(
    name="add",
    description="Add two numbers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
)


def ask(text: str = "What is 2 plus 3?", **kw) -> GenerationRequest:
    return GenerationRequest(
        messages=[Message(role="user", content=text)], max_new_tokens=kw.pop("max_new_tokens", 6), **kw
    )


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture
def make_server(tiny_policy):
    servers = []

    def make(**options) -> OpenAITestServer:
        server = OpenAITestServer(tiny_policy, options=ServerOptions(**options)).__enter__()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.__exit__(None, None, None)


def policy_for(server: OpenAITestServer, **kw) -> OpenAIPolicy:
    sleeps = kw.pop("sleeps", None)
    kw.setdefault("max_retries", 2)
    kw.setdefault("timeout", 10.0)
    kw.setdefault("return_token_ids", False)  # the tests that want token ids ask for them
    if sleeps is not None:
        kw["sleep"] = sleeps.append
    else:
        kw.setdefault("backoff_base_s", 0.001)
        kw.setdefault("backoff_max_s", 0.005)
    return OpenAIPolicy.from_spec(server.spec(), GREEDY, **kw)


# ---------------------------------------------------------------------------------- specs, keys


def test_spec_parsing():
    def parse_spec(text: str) -> tuple[str, str]:
        spec = ModelSpec.parse(text)
        assert spec.kind == "openai" and not spec.local
        return spec.name, spec.base_url

    assert parse_spec("openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1") == (
        "Qwen/Qwen3-1.7B",
        "http://127.0.0.1:8000/v1",
    )
    assert parse_spec("openai:org/m:q4@lora@https://h.example/v1/") == ("org/m:q4@lora", "https://h.example/v1")
    assert parse_spec("openai:m@http://user:pw@host:1/v1") == ("m", "http://user:pw@host:1/v1")
    for bad in [
        "openai:",
        "openai:model",
        "openai:model@localhost:8000/v1",
        "openai:@http://x/v1",
        "openai:m@ftp://x",
        "openai:m@http://",
    ]:
        with pytest.raises(ValueError, match="openai:MODEL@BASE_URL"):
            load_policy(bad)


def test_load_policy_and_describe(make_server):
    server = make_server()
    policy = load_policy(server.spec(), GREEDY)
    assert isinstance(policy, OpenAIPolicy)
    d = policy.describe()
    assert d["backend"] == "openai" and d["model"] == "tiny-random" and d["base_url"] == server.base_url
    assert d["logprobs"] is True and d["name"] == server.spec() and d["sampling"]["temperature"] == 0.0
    assert "api_key" not in d


def test_api_key_from_environment(make_server, monkeypatch):
    server = make_server()
    load_policy(server.spec()).complete([ask()])
    assert server.requests[-1].headers["authorization"] == "Bearer EMPTY"  # OPENAI_API_KEY unset

    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    load_policy(server.spec()).complete([ask()])
    assert server.requests[-1].headers["authorization"] == "Bearer sk-default"

    monkeypatch.setenv("MY_SERVER_KEY", "sk-named")
    load_policy(server.spec(), api_key_env="MY_SERVER_KEY").complete([ask()])
    assert server.requests[-1].headers["authorization"] == "Bearer sk-named"

    with pytest.raises(ValueError, match=r"\$NO_SUCH_KEY_VAR is not set"):
        load_policy(server.spec(), api_key_env="NO_SUCH_KEY_VAR")
    monkeypatch.setenv("EMPTY_KEY_VAR", "")
    with pytest.raises(ValueError, match=r"\$EMPTY_KEY_VAR is empty"):
        load_policy(server.spec(), api_key_env="EMPTY_KEY_VAR")


# ------------------------------------------------------------------------------ requests, replies


def test_request_shape_and_reply(make_server, tiny_policy):
    server = make_server()
    policy = policy_for(server)
    sampling = SamplingParams(temperature=0.5, top_p=0.9, seed=3)
    requests = [ask(stop=["Observation:"]), ask("hello", max_new_tokens=4)]
    calls = policy.complete(requests, sampling)
    assert len(calls) == 2
    bodies = sorted((r.body for r in server.requests), key=lambda b: b["max_tokens"], reverse=True)
    assert [b["max_tokens"] for b in bodies] == [6, 4]
    assert bodies[0]["stop"] == ["Observation:"] and "stop" not in bodies[1]
    assert all(b["temperature"] == 0.5 and b["top_p"] == 0.9 and b["logprobs"] is True for b in bodies)
    assert all("tools" not in b for b in bodies)
    assert bodies[0]["messages"] == [{"role": "user", "content": "What is 2 plus 3?"}]
    seeds = {b["seed"] for b in bodies}
    assert len(seeds) == 2  # one seed per request: attempts of one prompt get different noise
    policy.complete(requests, sampling)
    assert len({r.body["seed"] for r in server.requests}) == 4
    for call, request in zip(calls, requests):
        assert 0 < len(call.logprobs) <= request.max_new_tokens and all(lp <= 0 for lp in call.logprobs)
        assert call.completion_ids == [] and call.prompt_ids == []  # no token ids: unavailable
        assert call.finish_reason in ("stop", "length") and call.messages == request.messages
    # the server's text and logprobs are the tiny model's, greedy
    (direct,) = tiny_policy.complete([requests[1]], GREEDY)
    (via,) = policy_for(server).complete([requests[1]], GREEDY)
    assert via.text == direct.text and via.logprobs == pytest.approx(direct.logprobs)
    assert via.finish_reason == direct.finish_reason


def test_tool_messages_become_user_messages_without_native_tools(make_server):
    server = make_server()
    messages = [
        Message(role="system", content="sys"),
        Message(role="user", content="add 2 and 3"),
        Message(role="assistant", content='{"tool": "add", "arguments": {"a": 2, "b": 3}}'),
        Message(role="tool", name="add", content="5"),
    ]
    policy_for(server).complete([GenerationRequest(messages=messages, max_new_tokens=4, tools=[ADD])])
    sent = server.requests[-1].body["messages"]
    assert sent[2] == {"role": "assistant", "content": '{"tool": "add", "arguments": {"a": 2, "b": 3}}'}
    assert sent[3] == {"role": "user", "content": "Tool result (add):\n5"}
    assert "tools" not in server.requests[-1].body


def test_token_ids_when_the_server_returns_them(make_server, tiny_policy):
    server = make_server()
    request = ask()
    (call,) = policy_for(server, return_token_ids=True).complete([request])
    assert server.requests[-1].body["return_token_ids"] is True
    (direct,) = tiny_policy.complete([request], GREEDY)
    assert call.completion_ids == direct.completion_ids and len(call.logprobs) == len(call.completion_ids) > 0
    assert call.prompt_ids == direct.prompt_ids

    # vLLM's return_tokens_as_token_ids form: logprob tokens "token_id:N"
    body = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "length",
                "logprobs": {
                    "content": [{"token": "token_id:17", "logprob": -0.5}, {"token": "token_id:4", "logprob": -1.0}]
                },
            }
        ]
    }
    text, finish, prompt_ids, ids, logprobs = parse_completion(body)
    assert (text, finish, prompt_ids, ids, logprobs) == ("hi", "length", [], [17, 4], [-0.5, -1.0])


def test_no_logprobs_in_the_response(make_server):
    server = make_server(no_logprobs=True)
    (call,) = policy_for(server).complete([ask()])
    assert call.logprobs == [] and call.completion_ids == [] and isinstance(call.text, str)


def test_server_rejecting_logprobs_is_asked_without_them_once(make_server):
    server = make_server(reject_logprobs=True)
    policy = policy_for(server)
    (call,) = policy.complete([ask()])
    assert [r.body.get("logprobs") for r in server.requests] == [True, None]
    assert call.logprobs == [] and policy.logprobs is False and policy.describe()["logprobs"] is False
    policy.complete([ask(), ask("again")])
    assert len(server.requests) == 4 and all("logprobs" not in r.body for r in server.requests[2:])


def test_a_policy_from_a_spec_records_token_ids(make_server, tiny_policy):
    """What `harnessrl eval --model openai:...` builds asks for token ids, so vLLM's and serve's
    prompt and completion ids are recorded (a trajectory is trainable and comparable)."""
    server = make_server()
    (call,) = OpenAIPolicy.from_spec(server.spec(), GREEDY).complete([ask()])
    assert server.requests[-1].body["return_token_ids"] is True
    assert call.prompt_ids and len(call.completion_ids) == len(call.logprobs) > 0


@pytest.mark.parametrize("also_logprobs", [False, True])
def test_server_rejecting_token_ids_is_asked_without_them_once(make_server, also_logprobs):
    server = make_server(reject_token_ids=True, reject_logprobs=also_logprobs)
    policy = policy_for(server, return_token_ids=True)
    (call,) = policy.complete([ask()])
    sent = [(r.body.get("return_token_ids"), r.body.get("logprobs")) for r in server.requests]
    tries = [(True, True), (None, True)] + ([(None, None)] if also_logprobs else [])
    assert sent == tries
    assert call.completion_ids == [] and policy.return_token_ids is False
    assert policy.logprobs is not also_logprobs and (call.logprobs == []) is also_logprobs
    policy.complete([ask("again")])
    assert len(server.requests) == len(tries) + 1 and "return_token_ids" not in server.requests[-1].body


def test_a_rollout_client_never_drops_token_ids(make_server):
    """Training needs token ids: a server that refuses them fails the request instead."""
    from harnessrl.models.base import PolicyError
    from harnessrl.train.rollout_server import RolloutServers

    server = make_server(reject_token_ids=True)
    client = RolloutServers([server.base_url], max_retries=0).clients[0]
    with pytest.raises(PolicyError, match="return_token_ids is not supported"):
        client.complete([ask()])
    assert all(r.body.get("return_token_ids") for r in server.requests)


# ---------------------------------------------------------------------------------- failures


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_failures_are_retried_with_backoff(make_server, status):
    server = make_server(fail_first=2, fail_status=status)
    sleeps: list[float] = []
    (call,) = policy_for(server, sleeps=sleeps, max_retries=4).complete([ask()])
    assert server.completion_requests == 3 and len(call.logprobs) > 0
    # backoff 0.5 s * 2**k with jitter in [1/2, 1] of it
    assert len(sleeps) == 2 and 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0


def test_backoff_is_capped():
    policy = OpenAIPolicy("m", "http://127.0.0.1:1/v1", backoff_base_s=0.5, backoff_max_s=8.0)
    assert all(4.0 <= policy._backoff(k, None) <= 8.0 for k in range(4, 12))
    assert policy._backoff(0, 3.0) == 3.0  # Retry-After from the server wins


def test_server_that_always_fails_raises_policy_error(make_server):
    server = make_server(always_fail=True)
    sleeps: list[float] = []
    with pytest.raises(PolicyError, match=r"HTTP 500: injected failure 500 \(gave up after 3 attempts\)"):
        policy_for(server, sleeps=sleeps, max_retries=2).complete([ask()])
    assert server.completion_requests == 3 and len(sleeps) == 2


@pytest.mark.parametrize("status", [401, 404, 422])
def test_client_errors_are_not_retried(make_server, status):
    server = make_server(always_fail=True, fail_status=status)
    with pytest.raises(PolicyError, match=f"HTTP {status}"):
        policy_for(server, max_retries=3).complete([ask()])
    assert server.completion_requests == 1


def test_unreachable_server_fails_quickly():
    policy = OpenAIPolicy.from_spec(
        f"openai:m@http://127.0.0.1:{closed_port()}/v1", max_retries=2, backoff_base_s=0.01, backoff_max_s=0.02
    )
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"cannot connect to .*gave up after 3 attempts"):
        policy.complete([ask()])
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("fault", ["malformed", "no_choices"])
def test_malformed_responses_are_retried_then_policy_error(make_server, fault):
    server = make_server(**{fault: True})
    with pytest.raises(PolicyError, match="malformed response"):
        policy_for(server, max_retries=1).complete([ask()])
    assert server.completion_requests == 2


def test_malformed_bodies():
    from harnessrl.models.openai_compat import _Malformed

    ok = {"role": "assistant", "content": "x"}
    for body in [
        [],
        {"error": {"message": "boom"}},
        {"choices": [{}]},
        {"choices": [{"message": {"role": "assistant", "content": None}}]},
        {"choices": [{"message": {"content": 3}}]},
        {"choices": [{"message": {**ok, "tool_calls": [{"function": {}}]}}]},
    ]:
        with pytest.raises(_Malformed):
            parse_completion(body)
    # a reasoning model that ran out of tokens while thinking: no content, but a real outcome
    assert parse_completion({"choices": [{"message": {"content": None}, "finish_reason": "length"}]})[:2] == (
        "",
        "length",
    )


def test_one_failed_request_fails_only_itself(make_server):
    server = make_server(fail_first=1, fail_status=400)
    policy = policy_for(server, max_concurrency=1, logprobs=False)
    futures = [policy.submit(r) for r in (ask(), ask("b"), ask("c"))]
    assert isinstance(futures[0].exception(10), PolicyError) and "HTTP 400" in str(futures[0].exception())
    assert [f.result(10).messages[0].content for f in futures[1:]] == ["b", "c"]  # the others completed
    assert server.completion_requests == 3
    # complete() is all or nothing: it raises the failed request's error
    server.options.fail_first = 4
    with pytest.raises(PolicyError, match="HTTP 400"):
        policy.complete([ask(), ask("b")])


def test_a_withdrawn_request_is_not_sent_or_retried(make_server):
    """Cancelling a request's future: one waiting for a free slot is never sent, one waiting to
    retry gives up at once and frees its slot."""
    server = make_server(fail_first=1, fail_status=503)
    policy = policy_for(server, max_concurrency=1, backoff_base_s=30.0, backoff_max_s=30.0)
    retrying = policy.submit(ask("a"))
    queued = policy.submit(ask("b"))
    deadline = time.monotonic() + 10
    while server.completion_requests < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queued.cancel() and retrying.cancel()  # "a" is waiting 15-30 s to retry
    t0 = time.monotonic()
    assert policy.submit(ask("c")).result(10).messages[0].content == "c"
    assert time.monotonic() - t0 < 5.0  # the one slot was freed: "a" stopped waiting
    assert [r.body["messages"][0]["content"] for r in server.requests] == ["a", "c"]  # "b" never sent


def test_runner_fails_only_the_episode_whose_request_fails(make_server):
    tasks = get_suite("toolcalc").tasks("dev", 3)
    server = make_server(fail_matching=tasks[0].instruction)
    policy = policy_for(server, max_retries=1)
    spec = shrunk(load_harness("json-tools"), max_steps=2, max_new_tokens=8)
    runner = Runner(policy, GREEDY, progress=False, max_retries=1)
    trajs = {t.task_id: t for t in runner.run(make_jobs(tasks, [spec], 1))}
    bad = trajs[tasks[0].id]
    assert bad.termination == Termination.error and bad.retries == 1 and "HTTP 500" in bad.infra_error
    for task in tasks[1:]:
        t = trajs[task.id]
        assert t.termination != Termination.error and t.retries == 0 and t.infra_error is None
        sent = [r for r in server.requests if any(task.instruction in str(m["content"]) for m in r.body["messages"])]
        assert len(sent) == len(t.steps) > 0  # every turn asked once: the episode was never restarted


def test_request_seed_is_sent_as_31_bits(make_server):
    server = make_server()
    policy = policy_for(server)
    seed = 2**40 + 12345
    policy.complete([ask("a", seed=seed), ask("b", seed=seed), ask("c")])
    sent = {r.body["messages"][0]["content"]: r.body["seed"] for r in server.requests}
    assert sent["a"] == sent["b"] == seed & 0x7FFFFFFF
    assert sent["c"] != seed & 0x7FFFFFFF  # no seed of its own: derived from the policy's counter
    # the same seeded request sends the same seed again, whatever was sent before
    policy.complete([ask(seed=seed)])
    assert server.requests[-1].body["seed"] == seed & 0x7FFFFFFF


def test_runner_records_backend_failures_as_infra_errors(make_server):
    server = make_server(always_fail=True)
    policy = policy_for(server, max_retries=1)
    spec = shrunk(load_harness("json-tools"), max_steps=2, max_new_tokens=8)
    tasks = get_suite("toolcalc").tasks("dev", 2)
    trajs = Runner(policy, GREEDY, progress=False, max_retries=1).run(make_jobs(tasks, [spec], 1))
    assert len(trajs) == 2
    for t in trajs:
        assert t.termination == Termination.error and t.is_infra_error and t.retries == 1
        assert "model backend failed" in t.infra_error and "HTTP 500" in t.infra_error


# ---------------------------------------------------------------------------------- native tools


def test_native_tool_calls_come_back_as_data(make_server):
    server = make_server(tool_call=("add", {"a": 2, "b": 3}), tool_call_content="Adding.")
    request = ask(tools=[ADD], native_tools=True)
    (call,) = policy_for(server).complete([request])
    body = server.requests[-1].body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Add two numbers.", "parameters": ADD.parameters},
        }
    ]
    # the prose is the text, the calls are data: no tool-call text is written for the harness to parse
    assert call.text == "Adding."
    assert call.tool_calls == [ToolCall(name="add", arguments={"a": 2, "b": 3}, id="call_0")]
    assert call.tool_call_error is None and call.finish_reason == "stop"
    parsed = read_reply(get_protocol("json"), call, [ADD])
    assert parsed.error is None and parsed.thought == "Adding."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 2, "b": 3})]

    # tools are only sent when the request asks for native tools
    (plain,) = policy_for(server).complete([ask(tools=[ADD])])
    assert "tools" not in server.requests[-1].body
    assert plain.tool_calls == [ToolCall(name="add", arguments={"a": 2, "b": 3}, id="call_0")]  # (the server's)


def test_native_tool_call_with_bad_arguments_is_a_malformed_call(make_server):
    server = make_server(tool_call=("add", "{not json"))
    (call,) = policy_for(server).complete([ask(tools=[ADD], native_tools=True)])
    assert call.tool_calls is None and "add" in call.tool_call_error and "{not json" in call.tool_call_error
    parsed = read_reply(get_protocol("json", lenient=False), call, [ADD])
    assert not parsed.calls and parsed.error == call.tool_call_error  # the harness sees a malformed call, not a crash


def test_native_tools_history():
    add = ToolCall(name="add", arguments={"a": 2, "b": 3})
    messages = [
        Message(role="system", content="sys"),
        Message(role="user", content="demo"),
        Message(role="assistant", content='{"tool": "submit", "arguments": {}}'),  # text: sent as text
        Message(role="user", content="add 2 and 3"),
        Message(role="assistant", content="Adding.", tool_calls=[add]),
        Message(role="tool", name="add", content="Result of add: 5"),
        Message(role="assistant", content="no call here"),
        Message(role="tool", content="orphan"),
    ]
    sent = to_openai_messages(messages)
    assert sent[2] == {"role": "assistant", "content": '{"tool": "submit", "arguments": {}}'}
    assert sent[4] == {
        "role": "assistant",
        "content": "Adding.",
        "tool_calls": [
            {"id": "call_4_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        ],
    }
    assert sent[5] == {"role": "tool", "tool_call_id": "call_4_0", "content": "Result of add: 5"}
    assert sent[6] == {"role": "assistant", "content": "no call here"}
    assert sent[7] == {"role": "user", "content": "Tool result:\norphan"}
    # two calls in one turn and one result for both (a harness's observation): every id gets an answer
    two = [
        Message(role="user", content="u"),
        Message(role="assistant", content="", tool_calls=[add, add.model_copy(update={"id": "own"})]),
        Message(role="tool", content="r"),
    ]
    sent = to_openai_messages(two)
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool"]
    assert sent[1]["content"] is None  # no prose: OpenAI's null content
    assert [(m["tool_call_id"], m["content"]) for m in sent[2:]] == [("call_1_0", "r"), ("own", ANSWERED_ABOVE)]
    # results that name their calls (an agent's), and a call left without one before the next message
    named = [
        Message(role="assistant", content="", tool_calls=[add.model_copy(update={"id": "a"}), add]),
        Message(role="tool", content="ra", tool_call_id="a"),
        Message(role="user", content="next"),
    ]
    sent = to_openai_messages(named)
    assert [(m["role"], m.get("tool_call_id"), m["content"]) for m in sent[1:]] == [
        ("tool", "a", "ra"),
        ("tool", "call_0_1", UNANSWERED),
        ("user", None, "next"),
    ]


def test_native_tools_history_goes_through_the_server(make_server):
    server = make_server(tool_call=("add", {"a": 2, "b": 3}))
    policy = policy_for(server)
    (first,) = policy.complete([ask(tools=[ADD], native_tools=True)])
    history = [
        Message(role="user", content="What is 2 plus 3?"),
        Message(role="assistant", content=first.text, tool_calls=first.tool_calls),
        Message(role="tool", name="add", content="Result of add: 5"),
    ]
    policy.complete([GenerationRequest(messages=history, max_new_tokens=4, tools=[ADD], native_tools=True)])
    sent = server.requests[-1].body["messages"]
    assert sent[1]["tool_calls"][0]["function"]["name"] == "add" and sent[1]["tool_calls"][0]["id"] == "call_0"
    assert sent[2] == {"role": "tool", "tool_call_id": "call_0", "content": "Result of add: 5"}


def test_a_json_harness_with_native_tools_acts_on_the_servers_calls(make_server):
    """The loop takes the server's calls as they came (no text round trip), runs them, and sends
    them back as native tool calls with the result on their id."""
    server = make_server(tool_call=("add", {"a": 2, "b": 3}))
    data = shrunk(load_harness("json-tools"), max_steps=2, max_new_tokens=8).to_dict()
    data["protocol"]["native_tools"] = True
    spec = HarnessSpec.model_validate(data)
    task = get_suite("toolcalc").tasks("dev", 1)[0]
    (traj,) = Runner(policy_for(server), GREEDY, progress=False).run(make_jobs([task], [spec], 1))
    first = traj.steps[0]
    assert first.action == ActionKind.tool_calls and first.model_call.tool_calls
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert first.tool_results[0].name == "add" and first.tool_results[0].blocked is None
    second = server.requests[1].body["messages"]
    assistant = next(m for m in second if m.get("tool_calls"))
    answer = second[second.index(assistant) + 1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == assistant["tool_calls"][0]["id"] == "call_0"


# ---------------------------------------------------------------------------------- concurrency


def test_concurrency_cap(make_server):
    server = make_server(delay_s=0.15)
    policy = policy_for(server, max_concurrency=2)
    t0 = time.monotonic()
    calls = policy.complete([ask(f"question {i}") for i in range(6)])
    assert len(calls) == 6 and server.completion_requests == 6
    assert server.max_in_flight == 2
    assert time.monotonic() - t0 >= 3 * 0.15  # three waves of two
    # and the replies come back in request order
    assert [c.messages[0].content for c in calls] == [f"question {i}" for i in range(6)]


# ---------------------------------------------------------------------------------- through the runner


def test_eval_through_the_runner(make_server):
    server = make_server()
    policy = load_policy(server.spec(), GREEDY)
    specs = [shrunk(load_harness(n), max_steps=2, max_new_tokens=8) for n in ("json-tools", "react")]
    tasks = get_suite("toolcalc").tasks("dev", 2)
    trajs = Runner(policy, GREEDY, progress=False, max_in_flight=4).run(make_jobs(tasks, specs, 1))
    assert len(trajs) == 4 and {t.harness for t in trajs} == {"json-tools", "react"}
    for t in trajs:
        assert t.termination in {
            Termination.max_steps,
            Termination.submitted,
            Termination.max_tokens,
            Termination.loop_guard,
        }
        assert t.infra_error is None and t.grade is not None and t.steps
        for step in t.steps:
            mc = step.model_call
            # the spec's policy asks for token ids: recorded, one logprob per token
            assert 0 < len(mc.logprobs) == len(mc.completion_ids) <= 8 and mc.prompt_ids
    react_stops = [r.body.get("stop") for r in server.requests if "Action Input" in r.body["messages"][0]["content"]]
    assert react_stops and all(s == ["Observation:"] for s in react_stops)
