"""vLLM's sampling fields in the engine and its policies: top_k, min_p, the repetition, frequency and
presence penalties and stop_token_ids, with vLLM's meaning and order (penalties on the raw
logits, greedy, temperature, min_p, top_k, top_p), against hand-computed references on fixed
logits and through the engine on the tiny random model; the two log-probabilities (tempered and
sampled-distribution); neutral values bit-identical to the sampler without them; bad values
refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from harnessrl.models import GenerationRequest, SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineRequest
from harnessrl.models.hf import HFPolicy
from harnessrl.models.openai_compat import OpenAIPolicy
from harnessrl.models.sampling import Penalties, RowSampler, generator, sample, shaped_logprobs
from harnessrl.train.episode_sequence import episode_sequence
from harnessrl.types import ActionKind, Message, ModelCall, Step, Termination, Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")

Z = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _draws(n: int = 4000, logits: torch.Tensor = Z, **fields) -> dict[int, list[float]]:
    """token -> (count, tempered log-prob, sampled log-prob) over n seeds of a fresh RowSampler."""
    seen: dict[int, list[float]] = {}
    temperature = fields.pop("temperature", 1.0)
    for seed in range(n):
        token, logprob, sampled = RowSampler(seed, temperature, **fields).draw(logits)
        assert sampled is not None
        entry = seen.setdefault(token, [0, logprob, sampled])
        entry[0] += 1
        assert entry[1] == logprob and entry[2] == sampled  # one value per token, whatever the seed
    return seen


def _kept_distribution(x: torch.Tensor, keep: list[int]) -> dict[int, float]:
    """softmax of `x` restricted to `keep`, renormalised."""
    mass = torch.softmax(x, dim=-1)[keep]
    return {t: float(p) for t, p in zip(keep, mass / mass.sum())}


def _check_draws(seen: dict[int, list[float]], want: dict[int, float], n: int, temperature: float = 1.0) -> None:
    """The drawn tokens are `want`'s (all but any too rare to come up), each as often as its
    probability (4 sd of a binomial frequency: the seeds are fixed, so the test is too), its
    sampled log-prob log of it (so they sum to 1 over the kept set) and its tempered log-prob that
    of the raw logits."""
    assert set(seen) <= set(want) and all(t in seen for t, p in want.items() if p * n > 10)
    unseen = sum(p for t, p in want.items() if t not in seen)  # (a token too rare to come up)
    assert sum(math.exp(s) for _, _, s in seen.values()) + unseen == pytest.approx(1.0, abs=1e-6)
    tempered = torch.log_softmax(Z / temperature, dim=-1)
    for token, (count, logprob, sampled) in seen.items():
        p = want[token]
        assert sampled == pytest.approx(math.log(p), abs=1e-5)
        assert logprob == pytest.approx(float(tempered[token]), abs=1e-6)
        assert abs(count / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (token, count / n, p)


# ------------------------------------------------------------------ each field, by hand


def test_the_repetition_penalty_divides_positive_and_multiplies_other_logits_of_prompt_and_completion_tokens():
    penalties = Penalties(prompt=[0, 3, 4], repetition=2.0, frequency=0.0, presence=0.0)
    got = penalties.apply(Z)
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0, -2.0, -3.0])
    penalties.add(5)  # a completion token is penalised too
    assert penalties.apply(Z).tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0, -2.0, -6.0])
    assert Z.tolist() == [2.0, 1.0, 0.5, 0.0, -1.0, -3.0]  # the raw logits are left alone


def test_frequency_and_presence_penalties_count_completion_tokens_only():
    penalties = Penalties(prompt=[0], repetition=1.0, frequency=0.5, presence=0.25)
    assert torch.equal(penalties.apply(Z), Z)  # a prompt token is not in the completion
    for token in (1, 1, 2):
        penalties.add(token)
    # token 1: 1.0 - 2 x 0.5 - 0.25; token 2: 0.5 - 1 x 0.5 - 0.25
    assert penalties.apply(Z).tolist() == pytest.approx([2.0, -0.25, -0.25, 0.0, -1.0, -3.0])


def test_greedy_takes_the_arg_max_of_the_penalised_logits_and_ignores_the_truncations():
    token, logprob, sampled = RowSampler(0, 0.0, prompt=[0], repetition_penalty=4.0).draw(Z)
    assert token == 1  # token 0's 2.0 became 0.5
    assert logprob == pytest.approx(float(torch.log_softmax(Z, dim=-1)[1]), abs=1e-6)
    assert sampled == pytest.approx(float(torch.log_softmax(Z * torch.tensor([0.25, 1, 1, 1, 1, 1]), -1)[1]), abs=1e-6)
    # top_k, min_p and top_p do not apply to greedy: the arg max, its log-prob under log softmax(z)
    for fields in ({"top_k": 3}, {"min_p": 0.9}, {"top_p": 0.1}):
        token, logprob, sampled = RowSampler(0, 0.0, **fields).draw(Z)
        assert token == 0 and sampled == logprob == pytest.approx(float(torch.log_softmax(Z, -1)[0]))


def test_the_penalties_apply_before_the_temperature():
    """(z - f x count) / T, not z / T - f x count: the sampled log-prob says which."""
    seen = _draws(2000, temperature=0.5, prompt=[], frequency_penalty=1.0)
    # the first draw of every seed: no completion yet, so no penalty: only the tempered distribution
    _check_draws(seen, _kept_distribution(Z / 0.5, list(range(6))), 2000, temperature=0.5)
    sampler = RowSampler(3, 0.5, frequency_penalty=1.0)
    first, _, _ = sampler.draw(Z)
    second, _, sampled = sampler.draw(Z)
    counts = torch.zeros(6)
    counts[first] = 1
    assert sampled == pytest.approx(float(torch.log_softmax((Z - counts) / 0.5, -1)[second]), abs=1e-6)


def test_min_p_keeps_the_tokens_at_least_min_p_times_the_most_probable_after_the_temperature():
    # T = 1: p1 / p0 = e^-1 = 0.37 >= 0.3 kept, p2 / p0 = e^-1.5 = 0.22 dropped
    n = 3000
    _check_draws(_draws(n, min_p=0.3), _kept_distribution(Z, [0, 1]), n)
    # T = 2 flattens first: p2 / p0 = e^-0.75 = 0.47 and p3 / p0 = e^-1 = 0.37 kept too
    _check_draws(_draws(n, temperature=2.0, min_p=0.3), _kept_distribution(Z / 2.0, [0, 1, 2, 3]), n, 2.0)


def test_top_k_keeps_the_k_most_probable_and_every_tie_of_the_kth():
    n = 3000
    _check_draws(_draws(n, top_k=2), _kept_distribution(Z, [0, 1]), n)
    ties = torch.tensor([1.0, 0.0, 1.0, 1.0, -2.0])
    got = {RowSampler(seed, 1.0, top_k=2).draw(ties)[0] for seed in range(300)}
    assert got == {0, 2, 3}  # vLLM keeps a token whose logit equals the k-th largest
    # a k of at least the vocabulary truncates nothing (the request still records its sampled log-probs)
    _check_draws(_draws(n, top_k=6), _kept_distribution(Z, list(range(6))), n)


def test_top_p_applies_to_the_distribution_renormalised_after_top_k():
    """top_k=2 leaves [e^2, e^1] / (e^2 + e^1) = [0.73, 0.27]; top_p=0.6 then keeps token 0 alone.
    (top_p first, on the whole distribution, would keep 0 and 1: p0 = 0.55 < 0.6.)"""
    assert float(torch.softmax(Z, -1)[0]) < 0.6
    seen = _draws(500, top_k=2, top_p=0.6)
    assert set(seen) == {0} and seen[0][2] == pytest.approx(0.0, abs=1e-6)
    # min_p, then top_k, then top_p, then the draw from what is left, renormalised
    n = 3000
    _check_draws(_draws(n, min_p=0.05, top_k=4, top_p=0.9), _kept_distribution(Z, [0, 1, 2]), n)


def test_a_shaped_draw_uses_the_requests_own_generator_and_is_reproducible():
    fields = {"top_k": 4, "min_p": 0.02, "top_p": 0.95, "repetition_penalty": 1.3, "presence_penalty": 0.2}
    a, b = RowSampler(11, 0.8, prompt=[2], **fields), RowSampler(11, 0.8, prompt=[2], **fields)
    run_a = [a.draw(Z) for _ in range(20)]
    assert run_a == [b.draw(Z) for _ in range(20)]
    other = RowSampler(12, 0.8, prompt=[2], **fields)
    assert [other.draw(Z) for _ in range(20)] != run_a


def test_neutral_fields_draw_bit_identically_to_the_sampler_without_them():
    """Neutral values take `sample` itself (no penalty state, no sampled log-prob); top_p alone,
    now recorded as shaped, still draws the same tokens as before, with the same log-probs."""
    logits = torch.randn(49152, generator=torch.Generator().manual_seed(0)) * 3
    for temperature, top_p in [(0.7, 1.0), (0.0, 1.0), (1.0, 0.8)]:
        for seed in range(40):
            neutral = RowSampler(seed, temperature, top_p, top_k=-1, min_p=0.0, repetition_penalty=1.0)
            assert neutral.penalties is None and neutral.shapes == (top_p < 1)
            token, logprob, sampled = neutral.draw(logits)
            want = sample(logits, temperature, top_p, generator(seed, temperature))
            assert (token, logprob) == want
            assert (sampled is None) == (top_p == 1.0)


# ------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def model():
    return tiny_random_model()


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer.encode("Count the apples and the pears: one apple, two pears, three apples")


def _engine(model, stops=()) -> Engine:
    return Engine(model, list(stops), max_batch=4, overlap_prefill=False)


def _reference_penalised_greedy(model, prompt: list[int], n: int, rp: float, fp: float, pp: float) -> list[int]:
    """Greedy decoding with the penalties applied by hand to a full forward's last logits."""
    out: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            z = model(torch.tensor([prompt + out])).logits[0, -1].float().clone()
        for t in set(prompt) | set(out):
            z[t] = z[t] / rp if z[t] > 0 else z[t] * rp
        for t in set(out):
            z[t] = z[t] - fp * out.count(t)
            z[t] = z[t] - pp
        out.append(int(torch.argmax(z)))
    return out


def test_the_engine_applies_the_penalties_over_prompt_and_completion_as_a_hand_reference(model, prompt):
    n = 12
    engine = _engine(model)
    plain = engine.generate([EngineRequest(prompt, n)])[0].ids
    # (the random model never repeats a token greedily: a repetition penalty < 1 and a negative
    # presence penalty, which favour the tokens already there, are what change its output)
    fields = {"repetition_penalty": 0.5, "frequency_penalty": 0.3, "presence_penalty": -1.5}
    got = engine.generate([EngineRequest(prompt, n, **fields)])[0]
    want = _reference_penalised_greedy(model, prompt, n, 0.5, 0.3, -1.5)
    assert got.ids == want and got.ids != plain
    assert got.sampled_logprobs is not None and len(got.sampled_logprobs) == n
    # a batch of several rows, each with its own penalty state, gives each the same
    again = engine.generate(
        [EngineRequest(prompt, n, **fields), EngineRequest(prompt[:-3], n), EngineRequest(prompt, n)]
    )
    assert again[0].ids == want and again[2].ids == plain


def test_top_k_1_is_greedy_through_the_engine(model, prompt):
    engine = _engine(model)
    greedy = engine.generate([EngineRequest(prompt, 10)])[0]
    sampled = engine.generate([EngineRequest(prompt, 10, temperature=0.9, seed=5, top_k=1)])[0]
    assert sampled.ids == greedy.ids
    assert sampled.sampled_logprobs == [0.0] * 10  # one token kept: probability 1
    # the tempered log-probs are those of the raw logits at T = 0.9, as a teacher-forced pass gives
    with torch.no_grad():
        logits = model(torch.tensor([prompt + greedy.ids])).logits[0].float()
    z = logits[len(prompt) - 1 : len(prompt) + 9] / 0.9
    want = torch.log_softmax(z, -1).gather(1, torch.tensor(greedy.ids).unsqueeze(1)).squeeze(1)
    assert sampled.logprobs == pytest.approx(want.tolist(), abs=1e-4)


def test_stop_token_ids_stop_the_request_on_top_of_the_engines_stops(model, prompt):
    free = _engine(model).generate([EngineRequest(prompt, 16)])[0].ids
    later, earlier = free[9], free[4]
    assert later not in free[:9] and earlier not in free[:4], free  # the tiny model's output here
    engine = _engine(model, stops=[later])
    by_engine = engine.generate([EngineRequest(prompt, 16)])[0]
    assert by_engine.ids == free[:10] and by_engine.finish_reason == "stop"
    # the request's own stop id, earlier: it stops there (the stop token kept in the ids)
    both = engine.generate([EngineRequest(prompt, 16, stop_token_ids=[earlier])])[0]
    assert both.ids == free[:5] and both.finish_reason == "stop"
    # its own stop id after the engine's: the engine's still stops it (added, not replacing)
    engine = _engine(model, stops=[earlier])
    assert engine.generate([EngineRequest(prompt, 16, stop_token_ids=[later])])[0].ids == free[:5]


def test_shaped_sampling_is_reproducible_alone_or_beside_others(model, prompt):
    fields = {"temperature": 1.0, "seed": 7, "top_k": 50, "min_p": 0.01, "top_p": 0.95, "repetition_penalty": 1.2}
    engine = _engine(model)
    alone = engine.generate([EngineRequest(prompt, 12, **fields)])[0]
    crowd = engine.generate(
        [EngineRequest(prompt[:-2], 12, temperature=1.0, seed=1), EngineRequest(prompt, 12, **fields)]
    )[1]
    assert crowd.ids == alone.ids
    assert crowd.sampled_logprobs == pytest.approx(alone.sampled_logprobs, abs=1e-5)
    other_seed = engine.generate([EngineRequest(prompt, 12, **{**fields, "seed": 8})])[0]
    assert other_seed.ids != alone.ids
    # the sampled log-probs are of a truncated, renormalised distribution: above the tempered ones
    assert all(s >= lp - 1e-6 for s, lp in zip(alone.sampled_logprobs, alone.logprobs))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_engines_sampled_logprobs_are_the_teacher_forced_shaped_ones(model, prompt, temperature):
    """`shaped_logprobs` recomputes them from a forward of prompt + completion (what the vLLM test
    compares vLLM's processed logprobs against): the engine recorded the same, to float noise."""
    fields = {"top_k": 40, "min_p": 0.02, "top_p": 0.9, "repetition_penalty": 0.7, "frequency_penalty": 0.4}
    got = _engine(model).generate([EngineRequest(prompt, 10, temperature=temperature, seed=2, **fields)])[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + got.ids])).logits[0].float()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(got.ids)]
    assert got.sampled_logprobs == pytest.approx(
        shaped_logprobs(rows, prompt, got.ids, temperature, **fields), abs=1e-4
    )
    # a token the shaping drops has no probability under it
    dropped = int(torch.argmin(rows[0]))
    assert shaped_logprobs(rows[:1], prompt, [dropped], 0.9, **fields) == [-math.inf]


def test_neutral_fields_through_the_engine_are_the_defaults_bit_for_bit(model, prompt):
    # each alone on a fresh engine: the same products, so the same floats
    default = _engine(model).generate([EngineRequest(prompt, 12, temperature=0.8, seed=3)])[0]
    neutral = EngineRequest(
        prompt, 12, temperature=0.8, seed=3, top_k=0, min_p=0.0, repetition_penalty=1.0, frequency_penalty=0.0
    )
    off = EngineRequest(prompt, 12, temperature=0.8, seed=3, top_k=-1, presence_penalty=0.0, stop_token_ids=[])
    for completion in (_engine(model).generate([request])[0] for request in (neutral, off)):
        assert completion.ids == default.ids and completion.logprobs == default.logprobs
        assert completion.sampled_logprobs is None and default.sampled_logprobs is None


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("top_k", -2, "top_k must be an integer >= 1, or 0 or -1"),
        ("top_k", 2.5, "top_k must be an integer"),
        ("top_k", True, "top_k must be an integer"),
        ("min_p", 1.5, r"min_p must be in \[0, 1\]"),
        ("min_p", float("nan"), "min_p"),
        ("repetition_penalty", 0.0, "repetition_penalty must be a finite number > 0"),
        ("repetition_penalty", float("inf"), "repetition_penalty"),
        ("frequency_penalty", 2.5, r"frequency_penalty must be in \[-2, 2\]"),
        ("presence_penalty", -3.0, r"presence_penalty must be in \[-2, 2\]"),
        ("stop_token_ids", [10**7], "stop_token_ids: 10000000 is not a token id of the vocabulary"),
        ("stop_token_ids", [-1], "stop_token_ids"),
    ],
)
def test_invalid_values_are_refused_by_name(model, prompt, field, value, message):
    future = _engine(model).submit_request(EngineRequest(prompt, 4, **{field: value}))
    with pytest.raises(ValueError, match=message):
        future.result(timeout=30)


# ------------------------------------------------------------------------- the policies


def _ask(**kw) -> GenerationRequest:
    return GenerationRequest(messages=[Message(role="user", content="Name three fruits.")], max_new_tokens=8, **kw)


def test_hf_policy_passes_every_field_and_records_the_sampled_logprobs_when_shaped(model, tokenizer):
    policy = HFPolicy(model, tokenizer, name="tiny")
    try:
        neutral = policy.complete([_ask(seed=1)], SamplingParams(temperature=0.9))[0]
        assert neutral.sampled_logprobs is None
        for shaped in (
            SamplingParams(temperature=0.9, top_p=0.9),  # top_p alone is shaping too
            SamplingParams(temperature=0.9, top_k=5, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.5),
        ):
            assert shaped.shapes()
            call = policy.submit(_ask(seed=1), shaped).result(timeout=60)
            assert call.sampled_logprobs is not None and len(call.sampled_logprobs) == len(call.completion_ids)
            assert call.sampled_logprobs != call.logprobs
        top1 = policy.complete([_ask(seed=4)], SamplingParams(temperature=0.9, top_k=1))[0]
        greedy = policy.complete([_ask(seed=4)], SamplingParams(temperature=0.0))[0]
        assert top1.completion_ids == greedy.completion_ids and top1.sampled_logprobs == [0.0] * len(top1.logprobs)
        # a request's stop_token_ids end its completion at the first of them, the token kept
        stop = greedy.completion_ids[2]
        first = greedy.completion_ids.index(stop)
        cut = policy.complete([_ask(seed=4, stop_token_ids=[stop])], SamplingParams(temperature=0.0))[0]
        assert cut.completion_ids == greedy.completion_ids[: first + 1] and cut.finish_reason == "stop"
        assert policy.describe()["sampling"]["top_k"] == 0
    finally:
        policy.close()


def _body(sampling: SamplingParams, explicit: bool = False, **request) -> dict:
    policy = OpenAIPolicy("m", "http://127.0.0.1:9", api_key="k", explicit_sampling=explicit)
    return policy._body(_ask(**request), sampling, 1, logprobs=True)


def test_the_openai_backend_sends_the_fields_the_run_sets_and_nothing_more_when_neutral():
    neutral = _body(SamplingParams())
    assert not {"presence_penalty", "frequency_penalty", "extra_body"} & set(neutral)
    body = _body(
        SamplingParams(top_k=20, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5), stop_token_ids=[7, 9]
    )
    assert body["presence_penalty"] == 0.5 and "frequency_penalty" not in body
    assert body["extra_body"] == {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "stop_token_ids": [7, 9]}
    # explicit_sampling: every field, neutral or not (-1, vLLM's other "off", sent as 0)
    explicit = _body(SamplingParams(top_k=-1, frequency_penalty=-0.5), explicit=True)
    assert explicit["presence_penalty"] == 0.0 and explicit["frequency_penalty"] == -0.5
    assert explicit["extra_body"] == {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def test_the_openai_backend_records_a_shaped_requests_server_logprobs_as_sampled(monkeypatch):
    policy = OpenAIPolicy("m", "http://127.0.0.1:9", api_key="k")
    reply = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "ab"},
                "finish_reason": "stop",
                "token_ids": [5, 6],
                "logprobs": {"content": [{"token": "a", "logprob": -0.1}, {"token": "b", "logprob": -0.2}]},
            }
        ],
        "prompt_token_ids": [1, 2],
    }
    monkeypatch.setattr(policy, "_post", lambda body: reply)
    shaped = policy.complete([_ask()], SamplingParams(top_k=3))[0]
    assert shaped.sampled_logprobs == [-0.1, -0.2] == shaped.logprobs
    assert policy.complete([_ask()], SamplingParams())[0].sampled_logprobs is None


def test_an_episode_sequence_carries_the_sampled_distributions_logprobs():
    calls = [
        ModelCall(prompt_ids=[1], completion_ids=[2, 3], logprobs=[-1.0, -2.0], sampled_logprobs=[-0.5, -0.1], text=""),
        ModelCall(prompt_ids=[1, 2, 3, 4], completion_ids=[5], logprobs=[-3.0], text=""),
    ]
    trajectory = Trajectory(
        episode_id="e",
        task_id="t",
        suite="s",
        family="f",
        split="train",
        harness="h",
        attempt=0,
        instruction="i",
        steps=[Step(index=i, model_call=c, action=ActionKind.text) for i, c in enumerate(calls)],
        termination=Termination.submitted,
    )
    sequence = episode_sequence(trajectory)
    assert sequence is not None and sequence.logprobs == [-0.5, -0.1, 0.0, -3.0]
