"""Devices and precision (harnessrl.models.device): --device and --dtype on every job, the CUDA
branches (with torch.cuda monkeypatched: this machine has no GPU), the memory estimate made
before loading, the engine's device-neutral tensors (checked on torch's `meta` device), and
LoRA training with a bfloat16 base and with gradient checkpointing."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import shrunk_file
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.models import device as dev
from harnessrl.models.device import DeviceUnavailable, check_fits, resolve_device, resolve_dtype

cli = CliRunner()
GIB = 1024**3


@pytest.fixture
def two_gpus(monkeypatch):
    """torch sees two CUDA devices, cuda:0 current, 1 GiB free on each (of 80)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1 * GIB, 80 * GIB))


# -- resolve_device / resolve_dtype -----------------------------------------------------------------


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(DeviceUnavailable, match=rf"--device {spec}: torch sees no CUDA device here") as caught:
            resolve_device(spec)
        assert "\n" not in str(caught.value)


def test_with_gpus_auto_and_cuda_pick_the_current_one_and_an_index_past_the_last_is_refused(two_gpus):
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(
        DeviceUnavailable, match=r"--device cuda:3: this machine has 2 CUDA devices \(cuda:0 to cuda:1\)"
    ):
        resolve_device("cuda:3")


@pytest.mark.parametrize("spec", ["tpu", "gpu", "cuda:x", "cuda:-1", "mps", ""])
def test_an_unknown_device_names_the_forms(spec):
    with pytest.raises(DeviceUnavailable, match="must be auto, cpu, cuda or cuda:N"):
        resolve_device(spec)


def test_auto_precision_is_float32_on_a_cpu_and_bfloat16_on_cuda_and_int8_stays_on_the_cpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_dtype("auto", cpu) == "float32"
    assert resolve_dtype("auto", gpu) == "bfloat16"
    assert resolve_dtype("float32", gpu) == "float32"
    assert resolve_dtype("int8", cpu) == "int8"
    with pytest.raises(DeviceUnavailable, match="--dtype int8 runs on the CPU only"):
        resolve_dtype("int8", gpu)


# -- the estimate before loading ---------------------------------------------------------------------


def test_smollm2_is_counted_from_its_config_without_loading_it():
    shape = dev.model_shape("smollm2-135m")
    assert shape is not None and shape.parameters == 134_515_008  # SmolLM2-135M, tied embeddings
    assert shape.layers == 30 and shape.kv_elements_per_token == 30 * 2 * 3 * 64


def test_an_hf_folder_is_counted_from_its_config_json(tmp_path, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4
    )
    config.save_pretrained(tmp_path)
    real = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert dev.model_shape(f"hf:{tmp_path}").parameters == real
    assert dev.model_shape(f"hf:{tmp_path / 'missing'}") is None  # no estimate: loading reports it


def test_training_needs_more_than_inference_and_checkpointing_less_than_keeping_activations():
    shape = dev.model_shape("smollm2-135m")
    weights_only = dev.estimate_bytes(shape, "bfloat16")
    assert weights_only == int(shape.parameters * 2 * 1.1 + GIB)
    assert dev.estimate_bytes(shape, "float32") > weights_only
    kept = dev.estimate_bytes(shape, "bfloat16", training_tokens=4096, lora_parameters=10**6)
    recomputed = dev.estimate_bytes(
        shape, "bfloat16", training_tokens=4096, lora_parameters=10**6, gradient_checkpointing=True
    )
    assert weights_only < recomputed < kept


def test_a_model_too_large_for_the_free_memory_is_one_line_naming_estimate_and_free(two_gpus):
    with pytest.raises(DeviceUnavailable) as caught:
        check_fits("smollm2-135m", torch.device("cuda", 0), "bfloat16", cache_tokens=32768)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("smollm2-135m does not fit on cuda:0: running it in bfloat16 needs about ")
    assert "0.13B parameters" in message and "margin of 10% + 1 GiB" in message and "1.0 GiB are free" in message
    with pytest.raises(DeviceUnavailable, match=r"training it in bfloat16 .*\(try --gradient-checkpointing"):
        check_fits("smollm2-135m", torch.device("cuda", 0), "bfloat16", training_tokens=2048, lora_rank=16)


def test_a_model_that_fits_passes_and_the_cpu_is_not_checked(two_gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * GIB, 80 * GIB))
    need = check_fits("smollm2-135m", torch.device("cuda", 1), "bfloat16", cache_tokens=32768)
    assert 1 * GIB < need < 40 * GIB
    assert check_fits("smollm2-135m", torch.device("cpu"), "float32") is None


# -- the command line: one line, exit 2, before any work -----------------------------------------------


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())  # rich wraps long lines of a narrow terminal
    for needle in needles:
        assert needle in text, result.output


@pytest.mark.parametrize(
    "command",
    [
        ["eval", "--model", "tiny-random", "--suite", "toolcalc", "--tasks", "1", "--harness", "json-tools"],
        ["evolve", "--model", "tiny-random", "--suite", "toolcalc"],
        ["study", "--model", "tiny-random"],
        ["train", "sft", "--model", "tiny-random", "--sample", "1", "--sample-suite", "toolcalc"]
        + ["--sample-tasks", "1", "--as-harness", "json-tools"],
        ["serve", "--model", "tiny-random"],
        ["train", "grpo", "--model", "tiny-random", "--suite", "toolcalc", "--harnesses", "json-tools,react"],
    ],
    ids=["eval", "evolve", "study", "sft", "serve", "grpo"],
)
def test_every_job_refuses_a_device_this_machine_lacks_in_one_line_before_any_work(tmp_path, monkeypatch, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = ["--out", str(tmp_path / "run")] if command[0] != "serve" else []
    result = cli.invoke(app, [*command, *out, "--device", "cuda"])
    _one_line_error(result, "--device cuda: torch sees no CUDA device here")
    assert not (tmp_path / "run").exists()
    result = cli.invoke(app, [*command, *out, "--device", "tpu"])
    _one_line_error(result, "--device must be auto, cpu, cuda or cuda:N")


@pytest.mark.parametrize("command", [["train", "grpo"], ["train", "sft"], ["evolve"], ["study"]])
def test_jobs_that_train_or_compare_runs_take_float_precisions_only(command):
    result = cli.invoke(app, [*command, "--dtype", "int8"])
    _one_line_error(result, "--dtype must be float32 or bfloat16, or auto")


def test_eval_on_a_missing_gpu_index_and_int8_on_a_gpu_are_refused_before_any_work(tmp_path, two_gpus):
    args = ["eval", "--model", "tiny-random", "--suite", "toolcalc", "--tasks", "1", "--out", str(tmp_path / "run")]
    _one_line_error(cli.invoke(app, [*args, "--device", "cuda:3"]), "this machine has 2 CUDA devices")
    _one_line_error(cli.invoke(app, [*args, "--device", "cuda:1", "--dtype", "int8"]), "--dtype int8 runs on the CPU")
    assert not (tmp_path / "run" / "run.db").exists()


def test_eval_refuses_a_model_larger_than_the_free_gpu_memory_before_loading_it(tmp_path, two_gpus, monkeypatch):
    from harnessrl.models import hf

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(hf, "load_local", never)
    args = ["eval", "--model", "smollm2-135m", "--suite", "toolcalc", "--tasks", "1", "--harness", "json-tools"]
    result = cli.invoke(app, [*args, "--out", str(tmp_path / "run"), "--device", "cuda", "--no-progress"])
    _one_line_error(result, "smollm2-135m does not fit on cuda:0", "in bfloat16 needs about", "1.0 GiB are free")


def test_device_and_remote_models(tmp_path):
    args = ["eval", "--model", "openai:m@http://127.0.0.1:9/v1", "--out", str(tmp_path / "run")]
    _one_line_error(cli.invoke(app, [*args, "--device", "cpu"]), "--device cpu applies to local models")


def test_a_cpu_eval_records_its_device_not_its_default_precision_and_may_resume_on_another_device(tmp_path):
    """The default (auto) resolves to float32 on a CPU and is recorded as runs always were (no
    dtype key); the device is recorded, and a resume may name another one."""
    out = tmp_path / "run"
    harness = shrunk_file(tmp_path, "json-tools", max_steps=2, max_new_tokens=32)  # a short episode
    args = ["eval", "--model", "tiny-random", "--suite", "toolcalc", "--tasks", "1", "--harness", str(harness)]
    args += ["--out", str(out), "--no-progress"]
    assert cli.invoke(app, args).exit_code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["device"] == "cpu" and "dtype" not in config
    config["device"] = "cuda:0"  # as if it had started on a GPU in float32
    (out / "config.json").write_text(json.dumps(config))
    result = cli.invoke(app, [*args, "--resume", "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["device"] == "cpu"


# -- the policy and its engine on the model's device -------------------------------------------------


def test_load_policy_on_the_cpu_is_float32_exactly_as_before():
    from harnessrl.models import load_policy

    policy = load_policy("tiny-random", device="cpu", dtype="auto")
    try:
        first = next(policy.model.parameters())
        assert first.dtype == torch.float32 and first.device.type == "cpu"
        assert "device" not in policy.describe()
        engine = policy._slot.engine
        assert engine.shared_prefix_attention and engine._kv.device.type == "cpu"
    finally:
        policy.close()
    with pytest.raises(ValueError, match="--device cuda applies to local models"):
        load_policy("openai:m@http://127.0.0.1:9/v1", device="cuda")


def test_on_another_device_the_engine_runs_the_models_own_attention_with_every_tensor_there(tokenizer):
    """On `meta` (a device with no data, which refuses any CPU tensor mixed into its operations)
    the engine's prefill and decode steps run the whole model: its inputs, masks, positions and
    key/value cache are all made on the model's device. The logits are swapped for CPU zeros
    after the forward (meta tensors cannot be read), which is where the engine samples."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.engine import Engine

    model = tiny_random_model().to("meta")
    engine = Engine(model, [tokenizer.eos_token_id], max_batch=4, cache_budget_tokens=256)
    assert not engine.shared_prefix_attention and not engine.overlap_prefill and engine._packed is None
    seen = []

    def on_cpu_logits(module, args, kwargs, output):
        seen.append({k: v.device.type for k, v in kwargs.items() if isinstance(v, torch.Tensor)})
        seen[-1]["cache"] = getattr(kwargs.get(engine._cache_arg), "kv").buf.device.type
        output.logits = torch.zeros(output.logits.shape[0], 1, output.logits.shape[-1])
        return output

    model.register_forward_hook(on_cpu_logits, with_kwargs=True)
    prompts = [[1, 5, 7, 9, 11], [1, 5, 7, 9, 13, 15]]  # a shared prefix: the second reuses cached slots
    results = engine.generate([_request(p) for p in prompts])
    assert [len(r.ids) for r in results] == [3, 3]
    assert results[1].cached_tokens == 4
    assert len(seen) == 2 + 2  # two prefills, then decode steps until both had 3 tokens
    assert all(set(s.values()) == {"meta"} for s in seen), seen
    assert {"input_ids", "attention_mask", "position_ids"} <= set(seen[-1])


def _request(prompt):
    from harnessrl.models.engine import EngineRequest

    return EngineRequest(prompt, max_new_tokens=3, temperature=0.7, seed=len(prompt), stop_ids=[])


def test_on_the_cpu_the_engine_keeps_its_cpu_machinery(tiny_policy):
    engine = tiny_policy._slot.engine or tiny_policy._slot.running()
    assert engine.shared_prefix_attention
    assert engine.device.type == "cpu"


# -- training precision and gradient checkpointing ----------------------------------------------------


def _units(tokenizer):
    from harnessrl.train.grpo import TrainingUnit

    prompt = tokenizer("hello there, how are you today?")["input_ids"]
    where = {"harness": "json-tools", "episode_id": "e"}
    return [
        TrainingUnit(prompt_ids=prompt, completion_ids=[5, 9, 13, 2], old_logprobs=[-1.0] * 4, advantage=1.0, **where),
        TrainingUnit(prompt_ids=prompt[:5], completion_ids=[7, 2], old_logprobs=[-1.0] * 2, advantage=-1.0, **where),
    ]


def _lora_grads(tokenizer, *, dtype=torch.float32, checkpointing=False):
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy
    from harnessrl.train import lora
    from harnessrl.train.config import SFTConfig
    from harnessrl.train.grpo import pad_units, token_logprobs

    policy = HFPolicy(tiny_random_model().to(dtype), tokenizer, name="tiny-random")
    config = SFTConfig(from_runs=["x"], model="tiny-random", gradient_checkpointing=checkpointing, lora_r=4)
    peft_model, trainable, optimizer = lora.attach(policy, config, RuntimeError)
    for p in trainable:  # LoRA's B starts at 0: give it weights so every LoRA gradient is non-zero
        torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(p.numel()))
    layer_calls = []
    # (a pre-hook: a non-reentrant recompute stops once it has what the backward needs, before
    # the module's forward returns)
    policy.model.model.layers[0].self_attn.register_forward_pre_hook(lambda *args: layer_calls.append(1))
    batch = pad_units(_units(tokenizer), policy.pad_id)
    logp = token_logprobs(peft_model, batch, temperature=0.7)
    (-(logp * batch["completion_mask"]).sum()).backward()
    grads = [p.grad.clone() for p in trainable]
    optimizer.step()
    policy.close()
    return peft_model, trainable, optimizer, grads, len(layer_calls), logp


def test_a_bfloat16_base_trains_float32_lora_weights_with_float32_optimizer_state(tokenizer):
    peft_model, trainable, optimizer, grads, _, logp = _lora_grads(tokenizer, dtype=torch.bfloat16)
    base = peft_model.get_base_model()
    assert base.model.embed_tokens.weight.dtype == torch.bfloat16
    assert base.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert logp.dtype == torch.float32
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    state = optimizer.state[trainable[0]]
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32


def test_gradient_checkpointing_recomputes_the_layers_and_gives_the_same_gradients(tokenizer):
    *_, plain, plain_calls, plain_logp = _lora_grads(tokenizer)
    peft_model, *_, checkpointed, calls, logp = _lora_grads(tokenizer, checkpointing=True)
    assert plain_calls == 1 and calls == 2  # the forward, and its recompute in the backward
    torch.testing.assert_close(logp, plain_logp, rtol=0, atol=0)
    for a, b in zip(plain, checkpointed):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not any(m.training for m in peft_model.modules())  # eval mode throughout: no dropout acts


def test_a_checkpointed_model_still_generates_through_its_engine(tokenizer):
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy
    from harnessrl.train import lora
    from harnessrl.train.config import TrainConfig

    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    before = policy.generate_ids([[1, 5, 7, 9]], 4, seeds=[3])
    policy.clear_cache()
    lora.attach(policy, TrainConfig(model="tiny-random", gradient_checkpointing=True), RuntimeError)
    try:
        assert policy.generate_ids([[1, 5, 7, 9]], 4, seeds=[3]) == before  # LoRA B = 0: the same model
    finally:
        policy.close()


def test_training_loads_refuse_int8_and_a_missing_gpu_as_the_callers_error(monkeypatch):
    from harnessrl.train import lora

    class Refused(Exception):
        pass

    with pytest.raises(Refused, match="--dtype int8 cannot be trained"):
        lora.load_local_policy("tiny-random", Refused, dtype="int8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Refused, match="--device cuda: torch sees no CUDA device"):
        lora.load_local_policy("tiny-random", Refused, device="cuda")


def test_training_load_refuses_a_model_too_large_for_training_before_loading(two_gpus, monkeypatch):
    from harnessrl.models import hf
    from harnessrl.train import lora
    from harnessrl.train.config import TrainConfig

    monkeypatch.setattr(hf, "load_local", lambda *a, **k: pytest.fail("the model was loaded"))

    class Refused(Exception):
        pass

    with pytest.raises(Refused, match=r"training it in bfloat16 needs about .* GiB .* 1\.0 GiB are free"):
        lora.load_local_policy("smollm2-135m", Refused, device="cuda", training=TrainConfig())


def test_the_recorded_precision_of_a_training_run(monkeypatch):
    from harnessrl.kernel import job_record
    from harnessrl.train import lora
    from harnessrl.train.config import TrainConfig

    def recorded(config: TrainConfig) -> dict:  # what a training run's folder records of its options
        return job_record(config.model_dump(), lora.trained_model(config, ValueError))

    record = recorded(TrainConfig(model="tiny-random"))
    assert record["device"] == "cpu" and "dtype" not in record  # float32: as runs were recorded before
    assert record["lr"] == TrainConfig().lr  # the options beside it
    assert recorded(TrainConfig(dtype="bfloat16"))["dtype"] == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    on_gpu = recorded(TrainConfig())
    assert on_gpu["device"] == "cuda:0" and on_gpu["dtype"] == "bfloat16"
