"""Google's Gemini API on `harnessrl serve` and on the recording endpoint, through Google's
official `google-genai` client.

- serve answers generate_content as the chat completion it means (greedy: the same text, the same
  token counts and log probabilities), under /v1 (the client's default) and /v1beta (Gemini
  CLI's); count_tokens gives the prompt length the reply reports; generate_content_stream sends
  the text as the tokens come, the last chunk with finishReason and usage; a stop sequence cuts
  the reply (STOP), the limit is MAX_TOKENS;
- with a tool-call parser, a function the model calls comes back as a functionCall part (args an
  object) whose function response, named only, is matched to it and shown as the format's result;
  streamed too; declarations in Google's OpenAPI form (OBJECT, STRING) and as JSON schema;
- what cannot be served is a 400 in Google's error shape naming it (inline data, thoughts,
  built-in tools, structured output, a topK out of range, an unknown thinking level, cached content, ...), an unknown
  method a 404 NOT_FOUND;
- the recording endpoint records each Gemini call as a step (token ids and logprobs), hands out
  call ids whose name-only function responses are recorded with the call that made them, streams,
  counts tokens without recording, and answers its errors in Google's shape;
- a google-genai agent program (tests/fixtures/agents/gemini_agent.py) passes a task through an
  external episode, generating and streaming, and a request past a limit is refused with 429
  RESOURCE_EXHAUSTED and ends the episode, as for the other dialects.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from google import genai
from google.genai import errors, types
from test_serve_tools import CALL_TEXT, ScriptedHF

from harnessrl.harness.external import ExternalEpisode
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec
from harnessrl.models import SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job, Runner, make_jobs
from harnessrl.serve import serving
from harnessrl.tasks import get_suite
from harnessrl.types import ActionKind, Termination, ToolCall

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "tests" / "fixtures" / "agents" / "gemini_agent.py"
SYSTEM, USER = "You are a terse assistant.", "Name three prime numbers."
ADD = types.FunctionDeclaration(
    name="add",
    description="Add two integers.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={"a": types.Schema(type=types.Type.INTEGER), "b": types.Schema(type=types.Type.INTEGER)},
        required=["a", "b"],
    ),
)
READ = types.FunctionDeclaration(
    name="read_file",
    description="Read a file.",
    parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}}},
)
QUESTION = "What is 17 plus 25?"


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def root(url: str) -> str:
    """The base URL a google-genai client takes: the server's, without /v1 (it adds its version)."""
    assert url.endswith("/v1")
    return url[: -len("/v1")]


def gemini_client(url: str, version: str | None = None) -> genai.Client:
    options = types.HttpOptions(base_url=root(url), api_version=version)
    return genai.Client(api_key="any-key", http_options=options)


def config(**fields) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(**fields)


@pytest.fixture(scope="module")
def served(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    with serving(policy) as url:
        yield url, policy
    policy.close()


@pytest.fixture
def client(served):
    return gemini_client(served[0])


@pytest.fixture(scope="module")
def scripted(tokenizer):
    policy = ScriptedHF(tokenizer)
    with serving(policy, enable_auto_tool_choice=True, tool_call_parser="hermes") as url:
        yield gemini_client(url, "v1beta"), policy
    policy.close()


def chat_reply(url: str, messages: list[dict], max_tokens: int, **fields):
    import openai

    chat = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    return chat.chat.completions.create(
        model="tiny-random", messages=messages, temperature=0, max_tokens=max_tokens, **fields
    )


# ------------------------------------------------------------------------------------- serve


@pytest.mark.parametrize("version", [None, "v1beta"])
def test_generate_content_is_the_chat_completion_it_means(served, version):
    client = gemini_client(served[0], version)
    reply = client.models.generate_content(
        model="tiny-random",
        contents=USER,
        config=config(system_instruction=SYSTEM, temperature=0, max_output_tokens=8, response_logprobs=True),
    )
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    expected = chat_reply(served[0], messages, 8, logprobs=True)
    [candidate] = reply.candidates
    assert reply.text == expected.choices[0].message.content and reply.text
    assert candidate.content.role == "model" and [p.text for p in candidate.content.parts] == [reply.text]
    # the random model does not stop within 8 tokens
    assert candidate.finish_reason == types.FinishReason.MAX_TOKENS
    usage = reply.usage_metadata
    assert usage.candidates_token_count == 8 and usage.prompt_token_count == expected.usage.prompt_tokens
    assert usage.total_token_count == usage.prompt_token_count + 8
    assert reply.model_version == "tiny-random" and reply.response_id
    chosen = candidate.logprobs_result.chosen_candidates
    # the same tokens; their log-probabilities to float rounding (the two requests may be batched
    # with different neighbours in the engine)
    assert [c.token for c in chosen] == [t.token for t in expected.choices[0].logprobs.content]
    assert [c.log_probability for c in chosen] == pytest.approx(
        [t.logprob for t in expected.choices[0].logprobs.content], abs=1e-4
    )
    assert "".join(c.token for c in chosen) == reply.text and all(isinstance(c.token_id, int) for c in chosen)
    assert candidate.avg_logprobs == pytest.approx(sum(c.log_probability for c in chosen) / 8)
    # countTokens: the prompt the same contents take (no system instruction: countTokens of the
    # Gemini API takes contents only, or a whole generateContentRequest)
    bare = client.models.generate_content(model="tiny-random", contents=USER, config=config(max_output_tokens=1))
    counted = client.models.count_tokens(model="tiny-random", contents=USER)
    assert counted.total_tokens == bare.usage_metadata.prompt_token_count
    whole = {
        "generateContentRequest": {
            "contents": [{"role": "user", "parts": [{"text": USER}]}],
            "systemInstruction": {"parts": [{"text": SYSTEM}]},
        }
    }
    answer = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:countTokens", json=whole)
    assert answer.json() == {"totalTokens": usage.prompt_token_count}


def test_a_stop_sequence_ends_the_reply(client):
    whole = client.models.generate_content(
        model="tiny-random", contents=USER, config=config(temperature=0, max_output_tokens=12)
    ).text
    # a stop sequence the greedy reply is known to reach: a piece of its own text past the start
    sequence = whole[len(whole) // 2 :][:3]
    assert sequence.strip(), whole
    cut = client.models.generate_content(
        model="tiny-random",
        contents=USER,
        config=config(temperature=0, max_output_tokens=12, stop_sequences=[sequence]),
    )
    assert cut.text == whole[: whole.index(sequence)]
    assert cut.candidates[0].finish_reason == types.FinishReason.STOP


def test_generate_content_stream_sends_the_text_as_it_comes(client):
    settings = config(system_instruction=SYSTEM, temperature=0, max_output_tokens=10)
    whole = client.models.generate_content(model="tiny-random", contents=USER, config=settings)
    chunks = list(client.models.generate_content_stream(model="tiny-random", contents=USER, config=settings))
    assert len(chunks) > 2
    assert "".join(c.text or "" for c in chunks) == whole.text
    *before, last = chunks
    assert all(c.candidates[0].finish_reason is None for c in before)
    assert last.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert last.usage_metadata.candidates_token_count == 10
    assert last.usage_metadata.prompt_token_count == whole.usage_metadata.prompt_token_count
    # the prompt's size is known from the first chunk on
    assert all(c.usage_metadata.prompt_token_count == whole.usage_metadata.prompt_token_count for c in before)
    # with logprobs, every token of the reply comes once, in order, across the chunks
    logged = list(
        client.models.generate_content_stream(
            model="tiny-random",
            contents=USER,
            config=config(temperature=0, max_output_tokens=10, response_logprobs=True),
        )
    )
    ids = [c.token_id for chunk in logged for c in chunk.candidates[0].logprobs_result.chosen_candidates]
    assert len(ids) == 10 == logged[-1].usage_metadata.candidates_token_count


def test_a_function_call_part_and_its_response_by_name_on_serve(scripted):
    client, policy = scripted
    tools = [types.Tool(function_declarations=[ADD])]
    reply = client.models.generate_content(model="tiny-random", contents=QUESTION, config=config(tools=tools))
    text, call = reply.candidates[0].content.parts
    assert text.text == "Let me add."
    assert call.function_call.name == "add" and call.function_call.args == {"a": 17, "b": 25}
    assert reply.function_calls == [call.function_call] and call.function_call.id
    assert reply.candidates[0].finish_reason == types.FinishReason.STOP
    # the declaration in Google's OpenAPI form is shown to the model as JSON schema
    system = policy.seen[-1][0]
    assert system.role == "system" and '"name": "add"' in system.content and '"type": "integer"' in system.content
    assert "INTEGER" not in system.content
    history = [
        types.Content(role="user", parts=[types.Part(text=QUESTION)]),
        # the model's turn without the ids it was given: the response is matched by name
        types.Content(
            role="model",
            parts=[
                types.Part(text="Let me add."),
                types.Part(function_call=types.FunctionCall(name="add", args={"a": 17, "b": 25})),
            ],
        ),
        types.Content(role="user", parts=[types.Part.from_function_response(name="add", response={"output": "42"})]),
    ]
    second = client.models.generate_content(model="tiny-random", contents=history, config=config(tools=tools))
    assert second.text == "The sum is 42." and not second.function_calls
    assistant, result = policy.seen[-1][-2:]
    assert assistant.role == "assistant" and "<tool_call>" in assistant.content and '"a": 17' in assistant.content
    assert result.role == "tool" and result.content.startswith("<tool_response>") and "42" in result.content
    assert result.name == "add"
    # NONE shows no tools and parses nothing; ANY cannot be enforced here
    none = client.models.generate_content(
        model="tiny-random",
        contents=QUESTION,
        config=config(
            tools=tools,
            tool_config=types.ToolConfig(
                function_calling_config=types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.NONE)
            ),
        ),
    )
    assert none.text == CALL_TEXT and not none.function_calls
    with pytest.raises(errors.ClientError, match="cannot be enforced") as refused:
        client.models.generate_content(
            model="tiny-random",
            contents=QUESTION,
            config=config(
                tools=tools,
                tool_config=types.ToolConfig(
                    function_calling_config=types.FunctionCallingConfig(mode=types.FunctionCallingConfigMode.ANY)
                ),
            ),
        )
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"


def test_a_streamed_function_call_comes_whole_in_the_last_chunk(scripted):
    client, _ = scripted
    tools = [types.Tool(function_declarations=[ADD, READ])]
    chunks = list(
        client.models.generate_content_stream(model="tiny-random", contents=QUESTION, config=config(tools=tools))
    )
    *before, last = chunks
    assert (
        "".join(c.text or "" for c in before) + "".join(p.text or "" for p in last.candidates[0].content.parts)
        == "Let me add."
    )
    assert [(c.name, c.args) for c in last.function_calls] == [("add", {"a": 17, "b": 25})]
    assert last.candidates[0].finish_reason == types.FinishReason.STOP


INLINE = [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": ""}}]}]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"contents": INLINE}, "inline data"),
        ({"contents": [{"role": "user", "parts": [{"file_data": {"file_uri": "gs://x"}}]}]}, "file data"),
        ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "add"}}]}]}, "belongs in a model turn"),
        ({"contents": [{"role": "model", "parts": [{"text": "hm", "thought": True}]}]}, "thought"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "role"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "user", "parts": []}]}, "parts"),
        (
            {"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "add", "response": {}}}]}]},
            "answers no functionCall",
        ),
        ({"tools": [{"googleSearch": {}}]}, "googleSearch"),
        ({"tools": [{"codeExecution": {}}]}, "codeExecution"),
        ({"generationConfig": {"responseSchema": {"type": "OBJECT"}}}, "structured output"),
        ({"generationConfig": {"responseMimeType": "application/json"}}, "application/json"),
        ({"generationConfig": {"responseModalities": ["IMAGE"]}}, "IMAGE"),
        ({"generationConfig": {"topK": -2}}, "topK"),
        ({"generationConfig": {"candidateCount": 2}}, "candidateCount must be 1"),
        ({"generationConfig": {"thinkingConfig": {"thinkingBudget": -2}}}, "thinkingBudget"),
        ({"generationConfig": {"thinkingConfig": {"thinkingLevel": "EXTREME"}}}, "thinkingLevel"),
        ({"generationConfig": {"topP": 0}}, "generationConfig"),
        ({"cachedContent": "cachedContents/x"}, "cachedContent"),
        ({"toolConfig": {"functionCallingConfig": {"mode": "VALIDATED"}}}, "VALIDATED"),
    ],
)
def test_what_serve_cannot_do_is_a_400_in_googles_shape(served, fields, named):
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 2}}
    body.update(fields)
    answer = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:generateContent", json=body)
    assert answer.status_code == 400
    error = answer.json()
    assert set(error) == {"error"} and set(error["error"]) == {"code", "message", "status"}
    assert error["error"]["code"] == 400 and error["error"]["status"] == "INVALID_ARGUMENT"
    assert named in error["error"]["message"]


def test_accepted_settings_and_the_errors_google_genai_reads(served, client):
    # what changes nothing here: safety settings, thoughts to include (there are none), a zero
    # budget, a thought signature on a part, text/plain, snake_case names, the key as a parameter
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi", "thoughtSignature": "c2ln"}]}],
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
        "generation_config": {
            "max_output_tokens": 2,
            "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 0},
            "responseMimeType": "text/plain",
        },
        "labels": {"team": "x"},
    }
    answer = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:generateContent?key=k", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usageMetadata"]["candidatesTokenCount"] == 2
    # streamGenerateContent without alt=sse: a JSON array of responses
    listed = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:streamGenerateContent", json=body)
    assert isinstance(listed.json(), list) and listed.json()[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    with pytest.raises(errors.ClientError, match="inline data") as raised:
        client.models.generate_content(
            model="tiny-random", contents=[types.Part.from_bytes(data=b"\x89PNG", mime_type="image/png")]
        )
    assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
    unknown = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:embedContent", json={})
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    missing = httpx.post(f"{root(served[0])}/v1beta/models/no-such-model:generateContent", json=body)
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    malformed = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:generateContent", content=b"{not json")
    assert malformed.status_code == 400 and malformed.json()["error"]["status"] == "INVALID_ARGUMENT"
    # the OpenAI and Anthropic routes keep their shapes
    chat = httpx.post(served[0] + "/chat/completions", json={"messages": []})
    assert chat.status_code == 400 and chat.json()["error"]["type"] == "invalid_request_error"


# --------------------------------------------------------------------------- recording endpoint


def hermes(name: str, arguments: dict) -> str:
    return get_protocol("hermes").render_call(ToolCall(name=name, arguments=arguments))


def agent_spec(mode: str = "generate", **limits) -> ExternalHarnessSpec:
    data = {
        "name": f"gemini-{mode}",
        "kind": "external",
        "command": ["{python}", str(AGENT), mode],
        "limits": {"wall_s": 60, "max_model_calls": 4, "output_bytes": 10_000, **limits},
        "tool_protocol": "hermes",
    }
    spec = parse_spec(data)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def episode_for(endpoint, policy) -> tuple[ExternalEpisode, genai.Client]:
    task = get_suite("workspace").tasks("dev", 1)[0]
    episode = ExternalEpisode(Job(task, agent_spec(), 0), policy, SamplingParams(), lambda *a: None)
    endpoint.register(episode)
    return episode, gemini_client(endpoint.url(episode), "v1beta")


def test_the_endpoint_records_a_function_call_and_its_response_by_name(endpoint, tokenizer):
    replies = ["Let me look.\n" + hermes("read_file", {"path": "a.txt"}), "It says A."]
    episode, client = episode_for(endpoint, ScriptedPolicy(replies, tokenizer=tokenizer, name="replies"))
    settings = config(system_instruction=SYSTEM, tools=[types.Tool(function_declarations=[READ])])
    first = client.models.generate_content(model="m", contents="go", config=settings)
    assert first.model_version == "m" and first.candidates[0].finish_reason == types.FinishReason.STOP
    text, call = first.candidates[0].content.parts
    assert text.text == "Let me look." and call.function_call.name == "read_file"
    assert call.function_call.args == {"path": "a.txt"}
    assert call.function_call.id == "call_0_0"  # the episode's own id, which its response is matched by
    history = [
        types.Content(role="user", parts=[types.Part(text="go")]),
        first.candidates[0].content,
        # named only, as most clients write it: matched to the call of that name
        types.Content(
            role="user", parts=[types.Part.from_function_response(name="read_file", response={"output": "A"})]
        ),
    ]
    chunks = list(client.models.generate_content_stream(model="m", contents=history, config=settings))
    assert "".join(c.text or "" for c in chunks) == "It says A."
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    steps = episode.steps()
    assert len(steps) == 2
    assert steps[0].action == ActionKind.tool_calls and steps[0].tool_calls[0].name == "read_file"
    assert [r.output for r in steps[0].tool_results] == ["A"]
    for step in steps:
        made = step.model_call
        assert made.prompt_ids and made.completion_ids and len(made.logprobs) == len(made.completion_ids)
        assert made.messages[0].role == "system" and made.messages[0].content.startswith(SYSTEM)
    assert chunks[-1].usage_metadata.prompt_token_count == steps[1].model_call.prompt_tokens
    assert chunks[-1].usage_metadata.candidates_token_count == steps[1].model_call.completion_tokens


def test_the_endpoint_streams_a_real_model_counts_tokens_and_answers_errors_in_googles_shape(endpoint, served):
    episode, client = episode_for(endpoint, served[1])
    counted = client.models.count_tokens(model="m", contents=USER)
    assert not episode.steps()  # counting is not a model call
    settings = config(max_output_tokens=6, response_logprobs=True)
    chunks = list(client.models.generate_content_stream(model="m", contents=USER, config=settings))
    [step] = episode.steps()
    last = chunks[-1]
    assert last.usage_metadata.prompt_token_count == counted.total_tokens == step.model_call.prompt_tokens
    assert last.usage_metadata.candidates_token_count == step.model_call.completion_tokens
    assert "".join(c.text or "" for c in chunks) == step.model_call.text
    logged = [c for chunk in chunks for c in chunk.candidates[0].logprobs_result.chosen_candidates]
    assert [c.token_id for c in logged] == step.model_call.completion_ids
    assert [c.log_probability for c in logged] == pytest.approx(step.model_call.logprobs)
    with pytest.raises(errors.ClientError, match="inline data") as raised:
        client.models.generate_content(
            model="m", contents=[types.Part.from_bytes(data=b"\x89PNG", mime_type="image/png")]
        )
    assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
    [refusal] = episode.refusals
    assert refusal.route == "/v1beta/models/m:generateContent" and refusal.status == 400
    gone = gemini_client(endpoint.url(episode).replace(episode.token, "nope"))
    with pytest.raises(errors.ClientError) as missing:
        gone.models.generate_content(model="m", contents="x")
    assert missing.value.code == 404 and missing.value.status == "NOT_FOUND"
    unserved = httpx.post(endpoint.url(episode).removesuffix("/v1") + "/v1beta/models/m:embedContent", json={})
    assert unserved.status_code == 404 and "route not served" in unserved.json()["error"]["message"]
    assert "generateContent" in unserved.json()["error"]["message"]


def test_a_backend_failure_is_a_500_in_googles_shape_and_an_error_chunk(endpoint, tokenizer):
    """The policy fails (its script is exhausted): the request gets Google's INTERNAL, the stream
    an error chunk that google-genai raises, and the episode records a backend failure."""
    episode, client = episode_for(endpoint, ScriptedPolicy([], tokenizer=tokenizer, name="empty"))
    with pytest.raises(errors.ServerError, match="model backend failed") as raised:
        client.models.generate_content(model="m", contents="x")
    assert raised.value.code == 500 and raised.value.status == "INTERNAL"
    episode2, client2 = episode_for(endpoint, ScriptedPolicy([], tokenizer=tokenizer, name="empty"))
    with pytest.raises(errors.ServerError, match="model backend failed"):
        list(client2.models.generate_content_stream(model="m", contents="x"))
    assert episode.infra_error and episode2.infra_error


# ---------------------------------------------------------------------- an agent program


def create_file_task():
    task = next(t for t in get_suite("workspace").tasks("dev", 12) if t.family == "create_file")
    assert [c["name"] for c in task.solution] == ["write_file", "submit"]
    return task


def run(policy, spec, task):
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    [traj] = runner.run(make_jobs([task], [spec], 1))
    return traj


@pytest.mark.parametrize("mode", ["generate", "stream"])
def test_a_google_genai_agent_passes_a_task_through_the_gemini_api(mode, tokenizer):
    task = create_file_task()
    replies = [hermes(c["name"], c["arguments"]) for c in task.solution]
    traj = run(ScriptedPolicy(replies, tokenizer=tokenizer, name="replies"), agent_spec(mode), task)
    agent = traj.meta["agent"]
    assert traj.termination == Termination.submitted and traj.grade.passed, (traj.termination_detail, agent)
    write, submit = traj.steps
    assert write.tool_calls[0].name == "write_file" and write.tool_results[0].output.startswith("Wrote ")
    assert submit.tool_calls[0].name == "submit"
    for step in traj.steps:
        made = step.model_call
        assert made.prompt_ids and made.completion_ids and len(made.logprobs) == len(made.completion_ids)
        # the agent's two declarations (one in Google's OpenAPI form) shown to the model
        assert '"name": "write_file"' in made.messages[0].content and '"type": "string"' in made.messages[0].content
    assert not traj.refused_requests


def test_a_request_past_a_limit_is_refused_with_resource_exhausted(tokenizer):
    policy = ScriptedPolicy(["one two three"] * 10, tokenizer=tokenizer, name="replies")
    traj = run(policy, agent_spec("greedy", max_model_calls=2), create_file_task())
    assert traj.termination == Termination.max_steps and not traj.submitted
    assert len(traj.steps) == 2 and "limits.max_model_calls" in traj.termination_detail
    stdout = traj.meta["agent"]["stdout"]
    assert stdout.startswith("refused: 429 RESOURCE_EXHAUSTED") or traj.meta["agent"]["stopped"], stdout
    # google-genai asks under /v1 by default
    [refused] = traj.refused_requests
    assert (refused.method, refused.status, refused.after_calls) == ("POST", 429, 2)
    assert refused.route.startswith("/v1/models/") and refused.route.endswith(":generateContent")
