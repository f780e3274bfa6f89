"""`harnessrl train ...`: the training commands. Their options are the fields of TrainConfig, SFTConfig
and DistillConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import Field

from harnessrl.cli.common import (
    check_measured,
    config_command,
    err,
    executor_for,
    given_options,
    job_errors,
    out,
)
from harnessrl.config import PREFLIGHT, ExecutorOptions, cli, run_options
from harnessrl.train.config import DistillConfig, SFTConfig, TrainConfig

train_app = typer.Typer(
    no_args_is_help=True,
    help="Train the model's weights: across harnesses (GRPO with LoRA), on stored episodes (supervised LoRA), "
    "or toward the model under another harness (on-policy distillation).",
)

TrainRun = run_options(
    "runs/train", "continue the run in --out from its checkpoint", base=ExecutorOptions, preflight=PREFLIGHT
)
DistillRunOptions = run_options("runs/distill", "continue the run in --out from its checkpoint", base=ExecutorOptions)
SFTRunOptions = run_options(
    "runs/sft",
    "continue the run in --out from its checkpoint",
    export_jsonl=(
        Optional[Path],
        Field(None, description="also write the examples as JSONL in the chat messages format (one model call a line)"),
    ),
    export_hf=(
        Optional[Path],
        Field(
            None,
            description="also save the examples as a Hugging Face dataset in this folder (messages, task_id, "
            "harness, source run, placebo, ...); needs pip install 'harnessrl[datasets]'",
        ),
    ),
    export_only=(
        bool,
        Field(
            False,
            description="write --export-jsonl / --export-hf and train nothing",
            json_schema_extra=cli(bool_flag=True),
        ),
    ),
)


# What a training run keeps when it is interrupted.
CHECKPOINT_SAVED = "the last checkpoint is saved"


@train_app.command("grpo")
@config_command(TrainConfig, TrainRun)
def grpo_cmd(config: TrainConfig, run: Any) -> None:
    """GRPO with LoRA across harnesses: each step the scheduler picks the harness that collects the batch.

    Exit status: 0 trained; 1 training diverged; 2 a configuration error, or (the preflight) a
    harness whose first request cannot fit the model or whose agent program could not make its
    first request; 3 every training episode was an infrastructure error (nothing was measured)."""
    from harnessrl.jobs import entries
    from harnessrl.train.distributed import process_rank

    # Under torchrun / accelerate launch every process runs this command; rank 0 alone speaks.
    main = process_rank() == 0
    say = (lambda m: err.print(m, highlight=False, markup=False, soft_wrap=True)) if main else (lambda m: None)
    with job_errors(run.out, CHECKPOINT_SAVED, say=main):
        with executor_for(run) as executor:
            done = entries.train_grpo(
                config,
                run,
                given=given_options(),
                log=say,
                console=err,
                executor=executor,
            )
    if not main:
        return
    summary = done.result
    out.print(f"trained {summary.steps} steps; adapter: {summary.adapter}", highlight=False)
    out.print(
        f"evaluate it with: harnessrl eval --model hf:{summary.adapter} --suite {done.config.suite}",
        highlight=False,
        soft_wrap=True,
    )
    check_measured(run.out)


@train_app.command("sft")
@config_command(SFTConfig, SFTRunOptions)
def sft_cmd(config: SFTConfig, run: Any) -> None:
    """Supervised LoRA on stored episodes (passing ones by default), re-rendered into the harness given
    with --as-harness: every example is a model call as that harness would show it. --sample N first
    samples N attempts per task with the model and adds each task's best passing one."""
    from harnessrl.jobs import entries

    with job_errors(run.out, CHECKPOINT_SAVED):
        summary = entries.train_sft(
            config, run, given=given_options(), log=lambda m: err.print(m, highlight=False, markup=False), console=err
        ).result
    data = summary.data
    sampled = data.sampling
    if sampled:
        out.print(
            f"sampled {sampled.attempts} attempts of each of {sampled.tasks} tasks in {sampled.harness}: "
            f"{sampled.kept} tasks kept their best one ({sampled.run})",
            highlight=False,
            soft_wrap=True,
        )
    dropped = sum(data.dropped.values())
    out.print(
        f"{data.examples} examples from {data.replayed} of {data.selected} selected episodes, "
        f"as {summary.harness}" + (f" ({dropped} could not be replayed there)" if dropped else ""),
        highlight=False,
    )
    for exported in (summary.exported, summary.exported_hf):
        if exported is not None:
            out.print(f"exported: {exported}", highlight=False)
    if summary.adapter is not None:
        out.print(f"trained {summary.steps} steps; adapter: {summary.adapter}", highlight=False)
        out.print(
            f"evaluate it with: harnessrl eval --model hf:{summary.adapter} --suite {summary.suite} "
            f"--harness {summary.harness}",
            highlight=False,
            soft_wrap=True,
        )
    check_measured(run.out)  # the episodes --sample ran (none without it)


@train_app.command("distill")
@config_command(DistillConfig, DistillRunOptions)
def distill_cmd(config: DistillConfig, run: Any) -> None:
    """On-policy distillation: the student (LoRA) samples episodes in --student-harness; each sampled
    token is trained toward the same base model reading that episode through --teacher-harness
    (per-token reverse KL)."""
    from harnessrl.jobs import entries

    with job_errors(run.out, CHECKPOINT_SAVED):
        with executor_for(run) as executor:
            done = entries.train_distill(
                config,
                run,
                given=given_options(),
                log=lambda m: err.print(m, highlight=False, markup=False),
                console=err,
                executor=executor,
            )
    summary, config = done.result, done.config
    out.print(f"distilled {summary.steps} steps; adapter: {summary.adapter}", highlight=False)
    out.print(
        f"evaluate it with: harnessrl eval --model hf:{summary.adapter} --suite {config.suite} "
        f"--harness {config.student_harness}",
        highlight=False,
        soft_wrap=True,
    )
    check_measured(run.out)
