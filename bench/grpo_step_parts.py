"""The update of one GRPO step on a real step's units, with and without shared prefixes forwarded
once (harnessrl.train.prefix_share), split into its parts: the old-log-prob pass (run when a batch
makes more than one optimizer step), the forward, the backward and the optimizer step of the
default update (one pass, one mini-batch: the loss's own forward gives the old log-probs).

    .venv/bin/python bench/grpo_step_parts.py --model tiny-random --tasks 2 --group 2 --repeats 1   # smoke test
    HARNESSRL_THREADS=1 .venv/bin/python bench/grpo_step_parts.py --units /tmp/step-units.json --record

The units are one step's as `harnessrl train grpo` makes them: --tasks train tasks x --group
attempts through one harness at its own rules (unless --max-steps / --max-new-tokens cut them),
sampled at the run temperature by the trainer's own float32 model, every model call a unit. The
embedded model passes few tasks, so the advantages are forced: +1 / -1 alternating within each
group, so that every unit is forwarded. --units FILE keeps the units (written on the first run,
read on later ones: the rollouts take minutes). Each repeat times both ways on the same units and
the same weights (the optimizer step is undone after each), alternating the order; medians, and
each way's gradient compared with the rows-whole one.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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

WAYS = {"rows whole": False, "shared prefixes": True}
PARTS = ("old-log-prob pass", "forward", "backward", "optimizer")


def step_units(args, trainer, spec, suite) -> list:
    """The step's units: from --units FILE where it exists, else rolled out (and written there)."""
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.train.grpo import TrainingUnit, units_from_trajectories

    if args.units and Path(args.units).exists():
        return [TrainingUnit(**u) for u in json.loads(Path(args.units).read_text())]
    sampling = SamplingParams(temperature=trainer.config.temperature, top_p=1.0, seed=args.seed)
    jobs = make_jobs(suite.tasks("train", args.tasks), [spec], args.group)
    t0 = time.perf_counter()
    trajectories = Runner(trainer.policy, sampling, max_in_flight=len(jobs), progress=False).run(jobs)
    print(f"rollouts: {len(trajectories)} episodes in {time.perf_counter() - t0:.0f} s", flush=True)
    by_task: dict[str, int] = {}
    advantages = {}
    for t in trajectories:
        i = by_task[t.task_id] = by_task.get(t.task_id, -1) + 1
        advantages[t.episode_id] = 1.0 if i % 2 == 0 else -1.0
    units = units_from_trajectories(trajectories, advantages)
    if args.units:
        Path(args.units).write_text(json.dumps([dataclasses.asdict(u) for u in units]))
    return units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--suite", default="toolcalc")
    parser.add_argument("--harness", default="react")
    parser.add_argument("--tasks", type=int, default=8, help="train tasks of the step")
    parser.add_argument("--group", type=int, default=4, help="attempts per task")
    parser.add_argument("--max-steps", type=int, default=None, help="the harness's model calls per episode (its own)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per model call (the harness's own)")
    parser.add_argument("--micro-batch", type=int, default=None, help="the update's token budget (the trainer's)")
    parser.add_argument("--units", default=None, help="a JSON file of the step's units: read, or written")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", default="main", help="the record's table (one per kind of step)")
    add_record_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))

    from harnessrl.train.prefix_share import plan_of
    from harnessrl.train.update import (
        MismatchSums,
        accumulate_gradient,
        micro_batches,
        padded_batch,
        recompute_old_logprobs,
    )

    rules = {k: v for k, v in (("max_steps", args.max_steps), ("max_new_tokens", args.max_new_tokens)) if v}
    extra = {"micro_batch": args.micro_batch} if args.micro_batch else {}
    trainer, spec, suite = float32_trainer(args.model, args.suite, args.harness, rules, args.seed, **extra)
    units = step_units(args, trainer, spec, suite)
    trainer.policy.close()
    base_ctx = trainer.update_context()
    contexts = {
        name: dataclasses.replace(base_ctx, config=base_ctx.config.replace(share_prefixes=share))
        for name, share in WAYS.items()
    }
    assert contexts["shared prefixes"].shares, "this model's forward cannot share prefixes"
    weights = [p.detach().clone() for p in base_ctx.trainable]
    optimizer_state = copy.deepcopy(base_ctx.optimizer.state_dict())

    def one_update(ctx) -> tuple[dict[str, float], torch.Tensor]:
        """The old-log-prob pass, then the default update's forward + backward and optimizer
        step; the weights and the optimizer as they were afterwards."""
        seconds = {}
        t0 = time.perf_counter()
        recompute_old_logprobs(ctx, units)
        seconds["old-log-prob pass"] = time.perf_counter() - t0
        ctx.optimizer.zero_grad(set_to_none=True)
        times: dict[str, float] = {}
        running = MismatchSums(ctx.config)
        accumulate_gradient(ctx, units, mismatch=running, times=times)
        running.result(ctx.dist)
        seconds.update(times)
        grad = torch.cat([p.grad.reshape(-1) for p in ctx.trainable])
        t0 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(ctx.trainable, ctx.config.max_grad_norm)
        ctx.optimizer.step()
        ctx.optimizer.zero_grad(set_to_none=True)
        seconds["optimizer"] = time.perf_counter() - t0
        with torch.no_grad():
            for p, w in zip(ctx.trainable, weights):
                p.copy_(w)
        ctx.optimizer.load_state_dict(copy.deepcopy(optimizer_state))
        return seconds, grad

    seconds: dict[str, dict[str, list[float]]] = {name: {part: [] for part in PARTS} for name in WAYS}
    grads: dict[str, torch.Tensor] = {}
    for r in range(args.repeats):
        for name in list(WAYS) if r % 2 == 0 else list(reversed(WAYS)):
            parts, grads[name] = one_update(contexts[name])
            for part in PARTS:
                seconds[name][part].append(parts[part])
            print(f"  repeat {r + 1} {name}: " + ", ".join(f"{p} {parts[p]:.1f} s" for p in PARTS), flush=True)

    medians = {name: {part: statistics.median(s) for part, s in parts.items()} for name, parts in seconds.items()}
    for name in WAYS:
        medians[name]["update"] = sum(medians[name][p] for p in ("forward", "backward", "optimizer"))
    base = grads["rows whole"]
    grad_rel = {name: float((g - base).norm() / base.norm()) for name, g in grads.items()}
    forwarded, budgets = {}, {}
    active = contexts["rows whole"].active(units)
    for name, ctx in contexts.items():
        sizes = []
        for mb in micro_batches(active, ctx.config.micro_batch, ctx.packs, ctx.shares):
            batch = padded_batch(mb, ctx.pad_id, None, ctx.packs)
            sizes.append(plan_of(batch).forwarded if ctx.shares else batch["input_ids"].numel())
        forwarded[name], budgets[name] = sum(sizes), {"micro_batches": len(sizes), "largest": max(sizes)}
    result = {
        "settings": vars(args),
        "micro_batch": base_ctx.config.micro_batch,
        "units": len(units),
        "episodes": len({u.episode_id for u in units}),
        "prompt_tokens": sum(len(u.prompt_ids) for u in units),
        "completion_tokens": sum(len(u.completion_ids) for u in units),
        "forwarded_tokens": forwarded,
        "micro_batches": budgets,
        "seconds": seconds,
        "medians": medians,
        "ratio_update": medians["rows whole"]["update"] / medians["shared prefixes"]["update"],
        "ratio_old_logprob_pass": medians["rows whole"]["old-log-prob pass"]
        / medians["shared prefixes"]["old-log-prob pass"],
        "grad_rel_diff": grad_rel,
    }
    for name in WAYS:
        m = medians[name]
        print(
            f"{name:16} update {m['update']:7.1f} s (forward {m['forward']:.1f}, backward {m['backward']:.1f}, "
            f"optimizer {m['optimizer']:.2f}); old-log-prob pass {m['old-log-prob pass']:.1f} s; "
            f"{forwarded[name]} tokens forwarded in {budgets[name]['micro_batches']} micro-batches "
            f"(largest {budgets[name]['largest']}); gradient rel. diff {grad_rel[name]:.1g}"
        )
    print(
        f"{result['units']} units of {result['episodes']} episodes, {result['prompt_tokens']} prompt + "
        f"{result['completion_tokens']} completion tokens; update {result['ratio_update']:.2f}x, "
        f"old-log-prob pass {result['ratio_old_logprob_pass']:.2f}x"
    )
    print("GRPO_STEP_PARTS_JSON " + json.dumps(result))
    if args.record:
        label = (
            f"{args.model}: {args.suite} x {args.harness}, {args.tasks} tasks x group {args.group}; "
            f"{len(units)} units, {result['prompt_tokens']} prompt + {result['completion_tokens']} completion tokens"
        )
        doc_rows = []
        for name in WAYS:
            m = medians[name]
            doc_rows.append(
                {
                    "update of one step": name,
                    "units": label,
                    "tokens forwarded": f"{forwarded[name]} ({budgets[name]['micro_batches']} micro-batches)",
                    "old-log-prob pass s": round(m["old-log-prob pass"], 1),
                    "forward s": round(m["forward"], 1),
                    "backward s": round(m["backward"], 1),
                    "optimizer s": round(m["optimizer"], 2),
                    "update s": round(m["update"], 1),
                    "update vs rows whole": f"{medians['rows whole']['update'] / m['update']:.2f}x",
                    "gradient rel. diff": f"{grad_rel[name]:.0e}",
                }
            )
        record_run("grpo_step_parts", doc_rows, results=result, table=args.table, replace_table=True)


if __name__ == "__main__":
    main()
