"""Decode steps through wrapped linear layers (a LoRA adapter's own forward, as `train grpo`
generated with before the engine merged plain LoRA layers: `merge_lora=False` here, and any wrapper
it does not merge) run on the engine's own intra-op threads: they never borrow the prefill thread's
idle core, whose second OpenMP thread every small product of the adapter would wait for
(bench/rollout_paths.py)."""

from __future__ import annotations

import pytest
import torch

from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.engine import Engine, EngineRequest


def _with_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    model = tiny_random_model()
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], bias="none")
    torch.manual_seed(seed)
    get_peft_model(model, config)  # (injected in place: `model` now runs the adapter's layers)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            with torch.no_grad():
                p.normal_(0, 0.5)  # (peft starts B at 0: an adapter that changes the logits)
    return model.eval()


def _threads_seen(model) -> tuple[list[int], list[int]]:
    """A hook on every adapter's first product, noting the intra-op threads it runs on:
    (decode steps' calls: one row per request, 2-D; prefills' calls: 3-D)."""
    decode: list[int] = []
    prefill: list[int] = []

    def note(module, args):
        (decode if args[0].dim() == 2 else prefill).append(torch.get_num_threads())

    for name, module in model.named_modules():
        if name.endswith("lora_A.default"):
            module.register_forward_pre_hook(note)
    return decode, prefill


def test_decode_steps_through_lora_layers_never_borrow_the_idle_core(tokenizer):
    model = _with_lora()
    prompts = [tokenizer.encode(f"Task {k}: " + "count the apples " * (1 + k)) for k in range(3)]
    requests = [EngineRequest(p, 12, temperature=0.7, seed=k) for k, p in enumerate(prompts)]
    alone = Engine(model, tokenizer, overlap_prefill=False, merge_lora=False).generate(requests)
    decode, prefill = _threads_seen(model)
    threads = torch.get_num_threads()
    engine = Engine(model, tokenizer, overlap_prefill=True, merge_lora=False)
    assert engine.runner.fast is not None  # the engine's own decode forward, through the adapter's layers
    got = engine.generate(requests)
    engine.close()
    assert decode and set(decode) == {threads}
    assert prefill and max(prefill) == threads + 1  # a prefill in the step itself still borrows it
    # the same samples as without the prefill thread (log-probs up to float rounding, as always)
    assert [c.ids for c in got] == [c.ids for c in alone]
    for c, a in zip(got, alone):
        assert c.logprobs == pytest.approx(a.logprobs, abs=1e-5)
