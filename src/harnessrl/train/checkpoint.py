"""The GRPO trainer's checkpoint: OUT/checkpoint/ holds adapter/, optimizer.pt, rng.pt and
state.json (step, policy version, scheduler, task RNG, sampling-call counter; with
--max-off-policy-steps the plans already made for later steps), and pinned_adapters.pt when such
a plan is bound to an older policy version (its weights), written into a temporary folder
and renamed into place (`harnessrl.train.lora.write_checkpoint`), so a killed run leaves either
the previous checkpoint or the new one, never half of one.

A resumed run restores all of it and computes exactly what the uninterrupted run would have.
The RNG file holds the CPU generator and, when the run uses CUDA, every CUDA device's generator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harnessrl.train import lora


def rng_state() -> dict[str, Any]:
    """The torch generators a resumed run must continue: the CPU one, and CUDA's where initialised."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        # a different number of GPUs: sampling is seeded per request, so only CUDA's own
        # generator (unused by the trainer's computation) starts elsewhere


@dataclass
class Saved:
    """A checkpoint as read: its folder, state.json, the adapter's weights, the optimizer's state
    and the generators' state (plain data: it is broadcast to every process as it is)."""

    folder: str
    state: dict[str, Any]
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    pinned: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # version -> adapter weights


def save(
    out: Path,
    peft_model,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    pinned: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """OUT/checkpoint with the adapter, the optimizer, the generators and `state` (state.json);
    `pinned`: the adapter weights of older policy versions planned steps are bound to."""
    tensors: dict[str, Any] = {"rng.pt": rng_state()}
    if pinned:
        tensors["pinned_adapters.pt"] = pinned
    return lora.write_checkpoint(out, peft_model, optimizer, state, tensors)


def read(out: Path) -> Saved | None:
    """The checkpoint of OUT, or None when there is none yet. Tensors are read onto the CPU: the
    caller's load_state_dict moves them where the model and the optimizer live."""
    folder = lora.checkpoint_folder(out)
    if folder is None:
        return None
    return Saved(
        str(folder),
        json.loads((folder / "state.json").read_text(encoding="utf-8")),
        lora.read_adapter_weights(folder),
        torch.load(folder / "optimizer.pt", weights_only=True, map_location="cpu"),
        torch.load(folder / "rng.pt", weights_only=True, map_location="cpu"),
        torch.load(folder / "pinned_adapters.pt", weights_only=True, map_location="cpu")
        if (folder / "pinned_adapters.pt").is_file()
        else {},
    )


def restore(saved: Saved, peft_model, optimizer: torch.optim.Optimizer, error: type[Exception]) -> dict[str, Any]:
    """Load the adapter weights, the optimizer and the generators of `saved`; returns its state.json."""
    lora.load_adapter_weights(peft_model, saved.weights, saved.folder, error)
    optimizer.load_state_dict(saved.optimizer)
    set_rng_state(saved.rng)
    return saved.state


def step_of(out: Path) -> int | None:
    """The step of OUT's checkpoint (None without one): named when training stops on a NaN."""
    folder = lora.checkpoint_folder(out)
    if folder is None:
        return None
    return int(json.loads((folder / "state.json").read_text(encoding="utf-8"))["step"])
