"""`harnessrl train ...`: the training commands. Their options are TrainConfig's fields."""

from __future__ import annotations

from typing import Any

import typer

from harnessrl.cli.common import config_command, err, fail, out
from harnessrl.config import run_options
from harnessrl.train.config import TrainConfig

train_app = typer.Typer(no_args_is_help=True, help="Train the model's weights across harnesses (GRPO with LoRA).")

TrainRun = run_options("runs/train", "continue the run in --out from its checkpoint")


@train_app.command("grpo")
@config_command(TrainConfig, TrainRun)
def grpo_cmd(config: TrainConfig, run: Any) -> None:
    """GRPO with LoRA across harnesses: each step the scheduler picks the harness that collects the batch."""
    from harnessrl.train.trainer import Trainer, TrainError, TrainingDiverged

    try:
        trainer = Trainer(config, run.out, resume=run.resume, progress=run.progress, console=err)
        summary = trainer.run()
    except TrainError as e:
        fail(str(e), 2)
    except TrainingDiverged as e:
        fail(str(e), 1)
    except KeyboardInterrupt:
        err.print(f"interrupted: continue from the last checkpoint with --resume --out {run.out}", highlight=False)
        raise typer.Exit(130)
    out.print(f"trained {summary['steps']} steps; adapter: {summary['adapter']}", highlight=False)
    out.print(
        f"evaluate it with: harnessrl eval --model hf:{summary['adapter']} --suite {config.suite}",
        highlight=False,
        soft_wrap=True,
    )
