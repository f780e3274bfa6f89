"""A model as a request is measured with (harnessrl.preflight): its tokenizer, chat template and
context read without loading its weights where that can be helped (a named model's context from
its config; hf:PATH's tokenizer and config from its folder; an adapter followed to its base)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harnessrl.models.base import GenerationRequest
from harnessrl.models.spec import ModelSpec


@dataclass
class PromptModel:
    """What a request is measured with: the model's tokenizer and chat template (rendered as
    HFPolicy renders a prompt) and its context; `tokenizer` None for a model served elsewhere."""

    name: str
    tokenizer: Any
    context: int | None

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        from harnessrl.models import chat

        role = chat.default_tool_role(self.tokenizer)
        return chat.render_prompt_ids(self.tokenizer, request.messages, role, request.tools)

    def size(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @property
    def unit(self) -> Literal["tokens", "characters"]:
        return "characters" if self.tokenizer is None else "tokens"


def prompt_model(spec: str) -> PromptModel:
    """The tokenizer and context of a model spec, without loading its weights where it can be
    helped (a named model's context from its config; hf:PATH's tokenizer and config from its
    folder). ValueError for a spec that names no model, ModelUnavailable for one that cannot be read."""
    parsed = ModelSpec.parse(spec)
    if parsed.kind == "openai" or parsed.kind == "oracle":
        return PromptModel(spec, None, None)
    if parsed.kind == "named":
        from harnessrl.models.embedded import load_tokenizer

        return PromptModel(spec, load_tokenizer(), _named_context(parsed.name))
    return _hf_prompt_model(spec, Path(parsed.path).expanduser())


def _named_context(name: str) -> int | None:
    from harnessrl.models import embedded

    if name == "smollm2-135m" and embedded.is_complete(embedded.smollm2_model_dir()):
        folder = embedded.smollm2_model_dir()  # converted already: read its config, not its weights
    else:
        folder = embedded.model_folder(name)
    return _context_of(json.loads((folder / "config.json").read_text(encoding="utf-8")))


def _context_of(config: dict[str, Any]) -> int | None:
    context = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return int(context) if context else None


def _hf_prompt_model(spec: str, path: Path) -> PromptModel:
    from transformers import AutoTokenizer

    from harnessrl.models import chat
    from harnessrl.models.base import ModelUnavailable

    folder = path
    if path.is_dir() and (path / "adapter_config.json").is_file():  # a LoRA adapter: its base model's
        meta = path / "harnessrl.json"
        base = json.loads(meta.read_text(encoding="utf-8")).get("base_model") if meta.is_file() else None
        if base is None:
            base = "hf:" + str(json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path"))
        return prompt_model(base)
    if path.is_file() and path.suffix == ".gguf":
        raise ModelUnavailable(f"{path}: preflight reads a model folder, not a .gguf file (use --no-preflight)")
    if not (path / "config.json").is_file():
        raise ModelUnavailable(f"{path} is not a transformers model folder (no config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelUnavailable(f"cannot read the tokenizer of {path}: {type(exc).__name__}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = chat.CHATML_TEMPLATE  # as HFPolicy.from_pretrained does
    return PromptModel(spec, tokenizer, _context_of(json.loads((path / "config.json").read_text(encoding="utf-8"))))


def served_elsewhere(spec: str) -> bool:
    """Whether `spec` names no local model (a server's, or the oracle): its prompts are not
    rendered here."""
    return not ModelSpec.parse(spec).local
