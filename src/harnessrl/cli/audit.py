"""`harnessrl audit`: adversarial probes against a suite's graders (harnessrl/audit.py), what
an agent program's sandbox lets it read, reach and import (harnessrl/audit_agent.py), or the red
team: agent programs attacking the host through an eval (harnessrl/redteam.py)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from harnessrl.cli.common import err, fail, out

if TYPE_CHECKING:
    from harnessrl.audit_agent import HarnessAudit
    from harnessrl.tasks.base import Task

_VERDICT_STYLE = {"exposed": "bold red", "problem": "yellow", "ok": "green"}


def audit_cmd(
    suite: Annotated[
        Optional[str],
        typer.Option(
            help="a built-in suite, or a task folder as clawgym:PATH, harbor:PATH, ...; "
            "with --harness: the suite whose task folders the agent must not see"
        ),
    ] = None,
    harness: Annotated[
        Optional[str],
        typer.Option(
            help="audit an agent program instead (an external harness spec: a .yaml path or a registered "
            "name): what it can read, reach and import in its sandbox; exit 1 when anything is exposed"
        ),
    ] = None,
    split: Annotated[str, typer.Option(help="the split whose tasks are probed")] = "test",
    n: Annotated[Optional[int], typer.Option("--n", help="only the first N tasks of the split", min=1)] = None,
    probe: Annotated[
        Optional[list[str]],
        typer.Option(help="a probe to run (repeat for several; default all): null, empty, instruction, junk, grader"),
    ] = None,
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", help="folder for audit.json and audit.md (default: print only)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON (audit.json's content)")] = False,
    fail_on_findings: Annotated[
        bool, typer.Option(help="exit 1 when a probe passes a task or the grader probe sees grader files")
    ] = False,
    redteam: Annotated[
        bool,
        typer.Option(
            "--redteam",
            help="run the red team instead: attacker agent programs (one per attack) in an eval of --suite, "
            "in the sandbox of --harness when given; each attack HOLDS or LEAKS; exit 1 when one LEAKS",
        ),
    ] = False,
    n_tasks: Annotated[
        Optional[int], typer.Option("--tasks", help="--redteam: the first N tasks of the split (default 1)", min=1)
    ] = None,
    attack: Annotated[
        Optional[list[str]],
        typer.Option(help="--redteam: an attack to run (repeat for several; default all)"),
    ] = None,
    model: Annotated[
        str, typer.Option(help="--redteam: the model the attackers call once each (any form eval's --model takes)")
    ] = "tiny-random",
) -> None:
    """Probe a suite's graders for reward hacks (--suite): tasks a null, instruction-only,
    junk-writing or grader-seeking agent passes, and grader files an agent could see. Or audit an
    agent program's sandbox (--harness SPEC): the host files it can read, the host ports it can
    reach, whether it can import harnessrl; exit code 0 when nothing is exposed, 1 when something
    is, 2 when it could not be audited. Or run the red team (--redteam --suite S [--harness SPEC]):
    an attacker agent per attack, in one eval, each attack HOLDS or LEAKS; exit 1 when one LEAKS.
    Prints the report (and writes it with --out, beside audit.json)."""
    if redteam:
        if probe:
            fail("--probe chooses the probes of a suite audit; --redteam runs attacks (--attack)")
        if n is not None:
            fail("--redteam takes the number of tasks as --tasks")
        _redteam(suite, harness, split, n_tasks or 1, attack, model, out_dir, as_json)
        return
    if n_tasks is not None or attack:
        fail("--tasks and --attack are options of --redteam")
    if harness is not None:
        if probe:
            fail("--probe chooses the probes of a suite audit; --harness runs its own probe")
        _audit_harness(harness, suite, split, n, out_dir, as_json)
        return
    if suite is None:
        fail("give --suite SUITE (probe its graders) or --harness SPEC (audit an agent program's sandbox)")
    from harnessrl.audit import PROBES, audit_suite

    probes = tuple(probe) if probe else PROBES
    tasks = _tasks(suite, split, n)
    try:
        report = audit_suite(suite, tasks, split, probes, progress=lambda task_id: err.print(f"probing {task_id}"))
    except ValueError as e:
        fail(str(e))
    text = report.markdown()
    _write(out_dir, report.to_json(), text)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1))
    else:
        out.print(text, markup=False, highlight=False, soft_wrap=True)
    if fail_on_findings and (report.passed_by_probe() or report.exposed()):
        raise typer.Exit(1)


def _redteam(
    suite: str | None,
    harness: str | None,
    split: str,
    tasks: int,
    attacks: list[str] | None,
    model: str,
    out_dir: Path | None,
    as_json: bool,
) -> None:
    """The red team over `suite`: its report printed (redteam.json and redteam.md in --out, beside
    the eval's run folder and its JSONL export); exit 1 when an attack LEAKS."""
    from harnessrl.errors import JobError
    from harnessrl.redteam import ATTACKS, run_battery

    if suite is None:
        fail("--redteam needs --suite: the suite whose tasks the attackers play")
    folder = out_dir if out_dir is not None else Path(tempfile.mkdtemp(prefix="harnessrl-redteam-"))
    try:
        try:
            report = run_battery(
                suite,
                attacks=tuple(attacks) if attacks else tuple(ATTACKS),
                tasks=tasks,
                harness_spec=Path(harness) if harness is not None else None,
                out=folder,
                model=model,
                split=split,
                log=lambda line: err.print(line, markup=False, highlight=False),
            )
        except (ValueError, JobError) as e:
            fail(str(e))
        if out_dir is not None:
            (out_dir / "redteam.json").write_text(report.to_json(), encoding="utf-8")
            (out_dir / "redteam.md").write_text(report.markdown(), encoding="utf-8")
    finally:
        if out_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    if as_json:
        typer.echo(report.to_json())
    else:
        out.print(report.table(), markup=False, highlight=False, soft_wrap=True)
    if report.exit_code():
        raise typer.Exit(report.exit_code())


def _tasks(suite: str, split: str, n: int | None) -> list[Task]:
    from harnessrl.tasks import get_suite

    try:
        s = get_suite(suite)
        return s.tasks(split, n if n is None else min(n, s.split_sizes.get(split, 0)))
    except ValueError as e:
        fail(str(e))


def _write(out_dir: Path | None, data: dict[str, Any], text: str) -> None:
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "audit.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
        (out_dir / "audit.md").write_text(text, encoding="utf-8")


def _audit_harness(
    named: str, suite: str | None, split: str, n: int | None, out_dir: Path | None, as_json: bool
) -> None:
    from harnessrl.audit_agent import LoopHarnessError, audit_harness
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import SpecError

    try:
        spec = load_harness(named)
    except SpecError as e:
        fail(str(e))
    tasks = _tasks(suite, split, n) if suite is not None else []
    try:
        report = audit_harness(spec, named, tasks, suite)
    except LoopHarnessError as e:
        fail(str(e))
    _write(out_dir, report.to_json(), report.markdown())
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=1))
    else:
        _print_harness_audit(report)
    if report.exit_code():
        raise typer.Exit(report.exit_code())


def _print_harness_audit(report: HarnessAudit) -> None:
    from rich.table import Table
    from rich.text import Text

    out.print(
        f"[bold]{report.harness}[/] ({report.spec}): {' '.join(report.command)}\n"
        f"network: {report.network_had}; sandbox isolation: {report.isolation}"
        + (f"; suite: {report.suite} ({report.tasks} tasks)" if report.suite else ""),
        highlight=False,
    )
    if report.warning():
        out.print(Text(report.warning(), style="bold red"))
    table = Table("check", "what", "where", "verdict", "detail")
    table.columns[2].overflow = "fold"
    for f in report.sorted_findings():
        style = _VERDICT_STYLE.get(f.verdict, "cyan")
        table.add_row(f.check, f.what, f.where, Text(f.verdict, style=style), f.detail)
    out.print(table)
    out.print(report.summary(), highlight=False)
