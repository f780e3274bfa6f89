#!/usr/bin/env python
"""Served throughput: harnessrl's runner against an OpenAI-compatible server, and the server's
own speed on the same requests.

Two measurements in one process, against one server (`--url`, or `--serve SPEC` to start
`harnessrl serve` on a local model in this process):

  runner   the Runner with `--in-flight` episodes through `--harness` on the first `--episodes`
           tasks: everything an episode does (setup, prompts, tools, grading) while its model
           calls go to the server. Each episode's next request waits for its previous step.
  replay   every request the runner sent, sent again at once (`--in-flight` at a time) with the
           same messages, seed and max_tokens: the server's raw speed on those prompts, with no
           harness and no dependency between calls (an upper bound for the runner).

Reported: completion tokens per second of each, their ratio (runner / replay: how much of the
server's speed the runner's episodes use), and the calls made. Prints a table and one
`SERVED_THROUGHPUT_JSON {...}` line.

    .venv/bin/python bench/served_throughput.py --serve tiny-random --episodes 4          # plumbing
    .venv/bin/python bench/served_throughput.py --url http://127.0.0.1:8000/v1 --model base
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the server's base URL, ending in /v1")
    where.add_argument("--serve", metavar="SPEC", help="start harnessrl serve on this local model in this process")
    p.add_argument("--model", default=None, help="the served model name (default: the server's first model)")
    p.add_argument("--suite", default="workspace")
    p.add_argument("--split", default="dev")
    p.add_argument("--harness", default="json-tools", help="built-in harness name or spec path")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=3, help="harness rules.max_steps override")
    p.add_argument("--max-new-tokens", type=int, default=64, help="harness rules.max_new_tokens override")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def first_model(url: str) -> str:
    import openai

    models = openai.OpenAI(base_url=url, api_key="EMPTY").models.list().data
    if not models:
        sys.exit(f"{url} serves no model")
    return models[0].id


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.models.base import GenerationRequest, SamplingParams
    from harnessrl.models.openai_compat import OpenAIPolicy
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.tasks import get_suite

    data = load_harness(args.harness).to_dict()
    data["rules"].update(max_steps=args.max_steps, max_new_tokens=args.max_new_tokens, timeout_s=None)
    spec = HarnessSpec.model_validate(data)
    tasks = get_suite(args.suite).tasks(args.split, args.episodes)
    jobs = make_jobs(tasks, [spec], 1)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)

    if args.serve:
        from harnessrl.serve import serving

        server = serving(args.serve)
    else:
        server = contextlib.nullcontext(args.url)
    with server as url:
        model = args.model or first_model(url)
        policy = OpenAIPolicy(
            model, url, max_concurrency=args.in_flight, return_token_ids=True, full_seeds=True, timeout=600
        )
        t0 = time.perf_counter()
        runner = Runner(policy, sampling, max_in_flight=args.in_flight, progress=False)
        trajectories = runner.run(jobs)
        runner_wall = time.perf_counter() - t0
        calls = [s.model_call for t in trajectories for s in t.steps if s.model_call is not None]
        runner_tokens = sum(c.completion_tokens for c in calls)

        requests = [
            GenerationRequest(messages=c.messages, max_new_tokens=max(1, c.completion_tokens), seed=i)
            for i, c in enumerate(calls)
        ]
        t0 = time.perf_counter()
        futures = [policy.submit(r, sampling) for r in requests]  # the policy sends --in-flight at a time
        replies = [f.result() for f in futures]
        replay_wall = time.perf_counter() - t0
        replay_tokens = sum(c.completion_tokens for c in replies)

    result = {
        "server": args.serve or args.url,
        "model": model,
        "suite": args.suite,
        "harness": spec.name,
        "episodes": len(trajectories),
        "in_flight": args.in_flight,
        "model_calls": len(calls),
        "infra_errors": sum(t.is_infra_error for t in trajectories),
        "runner": {"wall_s": runner_wall, "completion_tokens": runner_tokens, "tok_s": runner_tokens / runner_wall},
        "replay": {"wall_s": replay_wall, "completion_tokens": replay_tokens, "tok_s": replay_tokens / replay_wall},
    }
    result["runner_over_replay"] = result["runner"]["tok_s"] / result["replay"]["tok_s"]
    print(f"{'':8} {'wall s':>8} {'tokens':>8} {'tok/s':>8}")
    for key in ("runner", "replay"):
        r = result[key]
        print(f"{key:8} {r['wall_s']:8.1f} {r['completion_tokens']:8d} {r['tok_s']:8.1f}")
    print(f"runner / replay = {result['runner_over_replay']:.2f} ({len(calls)} model calls)")
    print("SERVED_THROUGHPUT_JSON " + json.dumps(result))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
