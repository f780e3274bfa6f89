"""EngineConfig: the switches of the local inference engine, in one typed, frozen object.

`Engine(model, stops, config=EngineConfig(...))` takes it, `HFPolicy` and `load_policy` pass it
down, and the training launcher hands each process its share of the machine through it
(`Distributed.engine_config`). None in a field means "decide from the model and the machine" when
the engine is built (docs/engine.md, "Configuration").

Environment variables are an override read here and nowhere else: `EngineConfig.from_env()`
starts from the defaults and takes each `HARNESSRL_*` variable that is set (the table in
docs/engine.md). A malformed value is a ValueError naming the variable. Light to import: no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

# The chunk of a chunked prefill when one is asked for without a size (`HARNESSRL_PREFILL_CHUNK=on`).
PREFILL_CHUNK_TOKENS = 128

# field -> the environment variable that overrides it (packed_any_size is set by
# HARNESSRL_PACKED_DECODE=1 as well)
ENV_OVERRIDES = {
    "overlap_prefill": "HARNESSRL_PREFILL_THREAD",
    "packed_decode": "HARNESSRL_PACKED_DECODE",
    "fast_decode": "HARNESSRL_FAST_DECODE",
    "merge_lora": "HARNESSRL_MERGE_LORA",
    "prefill_chunk_tokens": "HARNESSRL_PREFILL_CHUNK",
    "threads": "HARNESSRL_THREADS",
}


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs; every field's default is the engine's behaviour when not told.

    `shared_prefix_attention`: a decode step reads the keys/values of a prefix every running row
    shares once instead of once per row (equal up to float rounding; off only for comparisons).
    None: on for a model on the CPU, off elsewhere.
    `overlap_prefill`: prefill an admitted request on a second thread while the running rows keep
    decoding (a CPU model only). None: on when torch runs one intra-op thread and the process may
    use a second CPU.
    `packed_decode`: the engine's forwards use oneDNN-prepacked copies of the float32 linear
    weights (as many bytes again as those weights). None: on for a float32 CPU model whose linear
    weights take at most 2 GiB (any size with `packed_any_size`), on a torch with oneDNN.
    `fast_decode`: decode steps run the engine's own forward for Llama models (the same floats).
    None: where it applies (a float32 Llama model on the CPU); True where it does not is a
    ValueError when the engine is built.
    `merge_lora`: in the engine's own decode forward, a peft LoRA layer takes one product with its
    adapters merged into a copy of its base weight (rebuilt when a weight or the adapters' state
    changes) instead of the adapter's own forward (the base product plus two small ones): the same
    model up to float rounding, faster. False: the adapter's own forward, for comparisons.
    `prefill_chunk_tokens`: a request admitted while more than 4 rows decode is prefilled this many
    prompt tokens per step, between decode steps. 0: off.
    `threads`: torch's intra-op threads, set once per process by the first local policy built.
    None: every CPU the process may use but one.
    """

    shared_prefix_attention: bool | None = None
    overlap_prefill: bool | None = None
    packed_decode: bool | None = None
    packed_any_size: bool = False
    fast_decode: bool | None = None
    merge_lora: bool = True
    prefill_chunk_tokens: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_chunk_tokens < 0:
            raise ValueError("prefill_chunk_tokens must be >= 0 (0: off)")

    def with_(self, **changes: Any) -> EngineConfig:
        """A copy with `changes` (field names; TypeError for any other)."""
        return replace(self, **changes) if changes else self

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **changes: Any) -> EngineConfig:
        """The defaults, overridden by each HARNESSRL_* variable set in `env` (default os.environ),
        then by `changes`; a field given in `changes` is not read from the environment at all."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        if "overlap_prefill" not in changes:
            overlap = _switch(env, "HARNESSRL_PREFILL_THREAD")
            if overlap is not None:
                values["overlap_prefill"] = overlap
        if "packed_decode" not in changes:
            packed = _switch(env, "HARNESSRL_PACKED_DECODE")
            if packed is False:
                values["packed_decode"] = False
            elif packed:  # on wherever the model can be packed, whatever its size
                values["packed_any_size"] = True
        if "fast_decode" not in changes and _switch(env, "HARNESSRL_FAST_DECODE") is False:
            values["fast_decode"] = False  # (1: where it applies, as unset)
        if "merge_lora" not in changes:
            merge = _switch(env, "HARNESSRL_MERGE_LORA")
            if merge is not None:
                values["merge_lora"] = merge
        chunk = env.get("HARNESSRL_PREFILL_CHUNK", "").strip().lower()
        if chunk and "prefill_chunk_tokens" not in changes:
            values["prefill_chunk_tokens"] = _chunk_tokens(chunk)
        threads = env.get("HARNESSRL_THREADS", "").strip()
        if threads and "threads" not in changes:
            try:
                values["threads"] = int(threads)
            except ValueError:
                raise ValueError(f"HARNESSRL_THREADS must be a number of threads, got {threads!r}") from None
        return cls(**{**values, **changes})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _switch(env: Mapping[str, str], name: str) -> bool | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _chunk_tokens(wanted: str) -> int:
    """HARNESSRL_PREFILL_CHUNK: tokens per chunk (`on`: PREFILL_CHUNK_TOKENS; 0: off)."""
    if wanted == "on":
        return PREFILL_CHUNK_TOKENS
    try:
        tokens = int(wanted)
    except ValueError:
        tokens = -1
    if tokens < 0:
        raise ValueError(f"HARNESSRL_PREFILL_CHUNK must be a number of tokens >= 0 or 'on', got {wanted!r}")
    return tokens
