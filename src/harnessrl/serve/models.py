"""ServedModels: the base policy a server answers for, and the LoRA adapters loaded at run time.

Each adapter is served by an HFPolicy of its own over its own copy of the base weights with the
adapter merged in (peft's merge_and_unload on a deep copy of the base model). That costs one
full copy of the base weights per loaded adapter (about 540 MB for smollm2-135m in float32),
and buys exactness: an adapter's completions and logprobs are exactly those of
`HFPolicy.from_adapter(folder)` over the same base, with no per-row adapter arithmetic in the
engine, and each adapter keeps its own prefix cache and batch.

Names follow vLLM's runtime LoRA routes: loading a name that is already loaded is refused
unless `inplace`, which writes the new merged weights into that adapter's model (the engine's
prefix cache is dropped, so every request after the reload sees only the new weights);
unloading takes the name out at once, and its policy is closed when its last request in flight
has its answer.
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

from harnessrl.models.hf import HFPolicy
from harnessrl.serve.protocol import ServeError

log = logging.getLogger(__name__)

LOCAL_ONLY = "harnessrl serve serves local models only: tiny-random, smollm2-135m or hf:PATH"


@dataclass
class ServedModel:
    """One name the server answers for: the base model or one adapter."""

    name: str
    policy: HFPolicy
    root: str  # the base model's spec or the adapter's folder (vLLM's `root`)
    parent: str | None = None  # the base model's name, for an adapter
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0
    retired: bool = False  # unloaded: close the policy when nothing is in flight

    @property
    def max_context(self) -> int | None:
        return getattr(self.policy.model.config, "max_position_embeddings", None)

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
    """The base policy under `name` plus up to `max_loras` adapters by name; thread-safe.

    `owns_base`: `close()` closes the base policy too (True when this object loaded it).
    Adapter policies are always this object's to close.
    """

    def __init__(
        self,
        base: HFPolicy,
        name: str | None = None,
        *,
        root: str | None = None,
        max_loras: int = 4,
        owns_base: bool = False,
    ):
        if not isinstance(base, HFPolicy):
            raise TypeError(f"{LOCAL_ONLY}; got a {type(base).__name__}")
        if max_loras < 0:
            raise ValueError(f"max_loras must be >= 0, got {max_loras}")
        name = name or base.name
        self.base = ServedModel(name=name, policy=base, root=root or base.name)
        self.max_loras = max_loras
        self.owns_base = owns_base
        self._adapters: dict[str, ServedModel] = {}
        self._lock = threading.Lock()  # the name table and in-flight counters
        self._admin = threading.Lock()  # one load or unload at a time (they check, then act)

    @classmethod
    def from_spec(
        cls, spec: str, *, served_model_name: str | None = None, max_loras: int = 4, dtype: str = "float32"
    ) -> ServedModels:
        """Load a local model spec (tiny-random, smollm2-135m, hf:PATH). ValueError for any other
        form (an openai: server, the oracle) or a path that does not exist."""
        from harnessrl.models import MODEL_NAMES, check_spec, load_policy

        spec = spec.strip()
        if not (spec in MODEL_NAMES or spec.startswith("hf:")):
            raise ValueError(f"{LOCAL_ONLY}; {spec!r} is not one")
        check_spec(spec, option="--model")
        policy = load_policy(spec, dtype=dtype)
        assert isinstance(policy, HFPolicy)
        return cls(policy, served_model_name or spec, root=spec, max_loras=max_loras, owns_base=True)

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

    @contextlib.contextmanager
    def use(self, name: str | None) -> Iterator[ServedModel]:
        """The model named `name` (None: the base), held for one request: an adapter unloaded
        meanwhile is closed only after this block. ServeError 404 for an unknown name."""
        with self._lock:
            entry = self.base if name is None or name == self.base.name else self._adapters.get(name)
            if entry is None:
                raise ServeError(404, f"The model `{name}` does not exist.", param="model")
            entry.in_flight += 1
        try:
            yield entry
        finally:
            with self._lock:
                entry.in_flight -= 1
                close = entry.retired and entry.in_flight == 0
            if close:
                entry.policy.close()

    # -------------------------------------------------------------------------------- adapters

    def load_adapter(self, name: str, path: str, *, inplace: bool = False) -> str:
        """Load the peft adapter folder `path` under `name` (slow: a copy of the base weights).
        With `inplace`, an adapter already loaded under `name` gets the new weights in place.
        ServeError 400 for a bad name, a full table, or a folder that is not an adapter of this
        base. Returns a one-line success message."""
        name = (name or "").strip()
        if not name:
            raise ServeError(400, "lora_name must not be empty", param="lora_name")
        if name == self.base.name:
            raise ServeError(400, f"lora_name {name!r} is the base model's name", param="lora_name")
        if self.base.policy.quantization is not None:
            raise ServeError(
                400,
                f"this server runs {self.base.name} with int8 linear layers (--dtype int8), and LoRA adapters are "
                "merged into float weights: serve it with --dtype float32 or bfloat16 to load adapters",
                param="lora_path",
            )
        folder = self._adapter_folder(path)
        with self._admin:
            with self._lock:
                existing = self._adapters.get(name)
                count = len(self._adapters)
            if existing is not None and not inplace:
                raise ServeError(
                    400,
                    f"The lora adapter '{name}' has already been loaded "
                    "(load_inplace=true replaces its weights; or unload it first)",
                    param="lora_name",
                )
            if existing is None and count >= self.max_loras:
                raise ServeError(
                    400,
                    f"cannot load '{name}': {count} of at most {self.max_loras} adapters are loaded "
                    f"(--max-loras {self.max_loras}); unload one first (POST /v1/unload_lora_adapter)",
                    param="lora_name",
                )
            merged = self._merged_copy(folder)
            if existing is not None:
                policy = existing.policy
                with policy.paused():  # no engine step sees half-written weights
                    policy.model.load_state_dict(merged.state_dict())
                    policy.clear_cache()
                existing.root = str(folder)
                log.info("reloaded adapter %s in place from %s", name, folder)
                return f"Success: LoRA adapter '{name}' reloaded in place from {folder}."
            base = self.base.policy
            policy = HFPolicy(
                merged,
                base.tokenizer,
                name=name,
                tool_role=base.tool_role,
                default_sampling=base.default_sampling,
                max_batch=base.max_batch,
                cache_budget_tokens=base.cache_budget_tokens,
            )
            with self._lock:
                self._adapters[name] = ServedModel(name=name, policy=policy, root=str(folder), parent=self.base.name)
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
                close = entry.in_flight == 0
            if close:
                entry.policy.close()
        log.info("unloaded adapter %s", name)
        return f"Success: LoRA adapter '{name}' removed successfully."

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
        base_model = self.base.policy.model
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
            entry.policy.close()
        if self.owns_base:
            self.base.policy.close()
