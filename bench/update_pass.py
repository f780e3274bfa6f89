"""The GRPO update with one optimizer step per batch (the default: one pass, one mini-batch), its
old log-probs taken from the loss's own forward, against the same update after a separate no-grad
pass that recomputes them (what a step with more passes or mini-batches runs first).

    .venv/bin/python bench/update_pass.py --model tiny-random --episodes 2 --repeats 1      # smoke test
    HARNESSRL_THREADS=1 .venv/bin/python bench/update_pass.py --record                       # the figures

The units are real: episodes of one harness on the suite's train tasks, sampled by the trainer's
own float32 model, every model call a unit with an advantage of +1 or -1 (alternating by episode,
so that every unit is forwarded). Each repeat times both ways on the same units, alternating which
goes first; medians are quoted, and the gradients of the two ways are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from float_trainer import float32_trainer  # noqa: E402
from results import add_record_argument, record_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--suite", default="toolcalc")
    parser.add_argument("--harness", default="react")
    parser.add_argument("--episodes", type=int, default=4, help="first N train tasks, one episode each")
    parser.add_argument("--max-steps", type=int, default=3, help="the harness's model calls per episode, at most")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_record_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))

    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.train.grpo import units_from_trajectories
    from harnessrl.train.update import MismatchSums, accumulate_gradient, recompute_old_logprobs

    rules = {"max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens}
    trainer, spec, suite = float32_trainer(args.model, args.suite, args.harness, rules, args.seed)
    config = trainer.config
    ctx = trainer.update_context()
    sampling = SamplingParams(temperature=config.temperature, top_p=1.0, seed=args.seed)
    jobs = make_jobs(suite.tasks("train", args.episodes), [spec], 1)
    trajectories = Runner(trainer.policy, sampling, max_in_flight=args.episodes, progress=False).run(jobs)
    signs = {t.episode_id: (1.0 if i % 2 == 0 else -1.0) for i, t in enumerate(trajectories)}
    units = units_from_trajectories(trajectories, signs)
    trainer.policy.close()

    def separate() -> list[torch.Tensor]:
        fresh, _ = recompute_old_logprobs(ctx, units)
        accumulate_gradient(ctx, fresh)
        return [p.grad.clone() for p in ctx.trainable]

    def fused() -> list[torch.Tensor]:
        running = MismatchSums(ctx.config)
        accumulate_gradient(ctx, units, mismatch=running)
        running.result(ctx.dist)
        return [p.grad.clone() for p in ctx.trainable]

    ways = {"separate no-grad pass": separate, "old log-probs from the loss's forward": fused}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    grads: dict[str, list[torch.Tensor]] = {}
    for r in range(args.repeats):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            ctx.optimizer.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            grads[name] = ways[name]()
            seconds[name].append(time.perf_counter() - t0)
    ctx.optimizer.zero_grad(set_to_none=True)
    a, b = grads.values()
    max_diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    scale = max(float(x.abs().max()) for x in a)
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    base, new = medians.values()
    result = {
        "settings": vars(args),
        "units": len(units),
        "prompt_tokens": sum(len(u.prompt_ids) for u in units),
        "completion_tokens": sum(len(u.completion_ids) for u in units),
        "seconds": seconds,
        "medians": medians,
        "speedup": base / new,
        "grad_max_abs_diff": max_diff,
        "grad_max_abs": scale,
    }
    for name, m in medians.items():
        print(f"{name:40} median {m:8.2f} s   ({', '.join(f'{s:.2f}' for s in seconds[name])})")
    print(
        f"units {len(units)}, prompt tokens {result['prompt_tokens']}, completion tokens {result['completion_tokens']}"
    )
    print(f"speed-up {base / new:.2f}x; gradients differ by at most {max_diff:.2g} (largest entry {scale:.2g})")
    print("UPDATE_PASS_JSON " + json.dumps(result))
    if args.record:
        label = f"{args.model}: {args.suite} x {args.harness}, {args.episodes} episodes of <= {args.max_steps} calls"
        row = {
            "model, units": f"{label}; {len(units)} units, {result['prompt_tokens']} prompt + "
            f"{result['completion_tokens']} completion tokens",
            "separate no-grad pass s": round(base, 2),
            "from the loss's forward s": round(new, 2),
            "speed-up": f"{base / new:.2f}x",
            "gradient max abs diff": f"{max_diff:.1g} (of {scale:.1g})",
        }
        record_run("update_pass", [row], results=result)


if __name__ == "__main__":
    main()
