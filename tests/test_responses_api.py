"""The Responses API, real streaming and refused requests in the episode.

- `harnessrl serve` answers POST /v1/responses as the chat completion it means (greedy: the same
  text), continues a conversation through previous_response_id, streams the events the official
  client's `responses.stream` reads, and refuses what it cannot serve with a 400 saying so;
- the recording endpoint answers the Responses API with function tools (function_call items whose
  call_id comes back in function_call_output), records each call as a chat completion is, and an
  agent program on the openai client passes a task through it, created and streamed;
- chat completions stream token by token (more than one content chunk, usage last when asked);
  the engine hands tokens out as it samples them;
- a request the endpoint refuses is kept in the trajectory and named in its termination.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from harnessrl.harness.external import ExternalEpisode
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec
from harnessrl.models import GenerationRequest, SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job, Runner, make_jobs
from harnessrl.serve import serving
from harnessrl.tasks import get_suite
from harnessrl.types import ActionKind, Message, Termination, ToolCall
from harnessrl.wire.streaming import TextDeltas

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "tests" / "fixtures" / "agents" / "responses_agent.py"
SYSTEM, USER = "You are a terse assistant.", "Name three prime numbers."
TOOL = {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def served(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    with serving(policy) as url:
        yield url, policy
    policy.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0], api_key="EMPTY", max_retries=0)


def chat_text(client, messages: list[dict], max_tokens: int = 8) -> str:
    reply = client.chat.completions.create(model="tiny-random", messages=messages, temperature=0, max_tokens=max_tokens)
    return reply.choices[0].message.content


# ------------------------------------------------------------------------------------- serve


def test_responses_create_is_the_chat_completion_it_means(client):
    response = client.responses.create(
        model="tiny-random", instructions=SYSTEM, input=USER, temperature=0, max_output_tokens=8
    )
    expected = chat_text(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
    assert response.object == "response" and response.id.startswith("resp_")
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    assert response.output_text == expected and expected
    assert response.usage.output_tokens == 8 and response.usage.input_tokens > 0
    # the random model does not stop within 8 tokens: OpenAI's answer to a reply cut at the limit
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_previous_response_id_continues_the_stored_conversation(client):
    first = client.responses.create(
        model="tiny-random", instructions=SYSTEM, input=USER, temperature=0, max_output_tokens=6
    )
    second = client.responses.create(
        model="tiny-random",
        instructions=SYSTEM,
        previous_response_id=first.id,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "And two more?"}]}],
        temperature=0,
        max_output_tokens=6,
    )
    expected = chat_text(
        client,
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": USER},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And two more?"},
        ],
        max_tokens=6,
    )
    assert second.output_text == expected and second.previous_response_id == first.id
    with pytest.raises(openai.BadRequestError, match="resp_nope"):
        client.responses.create(model="tiny-random", input="hi", previous_response_id="resp_nope", max_output_tokens=2)
    unstored = client.responses.create(model="tiny-random", input="hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(model="tiny-random", input="x", previous_response_id=unstored.id, max_output_tokens=2)


def test_responses_stream_sends_the_event_sequence_token_by_token(client):
    whole = client.responses.create(model="tiny-random", input=USER, temperature=0, max_output_tokens=10)
    with client.responses.stream(model="tiny-random", input=USER, temperature=0, max_output_tokens=10) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # cut at max_output_tokens, as OpenAI ends such a stream
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == whole.output_text
    final = events[-1].response
    assert final.output[0].content[0].text == whole.output_text and final.usage.output_tokens == 10


def test_responses_logprobs_are_included_when_asked(client):
    response = client.responses.create(
        model="tiny-random", input=USER, max_output_tokens=5, include=["message.output_text.logprobs"]
    )
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == 5 and all(lp.logprob <= 0 for lp in logprobs)


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"tools": [{"type": "web_search"}]}, "web_search"),
        ({"reasoning": {"effort": "low"}}, "does not reason"),
        ({"background": True}, "background mode"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "reasoning items"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
        ({"text": {"format": {"type": "json_object"}}}, "plain text"),
        ({"tools": [TOOL]}, "native tool calls are not supported"),  # as chat completions on this server
        ({"reasoning": {"effort": "none", "summary": "auto", "foo": 1}}, "'reasoning.foo'"),
        # a namespace's tools are served as its function and custom tools are, nothing else in it
        (
            {"tools": [TOOL, {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "web_search"}]}]},
            r"tools\[1\].tools\[0\]: 'web_search'",
        ),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"truncation": "middle"}, "truncation must be 'auto' or 'disabled'"),
        ({"tools": [{"type": "custom", "name": "x", "format": {"type": "grammar"}}]}, "a custom tool's format"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "x"}]}, r"input\[0\].input must be a string"),
    ],
)
def test_what_serve_cannot_do_is_a_400_saying_so(client, fields, named):
    body = {"model": "tiny-random", "input": "hi", "max_output_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError, match=named):
        client.post("/responses", body=body, cast_to=object)


def test_chat_completions_stream_token_by_token_with_usage_last(client):
    kw = dict(model="tiny-random", messages=[{"role": "user", "content": USER}], seed=3, temperature=0.7, max_tokens=10)
    whole = client.chat.completions.create(**kw, logprobs=True, extra_body={"return_token_ids": True})
    chunks = list(
        client.chat.completions.create(
            **kw,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
    )
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(contents) > 1 and "".join(contents) == whole.choices[0].message.content
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra or {}).get("token_ids") or []]
    assert ids == whole.choices[0].model_extra["token_ids"]
    streamed = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([e.logprob for e in whole.choices[0].logprobs.content], abs=1e-4)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])


def test_the_engine_hands_out_each_token_as_it_samples_it(served, tokenizer):
    policy = served[1]
    seen: list[tuple[int, float]] = []
    request = GenerationRequest(messages=[Message(role="user", content=USER)], max_new_tokens=7, seed=5)
    call = policy.submit(request, SamplingParams(temperature=0.8), on_token=lambda t, lp: seen.append((t, lp))).result(
        60
    )
    assert [t for t, _ in seen] == call.completion_ids and [lp for _, lp in seen] == call.logprobs


def test_text_deltas_join_to_the_cut_text(tokenizer):
    from harnessrl.models import chat

    for text, stop in [("héllo 日本語 🎉 done", []), ("abc STOP def", ["STOP"]), ("aaa</x> b", ["</x>"])]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        deltas = TextDeltas(tokenizer, stop)
        pieces = [p for t in ids if (p := deltas.push(t, -1.0)) is not None]
        cut_ids, _, cut_text, _ = chat.cut_at_stop_strings(tokenizer, ids, [0.0] * len(ids), stop)
        assert "".join(p.text for p in pieces) == cut_text
        assert [t for p in pieces for t in p.ids] == cut_ids
        assert all(p.text != "\ufffd" for p in pieces)  # half a character is never shown


# --------------------------------------------------------------------------- recording endpoint


def agent_spec(mode: str, **limits) -> ExternalHarnessSpec:
    data = {
        "name": f"responses-{mode}",
        "kind": "external",
        "command": ["{python}", str(AGENT), mode],
        "limits": {"wall_s": 60, "max_model_calls": 4, "output_bytes": 10_000, **limits},
        "tool_protocol": "hermes",
    }
    spec = parse_spec(data)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def create_file_task():
    task = next(t for t in get_suite("workspace").tasks("dev", 12) if t.family == "create_file")
    assert [c["name"] for c in task.solution] == ["write_file", "submit"]
    return task


def hermes(name: str, arguments: dict) -> str:
    return get_protocol("hermes").render_call(ToolCall(name=name, arguments=arguments))


def run(policy, spec, task):
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    [traj] = runner.run(make_jobs([task], [spec], 1))
    return traj


def episode_for(endpoint, replies: list[str], tokenizer) -> ExternalEpisode:
    policy = ScriptedPolicy(replies, tokenizer=tokenizer, name="replies")
    job = Job(create_file_task(), agent_spec("create"), 0)
    episode = ExternalEpisode(job, policy, SamplingParams(), lambda *a: None)
    endpoint.register(episode)
    return episode


def test_the_endpoint_answers_function_tools_and_their_outputs(endpoint, tokenizer):
    episode = episode_for(endpoint, ["Let me look.\n" + hermes("read_file", {}), "It says A."], tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    first = client.responses.create(model="m", input="go", tools=[TOOL], include=["message.output_text.logprobs"])
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.name == "read_file" and json.loads(call.arguments) == {}
    assert call.call_id == "call_0_0" and first.status == "completed"
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "A"}
    second = client.responses.create(model="m", previous_response_id=first.id, input=[output], tools=[TOOL])
    assert second.output_text == "It says A." and [o.type for o in second.output] == ["message"]
    one, two = episode.steps()
    assert one.action == ActionKind.tool_calls and one.tool_results[0].output == "A"
    assert two.action == ActionKind.text and two.model_call.completion_ids and two.model_call.logprobs
    # the stored conversation was rendered: the call and its result are in the second prompt
    assert [m.role for m in two.model_call.messages[-3:]] == ["user", "assistant", "tool"]
    assert "<tool_call>" in two.model_call.messages[-2].content
    assert len(first.output[0].content[0].logprobs) == one.model_call.completion_tokens


def test_the_endpoint_streams_function_calls_and_text(endpoint, tokenizer):
    episode = episode_for(endpoint, [hermes("read_file", {"path": "a"}), "Plain words here."], tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    with client.responses.stream(model="m", input="go", tools=[TOOL]) as stream:
        events = list(stream)
        first = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    [call] = first.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"path": "a"}
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "A"}
    with client.responses.stream(model="m", input=[output], previous_response_id=first.id) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        second = stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == second.output_text == "Plain words here."
    assert [s.action for s in episode.steps()] == [ActionKind.tool_calls, ActionKind.text]


def test_a_refused_request_is_recorded_in_the_episode(endpoint, tokenizer):
    episode = episode_for(endpoint, ["x"], tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="route not served"):
        client.post("/foo", body={}, cast_to=object)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="m", input="go", tools=[{"type": "web_search"}])
    assert [(r.method, r.route, r.status) for r in episode.refusals] == [
        ("POST", "/v1/foo", 404),
        ("POST", "/v1/responses", 400),
    ]
    assert "web_search" in episode.refusals[1].message and episode.calls == 0


@pytest.mark.parametrize("mode", ["create", "stream"])
def test_an_openai_client_agent_passes_a_task_through_the_responses_api(mode, tokenizer):
    task = create_file_task()
    replies = [hermes(c["name"], c["arguments"]) for c in task.solution]
    traj = run(ScriptedPolicy(replies, tokenizer=tokenizer, name="replies"), agent_spec(mode), task)
    assert traj.termination == Termination.submitted and traj.grade.passed, traj
    write, submit = traj.steps
    assert write.tool_calls[0].name == "write_file" and write.tool_results[0].output.startswith("Wrote ")
    for step in traj.steps:
        call = step.model_call
        assert call.prompt_ids and call.completion_ids and len(call.logprobs) == len(call.completion_ids)
    assert not traj.refused_requests


def test_an_agent_calling_an_unserved_route_is_an_infrastructure_error_naming_it(tokenizer, tmp_path):
    """A route the endpoint does not serve (another API dialect) is ours to answer for: the
    episode is an infrastructure error (retried, never scored 0 as the model's failure)."""
    from harnessrl.store import RunStore

    traj = run(
        ScriptedPolicy(["x"], tokenizer=tokenizer, name="replies"), agent_spec("wrong-route"), create_file_task()
    )
    assert traj.termination == Termination.error and traj.is_infra_error and not traj.steps and traj.grade is None
    assert "the agent's POST /v1/foo got 404 (route not served" in traj.infra_error
    assert "does not serve (not the model's failure)" in traj.infra_error
    [refused] = traj.refused_requests
    assert (refused.method, refused.route, refused.status, refused.after_calls) == ("POST", "/v1/foo", 404, 0)
    assert traj.meta["agent"]["stdout"].strip() == "refused: 404"
    with RunStore(tmp_path) as store:  # the refusals round-trip through the run database
        store.add(traj)
        [back] = list(store.trajectories())
    assert back.refused_requests == traj.refused_requests
    from harnessrl.report.episodes import episode_detail

    [line] = episode_detail(back, None, "run")["refused_requests"]  # what the report's viewer shows
    assert line.startswith("POST /v1/foo -> 404 after 0 model calls: route not served")


# ------------------------------------------------------------ Codex CLI's items (custom tools)

PATCH = "*** Begin Patch\n*** Add File: notes.txt\n+hello\n*** End Patch\n"
GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch" LF?'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}


@pytest.mark.parametrize(
    "reasoning", [{"effort": "none"}, {"summary": "auto"}, {"effort": "none", "summary": "detailed"}]
)
def test_reasoning_settings_that_ask_for_no_reasoning_are_served(client, reasoning):
    """What agent programs send by default in their Responses mode (Codex asks for a summary)
    asks for nothing a model without reasoning does not do: answered, with no reasoning item."""
    response = client.responses.create(model="tiny-random", input=USER, max_output_tokens=2, reasoning=reasoning)
    assert [o.type for o in response.output] == ["message"]


def test_truncation_auto_is_served_while_the_prompt_fits_and_a_prompt_past_the_context_is_a_400(client):
    """Agent programs send truncation "auto" by default (Cline's Responses provider): while the
    prompt fits nothing is dropped, so it is the same answer as "disabled"; past the context the
    request is refused either way, never cut silently."""
    response = client.responses.create(model="tiny-random", input=USER, max_output_tokens=2, truncation="auto")
    assert response.truncation == "auto" and [o.type for o in response.output] == ["message"]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.responses.create(model="tiny-random", input="word " * 9000, max_output_tokens=2, truncation="auto")


def test_encrypted_reasoning_asked_of_a_model_without_it_is_answered_as_openai_does(client):
    response = client.responses.create(
        model="tiny-random", input=USER, max_output_tokens=2, include=["reasoning.encrypted_content"], store=False
    )
    assert [o.type for o in response.output] == ["message"]  # no reasoning item
    assert response.reasoning.effort is None and response.reasoning.summary is None


def test_a_custom_tool_call_is_answered_as_a_custom_tool_call_item(endpoint, tokenizer):
    episode = episode_for(endpoint, [hermes("apply_patch", {"input": PATCH}), "Patched."], tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    first = client.responses.create(model="m", input="add notes.txt", tools=[APPLY_PATCH, TOOL])
    [call] = first.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == PATCH
    assert call.call_id == "call_0_0" and call.id == "ctc_call_0_0"
    output = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success. Updated: A notes.txt"}
    second = client.responses.create(model="m", previous_response_id=first.id, input=[output], tools=[APPLY_PATCH])
    assert second.output_text == "Patched."
    one, two = episode.steps()
    [made] = one.tool_calls
    assert made.name == "apply_patch" and made.arguments == {"input": PATCH}
    assert one.tool_results[0].output == "Success. Updated: A notes.txt"
    # the model was shown the tool as a function taking one string, with the grammar to follow
    system = one.model_call.messages[0].content
    assert '"apply_patch"' in system and "lark grammar" in system and "*** End Patch" in system
    # the call and its output are in the next prompt, in the tool-call format
    assert [m.role for m in two.model_call.messages[-3:]] == ["user", "assistant", "tool"]
    assert "Begin Patch" in two.model_call.messages[-2].content


def test_the_tools_of_a_namespace_are_served_as_codex_sends_an_mcp_servers_tools(endpoint, tokenizer):
    """A `namespace` tool (Codex groups an MCP server's tools under `mcp__<server>`): the model is
    shown each tool as `<namespace>__<tool>`, its call comes back with the tool's own name and the
    namespace, and such a call in the input is read back under the same shown name."""
    notes = {"type": "function", "name": "notes_list", "parameters": {"type": "object", "properties": {}}}
    group = {"type": "namespace", "name": "mcp__harnessrl", "description": "Task tools.", "tools": [notes]}
    episode = episode_for(endpoint, [hermes("mcp__harnessrl__notes_list", {}), "Two notes."], tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    first = client.post("/responses", body={"model": "m", "input": "list", "tools": [group, TOOL]}, cast_to=object)
    [call] = first["output"]
    assert call["type"] == "function_call" and call["name"] == "notes_list" and call["namespace"] == "mcp__harnessrl"
    made = {k: call[k] for k in ("type", "call_id", "name", "namespace", "arguments")}
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "n1, n2"}
    body = {"model": "m", "input": [{"role": "user", "content": "list"}, made, output], "tools": [group]}
    second = client.post("/responses", body=body, cast_to=object)
    assert second["output"][0]["content"][0]["text"] == "Two notes."
    one, two = episode.steps()
    [recorded] = one.tool_calls
    assert recorded.name == "mcp__harnessrl__notes_list" and one.tool_results[0].output == "n1, n2"
    system = one.model_call.messages[0].content
    assert '"name": "mcp__harnessrl__notes_list"' in system and '"name": "read_file"' in system
    assert "mcp__harnessrl__notes_list" in two.model_call.messages[-2].content  # the call, read back


def test_a_custom_tool_call_streams_its_input_events(endpoint, tokenizer):
    episode = episode_for(endpoint, [hermes("apply_patch", {"input": PATCH})], tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    with client.responses.stream(model="m", input="go", tools=[APPLY_PATCH]) as stream:
        events = list(stream)
        response = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[-5:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    added, delta, done, item_done = events[-5:-1]
    assert added.item.type == "custom_tool_call" and added.item.input == ""
    assert delta.delta == done.input == item_done.item.input == PATCH
    [call] = response.output
    assert call.type == "custom_tool_call" and call.input == PATCH and call.id == done.item_id


def test_a_conversation_sent_whole_as_codex_sends_it_is_rendered(endpoint, tokenizer):
    """Codex stores nothing on the server (store false): every request holds the whole
    conversation, developer messages, its custom tool calls and their outputs included."""
    # a scripted reply is picked by the assistant turns already in the conversation: one here
    episode = episode_for(endpoint, ["Done."] * 2, tokenizer)
    client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add notes.txt"}]},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Success."},
    ]
    response = client.responses.create(
        model="m", input=items, tools=[APPLY_PATCH], store=False, include=["reasoning.encrypted_content"]
    )
    assert response.output_text == "Done." and response.store is False
    [step] = episode.steps()
    roles = [m.role for m in step.model_call.messages]
    assert roles == ["system", "user", "assistant", "tool"]  # the developer message is the system one
    assert step.model_call.messages[0].content.startswith("Be brief.")
    assert "Begin Patch" in step.model_call.messages[2].content and step.model_call.messages[3].content


@pytest.mark.parametrize(
    "arguments, raw",
    [
        (json.dumps({"input": PATCH}), PATCH),
        (json.dumps(PATCH), PATCH),  # the model gave the string itself
        (json.dumps({"patch": PATCH}), PATCH),  # one string under another name
        ('{"a": "x", "b": "y"}', '{"a": "x", "b": "y"}'),  # not one string: as written
        ("not json", "not json"),
    ],
)
def test_a_custom_tools_input_is_read_from_the_arguments_the_format_parsed(arguments, raw):
    from harnessrl.wire.responses import custom_input

    assert custom_input(arguments) == raw
