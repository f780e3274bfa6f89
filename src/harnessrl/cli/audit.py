"""`harnessrl audit`: adversarial probes against a suite's graders (harnessrl/audit.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from harnessrl.cli.common import err, fail, out


def audit_cmd(
    suite: Annotated[str, typer.Option(help="a built-in suite, or a task folder as clawgym:PATH, harbor:PATH, ...")],
    split: Annotated[str, typer.Option(help="the split whose tasks are probed")] = "test",
    n: Annotated[Optional[int], typer.Option("--n", help="only the first N tasks of the split", min=1)] = None,
    probe: Annotated[
        Optional[list[str]],
        typer.Option(help="a probe to run (repeat for several; default all): null, empty, instruction, junk, grader"),
    ] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", help="folder for audit.json and audit.md (default: print only)")
    ] = None,
    fail_on_findings: Annotated[
        bool, typer.Option(help="exit 1 when a probe passes a task or the grader probe sees grader files")
    ] = False,
) -> None:
    """Probe a suite's graders for reward hacks: tasks a null, instruction-only, junk-writing or
    grader-seeking agent passes, and grader files an agent could see. Prints the report (and
    writes it with --out, beside audit.json)."""
    from harnessrl.audit import PROBES, audit_suite
    from harnessrl.tasks import get_suite

    probes = tuple(probe) if probe else PROBES
    try:
        s = get_suite(suite)
        tasks = s.tasks(split, n if n is None else min(n, s.split_sizes.get(split, 0)))
    except ValueError as e:
        fail(str(e))
    try:
        report = audit_suite(suite, tasks, split, probes, progress=lambda task_id: err.print(f"probing {task_id}"))
    except ValueError as e:
        fail(str(e))
    text = report.markdown()
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "audit.json").write_text(json.dumps(report.to_json(), indent=1), encoding="utf-8")
        (out_dir / "audit.md").write_text(text, encoding="utf-8")
    out.print(text, markup=False, highlight=False, soft_wrap=True)
    if fail_on_findings and (report.passed_by_probe() or report.exposed()):
        raise typer.Exit(1)
