"""`harnessrl eval`, `summary`: run an evaluation and read its run folder (`export`: cli/export.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from harnessrl.cli.common import config_command, err, executor_for, fail, job_errors, out
from harnessrl.config import EvalConfig, ExecutorOptions, run_options

if TYPE_CHECKING:
    from harnessrl.results import EvalSummary

EvalRun = run_options("runs/eval", "continue a run folder, skipping finished episodes", base=ExecutorOptions)


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_summary_table(summary: EvalSummary) -> None:
    table = Table(title=f"{summary.suite} / {summary.split} / {summary.model}")
    for col in (
        "harness",
        "tasks",
        "episodes",
        "mean score",
        "95% CI",
        "pass@1",
        "pass@k",
        "pass^k",
        "delivery",
        "infra",
    ):
        table.add_column(col, justify="left" if col == "harness" else "right", no_wrap=col == "harness")
    for name, m in summary.harnesses.items():
        k = str(m.attempts)
        ci = m.mean_score_ci95
        table.add_row(
            name,
            str(m.n_tasks),
            str(m.n_episodes),
            _fmt(m.mean_score),
            "-" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
            _fmt(m.pass_at_k.get("1")),
            _fmt(m.pass_at_k.get(k)) + f" (k={k})",
            _fmt(m.pass_hat_k.get(k)),
            _fmt(m.delivery_rate),
            str(m.n_infra_errors),
        )
    out.print(table)


@config_command(EvalConfig, EvalRun)
def eval_cmd(config: EvalConfig, run: Any) -> None:
    """Evaluate a model on a suite through one or more harnesses."""
    from harnessrl.executors import ExecutorError
    from harnessrl.jobs.evaluate import EvalError, run_eval

    with job_errors(run.out, "finished episodes are saved", (EvalError, ExecutorError)):
        with executor_for(run) as executor:
            summary = run_eval(
                config, run, log=lambda m: err.print(m, highlight=False, markup=False), executor=executor
            )
    print_summary_table(summary)
    out.print(f"run folder: {run.out}  (summary.json, run.db)", highlight=False)


def summary_cmd(run: Annotated[Path, typer.Argument(help="run folder")]) -> None:
    """Recompute and print the per-harness table of a run folder."""
    from harnessrl.jobs.evaluate import write_summary
    from harnessrl.store import RunStore

    if not RunStore.exists(run):
        fail(f"{run} holds no run (no run.db)")
    with RunStore(run) as store:
        config = store.config
        if not config:
            fail(f"{run}: run database has no config")
        print_summary_table(write_summary(store, config, run))
