"""A short GRPO run on the embedded model: harness-bandit vs mixed at the same budget, plus the
cost of the gradient sketch and the scheduler within a step, and the peak memory of a step.

    HARNESSRL_THREADS=1 .venv/bin/python bench/real_model_train.py --steps 3 --out runs/real-train

Each scheduler trains in its own child process (so each peak RSS is its own) with the real
trainer on smollm2-135m, LoRA r=16 on the attention projections, toolcalc train tasks through
code-act, json-tools and react. The harnesses' budgets are shrunk (4 steps, 96 new tokens per
reply) so that a step fits in minutes on a 2-core CPU; everything else is the built-in spec.
Rollouts are sampled at T=0.7: at T=1.0 this model almost never completes a toolcalc task, and
flat groups give no gradient at all.

`--force-advantages` is for timing only: when every group of a step is flat, advantages are
replaced by +-1 so that the backward pass, sketch and optimizer step still run and can be timed
(the model's update is then meaningless; the scores of such a run are not reported).

Prints, per scheduler: dev score of each harness before and after (trainer evaluation, 1 attempt
per task), mean reward per step, skipped steps, step time split, the share of the step spent in
the sketch + scheduler, and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

HARNESSES = ["code-act", "json-tools", "react"]


def shrunk_specs():
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import HarnessSpec

    specs = []
    for name in HARNESSES:
        data = load_harness(name).to_dict()
        data["rules"].update(max_steps=4, max_new_tokens=96, max_total_tokens=None, timeout_s=None)
        specs.append(HarnessSpec.model_validate(data))
    return specs


def train_one(args) -> dict:
    from float_trainer import force_flat_advantages

    from harnessrl.kernel import enter
    from harnessrl.train.trainer import TrainConfig, Trainer

    if args.force_advantages:
        force_flat_advantages()
    config = TrainConfig(
        model="smollm2-135m",
        suite="toolcalc",
        scheduler=args.one,
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        group_size=args.group_size,
        temperature=0.7,
        eval_every=args.steps if args.eval_tasks else 0,
        eval_tasks=args.eval_tasks,
        checkpoint_every=args.steps,
        seed=args.seed,
        save_rollouts=True,
    )
    out = Path(args.out) / args.one
    if out.exists():
        import shutil

        shutil.rmtree(out)
    trainer = Trainer(enter("train grpo", config, out, objects={"harnesses": shrunk_specs()}, progress=False))
    trainer.run()
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = (
        [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
        if (out / "eval.jsonl").exists()
        else []
    )
    times = [r["time"] for r in steps]
    trained = [t for r, t in zip(steps, times) if not r.get("skipped")]
    overhead = [(t["sketch"] + t["scheduler"]) / t["total"] for t in trained]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "scheduler": args.one,
        "forced_advantages": args.force_advantages,
        "harness_per_step": [r["harness"] for r in steps],
        "reward_per_step": [r["reward_mean"] for r in steps],
        "skipped_steps": sum(1 for r in steps if r.get("skipped")),
        "dev_before": evals[0]["mean_score"] if evals else None,
        "dev_after": evals[-1]["mean_score"] if len(evals) > 1 else None,
        "time_per_step": times,
        "sketch_scheduler_share_max": max(overhead) if overhead else None,
        "peak_rss_gib": peak_kib / 2**20,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks-per-step", type=int, default=3)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--eval-tasks", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedulers", default="harness-bandit,mixed")
    p.add_argument("--force-advantages", action="store_true", help="timing only: +-1 advantages on flat groups")
    p.add_argument("--out", default="runs/real-train")
    p.add_argument("--one", help=argparse.SUPPRESS)  # child process: train one scheduler, print JSON
    args = p.parse_args()
    if args.one:
        print("RESULT " + json.dumps(train_one(args)), flush=True)
        return 0
    os.environ.setdefault("HARNESSRL_THREADS", "1")
    results = []
    for scheduler in args.schedulers.split(","):
        cmd = [sys.executable, __file__, "--one", scheduler] + sys.argv[1:]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{scheduler}: the training child failed (exit {proc.returncode})")
        result = json.loads(line.removeprefix("RESULT "))
        results.append(result)
        print(json.dumps(result, indent=1), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
