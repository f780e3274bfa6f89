"""`harnessrl study`: its options are StudyConfig's fields (plus the run folder's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from harnessrl.cli.common import check_measured, config_command, err, given_options, job_errors, out
from harnessrl.config import run_options
from harnessrl.jobs.study import StudyConfig

if TYPE_CHECKING:
    from harnessrl.results import StudyResult

StudyRun = run_options(
    "runs/study",
    "continue the study in --out: finished stages are skipped, an interrupted one resumes",
)


@config_command(StudyConfig, StudyRun)
def study_cmd(config: StudyConfig, run: Any) -> None:
    """Harness x weights: evolve a harness, distil its passing episodes into the seed harness's
    weights (and a placebo), and compare the 5 cells on held-out tasks."""
    from harnessrl.jobs import entries

    with job_errors(run.out, "finished stages and episodes are saved"):
        done = entries.study(
            config, run, given=given_options(), log=lambda m: err.print(m, highlight=False, markup=False), console=err
        )
    print_study(done.result)
    out.print(f"study folder: {run.out} (study.json, stages.json, one run folder per stage)", highlight=False)
    check_measured(run.out)


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def _share(x: Any) -> str:
    return "-" if x is None else f"{x:.0%}"


def print_study(result: StudyResult) -> None:
    """The cells, the paired differences and the recommendation's sentences."""
    cells = result.cells
    k = str(next(iter(cells.values()))["attempts"])
    table = Table(title=f"{result.suite} / test / {result.model}: harness x weights")
    for col in ("cell", "harness", "weights", "tasks", "mean score", "95% CI", "pass@1", f"pass@{k}", f"pass^{k}"):
        table.add_column(col, justify="left" if col in ("cell", "harness", "weights") else "right", no_wrap=True)
    for col in ("delivery", "process fail", "content fail"):
        table.add_column(col, justify="right")
    for name, c in cells.items():
        ci = c["mean_score_ci95"]
        table.add_row(
            name,
            c["harness_name"],
            c["weights"],
            str(c["n_tasks"]),
            _fmt(c["mean_score"]),
            "-" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
            _fmt(c["pass_at_k"].get("1")),
            _fmt(c["pass_at_k"].get(k)),
            _fmt(c["pass_hat_k"].get(k)),
            _fmt(c["delivery_rate"]),
            _share(c["triage"]["process_rate"]),
            _share(c["triage"]["content_rate"]),
        )
    out.print(table)
    diffs = Table(title="paired differences by task (b - a)")
    for col in ("comparison", "a", "b", "difference", "95% CI", "claim"):
        diffs.add_column(col, justify="right" if col in ("difference", "95% CI") else "left", no_wrap=True)
    for name, d in result.paired_differences.items():
        ci = d["ci95"]
        diffs.add_row(
            name,
            d["a"],
            d["b"],
            "-" if d["mean_difference"] is None else f"{d['mean_difference']:+.3f}",
            "-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]",
            d["verdict"],
        )
    out.print(diffs)
    out.print("recommendation:", highlight=False)
    for line in result.recommendation.text:
        out.print(f"  - {line}", highlight=False, markup=False, soft_wrap=True)
