"""Synchronous against asynchronous GRPO on the same run: `--max-off-policy-steps 0` (collect, then
update) and `--max-off-policy-steps 1` (the next step's rollouts are sampled on the rollout server
while the trainer updates), alternating, on one model, suite, harnesses and seed.

    .venv/bin/python bench/async_grpo.py --steps 3 --repeats 1            # smoke test, ~1 minute
    HARNESSRL_THREADS=1 .venv/bin/python bench/async_grpo.py               # the figures

Setup: the codeword task of bench/scheduler_sweep.py (a small Llama warm-started on oracle replies
through some harnesses, then trained by reward on one key), so that groups carry signal and every
step updates: that is when there is something to overlap. The rollout server is `harnessrl serve`
over the warm-started model, in this process (a thread), so the server and the trainer share this
machine's cores and an update slows the rollouts it overlaps; on a GPU node with vLLM on its own
GPU they would not compete.

Reported per mode (medians over the repeats; each run's step figures without its first step,
which has nothing to overlap): steps per hour, seconds per step, the trainer's wait for rollouts
per step (`time.rollout_wait`), the server's idle seconds per step (`servers_idle`: no request of
this run in flight), the policy lag, and the held-out evaluation after the last step (the same
number of steps in both modes: test-split tasks x attempts under the training harnesses and the
two held-out ones). One `ASYNC_GRPO_JSON {...}` line to paste.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _run(args, url: str, warm: Path, lag: int, out: Path) -> dict:
    import scheduler_sweep as sweep

    from harnessrl.kernel import enter
    from harnessrl.train.config import TrainConfig
    from harnessrl.train.trainer import Trainer

    suite = sweep.CodewordSuite(sweep.N_KEYS)
    specs = {n: sweep.shrunk_spec(n) for n in args.train + sweep.HELD_OUT_HARNESSES}
    config = TrainConfig(
        model=f"hf:{warm}",
        scheduler="harness-bandit",
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        group_size=args.group_size,
        lr=args.lr,
        lora_r=8,
        lora_alpha=16,
        temperature=args.temperature,
        checkpoint_every=args.steps,
        eval_every=0,
        rollout_servers=[url],
        max_off_policy_steps=lag,
        seed=args.seed,
        device="cpu",
        save_rollouts=False,
    )
    t0 = time.perf_counter()
    objects = {"suite": suite, "harnesses": [specs[n] for n in args.train]}
    trainer = Trainer(enter("train grpo", config, out, objects=objects, progress=False))
    trainer.run()
    wall = time.perf_counter() - t0
    held_out = sweep.evaluate(trainer.peft_model, trainer.tokenizer, suite, list(specs.values()), args, args.seed)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    later = steps[1:] or steps
    return {
        "max_off_policy_steps": lag,
        "wall_s": wall,
        "step_s": statistics.median(r["time"]["total"] for r in later),
        "steps_per_hour": 3600 / statistics.median(r["time"]["total"] for r in later),
        "trainer_wait_s": statistics.median(r["time"].get("rollout_wait", r["time"]["rollout"]) for r in later),
        "server_idle_s": statistics.median(sum(r.get("servers_idle") or [0.0]) for r in later),
        "backward_s": statistics.median(r["time"]["backward"] for r in later),
        "overlapped_steps": sum(bool(r.get("rollouts_overlapped")) for r in steps),
        "policy_lag_max": max(r.get("policy_lag_max") or 0 for r in steps),
        "optimizer_steps": sum(bool(r["optimizer_step"]) for r in steps),
        "reward_mean": statistics.mean(r["reward_mean"] for r in steps if r["reward_mean"] is not None),
        "test_train_harnesses": held_out["train_mean"],
        "test_held_out": held_out["held_out"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--tasks-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--warm-epochs", type=int, default=15)
    parser.add_argument("--eval-tasks", type=int, default=16)
    parser.add_argument("--eval-attempts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))

    import scheduler_sweep as sweep

    from harnessrl.serve import serving

    args.train = list(sweep.TRAIN_HARNESSES)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="async-grpo-"))
    warm = root / "warm"
    specs = {n: sweep.shrunk_spec(n) for n in args.train}
    facts = sweep.warm_start(args.seed, sweep.CodewordSuite(sweep.WARM_KEYS), specs, args.train, warm, args.warm_epochs)
    print(f"warm start: {facts['units']} units, final loss {facts['final_loss']:.3f}, {facts['seconds']:.0f} s")
    results: dict[int, list[dict]] = {0: [], 1: []}
    with serving(f"hf:{warm}") as url:
        for repeat in range(args.repeats):
            for lag in (0, 1) if repeat % 2 == 0 else (1, 0):
                r = _run(args, url, warm, lag, root / f"n{lag}-r{repeat}")
                results[lag].append(r)
                print(
                    f"  N={lag} repeat {repeat}: {r['step_s']:.2f} s/step, wait {r['trainer_wait_s']:.2f} s, "
                    f"server idle {r['server_idle_s']:.2f} s, overlapped {r['overlapped_steps']}, "
                    f"lag max {r['policy_lag_max']}, updates {r['optimizer_steps']}, "
                    f"test {r['test_train_harnesses']:.3f}",
                    flush=True,
                )

    def median(lag: int, key: str):
        values = [r[key] for r in results[lag] if r[key] is not None]
        return statistics.median(values) if values else None

    keys = ("step_s", "steps_per_hour", "trainer_wait_s", "server_idle_s", "backward_s", "test_train_harnesses")
    summary = {lag: {k: median(lag, k) for k in keys} for lag in (0, 1)}
    print(f"\n{'':28}{'sync (N=0)':>14}{'async (N=1)':>14}")
    for key in keys:
        a, b = summary[0][key], summary[1][key]
        shown = [("-" if v is None else f"{v:.3f}") for v in (a, b)]
        print(f"{key:28}{shown[0]:>14}{shown[1]:>14}")
    ratio = summary[0]["step_s"] / summary[1]["step_s"]
    print(f"async over sync, steps per hour: {ratio:.2f}x  (run folders: {root})")
    payload = {
        "setup": "codeword (bench/scheduler_sweep.py), warm-started small Llama, harness-bandit",
        "harnesses": args.train,
        "steps": args.steps,
        "tasks_per_step": args.tasks_per_step,
        "group_size": args.group_size,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "summary": {f"N={lag}": summary[lag] for lag in (0, 1)},
        "async_over_sync_steps_per_hour": ratio,
        "runs": results,
    }
    print("ASYNC_GRPO_JSON " + json.dumps(payload))


if __name__ == "__main__":
    main()
