"""HarnessBandit in TRL's asynchronous GRPO trainer (AsyncGRPOTrainer), rollouts on `harnessrl serve`.

On this machine (the tiny random model on the CPU, `harnessrl serve` started in this process;
about 4 minutes for 3 steps; the default SmolLM2-135M is much slower on a 2-core CPU):

    .venv/bin/python examples/trl/async_bandit.py --model tiny-random --steps 3 --out runs/trl-async

With an agent program among the harnesses (examples/agents/minimal.yaml: its own OpenAI client):

    .venv/bin/python examples/trl/async_bandit.py --harnesses json-tools,examples/agents/minimal.yaml

Against a server started elsewhere (the same base model; its admin key in $HARNESSRL_ADMIN_KEY,
and the adapter folders under --out readable by it):

    harnessrl serve hf:/models/Qwen2.5-1.5B-Instruct --port 8000 &
    export HARNESSRL_ADMIN_KEY=$(cat /tmp/harnessrl-serve-XXXX/admin-key)
    python examples/trl/async_bandit.py --model /models/Qwen2.5-1.5B-Instruct --server http://127.0.0.1:8000/v1

What it builds (docs/trl-async.md): HarnessRolloutWorker (the scheduler, harnessrl's runner on the
server, TRL's RolloutSamples) as AsyncGRPOTrainer's rollout_worker, its ServeAdapterTransfer (the
LoRA adapter to the server's keyed adapter route at every weight sync) as the weight_transfer.
Without CUDA, TRL's two CUDA-only pieces are replaced for the run (cpu_stand_ins). The run folder
holds TRL's logs and OUT/harnessrl/ (batches.jsonl, rollouts/run.db).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # AsyncGRPOTrainer is experimental in TRL 1.16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m, tiny-random, or a local model folder")
    p.add_argument(
        "--server", default="", help="a running `harnessrl serve` (base URL ending in /v1); default: start one"
    )
    p.add_argument("--suite", default="toolcalc")
    p.add_argument("--harnesses", default="json-tools,react", help="names or spec files, comma-separated")
    p.add_argument("--scheduler", default="harness-bandit", help="any `harnessrl train grpo --scheduler` name")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps")
    p.add_argument("--per-device-batch", type=int, default=4, help="samples (episodes) per micro-batch")
    p.add_argument("--gradient-accumulation", type=int, default=1)
    p.add_argument("--num-generations", type=int, default=2, help="attempts per task (a GRPO group)")
    p.add_argument("--max-staleness", type=int, default=1, help="policy versions a sample may lag (TRL's)")
    p.add_argument("--scheduler-lag", type=int, default=1, help="batches selected before earlier ones are taken")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--max-in-flight", type=int, default=8, help="episodes in flight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/trl-async")
    return p.parse_args(argv)


def model_path(spec: str) -> Path:
    """A transformers folder: AsyncGRPOTrainer loads its model from a path, and the server must
    serve the same weights (the embedded models' folders, written once into the cache)."""
    from harnessrl.models.embedded import model_folder

    if spec in ("smollm2-135m", "tiny-random"):
        return model_folder(spec)
    if Path(spec).is_dir():
        return Path(spec)
    raise SystemExit(f"--model {spec!r}: give smollm2-135m, tiny-random or the path of a local model folder")


@contextlib.contextmanager
def rollout_server(url: str, folder: Path):
    """(base URL, admin key): the given server with $HARNESSRL_ADMIN_KEY, or one started here."""
    if url:
        yield url, None
        return
    from harnessrl.serve import serving

    key = secrets.token_urlsafe(24)
    with serving(f"hf:{folder}", admin_key=key, max_loras=4, max_lora_rank=64) as started:
        yield started, key


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch
    from peft import LoraConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    from harnessrl.harness.registry import resolve_harnesses
    from harnessrl.integrations.trl.async_serve import cpu_stand_ins
    from harnessrl.integrations.trl.async_worker import HarnessRolloutWorker

    folder = model_path(args.model)
    out = Path(args.out)
    on_cpu = not torch.cuda.is_available()
    stand_ins = cpu_stand_ins() if on_cpu else contextlib.nullcontext()
    with rollout_server(args.server, folder) as (url, key), stand_ins:
        worker = HarnessRolloutWorker(
            args.suite,
            resolve_harnesses([args.harnesses]),
            url,
            scheduler=args.scheduler,
            seed=args.seed,
            scheduler_lag=args.scheduler_lag,
            max_in_flight=args.max_in_flight,
            admin_key=key,  # None: $HARNESSRL_ADMIN_KEY
        )
        config = AsyncGRPOConfig(
            output_dir=str(out),
            max_steps=args.steps,
            per_device_train_batch_size=args.per_device_batch,
            gradient_accumulation_steps=args.gradient_accumulation,
            num_generations=args.num_generations,
            max_staleness=args.max_staleness,
            token_budget=0,  # fixed-count micro-batches: how the worker knows which batch a step trained
            temperature=args.temperature,
            learning_rate=args.lr,
            bf16=False,  # the server samples in float32: TRL's bf16 autocast would put a gap in every ratio
            use_cpu=on_cpu,
            save_strategy="no",
            report_to=[],
            logging_steps=1,
            seed=args.seed,
        )
        trainer = AsyncGRPOTrainer(
            model=str(folder),
            args=config,
            train_dataset=worker.dataset(),
            peft_config=LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, target_modules=["q_proj", "v_proj"]),
            rollout_worker=worker,
            weight_transfer=worker.weight_transfer,
        )
        worker.attach(trainer)
        trainer.train()
    for record in worker.batches:
        print(
            json.dumps(
                {
                    "batch": record.batch,
                    "version": record.version,
                    "harness": record.harness,
                    "probabilities": {h: round(p, 3) for h, p in record.probabilities.items()},
                    "rewards": {h: sum(v) / len(v) for h, v in record.rewards.items() if v},
                    "trained": record.trained,
                    "pure_steps": record.pure_steps,
                    "observed": record.observed,
                }
            )
        )
    print(f"policy versions published: {worker.weight_transfer.version}; records in {out / 'harnessrl'}")


if __name__ == "__main__":
    main()
