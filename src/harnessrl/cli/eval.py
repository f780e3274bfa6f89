"""`harnessrl eval`, `summary`: run an evaluation and read its run folder (`export`: cli/export.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from harnessrl.cli.common import config_command, err, executor_for, fail, given_options, job_errors, out
from harnessrl.config import PREFLIGHT, EvalConfig, ExecutorOptions, run_options
from harnessrl.jobs.measured import NOTHING_MEASURED, message

if TYPE_CHECKING:
    from harnessrl.results import EvalSummary

EvalRun = run_options(
    "runs/eval", "continue a run folder, skipping finished episodes", base=ExecutorOptions, preflight=PREFLIGHT
)

# NOTHING_MEASURED (3): the exit status of an evaluation whose every episode was an infrastructure
# error: it ran, but measured nothing (a dead model server, an agent program the sandbox cannot
# start, a broken grader); every job that runs episodes exits so (harnessrl.jobs.measured).


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


def _first_infra_error(folder: Path, harness: str) -> str:
    """The infrastructure error of the first stored episode of `harness` that has one."""
    from harnessrl.store import RunStore

    with RunStore(folder) as store:
        for t in store.trajectories(harness=harness, with_tokens=False):
            if t.is_infra_error:
                return t.infra_error or t.termination_detail
    return ""


def check_measured(summary: EvalSummary, folder: Path) -> None:
    """Exit NOTHING_MEASURED, with the first error, when every episode of the run was an
    infrastructure error; a warning for each harness of which that is true while others measured."""
    empty = [name for name, m in summary.harnesses.items() if m.n_episodes == 0 and m.n_infra_errors]
    if not empty:
        return
    if len(empty) < len(summary.harnesses):
        for name in empty:
            m = summary.harnesses[name]
            err.print(
                f"warning: every episode of harness {name} ({m.n_infra_errors}) was an infrastructure error; "
                f"the first: {_first_infra_error(folder, name)}",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        return
    n = sum(m.n_infra_errors for m in summary.harnesses.values())
    fail(message(n, _first_infra_error(folder, empty[0])), NOTHING_MEASURED)


@config_command(EvalConfig, EvalRun)
def eval_cmd(config: EvalConfig, run: Any) -> None:
    """Evaluate a model on a suite through one or more harnesses.

    Exit status: 0 the run finished;
    2 a configuration error, or a harness whose first request cannot fit the model or whose agent
    program could not make its first request (the preflight: nothing ran);
    3 every episode was an infrastructure error, so nothing was measured (the first error is shown);
    130 Ctrl-C, 143 SIGTERM (finished episodes are kept: continue with --resume).
    """
    from harnessrl.jobs import entries

    with job_errors(run.out, "finished episodes are saved"):
        with executor_for(run) as executor:
            summary = entries.evaluate(
                config,
                run,
                given=given_options(),
                log=lambda m: err.print(m, highlight=False, markup=False, soft_wrap=True),
                executor=executor,
            ).result
    print_summary_table(summary)
    out.print(f"run folder: {run.out}  (summary.json, run.db)", highlight=False)
    check_measured(summary, Path(run.out))


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
