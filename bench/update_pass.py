"""The GRPO update of one batch with one optimizer step (the default: one pass, one mini-batch),
timed three ways on the same real units: as it ran before (a separate no-grad pass recomputing the
old log-probs, then the loss, one row per model call); with the old log-probs taken from the
loss's own forward; and with that and an episode's calls packed into shared rows
(harnessrl.train.packing).

    .venv/bin/python bench/update_pass.py --model tiny-random --episodes 2 --repeats 1      # smoke test
    HARNESSRL_THREADS=1 .venv/bin/python bench/update_pass.py --record                       # the figures

The units are real: episodes of one harness on the suite's train tasks, sampled by the trainer's
own float32 model, every model call a unit with an advantage of +1 or -1 (alternating by episode,
so that every unit is forwarded). Each repeat times every way on the same units, alternating the
order; medians are quoted, and each way's gradient is compared with the first's.
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
    from harnessrl.train.packing import packed_rows
    from harnessrl.train.update import MismatchSums, UpdateContext, accumulate_gradient, recompute_old_logprobs

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

    def rows(packs: bool) -> None:
        UpdateContext.packs = property(lambda self: packs)  # type: ignore[method-assign,assignment]

    def separate() -> list[torch.Tensor]:
        rows(False)
        fresh, _ = recompute_old_logprobs(ctx, units)
        accumulate_gradient(ctx, fresh)
        return [p.grad.clone() for p in ctx.trainable]

    def fused(packs: bool) -> list[torch.Tensor]:
        rows(packs)
        running = MismatchSums(ctx.config)
        accumulate_gradient(ctx, units, mismatch=running)
        running.result(ctx.dist)
        return [p.grad.clone() for p in ctx.trainable]

    ways = {
        "separate no-grad pass, a row per call": separate,
        "old log-probs from the loss's forward, a row per call": lambda: fused(False),
        "the same, an episode's calls in shared rows": lambda: fused(True),
    }
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
    base_grads = grads[next(iter(ways))]
    scale = max(float(x.abs().max()) for x in base_grads)
    diffs = {name: max(float((x - y).abs().max()) for x, y in zip(g, base_grads)) for name, g in grads.items()}
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    base = medians[next(iter(ways))]
    result = {
        "settings": vars(args),
        "units": len(units),
        "rows_packed": len(packed_rows(units)),
        "prompt_tokens": sum(len(u.prompt_ids) for u in units),
        "completion_tokens": sum(len(u.completion_ids) for u in units),
        "seconds": seconds,
        "medians": medians,
        "speedups": {name: base / m for name, m in medians.items()},
        "grad_max_abs_diff": diffs,
        "grad_max_abs": scale,
    }
    for name, m in medians.items():
        print(
            f"{name:55} median {m:8.2f} s  {base / m:5.2f}x  grad diff {diffs[name]:.2g}"
            f"   ({', '.join(f'{s:.2f}' for s in seconds[name])})"
        )
    print(
        f"units {len(units)} in {result['rows_packed']} shared rows; prompt tokens {result['prompt_tokens']}, "
        f"completion tokens {result['completion_tokens']}; largest gradient entry {scale:.2g}"
    )
    print("UPDATE_PASS_JSON " + json.dumps(result))
    if args.record:
        label = f"{args.model}: {args.suite} x {args.harness}, {args.episodes} episodes of <= {args.max_steps} calls"
        units_text = (
            f"{len(units)} units ({result['rows_packed']} shared rows), {result['prompt_tokens']} prompt + "
            f"{result['completion_tokens']} completion tokens"
        )
        doc_rows = [
            {
                "update of the batch": name,
                "units": f"{label}; {units_text}",
                "median s": round(m, 2),
                "speed-up": f"{base / m:.2f}x",
                "gradient max abs diff": f"{diffs[name]:.1g} (of {scale:.1g})",
            }
            for name, m in medians.items()
        ]
        record_run("update_pass", doc_rows, results=result, replace_table=True)


if __name__ == "__main__":
    main()
