"""A peft LoRA adapter in the engine's own decode forward (harnessrl.models.llama_forward,
`merge_lora`): each adapted layer takes one product with its adapters merged into a copy of its base
weight. The same model as the adapter's own forward up to float rounding, switched off and on with
the adapter, rebuilt when a weight moves, and never merged where the adapter's product is not the
plain sum (dropout in effect)."""

from __future__ import annotations

import pytest
import torch

from harnessrl.models import llama_forward
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineConfig, EngineRequest


def _with_lora(dropout: float = 0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")):
    from peft import LoraConfig, get_peft_model

    model = tiny_random_model()
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=list(targets), bias="none")
    torch.manual_seed(0)
    peft_model = get_peft_model(model, config)  # (injected in place: `model` runs the adapter's layers)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            with torch.no_grad():
                p.normal_(0, 0.5)  # (peft starts B at 0: an adapter that changes the logits)
    return model.eval(), peft_model


def _prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.encode("You are an agent. " * 6 + f"Task {k}: " + "count the apples " * (1 + k)) for k in range(n)
    ]


def _requests(prompts, temperature: float, max_new: int = 12):
    return [EngineRequest(p, max_new, temperature=temperature, seed=i, stop_ids=[]) for i, p in enumerate(prompts)]


def _teacher_forced(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    z = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1] / temperature
    return torch.log_softmax(z, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1).tolist()


def _merged_layers(engine) -> int:
    fast = engine.runner.fast
    return sum(1 for f in fast.fused for m in f.modules if type(m) is not torch.nn.Linear)


def test_lora_layers_decode_merged_with_the_adapters_tokens_and_logprobs(tokenizer):
    model, _ = _with_lora()
    prompts = _prompts(tokenizer, 4)
    merged = Engine(model, tokenizer, max_batch=4, cache_budget_tokens=0, merge_lora=True)
    sampled = merged.generate(_requests(prompts, 0.8))
    # every adapted layer of every layer merged (q/k/v fused in one product; o and down alone)
    assert _merged_layers(merged) == 5 * model.config.num_hidden_layers
    assert not merged.runner.fast.wraps_linears
    own = Engine(model, tokenizer, max_batch=4, cache_budget_tokens=0, merge_lora=False)
    unmerged = own.generate(_requests(prompts, 0.8))
    assert _merged_layers(own) == 0 and own.runner.fast.wraps_linears
    for prompt, a, b in zip(prompts, sampled, unmerged):
        assert a.ids == b.ids  # float rounding moved no sampled token
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.logprobs == pytest.approx(_teacher_forced(model, prompt, a.ids, 0.8), abs=1e-4)
    merged.close()
    own.close()


def test_switching_the_adapter_off_and_on_is_seen_at_the_next_step(tokenizer):
    """peft's disable_adapter() changes no parameter (the weights watch cannot see it): the merged
    products follow the adapters' state all the same, read at every step."""
    model, peft_model = _with_lora()
    prompt = _prompts(tokenizer, 1)
    engine = Engine(model, tokenizer, cache_budget_tokens=0, merge_lora=True)
    reference = Engine(model, tokenizer, cache_budget_tokens=0, merge_lora=False)
    with_adapter = engine.generate(_requests(prompt, 0.0))[0]
    with peft_model.disable_adapter():
        off = engine.generate(_requests(prompt, 0.0))[0]
        assert off.ids == reference.generate(_requests(prompt, 0.0))[0].ids
    assert off.ids != with_adapter.ids  # (the adapter changes the greedy tokens)
    assert engine.generate(_requests(prompt, 0.0))[0].ids == with_adapter.ids
    engine.close()
    reference.close()


def test_an_optimizer_step_on_the_adapter_reaches_the_merged_weights(tokenizer):
    model, _ = _with_lora()
    prompt = _prompts(tokenizer, 1)
    engine = Engine(model, tokenizer, cache_budget_tokens=0, merge_lora=True)
    before = engine.generate(_requests(prompt, 0.0))[0]
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.SGD(params, lr=5.0)
    model(torch.tensor(prompt)).logits.float().logsumexp(-1).mean().backward()
    optimizer.step()  # in place: the parameters' versions move
    after = engine.generate(_requests(prompt, 0.0))[0]
    reference = Engine(model, tokenizer, cache_budget_tokens=0, merge_lora=False).generate(_requests(prompt, 0.0))[0]
    assert after.ids == reference.ids and after.ids != before.ids
    engine.close()


def test_lora_with_dropout_in_effect_runs_the_adapters_own_forward(tokenizer):
    """The engine's steps put a model in train mode in eval mode (no dropout), and merge; the
    decode forward on its own, with dropout in effect, keeps the adapter's own product."""
    model, _ = _with_lora(dropout=0.3)
    model.train()  # (as TRL leaves a model it generates with)
    engine = Engine(model, tokenizer, cache_budget_tokens=0, merge_lora=True)
    engine.generate(_requests(_prompts(tokenizer, 1), 0.0))
    assert model.training and _merged_layers(engine) == 5 * model.config.num_hidden_layers
    engine.close()
    decode = llama_forward.LlamaDecode(model)
    assert decode.prepare() is True  # wraps linear layers: the adapters' own forward
    assert not [f for f in decode.fused for m in f.modules if type(m) is not torch.nn.Linear]
    model.eval()
    assert decode.prepare() is False  # dropout off now: merged at the next step


def test_merge_lora_is_a_switch_of_the_config_and_the_environment():
    assert EngineConfig().merge_lora is True
    assert EngineConfig.from_env({"HARNESSRL_MERGE_LORA": "0"}).merge_lora is False
    assert EngineConfig.from_env({"HARNESSRL_MERGE_LORA": "1"}).merge_lora is True
    with pytest.raises(ValueError, match="HARNESSRL_MERGE_LORA"):
        EngineConfig.from_env({"HARNESSRL_MERGE_LORA": "yes"})
