#!/usr/bin/env python
"""Does GRPO make the model better on held-out tasks, beyond what the same updates do without
the rewards' meaning? A trained run against its control, paired by task.

Stages, each one `harnessrl` command with its own run folder under --out (a finished stage is
skipped when the script is run again, an interrupted one resumes with --resume):

  before    `harnessrl eval` of --model on the first --test-tasks TEST tasks through --harness,
            --attempts each (or --before FOLDER: an evaluation that already ran, e.g. a study's
            evolved-base cell of the same model, harness, tasks, attempts and temperature);
  grpo      `harnessrl train grpo` on TRAIN tasks through --harness, --steps steps;
  after-grpo
            `harnessrl eval` of its adapter, as `before`;
  control   the same command with `--advantage-control shuffled-rewards` (docs/training.md,
            "A control run"): the same steps and update sizes, rewards shuffled within groups;
  after-control
            `harnessrl eval` of the control's adapter, as `before`.

Reported: the held-out mean of each, the paired differences (by task) grpo - before,
control - before and grpo - control with 95 % bootstrap intervals (`harnessrl compare`), and
each run's reward per step. Prints a table and one `GRPO_GAIN_JSON {...}` line; `--record`
appends the run to bench/results/grpo_gain.jsonl and, after each stage, writes the stage's
per-task (evaluations) or per-step (training runs) records to
bench/results/records/grpo_gain/NAME/ (NAME: --out's last part; records/README.md).

    .venv/bin/python bench/grpo_gain.py --model tiny-random --harness json-tools --steps 1 \\
        --tasks-per-step 2 --group-size 2 --test-tasks 2 --attempts 1 --out /tmp/gain   # plumbing only
    .venv/bin/python bench/grpo_gain.py --model hf:runs/ws/sft/adapter \\
        --harness bench/specs/xml-tags-demo.yaml --steps 20 --out runs/grpo-gain --record
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import (  # noqa: E402
    RECORDS_DIR,
    add_record_argument,
    eval_rows,
    interval_text,
    record_run,
    this_command,
    train_rows,
    write_lines,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--suite", default="toolcalc")
    p.add_argument("--harness", default="json-tools", help="the one harness trained and evaluated (name or spec)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=None, help="default: train grpo's")
    p.add_argument(
        "--checkpoint-every", type=int, default=None, help="of both runs (default: train grpo's): what a kill loses"
    )
    p.add_argument("--temperature", type=float, default=0.7, help="of the rollouts and the evaluations")
    p.add_argument("--test-tasks", type=int, default=72)
    p.add_argument("--attempts", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--before", default=None, help="an evaluation folder to use as `before` instead of running it")
    p.add_argument("--out", default="runs/grpo-gain")
    add_record_argument(p)
    return p.parse_args(argv)


def harnessrl(*args: str) -> None:
    command = [sys.executable, "-m", "harnessrl.cli", *args]
    print("$ harnessrl " + " ".join(args), flush=True)
    if subprocess.run(command).returncode:
        raise SystemExit(f"stopped: `harnessrl {args[0]}` failed (its message is above); run this again to resume")


def harness_name(text: str) -> str:
    from harnessrl.harness.registry import load_harness

    return load_harness(text).name


def _resume(folder: Path) -> list[str]:
    return ["--resume"] if (folder / "config.json").is_file() else []


def evaluate(args: argparse.Namespace, model: str, folder: Path) -> None:
    if (folder / "summary.json").is_file():
        return
    harnessrl(
        "eval", "--suite", args.suite, "--split", "test", "--harness", args.harness, "--model", model,
        "--tasks", str(args.test_tasks), "--attempts", str(args.attempts), "--temperature", str(args.temperature),
        "--seed", str(args.seed), "--no-progress", "--out", str(folder), *_resume(folder),
    )  # fmt: skip


def train(args: argparse.Namespace, folder: Path, control: bool) -> None:
    if (folder / "adapter").is_dir():
        return
    options = [
        "train", "grpo", "--model", args.model, "--suite", args.suite,
        "--harnesses", args.harness, "--scheduler", f"single:{harness_name(args.harness)}",
        "--steps", str(args.steps), "--tasks-per-step", str(args.tasks_per_step),
        "--group-size", str(args.group_size), "--temperature", str(args.temperature), "--seed", str(args.seed),
        "--no-progress", "--out", str(folder),
    ]  # fmt: skip
    if args.lr is not None:
        options += ["--lr", str(args.lr)]
    if args.checkpoint_every is not None:  # changes nothing a step computes (a resume equals the run)
        options += ["--checkpoint-every", str(args.checkpoint_every)]
    if control:
        options += ["--advantage-control", "shuffled-rewards"]
    harnessrl(*options, *_resume(folder))


def compare(a: Path, b: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "harnessrl.cli", "compare", str(a), str(b), "--json"], check=True, capture_output=True
    )
    (row,) = json.loads(done.stdout)["comparisons"]
    return row


def rewards(folder: Path) -> list[float | None]:
    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(x).get("reward_mean") for x in lines if x.strip()]


COMPARISONS = [
    ["GRPO - before", "before", "after-grpo"],
    ["control - before", "before", "after-control"],
    ["GRPO - control", "after-control", "after-grpo"],
]


def write_records(args: argparse.Namespace, folders: dict[str, Path], done: list[str]) -> None:
    """The finished stages' records under bench/results/records/grpo_gain/NAME/, and run.json."""
    records = RECORDS_DIR / "grpo_gain" / Path(args.out).resolve().name
    for name in done:
        kind = "train" if name in ("grpo", "control") else "eval"
        rows = train_rows(folders[name]) if kind == "train" else eval_rows(folders[name])
        write_lines(records / f"{kind}-{name}.jsonl", rows)
    evaluations = [n for n in done if n not in ("grpo", "control")]
    run = {
        "experiment": "grpo_gain",
        "command": this_command(),
        "model": args.model,
        "suite": args.suite,
        "budget": {k: getattr(args, k) for k in ("steps", "tasks_per_step", "group_size", "lr", "temperature")},
        "seeds": [args.seed],
        "test": f"{args.test_tasks} test tasks x {args.attempts} attempts, T={args.temperature}",
        "attempts": args.attempts,
        "harnesses": {"trained": [harness_name(args.harness)], "held_out": None},
        "evaluations": evaluations,
        "arms": [n for n in done if n in ("grpo", "control")],
        "comparisons": [c for c in COMPARISONS if c[1] in evaluations and c[2] in evaluations],
    }
    (records / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    before = Path(args.before) if args.before else out / "before"
    folders = {
        "before": before,
        "grpo": out / "grpo",
        "after-grpo": out / "after-grpo",
        "control": out / "control",
        "after-control": out / "after-control",
    }
    stages = [
        ("before", lambda: evaluate(args, args.model, before)),
        ("grpo", lambda: train(args, out / "grpo", control=False)),
        ("after-grpo", lambda: evaluate(args, f"hf:{out / 'grpo' / 'adapter'}", out / "after-grpo")),
        ("control", lambda: train(args, out / "control", control=True)),
        ("after-control", lambda: evaluate(args, f"hf:{out / 'control' / 'adapter'}", out / "after-control")),
    ]
    for name, stage in stages:
        started = time.perf_counter()
        stage()
        seconds[name] = round(time.perf_counter() - started, 1)
        if args.record:  # the stage's records, committed stage by stage
            write_records(args, folders, list(seconds))
    diffs = {
        "grpo - before": compare(before, out / "after-grpo"),
        "control - before": compare(before, out / "after-control"),
        "grpo - control": compare(out / "after-control", out / "after-grpo"),
    }
    means = {
        "before": diffs["grpo - before"]["mean_a"],
        "after GRPO": diffs["grpo - before"]["mean_b"],
        "after control": diffs["control - before"]["mean_b"],
    }
    curves = {"grpo": rewards(out / "grpo"), "control": rewards(out / "control")}
    result = {"args": vars(args), "means": means, "differences": diffs, "rewards": curves, "seconds": seconds}
    print(f"\n{args.harness} x {args.model}: {args.test_tasks} test tasks x {args.attempts}, {args.steps} GRPO steps")
    for name, value in means.items():
        print(f"  {name:<14} {value:.3f}")
    for name, row in diffs.items():
        print(f"  {name:<17} {interval_text(row)}   ({row['n_tasks']} tasks)")
    for name, curve in curves.items():
        print(f"  reward per step, {name}: " + " ".join("-" if r is None else f"{r:.2f}" for r in curve))
    print("GRPO_GAIN_JSON " + json.dumps(result))
    if args.record:
        row = {
            "run": f"{args.harness}, {args.steps} steps x {args.tasks_per_step} tasks x group {args.group_size}",
            "held-out before": f"{means['before']:.3f}",
            "after GRPO": f"{means['after GRPO']:.3f}",
            "after control": f"{means['after control']:.3f}",
            "GRPO - before [95% CI]": interval_text(diffs["grpo - before"]),
            "control - before [95% CI]": interval_text(diffs["control - before"]),
            "GRPO - control [95% CI]": interval_text(diffs["grpo - control"]),
        }
        record_run("grpo_gain", [row], results=result)
    return result


if __name__ == "__main__":
    main()
