#!/usr/bin/env python
"""Rollout throughput: how close the runner gets to raw batched generation, and what batching buys.

Three measurements in ONE process, on the SAME model object and the SAME prompts:

1. runner      harnessrl's Runner runs tasks x harness with `--in-flight` episodes at once:
               everything included (environment setup, prompt rendering, generation, stop-string
               cutting, parsing, tools, grading). A thin RecordingPolicy in front of the real
               policy stores every batch the runner issued: its requests, the prompt ids, the
               completion lengths, and the number of decode steps `model.generate` really ran
               (counted and timed with forward hooks on the model: one forward per new token,
               the first one of a call being the prefill).
2. raw         the limit: every recorded batch is replayed straight through `model.generate`:
               prompt ids rendered with the policy's own `prompt_ids` (checked equal to the
               recorded ones; rendering is timed separately, outside the generate clock),
               left-padded, and generated with eos disabled and max_new_tokens = the decode
               steps the runner's call ran, so each replayed batch does exactly the same forward
               passes (same rows, same width, same number of steps) as the runner's did. Same
               sampler (multinomial at the same temperature, top_k off), no logprob recording.
               raw tokens/s = the runner's completion tokens / the summed generate time, so
               runner_tok_s / raw_tok_s = raw_generate_s / runner_wall_s: the share of the
               runner's wall clock that the model itself needs.
   policy      (diagnostic, --policy-replay) the same batches through HFPolicy.generate_ids with
               no stop ids and the same step counts: the backend with its logprob recorder and
               seeding, without the harness. Splits the runner-vs-raw gap into backend and harness.
3. sequential  the same jobs through a Runner with max_in_flight=1 (the naive loop), possibly on
               the first `--sequential-episodes` jobs only. Compared in completion tokens/s
               (episodes sample differently at batch 1, so their token counts differ).

Before every runner run the policy's call counter is reset, so each repeat replays the same
samples (a fresh policy replays a run's calls exactly, docs/models.md "Seeds").

Prints a table and one JSON line (`ROLLOUT_THROUGHPUT_JSON {...}`) with every figure; with
`--repeats N` each figure is measured N times and medians are reported (ratios: the median of
the per-repeat ratios, each taken within one repeat, so slow phases of a shared machine hit
both sides of a ratio alike as far as possible).
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
from dataclasses import dataclass, field

try:
    import psutil
except ImportError:  # optional
    psutil = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m", help="tiny-random, smollm2-135m or hf:PATH")
    p.add_argument("--suite", default="workspace")
    p.add_argument("--split", default="dev")
    p.add_argument("--harness", default="json-tools", help="built-in harness name or spec path")
    p.add_argument("--episodes", type=int, default=16, help="tasks (one episode each)")
    p.add_argument("--in-flight", type=int, default=16, help="runner max_in_flight")
    p.add_argument("--max-steps", type=int, default=3, help="harness rules.max_steps override")
    p.add_argument("--max-new-tokens", type=int, default=64, help="harness rules.max_new_tokens override")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=1, help="measure everything N times; report medians")
    p.add_argument(
        "--sequential-episodes",
        type=int,
        default=None,
        help="run only the first N jobs one at a time (default: all); compared in tokens/s",
    )
    p.add_argument("--no-sequential", action="store_true", help="skip the naive sequential run")
    p.add_argument("--policy-replay", action="store_true", help="also replay the batches through HFPolicy.generate_ids")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no further repeat once the elapsed time plus one more repeat (as long as the last) "
        "would exceed this",
    )
    p.add_argument("--json-out", default=None, help="also write the JSON figures to this file")
    args = p.parse_args(argv)
    if args.episodes < 1 or args.in_flight < 1 or args.repeats < 1:
        p.error("--episodes, --in-flight and --repeats must be >= 1")
    return args


# ------------------------------------------------------------------------------------ recording


class ForwardCounter:
    """Counts and times the forward calls of a model: generate runs one forward per new token,
    the first of a call being the prefill of the whole (padded) prompt."""

    def __init__(self, model):
        self.durations: list[float] = []
        self._t0 = 0.0
        self.handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    @property
    def n(self) -> int:
        return len(self.durations)

    def _pre(self, module, args):
        self._t0 = time.perf_counter()

    def _post(self, module, args, output):
        self.durations.append(time.perf_counter() - self._t0)

    def split(self, start: int) -> tuple[float, float]:
        """(prefill seconds, decode-forward seconds) of the forwards since index `start`."""
        d = self.durations[start:]
        return (d[0], sum(d[1:])) if d else (0.0, 0.0)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@dataclass
class Batch:
    requests: list
    prompt_ids: list[list[int]]
    completion_lens: list[int]
    steps: int  # decode steps model.generate ran for this batch (= forwards)
    seconds: float  # wall time of the policy.complete call
    prefill_s: float = 0.0  # the first forward (whole padded prompt)
    decode_forward_s: float = 0.0  # the other forwards (one token per row each)


def make_recording_policy(inner, counter: ForwardCounter):
    from harnessrl.models.base import Policy

    class RecordingPolicy(Policy):
        """Forwards to the real policy; stores what every complete() call asked and got."""

        def __init__(self):
            self.inner = inner
            self.name = inner.name
            self.batches: list[Batch] = []

        def complete(self, requests, sampling):
            before = counter.n
            t0 = time.perf_counter()
            calls = self.inner.complete(requests, sampling)
            dt = time.perf_counter() - t0
            prefill, decode = counter.split(before)
            self.batches.append(
                Batch(
                    requests=list(requests),
                    prompt_ids=[list(c.prompt_ids) for c in calls],
                    completion_lens=[len(c.completion_ids) for c in calls],
                    steps=counter.n - before,
                    seconds=dt,
                    prefill_s=prefill,
                    decode_forward_s=decode,
                )
            )
            return calls

        def describe(self):
            return self.inner.describe()

    return RecordingPolicy()


def rss_mb() -> float | None:
    return psutil.Process().memory_info().rss / 2**20 if psutil else None


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


# ------------------------------------------------------------------------------------ phases


@dataclass
class RunnerResult:
    wall_s: float
    completion_tokens: int
    episodes: int
    passed: int
    infra_errors: int
    complete_s: float  # time inside policy.complete
    batches: list[Batch] = field(default_factory=list)
    terminations: dict = field(default_factory=dict)


def run_runner(policy, counter, jobs, sampling, in_flight: int) -> RunnerResult:
    from harnessrl.rollout import Runner

    policy.generate_calls = 0  # replay the same samples every repeat (fresh-policy behaviour)
    rec = make_recording_policy(policy, counter)
    runner = Runner(rec, sampling, max_in_flight=in_flight, progress=False)
    t0 = time.perf_counter()
    trajs = runner.run(jobs)
    wall = time.perf_counter() - t0
    terms: dict[str, int] = {}
    for t in trajs:
        k = t.termination.value if t.termination is not None else "none"
        terms[k] = terms.get(k, 0) + 1
    tokens = sum(sum(b.completion_lens) for b in rec.batches)
    assert tokens == runner.stats.completion_tokens, (tokens, runner.stats.completion_tokens)
    return RunnerResult(
        wall_s=wall,
        completion_tokens=tokens,
        episodes=runner.stats.episodes,
        passed=runner.stats.passed,
        infra_errors=runner.stats.infra_errors,
        complete_s=sum(b.seconds for b in rec.batches),
        batches=rec.batches,
        terminations=terms,
    )


def raw_replay(policy, counter, batches: list[Batch], sampling) -> dict:
    """Each recorded batch through model.generate directly, with exactly the same decode steps."""
    import torch
    from transformers import GenerationConfig

    model, pad = policy.model, policy.pad_id
    render_s = generate_s = prefill_s = decode_s = 0.0
    slots = 0
    greedy = sampling.temperature == 0
    sampler = {} if greedy else {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
    saved_config, was_training = model.generation_config, model.training
    model.generation_config = GenerationConfig()  # no checkpoint defaults, as HFPolicy does
    model.eval()
    try:
        for b in batches:
            t0 = time.perf_counter()
            prompts = [policy.prompt_ids(r) for r in b.requests]
            render_s += time.perf_counter() - t0
            if prompts != b.prompt_ids:
                raise RuntimeError("re-rendered prompt ids differ from the ones the runner sent")
            width = max(len(p) for p in prompts)
            input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
            mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for row, ids in enumerate(prompts):  # left padding
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                mask[row, width - len(ids) :] = 1
            config = GenerationConfig(
                max_new_tokens=b.steps,
                do_sample=not greedy,
                **sampler,
                num_beams=1,
                use_cache=True,
                eos_token_id=None,  # no early stop: exactly b.steps new tokens per row
                pad_token_id=pad,
            )
            before = counter.n
            t0 = time.perf_counter()
            with torch.inference_mode():
                torch.manual_seed(sampling.seed)
                out = model.generate(
                    input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device), generation_config=config
                )
            generate_s += time.perf_counter() - t0
            pre, dec = counter.split(before)
            prefill_s, decode_s = prefill_s + pre, decode_s + dec
            made = out.shape[1] - width
            if made != b.steps or counter.n - before != b.steps:
                raise RuntimeError(f"raw replay ran {made} steps / {counter.n - before} forwards, runner ran {b.steps}")
            slots += len(prompts) * made
    finally:
        model.generation_config = saved_config
        model.train(was_training)
    return {
        "render_s": render_s,
        "generate_s": generate_s,
        "prefill_s": prefill_s,
        "decode_forward_s": decode_s,
        "token_slots": slots,
    }


def policy_replay(policy, counter, batches: list[Batch], sampling) -> dict:
    """The same batches through HFPolicy.generate_ids (logprob recorder included), no stop ids."""
    t_total = 0.0
    for b in batches:
        before = counter.n
        t0 = time.perf_counter()
        out = policy.generate_ids(b.prompt_ids, b.steps, sampling, stop_ids=[])
        t_total += time.perf_counter() - t0
        if counter.n - before != b.steps or any(len(ids) != b.steps for ids, _, _ in out):
            raise RuntimeError("policy replay did not run the runner's number of steps")
    return {"generate_s": t_total}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def prompt_stats(batches: list[Batch]) -> dict:
    """Where the prefill work goes. Prefill runs over B x width (left-padded) positions per batch;
    `pad_share` of them are padding; `shared_prefix_share` of the real prompt tokens repeat the
    prefix every row of the batch has in common (computable once per batch); `previous_turn_share`
    of them are a prefix of some prompt+completion of the previous batch (the same episode's last
    turn: reusable with a KV cache kept across turns)."""
    real = padded = shared = reused = 0
    prev: list[list[int]] = []
    for b in batches:
        lens = [len(p) for p in b.prompt_ids]
        real += sum(lens)
        padded += len(lens) * max(lens)
        lcp = min(_common_prefix(b.prompt_ids[0], p) for p in b.prompt_ids)
        shared += (len(lens) - 1) * lcp
        for p in b.prompt_ids:
            reused += max((_common_prefix(p, q) for q in prev), default=0)
        prev = b.prompt_ids
    return {
        "prompt_tokens": real,
        "prefill_positions": padded,
        "pad_share": 1 - real / padded if padded else 0.0,
        "shared_prefix_share": shared / real if real else 0.0,
        "previous_turn_share": reused / real if real else 0.0,
        "mean_prompt_len": real / sum(len(b.prompt_ids) for b in batches) if batches else 0.0,
    }


# ------------------------------------------------------------------------------------ main


def warmup_request():
    from harnessrl.models.base import GenerationRequest
    from harnessrl.types import Message

    return GenerationRequest(messages=[Message(role="user", content="Say hello.")], max_new_tokens=4)


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

    t0 = time.perf_counter()
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    policy = load_policy(args.model, sampling)
    load_s = time.perf_counter() - t0
    if not hasattr(policy, "model"):
        sys.exit(f"{args.model}: this benchmark needs a local transformers policy (HFPolicy)")
    import torch

    base = load_harness(args.harness).to_dict()
    base["rules"] = {**base["rules"], "max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens}
    spec = parse_spec(base, f"{args.harness} (max_steps={args.max_steps}, max_new_tokens={args.max_new_tokens})")
    tasks = get_suite(args.suite).tasks(args.split, args.episodes)
    n_seq = len(tasks) if args.sequential_episodes is None else min(args.sequential_episodes, len(tasks))
    counter = ForwardCounter(policy.model)
    # warm up generate (lazy imports, allocator, kernels) so the first timed phase is not penalised
    policy.generate_ids([policy.prompt_ids(warmup_request())], 4, sampling)

    rows: list[dict] = []
    rss_after_load = rss_mb()
    t_bench = time.perf_counter()
    for rep in range(args.repeats):
        t_rep = time.perf_counter()
        r = run_runner(policy, counter, make_jobs(tasks, [spec], 1), sampling, args.in_flight)
        raw = raw_replay(policy, counter, r.batches, sampling)
        pol = policy_replay(policy, counter, r.batches, sampling) if args.policy_replay else None
        seq = None
        if not args.no_sequential and n_seq > 0:
            seq = run_runner(policy, counter, make_jobs(tasks[:n_seq], [spec], 1), sampling, 1)
        steps = sum(b.steps for b in r.batches)
        ps = prompt_stats(r.batches)
        row = {
            "repeat": rep,
            "episodes": r.episodes,
            "passed": r.passed,
            "infra_errors": r.infra_errors,
            "terminations": r.terminations,
            "batches": len(r.batches),
            "batch_sizes": [len(b.completion_lens) for b in r.batches],
            "decode_steps": steps,
            "model_calls": sum(len(b.completion_lens) for b in r.batches),
            "completion_tokens": r.completion_tokens,
            "runner_wall_s": r.wall_s,
            "runner_complete_s": r.complete_s,
            "runner_outside_complete_s": r.wall_s - r.complete_s,
            "runner_tok_s": r.completion_tokens / r.wall_s,
            "runner_prefill_s": sum(b.prefill_s for b in r.batches),
            "runner_prefill_pos_s": ps["prefill_positions"] / max(sum(b.prefill_s for b in r.batches), 1e-9),
            "runner_decode_forward_s": sum(b.decode_forward_s for b in r.batches),
            "runner_complete_outside_forward_s": r.complete_s
            - sum(b.prefill_s + b.decode_forward_s for b in r.batches),
            "raw_generate_s": raw["generate_s"],
            "raw_prefill_s": raw["prefill_s"],
            "raw_decode_forward_s": raw["decode_forward_s"],
            "raw_generate_outside_forward_s": raw["generate_s"] - raw["prefill_s"] - raw["decode_forward_s"],
            "render_s": raw["render_s"],
            **ps,
            "raw_token_slots": raw["token_slots"],
            "useful_slot_fraction": r.completion_tokens / raw["token_slots"] if raw["token_slots"] else None,
            "raw_tok_s": r.completion_tokens / raw["generate_s"],
            "raw_slot_tok_s": raw["token_slots"] / raw["generate_s"],
            "runner_over_raw": raw["generate_s"] / r.wall_s,
            "policy_generate_s": pol["generate_s"] if pol else None,
            "policy_over_raw": raw["generate_s"] / pol["generate_s"] if pol else None,
        }
        if seq is not None:
            seq_ps = prompt_stats(seq.batches)
            row.update(
                {
                    "seq_episodes": seq.episodes,
                    "seq_wall_s": seq.wall_s,
                    "seq_completion_tokens": seq.completion_tokens,
                    "seq_tok_s": seq.completion_tokens / seq.wall_s,
                    "seq_prefill_s": sum(b.prefill_s for b in seq.batches),
                    "seq_prompt_tokens": seq_ps["prompt_tokens"],
                    "seq_calls": len(seq.batches),
                    "seq_prefill_pos_s": seq_ps["prefill_positions"] / max(sum(b.prefill_s for b in seq.batches), 1e-9),
                    "seq_decode_forward_s": sum(b.decode_forward_s for b in seq.batches),
                    "speedup_tok_s": (r.completion_tokens / r.wall_s) / (seq.completion_tokens / seq.wall_s),
                    "speedup_wall": seq.wall_s / r.wall_s if n_seq == len(tasks) else None,
                }
            )
        row["rss_mb"] = rss_mb()
        row["peak_rss_mb"] = peak_rss_mb()
        rows.append(row)
        print(
            f"[repeat {rep + 1}/{args.repeats}] runner {r.wall_s:.1f}s {row['runner_tok_s']:.1f} tok/s | "
            f"raw {raw['generate_s']:.1f}s {row['raw_tok_s']:.1f} tok/s | runner/raw {row['runner_over_raw']:.3f}"
            + (
                f" | seq {seq.wall_s:.1f}s {row['seq_tok_s']:.1f} tok/s | speedup {row['speedup_tok_s']:.2f}x"
                if seq
                else ""
            ),
            file=sys.stderr,
            flush=True,
        )
        last = time.perf_counter() - t_rep
        if (
            args.budget_s is not None
            and rep + 1 < args.repeats
            and time.perf_counter() - t_bench + last > args.budget_s
        ):
            print(
                f"stopping after {rep + 1} repeat(s): another would pass --budget-s {args.budget_s:g}", file=sys.stderr
            )
            break
    counter.close()

    keys = [k for k in rows[0] if isinstance(rows[0][k], (int, float)) and k != "repeat"]
    med = {k: median([row.get(k) for row in rows]) for k in keys}
    result = {
        "benchmark": "rollout_throughput",
        "config": {
            "model": args.model,
            "suite": args.suite,
            "split": args.split,
            "harness": args.harness,
            "episodes": len(tasks),
            "in_flight": args.in_flight,
            "max_steps": args.max_steps,
            "max_new_tokens": args.max_new_tokens,
            "seed": args.seed,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "repeats": len(rows),
            "repeats_asked": args.repeats,
            "sequential_episodes": None if args.no_sequential else n_seq,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "HARNESSRL_THREADS": os.environ.get("HARNESSRL_THREADS"),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "load_s": load_s,
        "rss_after_load_mb": rss_after_load,
        "median": med,
        "targets": {
            "runner_over_raw": {"target": 0.85, "met": (med["runner_over_raw"] or 0) >= 0.85},
            "speedup_tok_s": {"target": 3.0, "met": (med.get("speedup_tok_s") or 0) >= 3.0}
            if "speedup_tok_s" in med
            else None,
        },
        "repeats": rows,
    }
    print_table(result)
    line = json.dumps(result, separators=(",", ":"), default=float)
    print("ROLLOUT_THROUGHPUT_JSON " + line)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    return result


def print_table(res: dict) -> None:
    m, c, mach = res["median"], res["config"], res["machine"]

    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    print()
    print(
        f"rollout throughput: {c['model']} | {c['suite']}/{c['split']} x {c['harness']} | {c['episodes']} episodes, "
        f"{c['in_flight']} in flight | max_steps {c['max_steps']}, max_new_tokens {c['max_new_tokens']} | "
        f"T={c['temperature']} seed {c['seed']} | {mach['torch_threads']} torch threads "
        f"(HARNESSRL_THREADS={mach['HARNESSRL_THREADS']}) on {mach['cpus']} CPUs | medians of {c['repeats']} repeat(s)"
    )
    rows = [
        ("runner (Runner, all included)", m["runner_wall_s"], m["completion_tokens"], m["runner_tok_s"]),
        ("raw model.generate, same batches+steps", m["raw_generate_s"], m["completion_tokens"], m["raw_tok_s"]),
    ]
    if m.get("policy_generate_s") is not None:
        rows.append(
            (
                "HFPolicy.generate_ids, same batches+steps",
                m["policy_generate_s"],
                m["completion_tokens"],
                m["completion_tokens"] / m["policy_generate_s"],
            )
        )
    if m.get("seq_wall_s") is not None:
        rows.append(
            (
                f"sequential (in flight 1, {c['sequential_episodes']} episodes)",
                m["seq_wall_s"],
                m["seq_completion_tokens"],
                m["seq_tok_s"],
            )
        )
    print(f"{'':44s} {'wall s':>9s} {'tokens':>8s} {'tok/s':>8s}")
    for name, s, tok, rate in rows:
        print(f"{name:44s} {f(s, '{:.1f}'):>9s} {f(tok, '{:.0f}'):>8s} {f(rate, '{:.1f}'):>8s}")
    print()
    print(
        f"runner tok/s / raw tok/s     {f(m['runner_over_raw'], '{:.3f}')}   "
        f"(target >= 0.85: {'met' if res['targets']['runner_over_raw']['met'] else 'NOT met'})"
    )
    if m.get("speedup_tok_s") is not None:
        print(
            f"runner speedup vs sequential {f(m['speedup_tok_s'])}x in tok/s   "
            f"(target >= 3x: {'met' if res['targets']['speedup_tok_s']['met'] else 'NOT met'})"
            + (f"; wall {f(m['speedup_wall'])}x" if m.get("speedup_wall") is not None else "")
        )
    print(
        f"runner time: inside policy.complete {f(m['runner_complete_s'], '{:.1f}')} s "
        f"(prompt rendering {f(m['render_s'], '{:.2f}')} s), "
        f"outside (harness, tools, env, grading) {f(m['runner_outside_complete_s'], '{:.2f}')} s"
    )
    print(
        f"model forwards: runner prefill {f(m['runner_prefill_s'], '{:.1f}')} s "
        f"+ decode {f(m['runner_decode_forward_s'], '{:.1f}')} s "
        f"(rest of policy.complete {f(m['runner_complete_outside_forward_s'], '{:.2f}')} s); "
        f"raw prefill {f(m['raw_prefill_s'], '{:.1f}')} s "
        f"+ decode {f(m['raw_decode_forward_s'], '{:.1f}')} s "
        f"(rest of generate {f(m['raw_generate_outside_forward_s'], '{:.2f}')} s)"
        + (
            f"; sequential prefill {f(m['seq_prefill_s'], '{:.1f}')} s "
            f"+ decode {f(m['seq_decode_forward_s'], '{:.1f}')} s"
            if m.get("seq_prefill_s") is not None
            else ""
        )
    )
    print(
        f"prefill rate (prompt positions/s incl. padding): runner {f(m['runner_prefill_pos_s'], '{:.0f}')}"
        + (f", sequential {f(m['seq_prefill_pos_s'], '{:.0f}')}" if m.get("seq_prefill_pos_s") is not None else "")
        + "; completion tokens per model call: runner "
        f"{f(m['completion_tokens'] / m['model_calls'] if m.get('model_calls') else None, '{:.1f}')}"
        + (f", sequential {f(m['seq_completion_tokens'] / m['seq_calls'], '{:.1f}')}" if m.get("seq_calls") else "")
    )
    print(
        f"prompts: mean {f(m['mean_prompt_len'], '{:.0f}')} tokens; "
        f"of the prefill positions {f(m['pad_share'], '{:.1%}')} are left padding; "
        f"of the prompt tokens {f(m['shared_prefix_share'], '{:.1%}')} repeat the batch's common prefix and "
        f"{f(m['previous_turn_share'], '{:.1%}')} repeat a prompt of the previous turn (both recomputed at every call)"
    )
    print(
        f"batches {f(m['batches'], '{:.0f}')}, decode steps {f(m['decode_steps'], '{:.0f}')}, "
        "useful share of batch token slots "
        f"{f(m['useful_slot_fraction'], '{:.2f}')} (raw {f(m['raw_slot_tok_s'], '{:.1f}')} slot tok/s)"
    )
    print(
        f"memory: peak RSS (ru_maxrss) {f(m['peak_rss_mb'], '{:.0f}')} MiB, "
        f"current RSS {f(m.get('rss_mb'), '{:.0f}')} MiB, "
        f"after load {f(res['rss_after_load_mb'], '{:.0f}')} MiB"
    )
    print(
        "fairness: raw replays the runner's own batches (same prompt ids, same left padding, same rows) "
        "with eos off and exactly the decode steps the runner's generate ran (counted by a forward hook), "
        "so both do the same forward passes; both rates divide the runner's completion tokens by their own time."
    )
    print()


if __name__ == "__main__":
    main()
