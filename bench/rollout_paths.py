#!/usr/bin/env python
"""The same episodes through the engine's rollout paths: a plain evaluation, the model with the
LoRA layers of `train grpo` in train mode (how TRL's GRPOTrainer leaves it while HarnessRollout
generates), and `train grpo` itself (one step: its metrics.jsonl `time.rollout`), the last one with
the engine as it is and as it was before decode steps through wrapped layers stopped borrowing the
prefill thread's core (src/harnessrl/models/forward_runner.py at BEFORE_FIX, loaded in its place).

    HARNESSRL_THREADS=1 .venv/bin/python bench/rollout_paths.py [--tasks 2] [--repeats 2] [--load 0] [--record]

The workload: smollm2-135m (float32, CPU), toolcalc's first `--tasks` train tasks x 2 attempts
through json-tools (at most 4 model calls, as bench/trl_step.py), temperature 0.7, the sampling
seed of a run's step 0, LoRA r=16 on q/k/v/o. Every configuration runs in a child process of its
own, once per repeat, their order rotating; every run must sample the same token ids, else nothing
is recorded, and each row gives its log-probs' largest difference from the baseline's first run (the
plain model's own products differ from the adapter's by float rounding: q/k/v fused in one).
`--load N` keeps N busy processes (a spinning Python loop each) beside every child; the machine's
load average is recorded either way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "examples" / "trl"))
from results import add_record_argument, record_run  # noqa: E402

BEFORE_FIX = "f5acadf"  # the last commit whose engine borrowed the idle core for LoRA decode steps
HARNESS, MAX_STEPS, GROUP, MODEL = "json-tools", 4, 2, "smollm2-135m"
CONFIGS = {
    "eval": "harnessrl eval's path: Runner on the plain model",
    "lora-train": "the model with LoRA, in train mode (TRL's GRPOTrainer + HarnessRollout)",
    "trainer-before": f"train grpo, engine before the fix (forward_runner.py at {BEFORE_FIX})",
    "trainer": "train grpo, engine now",
}
BASELINE = "trainer-before"


def _sampled(trajectories) -> tuple[str, list[float]]:
    """A digest of every call's sampled token ids, episode by episode, and their log-probs in that order."""
    calls = [s.model_call for t in sorted(trajectories, key=lambda t: t.episode_id) for s in t.steps if s.model_call]
    ids = json.dumps([list(c.completion_ids) for c in calls])
    return hashlib.sha256(ids.encode()).hexdigest()[:12], [x for c in calls for x in c.logprobs]


def _old_forward_runner() -> None:
    """forward_runner.py as of BEFORE_FIX, imported under its own name before the engine imports it."""
    import importlib.util

    source = subprocess.run(
        ["git", "show", f"{BEFORE_FIX}:src/harnessrl/models/forward_runner.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="rollout-paths-")) / "forward_runner.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("harnessrl.models.forward_runner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["harnessrl.models.forward_runner"] = module
    spec.loader.exec_module(module)


def child(config: str, tasks: int) -> dict:
    if config == "trainer-before":
        _old_forward_runner()
    from train_toolcalc import harness_specs

    from harnessrl.tasks import get_suite
    from harnessrl.train.config import TrainConfig

    suite = get_suite("toolcalc")
    suite.split_sizes = {**suite.split_sizes, "train": tasks}
    specs = harness_specs(HARNESS, MAX_STEPS)
    train = TrainConfig(
        model=MODEL,
        device="cpu",
        harnesses=[HARNESS],
        scheduler=f"single:{HARNESS}",
        steps=1,
        tasks_per_step=tasks,
        group_size=GROUP,
        temperature=0.7,
        lr=1e-4,
        lora_r=16,
        lora_alpha=32,
    )
    if config.startswith("trainer"):
        from harnessrl.kernel import enter
        from harnessrl.store import RunStore
        from harnessrl.train.trainer import Trainer

        out = Path(tempfile.mkdtemp(prefix="rollout-paths-"))
        Trainer(enter("train grpo", train, out, objects={"suite": suite, "harnesses": specs}, progress=False)).run()
        record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        with RunStore(out / "rollouts") as store:
            trajectories = list(store.trajectories())
        seconds = record["time"]["rollout"]
    else:
        from harnessrl.models import load_policy
        from harnessrl.models.base import SamplingParams
        from harnessrl.rollout import Job, Runner
        from harnessrl.train import lora
        from harnessrl.train.step import sampling_seed

        policy = load_policy(MODEL, device="cpu")
        if config == "lora-train":
            lora.attach(policy, train, RuntimeError)
            policy.model.train()
        jobs = [Job(task, specs[0], i) for task in suite.tasks("train")[:tasks] for i in range(GROUP)]
        sampling = SamplingParams(temperature=0.7, top_p=1.0, seed=sampling_seed(train.seed, 0, "train"))
        runner = Runner(policy, sampling, max_in_flight=train.max_in_flight, progress=False)
        started = time.perf_counter()
        trajectories = runner.run(jobs)
        seconds = time.perf_counter() - started
    tokens = sum(len(s.model_call.completion_ids) for t in trajectories for s in t.steps if s.model_call)
    ids, logprobs = _sampled(trajectories)
    return {"seconds": seconds, "tokens": tokens, "ids": ids, "logprobs": logprobs}


def run_child(config: str, tasks: int, load: int) -> dict:
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        before = os.getloadavg()[0]
        done = subprocess.run(
            [sys.executable, __file__, "--child", config, "--tasks", str(tasks)],
            check=True,
            capture_output=True,
            text=True,
        )
        after = os.getloadavg()[0]
    finally:
        for p in busy:
            p.kill()
            p.wait()
    line = next(x for x in done.stdout.splitlines() if x.startswith("ROLLOUT_PATHS "))
    return {**json.loads(line.split(" ", 1)[1]), "load_before": before, "load_after": after}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2, help="toolcalc train tasks (x 2 attempts)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--load", type=int, default=0, help="busy processes beside every child")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_record_argument(p)
    args = p.parse_args(argv)
    if args.child:
        print("ROLLOUT_PATHS " + json.dumps(child(args.child, args.tasks)), flush=True)
        return {}
    configs = args.configs.split(",")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for i in range(args.repeats):
        for config in configs[i % len(configs) :] + configs[: i % len(configs)]:
            r = run_child(config, args.tasks, args.load)
            print(config, json.dumps(r), flush=True)
            runs[config].append(r)
    first = runs[configs[0]][0]
    differ = [c for c, rs in runs.items() for r in rs if r["ids"] != first["ids"]]
    if differ:
        raise SystemExit(f"runs sampled other tokens ({', '.join(differ)}): nothing recorded")
    reference = runs[BASELINE][0]["logprobs"] if BASELINE in runs else first["logprobs"]
    rows = []
    for config, rs in runs.items():
        row = {
            "path": CONFIGS[config],
            "rollout s": round(statistics.median(r["seconds"] for r in rs), 1),
            "completion tok/s": round(statistics.median(r["tokens"] / r["seconds"] for r in rs), 2),
        }
        if BASELINE in runs:
            row[f"x {BASELINE} (same repeat)"] = round(
                statistics.median(b["seconds"] / r["seconds"] for r, b in zip(rs, runs[BASELINE])), 2
            )
        row[f"log-prob max abs diff vs {BASELINE}"] = max(
            max(abs(a - b) for a, b in zip(r["logprobs"], reference)) for r in rs
        )
        row["load average (1 min)"] = f"{min(r['load_before'] for r in rs):.1f}-{max(r['load_after'] for r in rs):.1f}"
        row["runs"] = len(rs)
        rows.append(row)
        print(json.dumps(row))
    for rs in runs.values():
        for r in rs:
            del r["logprobs"]  # (compared above; the record keeps the digests of the ids)
    result = {"runs": runs, "tokens": first["tokens"], "same_tokens": True, "load": args.load}
    if args.record:
        record_run("rollout_paths", rows, table="main" if not args.load else f"loaded-{args.load}", results=result)
    return result


if __name__ == "__main__":
    main()
