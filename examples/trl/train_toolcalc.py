"""GRPO in TRL with harnessrl's harnesses and HarnessBandit: toolcalc through several harnesses.

On this machine (the embedded SmolLM2-135M on the CPU, a few steps):

    .venv/bin/python examples/trl/train_toolcalc.py --steps 2 --out runs/trl-toolcalc

On a GPU node (not run here; docs/trl.md, "The GPU recipe"):

    accelerate launch --num_processes 8 examples/trl/train_toolcalc.py --model hf:/models/Qwen2.5-1.5B-Instruct \
        --harnesses json-tools,react,plan-execute --eval-harnesses hermes-tools --per-device-batch 4 \
        --num-generations 8 --steps 150 --out runs/trl-qwen

What it builds is the whole integration (harnessrl.integrations.trl): a dataset of toolcalc's
train tasks, HarnessRollout as the rollout function (one harnessrl episode per row, the harness
of each batch chosen by the scheduler), its reward (the episode's grade) and its callback (the
gradient sketch, the scheduler's observation, checkpoints, evaluations), and TRL's GRPOTrainer
with a LoRA adapter. The run folder holds TRL's checkpoints and logs and OUT/harnessrl/
(steps.jsonl, eval.jsonl, rollouts/run.db: `harnessrl triage OUT/harnessrl/rollouts` works on it).
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", default="smollm2-135m", help="smollm2-135m, tiny-random, hf:PATH or PATH (a local model folder)"
    )
    p.add_argument("--suite", default="toolcalc")
    p.add_argument("--harnesses", default="json-tools,react,plan-execute", help="trained through (comma-separated)")
    p.add_argument("--eval-harnesses", default="", help="held out: evaluated, never trained on (comma-separated)")
    p.add_argument("--train-tasks", type=int, default=0, help="the first N train tasks only (0: the whole split)")
    p.add_argument("--scheduler", default="harness-bandit", help="any `harnessrl train grpo --scheduler` name")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (one generation batch each)")
    p.add_argument("--per-device-batch", type=int, default=4, help="rows per process and step (episodes)")
    p.add_argument("--num-generations", type=int, default=2, help="attempts per task (a GRPO group)")
    p.add_argument(
        "--gradient-accumulation", type=int, default=1, help="micro-batches per optimizer step (one batch's rows)"
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--max-steps-per-episode", type=int, default=0, help="override the harnesses' max_steps (0: keep)")
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: off; needed for held-out)")
    p.add_argument("--eval-tasks", type=int, default=8)
    p.add_argument("--eval-attempts", type=int, default=1)
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the weights' dtype: HarnessRollout serves float32 only (bfloat16 is refused, docs/trl.md 'Precision'; "
        "examples/trl/logprob_gap.py measures it)",
    )
    p.add_argument("--max-in-flight", type=int, default=16, help="episodes in flight per process")
    p.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: at the end only)")
    p.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute activations in the backward (TRL's default: less memory, more time)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/trl-toolcalc")
    return p.parse_args(argv)


def load_model(spec: str, dtype: str):
    """The model and tokenizer: the embedded ones by name, or a local transformers folder (never a download)."""
    import torch

    from harnessrl.models.embedded import load_smollm2, load_tokenizer, tiny_random_model

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    if spec == "smollm2-135m":
        return load_smollm2().to(torch_dtype), copy.deepcopy(load_tokenizer())
    if spec == "tiny-random":
        return tiny_random_model(), copy.deepcopy(load_tokenizer())
    if spec.startswith("hf:") or Path(spec).is_dir():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = spec.removeprefix("hf:")
        return (
            AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True),
            AutoTokenizer.from_pretrained(path, local_files_only=True),
        )
    raise SystemExit(f"--model {spec!r}: give smollm2-135m, tiny-random, hf:PATH or the path of a local model folder")


def harness_specs(names: str, max_steps: int) -> list:
    """The harnesses by name or spec path, with max_steps overridden where asked."""
    from harnessrl.harness.registry import resolve_harnesses
    from harnessrl.harness.spec import HarnessSpec

    specs = resolve_harnesses([names]) if names else []
    if max_steps:
        specs = [
            HarnessSpec.model_validate({**s.to_dict(), "rules": {**s.to_dict()["rules"], "max_steps": max_steps}})
            if isinstance(s, HarnessSpec)
            else s
            for s in specs
        ]
    return specs


def build_trainer(args: argparse.Namespace, bf16: bool = False):
    """GRPOTrainer wired to harnessrl: the rollout function, its reward and its callback. `bf16`:
    TRL's bf16 autocast (refused by HarnessRollout; examples/trl/logprob_gap.py measures it)."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from harnessrl.integrations.trl import HarnessRollout
    from harnessrl.train.config import DEFAULT_LORA_TARGETS

    rollout = HarnessRollout(
        args.suite,
        harness_specs(args.harnesses, args.max_steps_per_episode),
        scheduler=args.scheduler,
        seed=args.seed,
        max_in_flight=args.max_in_flight,
        eval_harnesses=harness_specs(args.eval_harnesses, args.max_steps_per_episode),
        eval_every=args.eval_every,
        eval_tasks=args.eval_tasks,
        eval_attempts=args.eval_attempts,
    )
    model, tokenizer = load_model(args.model, args.dtype)
    config = GRPOConfig(
        output_dir=args.out,
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=args.gradient_accumulation,
        num_generations=args.num_generations,
        max_steps=args.steps,
        learning_rate=args.lr,
        temperature=args.temperature,
        logging_steps=1,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to="none",
        seed=args.seed,
        bf16=bf16,  # TRL's default is True: autocast, which HarnessRollout refuses (docs/trl.md, "Precision")
        use_cpu=not _has_gpu(),
        disable_tqdm=False,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        train_dataset=rollout.dataset("train", args.train_tasks or None),
        reward_funcs=rollout.reward,
        rollout_func=rollout,
        callbacks=[rollout.callback],
        peft_config=LoraConfig(
            r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules=list(DEFAULT_LORA_TARGETS)
        ),
    )
    return trainer, rollout


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    trainer, rollout = build_trainer(args)
    trainer.train()
    trainer.save_model(args.out)
    harnesses = [p.harness for p in rollout.history]
    print(f"{len(harnesses)} steps in {time.perf_counter() - started:.0f} s, harnesses: {', '.join(harnesses)}")
    print(f"adapter: {args.out}; per step: {args.out}/harnessrl/steps.jsonl; episodes: {args.out}/harnessrl/rollouts")


if __name__ == "__main__":
    main()
