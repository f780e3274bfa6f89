"""One linear layer's product in float32 and in bfloat16 on this CPU, at the embedded model's shapes.

What a rollout on the CPU spends its time in is products of a few rows (decode steps) or a few
hundred (prefills) by smollm2-135m's weights. The engine computes them in float32, so that the
sampler's log-probs are the trainer's (docs/BENCHMARKS.md, "TRL's log-probs against the
sampler's, by precision"). This benchmark measures what that choice costs on this machine: the
same product, `torch.nn.functional.linear(x, W)`, with x and W in float32 and in bfloat16, for
each layer shape of the model (q/k/v fused, o, gate/up fused, down, the output head) at 1, 16
and 256 rows, with 1 and 2 torch threads. Each configuration repeats for at least `--seconds`;
rounds alternate the dtypes and the ratio bfloat16 / float32 is taken round by round, then the
median.

    .venv/bin/python bench/gemm_dtype.py --rounds 3 --record
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402

# smollm2-135m: hidden 576, 9 query and 3 key/value heads of 64, MLP 1536, vocabulary 49152
SHAPES = {
    "q/k/v": (576, 960),
    "o": (576, 576),
    "gate/up": (576, 3072),
    "down": (1536, 576),
    "head": (576, 49152),
}


def gflops(rows: int, inputs: int, outputs: int, dtype, threads: int, seconds: float) -> float:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inputs, generator=g).to(dtype)
    w = torch.randn(outputs, inputs, generator=g).to(dtype)
    for _ in range(3):
        F.linear(x, w)
    count, started = 0, time.perf_counter()
    while True:
        F.linear(x, w)
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    return 2 * rows * inputs * outputs * count / elapsed / 1e9


def main(argv: list[str] | None = None) -> list[dict]:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=0.5, help="the least time of each measurement")
    p.add_argument("--rows", default="1,16,256")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    add_record_argument(p)
    args = p.parse_args(argv)
    rows_list = [int(r) for r in args.rows.split(",")]
    threads_list = [int(t) for t in args.threads.split(",")]
    shapes = [s.strip() for s in args.shapes.split(",")]
    for s in shapes:
        if s not in SHAPES:
            p.error(f"unknown shape {s!r}; known: {', '.join(SHAPES)}")
    results: dict[tuple, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        order = (torch.float32, torch.bfloat16) if r % 2 == 0 else (torch.bfloat16, torch.float32)
        for threads in threads_list:
            for rows in rows_list:
                for shape in shapes:
                    cell = results.setdefault((threads, rows, shape), {"float32": [], "bfloat16": []})
                    for dtype in order:
                        value = gflops(rows, *SHAPES[shape], dtype, threads, args.seconds)
                        cell[str(dtype).removeprefix("torch.")].append(value)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    table = []
    for (threads, rows, shape), cell in results.items():
        ratios = [b / f for f, b in zip(cell["float32"], cell["bfloat16"])]
        row = {
            "threads": threads,
            "rows": rows,
            "layer (inputs x outputs)": f"{shape} ({SHAPES[shape][0]} x {SHAPES[shape][1]})",
            "float32 GFLOP/s": round(statistics.median(cell["float32"]), 1),
            "bfloat16 GFLOP/s": round(statistics.median(cell["bfloat16"]), 1),
            "bfloat16 / float32": f"{statistics.median(ratios):.2f}x",
        }
        table.append(row)
        print("  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    if args.record:
        record_run("gemm_dtype", table)
    return table


if __name__ == "__main__":
    main()
