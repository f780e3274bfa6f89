"""ServedModels: the base policy a server answers for, and the LoRA adapters loaded at run time.

Each adapter is served by an HFPolicy of its own over its own copy of the base weights with the
adapter merged in (peft's merge_and_unload on a deep copy of the base model). That costs one
full copy of the base weights per loaded adapter (about 540 MB for smollm2-135m in float32),
and buys exactness: an adapter's completions and logprobs are exactly those of
`HFPolicy.from_adapter(folder)` over the same base, with no per-row adapter arithmetic in the
engine, and each adapter keeps its own prefix cache and batch.

Names follow vLLM's runtime LoRA routes (vLLM 0.33, entrypoints/openai/models/serving.py and
lora/worker_manager.py): loading a name that is already loaded is refused unless `inplace`,
which writes the new merged weights into that adapter's model; unloading takes the name out at
once, and its policy is closed when its last request in flight has its answer. As in vLLM:
- there is no limit on the names loaded; at most `max_loras` merged copies are held at once
  (vLLM's --max-loras / --max-cpu-loras LRU): loading or using one more evicts the least
  recently used copy that no request is using, and a request for an evicted adapter merges
  it again from its folder (which must still be there, as vLLM reloads from the path);
- an adapter whose rank exceeds `max_lora_rank` (one of vLLM's --max-lora-rank choices) is
  refused with vLLM's message and status (its engine's error comes back as a 500).
Not as in vLLM: a reload drops the adapter's cached prefixes whatever its path, where vLLM
keeps the blocks of a reload from the same path (its prefix cache is keyed by name and path).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.harness.prompt_tools import PromptTools
from harnessrl.models.hf import HFPolicy
from harnessrl.models.spec import LOCAL_FORMS
from harnessrl.serve.tools import check_tool_parser
from harnessrl.wire.chat import ServeError

log = logging.getLogger(__name__)

LOCAL_ONLY = f"harnessrl serve serves local models only: {LOCAL_FORMS}"
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.33's --max-lora-rank choices
GENERATION_CONFIGS = ("auto", "vllm")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
# what vLLM takes from generation_config.json as request defaults (config/model.py, get_diff_sampling_param);
# its chat completions apply all but the presence and frequency penalties (wire.chat.sampling_params)
GENERATION_DEFAULTS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
)


@dataclass
class ServedModel:
    """One name the server answers for: the base model or one adapter."""

    name: str
    policy: HFPolicy | None  # None: an adapter evicted from the LRU of merged copies
    root: str  # the base model's spec or the adapter's folder (vLLM's `root`)
    parent: str | None = None  # the base model's name, for an adapter
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0
    retired: bool = False  # unloaded: close the policy when nothing is in flight
    max_context: int | None = None
    used: int = 0  # LRU clock: when a request or a load last touched it

    def raw_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """log softmax(z) of each completion token, untempered (vLLM's raw_logprobs), by one
        teacher-forced forward pass while the engine waits."""
        import torch

        policy = self.policy
        assert policy is not None
        device = next(policy.model.parameters()).device
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
        with policy.paused(), torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt_ids) :].unsqueeze(-1))
        return picked.squeeze(-1).tolist()

    def card(self) -> dict:
        """The /v1/models entry (vLLM's fields)."""
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "harnessrl",
            "root": self.root,
            "parent": self.parent,
            "max_model_len": self.max_context,
        }


class ServedModels:
    """The base policy under `name` plus adapters by name, at most `max_loras` of them merged
    at once (LRU, see the module docstring); thread-safe.

    `owns_base`: `close()` closes the base policy too (True when this object loaded it).
    Adapter policies are always this object's to close. `max_lora_rank`: the highest adapter
    rank accepted (vLLM's choices, default 16 as vLLM's). `generation_config`: "vllm" (requests
    default to OpenAI's neutral values) or "auto" (fields a request does not send default to
    the base model's generation_config, as vLLM's default does; see `sampling_defaults`).
    `logprobs_mode`: "processed_logprobs" (log softmax(z / T), what is sampled from) or
    "raw_logprobs" (log softmax(z), vLLM's default). `tool_call_parser`: a registered tool-call
    format (hermes, json, ...): requests with `tools` are served through it (harness/prompt_tools.py), as
    vLLM's --enable-auto-tool-choice --tool-call-parser; None (the default) refuses them as vLLM
    does without those flags.
    """

    def __init__(
        self,
        base: HFPolicy,
        name: str | None = None,
        *,
        root: str | None = None,
        max_loras: int = 4,
        owns_base: bool = False,
        max_lora_rank: int = 16,
        generation_config: str = "vllm",
        logprobs_mode: str = "processed_logprobs",
        tool_call_parser: str | None = None,
    ):
        if not isinstance(base, HFPolicy):
            raise TypeError(f"{LOCAL_ONLY}; got a {type(base).__name__}")
        if max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got {max_loras}")
        if max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, MAX_LORA_RANKS))}, got {max_lora_rank}")
        if generation_config not in GENERATION_CONFIGS:
            raise ValueError(f"generation_config must be auto or vllm, got {generation_config!r}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be raw_logprobs or processed_logprobs, got {logprobs_mode!r}")
        name = name or base.name
        context = getattr(base.model.config, "max_position_embeddings", None)
        self.base = ServedModel(name=name, policy=base, root=root or base.name, max_context=context)
        self.base_policy = base  # `self.base.policy`, typed: the base is never evicted nor retired
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.generation_config = generation_config
        self.logprobs_mode = logprobs_mode
        # native tool calls (vLLM's --enable-auto-tool-choice --tool-call-parser P): None refuses them
        self.tool_call_parser = check_tool_parser(tool_call_parser is not None, tool_call_parser)
        self.prompt_tools = PromptTools.named(tool_call_parser) if tool_call_parser is not None else None
        self.owns_base = owns_base
        self._clock = 0
        self._adapters: dict[str, ServedModel] = {}
        self._lock = threading.Lock()  # the name table and in-flight counters
        self._admin = threading.Lock()  # one load or unload at a time (they check, then act)

    @classmethod
    def from_spec(
        cls,
        spec: str,
        *,
        served_model_name: str | None = None,
        max_loras: int = 4,
        dtype: str = "float32",
        **options: Any,
    ) -> ServedModels:
        """Load a local model spec (tiny-random, smollm2-135m, hf:PATH). ValueError for any other
        form (an openai: server, the oracle) or a path that does not exist. `options`: the
        vLLM-like keywords of the constructor (max_lora_rank, generation_config, logprobs_mode,
        tool_call_parser)."""
        from harnessrl.models import load_policy
        from harnessrl.models.choice import choose_local

        chosen = choose_local(spec, f"{LOCAL_ONLY}; {spec.strip()!r} is not one", dtype=dtype)
        spec = chosen.text
        policy = load_policy(chosen)
        assert isinstance(policy, HFPolicy)
        return cls(policy, served_model_name or spec, root=spec, max_loras=max_loras, owns_base=True, **options)

    # ---------------------------------------------------------------------------------- names

    @property
    def base_name(self) -> str:
        return self.base.name

    def entries(self) -> list[ServedModel]:
        with self._lock:
            return [self.base, *self._adapters.values()]

    def adapter_names(self) -> list[str]:
        with self._lock:
            return list(self._adapters)

    def sampling_defaults(self) -> dict[str, float]:
        """The request defaults of `generation_config`: {} for "vllm"; for "auto", the sampling
        fields the base model's generation config sets away from transformers' defaults (its
        generation_config.json), as vLLM reads them."""
        if self.generation_config == "vllm":
            return {}
        config = getattr(self.base_policy.model, "generation_config", None)
        diff = config.to_diff_dict() if config is not None else {}
        return {k: diff[k] for k in GENERATION_DEFAULTS if diff.get(k) is not None}

    def acquire(self, name: str | None) -> ServedModel:
        """The model named `name` (None: the base), held for one request until `release`: an
        adapter unloaded meanwhile is closed only after that, and an evicted one is merged again
        from its folder first (slow: call it off the event loop). ServeError 404 for an unknown name."""
        with self._lock:
            entry = self.base if name is None or name == self.base.name else self._adapters.get(name)
            if entry is None:
                raise ServeError(404, f"The model `{name}` does not exist.", param="model")
            entry.in_flight += 1
            self._clock += 1
            entry.used = self._clock
            resident = entry.policy is not None
        if not resident:
            try:
                self._make_resident(entry)
            except BaseException:
                self.release(entry)
                raise
        return entry

    def release(self, entry: ServedModel) -> None:
        with self._lock:
            entry.in_flight -= 1
            close = entry.retired and entry.in_flight == 0 and entry.policy is not None
            policy = entry.policy if close else None
            if close:
                entry.policy = None
        if policy is not None:
            policy.close()

    @contextlib.contextmanager
    def use(self, name: str | None) -> Iterator[ServedModel]:
        """`acquire` ... `release` as a block."""
        entry = self.acquire(name)
        try:
            yield entry
        finally:
            self.release(entry)

    # -------------------------------------------------------------------------------- adapters

    def load_adapter(self, name: str, path: str, *, inplace: bool = False) -> str:
        """Load the peft adapter folder `path` under `name` (slow: a copy of the base weights).
        With `inplace`, an adapter already loaded under `name` gets the new weights in place.
        ServeError 400 for a bad name or a folder that is not an adapter of this base, 500 (as
        vLLM) for a rank above `max_lora_rank`. Returns a one-line success message."""
        name = (name or "").strip()
        if not name:
            raise ServeError(400, "lora_name must not be empty", param="lora_name")
        if name == self.base.name:
            raise ServeError(400, f"lora_name {name!r} is the base model's name", param="lora_name")
        if self.base_policy.quantization is not None:
            raise ServeError(
                400,
                f"this server runs {self.base.name} with int8 linear layers (--dtype int8), and LoRA adapters are "
                "merged into float weights: serve it with --dtype float32 or bfloat16 to load adapters",
                param="lora_path",
            )
        if self.max_loras == 0:
            raise ServeError(400, "this server loads no LoRA adapters (--max-loras 0)", param="lora_name")
        folder = self._adapter_folder(path)
        self._check_rank(folder)
        with self._admin:
            with self._lock:
                existing = self._adapters.get(name)
            if existing is not None and not inplace:
                raise ServeError(
                    400,
                    f"The lora adapter '{name}' has already been loaded "
                    "(load_inplace=true replaces its weights; or unload it first)",
                    param="lora_name",
                )
            merged = self._merged_copy(folder)
            if existing is not None:
                if existing.root == str(folder):
                    # vLLM keeps this adapter's cached blocks here (same name, same path); this
                    # server cannot keep them and drops them: it warns as vLLM does
                    log.warning(
                        "Reloaded LoRA adapter '%s' in place from the same path '%s': vLLM would keep serving "
                        "prefix-cache blocks computed with its previous weights (load changed weights from a new "
                        "path); this server drops them",
                        name,
                        folder,
                    )
                with self._lock:
                    policy = existing.policy
                    existing.root = str(folder)
                if policy is not None:
                    with policy.paused():  # no engine step sees half-written weights
                        policy.model.load_state_dict(merged.state_dict())
                        policy.clear_cache()
                log.info("reloaded adapter %s in place from %s", name, folder)
                return f"Success: LoRA adapter '{name}' reloaded in place from {folder}."
            entry = ServedModel(
                name=name,
                policy=self._adapter_policy(name, merged),
                root=str(folder),
                parent=self.base.name,
                max_context=self.base.max_context,
            )
            with self._lock:
                self._clock += 1
                entry.used = self._clock
                self._adapters[name] = entry
            self._evict()
            log.info("loaded adapter %s from %s", name, folder)
            return f"Success: LoRA adapter '{name}' added successfully."

    def unload_adapter(self, name: str) -> str:
        """Take `name` out (ServeError 404 if it is not loaded); its policy closes when the
        requests it is serving have their answers."""
        with self._admin:
            with self._lock:
                entry = self._adapters.pop(name, None)
                if entry is None:
                    raise ServeError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name")
                entry.retired = True
                policy = entry.policy if entry.in_flight == 0 else None
                if policy is not None:
                    entry.policy = None
            if policy is not None:
                policy.close()
        log.info("unloaded adapter %s", name)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def resident_adapters(self) -> list[str]:
        """The adapters whose merged copy is held now (at most `max_loras` when none is busy)."""
        with self._lock:
            return [n for n, e in self._adapters.items() if e.policy is not None]

    def _adapter_policy(self, name: str, merged) -> HFPolicy:
        base = self.base_policy
        return HFPolicy(
            merged,
            base.tokenizer,
            name=name,
            tool_role=base.tool_role,
            default_sampling=base.default_sampling,
            max_batch=base.max_batch,
            cache_budget_tokens=base.cache_budget_tokens,
        )

    def _make_resident(self, entry: ServedModel) -> None:
        """Merge an evicted adapter again from its folder (vLLM reloads from the path too)."""
        with self._admin:
            if entry.policy is not None:  # another request did it meanwhile
                return
            folder = Path(entry.root)
            if not (folder / "adapter_config.json").is_file():
                raise ServeError(
                    404,
                    f"Loading lora {entry.name} failed: No adapter found for {folder} (it was evicted from the "
                    f"{self.max_loras} adapters held at once, --max-loras, and its folder is gone)",
                    param="model",
                )
            policy = self._adapter_policy(entry.name, self._merged_copy(folder))
            with self._lock:
                entry.policy = policy
            log.info("merged evicted adapter %s again from %s", entry.name, folder)
        self._evict()

    def _evict(self) -> None:
        """Close the least recently used merged copies no request is using until at most
        `max_loras` are held (busy ones stay: the limit is exceeded until they are done)."""
        closing: list[HFPolicy] = []
        with self._lock:
            resident = sorted((e for e in self._adapters.values() if e.policy is not None), key=lambda e: e.used)
            extra = len(resident) - self.max_loras
            for entry in resident:
                if extra <= 0:
                    break
                if entry.in_flight == 0:
                    assert entry.policy is not None  # resident
                    closing.append(entry.policy)
                    entry.policy = None
                    extra -= 1
        for policy in closing:
            log.info("evicted adapter %s (--max-loras %d)", policy.name, self.max_loras)
            policy.close()

    def _check_rank(self, folder: Path) -> None:
        """vLLM's check (lora/peft_helper.py, validate_legal): the highest of r and rank_pattern."""
        try:
            config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ServeError(400, f"cannot read {folder / 'adapter_config.json'}: {exc}", param="lora_path") from None
        ranks = [config.get("r") or 0, *((config.get("rank_pattern") or {}).values())]
        rank = max(int(r) for r in ranks)
        if rank > self.max_lora_rank:
            enough = [r for r in MAX_LORA_RANKS if r >= rank]
            hint = f" (serve with --max-lora-rank {enough[0]})" if enough else ""
            raise ServeError(
                500, f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.{hint}", param="lora_path"
            )

    def _adapter_folder(self, path: str) -> Path:
        if not path or not str(path).strip():
            raise ServeError(400, "lora_path must name a peft adapter folder", param="lora_path")
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise ServeError(400, f"lora_path {path!r} is not a folder", param="lora_path")
        if not (folder / "adapter_config.json").is_file():
            raise ServeError(
                400, f"lora_path {path!r} is not a peft adapter folder (no adapter_config.json)", param="lora_path"
            )
        return folder.resolve()

    def _merged_copy(self, folder: Path):
        """A deep copy of the base model with the adapter in `folder` merged into its weights."""
        from peft import PeftModel

        self._warn_other_base(folder)
        base_model = self.base_policy.model
        try:
            model = PeftModel.from_pretrained(copy.deepcopy(base_model), str(folder)).merge_and_unload()
        except Exception as exc:  # noqa: BLE001 - any failure of peft is a bad adapter for this base
            raise ServeError(
                400,
                f"cannot apply the adapter {folder} to {self.base.name}: {type(exc).__name__}: {exc}",
                param="lora_path",
            ) from None
        model.eval()
        return model

    def _warn_other_base(self, folder: Path) -> None:
        """Log when the adapter's harnessrl.json names another base model (it is still applied to
        the served base, as vLLM does, but its outputs are then not what it was trained for)."""
        meta = folder / "harnessrl.json"
        try:
            declared = json.loads(meta.read_text(encoding="utf-8")).get("base_model") if meta.is_file() else None
        except (OSError, ValueError, AttributeError):
            declared = None
        if declared and declared not in (self.base.root, self.base.name):
            log.warning("adapter %s names %s as its base; serving it on %s", folder, declared, self.base.root)

    # ----------------------------------------------------------------------------------- close

    def close(self) -> None:
        """Close every adapter policy (and the base one when this object owns it)."""
        with self._lock:
            adapters = list(self._adapters.values())
            self._adapters.clear()
        for entry in adapters:
            entry.retired = True
            if entry.policy is not None:
                entry.policy.close()
        if self.owns_base:
            self.base_policy.close()
