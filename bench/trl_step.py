"""One GRPO step of the same workload in TRL's GRPOTrainer (with harnessrl.integrations.trl) and in
`harnessrl train grpo`: seconds per phase and tokens.

    .venv/bin/python bench/trl_step.py [--repeats 2] [--record]

The workload, the same in both: the embedded SmolLM2-135M (float32, CPU), toolcalc's first 4 train
tasks x 2 attempts (one GRPO group per task) through json-tools (at most 4 model calls), temperature
0.7, LoRA r=16 on q/k/v/o (alpha 32), AdamW lr 1e-4, one optimizer step. Both play the same
episodes: the same tasks, the same sampling seed (`sampling_seed(0, 0, "train")`: TRL's batch 0 and
our step 0) and the same attempt numbers (ours number each group's attempts 0 .. G-1; TRL's rollout
numbers them on through the batch, so here its jobs are renumbered to ours before they run), on
the same base weights: the same tokens, which the bench checks (`same_episodes`). The runs
alternate (TRL, ours, TRL, ours, ...) and medians are reported. Timing only: a
group whose episodes all scored alike (nearly all of them: the embedded model passes almost no
toolcalc task) is given advantages +-1 in both trainers, so both run their backward pass and
optimizer step.

Phases: rollout (the episodes, both through harnessrl's engine on the model being trained) and
update (everything else of the step: for TRL its reward and advantage bookkeeping, the forward of
every episode's whole sequence and the backward, the optimizer; for ours the forward and backward
of the packed per-call rows, the gradient sketch and the optimizer).

TRL's update, per trained token, in parts: `trl_logps_s` (its forward passes computing log-probs
and entropies, `_get_per_token_logps_and_entropies`: in TRL 1.16 one fused head computes both at
every completion position, so the entropy's share is not separable here) and the rest (backward,
optimizer, bookkeeping); and in tokens: `padded_positions` (positions of its padded micro-batches,
prompt and completion, against `real_positions`) and `scored_positions` (completion positions whose
log-prob it computes: model tokens, the harness's tokens under env_mask 0, padding) against
`trained_tokens` (the model tokens in the loss).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "trl"))

TASKS, GROUP, HARNESS, MAX_STEPS = 4, 2, "json-tools", 4
ROWS = 2  # TRL's micro-batch: 2 episodes per forward and backward, 4 of them per optimizer step


def forced(scores: list, group: int) -> list:
    """Timing only: a group whose scores are all equal gets 1, 0, 1, 0, ... (advantages +-1), so
    every step of both trainers runs its backward pass and optimizer step (the embedded model
    passes almost no toolcalc task, and a flat batch skips our update but not TRL's)."""
    out = list(scores)
    for start in range(0, len(out), group):
        chunk = out[start : start + group]
        if None not in chunk and len(set(chunk)) == 1:
            out[start : start + group] = [float(i % 2 == 0) for i in range(len(chunk))]
    return out


def ours_numbering(group: int):
    """A context in which Runner.run plays each job with attempt `attempt % group` (our trainer's
    numbering of a step-0 group's attempts) in place of TRL's rollout's numbering."""
    import contextlib
    import dataclasses

    from harnessrl.rollout import Runner

    @contextlib.contextmanager
    def renumbered():
        run = Runner.run

        def run_ours(self, jobs, *a, **k):
            return run(self, [dataclasses.replace(j, attempt=j.attempt % group) for j in jobs], *a, **k)

        Runner.run = run_ours
        try:
            yield
        finally:
            Runner.run = run

    return renumbered()


def trl_step(out: Path, gradient_checkpointing: bool = True) -> dict:
    import torch
    from train_toolcalc import build_trainer, parse_args
    from transformers import TrainerCallback

    args = parse_args(
        [
            "--harnesses", HARNESS, "--scheduler", f"single:{HARNESS}", "--steps", "1",
            "--per-device-batch", str(ROWS), "--gradient-accumulation", str(TASKS * GROUP // ROWS),
            "--num-generations", str(GROUP),
            "--temperature", "0.7", "--lr", "1e-4", "--lora-r", "16", "--out", str(out),
            "--train-tasks", str(TASKS), "--max-steps-per-episode", str(MAX_STEPS),
            "--gradient-checkpointing" if gradient_checkpointing else "--no-gradient-checkpointing",
        ]
    )  # fmt: skip
    trainer, rollout = build_trainer(args)  # exactly the 4 tasks: one batch holds them all
    reward = rollout.reward

    def forced_reward(*a, harnessrl_score=None, **k):
        return forced(reward(*a, harnessrl_score=harnessrl_score, **k), GROUP)

    forced_reward.__name__ = "harnessrl"
    trainer.reward_funcs = [forced_reward]
    rollout.reward = forced_reward  # (HarnessRollout checks that its reward is the trainer's)

    class StepClock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.seconds = time.perf_counter() - self.start

    clock = StepClock()
    trainer.add_callback(clock)
    parts = {"logps_s": 0.0, "padded": 0, "real": 0, "scored": 0}
    logps_fn = trainer._get_per_token_logps_and_entropies

    def timed_logps(model, input_ids, attention_mask, logits_to_keep, *a, **k):
        started = time.perf_counter()
        result = logps_fn(model, input_ids, attention_mask, logits_to_keep, *a, **k)
        parts["logps_s"] += time.perf_counter() - started
        if torch.is_grad_enabled():  # the loss's forward (one per micro-batch)
            parts["padded"] += input_ids.numel()
            parts["real"] += int(attention_mask.sum())
            parts["scored"] += input_ids.size(0) * logits_to_keep
        return result

    trainer._get_per_token_logps_and_entropies = timed_logps
    with ours_numbering(GROUP):
        trainer.train()
    step = json.loads((out / "harnessrl" / "steps.jsonl").read_text().splitlines()[0])
    update = clock.seconds - step["rollout_s"]
    return {
        "total_s": clock.seconds,
        "rollout_s": step["rollout_s"],
        "update_s": update,
        "completion_tokens": step["model_tokens"],
        "trained_tokens": step["model_tokens_kept"],
        "episodes": step["episodes"],
        "reward_mean": step["reward_mean"],
        "trl_logps_s": parts["logps_s"],
        "trl_rest_s": update - parts["logps_s"],
        "padded_positions": parts["padded"],
        "real_positions": parts["real"],
        "scored_positions": parts["scored"],
        "episode_ids": _episode_ids(out / "harnessrl" / "rollouts"),
    }


def _episode_ids(rollouts: Path) -> list[str]:
    """The episodes of a run database, by id (which names the task, harness and attempt)."""
    from harnessrl.store import RunStore

    with RunStore(rollouts) as store:
        return sorted(t.episode_id for t in store.trajectories(with_tokens=False))


def ours_step(out: Path) -> dict:
    from train_toolcalc import harness_specs

    from harnessrl.kernel import enter
    from harnessrl.tasks import get_suite
    from harnessrl.train.trainer import TrainConfig, Trainer

    suite = get_suite("toolcalc")
    suite.split_sizes = {**suite.split_sizes, "train": TASKS}  # the first 4 train tasks, each step all of them
    config = TrainConfig(
        model="smollm2-135m",
        device="cpu",
        harnesses=[HARNESS],
        scheduler=f"single:{HARNESS}",
        steps=1,
        tasks_per_step=TASKS,
        group_size=GROUP,
        temperature=0.7,
        lr=1e-4,
        lora_r=16,
        lora_alpha=32,
    )
    objects = {"suite": suite, "harnesses": harness_specs(HARNESS, MAX_STEPS)}
    Trainer(enter("train grpo", config, out, objects=objects, progress=False)).run()
    r = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    t = r["time"]
    return {
        "episode_ids": _episode_ids(out / "rollouts"),
        "total_s": t["total"],
        "rollout_s": t["rollout"],
        "update_s": t["total"] - t["rollout"],
        "completion_tokens": r["completion_tokens"],
        "trained_tokens": r["completion_tokens"],
        "episodes": r["episodes"],
        "reward_mean": r["reward_mean"],
    }


def median_row(name: str, runs: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in runs) for k in ("total_s", "rollout_s", "update_s")}
    tokens = statistics.median(r["completion_tokens"] for r in runs)
    per_token = statistics.median(r["total_s"] / max(1, r["completion_tokens"]) for r in runs)
    update_per_token = statistics.median(r["update_s"] / max(1, r["trained_tokens"]) for r in runs)
    return {
        "trainer": name,
        "step s (median)": round(med["total_s"], 1),
        "rollout s": round(med["rollout_s"], 1),
        "update s": round(med["update_s"], 1),
        "completion tokens": int(tokens),
        "s per completion token": round(per_token, 4),
        "update s per trained token": round(update_per_token, 4),
        "runs": len(runs),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--record", action="store_true")
    p.add_argument(
        "--trl-gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TRL's default (on); ours is off: --no-trl-gradient-checkpointing compares like with like",
    )
    args = p.parse_args(argv)
    import torch
    from float_trainer import force_flat_advantages

    force_flat_advantages()

    checkpointing = "gradient checkpointing (TRL's default)" if args.trl_gradient_checkpointing else "no checkpointing"
    trl_name = f"TRL 1.16 GRPOTrainer + harnessrl.integrations.trl, micro-batches of {ROWS} episodes, {checkpointing}"
    runs: dict[str, list[dict]] = {trl_name: [], "harnessrl train grpo": []}
    with tempfile.TemporaryDirectory(prefix="trl-step-") as tmp:
        for i in range(args.repeats):
            for name in runs:
                folder = Path(tmp) / f"{i}-{len(runs[name])}-{'trl' if name == trl_name else 'ours'}"
                r = trl_step(folder, args.trl_gradient_checkpointing) if name == trl_name else ours_step(folder)
                print(name, json.dumps(r), flush=True)
                runs[name].append(r)
    rows = [median_row(name, r) for name, r in runs.items()]
    trl_row, ours_row = rows
    trl_runs, our_runs = runs.values()
    same = all(
        a["episode_ids"] == b["episode_ids"] and a["completion_tokens"] == b["completion_tokens"]
        for a, b in zip(trl_runs, our_runs)
    )
    trained = statistics.median(r["trained_tokens"] for r in trl_runs)
    trl_row["update parts per trained token"] = {
        "logps+entropy forward s": round(statistics.median(r["trl_logps_s"] for r in trl_runs) / max(1, trained), 5),
        "rest (backward, optimizer) s": round(
            statistics.median(r["trl_rest_s"] for r in trl_runs) / max(1, trained), 5
        ),
        "padded positions": round(statistics.median(r["padded_positions"] for r in trl_runs) / max(1, trained), 2),
        "real positions": round(statistics.median(r["real_positions"] for r in trl_runs) / max(1, trained), 2),
        "scored positions": round(statistics.median(r["scored_positions"] for r in trl_runs) / max(1, trained), 2),
    }
    ratio = trl_row["s per completion token"] / ours_row["s per completion token"]
    result = {
        "runs": runs,
        "torch_threads": torch.get_num_threads(),
        "trl_over_ours_per_token": round(ratio, 2),
        "same_episodes": same,
    }
    for row in rows:
        print(json.dumps(row))
    print(f"same episodes and tokens in both trainers: {same}")
    print(f"TRL / harnessrl, seconds per completion token: {ratio:.2f}x")
    if args.record:
        from results import record_run

        record_run("trl_step", rows, results=result)
    return result


if __name__ == "__main__":
    main()
