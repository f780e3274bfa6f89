"""A float32 CPU trainer of one harness, shrunk to a few short model calls, for the benchmarks
that time or measure the update on real units (bench/rollout_mismatch.py, bench/update_pass.py),
and the advantages the timing benchmarks force on flat groups (force_flat_advantages)."""

from __future__ import annotations

import tempfile
from typing import Any


def float32_trainer(model: str, suite_name: str, harness: str, rules: dict[str, Any], seed: int, **config: Any):
    """(trainer, spec, suite): `harness` with its rules updated by `rules` (max_steps,
    max_new_tokens, ...), a one-harness TrainConfig on `suite_name` (float32, CPU, no rollouts
    saved; `config` sets other fields), and the trainer set up (its LoRA at zero init)."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.kernel import enter
    from harnessrl.tasks import get_suite
    from harnessrl.train.config import TrainConfig
    from harnessrl.train.trainer import Trainer

    data = load_harness(harness).to_dict()
    data["rules"].update(rules, timeout_s=None)
    spec = HarnessSpec.model_validate(data)
    suite = get_suite(suite_name)
    cfg = TrainConfig(
        model=model,
        suite=suite_name,
        harnesses=[spec.name],
        scheduler=f"single:{spec.name}",
        tasks_per_step=1,
        seed=seed,
        device="cpu",
        dtype="float32",
        save_rollouts=False,
        **config,
    )
    folder = tempfile.mkdtemp(prefix="bench-trainer-")
    trainer = Trainer(enter("train grpo", cfg, folder, objects={"suite": suite, "harnesses": [spec]}, progress=False))
    trainer._setup()
    return trainer, spec, suite


def force_flat_advantages() -> None:
    """Timing only: `harnessrl train grpo`'s flat groups (every advantage 0) get +1, -1, +1, ...
    in this process, so every step runs its backward pass and optimizer step (the embedded model
    passes almost no task, and a flat batch skips the update)."""
    import torch

    from harnessrl.train import step

    real = step.group_advantages

    def group_advantages(rewards, scale=True, eps=1e-6):
        A = real(rewards, scale=scale, eps=eps)
        if torch.all(A == 0):
            A = torch.tensor([[(-1.0) ** i for i in range(rewards.shape[1])]], dtype=A.dtype)
        return A

    step.group_advantages = group_advantages
