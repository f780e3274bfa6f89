"""vLLM's sampling fields through every wire format that carries them, sent by the official
clients (openai, anthropic, google-genai) to `harnessrl serve` on the tiny random model:

- each field reaches the SamplingParams / GenerationRequest the policy is given: chat completions
  (top_k, min_p, repetition_penalty, frequency_penalty, presence_penalty, seed, stop,
  stop_token_ids), the Responses API (vLLM's extras, through extra_body), the Messages API (top_k,
  stop_sequences) and the Gemini API (topK, topP, stopSequences, seed, presencePenalty,
  frequencyPenalty, candidateCount 1);
- a value out of vLLM's range is a 400 naming the field, in each dialect's error shape; what
  cannot be honoured (beam search, n > 1, logit_bias, allowed_token_ids, bad_words, structured
  outputs, top_logprobs, min_tokens, ...) stays a 400 naming it;
- settings that ask for no reasoning are served on every route (chat's reasoning_effort "none",
  Anthropic's thinking disabled or adaptive, Gemini's thinkingConfig with any budget or level
  and includeThoughts),
  and one that asks for reasoning is refused by name;
- --generation-config auto applies the model's top_k, min_p and repetition_penalty to a request
  that does not send them, as vLLM's chat completions do, instead of refusing it;
- the recording endpoint answers Gemini CLI's default generation config (topK 64, topP 0.95, a
  thinking budget with includeThoughts) and records the call;
- what the engine makes of them, in each dialect: top_k 1 at temperature 1 samples the greedy
  tokens; stop_token_ids end the completion at the token (kept in it; one outside the vocabulary
  is a 400 naming the field); stop strings cut the reply;
- the logprobs of a shaped request are those of the distribution drawn from (vLLM's
  processed_logprobs), streamed too; raw_logprobs are streamed as they are answered.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors, types

from harnessrl.harness.external import ExternalEpisode
from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec
from harnessrl.models import SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job
from harnessrl.serve import serving
from harnessrl.tasks import get_suite

WIRE = [{"role": "user", "content": "Name three prime numbers."}]


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


class Recorded:
    """The (GenerationRequest, SamplingParams) of each submit of `policy`, in order."""

    def __init__(self, policy: HFPolicy):
        self.calls: list = []
        submit = policy.submit

        def recording(request, sampling, **kw):
            self.calls.append((request, sampling))
            return submit(request, sampling, **kw)

        policy.submit = recording  # type: ignore[method-assign]

    def last(self):
        assert self.calls, "the policy was given no request"
        return self.calls[-1]


@pytest.fixture(scope="module")
def served(tokenizer):
    """(base URL ending in /v1, Recorded): one server for the module."""
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    recorded = Recorded(policy)
    with serving(policy) as url:
        yield url, recorded
    policy.close()


def root(url: str) -> str:
    return url.removesuffix("/v1")


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)


def anthropic_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root(url), api_key="k", max_retries=0)


def gemini_client(url: str, version: str | None = None) -> genai.Client:
    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=root(url), api_version=version))


# ------------------------------------------------------------------------------ chat completions


def test_chat_completions_carry_every_vllm_sampling_field(served):
    url, recorded = served
    reply = openai_client(url).chat.completions.create(
        model="tiny-random",
        messages=WIRE,
        max_tokens=3,
        temperature=0.8,
        top_p=0.9,
        seed=-3,
        stop=["zzz", "qqq"],
        frequency_penalty=0.5,
        presence_penalty=-0.25,
        reasoning_effort="none",
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2, "stop_token_ids": [7, 11]},
    )
    assert reply.choices[0].finish_reason in ("length", "stop")
    request, sampling = recorded.last()
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (0.8, 0.9, 5, 0.05)
    assert (sampling.repetition_penalty, sampling.frequency_penalty, sampling.presence_penalty) == (1.2, 0.5, -0.25)
    assert request.stop == ["zzz", "qqq"] and request.stop_token_ids == [7, 11]
    assert request.seed == 2**64 - 3  # a negative seed wraps, as a 64-bit integer does


def test_chat_completions_without_the_fields_sample_with_their_neutral_values(served):
    url, recorded = served
    openai_client(url).chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=2, stop="x")
    request, sampling = recorded.last()
    assert sampling == SamplingParams(temperature=1.0)  # OpenAI's temperature; every other field neutral
    assert request.stop == ["x"] and request.stop_token_ids == [] and request.seed is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -2),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("repetition_penalty", 0.0),
        ("frequency_penalty", 2.5),
        ("presence_penalty", -3.0),
        ("stop_token_ids", [-1]),
        ("seed", 2**64),
    ],
)
def test_chat_values_out_of_vllms_range_are_a_400_naming_the_field(served, field, value):
    with pytest.raises(openai.BadRequestError, match=field) as raised:
        openai_client(served[0]).chat.completions.create(
            model="tiny-random", messages=WIRE, max_tokens=2, extra_body={field: value}
        )
    assert raised.value.status_code == 400


@pytest.mark.parametrize("field", ["repetition_penalty", "min_p", "presence_penalty", "frequency_penalty"])
def test_a_field_that_is_not_a_finite_number_is_a_400_naming_it(served, field):
    """JSON as Python writes it may hold Infinity and NaN (the official client refuses to send
    them): the engine needs finite numbers, so they are refused before it."""
    for value in ("Infinity", "NaN"):
        body = '{"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
        body += f'"{field}": {value}}}'
        answer = httpx.post(f"{served[0]}/chat/completions", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400 and field in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"n": 2}, "n must be 1"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"length_penalty": 0.5}, "length_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
        ({"bad_words": ["no"]}, "bad_words"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        ({"min_tokens": 2}, "min_tokens"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"reasoning_effort": "minimal"}, "reasoning_effort"),
    ],
)
def test_what_the_engine_cannot_honour_is_still_refused_by_name(served, fields, named):
    url, recorded = served
    before = len(recorded.calls)
    with pytest.raises(openai.BadRequestError, match=named):
        openai_client(url).chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=2, extra_body=fields)
    assert len(recorded.calls) == before  # nothing reached the policy


def test_generation_config_auto_applies_the_models_defaults_the_engine_can_apply(tokenizer):
    """vLLM's --generation-config auto: the model's top_k, min_p and repetition_penalty apply to a
    request that does not send them (its presence and frequency penalties do not: vLLM's chat
    request has its own 0); a field the request sends wins."""
    model = tiny_random_model()
    config = model.generation_config
    config.top_k, config.min_p, config.repetition_penalty, config.presence_penalty = 20, 0.1, 1.3, 0.5
    policy = HFPolicy(model, tokenizer, name="tiny-random")
    recorded = Recorded(policy)
    try:
        with serving(policy, generation_config="auto") as url:
            client = openai_client(url)
            client.chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=2)
            defaulted = recorded.last()[1]
            client.chat.completions.create(
                model="tiny-random", messages=WIRE, max_tokens=2, extra_body={"top_k": 0, "repetition_penalty": 1.0}
            )
            sent = recorded.last()[1]
        with serving(policy) as url:  # --generation-config vllm: the neutral values
            openai_client(url).chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=2)
            neutral = recorded.last()[1]
    finally:
        policy.close()
    assert (defaulted.top_k, defaulted.min_p, defaulted.repetition_penalty) == (20, 0.1, 1.3)
    assert defaulted.presence_penalty == 0.0 and defaulted.frequency_penalty == 0.0
    assert (sent.top_k, sent.min_p, sent.repetition_penalty) == (0, 0.1, 1.0)
    assert neutral == SamplingParams(temperature=1.0)


# ---------------------------------------------------------------------------------- Responses


def test_responses_carry_vllms_sampling_extras(served):
    url, recorded = served
    openai_client(url).responses.create(
        model="tiny-random",
        input="hi",
        max_output_tokens=2,
        temperature=0.6,
        top_p=0.8,
        reasoning={"effort": "none"},
        extra_body={
            "top_k": 3,
            "min_p": 0.2,
            "repetition_penalty": 1.1,
            "frequency_penalty": 1.0,
            "presence_penalty": 0.5,
            "seed": 42,
            "stop": ["END"],
            "stop_token_ids": [9],
        },
    )
    request, sampling = recorded.last()
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (0.6, 0.8, 3, 0.2)
    assert (sampling.repetition_penalty, sampling.frequency_penalty, sampling.presence_penalty) == (1.1, 1.0, 0.5)
    assert request.seed == 42 and request.stop == ["END"] and request.stop_token_ids == [9]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", -5),
        ("min_p", 2.0),
        ("repetition_penalty", -1.0),
        ("frequency_penalty", -2.5),
        ("presence_penalty", 9.0),
        ("stop_token_ids", [-4]),
        ("seed", 2**64),
    ],
)
def test_responses_values_out_of_range_are_a_400_naming_the_field(served, field, value):
    with pytest.raises(openai.BadRequestError, match=field):
        openai_client(served[0]).responses.create(
            model="tiny-random", input="hi", max_output_tokens=2, extra_body={field: value}
        )


# ------------------------------------------------------------------------------- Messages API


def test_messages_carry_top_k_and_stop_sequences_and_disabled_thinking(served):
    url, recorded = served
    reply = anthropic_client(url).messages.create(
        model="tiny-random",
        max_tokens=3,
        messages=WIRE,
        stop_sequences=["STOP", "HALT"],
        thinking={"type": "disabled"},
        # this anthropic SDK (2.x) no longer has sampling keywords: the API's fields go in the body
        extra_body={"temperature": 0.5, "top_p": 0.7, "top_k": 4},
    )
    assert reply.stop_reason in ("max_tokens", "end_turn", "stop_sequence")
    request, sampling = recorded.last()
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.5, 0.7, 4)
    assert request.stop == ["STOP", "HALT"]


@pytest.mark.parametrize("thinking", [{"type": "disabled"}, {"type": "adaptive"}])
def test_messages_thinking_that_a_model_without_thinking_honours_is_served(served, thinking):
    """`disabled`, and `adaptive` (as much thinking as the model chooses: none here): answered
    with no thinking block."""
    reply = anthropic_client(served[0]).messages.create(
        model="tiny-random", max_tokens=3, messages=WIRE, thinking=thinking
    )
    assert [block.type for block in reply.content] == ["text"]


def test_messages_refuse_a_bad_top_k_and_thinking_by_name(served):
    client = anthropic_client(served[0])
    for field, value in (("top_k", -1), ("top_p", 0.0), ("temperature", 1.5)):  # Anthropic's temperature is 0 to 1
        with pytest.raises(anthropic.BadRequestError, match=field):
            client.messages.create(model="tiny-random", max_tokens=2, messages=WIRE, extra_body={field: value})
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(
            model="tiny-random", max_tokens=2, messages=WIRE, thinking={"type": "enabled", "budget_tokens": 1024}
        )


# --------------------------------------------------------------------------------- Gemini API


@pytest.mark.parametrize(
    "thinking",
    [
        types.ThinkingConfig(thinking_budget=-1, include_thoughts=True),
        types.ThinkingConfig(thinking_budget=0),
        types.ThinkingConfig(thinking_budget=8192, include_thoughts=True),  # Gemini CLI's, for 2.5 models
        types.ThinkingConfig(thinking_level=types.ThinkingLevel.HIGH, include_thoughts=True),  # for Gemini 3
        types.ThinkingConfig(thinking_level=types.ThinkingLevel.MINIMAL),
    ],
)
def test_gemini_generation_config_reaches_the_sampling_and_any_thinking_config_is_served(served, thinking):
    """Google answers a thinking model's request, whatever its thinkingConfig, with or without
    thought parts: a reply with none answers every budget and level."""
    url, recorded = served
    config = types.GenerateContentConfig(
        max_output_tokens=3,
        temperature=1.0,
        top_p=0.95,
        top_k=64,
        candidate_count=1,
        stop_sequences=["STOP"],
        seed=7,
        presence_penalty=0.3,
        frequency_penalty=-0.4,
        thinking_config=thinking,
    )
    client = gemini_client(url, "v1beta")  # kept: a google-genai client closes its connections when collected
    reply = client.models.generate_content(model="tiny-random", contents="hi", config=config)
    candidate = reply.candidates[0]
    assert not any(part.thought for part in candidate.content.parts or [])  # no thoughts to include
    request, sampling = recorded.last()
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (1.0, 0.95, 64)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.3, -0.4)
    assert request.stop == ["STOP"] and request.seed == 7


@pytest.mark.parametrize(
    ("generation", "named"),
    [
        ({"topK": -2}, "topK"),
        ({"presencePenalty": 2.5}, "presencePenalty"),
        ({"frequencyPenalty": -9}, "frequencyPenalty"),
        ({"candidateCount": 2}, "candidateCount"),
        ({"seed": 2**64}, "seed"),
        ({"responseLogprobs": True, "logprobs": 3}, "logprobs"),
        ({"thinkingConfig": {"thinkingBudget": -5}}, "thinkingBudget"),
        ({"thinkingConfig": {"thinkingBudget": "lots"}}, "thinkingBudget"),
        ({"thinkingConfig": {"thinkingLevel": "EXTREME"}}, "thinkingLevel"),
        ({"thinkingConfig": {"thinkingLevel": "LOW", "thinkingBudget": 1024}}, "not both"),
    ],
)
def test_gemini_bad_or_unservable_settings_are_a_400_naming_them(served, generation, named):
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 2}}
    body["generationConfig"].update(generation)
    answer = httpx.post(f"{root(served[0])}/v1beta/models/tiny-random:generateContent", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and named in error["message"], error


def test_gemini_client_reads_a_bad_top_k_as_a_client_error(served):
    config = types.GenerateContentConfig(max_output_tokens=2, top_k=-3)
    client = gemini_client(served[0])
    with pytest.raises(errors.ClientError, match="topK") as raised:
        client.models.generate_content(model="tiny-random", contents="hi", config=config)
    assert raised.value.code == 400


# ------------------------------------------------------------------------ the recording endpoint


def test_the_endpoint_records_a_call_with_gemini_clis_default_generation_config(endpoint, tokenizer):
    """Gemini CLI's first request carries topK 64, topP 0.95, temperature 1 and, for the Gemini
    model names it knows, a thinking budget with includeThoughts: answered and recorded (the run's
    sampling applies on the endpoint, not the request's)."""
    spec = parse_spec(
        {
            "name": "gemini-defaults",
            "kind": "external",
            "command": ["true"],
            "limits": {"wall_s": 60, "max_model_calls": 2, "output_bytes": 10_000},
            "tool_protocol": "hermes",
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    task = get_suite("workspace").tasks("dev", 1)[0]
    policy = ScriptedPolicy(["All done."], tokenizer=tokenizer, name="replies")
    episode = ExternalEpisode(Job(task, spec, 0), policy, SamplingParams(), lambda *a: None)
    endpoint.register(episode)
    config = types.GenerateContentConfig(
        temperature=1,
        top_p=0.95,
        top_k=64,
        thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=8192),
    )
    client = gemini_client(endpoint.url(episode), "v1beta")
    reply = client.models.generate_content(model="gemini-2.5-pro", contents="go", config=config)
    assert reply.text == "All done." and not episode.refusals
    [step] = episode.steps()
    assert step.model_call.text == "All done."


# ------------------------------------------------------------------- what the engine makes of them


def chat_ids(client: openai.OpenAI, **fields) -> tuple[list[int], str, str]:
    """(completion token ids, text, finish reason) of an 8-token chat completion."""
    extra = {"return_token_ids": True, **fields.pop("extra_body", {})}
    reply = client.chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=8, extra_body=extra, **fields)
    choice = reply.choices[0]
    return choice.model_extra["token_ids"], choice.message.content, choice.finish_reason


def test_top_k_1_samples_the_greedy_tokens_in_every_dialect(served):
    url = served[0]
    client = openai_client(url)
    greedy = chat_ids(client, temperature=0)
    sampled = chat_ids(client, temperature=1.0, seed=1)
    assert sampled[0] != greedy[0]  # at temperature 1 the tiny model's tokens differ from greedy's
    assert chat_ids(client, temperature=1.0, seed=1, extra_body={"top_k": 1})[0] == greedy[0]
    text = greedy[1]
    responses = client.responses.create(
        model="tiny-random", input=WIRE, max_output_tokens=8, temperature=1.0, extra_body={"top_k": 1, "seed": 1}
    )
    assert responses.output_text == text
    messages = anthropic_client(url).messages.create(
        model="tiny-random", max_tokens=8, messages=WIRE, extra_body={"temperature": 1.0, "top_k": 1}
    )
    assert messages.content[0].text == text
    gemini = gemini_client(url)
    config = types.GenerateContentConfig(max_output_tokens=8, temperature=1.0, top_k=1, seed=1)
    assert gemini.models.generate_content(model="tiny-random", contents=WIRE[0]["content"], config=config).text == text


def test_stop_token_ids_end_the_completion_at_the_token_kept_in_it(served):
    client = openai_client(served[0])
    ids, text, _ = chat_ids(client, temperature=0)
    at = next(k for k in range(2, len(ids)) if ids[k] not in ids[:k])  # its first occurrence
    cut, _, finish = chat_ids(client, temperature=0, extra_body={"stop_token_ids": [ids[at]]})
    assert cut == ids[: at + 1] and finish == "stop"
    answered = client.responses.create(
        model="tiny-random", input=WIRE, max_output_tokens=8, temperature=0, extra_body={"stop_token_ids": [ids[at]]}
    )
    assert answered.usage.output_tokens == at + 1 and text.startswith(answered.output_text)
    with pytest.raises(openai.BadRequestError, match="stop_token_ids: 1000000000 is not a token id"):
        chat_ids(client, extra_body={"stop_token_ids": [10**9]})


def test_stop_strings_cut_the_reply_in_every_dialect(served):
    url = served[0]
    client = openai_client(url)
    _, text, _ = chat_ids(client, temperature=0)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = text[: text.index(stop)]
    reply = client.chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=8, temperature=0, stop=stop)
    assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "stop"
    responses = client.responses.create(
        model="tiny-random", input=WIRE, max_output_tokens=8, temperature=0, extra_body={"stop": [stop]}
    )
    assert responses.output_text == expected
    messages = anthropic_client(url).messages.create(
        model="tiny-random", max_tokens=8, messages=WIRE, stop_sequences=[stop], extra_body={"temperature": 0}
    )
    assert messages.content[0].text == expected
    assert (messages.stop_reason, messages.stop_sequence) == ("stop_sequence", stop)
    gemini = gemini_client(url)
    config = types.GenerateContentConfig(max_output_tokens=8, temperature=0, stop_sequences=[stop])
    answer = gemini.models.generate_content(model="tiny-random", contents=WIRE[0]["content"], config=config)
    assert answer.text == expected and answer.candidates[0].finish_reason == types.FinishReason.STOP


def stream_logprobs(client: openai.OpenAI, **fields) -> list[float]:
    chunks = client.chat.completions.create(model="tiny-random", messages=WIRE, stream=True, logprobs=True, **fields)
    return [e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]


def test_a_shaped_requests_logprobs_are_those_of_the_distribution_drawn_from(served, tokenizer):
    """vLLM's processed_logprobs (this server's default mode): for a request whose top_k, min_p or
    penalties shape the distribution, each token's log-probability after that shaping, the
    call's sampled_logprobs; streamed the same; a neutral request keeps log softmax(z / T)."""
    from harnessrl.models import GenerationRequest
    from harnessrl.types import Message

    client = openai_client(served[0])
    fields = {"max_tokens": 6, "temperature": 0.7, "seed": 21, "extra_body": {"top_k": 5, "repetition_penalty": 1.3}}
    reply = client.chat.completions.create(model="tiny-random", messages=WIRE, logprobs=True, **fields)
    served_lp = [e.logprob for e in reply.choices[0].logprobs.content]
    reference = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    try:
        request = GenerationRequest(messages=[Message(**m) for m in WIRE], max_new_tokens=6, seed=21)
        shaped = SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.3)
        call = reference.submit(request, shaped).result(timeout=120)
    finally:
        reference.close()
    assert call.sampled_logprobs is not None and len(call.sampled_logprobs) == len(served_lp) > 0
    assert all(abs(a - b) < 1e-4 for a, b in zip(served_lp, call.sampled_logprobs))
    assert any(abs(a - b) > 1e-3 for a, b in zip(call.sampled_logprobs, call.logprobs))  # they differ
    streamed = stream_logprobs(client, **fields)
    assert len(streamed) == len(served_lp) and all(abs(a - b) < 1e-4 for a, b in zip(streamed, served_lp))


def test_raw_logprobs_are_streamed_as_they_are_answered(tokenizer):
    """--logprobs-mode raw_logprobs: a stream carries the recomputed log softmax(z), as the
    answer without a stream does (a stream used to carry the processed ones)."""
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    try:
        with serving(policy, logprobs_mode="raw_logprobs") as url:
            client = openai_client(url)
            fields = {"max_tokens": 4, "temperature": 0.5, "seed": 3}
            reply = client.chat.completions.create(model="tiny-random", messages=WIRE, logprobs=True, **fields)
            whole = [e.logprob for e in reply.choices[0].logprobs.content]
            streamed = stream_logprobs(client, **fields)
    finally:
        policy.close()
    assert len(streamed) == len(whole) == 4 and all(abs(a - b) < 1e-4 for a, b in zip(streamed, whole))
