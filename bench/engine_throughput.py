#!/usr/bin/env python
"""Engine throughput: continuous batching + prefix reuse vs today's lock-step batched generate.

Multi-turn agent-like episodes in ONE process, on the SAME model object:
every episode's first prompt is a shared system prompt with `--demos` demonstration exchanges
plus its own task; each later turn's prompt is the previous prompt + the previous completion
(closed with <|im_end|> if it ran out of tokens) + a new observation (a user turn), token by
token, the way an agent's conversation grows. Three ways to run `--episodes` episodes of
`--turns` turns:

  lockstep         the lock-step generate HFPolicy used to have (bench/lockstep.py) on all
                   episodes' prompts of a turn at once (one padded model.generate per turn;
                   finished rows keep occupying their decode slot until the longest row of the
                   batch ends), as the runner did before the engine.
  engine-nocache   the Engine with its prefix cache off, each episode in its own thread
                   submitting its next turn as soon as its previous completion is back
                   (continuous batching alone).
  engine           the same with the prefix cache on (shared system prompt and each episode's
                   previous turn are not prefilled again).

Completions differ between modes (sampling at --temperature; the engine seeds each request,
generate_ids seeds each call), so the modes are compared in completion tokens per second of
wall clock. Prints a table and one `ENGINE_THROUGHPUT_JSON {...}` line; `--repeats N` reports
medians (ratios: the median of the per-repeat ratios).

    .venv/bin/python bench/engine_throughput.py --episodes 4 --turns 2 --max-new-tokens 16
    HARNESSRL_THREADS=1 .venv/bin/python bench/engine_throughput.py --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("lockstep", "engine-nocache", "engine")

SYSTEM = (
    "You are a careful agent that solves tasks with tools. Tools: add(a, b) returns a + b; "
    "mul(a, b) returns a * b; submit(answer) ends the task. Call exactly one tool per reply as JSON "
    'on one line, like {"tool": "add", "arguments": {"a": 1, "b": 2}}. Read every tool result '
    "before the next call, never invent results, and submit once the answer is known."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="tiny-random, smollm2-135m or hf:PATH")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--demos", type=int, default=3, help="demonstration exchanges in the shared prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=None, help="engine rows (default: --episodes)")
    p.add_argument("--cache-budget", type=int, default=32768, help="engine prefix cache budget, tokens")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        p.error(f"--modes: unknown {unknown}; choose from {','.join(MODES)}")
    if min(args.episodes, args.turns, args.max_new_tokens, args.repeats) < 1 or args.demos < 0:
        p.error("--episodes, --turns, --max-new-tokens and --repeats must be >= 1, --demos >= 0")
    return args


def request_seed(seed: int, episode: int, turn: int) -> int:
    digest = hashlib.sha256(f"engine-bench:{seed}:{episode}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Workload:
    """First prompts and the token pieces a turn appends (same for every mode)."""

    def __init__(self, policy, args):
        from harnessrl.models.chat import render_prompt_ids
        from harnessrl.types import Message

        tok = policy.tokenizer
        messages = [Message(role="system", content=SYSTEM)]
        for k in range(args.demos):
            a, b = 3 + 7 * k, 11 + 5 * k
            messages += [
                Message(role="user", content=f"Example task: what is {a} plus {b}?"),
                Message(role="assistant", content=f'{{"tool": "add", "arguments": {{"a": {a}, "b": {b}}}}}'),
                Message(role="user", content=f"Tool result (add):\n{a + b}"),
                Message(role="assistant", content=f'{{"tool": "submit", "arguments": {{"answer": {a + b}}}}}'),
            ]
        self.first_prompts = []
        for e in range(args.episodes):
            task = f"Task {e}: what is {12 + 9 * e} times {4 + e}, plus {100 + 31 * e}?"
            conversation = messages + [Message(role="user", content=task)]
            self.first_prompts.append(render_prompt_ids(tok, conversation, policy.tool_role))
        self.end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
        self.stops = set(policy.stop_ids)

    def observation(self, tokenizer, episode: int, turn: int) -> list[int]:
        text = (
            f"\n<|im_start|>user\nTool result (add):\n{1000 + 37 * episode + turn}. The result is recorded; "
            f"continue with the next step of task {episode}.<|im_end|>\n<|im_start|>assistant\n"
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def next_prompt(self, tokenizer, prompt: list[int], completion: list[int], episode: int, turn: int) -> list[int]:
        closed = completion if completion and completion[-1] in self.stops else completion + [self.end_of_turn]
        return prompt + closed + self.observation(tokenizer, episode, turn)


def run_lockstep(policy, work: Workload, args) -> dict:
    from lockstep import lockstep_generate_ids

    from harnessrl.models.base import SamplingParams

    policy.generate_calls = 0
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    prompts = list(work.first_prompts)
    completion_tokens = prompt_tokens = padded_tokens = 0
    t0 = time.perf_counter()
    for turn in range(args.turns):
        outputs = lockstep_generate_ids(policy, prompts, [args.max_new_tokens] * len(prompts), sampling)
        prompt_tokens += sum(len(p) for p in prompts)
        padded_tokens += len(prompts) * max(len(p) for p in prompts)  # what the padded prefill runs
        completion_tokens += sum(len(ids) for ids, _, _ in outputs)
        prompts = [
            work.next_prompt(policy.tokenizer, p, out[0], e, turn) for e, (p, out) in enumerate(zip(prompts, outputs))
        ]
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "prefilled_tokens": padded_tokens,
    }


def run_engine(policy, work: Workload, args, cache_budget: int) -> dict:
    from harnessrl.models.engine import Engine

    engine = Engine(
        policy.model, policy.tokenizer, max_batch=args.max_batch or args.episodes, cache_budget_tokens=cache_budget
    )
    errors: list[BaseException] = []

    def episode(e: int) -> None:
        try:
            prompt = work.first_prompts[e]
            for turn in range(args.turns):
                result = engine.submit(
                    prompt,
                    args.max_new_tokens,
                    temperature=args.temperature,
                    top_p=args.top_p,
                    seed=request_seed(args.seed, e, turn),
                ).result()
                prompt = work.next_prompt(policy.tokenizer, prompt, result.ids, e, turn)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=episode, args=(e,)) for e in range(args.episodes)]
    t0 = time.perf_counter()
    engine.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    engine.close()
    if errors:
        raise errors[0]
    s = engine.stats()
    return {
        "wall_s": wall,
        "completion_tokens": s.completion_tokens,
        "prompt_tokens": s.prompt_tokens,
        "prefilled_tokens": s.prefilled_tokens,
        "cached_tokens": s.cached_tokens,
        "decode_steps": s.decode_steps,
        "mean_batch": round(s.mean_batch, 2),
        "prefill_s": s.prefill_seconds,
        "decode_s": s.decode_seconds,
        "evictions": s.evictions,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from harnessrl.models import load_policy
    from harnessrl.models.engine_config import EngineConfig
    from harnessrl.models.hf import configure_threads

    threads = configure_threads(EngineConfig.from_env().threads)  # $HARNESSRL_THREADS, as the policy's
    policy = load_policy(args.model)
    work = Workload(policy, args)
    # warm-up: first-call allocations and kernel selection, outside every clock
    policy.generate_ids([work.first_prompts[0][:16]], 2)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for _ in range(args.repeats):
        for mode in args.modes:
            if mode == "lockstep":
                r = run_lockstep(policy, work, args)
            else:
                r = run_engine(policy, work, args, 0 if mode == "engine-nocache" else args.cache_budget)
            r["tok_s"] = r["completion_tokens"] / r["wall_s"]
            runs[mode].append(r)
            print(f"  {mode:15s} {r['wall_s']:8.1f} s  {r['tok_s']:7.2f} tok/s", file=sys.stderr, flush=True)

    def median(mode: str, key: str):
        values = [r[key] for r in runs[mode] if key in r]
        return statistics.median(values) if values else None

    summary = {
        "model": args.model,
        "threads": threads,
        "episodes": args.episodes,
        "turns": args.turns,
        "demos": args.demos,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "first_prompt_tokens": [len(p) for p in work.first_prompts],
        "repeats": args.repeats,
        "modes": {},
    }
    keys = (
        "wall_s",
        "tok_s",
        "completion_tokens",
        "prompt_tokens",
        "prefilled_tokens",
        "cached_tokens",
        "decode_steps",
        "mean_batch",
        "prefill_s",
        "decode_s",
    )
    print(f"{'mode':15s} " + " ".join(f"{k:>17s}" for k in keys))
    for mode in args.modes:
        row = {k: median(mode, k) for k in keys}
        summary["modes"][mode] = row
        print(f"{mode:15s} " + " ".join(f"{'-' if v is None else round(v, 2):>17}" for v in row.values()))
    if "lockstep" in runs:
        for mode in args.modes:
            if mode != "lockstep":
                ratios = [e["tok_s"] / b["tok_s"] for e, b in zip(runs[mode], runs["lockstep"])]
                summary[f"{mode}_vs_lockstep"] = round(statistics.median(ratios), 3)
                print(f"{mode} / lockstep completion tok/s: {summary[f'{mode}_vs_lockstep']:.2f}x")
    line = json.dumps(summary)
    print("ENGINE_THROUGHPUT_JSON " + line)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
