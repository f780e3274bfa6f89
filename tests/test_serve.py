"""`harnessrl serve` through real HTTP: a uvicorn server in a thread (`serving`) answering with the
tiny random model, asked by the official openai client and by our own OpenAIPolicy. What it
answers must be exactly what the policy gives in process: text, token ids and logprobs for the
same messages, seed and sampling; LoRA adapters loaded through the routes must give exactly
`HFPolicy.from_adapter`'s logprobs, and an in-place reload the new adapter's."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future

import openai
import pytest
import torch
from helpers import ADMIN_KEY
from typer.testing import CliRunner

from harnessrl.models import GenerationRequest, PolicyError, SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.openai_compat import OpenAIPolicy
from harnessrl.serve import ServedModels, serving
from harnessrl.types import Message

try:  # the HTTP client the openai package is built on (httpx2 from openai 3 on)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai
    import httpx

MESSAGES = [
    Message(role="system", content="You are a terse assistant."),
    Message(role="user", content="Name three prime numbers."),
]
WIRE = [{"role": m.role, "content": m.content} for m in MESSAGES]
TOL = 1e-5
# six rows decoded together round differently from one alone (the tiny model's logits are large)
BATCH_TOL = 1e-4


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def served(tokenizer):
    """(base URL, the served HFPolicy): one server for the module."""
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    with serving(policy, max_loras=2, admin_key=ADMIN_KEY) as url:
        yield url, policy
    policy.close()


@pytest.fixture(scope="module")
def reference(tokenizer):
    """An in-process policy over the same weights, never served."""
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    yield policy
    policy.close()


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0], api_key="EMPTY", max_retries=0)


def in_process(policy: HFPolicy, *, seed: int, temperature: float, top_p: float = 1.0, max_new_tokens: int = 12):
    request = GenerationRequest(messages=MESSAGES, max_new_tokens=max_new_tokens, seed=seed)
    return policy.submit(request, SamplingParams(temperature=temperature, top_p=top_p)).result(timeout=120)


def ask(client, model: str = "tiny-random", *, seed: int = 11, temperature: float = 0.7, **kw):
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(
        model=model,
        messages=WIRE,
        seed=seed,
        temperature=temperature,
        logprobs=True,
        extra_body={"return_token_ids": True, **kw.pop("extra_body", {})},
        **kw,
    )


def served_logprobs(response) -> list[float]:
    return [entry.logprob for entry in response.choices[0].logprobs.content]


def close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def post(url: str, route: str, body) -> httpx.Response:
    """POST with the admin key the servers of this module are started with (the adapter routes
    need it; the others ignore it)."""
    key = {"authorization": f"Bearer {ADMIN_KEY}"}
    if isinstance(body, (bytes, str)):
        headers = {"content-type": "application/json", **key}
        return httpx.post(url + route, content=body, headers=headers, timeout=120)
    return httpx.post(url + route, json=body, headers=key, timeout=120)


# ------------------------------------------------------------------------------------ answers


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
def test_completion_is_the_in_process_completion(client, reference, temperature, top_p):
    response = ask(client, seed=1234, temperature=temperature, top_p=top_p)
    call = in_process(reference, seed=1234, temperature=temperature, top_p=top_p)
    choice = response.choices[0]
    extra = choice.model_extra or {}
    assert choice.message.role == "assistant" and choice.message.content == call.text
    assert extra["token_ids"] == call.completion_ids and len(call.completion_ids) > 0
    assert (response.model_extra or {})["prompt_token_ids"] == call.prompt_ids
    # vLLM's processed logprobs: of the distribution drawn from, renormalised over the top_p nucleus
    assert close(served_logprobs(response), call.sampled_logprobs or call.logprobs)
    assert (call.sampled_logprobs is not None) == (top_p < 1)
    assert choice.finish_reason == call.finish_reason
    tokens = [entry.token for entry in choice.logprobs.content]
    assert tokens == [reference.tokenizer.decode([i]) for i in call.completion_ids]
    assert all(
        entry.bytes == list(entry.token.encode()) and entry.top_logprobs == [] for entry in choice.logprobs.content
    )
    assert response.usage.prompt_tokens == len(call.prompt_ids)
    assert response.usage.completion_tokens == len(call.completion_ids)
    assert response.object == "chat.completion" and response.model == "tiny-random" and response.id


def test_the_seed_decides_the_sample(client):
    first, again, other = (ask(client, seed=s, max_tokens=16) for s in (5, 5, 6))
    assert first.choices[0].model_extra["token_ids"] == again.choices[0].model_extra["token_ids"]
    assert first.choices[0].model_extra["token_ids"] != other.choices[0].model_extra["token_ids"]


def test_token_ids_only_when_asked_and_tokens_as_ids(client):
    plain = client.chat.completions.create(model="tiny-random", messages=WIRE, max_tokens=4, seed=1)
    assert "token_ids" not in (plain.choices[0].model_extra or {})
    assert "prompt_token_ids" not in (plain.model_extra or {})
    assert plain.choices[0].logprobs is None
    as_ids = ask(client, seed=3, max_tokens=6, extra_body={"return_tokens_as_token_ids": True})
    ids = as_ids.choices[0].model_extra["token_ids"]
    assert [e.token for e in as_ids.choices[0].logprobs.content] == [f"token_id:{i}" for i in ids]


def test_stop_strings_and_max_completion_tokens(client, reference):
    full = in_process(reference, seed=21, temperature=0.0, max_new_tokens=12)
    cut = full.text.split()[2]  # a word of the greedy completion: the reply stops before it
    response = client.chat.completions.create(
        model="tiny-random", messages=WIRE, temperature=0, max_completion_tokens=12, stop=[cut]
    )
    assert response.choices[0].finish_reason == "stop"
    assert response.choices[0].message.content == full.text[: full.text.index(cut)]


def test_openai_policy_through_the_server_gets_the_in_process_tokens(served, reference):
    url = served[0]
    policy = OpenAIPolicy.from_spec(f"openai:tiny-random@{url}", return_token_ids=True, max_retries=0)
    messages = [*MESSAGES, Message(role="assistant", content="2, 3"), Message(role="tool", content="5", name="calc")]
    request = GenerationRequest(messages=messages, max_new_tokens=10, seed=987654)
    sampling = SamplingParams(temperature=0.7)
    (remote,) = policy.complete([request], sampling)
    local = reference.submit(request, sampling).result(timeout=120)
    assert remote.completion_ids == local.completion_ids and len(local.completion_ids) > 0
    assert remote.prompt_ids == local.prompt_ids
    assert remote.text == local.text
    assert close(remote.logprobs, local.logprobs)


def test_stream_sends_the_completion_as_chunks(client):
    whole = ask(client, seed=8)
    stream = client.chat.completions.create(
        model="tiny-random",
        messages=WIRE,
        seed=8,
        temperature=0.7,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content and finish == [whole.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_health_and_models(served):
    url = served[0]
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    models = httpx.get(url + "/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny-random"]
    assert models["data"][0]["parent"] is None and models["data"][0]["object"] == "model"


# ------------------------------------------------------------------------------- concurrency


def test_concurrent_requests_join_one_batch(tokenizer, reference):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    seeds = [101, 102, 103, 104, 105, 106]
    results: dict[int, object] = {}
    try:
        with serving(policy) as url:
            client = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0)

            def one(seed: int) -> None:
                results[seed] = ask(client, seed=seed, max_tokens=8)

            threads = [threading.Thread(target=one, args=(s,)) for s in seeds]
            with policy.paused():  # no step runs: every request must reach the engine's queue first
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 60
                while policy.engine_stats()["requests"] < len(seeds):
                    assert time.monotonic() < deadline, "the requests did not reach the engine together"
                    time.sleep(0.02)
            for t in threads:
                t.join(120)
        assert policy.engine_stats()["peak_batch"] == len(seeds)
    finally:
        policy.close()
    for seed in seeds:
        call = in_process(reference, seed=seed, temperature=0.7, max_new_tokens=8)
        assert results[seed].choices[0].model_extra["token_ids"] == call.completion_ids
        assert close(served_logprobs(results[seed]), call.logprobs, BATCH_TOL)


def test_a_failed_request_gets_500_and_only_it(served, monkeypatch):
    url, policy = served
    real_submit = policy.submit

    def submit(request, sampling=None):
        if any("FAIL" in m.content for m in request.messages):
            failed: Future = Future()
            failed.set_exception(PolicyError("tiny-random: generation failed: injected"))
            return failed
        return real_submit(request, sampling)

    monkeypatch.setattr(policy, "submit", submit)
    bodies = [
        {"model": "tiny-random", "messages": [{"role": "user", "content": text}], "max_tokens": 4, "seed": 1}
        for text in ("hello", "please FAIL", "again")
    ]
    responses: list = [None] * len(bodies)

    def send(i: int) -> None:
        responses[i] = post(url, "/chat/completions", bodies[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r.status_code for r in responses] == [200, 500, 200]
    error = responses[1].json()["error"]
    assert "injected" in error["message"] and error["type"] == "server_error" and error["code"] == 500


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"n": 2}, 400, "n must be 1"),
        ({"model": "nope"}, 404, "does not exist"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400, "tool"),
        ({"top_logprobs": 3, "logprobs": True}, 400, "top_logprobs"),
        ({"frequency_penalty": 2.5}, 400, "frequency_penalty"),
        ({"top_k": -2}, 400, "top_k"),
        ({"temperature": -1}, 400, "temperature"),
        ({"messages": []}, 400, "at least one message"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "robot"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "text parts"),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi " * 9000}]}, 400, "maximum context length is 8192"),
    ],
)
def test_bad_requests_get_openai_errors(served, body, status, words):
    full = {"model": "tiny-random", "messages": WIRE, "max_tokens": 4, **body}
    response = post(served[0], "/chat/completions", full)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["code"] == status and error["type"]


def test_unknown_fields_are_ignored_and_vllms_unservable_fields_refused_unless_neutral(served, reference):
    """As vLLM 0.33: a field no one defines is ignored (its request models allow extra fields);
    vLLM's sampling fields the engine applies are served (neutral: the same reply), and those it
    has no equivalent for (min_tokens, ignore_eos, beam search, ...) are refused unless neutral."""
    base = {"model": "tiny-random", "messages": WIRE, "max_tokens": 4, "seed": 5, "temperature": 0.7}
    plain = post(served[0], "/chat/completions", base).json()["choices"][0]["message"]
    unknown = post(served[0], "/chat/completions", {**base, "not_a_field": 1, "user": "someone"})
    assert unknown.status_code == 200 and unknown.json()["choices"][0]["message"] == plain
    neutral = {**base, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0}
    neutral.update(frequency_penalty=0.0, min_tokens=0, ignore_eos=False, stop_token_ids=[], use_beam_search=False)
    response = post(served[0], "/chat/completions", neutral)
    assert response.status_code == 200 and response.json()["choices"][0]["message"] == plain
    for field, value in [("min_tokens", 2), ("ignore_eos", True), ("use_beam_search", True), ("bad_words", ["a"])]:
        refused = post(served[0], "/chat/completions", {**base, field: value})
        assert refused.status_code == 400 and field in refused.json()["error"]["message"], (field, refused.text)


def test_generation_config_auto_and_raw_logprobs_emulate_vllms_defaults(tokenizer):
    """--generation-config auto: unsent fields default from the model's generation config (a top_k
    too, now that the engine applies it: tests/test_wire_sampling.py checks what it is given).
    --logprobs-mode raw_logprobs: log softmax of the untempered logits, vLLM's default."""
    import torch

    model = tiny_random_model()
    model.generation_config.temperature = 0.5
    policy = HFPolicy(model, tokenizer, name="tiny-random")
    body = {"model": "tiny-random", "messages": WIRE, "max_tokens": 6, "seed": 9, "logprobs": True}
    body["return_token_ids"] = True
    try:
        with serving(policy) as url:  # the defaults: --generation-config vllm, processed logprobs
            at_1 = post(url, "/chat/completions", body).json()
            at_half = post(url, "/chat/completions", {**body, "temperature": 0.5}).json()
        with serving(policy, generation_config="auto", logprobs_mode="raw_logprobs") as url:
            auto = post(url, "/chat/completions", body).json()
            model.generation_config.top_k = 20
            defaulted = post(url, "/chat/completions", body)
            sent = post(url, "/chat/completions", {**body, "top_k": 0})
    finally:
        policy.close()
    # auto took T=0.5 from the generation config: the tokens sampled at 0.5
    assert auto["choices"][0]["token_ids"] == at_half["choices"][0]["token_ids"] != at_1["choices"][0]["token_ids"]
    ids = auto["prompt_token_ids"] + auto["choices"][0]["token_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, len(auto["prompt_token_ids"]) - 1 : -1]
    raw = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids[len(auto["prompt_token_ids"]) :])[:, None])
    served_raw = [e["logprob"] for e in auto["choices"][0]["logprobs"]["content"]]
    processed = [e["logprob"] for e in at_half["choices"][0]["logprobs"]["content"]]
    assert close(served_raw, raw.squeeze(-1).tolist()) and not close(served_raw, processed)
    assert defaulted.status_code == 200 and sent.status_code == 200


def test_malformed_bodies_are_400(served):
    for raw in (b"{not json", b"[1, 2]", b'{"model": "tiny-random"}'):
        response = post(served[0], "/chat/completions", raw)
        assert response.status_code == 400 and "error" in response.json(), raw


def test_text_parts_and_developer_role_render_like_plain_messages(client, reference):
    parts = [
        {"role": "developer", "content": MESSAGES[0].content},
        {"role": "user", "content": [{"type": "text", "text": MESSAGES[1].content}]},
    ]
    response = client.chat.completions.create(
        model="tiny-random", messages=parts, max_tokens=4, temperature=0, extra_body={"return_token_ids": True}
    )
    call = in_process(reference, seed=0, temperature=0.0, max_new_tokens=4)
    assert response.model_extra["prompt_token_ids"] == call.prompt_ids
    assert response.choices[0].model_extra["token_ids"] == call.completion_ids


# --------------------------------------------------------------------------------------- LoRA


def make_adapter(folder, seed: int):
    """A peft LoRA adapter on tiny-random with random (non-zero) A and B, naming its base."""
    from peft import LoraConfig, get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(
            tiny_random_model(),
            LoraConfig(
                r=4,
                lora_alpha=8,
                target_modules=["q_proj", "v_proj", "o_proj"],
                init_lora_weights=False,
                task_type="CAUSAL_LM",
            ),
        )
    model.save_pretrained(str(folder))
    (folder / "harnessrl.json").write_text(json.dumps({"base_model": "tiny-random"}))
    return folder


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return make_adapter(root / "one", 1), make_adapter(root / "two", 2)


def test_lora_load_reload_in_place_and_unload(served, client, adapters, reference):
    url = served[0]
    one, two = adapters
    base = served_logprobs(ask(client, seed=31))

    assert post(url, "/load_lora_adapter", {"lora_name": "ad", "lora_path": str(one)}).status_code == 200
    models = {m["id"]: m for m in httpx.get(url + "/models").json()["data"]}
    assert models["ad"]["parent"] == "tiny-random" and models["ad"]["root"] == str(one.resolve())
    with_one = ask(client, "ad", seed=31)
    expected_one = in_process(HFPolicy.from_adapter(one), seed=31, temperature=0.7)
    assert with_one.choices[0].model_extra["token_ids"] == expected_one.completion_ids
    assert close(served_logprobs(with_one), expected_one.logprobs)
    assert not close(served_logprobs(with_one), base)  # the adapter changes the model
    assert close(served_logprobs(ask(client, seed=31)), base)  # the base is untouched

    again = post(url, "/load_lora_adapter", {"lora_name": "ad", "lora_path": str(two)})
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]

    # the same prompt again after an in-place reload: nothing of adapter one may be reused
    reload = post(url, "/load_lora_adapter", {"lora_name": "ad", "lora_path": str(two), "load_inplace": True})
    assert reload.status_code == 200, reload.text
    with_two = ask(client, "ad", seed=31)
    expected_two = in_process(HFPolicy.from_adapter(two), seed=31, temperature=0.7)
    assert with_two.choices[0].model_extra["token_ids"] == expected_two.completion_ids
    assert close(served_logprobs(with_two), expected_two.logprobs)
    assert not close(expected_two.logprobs, expected_one.logprobs)

    assert post(url, "/unload_lora_adapter", {"lora_name": "ad"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        ask(client, "ad")
    assert post(url, "/unload_lora_adapter", {"lora_name": "ad"}).status_code == 404
    assert [m["id"] for m in httpx.get(url + "/models").json()["data"]] == ["tiny-random"]


def test_lora_route_errors(tokenizer, adapters, tmp_path):
    one, _ = adapters
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    not_adapter = tmp_path / "empty"
    not_adapter.mkdir()
    try:
        with serving(policy, max_loras=1, admin_key=ADMIN_KEY) as url:
            for body, words in [
                ({"lora_name": "tiny-random", "lora_path": str(one)}, "base model"),
                ({"lora_name": "c", "lora_path": str(tmp_path / "missing")}, "not a folder"),
                ({"lora_name": "c", "lora_path": str(not_adapter)}, "adapter_config.json"),
                ({"lora_name": "c"}, "lora_path"),
            ]:
                response = post(url, "/load_lora_adapter", body)
                assert response.status_code == 400 and words in response.json()["error"]["message"], response.text
    finally:
        policy.close()


def test_max_loras_is_an_lru_of_merged_copies_as_in_vllm(tokenizer, adapters, tmp_path):
    """vLLM registers any number of adapter names and holds at most --max-loras (--max-cpu-loras)
    of them, evicting the least recently used and reloading an evicted one from its path."""
    import shutil

    one, two = adapters
    moved = shutil.copytree(one, tmp_path / "one")
    models = ServedModels(HFPolicy(tiny_random_model(), tokenizer, name="tiny-random"), max_loras=1)
    try:
        with serving(models, admin_key=ADMIN_KEY) as url:
            assert post(url, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(moved)}).status_code == 200
            body = {"model": "a", "messages": WIRE, "max_tokens": 4, "seed": 3, "logprobs": True}
            first = post(url, "/chat/completions", body).json()["choices"][0]
            # a second adapter is not refused: it takes the only slot, "a" is evicted
            assert post(url, "/load_lora_adapter", {"lora_name": "b", "lora_path": str(two)}).status_code == 200
            assert models.resident_adapters() == ["b"]
            assert sorted(m["id"] for m in httpx.get(url + "/models").json()["data"]) == ["a", "b", "tiny-random"]
            # a request for "a" merges it again from its folder (and evicts "b"): the same answer
            again = post(url, "/chat/completions", body).json()["choices"][0]
            assert again["message"] == first["message"] and again["logprobs"] == first["logprobs"]
            assert models.resident_adapters() == ["a"]
            # evicted and its folder gone: it cannot be reloaded (vLLM reloads from the path too)
            assert post(url, "/chat/completions", {**body, "model": "b"}).status_code == 200
            shutil.rmtree(moved)
            gone = post(url, "/chat/completions", body)
            assert gone.status_code == 404 and "No adapter found" in gone.json()["error"]["message"]
    finally:
        models.close()
        models.base.policy.close()


def test_an_adapter_above_max_lora_rank_is_refused_as_vllm_does(tokenizer, adapters):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    try:
        with serving(policy, max_lora_rank=1, admin_key=ADMIN_KEY) as url:  # the adapters are rank 4
            refused = post(url, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapters[0])})
            # vLLM 0.33: its engine's ValueError comes back as a 500 with this message
            assert refused.status_code == 500
            assert "LoRA rank 4 is greater than max_lora_rank 1." in refused.json()["error"]["message"]
            assert "--max-lora-rank 8" in refused.json()["error"]["message"]
            assert [m["id"] for m in httpx.get(url + "/models").json()["data"]] == ["tiny-random"]
        with serving(policy, max_lora_rank=8, admin_key=ADMIN_KEY) as url:
            assert post(url, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapters[0])}).status_code == 200
        with pytest.raises(ValueError, match="max_lora_rank must be one of 1, 8, 16"):
            ServedModels(policy, max_lora_rank=4)
    finally:
        policy.close()


def test_unload_waits_for_the_adapters_requests_in_flight(tokenizer, adapters):
    models = ServedModels(HFPolicy(tiny_random_model(), tokenizer, name="tiny-random"), max_loras=1)
    try:
        with serving(models, admin_key=ADMIN_KEY) as url:
            assert post(url, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapters[0])}).status_code == 200
            adapter = next(e.policy for e in models.entries() if e.name == "a")
            body = {"model": "a", "messages": WIRE, "max_tokens": 4, "seed": 2}
            answers: list = []
            sender = threading.Thread(target=lambda: answers.append(post(url, "/chat/completions", body)))
            with adapter.paused():  # the request waits in the adapter's engine while it is unloaded
                sender.start()
                deadline = time.monotonic() + 60
                while adapter.engine_stats()["requests"] < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                assert post(url, "/unload_lora_adapter", {"lora_name": "a"}).status_code == 200
                assert post(url, "/chat/completions", body).status_code == 404
                assert adapter.engine_stats() != {}  # still open: a request is in flight
            sender.join(120)
            assert answers[0].status_code == 200 and answers[0].json()["choices"][0]["finish_reason"] == "length"
            assert adapter.engine_stats() == {}  # closed once its last request had its answer
    finally:
        models.close()
        models.base.policy.close()


def test_lora_modules_at_start(tokenizer, adapters):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    try:
        with serving(policy, served_model_name="base", lora_modules={"one": str(adapters[0])}) as url:
            models = {m["id"]: m["parent"] for m in httpx.get(url + "/models").json()["data"]}
            assert models == {"base": None, "one": "base"}
    finally:
        policy.close()


# ---------------------------------------------------------------------------------- the CLI


def test_only_local_models_are_served():
    for spec in ("openai:m@http://127.0.0.1:1/v1", "oracle", "no-such-model"):
        with pytest.raises(ValueError, match="local models only"):
            ServedModels.from_spec(spec)
        with pytest.raises(ValueError, match="local models only"):
            with serving(spec):
                pass


def test_cli_help_and_refusals():
    from harnessrl.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--help"])
    assert result.exit_code == 0 and "--max-loras" in result.output and "--served-model-name" in result.output
    remote = runner.invoke(app, ["serve", "--model", "openai:m@http://127.0.0.1:1/v1"])
    assert remote.exit_code == 2 and "local models only" in remote.output
    bad = runner.invoke(app, ["serve", "--model", "tiny-random", "--lora-modules", "nopath"])
    assert bad.exit_code == 2 and "NAME=PATH" in bad.output


def test_cli_takes_vllms_sampling_and_lora_rank_options_and_refuses_values_vllm_refuses():
    from harnessrl.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["serve", "--help"])
    for flag in ("--max-lora-rank", "--generation-config", "--logprobs-mode"):
        assert flag in result.output
    for args, message in (
        (["--max-lora-rank", "24"], "--max-lora-rank must be one of 1, 8, 16, 32"),
        (["--generation-config", "model"], "--generation-config must be auto or vllm"),
        (["--logprobs-mode", "processed"], "--logprobs-mode must be raw_logprobs or processed_logprobs"),
    ):
        bad = runner.invoke(app, ["serve", "--model", "tiny-random", *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_cli_options_reach_the_served_models(monkeypatch):
    import harnessrl.serve as serve_module
    from harnessrl.cli import app

    seen = {}

    def capture(models, **kwargs):
        seen.update(rank=models.max_lora_rank, config=models.generation_config, mode=models.logprobs_mode)

    monkeypatch.setattr(serve_module, "run_server", capture)
    args = ["serve", "--model", "tiny-random", "--max-lora-rank", "32", "--generation-config", "auto"]
    result = CliRunner().invoke(app, [*args, "--logprobs-mode", "raw_logprobs"])
    assert result.exit_code == 0, result.output
    assert seen == {"rank": 32, "config": "auto", "mode": "raw_logprobs"}
