"""`harnessrl train ...`: the training commands (cli.py mounts `train_app` as `train`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

train_app = typer.Typer(no_args_is_help=True, help="Train the model's weights across harnesses (GRPO with LoRA).")

_err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)
_out = Console() if sys.stdout.isatty() else Console(width=160)


def _fail(message: str, code: int = 2) -> None:
    """One clear line on stderr and a non-zero exit, never a traceback (as cli.fail)."""
    _err.print("[bold red]error:[/] ", end="")
    _err.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _scheduler_options(items: list[str]) -> dict[str, str]:
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--scheduler-option wants KEY=VALUE (e.g. floor=0.02), got {item!r}")
        options[key.strip().replace("-", "_")] = value.strip()
    return options


@train_app.command("grpo")
def grpo_cmd(
    model: Annotated[str, typer.Option(help="model to train: tiny-random, smollm2-135m or hf:PATH")] = "smollm2-135m",
    suite: Annotated[str, typer.Option(help="suite whose train split gives the tasks")] = "toolcalc",
    harnesses: Annotated[list[str], typer.Option("--harnesses", "-H", help="harness names, 'all' or spec paths; comma-separate or repeat")] = ["json-tools,xml-tags,react,code-act,plan-execute,workspace-agent"],
    scheduler: Annotated[str, typer.Option(help="harness-bandit, mixed, uniform, round-robin, single:NAME, learnability-only, transfer-only")] = "harness-bandit",
    scheduler_option: Annotated[list[str], typer.Option("--scheduler-option", help="KEY=VALUE passed to the scheduler (e.g. floor=0.02); repeat")] = [],
    steps: Annotated[int, typer.Option(help="training steps (one rollout batch each)")] = 150,
    tasks_per_step: Annotated[int, typer.Option(help="train tasks sampled per step")] = 8,
    group_size: Annotated[int, typer.Option(help="attempts per task (one GRPO group), >= 2")] = 8,
    lr: Annotated[float, typer.Option(help="AdamW learning rate of the LoRA weights")] = 1e-4,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay")] = 0.0,
    max_grad_norm: Annotated[float, typer.Option(help="gradient clipping norm (0 = off)")] = 1.0,
    lora_r: Annotated[int, typer.Option(help="LoRA rank")] = 16,
    lora_alpha: Annotated[float, typer.Option(help="LoRA alpha (scale = alpha / r)")] = 32.0,
    lora_targets: Annotated[str, typer.Option(help="comma-separated module names that get LoRA")] = "q_proj,k_proj,v_proj,o_proj",
    temperature: Annotated[float, typer.Option(help="temperature of rollouts and of training log-probs (> 0)")] = 0.7,
    ppo_epochs: Annotated[int, typer.Option(help="passes over each rollout batch (> 1: the ratio clip acts)")] = 1,
    mini_batches: Annotated[int, typer.Option(help="optimizer steps per pass (the batch split in N parts)")] = 1,
    micro_batch: Annotated[int, typer.Option(help="tokens (rows x padded length) per forward/backward")] = 2048,
    aggregation: Annotated[str, typer.Option(help="token-mean (DAPO) or seq-mean (GRPO)")] = "token-mean",
    clip_low: Annotated[float, typer.Option(help="lower ratio clip")] = 0.2,
    clip_high: Annotated[float, typer.Option(help="upper ratio clip")] = 0.28,
    kl_coef: Annotated[float, typer.Option(help="KL penalty to the base model (0 = off)")] = 0.0,
    scale_advantages: Annotated[bool, typer.Option("--scale-advantages/--no-scale-advantages", help="divide advantages by the group std (off: Dr. GRPO)")] = True,
    sketch_dim: Annotated[int, typer.Option(help="dimension of the gradient sketch")] = 512,
    sketch_kind: Annotated[str, typer.Option(help="countsketch or gaussian")] = "countsketch",
    checkpoint_every: Annotated[int, typer.Option(help="write OUT/checkpoint every N steps (and at the end)")] = 10,
    eval_every: Annotated[int, typer.Option(help="evaluate on dev tasks every N steps (0 = off)")] = 0,
    eval_tasks: Annotated[int, typer.Option(help="first N dev tasks, every harness")] = 8,
    eval_temperature: Annotated[float, typer.Option(help="sampling temperature of evaluations")] = 0.7,
    max_in_flight: Annotated[int, typer.Option(help="episodes in flight (generation batch)")] = 64,
    retries: Annotated[int, typer.Option(help="re-runs of an episode after an infrastructure error")] = 2,
    seed: Annotated[int, typer.Option(help="seed of tasks, scheduler, LoRA init and sampling")] = 0,
    save_rollouts: Annotated[bool, typer.Option("--save-rollouts/--no-save-rollouts", help="keep every training episode in OUT/rollouts/run.db")] = True,
    out: Annotated[Path, typer.Option("--out", "-o", help="run folder")] = Path("runs/train"),
    resume: Annotated[bool, typer.Option("--resume", help="continue the run in --out from its checkpoint")] = False,
    progress: Annotated[bool, typer.Option(help="progress bar (plain lines when not a terminal)")] = True,
) -> None:
    """GRPO with LoRA across harnesses: each step the scheduler picks the harness that collects the batch."""
    from harnessrl.train.trainer import Trainer, TrainConfig, TrainError, TrainingDiverged

    config = TrainConfig(
        model=model,
        suite=suite,
        harnesses=list(harnesses),
        scheduler=scheduler,
        scheduler_options=_scheduler_options(scheduler_option),
        steps=steps,
        tasks_per_step=tasks_per_step,
        group_size=group_size,
        lr=lr,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        lora_targets=[t.strip() for t in lora_targets.split(",") if t.strip()],
        temperature=temperature,
        ppo_epochs=ppo_epochs,
        mini_batches=mini_batches,
        micro_batch=micro_batch,
        aggregation=aggregation,
        clip_low=clip_low,
        clip_high=clip_high,
        kl_coef=kl_coef,
        scale_advantages=scale_advantages,
        sketch_dim=sketch_dim,
        sketch_kind=sketch_kind,
        checkpoint_every=checkpoint_every,
        eval_every=eval_every,
        eval_tasks=eval_tasks,
        eval_temperature=eval_temperature,
        max_in_flight=max_in_flight,
        retries=retries,
        seed=seed,
        save_rollouts=save_rollouts,
    )
    try:
        trainer = Trainer(config, out, resume=resume, progress=progress, console=_err)
        summary = trainer.run()
    except TrainError as e:
        _fail(str(e), 2)
    except TrainingDiverged as e:
        _fail(str(e), 1)
    except KeyboardInterrupt:
        _err.print(f"interrupted: continue from the last checkpoint with --resume --out {out}", highlight=False)
        raise typer.Exit(130)
    _out.print(f"trained {summary['steps']} steps; adapter: {summary['adapter']}", highlight=False)
    _out.print(f"evaluate it with: harnessrl eval --model hf:{summary['adapter']} --suite {suite}", highlight=False, soft_wrap=True)
