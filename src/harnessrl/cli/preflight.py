"""`harnessrl preflight`: each harness's first request measured against the model's context
before a run (harnessrl/preflight.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

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
) -> None:
    """Measure each harness's first request against the model's context, before a run: a loop
    harness's is rendered, an agent program is run on the task until its first model call (which
    is refused, so it stops). Reports the prompt's tokens (through the model's chat template and
    tokenizer) against the context, the dialect (chat, responses, messages, gemini), the tool-call
    format, the tools and the system prompt, whether a reply of the harness's max_new_tokens fits,
    and what to trim. Exit status: 0 when every request leaves room for a whole reply or is tight,
    1 when one does not fit at all, 2 when a harness made no request (or for a bad option)."""
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

    reports = preflight(specs, chosen, the_model, wait_s=wait, on_report=progress)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in reports], indent=1))
    else:
        print_reports(reports)
    if any(r.verdict == "too big" for r in reports):
        raise typer.Exit(TOO_BIG)
    if any(r.verdict == "no request" for r in reports):
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
