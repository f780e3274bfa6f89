"""ModelChoice: a job's model, chosen once.

`choose_model(text, device=..., dtype=..., api_key_env=...)` parses the spec, checks it (an hf:
path that exists, an API-key variable that is set, the oracle only where the job accepts it),
and for a local model resolves the device and the precision on this machine ("auto" becomes a
real device and dtype; a device this machine lacks is refused here, before anything loads). For a
model on a server, a device or dtype other than the neutral ones is refused with the option named.
Every job makes this choice once, in the job kernel (harnessrl.kernel); `load_policy` takes the
choice and resolves nothing again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harnessrl.models.spec import LOCAL_FORMS, ModelSpec, check_spec

if TYPE_CHECKING:
    import torch

# What a device or dtype option may say for a model that is not loaded here (a server, the oracle).
NEUTRAL = {"--device": ("auto",), "--dtype": ("auto", "float32")}


@dataclass(frozen=True)
class ModelChoice:
    """One model a job uses. `spec` is the parsed spec; for a local model `device` and `dtype`
    are resolved (`torch.device`, "float32" | "bfloat16" | "int8"), else both None.
    `api_key_env` names the variable holding a server's API key (the name only, never the key).
    `option` is the command-line option it came from ("--model", "--collect-model", ...)."""

    spec: ModelSpec
    device: torch.device | None = None
    dtype: str | None = None
    api_key_env: str | None = None
    option: str = "--model"

    @property
    def text(self) -> str:
        """The spec as the user wrote it (stripped): what run folders record."""
        return self.spec.text

    @property
    def local(self) -> bool:
        """A model loaded into this process (trainable, with a device and dtype)."""
        return self.spec.local

    @property
    def oracle(self) -> bool:
        """The oracle: no model, each task's known solution replayed."""
        return self.spec.kind == "oracle"

    def recorded(self) -> dict[str, str]:
        """What a run folder records of a local model's precision: the device as it resolved (a
        resume may continue on another one: it changes float rounding only) and the dtype only
        when it is not float32 (runs from before the option resume as they were, and a float32
        run is not continued in bfloat16 unnoticed). Empty for a model that is not local."""
        if not self.local:
            return {}
        return {"device": str(self.device), **({"dtype": str(self.dtype)} if self.dtype != "float32" else {})}


def choose_model(
    text: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    api_key_env: str | None = None,
    option: str = "--model",
    key_option: str = "--api-key-env",
    oracle: bool = False,
) -> ModelChoice:
    """The model `text` names, checked and (local) resolved on this machine; ValueError with
    the option named for a spec of no known form, an hf: path that does not exist, an unset
    API-key variable, the oracle where `oracle` is False, a device or dtype given for a model
    that is not local; DeviceUnavailable (a ValueError) for a device this machine lacks."""
    spec = check_spec(text, api_key_env, option=option, key_option=key_option, oracle=oracle)
    return resolve_choice(spec, device=device, dtype=dtype, api_key_env=api_key_env, option=option)


def resolve_choice(
    spec: ModelSpec,
    *,
    device: str = "auto",
    dtype: str = "auto",
    api_key_env: str | None = None,
    option: str = "--model",
) -> ModelChoice:
    """`spec` resolved on this machine without `choose_model`'s checks of the spec itself (for
    `load_policy(str)`, which leaves those to the loader): a local model's device and dtype, or
    the refusal of a device or dtype given for a model that is not local."""
    if spec.local:
        from harnessrl.models.device import resolve_device, resolve_dtype

        where = resolve_device(device)
        return ModelChoice(spec, where, resolve_dtype(dtype, where), api_key_env, option)
    for flag, value in (("--dtype", dtype), ("--device", device)):
        if value not in NEUTRAL[flag]:
            raise ValueError(f"{flag} {value} applies to local models ({LOCAL_FORMS}), not {spec.text!r}")
    return ModelChoice(spec, None, None, api_key_env, option)


def choose_local(
    text: str, refusal: str, *, device: str = "auto", dtype: str = "auto", option: str = "--model"
) -> ModelChoice:
    """A model that must be local (trained, or served by `harnessrl serve`): `refusal` (ValueError)
    for any other form, else `choose_model`'s checks and resolution."""
    if ModelSpec.parse_local(text) is None:
        raise ValueError(refusal)
    return choose_model(text, device=device, dtype=dtype, option=option)


def is_local_spec(text: str) -> bool:
    """Whether `text` names a local model (a named model or hf:PATH), without checking it."""
    return ModelSpec.parse_local(text) is not None
