"""How far TRL's log-probs of the trained tokens are from the sampler's, by precision set-up.

    .venv/bin/python examples/trl/logprob_gap.py [--setups fp32,bf16-autocast,bf16-weights]

One GRPO step of examples/trl/train_toolcalc.py (the embedded SmolLM2-135M on the CPU, toolcalc's
first 2 train tasks x 2 attempts through json-tools, at most 2 model calls each, temperature 0.7).
For every model token of the batch it compares the log-prob harnessrl's engine recorded when it
sampled the token (the `logprobs` the rollout hands TRL) with the one TRL computes for the loss
(`_get_per_token_logps_and_entropies` inside `compute_loss`). Printed per set-up: tokens compared,
max and mean |difference|, and the importance ratio exp(trl - sampler) range.

Set-ups: fp32 (float32 weights, bf16=False: what HarnessRollout serves), bf16-autocast (float32
weights under TRL's default bf16=True: accelerate runs TRL's forward under bfloat16 autocast, the
engine samples without it), bf16-weights (the weights themselves in bfloat16, bf16=False: both
compute in bfloat16, by different kernels). The refusals of both (HarnessRollout's on_train_begin)
are lifted here: this script is what measured them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(setup: str, out: Path) -> dict:
    import torch
    from train_toolcalc import build_trainer, parse_args

    from harnessrl.integrations.trl import callback as trl_callback
    from harnessrl.integrations.trl import setup as trl_setup

    dtype = "bfloat16" if setup == "bf16-weights" else "float32"
    args = parse_args(
        ["--harnesses", "json-tools", "--scheduler", "single:json-tools", "--steps", "1", "--per-device-batch", "4",
         "--num-generations", "2", "--train-tasks", "2", "--max-steps-per-episode", "2", "--dtype", dtype,
         "--temperature", "0.7", "--out", str(out), "--no-gradient-checkpointing"]
    )  # fmt: skip
    trl_setup.check_precision = lambda trainer_args: None  # measured here, refused elsewhere
    trl_setup.check_weights = trl_callback.check_weights = lambda model: None
    trainer, _ = build_trainer(args, bf16=setup == "bf16-autocast")
    seen: dict = {}
    logps_fn, loss_fn = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

    def logps(*a, **k):
        out = logps_fn(*a, **k)
        if torch.is_grad_enabled():
            seen["trl"] = out[0].detach().float()
        return out

    def compute_loss(model, inputs):
        loss = loss_fn(model, inputs)
        mask = inputs["completion_mask"] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))
        keep = mask.bool()
        diff = (seen["trl"] - inputs["sampling_per_token_logps"].float())[keep]
        seen.setdefault("diffs", []).append(diff)
        return loss

    trainer._get_per_token_logps_and_entropies = logps
    trainer._compute_loss = compute_loss
    trainer.train()
    d = torch.cat(seen["diffs"])
    ratio = d.exp()
    return {
        "setup": setup,
        "tokens": int(d.numel()),
        "max_abs": round(float(d.abs().max()), 6),
        "mean_abs": round(float(d.abs().mean()), 6),
        "ratio_min": round(float(ratio.min()), 4),
        "ratio_max": round(float(ratio.max()), 4),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--setups", default="fp32,bf16-autocast,bf16-weights")
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="logprob-gap-") as tmp:
        for setup in a.setups.split(","):
            rows.append(measure(setup, Path(tmp) / setup))
            print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
