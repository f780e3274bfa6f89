#!/usr/bin/env python
"""Decode with `train grpo`'s LoRA adapter in the model: the engine's decode forward with the
adapter's layers merged (`merge_lora`, the default) against the adapter's own forward
(`HARNESSRL_MERGE_LORA=0`), and the plain model as a reference.

    .venv/bin/python bench/lora_decode.py [--rows 32] [--new-tokens 96] [--repeats 2] [--record]

The workload: smollm2-135m (float32, CPU) through HFPolicy, `--rows` chat requests at once (what
one GRPO step of 8 tasks x group 4 keeps in flight), each up to `--new-tokens` new tokens at
temperature 1.0 with a fixed seed; the LoRA of `train grpo` (r 16, alpha 32, q/k/v/o) with its B
matrices drawn from N(0, 0.02) (peft starts them at 0, which would change nothing). Each
configuration runs in a child process of its own, once per repeat, the order rotating; a child
times 3 passes over the requests after one warm-up and reports the median. The adapter's two
configurations must sample the same token ids, else nothing is recorded; the row gives each one's
largest log-prob difference from the adapter's own forward.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from results import add_record_argument, record_run  # noqa: E402

MODEL = "smollm2-135m"
CONFIGS = {
    "lora-own": ("LoRA, the adapter's own forward (HARNESSRL_MERGE_LORA=0)", "0"),
    "lora-merged": ("LoRA, merged in decode steps (the default)", "1"),
    "plain": ("the plain model, no adapter", "1"),
}
BASELINE = "lora-own"


def child(config: str, rows: int, new_tokens: int) -> dict:
    import torch

    from harnessrl.models import load_policy
    from harnessrl.models.base import GenerationRequest, SamplingParams
    from harnessrl.train import lora
    from harnessrl.train.config import TrainConfig
    from harnessrl.types import Message

    policy = load_policy(MODEL, device="cpu")
    if config != "plain":
        train = TrainConfig(model=MODEL, device="cpu", harnesses=["react"], scheduler="single:react", lora_r=16)
        lora.attach(policy, train, RuntimeError)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
        policy.clear_cache()
    requests = [
        GenerationRequest(
            messages=[Message(role="user", content=f"Count from {i} to {i + 200}, one number per line.")],
            max_new_tokens=new_tokens,
        )
        for i in range(rows)
    ]
    sampling = SamplingParams(temperature=1.0, seed=1)
    policy.complete(requests[:2], sampling)  # warm-up: the packed and merged copies, the kernels
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        calls = policy.complete(requests, sampling)
        seconds.append(time.perf_counter() - started)
    tokens = sum(len(c.completion_ids) for c in calls)
    ids = hashlib.sha256(json.dumps([list(c.completion_ids) for c in calls]).encode()).hexdigest()[:12]
    stats = policy.engine_stats()
    return {
        "seconds": statistics.median(seconds),
        "tokens": tokens,
        "ids": ids,
        "logprobs": [x for c in calls for x in c.logprobs],
        "decode_steps": stats.get("decode_steps"),
    }


def run_child(config: str, rows: int, new_tokens: int) -> dict:
    env = {**os.environ, "HARNESSRL_MERGE_LORA": CONFIGS[config][1]}
    before = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, __file__, "--child", config, "--rows", str(rows), "--new-tokens", str(new_tokens)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("LORA_DECODE "))
    return {**json.loads(line.split(" ", 1)[1]), "load_before": before, "load_after": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=32, help="requests in flight")
    p.add_argument("--new-tokens", type=int, default=96, help="max new tokens per request")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_record_argument(p)
    args = p.parse_args(argv)
    if args.child:
        print("LORA_DECODE " + json.dumps(child(args.child, args.rows, args.new_tokens)), flush=True)
        return {}
    configs = args.configs.split(",")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for i in range(args.repeats):
        for config in configs[i % len(configs) :] + configs[: i % len(configs)]:
            r = run_child(config, args.rows, args.new_tokens)
            print(config, json.dumps({k: v for k, v in r.items() if k != "logprobs"}), flush=True)
            runs[config].append(r)
    lora_runs = [r for c, rs in runs.items() if c != "plain" for r in rs]
    if len({r["ids"] for r in lora_runs}) > 1:
        raise SystemExit("the adapter's configurations sampled other tokens: nothing recorded")
    reference = runs[BASELINE][0]["logprobs"] if BASELINE in runs else None
    rows = []
    for config, rs in runs.items():
        row: dict = {
            "decode path": CONFIGS[config][0],
            "seconds (median)": round(statistics.median(r["seconds"] for r in rs), 2),
            "completion tok/s": round(statistics.median(r["tokens"] / r["seconds"] for r in rs), 1),
        }
        if BASELINE in runs:
            row[f"x {BASELINE} (same repeat)"] = round(
                statistics.median(b["seconds"] / r["seconds"] for r, b in zip(rs, runs[BASELINE])), 2
            )
            if config != "plain" and reference is not None:
                row["log-prob max abs diff"] = max(
                    max(abs(a - b) for a, b in zip(r["logprobs"], reference)) for r in rs
                )
        row["load average (1 min)"] = f"{min(r['load_before'] for r in rs):.1f}-{max(r['load_after'] for r in rs):.1f}"
        row["runs"] = len(rs)
        rows.append(row)
        print(json.dumps(row))
    for rs in runs.values():
        for r in rs:
            del r["logprobs"]  # (compared above; the record keeps the digests of the ids)
    result = {"runs": runs, "rows_in_flight": args.rows, "new_tokens": args.new_tokens}
    if args.record:
        record_run("lora_decode", rows, results=result)
    return result


if __name__ == "__main__":
    main()
