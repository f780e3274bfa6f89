#!/usr/bin/env python
"""Torch threads and the OpenMP wait policy, for decode and for the update, on this machine.

Each configuration (torch intra-op threads x OMP_WAIT_POLICY) runs in a child process of its own,
because OpenMP reads its wait policy once, when it starts. A child times three workloads on the
same model and the same inputs:

  decode-1    the engine decoding one request alone (tokens/s of the completion's decode)
  decode-16   the engine decoding 16 requests in flight together (completion tokens/s)
  update      one LoRA update (r 16 on q/k/v/o, as `train grpo`): forward, backward and the
              AdamW step over a batch of 4 rows x 384 tokens (seconds per update)

Rounds alternate the configurations in a new order each round, so that a drift of the machine's
speed falls on all of them alike; the table quotes medians and each configuration's ratio to the
baseline (1 thread, the policy unset), computed round by round and then the median taken.

    .venv/bin/python bench/threads.py --record                                   # the figures
    .venv/bin/python bench/threads.py --load 2 --record                          # beside 2 busy processes
    .venv/bin/python bench/threads.py --model tiny-random --rounds 1 --tokens 4  # plumbing

Prints a table and one `THREADS_JSON {...}` line; --record appends it to bench/results/threads.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402

POLICIES = ("unset", "PASSIVE", "ACTIVE")
WORKLOADS = ("decode-1", "decode-16", "update")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="tiny-random, smollm2-135m or hf:PATH")
    p.add_argument("--threads", default="1,2", help="torch intra-op thread counts to try")
    p.add_argument("--policies", default=",".join(POLICIES), help="OMP_WAIT_POLICY values ('unset': none)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48, help="completion tokens per request")
    p.add_argument("--prompt", type=int, default=120, help="prompt tokens per request")
    p.add_argument("--update-tokens", type=int, default=384, help="tokens per row of the update's batch")
    p.add_argument(
        "--load",
        type=int,
        default=0,
        help="busy processes (one spinning Python loop each) kept running beside every child: a machine "
        "other jobs share; recorded as table loaded-N",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_record_argument(p)
    args = p.parse_args(argv)
    if min(args.rounds, args.tokens, args.prompt, args.update_tokens) < 1:
        p.error("--rounds, --tokens, --prompt and --update-tokens must be >= 1")
    if args.load < 0:
        p.error("--load must be >= 0")
    return args


def child(args: argparse.Namespace) -> None:
    """One configuration's three workloads; prints one JSON line."""
    import torch

    from harnessrl.models import load_policy
    from harnessrl.models.engine import Engine, EngineRequest

    policy = load_policy(args.model)  # sets the engine's threads from $HARNESSRL_THREADS (run_child sets it)
    torch.set_num_threads(int(args.child))
    model, tokenizer = policy.model, policy.tokenizer
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, vocab, (args.prompt,), generator=gen).tolist() for _ in range(16)]

    def decode(n: int) -> float:
        engine = Engine(model, tokenizer, max_batch=n, cache_budget_tokens=0, overlap_prefill=False)
        try:
            engine.generate([EngineRequest(prompts[0], 2, temperature=0.7, seed=1, stop_ids=[])])  # warm
            requests = [
                EngineRequest(p, args.tokens, temperature=0.7, seed=i, stop_ids=[]) for i, p in enumerate(prompts[:n])
            ]
            t0 = time.perf_counter()
            done = engine.generate(requests)
            if n == 1:
                return (len(done[0].ids) - 1) / done[0].decode_s
            return sum(len(c.ids) for c in done) / (time.perf_counter() - t0)
        finally:
            engine.close()

    def update() -> float:
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(
            model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        )
        peft_model.train()
        params = [p for p in peft_model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-5)
        ids = torch.randint(100, vocab, (4, args.update_tokens), generator=gen)

        def one() -> float:
            t0 = time.perf_counter()
            logits = peft_model(input_ids=ids).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            (-logp.mean()).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return time.perf_counter() - t0

        one()  # warm
        return statistics.median(one() for _ in range(2))

    out = {"decode-1": decode(1), "decode-16": decode(16), "update": update(), "threads": torch.get_num_threads()}
    print("CHILD_JSON " + json.dumps(out), flush=True)


def run_child(args: argparse.Namespace, threads: int, policy: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "HARNESSRL_THREADS", "OMP_NUM_THREADS")}
    env["HARNESSRL_THREADS"] = str(threads)
    if policy != "unset":
        env["OMP_WAIT_POLICY"] = policy
    cmd = [sys.executable, __file__, "--child", str(threads), "--model", args.model, "--tokens", str(args.tokens)]
    cmd += ["--prompt", str(args.prompt), "--update-tokens", str(args.update_tokens)]
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)
        for _ in range(args.load)
    ]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CHILD_JSON ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the child for {threads} thread(s), policy {policy} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1].split(" ", 1)[1])
    if out["threads"] != threads:
        raise SystemExit(f"the child asked for {threads} torch thread(s) ran on {out['threads']}")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        child(args)
        return
    configs = [(int(t), p) for t in args.threads.split(",") for p in args.policies.split(",")]
    for _, policy in configs:
        if policy not in POLICIES:
            raise SystemExit(f"--policies: {policy!r} is not one of {', '.join(POLICIES)}")
    base = configs[0]
    runs: dict[tuple[int, str], list[dict[str, float]]] = {c: [] for c in configs}
    order = random.Random(0)
    for r in range(args.rounds):
        round_configs = configs[:]
        order.shuffle(round_configs)
        for c in round_configs:
            runs[c].append(run_child(args, *c))
            print(f"round {r + 1}/{args.rounds} {c[0]} thread(s), {c[1]}: {runs[c][-1]}", flush=True)
    results: dict = {"model": args.model, "cpus": os.cpu_count(), "rounds": args.rounds, "baseline": list(base)}
    results["load"] = args.load
    results["configs"] = []
    for c in configs:
        row: dict = {"threads": c[0], "policy": c[1]}
        for w in WORKLOADS:
            row[w] = statistics.median(run[w] for run in runs[c])
            # each round's ratio to the baseline's run of the same round; higher is faster
            ratios = [(b[w] / x[w]) if w == "update" else (x[w] / b[w]) for x, b in zip(runs[c], runs[base])]
            row[f"{w} speed vs baseline"] = statistics.median(ratios)
        row["runs"] = runs[c]
        results["configs"].append(row)
    print(f"{'threads':>7} {'policy':>8} {'decode-1 tok/s':>15} {'decode-16 tok/s':>16} {'update s':>9}  (x baseline)")
    for row in results["configs"]:
        print(
            f"{row['threads']:>7} {row['policy']:>8} "
            f"{row['decode-1']:>8.1f} ({row['decode-1 speed vs baseline']:.2f}) "
            f"{row['decode-16']:>8.1f} ({row['decode-16 speed vs baseline']:.2f}) "
            f"{row['update']:>6.2f} ({row['update speed vs baseline']:.2f})"
        )
    print("THREADS_JSON " + json.dumps(results))
    if args.record:
        table = f"loaded-{args.load}" if args.load else "main"
        record_run("threads", doc_rows(results), table=table, results=results)


def doc_rows(results: dict) -> list[dict]:
    """One row per configuration: each workload's median and its speed against the baseline."""
    return [
        {
            "threads, OMP_WAIT_POLICY": f"{row['threads']}, {row['policy']}",
            "decode, 1 in flight (tok/s)": f"{row['decode-1']:.1f} ({row['decode-1 speed vs baseline']:.2f}x)",
            "decode, 16 in flight (tok/s)": f"{row['decode-16']:.1f} ({row['decode-16 speed vs baseline']:.2f}x)",
            "LoRA update, 4 x 384 tokens (s)": f"{row['update']:.2f} ({row['update speed vs baseline']:.2f}x)",
        }
        for row in results["configs"]
    ]


if __name__ == "__main__":
    main()
