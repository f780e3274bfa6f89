"""Supervised fine-tuning with and without packed rows (`harnessrl train sft --pack`), timed on
the same batches of real examples.

    .venv/bin/python bench/sft_pack.py --model tiny-random --tasks 4 --batches 1 --repeats 1   # smoke test
    HARNESSRL_THREADS=1 .venv/bin/python bench/sft_pack.py --record                            # the figures

The examples are real: the oracle's passing episodes of the suite's first train tasks through the
source harness (`harnessrl eval --model oracle`), re-rendered into the target harness as
`harnessrl train sft` does, every model call an example. The batches are those of a --pack epoch
(episodes shuffled, an episode's calls kept together, --batch-size examples a batch); each batch's
loss and gradient (forward and backward, one optimizer step's worth) is timed with one row per
call and with an episode's calls in shared rows, alternating the order; medians are quoted, and
the packed loss and gradient are compared with the unpacked ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--suite", default="toolcalc")
    parser.add_argument("--source-harness", default="json-tools")
    parser.add_argument("--as-harness", default="react")
    parser.add_argument("--tasks", type=int, default=16, help="first N train tasks, one oracle episode each")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=3, help="the first B batches of the epoch are timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_record_argument(parser)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))

    from harnessrl.config import EvalConfig, RunOptions
    from harnessrl.harness.registry import load_harness
    from harnessrl.jobs import entries
    from harnessrl.models import load_policy
    from harnessrl.train import lora
    from harnessrl.train.config import SFTConfig
    from harnessrl.train.packing import packed_rows
    from harnessrl.train.sft import epoch_order, sft_loss, units_of
    from harnessrl.train.sft_data import ChatRenderer, build_examples, select_episodes

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "oracle"
        config = EvalConfig(
            model="oracle", suite=args.suite, split="train", tasks=args.tasks, harness=[args.source_harness]
        )
        entries.evaluate(config, RunOptions(out=run, progress=False))
        policy = load_policy(args.model)
        examples = build_examples(
            select_episodes([run]), load_harness(args.as_harness), ChatRenderer(policy.tokenizer, policy.tool_role)
        )
    units = units_of(examples)
    sft = SFTConfig(model=args.model, batch_size=args.batch_size, pack=True, seed=args.seed)
    peft_model, trainable, _ = lora.attach(policy, sft, ValueError)
    order = epoch_order(len(units), args.seed, 0, [u.episode_id for u in units])
    batches = [[units[i] for i in order[k : k + args.batch_size]] for k in range(0, len(order), args.batch_size)][
        : args.batches
    ]
    pad_id = policy.pad_id

    def step(batch, pack: bool) -> tuple[float, float, int, list[torch.Tensor]]:
        for p in trainable:
            p.grad = None
        t0 = time.perf_counter()
        loss, _, padded = sft_loss(peft_model, batch, pad_id, sft.micro_batch, pack)
        return time.perf_counter() - t0, loss, padded, [p.grad.detach().clone() for p in trainable]

    ways = {"a row per call": False, "an episode's calls in shared rows": True}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    padded: dict[str, int] = dict.fromkeys(ways, 0)
    loss_diff = grad_diff = scale = 0.0
    for b, batch in enumerate(batches):
        for r in range(args.repeats):
            names = list(ways) if (r + b) % 2 == 0 else list(reversed(ways))
            got = {}
            for name in names:
                got[name] = step(batch, ways[name])
                seconds[name].append(got[name][0])
            if r == 0:
                (_, l0, p0, g0), (_, l1, p1, g1) = got["a row per call"], got["an episode's calls in shared rows"]
                padded["a row per call"] += p0
                padded["an episode's calls in shared rows"] += p1
                loss_diff = max(loss_diff, abs(l0 - l1))
                grad_diff = max(grad_diff, max(float((x - y).abs().max()) for x, y in zip(g0, g1)))
                scale = max(scale, max(float(x.abs().max()) for x in g0))
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    base = medians["a row per call"]
    timed = [u for batch in batches for u in batch]
    rows_packed = sum(len(packed_rows(batch)) for batch in batches)
    result = {
        "settings": vars(args),
        "examples": len(units),
        "episodes": len({u.episode_id for u in units}),
        "timed_examples": len(timed),
        "rows_packed": rows_packed,
        "prompt_tokens": sum(len(u.prompt_ids) for u in timed),
        "completion_tokens": sum(len(u.completion_ids) for u in timed),
        "padded_tokens": padded,
        "seconds": seconds,
        "medians": medians,
        "speedups": {name: base / m for name, m in medians.items()},
        "loss_max_abs_diff": loss_diff,
        "grad_max_abs_diff": grad_diff,
        "grad_max_abs": scale,
    }
    for name, m in medians.items():
        print(
            f"{name:36} median {m:7.2f} s a batch  {base / m:5.2f}x  padded tokens {padded[name]}"
            f"   ({', '.join(f'{s:.2f}' for s in seconds[name])})"
        )
    print(
        f"{len(timed)} examples of {len(batches)} batches in {rows_packed} shared rows; loss diff {loss_diff:.2g}, "
        f"gradient diff {grad_diff:.2g} (largest entry {scale:.2g})"
    )
    print("SFT_PACK_JSON " + json.dumps(result))
    if args.record:
        label = (
            f"{args.model}: oracle {args.suite} x {args.source_harness} as {args.as_harness}, "
            f"{len(batches)} batches of {args.batch_size}; {len(timed)} examples ({rows_packed} shared rows), "
            f"{result['prompt_tokens']} prompt + {result['completion_tokens']} completion tokens"
        )
        doc_rows = [
            {
                "SFT step (forward + backward)": name,
                "examples": label,
                "padded tokens": padded[name],
                "median s a batch": round(m, 2),
                "speed-up": f"{base / m:.2f}x",
                "loss / gradient max abs diff": f"{loss_diff:.1g} / {grad_diff:.1g} (of {scale:.1g})",
            }
            for name, m in medians.items()
        ]
        record_run("sft_pack", doc_rows, results=result, replace_table=True)


if __name__ == "__main__":
    main()
