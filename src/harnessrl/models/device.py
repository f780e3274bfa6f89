"""Where a local model runs and in what precision, and whether it fits there, decided before
anything loads.

    resolve_device(spec)      "auto" | "cpu" | "cuda" | "cuda:N" -> torch.device; DeviceUnavailable
                              (one line) for a device this machine does not have
    resolve_dtype(dtype, d)   "auto" -> float32 on a CPU, bfloat16 on CUDA; int8 only on a CPU
    estimate_bytes(...)       device memory a model needs: its weights, the engine's key/value
                              cache, for training LoRA + AdamW + activations, plus MARGIN
    check_fits(spec, d, ...)  DeviceUnavailable naming the estimate and the free memory when a
                              CUDA device has less free than that (CPU memory is not checked)

"auto" picks float32 on a CPU on purpose: every result recorded on CPUs (and the tests) was
computed in float32, and bfloat16 there changes samples with the batch (docs/models.md). On CUDA
bfloat16 is what these models are trained and served in: half the memory and the GPU's fast
matrix units.

Sizes come from the model's config (config.json of an hf:PATH folder, the built-in configs of
tiny-random and smollm2-135m), with the parameters counted on torch's `meta` device: exact for
any architecture transformers knows, and no memory is allocated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harnessrl.config import device_spec


class DeviceUnavailable(ValueError):
    """The device asked for is not on this machine, or the model does not fit in it."""


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch.device that `spec` names on this machine (None or "auto": the first GPU when
    torch sees one, else the CPU). DeviceUnavailable for cuda without a GPU, an index past the
    last GPU, or a form that is none of auto, cpu, cuda, cuda:N."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    try:
        spec = device_spec("auto" if spec is None else spec)
    except ValueError as exc:
        raise DeviceUnavailable(f"--device {exc}") from None
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceUnavailable(
            f"--device {spec}: torch sees no CUDA device here (torch {torch.__version__}, {build}); use --device cpu"
        )
    count = torch.cuda.device_count()
    index = int(spec.partition(":")[2] or 0)
    if index >= count:
        raise DeviceUnavailable(
            f"--device {spec}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
            f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
        )
    return torch.device("cuda", index)


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """The precision `dtype` ("auto", "float32", "bfloat16", "int8") means on `device`: auto is
    float32 on a CPU and bfloat16 elsewhere. DeviceUnavailable for int8 off the CPU (its
    kernels are CPU ones)."""
    dtype = str(dtype).strip().lower()
    if dtype == "auto":
        return "float32" if device.type == "cpu" else "bfloat16"
    if dtype == "int8" and device.type != "cpu":
        raise DeviceUnavailable(
            f"--dtype int8 runs on the CPU only (its int8 matrix products are CPU kernels), not on {device}; "
            "use --dtype bfloat16 there, or --device cpu"
        )
    return dtype


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a resolved precision's float weights (int8 keeps float32 outside its linears)."""
    return torch.bfloat16 if dtype == "bfloat16" else torch.float32


def bytes_per_parameter(dtype: str) -> float:
    """Weight bytes per parameter: int8 is ~1 (its linear layers; the rest stays float32)."""
    return {"float32": 4.0, "bfloat16": 2.0, "int8": 1.0}[dtype]


# -- model sizes ----------------------------------------------------------------------------------

SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
}
"""SmolLM2-135M-Instruct's shape (what its GGUF holds), so its size is known without loading it."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model."""

    parameters: int
    layers: int
    hidden: int
    vocab: int
    kv_elements_per_token: int  # layers x 2 x kv_heads x head_dim (times the element size: bytes)


def _shape_of(config) -> ModelShape:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # counted, not allocated
        model = AutoModelForCausalLM.from_config(config)
    parameters = sum(p.numel() for p in model.parameters())
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    layers = config.num_hidden_layers
    return ModelShape(parameters, layers, config.hidden_size, config.vocab_size, layers * 2 * kv_heads * head_dim)


def model_shape(spec: str) -> ModelShape | None:
    """The shape of the model a local spec names, from its config alone; None when it cannot be
    told without loading the model (a .gguf file, a config transformers does not know)."""
    from transformers import AutoConfig, LlamaConfig

    spec = spec.strip()
    try:
        if spec == "tiny-random":
            from harnessrl.models.embedded import tiny_random_model

            model = tiny_random_model()  # tiny: building it is cheaper than describing it
            return _shape_of(model.config)
        if spec == "smollm2-135m":
            fields = {k: v for k, v in SMOLLM2_135M.items() if k not in ("architectures", "model_type")}
            return _shape_of(LlamaConfig(**fields))
        if spec.startswith("hf:"):
            path = Path(spec[3:]).expanduser()
            if (path / "adapter_config.json").is_file():  # an adapter is merged into its base: the base's size
                base = _adapter_base(path)
                return model_shape(base) if base else None
            if not (path / "config.json").is_file():
                return None
            return _shape_of(AutoConfig.from_pretrained(str(path), local_files_only=True))
    except Exception:  # noqa: BLE001 - no estimate is no reason to refuse a model; loading reports real errors
        return None
    return None


def _adapter_base(folder: Path) -> str | None:
    for name, key in (("harnessrl.json", "base_model"), ("adapter_config.json", "base_model_name_or_path")):
        try:
            value = json.loads((folder / name).read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if value:
            return value if name == "harnessrl.json" else f"hf:{value}"
    return None


# -- the estimate ---------------------------------------------------------------------------------

GIB = 1024**3
MARGIN_FRACTION = 0.10
MARGIN_BYTES = 1 * GIB
"""Added to every estimate: 10% of it plus 1 GiB, for the CUDA context and kernels' workspaces,
the batch's own key/value rows, allocator fragmentation and temporary tensors."""

ACTIVATION_FACTOR = 18
"""Bytes saved for the backward per token, layer and hidden unit, in units of the compute dtype's
element size: a transformer layer keeps roughly 34 x hidden 16-bit bytes per token without
recomputation (Korthikanti et al., 2022; the attention scores themselves are not kept by SDPA),
i.e. ~17-18 elements. With gradient checkpointing only each layer's input is kept (1), plus one
layer being recomputed."""


def estimate_bytes(
    shape: ModelShape,
    dtype: str,
    *,
    cache_tokens: int = 0,
    training_tokens: int | None = None,
    lora_parameters: int = 0,
    gradient_checkpointing: bool = False,
) -> int:
    """Device memory, in bytes, for a model of `shape` in `dtype`: the weights, `cache_tokens`
    tokens of keys and values (the engine's prefix cache budget), and for training
    (`training_tokens`: tokens of one micro-batch) the LoRA weights with their gradients and
    AdamW's two moments (float32: 16 bytes each), the activations kept for the backward
    (ACTIVATION_FACTOR) and the float32 logits of the predicted tokens with their gradient; then
    MARGIN_FRACTION and MARGIN_BYTES on top. Rough by design: it is there to refuse a model that
    cannot fit before minutes of loading, not to plan the last GiB."""
    element = 2 if dtype == "bfloat16" else 4
    total = shape.parameters * bytes_per_parameter(dtype)
    total += cache_tokens * shape.kv_elements_per_token * element
    if training_tokens is not None:
        total += lora_parameters * 16
        kept = 1 if gradient_checkpointing else ACTIVATION_FACTOR
        total += training_tokens * shape.layers * shape.hidden * element * kept
        if gradient_checkpointing:  # the layer being recomputed holds all of its activations
            total += training_tokens * shape.hidden * element * ACTIVATION_FACTOR
        total += training_tokens * shape.vocab * 4 * 2
    return int(total * (1 + MARGIN_FRACTION) + MARGIN_BYTES)


def lora_parameter_count(shape: ModelShape, rank: int, targets: int) -> int:
    """An upper bound of a LoRA's parameters: `targets` square hidden x hidden layers per
    decoder layer, each with rank x (in + out) weights (projections narrower than the hidden
    size, as k/v with grouped heads, have fewer)."""
    return shape.layers * targets * rank * 2 * shape.hidden


def free_memory(device: torch.device) -> int | None:
    """Free bytes on a CUDA device (torch.cuda.mem_get_info); None for other devices."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


def check_fits(
    spec: str,
    device: torch.device,
    dtype: str,
    *,
    cache_tokens: int = 0,
    training_tokens: int | None = None,
    lora_rank: int = 0,
    lora_targets: int = 0,
    gradient_checkpointing: bool = False,
) -> int | None:
    """Raise DeviceUnavailable, in one line naming the estimate and the free memory, when the
    model `spec` will not fit on the CUDA `device` (see `estimate_bytes`); returns the estimate
    (None: not checked: a CPU, or a model whose size cannot be told before it loads)."""
    free = free_memory(device)
    if free is None:
        return None
    shape = model_shape(spec)
    if shape is None:
        return None
    need = estimate_bytes(
        shape,
        dtype,
        cache_tokens=cache_tokens,
        training_tokens=training_tokens,
        lora_parameters=lora_parameter_count(shape, lora_rank, lora_targets) if training_tokens is not None else 0,
        gradient_checkpointing=gradient_checkpointing,
    )
    if need > free:
        what = "training" if training_tokens is not None else "running"
        hint = (
            " (try --gradient-checkpointing or a smaller --micro-batch)"
            if training_tokens is not None and not gradient_checkpointing
            else ""
        )
        raise DeviceUnavailable(
            f"{spec} does not fit on {device}: {what} it in {dtype} needs about {need / GIB:.1f} GiB "
            f"({shape.parameters / 1e9:.2f}B parameters, with a margin of {MARGIN_FRACTION:.0%} + "
            f"{MARGIN_BYTES // GIB} GiB) and {free / GIB:.1f} GiB are free{hint}"
        )
    return need
