"""How far a sampler's log-probs are from the float32 trainer's: the same episodes' tokens sampled
by the float32, bfloat16 and int8 engines of one model, then recomputed by the trainer (LoRA at its
zero init, so the trainer's policy is the model itself), as `train grpo` measures it every step.

    .venv/bin/python bench/rollout_mismatch.py --model tiny-random --episodes 4     # smoke test
    HARNESSRL_THREADS=1 .venv/bin/python bench/rollout_mismatch.py                    # the figures

Per sampler: the per-token k3 KL estimate of KL(sampler || trainer) (mean, max), the mean and max
|log r| (r = p_trainer / p_sampler on the sampled tokens), the share of tokens with |log r| >
log 2, and the mean truncated-importance weight min(r, 2) with the share of tokens capped.
docs/training.md, "Rollout-trainer mismatch and truncated importance sampling", has the formulas.
"""

from __future__ import annotations

import argparse
import json
import os
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
    parser.add_argument("--harness", default="json-tools")
    parser.add_argument("--episodes", type=int, default=8, help="first N train tasks, one episode each")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--dtypes", default="float32,bfloat16,int8")
    parser.add_argument("--seed", type=int, default=0)
    add_record_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))

    from harnessrl.models import load_policy
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.train.grpo import units_from_trajectories
    from harnessrl.train.update import recompute_old_logprobs

    rules = {"max_steps": 1, "max_new_tokens": args.max_new_tokens}
    extra = {"temperature": args.temperature, "rollout_correction": "tis"}
    # the float32 model with its LoRA at zero: the trainer's log-probs
    trainer, spec, suite = float32_trainer(args.model, args.suite, args.harness, rules, args.seed, **extra)
    ctx = trainer.update_context()
    jobs = make_jobs(suite.tasks("train", args.episodes), [spec], 1)
    rows = {}
    for dtype in args.dtypes.split(","):
        sampler = trainer.policy if dtype == "float32" else load_policy(args.model, dtype=dtype, device="cpu")
        t0 = time.perf_counter()
        sampling = SamplingParams(temperature=args.temperature, top_p=1.0, seed=args.seed)
        trajectories = Runner(sampler, sampling, max_in_flight=args.episodes, progress=False).run(jobs)
        seconds = time.perf_counter() - t0
        if sampler is not trainer.policy:
            sampler.close()
        # every unit with a nonzero advantage, so that every sampled token is recomputed
        units = units_from_trajectories(trajectories, {t.episode_id: 1.0 for t in trajectories})
        _, m = recompute_old_logprobs(ctx, units)
        rows[dtype] = {
            "tokens": sum(len(u.completion_ids) for u in units),
            "sample_s": round(seconds, 1),
            "kl_mean": m.kl_mean,
            "kl_max": m.kl_max,
            "abs_log_ratio_mean": m.logprob_diff_mean,
            "abs_log_ratio_max": m.logprob_diff_max,
            "mismatch_frac": m.mismatch_frac,
            "tis_weight_mean": m.tis_weight_mean,
            "tis_capped_frac": m.tis_capped_frac,
        }
    trainer.policy.close()
    keys = ["tokens", "kl_mean", "kl_max", "abs_log_ratio_mean", "abs_log_ratio_max", "mismatch_frac"]
    keys += ["tis_weight_mean", "tis_capped_frac"]
    print(f"{'sampler':10}" + "".join(f"{k:>20}" for k in keys))
    for dtype, r in rows.items():
        print(f"{dtype:10}" + "".join(f"{r[k]:>20.3g}" if r[k] is not None else f"{'-':>20}" for k in keys))
    print("ROLLOUT_MISMATCH_JSON " + json.dumps({"settings": vars(args), "samplers": rows}))
    if args.record:
        record_run("rollout_mismatch", doc_rows(rows, args), results={"settings": vars(args), "samplers": rows})


def doc_rows(rows: dict, args: argparse.Namespace) -> list[dict]:
    """One row per sampler, as docs/BENCHMARKS.md shows them."""

    def g(x: float | None, digits: int = 2) -> str:
        return "-" if x is None else f"{x:.{digits}g}"

    out = []
    for dtype, r in rows.items():
        label = dtype + (" (the trainer's own engine)" if dtype == "float32" else "")
        if args.model != "smollm2-135m":
            label += f", {args.model}"
        out.append(
            {
                "sampler": label,
                "tokens": r["tokens"],
                "k3 KL mean": g(r["kl_mean"]),
                "k3 KL max": g(r["kl_max"]),
                "|log r| mean": g(r["abs_log_ratio_mean"]),
                "|log r| max": g(r["abs_log_ratio_max"]),
                "share |log r| > log 2": "0" if not r["mismatch_frac"] else f"{100 * r['mismatch_frac']:.2g} %",
                "TIS weight mean (cap 2)": g(r["tis_weight_mean"], 4),
                "share capped": "0" if not r["tis_capped_frac"] else f"{100 * r['tis_capped_frac']:.2g} %",
            }
        )
    return out


if __name__ == "__main__":
    main()
