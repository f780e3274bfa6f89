#!/usr/bin/env python
"""One stream alone: the engine's decode tokens/s against the weight-read limit, in ONE process.

The weight-read limit: how many float32 matrix-vector products per second torch runs over a
matrix of as many bytes as the model's weights (every parameter once; tied embeddings once),
on the threads this process runs. A decode step of one row must read every weight at least once,
so tokens/s / limit says how close the engine gets to the memory's rate. Each repeat runs one
request decoding alone through each engine variant in turn, each run right after a limit
measurement of its own (the ratio pairs two measurements a second apart, which is what keeps it
meaningful on a machine whose speed drifts):

  fast       the engine's own Llama decode forward (harnessrl.models.llama_forward)
  model      the model's own forward (the path before it, and the fallback for other models)
  int8-fast, int8-model   the same on the int8 model (--int8; its limit is the float32 one)

Every engine runs with one row, no prefix cache and no prefill thread (the decode steps then run
on exactly the threads the limit was measured on). Decode tokens/s = (completion tokens - 1) /
the completion's decode_s. Medians over --repeats (of the ratios: of each run's own).

    HARNESSRL_THREADS=1 .venv/bin/python bench/single_stream.py --int8 --record
    .venv/bin/python bench/single_stream.py --model tiny-random --repeats 1 --tokens 8   # plumbing

Prints a table and one `SINGLE_STREAM_JSON {...}` line; --record appends it to
bench/results/single_stream.jsonl.
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="tiny-random, smollm2-135m or hf:PATH")
    p.add_argument("--tokens", type=int, default=48, help="completion tokens per request")
    p.add_argument("--prompt", type=int, default=120, help="prompt tokens")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--limit-calls", type=int, default=20, help="matrix-vector products per limit measurement")
    p.add_argument("--int8", action="store_true", help="also the int8 model (harnessrl.models.int8)")
    add_record_argument(p)
    args = p.parse_args(argv)
    if min(args.tokens, args.prompt, args.repeats, args.limit_calls) < 2:
        p.error("--tokens, --prompt, --repeats and --limit-calls must be >= 2")
    return args


def weight_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def weight_read_limit(nbytes: int, calls: int) -> float:
    """Float32 matrix-vector products per second over a matrix of `nbytes` (median of `calls`)."""
    import torch

    cols = 576
    matrix = torch.randn(max(1, nbytes // 4 // cols), cols)
    x = torch.randn(cols)
    torch.mv(matrix, x)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        torch.mv(matrix, x)
        times.append(time.perf_counter() - t0)
    return 1.0 / statistics.median(times)


def engine_tokens_per_s(engine, prompt: list[int], tokens: int) -> float:
    from harnessrl.models.engine import EngineRequest

    c = engine.generate([EngineRequest(prompt, tokens, temperature=0.7, seed=1, stop_ids=[])])[0]
    return (len(c.ids) - 1) / c.decode_s


def make_engine(model, tokenizer, fast: bool):
    from harnessrl.models.engine import Engine

    engine = Engine(model, tokenizer, max_batch=1, cache_budget_tokens=0, overlap_prefill=False)
    if not fast:
        engine.runner.fast = None
    return engine


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from harnessrl.models import load_policy

    policy = load_policy(args.model)
    model, tokenizer = policy.model, policy.tokenizer
    nbytes = weight_bytes(model)
    variants = {"fast": make_engine(model, tokenizer, True), "model": make_engine(model, tokenizer, False)}
    int8_bytes = None
    if args.int8:
        int8_policy = load_policy(args.model, dtype="int8")
        int8_bytes = weight_bytes(int8_policy.model)
        variants["int8-fast"] = make_engine(int8_policy.model, tokenizer, True)
        variants["int8-model"] = make_engine(int8_policy.model, tokenizer, False)
    fast_used = {name: e.runner.fast is not None for name, e in variants.items()}
    gen = torch.Generator().manual_seed(0)
    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(100, vocab, (args.prompt,), generator=gen).tolist()
    for engine in variants.values():  # warm: kernels compiled, weights fused and packed
        engine_tokens_per_s(engine, prompt, 4)
    limits: list[float] = []
    rates: dict[str, list[float]] = {name: [] for name in variants}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, engine in variants.items():  # each run right after a limit of its own
            limit = weight_read_limit(nbytes, args.limit_calls)
            rate = engine_tokens_per_s(engine, prompt, args.tokens)
            limits.append(limit)
            rates[name].append(rate)
            ratios[name].append(rate / limit)
    for engine in variants.values():
        engine.close()
    limit = statistics.median(limits)
    results = {
        "model": args.model,
        "threads": torch.get_num_threads(),
        "weight_bytes": nbytes,
        "int8_weight_bytes": int8_bytes,
        "limit_per_s": limit,
        "limit_runs": limits,
        "fast_path_used": fast_used,
        "variants": {},
    }
    print(f"{args.model}: {nbytes / 1e6:.0f} MB of weights, {torch.get_num_threads()} torch threads")
    print(f"weight-read limit {limit:.1f}/s (median of {len(limits)}: {min(limits):.1f}-{max(limits):.1f})")
    print(f"{'variant':>12} {'tokens/s':>9} {'/ limit':>8}  ratios of each run to the limit measured just before it")
    for name, runs in rates.items():
        ratio = statistics.median(ratios[name])
        results["variants"][name] = {
            "tokens_per_s": statistics.median(runs),
            "ratio": ratio,
            "runs": runs,
            "ratios": ratios[name],
        }
        print(
            f"{name:>12} {statistics.median(runs):>9.1f} {ratio:>8.2f}  {', '.join(f'{x:.2f}' for x in ratios[name])}"
        )
    print("SINGLE_STREAM_JSON " + json.dumps(results))
    if args.record:
        record_run("single_stream", doc_rows(results), results=results)


def doc_rows(results: dict) -> list[dict]:
    """One row per engine variant, as docs/BENCHMARKS.md shows them."""
    names = {
        "fast": "float32, the engine's own decode forward",
        "model": "float32, the model's own forward",
        "int8-fast": "int8, the engine's own decode forward",
        "int8-model": "int8, the model's own forward",
    }
    rows = []
    for name, v in results["variants"].items():
        label = names.get(name, name) + ("" if results["model"] == "smollm2-135m" else f", {results['model']}")
        rows.append(
            {
                "variant": label,
                "decode tokens/s": round(v["tokens_per_s"], 1),
                "weight-read limit /s": round(results["limit_per_s"], 1),
                "tokens/s / limit (median)": f"{v['ratio']:.2f}",
                "per-run ratios": ", ".join(f"{r:.2f}" for r in v["ratios"]),
            }
        )
    return rows


if __name__ == "__main__":
    main()
