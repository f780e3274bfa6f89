"""The LoRA-adapted local model both trainers (GRPO: trainer.py, SFT: sft.py) set up, checkpoint
and save the same way.

    check_trainable       cheap: int8 or a model that is not local cannot be trained
    trained_model         the local model a job fine-tunes, as the job kernel chose it (device, dtype)
    load_local_policy     the model loaded as an HFPolicy: training needs its weights in this process
    open_run_folder       OUT opened with the options and the precision as they resolve (kernel.job_record)
    record_start          a collecting run's shell isolation and executor, in its record
    attach                LoRA injected in place (the policy then generates with the adapter),
                          initialised from the run seed alone; its trainable parameters, AdamW
    write_checkpoint      OUT/checkpoint: adapter/, optimizer.pt, extra tensors, state.json
    checkpoint_folder     the checkpoint a resume reads (or the previous one, after a crash)
    load_adapter_weights  a checkpoint's adapter weights back into the peft model
    adapter_state         a CPU copy of the adapter's weights as they are
    holding_weights       the model holds other adapter weights inside a block, then its own again
    write_adapter         OUT/adapter: a peft adapter folder + harnessrl.json naming the base model
    WritesAdapter         save_adapter for every trainer (GRPO, SFT, distill): write_adapter with its facts

The checks take the exception class of their caller (TrainError, SFTError), so each command
reports a bad model or checkpoint as its own error.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from harnessrl import __version__
from harnessrl.rundir import RunFolder, write_json

if TYPE_CHECKING:
    from harnessrl.models.choice import ModelChoice

ADAPTER_META = "harnessrl.json"


def check_trainable(config: Any, error: type[Exception]) -> None:
    """`error` for a config whose model cannot be trained, without resolving its device: int8
    (no gradients), or a model that is not local."""
    from harnessrl.models import LOCAL_FORMS
    from harnessrl.models.choice import is_local_spec

    if config.dtype == "int8":
        raise error("--dtype int8 cannot be trained (int8 layers have no gradients): use auto, float32 or bfloat16")
    if not is_local_spec(config.model):
        raise error(f"cannot train '{config.model}': training needs a local model ({LOCAL_FORMS})")


def trained_model(config: Any, error: type[Exception], choice: ModelChoice | None = None) -> ModelChoice:
    """The local model a training job fine-tunes: `choice` (what the job kernel chose), or chosen
    here from the config's --model, --device and --dtype; `error` in one line for a model that is
    not local, a path that does not exist, a device this machine lacks or int8 (no gradients)."""
    from harnessrl.models import LOCAL_FORMS
    from harnessrl.models.choice import choose_local

    if config.dtype == "int8":
        raise error("--dtype int8 cannot be trained (int8 layers have no gradients): use auto, float32 or bfloat16")
    refusal = f"cannot train '{config.model}': training needs a local model ({LOCAL_FORMS})"
    if choice is not None and not choice.local:
        raise error(refusal)
    try:
        return (
            choice
            if choice is not None
            else choose_local(config.model, refusal, device=config.device, dtype=config.dtype)
        )
    except ValueError as e:
        raise error(str(e)) from None


def _chosen(model: str | ModelChoice, device: str, dtype: str) -> ModelChoice:
    from harnessrl.models import LOCAL_FORMS
    from harnessrl.models.choice import ModelChoice, choose_local

    if isinstance(model, ModelChoice):
        return model
    return choose_local(
        model, f"training needs a local model ({LOCAL_FORMS}), not {model!r}", device=device, dtype=dtype
    )


def load_local_policy(
    model: str | ModelChoice,
    error: type[Exception],
    *,
    device: str = "auto",
    dtype: str = "auto",
    training: Any = None,
    engine: Any = None,
):
    """The model as an HFPolicy (its tokenizer, its torch model, its engine) on `device` in
    `dtype` ("auto": float32 on a CPU, bfloat16 on CUDA; harnessrl.models.device), or as a
    ModelChoice already resolved (`trained_model`; `device` and `dtype` are then not read).
    `training`: the run's TrainConfig or SFTConfig, whose micro-batch, LoRA and gradient
    checkpointing size the memory check made before loading (without it only the weights and
    the engine's cache are counted). `engine`: the engine's switches
    (harnessrl.models.engine_config.EngineConfig; default from the environment). A device this
    machine lacks, int8, or a model that will not fit is `error`, in one line."""
    from harnessrl.models import LOCAL_FORMS, load_policy
    from harnessrl.models.base import ModelUnavailable
    from harnessrl.models.device import check_fits
    from harnessrl.models.hf import DEFAULT_CACHE_BUDGET_TOKENS, HFPolicy

    if dtype == "int8" or getattr(model, "dtype", None) == "int8":
        raise error("--dtype int8 cannot be trained (int8 layers have no gradients): use auto, float32 or bfloat16")
    try:
        chosen = _chosen(model, device, dtype)
        if not chosen.local or chosen.device is None or chosen.dtype is None:
            raise error(f"training needs a local transformers model ({LOCAL_FORMS}), not {chosen.text!r}")
        if training is not None:
            check_fits(
                chosen.text,
                chosen.device,
                chosen.dtype,
                cache_tokens=DEFAULT_CACHE_BUDGET_TOKENS,
                training_tokens=training.micro_batch,
                lora_rank=training.lora_r,
                lora_targets=len(training.lora_targets),
                gradient_checkpointing=training.gradient_checkpointing,
            )
    except ValueError as e:  # DeviceUnavailable, or a spec of no known form
        raise error(str(e)) from None
    try:
        policy = load_policy(chosen, engine=engine)
    except (ValueError, ModelUnavailable, OSError) as e:
        raise error(f"cannot load model '{chosen.text}': {e}") from None
    if not isinstance(policy, HFPolicy):
        raise error(f"training needs a local transformers model ({LOCAL_FORMS}), not {chosen.text!r}")
    return policy


def open_run_folder(
    out: Path,
    kind: str,
    config: Any,
    choice: ModelChoice,
    *,
    resume: bool,
    may_differ: Sequence[str],
    recorded_when_on: Mapping[str, Any] | None = None,
    **record: Any,
) -> RunFolder:
    """OUT opened for a training run (RunFolder.open: a fresh start, or a resume that must match):
    the config's options with the precision `choice` resolved (harnessrl.kernel.job_record), and `record`
    beside them (the harness specs). `recorded_when_on`: options recorded only when they are not
    at this off value, so that runs from before the option resume as they were. A refusal is the
    RunFolderError (a JobError) naming what differs."""
    from harnessrl.kernel import job_record

    options = config.model_dump()
    off = [name for name, value in (recorded_when_on or {}).items() if name in options and options[name] == value]
    return RunFolder.open(out, kind, job_record(options, choice, off, **record), resume=resume, may_differ=may_differ)


def record_start(folder: RunFolder, specs: list[Any], offers_shell: bool, executor: Any) -> None:
    """What a run that collects its own episodes records at its start: whether the shell it offers
    is isolated, and where its episodes run."""
    folder.record_shell_isolation(specs, offers_shell, training=True)
    folder.record(executor=executor.describe())


def lora_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def attach(policy, config, error: type[Exception]) -> tuple[Any, list[torch.nn.Parameter], torch.optim.AdamW]:
    """LoRA on `policy.model` from `config` (TrainConfig or SFTConfig: model, seed, lora_r,
    lora_alpha, lora_targets, lr, weight_decay): the peft model, its trainable parameters, their AdamW.

    The LoRA layers are injected into policy.model in place, so the policy generates with the
    adapter. No dropout, and the model stays in eval mode, in training too: dropout would make the
    training log-probs differ from the rollout's, and a resumed run compute other numbers than the
    uninterrupted one."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(config.lora_targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # the LoRA init depends only on the seed
            torch.manual_seed(config.seed)
            # peft reads transformers' deprecated is_gradient_checkpointing: a FutureWarning on every
            # training run that the user can do nothing about
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(policy.model, lora)
    except ValueError as e:
        raise error(
            f"cannot apply LoRA to {config.model} (--lora-targets {','.join(config.lora_targets)}): {e}"
        ) from None
    assert peft_model.get_base_model() is policy.model
    peft_model.eval()
    if getattr(config, "gradient_checkpointing", False):
        enable_gradient_checkpointing(policy.model, error)
    trainable = [p for _, p in lora_parameters(peft_model)]
    # With a bfloat16 base peft keeps the adapter in float32 (autocast_adapter_dtype, on by
    # default): AdamW's moments take their parameters' dtype, so they are float32 too.
    return peft_model, trainable, torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)


def enable_gradient_checkpointing(model: torch.nn.Module, error: type[Exception]) -> None:
    """Recompute each decoder layer's activations in the backward instead of keeping them
    (transformers' activation checkpointing, non-reentrant: gradients reach the LoRA weights
    although the layers' inputs need none, and the result equals the plain backward).

    transformers checkpoints a layer only while that module is in training mode, and the
    trainers keep the model in eval mode (no dropout anywhere: see `attach`); the training
    forward (`harnessrl.train.grpo.token_logprobs`) therefore switches the flag of the
    checkpointed modules alone for its duration (`checkpointing_forward`), which changes nothing
    else they compute."""
    kwargs = {"use_reentrant": False}
    try:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x
            # transformers model methods: nn.Module.__getattr__ is typed as returning Tensor | Module
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
    except (ValueError, AttributeError) as e:
        raise error(f"--gradient-checkpointing: this model does not support it ({e})") from None


# -- the run folder's checkpoint and adapter ----------------------------------------------------------


def write_checkpoint(
    out: Path,
    peft_model,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    tensors: dict[str, Any] | None = None,
) -> Path:
    """OUT/checkpoint: adapter/, optimizer.pt, `tensors` (file name -> object for torch.save) and
    state.json last, written in a temporary folder then renamed into place."""
    tmp = _fresh_folder(out, ".checkpoint-tmp-")
    final, old = out / "checkpoint", out / ".checkpoint-old"
    try:
        peft_model.save_pretrained(str(tmp / "adapter"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        for name, value in (tensors or {}).items():
            torch.save(value, tmp / name)
        write_json(tmp / "state.json", state)
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.rename(final, old)  # a crash right here leaves .checkpoint-old, which resume uses
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def checkpoint_folder(out: Path) -> Path | None:
    """OUT/checkpoint, or OUT/.checkpoint-old when a crash came between the two renames; None when
    there is no complete checkpoint (state.json is written last)."""
    for folder in (out / "checkpoint", out / ".checkpoint-old"):
        if (folder / "state.json").is_file():
            return folder
    return None


def read_adapter_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter weights of a checkpoint folder."""
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter" / "adapter_model.safetensors"))


def load_adapter_weights(peft_model, weights: dict[str, torch.Tensor], folder: Path | str, error: type[Exception]):
    """Put a checkpoint's adapter weights (`read_adapter_weights`) into the peft model."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, weights)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise error(f"{folder}: adapter weights do not fit this model: {unexpected[:3]}")


def adapter_state(peft_model) -> dict[str, torch.Tensor]:
    """A CPU copy of the adapter's weights as they are now."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(peft_model).items()}


@contextlib.contextmanager
def holding_weights(peft_model, weights: dict[str, torch.Tensor] | None, error: type[Exception]):
    """The model holds `weights` inside the block (None: as it is), then exactly its own again."""
    if weights is None:
        yield
        return
    own = adapter_state(peft_model)
    load_adapter_weights(peft_model, weights, "a restored policy version", error)
    try:
        yield
    finally:
        load_adapter_weights(peft_model, own, "the current policy version", error)


def _fresh_folder(out: Path, prefix: str) -> Path:
    """A new folder in `out` to write into and rename into place, with the mode a plain mkdir
    gives (the umask's): a server or sandbox running as another user can read the adapter it
    becomes (tempfile.mkdtemp's are 0700)."""
    while True:
        tmp = Path(out) / f"{prefix}{uuid.uuid4().hex[:12]}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


def write_adapter(out: Path, peft_model, model: str, trained_by: str, **facts: Any) -> Path:
    """OUT/adapter: a standard peft adapter folder plus harnessrl.json naming the base model (an
    hf: path made absolute, so the adapter loads from anywhere), the command and `facts`."""
    base = model
    if base.startswith("hf:"):
        base = "hf:" + str(Path(base[3:]).expanduser().resolve())
    tmp = _fresh_folder(out, ".adapter-tmp-")
    final = out / "adapter"
    try:
        peft_model.save_pretrained(str(tmp))
        meta = {"base_model": base, "trained_by": trained_by, "harnessrl_version": __version__, **facts}
        write_json(tmp / ADAPTER_META, meta)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class WritesAdapter:
    """A training run that saves its LoRA weights as OUT/adapter (GRPO's Trainer, SFTRun,
    DistillRun): `save_adapter` writes them with the command that trained them (`trained_by`) and
    the run's own facts (`adapter_facts`) in harnessrl.json."""

    trained_by: str
    out: Any
    peft_model: Any
    config: Any
    step: int

    def adapter_facts(self) -> dict[str, Any]:
        """What harnessrl.json says of this run besides the base model, the command and the steps."""
        raise NotImplementedError

    def save_adapter(self) -> Path:
        """OUT/adapter (write_adapter), with `adapter_facts` in harnessrl.json."""
        assert self.out is not None  # a run that trains
        facts = self.adapter_facts()
        return write_adapter(self.out, self.peft_model, self.config.model, self.trained_by, steps=self.step, **facts)
