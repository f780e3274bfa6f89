#!/usr/bin/env python
"""A long prompt arriving while rows decode: the running rows' stall, with and without chunks.

One process, the engine without the prefill thread (where chunked prefill is on by default:
one core, several torch threads, a GPU). Each repeat, for each chunk size (0 = a prefill in one
piece, then each of --chunks): --rows requests decode (short prompts, --decode-tokens each, no
stop), and after --warm decode steps one request with a --long-tokens prompt arrives. Measured
from the running rows' own tokens (`on_token` stamps): the longest gap between two tokens of a
running row while the long prompt is read (what a user streaming one of them sees), the wall
time until the long request's first token, and the rows' decode tokens/s over the whole run.
Medians over --repeats, the variants alternating within each repeat.

    HARNESSRL_THREADS=1 .venv/bin/python bench/chunked_prefill.py --record
    .venv/bin/python bench/chunked_prefill.py --model tiny-random --repeats 1 --rows 2 --long-tokens 40 --chunks 16

Prints a table and one `CHUNKED_PREFILL_JSON {...}` line; --record appends the run to
bench/results/chunked_prefill.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=15, help="requests decoding when the long prompt arrives")
    p.add_argument("--prompt-tokens", type=int, default=40, help="prompt tokens of each running request")
    p.add_argument("--decode-tokens", type=int, default=48, help="tokens each running request decodes")
    p.add_argument("--warm", type=int, default=8, help="decode steps before the long prompt arrives")
    # (--decode-tokens must outlast the warm steps and the long prompt's prefill)
    p.add_argument("--long-tokens", type=int, default=300, help="prompt tokens of the request that arrives")
    p.add_argument("--chunks", default="64,128", help="chunk sizes to compare with the whole prefill")
    p.add_argument("--repeats", type=int, default=3)
    add_record_argument(p)
    return p.parse_args(argv)


def one_run(model, tokenizer, chunk: int, args, prompts: list[list[int]], long_prompt: list[int]) -> dict:
    from harnessrl.models.engine import Engine

    engine = Engine(
        model,
        tokenizer,
        max_batch=args.rows + 1,
        cache_budget_tokens=0,
        overlap_prefill=False,
        prefill_chunk_tokens=chunk,
    )
    stamps: list[list[float]] = [[] for _ in prompts]

    def stamp(i):
        return lambda token, logprob: stamps[i].append(time.perf_counter())

    t0 = time.perf_counter()
    futures = [
        engine.submit(p, args.decode_tokens, temperature=0.7, seed=i, stop_ids=[], on_token=stamp(i))
        for i, p in enumerate(prompts)
    ]
    for _ in range(args.warm + 1):  # admissions (and their prefills), then the warm decode steps
        engine.step()
    arrived = time.perf_counter()
    long_first: list[float] = []
    long = engine.submit(
        long_prompt,
        4,
        temperature=0.7,
        seed=99,
        stop_ids=[],
        on_token=lambda t, lp: long_first.append(time.perf_counter()),
    )
    while not long_first:
        engine.step()
    joined = long_first[0]
    engine.run_until_done()
    wall = time.perf_counter() - t0
    results = [f.result() for f in futures]
    long.result()
    engine.close()
    # the longest gap between two tokens of a running row, from just before the arrival to the join
    gaps = []
    for s in stamps:
        inside = [t for t in s if arrived <= t <= joined]
        before = [t for t in s if t < arrived]
        points = ([before[-1]] if before else []) + inside
        after = [t for t in s if t > joined]
        if after:
            points.append(after[0])
        gaps += [b - a for a, b in zip(points, points[1:])]
    tokens = sum(len(r.ids) for r in results)
    return {
        "max_gap_s": max(gaps) if gaps else float("nan"),  # nan: the rows had finished before it came
        "first_token_s": joined - arrived,
        "rows_tokens_per_s": tokens / wall,
        "prefills_chunked": engine.stats().prefills_chunked,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from harnessrl.models import load_policy

    policy = load_policy(args.model)
    model, tokenizer = policy.model, policy.tokenizer
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    prompts = [torch.randint(100, vocab, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.rows)]
    long_prompt = torch.randint(100, vocab, (args.long_tokens,), generator=gen).tolist()
    chunks = [0] + [int(c) for c in args.chunks.split(",") if c.strip()]
    warm = argparse.Namespace(**{**vars(args), "decode_tokens": args.warm + 8})  # kernels compiled, weights packed
    one_run(model, tokenizer, chunks[-1], warm, prompts, long_prompt)
    runs: dict[int, list[dict]] = {c: [] for c in chunks}
    for _ in range(args.repeats):
        for c in chunks:
            runs[c].append(one_run(model, tokenizer, c, args, prompts, long_prompt))
    results = {
        "model": args.model,
        "threads": torch.get_num_threads(),
        "rows": args.rows,
        "long_tokens": args.long_tokens,
        "variants": {},
    }
    print(
        f"{args.model}, {torch.get_num_threads()} torch threads: {args.rows} rows decoding, "
        f"a {args.long_tokens}-token prompt arrives (medians of {args.repeats})"
    )
    print(f"{'prefill':>18} {'max row gap ms':>15} {'its first token ms':>19} {'rows tokens/s':>14}")
    for c, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("max_gap_s", "first_token_s", "rows_tokens_per_s")}
        results["variants"][str(c)] = {**med, "runs": rs}
        label = "whole" if c == 0 else f"chunks of {c}"
        print(
            f"{label:>18} {med['max_gap_s'] * 1e3:>15.0f} {med['first_token_s'] * 1e3:>19.0f} "
            f"{med['rows_tokens_per_s']:>14.1f}"
        )
    print("CHUNKED_PREFILL_JSON " + json.dumps(results))
    if args.record:
        record_run("chunked_prefill", doc_rows(results), results=results)


def doc_rows(results: dict) -> list[dict]:
    rows = []
    for c, v in results["variants"].items():
        rows.append(
            {
                "prefill": "in one piece" if c == "0" else f"chunks of {c} tokens",
                "longest gap of a running row (ms)": round(v["max_gap_s"] * 1e3),
                "its first token after (ms)": round(v["first_token_s"] * 1e3),
                "running rows tokens/s": round(v["rows_tokens_per_s"], 1),
                "model, rows, prompt": f"{results['model']}, {results['rows']}, {results['long_tokens']} tokens",
            }
        )
    return rows


if __name__ == "__main__":
    main()
