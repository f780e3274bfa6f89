"""int8 linear layers (`load_policy(spec, dtype="int8")`): the layer itself, the policy through the
engine and the runner, how far it is from float32 and from its own teacher-forced pass, and the
places that refuse it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from harnessrl.models import GenerationRequest, SamplingParams, load_policy
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.models.int8 import Int8Linear, Int8Unavailable, quantize_int8
from harnessrl.types import Message

PROMPTS = [
    "Name three prime numbers.",
    "What is 17 times 23? Answer with a number.",
    "Write the word hello in French.",
    "List the files in the current folder and say which one is largest.",
]


@pytest.fixture(scope="module")
def float_policy(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def int8_policy(tokenizer):
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    policy.quantize_int8()
    yield policy
    policy.close()


def prompt_ids(policy: HFPolicy) -> list[list[int]]:
    return [policy.prompt_ids(GenerationRequest(messages=[Message(role="user", content=p)])) for p in PROMPTS]


def teacher_forced(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    z = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    return torch.log_softmax(z, dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


# ------------------------------------------------------------------------------------ the layer


def _linear(inp: int, out: int, bias: bool) -> nn.Linear:
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(inp, out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out, inp, generator=gen) * 0.05)
        if bias:
            layer.bias.copy_(torch.randn(out, generator=gen))
    return layer


def test_int8_linear_is_close_to_the_float_layer_and_needs_its_outlier_channels():
    layer = _linear(96, 40, bias=True)
    x = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(1))
    x[..., 7] *= 300.0  # one channel hundreds of times larger than the rest, as in small LLMs
    want = layer(x).detach()

    def rel_err(q: Int8Linear) -> float:
        got = q(x)
        assert got.shape == want.shape and got.dtype == torch.float32
        return float((got - want).norm() / want.norm())

    with_outlier, without = Int8Linear(layer, torch.tensor([7])), Int8Linear(layer, torch.tensor([], dtype=torch.long))
    assert rel_err(with_outlier) < 2e-3
    assert rel_err(without) > 10 * rel_err(with_outlier)
    assert with_outlier(x[:, :0]).shape == (2, 0, 40)


def test_int8_linear_rows_do_not_depend_on_each_other():
    """One scale per row and integer sums: a row gives the same numbers alone as in any batch
    (only the small float32 product of the outlier channels may round differently)."""
    layer = Int8Linear(_linear(64, 48, bias=False), torch.tensor([3, 9]))
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(2))
    batch = layer(x)
    for r in range(9):
        torch.testing.assert_close(layer(x[r : r + 1])[0], batch[r], rtol=0, atol=1e-6)
    no_outliers = Int8Linear(_linear(64, 48, bias=False), torch.tensor([], dtype=torch.long))
    batch = no_outliers(x)
    assert all(torch.equal(no_outliers(x[r : r + 1])[0], batch[r]) for r in range(9))


# ----------------------------------------------------------------------------------- the policy


def test_int8_policy_has_int8_linears_float_embeddings_and_a_float32_engine(int8_policy, float_policy):
    model = int8_policy.model
    assert not [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    quantized = [n for n, m in model.named_modules() if isinstance(m, Int8Linear)]
    assert "lm_head" in quantized and len(quantized) == 2 * 7 + 1  # 2 layers x (q k v o gate up down) + head
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    description = int8_policy.describe()
    assert description["quantization"]["kind"] == "int8" and description["quantization"]["layers"] == 15
    assert description["parameters"] == float_policy.describe()["parameters"]
    assert "quantization" not in float_policy.describe()
    with pytest.raises(Int8Unavailable, match="already int8"):
        int8_policy.quantize_int8()


def test_int8_is_near_float32_and_records_its_own_logprobs(int8_policy, float_policy):
    """Measured on these prompts: |int8 - float32| teacher-forced logprob of float32's greedy
    tokens, mean ~0.1 (the tiny random model's logits are large); the engine's recorded
    logprobs match the int8 model's own teacher-forced pass to 1e-4 on most tokens, and off by
    up to a few 1e-2 where float32 rounding moved an activation to the next int8 level."""
    prompts = prompt_ids(float_policy)
    greedy = SamplingParams(temperature=0.0)
    reference = float_policy.generate_ids(prompts, 24, greedy)
    diffs = torch.cat(
        [
            (teacher_forced(int8_policy.model, p, ids) - teacher_forced(float_policy.model, p, ids)).abs()
            for p, (ids, _, _) in zip(prompts, reference)
        ]
    )
    assert 1e-3 < float(diffs.mean()) < 0.25 and float(diffs.max()) < 1.5

    # the quantized model through the engine, 4 rows decoding together, and at temperature 0.7
    for sampling in (greedy, SamplingParams(temperature=0.7, seed=3)):
        outputs = int8_policy.generate_ids(prompts, 24, sampling)
        gaps = []
        for p, (ids, logprobs, _) in zip(prompts, outputs):
            own = teacher_forced(int8_policy.model, p, ids)
            if sampling.temperature:
                with torch.inference_mode():
                    z = int8_policy.model(torch.tensor([p + ids])).logits[0, len(p) - 1 : -1].float()
                own = torch.log_softmax(z / sampling.temperature, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            gaps.append((own - torch.tensor(logprobs)).abs())
        gap = torch.cat(gaps)
        assert float((gap <= 1e-4).float().mean()) >= 0.95, gap
        assert float(gap.max()) < 0.1, gap


def test_int8_policy_runs_episodes_through_the_runner(int8_policy):
    from helpers import shrunk

    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.tasks import get_suite

    # three episodes in flight at once, each cut to three short calls (int8 matmuls are slow on a CPU)
    jobs = make_jobs(get_suite("toolcalc").tasks("dev", 3), [shrunk("json-tools", max_steps=3, max_new_tokens=48)], 1)
    trajectories = Runner(int8_policy, SamplingParams(temperature=0.7, seed=1), max_in_flight=3).run(jobs)
    assert len(trajectories) == 3 and not any(t.is_infra_error for t in trajectories)
    calls = [s.model_call for t in trajectories for s in t.steps if s.model_call is not None]
    assert calls and all(len(c.logprobs) == len(c.completion_ids) > 0 for c in calls)
    assert all(lp <= 0 for c in calls for lp in c.logprobs)


# ------------------------------------------------------------------------------------- refusals


def test_load_policy_int8_on_tiny_random_and_its_refusals(monkeypatch):
    policy = load_policy("tiny-random", dtype="int8")
    try:
        assert policy.describe()["quantization"]["kind"] == "int8"
    finally:
        policy.close()
    with pytest.raises(ValueError, match="float32, bfloat16 or int8"):
        load_policy("tiny-random", dtype="int4")
    with pytest.raises(ValueError, match="applies to local models"):
        load_policy("openai:m@http://127.0.0.1:9/v1", dtype="int8")
    monkeypatch.delattr(torch, "_int_mm")
    with pytest.raises(Int8Unavailable, match=r"--dtype int8 needs torch\._int_mm"):
        load_policy("tiny-random", dtype="int8")


def test_quantize_int8_refuses_a_model_it_cannot_serve():
    with pytest.raises(Int8Unavailable, match="float32 model"):
        quantize_int8(tiny_random_model().to(torch.bfloat16), [[1, 2, 3]])
    with pytest.raises(ValueError, match="calibration"):
        quantize_int8(tiny_random_model(), [])


class _ReadsWeights(nn.Module):
    """A model whose code multiplies by a linear layer's .weight itself."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, input_ids):
        return nn.functional.linear(self.embed(input_ids), self.head.weight)


def test_quantize_int8_says_so_when_the_model_cannot_run_int8():
    with pytest.raises(Int8Unavailable, match="does not run with int8 linear layers"):
        quantize_int8(_ReadsWeights(), [[1, 2, 3]])


def test_serving_int8_refuses_lora_adapters(tokenizer, tmp_path):
    from harnessrl.cli import app
    from harnessrl.serve import ServedModels, ServeError

    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    policy.quantize_int8()
    models = ServedModels(policy)
    try:
        with pytest.raises(ServeError, match="--dtype int8") as caught:
            models.load_adapter("a", str(tmp_path))
        assert caught.value.status == 400
    finally:
        policy.close()
    result = CliRunner().invoke(
        app, ["serve", "--model", "tiny-random", "--dtype", "int8", "--lora-modules", f"a={tmp_path}"]
    )
    assert result.exit_code == 2 and "--dtype float32 or bfloat16" in result.output
