"""The engine's own Llama decode forward (harnessrl.models.llama_forward): the same tokens and
log-probabilities as the model's own forward, and a clean fallback where it does not apply."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from harnessrl.models import llama_forward
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineRequest
from harnessrl.models.int8 import quantize_int8


@pytest.fixture(scope="module")
def model():
    return tiny_random_model()


def _prompts(tokenizer, n: int, shared: str = "") -> list[list[int]]:
    return [tokenizer.encode(shared + f"Task {k}: " + "count the apples " * (1 + 2 * k)) for k in range(n)]


def _requests(prompts, temperature: float, max_new: int = 10):
    return [EngineRequest(p, max_new, temperature=temperature, seed=i, stop_ids=[]) for i, p in enumerate(prompts)]


def _generate_alone(model, prompt: list[int], max_new: int) -> list[int]:
    config = GenerationConfig(max_new_tokens=max_new, do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            generation_config=config,
        )
    return out[0, len(prompt) :].tolist()


def _teacher_forced(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    z = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1] / temperature
    return torch.log_softmax(z, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


def test_a_llama_model_on_the_cpu_decodes_through_the_engines_own_forward(model, tokenizer):
    assert llama_forward.supports(model)
    engine = Engine(model, tokenizer, max_batch=3)
    assert engine.runner.fast is not None
    prompts = _prompts(tokenizer, 5)
    results = engine.generate(_requests(prompts, 0.0))
    for prompt, result in zip(prompts, results):
        assert result.ids == _generate_alone(model, prompt, 10)
    sampled = engine.generate(_requests(prompts, 0.8))
    for prompt, result in zip(prompts, sampled):
        assert result.logprobs == pytest.approx(_teacher_forced(model, prompt, result.ids, 0.8), abs=1e-4)


@pytest.mark.parametrize(
    "options",
    [{}, {"shared_prefix_attention": False}, {"packed_decode": False}, {"max_batch": 1}],
    ids=["default", "plain-attention", "unpacked", "one-row"],
)
def test_the_fast_forward_gives_the_models_own_tokens_and_logprobs(model, tokenizer, options):
    """Rows that share a long prefix (the shared-prefix attention), rows that do not, one row
    alone (the compiled kernel over its whole context): the very floats of the model's own
    forward (the same operations in the same order; a fused product's outputs are the same dot
    products), so switching paths never moves a sampled token."""
    prompts = _prompts(tokenizer, 4, shared="You are a careful agent. " * 12) + _prompts(tokenizer, 2)
    kwargs = {"max_batch": 4, **options}
    fast = Engine(model, tokenizer, fast_decode=True, **kwargs).generate(_requests(prompts, 0.7))
    own = Engine(model, tokenizer, fast_decode=False, **kwargs).generate(_requests(prompts, 0.7))
    for a, b in zip(fast, own):
        assert a.ids == b.ids and a.logprobs == b.logprobs


def test_weights_changed_in_place_or_by_data_reach_the_fused_copies(tokenizer):
    model = tiny_random_model()
    prompt = _prompts(tokenizer, 1)[0]
    engine = Engine(model, tokenizer, cache_budget_tokens=0)
    before = engine.generate(_requests([prompt], 0.0))[0]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(1.5)  # in place: its version moves
            layer.post_attention_layernorm.weight.mul_(0.5)  # folded into the fused gate/up weights
    after = engine.generate(_requests([prompt], 0.0))[0]
    reference = Engine(model, tokenizer, cache_budget_tokens=0, fast_decode=False).generate(_requests([prompt], 0.0))[0]
    assert after.ids == reference.ids and after.ids != before.ids
    up = model.model.layers[0].mlp.up_proj
    up.weight.data = torch.randn_like(up.weight)  # same tensor identity and version: needs clear_cache
    engine.clear_cache()
    fresh = Engine(model, tokenizer, cache_budget_tokens=0, fast_decode=False).generate(_requests([prompt], 0.0))[0]
    assert engine.generate(_requests([prompt], 0.0))[0].ids == fresh.ids


def test_an_int8_model_decodes_through_its_int8_layers_in_the_fast_forward(tokenizer):
    model = tiny_random_model()
    quantize_int8(model, [tokenizer.encode("calibrate on a short sentence about apples")])
    engine = Engine(model, tokenizer, max_batch=3)
    assert engine.runner.fast is not None
    prompts = _prompts(tokenizer, 4)
    fast = engine.generate(_requests(prompts, 0.0))
    own = Engine(model, tokenizer, max_batch=3, fast_decode=False).generate(_requests(prompts, 0.0))
    for a, b in zip(fast, own):
        assert a.ids == b.ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)  # int8 rounding amplifies float noise


def test_a_model_that_is_not_llama_falls_back_to_its_own_forward(tokenizer):
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        use_sliding_window=False,
    )
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(config).eval()
    assert not llama_forward.supports(qwen)
    engine = Engine(qwen, tokenizer, max_batch=2)
    assert engine.runner.fast is None
    prompts = _prompts(tokenizer, 2)
    results = engine.generate(_requests(prompts, 0.0, max_new=6))
    for prompt, result in zip(prompts, results):
        assert result.ids == _generate_alone(qwen, prompt, 6)
    with pytest.raises(ValueError, match="fast_decode needs a float32 Llama model"):
        Engine(qwen, tokenizer, fast_decode=True)


def test_a_hook_on_the_model_sees_every_decode_step(model, tokenizer):
    """Something watching the model's forward (a hook) gets the model's own forward, every step."""
    engine = Engine(model, tokenizer, max_batch=2, overlap_prefill=False)
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        results = engine.generate(_requests(_prompts(tokenizer, 2), 0.0, max_new=5))
    finally:
        hook.remove()
    assert [len(r.ids) for r in results] == [5, 5]
    assert len(calls) == 2 + 4  # two prefills, then four decode steps of both rows


def test_the_environment_can_turn_it_off_for_comparisons(model, tokenizer, monkeypatch):
    monkeypatch.setenv("HARNESSRL_FAST_DECODE", "0")
    assert Engine(model, tokenizer).runner.fast is None
    assert Engine(model, tokenizer, fast_decode=True).runner.fast is not None
    monkeypatch.setenv("HARNESSRL_FAST_DECODE", "yes")
    with pytest.raises(ValueError, match="HARNESSRL_FAST_DECODE must be 0 or 1"):
        Engine(model, tokenizer)
