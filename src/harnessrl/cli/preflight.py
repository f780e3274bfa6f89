"""`harnessrl preflight`: each harness's first request measured against the model's context
before a run (harnessrl/preflight.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from harnessrl.cli.common import err, fail, out

if TYPE_CHECKING:
    from harnessrl.preflight import PreflightReport

_VERDICT_STYLE = {"fits": "green", "tight": "yellow", "too big": "bold red", "no request": "bold red"}
TOO_BIG = 1  # exit status: a harness's first request does not fit the model
NOT_MEASURED = 2  # a harness made no first request (and none was too big), or a bad option


def preflight_cmd(
    harness: Annotated[
        list[str],
        typer.Option("--harness", "-H", help="built-in name, 'all', or a spec path; repeat or comma-separate"),
    ] = ["all"],  # noqa: B006 - typer reads the default
    model: Annotated[
        str, typer.Option(help="tiny-random, smollm2-135m, hf:PATH or openai:MODEL@BASE_URL")
    ] = "tiny-random",
    suite: Annotated[str, typer.Option(help="the suite whose first task is the one asked")] = "workspace",
    split: Annotated[str, typer.Option(help="train, dev or test")] = "dev",
    task: Annotated[Optional[str], typer.Option(help="a task id of the split (default: its first task)")] = None,
    wait: Annotated[
        float, typer.Option(help="seconds an agent program gets to make its first model call", min=1)
    ] = 120.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the reports as JSON (a list, one per harness)")
    ] = False,
    needs: Annotated[
        bool,
        typer.Option(
            "--needs",
            help="instead: run each agent program to its first model call with its sandbox limits out of the "
            "way and print what it took (processes and threads, address space, files in HOME): what its "
            "limits must allow",
        ),
    ] = False,
) -> None:
    """Measure each harness's first request against the model's context, before a run: a loop
    harness's is rendered, an agent program is run on the task until its first model call (which
    is refused, so it stops). Reports the prompt's tokens (through the model's chat template and
    tokenizer) against the context, the dialect (chat, responses, messages, gemini), the tool-call
    format, the tools and the system prompt, whether a reply of the harness's max_new_tokens fits,
    and what to trim. Exit status: 0 when every request leaves room for a whole reply or is tight,
    1 when one does not fit at all, 2 when a harness made no request (or for a bad option).
    --needs: what each agent program took of the sandbox instead (2 when one made no call even so)."""
    from harnessrl.harness.registry import resolve_harnesses
    from harnessrl.harness.spec import SpecError
    from harnessrl.models.base import ModelUnavailable
    from harnessrl.models.prompt_model import prompt_model
    from harnessrl.preflight import preflight
    from harnessrl.tasks import get_suite

    try:
        specs = resolve_harnesses(harness)
        tasks = get_suite(suite).tasks(split)
        the_model = prompt_model(model)
    except (SpecError, ValueError, ModelUnavailable) as e:
        fail(str(e))
    if not tasks:
        fail(f"suite {suite} has no {split} tasks")
    chosen = tasks[0] if task is None else next((t for t in tasks if t.id == task), None)
    if chosen is None:
        fail(f"no task {task!r} in {suite}/{split} (its first: {tasks[0].id})")
    if not as_json:
        err.print(f"preflight of {len(specs)} harness(es) for {model} on {chosen.id}", highlight=False)

    def progress(r: PreflightReport) -> None:
        if not as_json:
            err.print(f"  {r.harness}: {r.verdict}", highlight=False)

    if needs:
        print_needs(specs, chosen, the_model, wait, as_json)
        return
    reports = preflight(specs, chosen, the_model, wait_s=wait, on_report=progress)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in reports], indent=1))
    else:
        print_reports(reports)
    if any(r.verdict == "too big" for r in reports):
        raise typer.Exit(TOO_BIG)
    if any(r.verdict == "no request" for r in reports):
        raise typer.Exit(NOT_MEASURED)


def print_needs(specs: list, task: Any, model: Any, wait: float, as_json: bool) -> None:
    """`--needs`: what each agent program took of the sandbox to make its first model call (loop
    harnesses run no program: left out); exit 2 when one made no call even so."""
    from dataclasses import asdict

    from rich.table import Table

    from harnessrl.harness.spec import ExternalHarnessSpec
    from harnessrl.preflight import sandbox_needs

    agents = [s for s in specs if isinstance(s, ExternalHarnessSpec)]
    if not agents:
        fail("--needs measures agent programs (kind: external); none is among the harnesses")
    measured = []
    for spec in agents:
        if not as_json:
            err.print(f"  {spec.name}: running to its first model call", highlight=False)
        measured.append(sandbox_needs(spec, task, model, wait))
    if as_json:
        typer.echo(json.dumps([asdict(m) for m in measured], indent=1))
    else:
        table = Table(title=f"what each agent took of the sandbox to make its first model call ({task.id})")
        for col in ("harness", "first call", "processes", "with threads", "address space", "resident", "HOME"):
            table.add_column(col, justify="left" if col == "harness" else "right")
        table.add_column("largest file")
        for m in measured:
            u = m.use
            table.add_row(
                m.harness,
                "none" if m.note else f"{m.seconds:.0f} s",
                str(u.processes),
                str(u.tasks),
                f"{u.address_space_mb:,.0f} MB",
                f"{u.resident_mb:,.0f} MB",
                f"{u.written_mb:,.1f} MB",
                f"{u.largest_file_mb:,.1f} MB {u.largest_file}".strip(),
            )
        out.print(table)
        for m in measured:
            if m.note:
                out.print(f"{m.harness}: {m.note}", highlight=False, markup=False, soft_wrap=True)
    if any(m.note for m in measured):
        raise typer.Exit(NOT_MEASURED)


def print_reports(reports: list[PreflightReport]) -> None:
    from rich.table import Table
    from rich.text import Text

    if not reports:
        return
    unit = reports[0].unit
    first = reports[0]
    table = Table(title=f"first requests for {first.model} (context {first.context or '?'}; task {first.task}; {unit})")
    for col in (
        "harness",
        "kind",
        "dialect",
        "tool format",
        "tools",
        "system",
        "tool defs",
        "prompt",
        "left",
        "max new",
    ):
        table.add_column(col, justify="left" if col in ("harness", "kind", "dialect", "tool format") else "right")
    table.add_column("verdict")

    def n(x: int | None) -> str:
        return "-" if x is None else f"{x:,}"

    for r in reports:
        table.add_row(
            r.harness,
            r.kind,
            r.dialect,
            r.tool_format,
            str(r.tools),
            n(r.system),
            n(r.tool_definitions),
            n(r.prompt),
            n(r.left),
            n(r.max_new_tokens),
            Text(r.verdict, style=_VERDICT_STYLE.get(r.verdict, "cyan")),
        )
    out.print(table)
    for r in reports:
        if r.advice:
            out.print(f"{r.harness} ({r.verdict}): {r.advice}", highlight=False, markup=False, soft_wrap=True)
        if r.note:
            out.print(f"{r.harness}: {r.note}", highlight=False, markup=False, soft_wrap=True)
