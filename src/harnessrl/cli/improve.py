"""`harnessrl improve`: its options are ImproveConfig's fields (plus the run folder's)."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field
from rich.table import Table

from harnessrl.cli.common import check_measured, config_command, err, given_options, job_errors, out
from harnessrl.config import run_options
from harnessrl.improve import ImproveConfig

ImproveRun = run_options(
    "runs/improve",
    "continue the job in --out: finished stages are read, the interrupted one resumes, every decision is checked "
    "against the recorded one",
    stop_after=(
        Optional[str],
        Field(None, description="stop after this phase (harness, weights or content); --resume continues"),
    ),
)


@config_command(ImproveConfig, ImproveRun)
def improve_cmd(config: ImproveConfig, run: Any) -> None:
    """Harness, then weights, then content: evolve the seed harness while its edits lower the
    process failures, distil the evolved harness into the seed harness's weights (imitation and
    on-policy, the better on dev kept), GRPO on the content failures, then one held-out comparison.
    Every decision and its evidence is in OUT/decisions.jsonl."""
    from harnessrl.jobs import entries
    from harnessrl.results import ImproveStopped

    saved = "finished stages, episodes and decisions are saved"
    with job_errors(run.out, saved):
        result = entries.improve(
            config, run, given=given_options(), log=lambda m: err.print(m, highlight=False, markup=False), console=err
        ).result
    for d in result.decisions:
        out.print(f"{d.phase}: {d.key} = {d.choice}", highlight=False, markup=False, soft_wrap=True)
    if isinstance(result, ImproveStopped):
        out.print(f"stopped after the {result.stopped_after} phase; continue with --resume --out {run.out}")
        check_measured(run.out)
        return
    table = Table(title=f"{result.suite} / test / {result.model}: held out, once")
    for col in ("cell", "what", "mean score", "95% CI", "process fail", "content fail"):
        table.add_column(col, justify="left" if col in ("cell", "what") else "right")
    for name, c in result.cells.items():
        ci = c["mean_score_ci95"]
        table.add_row(
            name,
            c["what"],
            "-" if c["mean_score"] is None else f"{c['mean_score']:.3f}",
            "-" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
            "-" if c["triage"]["process_rate"] is None else f"{c['triage']['process_rate']:.0%}",
            "-" if c["triage"]["content_rate"] is None else f"{c['triage']['content_rate']:.0%}",
        )
    out.print(table)
    out.print(f"runtime-only: {result.runtime_only['text']}", highlight=False, soft_wrap=True)
    out.print(
        f"folder: {run.out} (improve.json, report.md, decisions.jsonl, one run folder per stage)", highlight=False
    )
    check_measured(run.out)
