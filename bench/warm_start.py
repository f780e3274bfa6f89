#!/usr/bin/env python
"""Supervised warm start: does LoRA fine-tuning on oracle trajectories lift a model's held-out
score, and does GRPO from it get groups it can learn from?

Five stages, each a run folder under --out (a finished stage is skipped on a rerun, a killed one
resumes):

  oracle   `harnessrl eval --model oracle` on TRAIN tasks through every harness: passing
           trajectories of each task's known solution, in each harness's own format.
  sft      `harnessrl train sft --from OUT/oracle`: one LoRA adapter on all of them, each
           episode in its own harness.
  base     the model on held-out TEST tasks through every harness.
  tuned    the same with `hf:OUT/sft/adapter`.
  grpo     `harnessrl train grpo --model hf:OUT/sft/adapter` for a few steps (scheduler mixed):
           the share of flat groups (every attempt scoring the same: no GRPO signal) per step.

Reported per harness: base and tuned mean score with 95 % CIs, and the paired difference
tuned - base over tasks with its 95 % bootstrap CI; then each GRPO step's flat-group share and
mean reward. Prints a table and one `WARM_START_JSON {...}` line.

    HARNESSRL_THREADS=2 .venv/bin/python bench/warm_start.py --out runs/warm-start
    .venv/bin/python bench/warm_start.py --model tiny-random --train-tasks 4 --test-tasks 2 \\
        --epochs 1 --grpo-steps 1 --grpo-tasks 2 --out /tmp/ws     # plumbing only
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--suite", default="toolcalc")
    p.add_argument("--harnesses", default="json-tools,code-act")
    p.add_argument("--train-tasks", type=int, default=96, help="oracle episodes per harness (train split)")
    p.add_argument("--test-tasks", type=int, default=72, help="held-out tasks per harness (test split)")
    p.add_argument("--attempts", type=int, default=1, help="attempts per held-out task and harness")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the evaluations")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grpo-steps", type=int, default=2, help="0: no GRPO stage")
    p.add_argument("--grpo-tasks", type=int, default=4, help="train tasks per GRPO step")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/warm-start")
    return p.parse_args(argv)


def _eval(out: Path, progress: bool = True, **fields) -> dict:
    from harnessrl.config import EvalConfig, RunOptions
    from harnessrl.jobs.entries import evaluate

    summary = out / "summary.json"  # written when every episode is in
    if summary.is_file():
        return json.loads(summary.read_text(encoding="utf-8"))
    resume = (out / "run.db").exists()
    return evaluate(EvalConfig(**fields), RunOptions(out=out, resume=resume, progress=progress), log=print).result


def _task_scores(run: Path) -> dict[str, dict[str, float]]:
    """harness -> task id -> mean score over the task's attempts."""
    from harnessrl.metrics import task_scores
    from harnessrl.store import RunStore

    with RunStore(run) as store:
        trajectories = list(store.trajectories())
    by_harness: dict[str, list] = {}
    for t in trajectories:
        by_harness.setdefault(t.harness, []).append(t)
    return {h: task_scores(ts) for h, ts in by_harness.items()}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from harnessrl.kernel import enter
    from harnessrl.metrics import bootstrap_ci, paired_difference
    from harnessrl.train.config import SFTConfig, TrainConfig
    from harnessrl.train.sft import run_sft
    from harnessrl.train.trainer import Trainer

    out = Path(args.out)
    harnesses = [h for h in args.harnesses.split(",") if h]
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    _eval(out / "oracle", model="oracle", suite=args.suite, split="train", harness=harnesses, tasks=args.train_tasks)
    timings["oracle_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    adapter = out / "sft" / "adapter"
    if not (out / "sft" / "summary.json").is_file():
        sft = SFTConfig(
            from_runs=[str(out / "oracle")],
            as_harness="own",
            model=args.model,
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.batch_size,
            seed=args.seed,
        )
        run_sft(enter("train sft", sft, out / "sft", resume=(out / "sft" / "config.json").is_file()))
    timings["sft_s"] = time.perf_counter() - t0

    evals = {}
    for name, model in (("base", args.model), ("tuned", f"hf:{adapter}")):
        t0 = time.perf_counter()
        _eval(
            out / name,
            model=model,
            suite=args.suite,
            split="test",
            harness=harnesses,
            tasks=args.test_tasks,
            attempts=args.attempts,
            temperature=args.temperature,
            seed=args.seed,
        )
        timings[f"{name}_s"] = time.perf_counter() - t0
        evals[name] = _task_scores(out / name)

    result: dict = {"args": vars(args), "harnesses": {}, "timings": timings}
    for h in harnesses:
        row = {}
        for name in ("base", "tuned"):
            scores = list(evals[name].get(h, {}).values())
            row[name] = {
                "mean": sum(scores) / len(scores) if scores else None,
                "ci95": list(bootstrap_ci(scores, seed=args.seed)) if scores else None,
                "tasks": len(scores),
            }
        row["tuned_minus_base"] = paired_difference(
            evals["base"].get(h, {}), evals["tuned"].get(h, {}), seed=args.seed
        ).model_dump()
        result["harnesses"][h] = row

    if args.grpo_steps:
        t0 = time.perf_counter()
        grpo_out = out / "grpo"
        config = TrainConfig(
            model=f"hf:{adapter}",
            suite=args.suite,
            harnesses=harnesses,
            scheduler="mixed",
            steps=args.grpo_steps,
            tasks_per_step=args.grpo_tasks,
            group_size=args.group_size,
            seed=args.seed,
            checkpoint_every=1,
        )
        metrics = grpo_out / "metrics.jsonl"
        finished = metrics.is_file() and len(metrics.read_text(encoding="utf-8").splitlines()) >= args.grpo_steps
        if not finished:
            Trainer(enter("train grpo", config, grpo_out, resume=(grpo_out / "config.json").is_file())).run()
        steps = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
        result["grpo"] = [
            {k: s.get(k) for k in ("step", "harness", "reward_mean", "zero_std_frac", "loss", "adv_abs_mean")}
            for s in steps
        ]
        timings["grpo_s"] = time.perf_counter() - t0

    print_table(result)
    print("WARM_START_JSON " + json.dumps(result, default=float))
    (out / "warm_start.json").write_text(json.dumps(result, indent=1, default=float) + "\n", encoding="utf-8")
    return result


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(result: dict) -> None:
    a = result["args"]
    print(
        f"{a['model']} on {a['suite']}: SFT on oracle episodes of {a['train_tasks']} train tasks per harness, "
        f"{a['epochs']} epochs; held out: {a['test_tasks']} test tasks x {a['attempts']} attempt(s), "
        f"T={a['temperature']}"
    )
    print(f"{'harness':14s} {'base':>22s} {'tuned':>22s} {'tuned - base':>26s}")
    for h, row in result["harnesses"].items():
        cells = []
        for name in ("base", "tuned"):
            c = row[name]
            ci = c["ci95"] or [None, None]
            cells.append(f"{_fmt(c['mean'])} [{_fmt(ci[0])}, {_fmt(ci[1])}]")
        d = row["tuned_minus_base"]
        ci = d["ci95"] or [None, None]
        diff = f"{_fmt(d['mean_difference'], '+.3f')} [{_fmt(ci[0], '+.3f')}, {_fmt(ci[1], '+.3f')}]"
        print(f"{h:14s} {cells[0]:>22s} {cells[1]:>22s} {diff:>26s}")
    for s in result.get("grpo", []):
        print(
            f"grpo step {s['step']}: harness {s['harness']}, reward {_fmt(s['reward_mean'])}, "
            f"flat groups {_fmt(s['zero_std_frac'], '.2f')}, loss {_fmt(s['loss'], '.4f')}"
        )
    print("timings: " + ", ".join(f"{k} {v:.0f}" for k, v in result["timings"].items()))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
