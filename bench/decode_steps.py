#!/usr/bin/env python
"""Decode step time of the engine, one option on and off, alternating in ONE process.

Builds an engine over the model, admits `--rows` requests whose prompts share a `--shared`-token
prefix followed by an own part of random length (`--own-min`..`--own-max` tokens, so the rows'
contexts differ as an agent's episodes at different turns do), then times decode steps with the
option on and off, alternating, and reports the median step time of each. Options:

  kernel   the rows' own slots in the compiled kernel (harnessrl.models.decode_kernel) against
           torch's fused kernel in runs of rows (`plan_runs`)
  runs     reading each row's own slots in runs of similar width (harnessrl.models.attention
           `plan_runs`) against reading every row up to the longest row's length (both with
           the fused kernel)
  shared   shared-prefix decode attention against attending over every row's whole cache
  fast     the engine's own Llama decode forward (harnessrl.models.llama_forward) against the
           model's own forward

    HARNESSRL_THREADS=1 .venv/bin/python bench/decode_steps.py --rows 1,5,8,12
    HARNESSRL_THREADS=1 .venv/bin/python bench/decode_steps.py --option runs --rows 5,8,12
    HARNESSRL_THREADS=1 .venv/bin/python bench/decode_steps.py --option shared --rows 8
    HARNESSRL_THREADS=1 .venv/bin/python bench/decode_steps.py --option fast --rows 1,4,8,12
    .venv/bin/python bench/decode_steps.py --model tiny-random --rows 2 --steps 2   # plumbing

Prints a table and one `DECODE_STEPS_JSON {...}` line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

OPTIONS = ("kernel", "runs", "shared", "fast")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="tiny-random, smollm2-135m or hf:PATH")
    p.add_argument("--option", default="kernel", choices=OPTIONS)
    p.add_argument("--rows", default="5,8,12", help="comma-separated batch sizes")
    p.add_argument("--shared", type=int, default=450, help="tokens of prefix every row shares")
    p.add_argument("--own-min", type=int, default=30)
    p.add_argument("--own-max", type=int, default=450)
    p.add_argument("--steps", type=int, default=3, help="decode steps per timing")
    p.add_argument("--repeats", type=int, default=8, help="timings per setting (alternating)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",") if r.strip()]
    if not args.rows or min(args.rows) < 1 or min(args.steps, args.repeats) < 1:
        p.error("--rows, --steps and --repeats must be >= 1")
    if not 1 <= args.own_min <= args.own_max or args.shared < 0:
        p.error("need 1 <= --own-min <= --own-max and --shared >= 0")
    return args


def measure(args: argparse.Namespace, model, tokenizer, rows: int) -> dict:
    import torch

    from harnessrl.models import attention
    from harnessrl.models.engine import Engine, EngineRequest

    gen = torch.Generator().manual_seed(args.seed + rows)
    vocab = model.get_input_embeddings().num_embeddings
    low, high = min(100, vocab - 1), vocab
    prefix = torch.randint(low, high, (args.shared,), generator=gen).tolist()
    engine = Engine(model, tokenizer, max_batch=rows, overlap_prefill=False)
    budget = args.steps * (2 * args.repeats + 1) + 2
    for i in range(rows):
        own = int(torch.randint(args.own_min, args.own_max + 1, (1,), generator=gen))
        prompt = prefix + torch.randint(low, high, (own,), generator=gen).tolist()
        engine.submit_request(EngineRequest(prompt, max_new_tokens=budget, temperature=0.7, seed=i, stop_ids=[]))
    default_cost = attention.plan_runs.__defaults__
    fast = engine.runner.fast

    def setting(on: bool) -> None:
        if args.option == "kernel":
            engine.compiled_attention = on
        elif args.option == "runs":  # a call that costs more than any padding: one run
            engine.compiled_attention = False
            attention.plan_runs.__defaults__ = default_cost if on else (10**12,)
        elif args.option == "fast":
            engine.runner.fast = fast if on else None
        else:
            engine.shared_prefix_attention = on

    times: dict[str, list[float]] = {"on": [], "off": []}
    try:
        with torch.inference_mode():
            while len(engine._rows) < rows:
                engine.step()
            own_lengths = sorted(r.length - args.shared for r in engine._rows)
            engine._decode()  # warm
            for _ in range(args.repeats):
                for name in ("on", "off"):
                    setting(name == "on")
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        engine._decode()
                    times[name].append((time.perf_counter() - t0) / args.steps * 1000)
    finally:
        attention.plan_runs.__defaults__ = default_cost
        engine.close()
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    return {"rows": rows, "own_lengths": own_lengths, "on_ms": on, "off_ms": off, "speedup": off / on}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from harnessrl.models import load_policy

    policy = load_policy(args.model)
    results = [measure(args, policy.model, policy.tokenizer, rows) for rows in args.rows]
    print(f"{args.model}  option {args.option}: on vs off, {torch.get_num_threads()} torch threads")
    print(f"{'rows':>5} {'on ms':>8} {'off ms':>8} {'off/on':>7}  own tokens per row")
    for r in results:
        print(f"{r['rows']:>5} {r['on_ms']:>8.1f} {r['off_ms']:>8.1f} {r['speedup']:>6.2f}x  {r['own_lengths']}")
    print("DECODE_STEPS_JSON " + json.dumps({"args": vars(args), "results": results}))


if __name__ == "__main__":
    main()
