"""`harnessrl tasks ...` and `harnessrl models ...`: what can be run."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table

from harnessrl.cli.common import fail, out

tasks_app = typer.Typer(no_args_is_help=True, help="List suites and show tasks.")
models_app = typer.Typer(no_args_is_help=True, help="The models harnessrl can run.")


@tasks_app.command("list")
def tasks_list(suite: Annotated[Optional[str], typer.Option(help="only this suite")] = None) -> None:
    """Suites, their split sizes and task families."""
    from harnessrl.tasks import get_suite, list_suites

    names = list_suites() if suite is None else [suite]
    table = Table("suite", "train", "dev", "test", "families", "description")
    for n in names:
        try:
            s = get_suite(n)
        except ValueError as e:
            fail(str(e))
        table.add_row(
            n,
            str(s.split_sizes.get("train", 0)),
            str(s.split_sizes.get("dev", 0)),
            str(s.split_sizes.get("test", 0)),
            ", ".join(s.family_names()),
            s.description,
        )
    out.print(table)


@tasks_app.command("show")
def tasks_show(task_id: Annotated[str, typer.Argument(help="suite/split/index, e.g. workspace/dev/00003")]) -> None:
    """Show one task: instruction, tools and the known-good solution."""
    from harnessrl.tasks import get_suite

    try:
        task = get_suite(task_id.split("/")[0]).task(task_id)
    except ValueError as e:
        fail(str(e))
    out.print(f"{task.id} family={task.family} pass_threshold={task.pass_threshold}", markup=False, highlight=False)
    out.print(task.instruction, markup=False, highlight=False)
    out.print("tools: " + ", ".join(t.name for t in task.tools), markup=False, highlight=False)
    out.print("solution: " + json.dumps(task.solution), markup=False, highlight=False, soft_wrap=True)


def _size(n: int | None) -> str:
    if not n:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


@models_app.command("list")
def models_list() -> None:
    """Named models: what they are, where they are cached, their size on disk."""
    from harnessrl.models import SPEC_FORMS, describe_models

    table = Table("name", "available", "cached", "size", "cache folder", "source")
    for m in describe_models():
        table.add_row(
            m["name"],
            "yes" if m["available"] else "no",
            "yes" if m["cached"] else "no",
            _size(m["size_bytes"]),
            m["cache"],
            m["source"],
        )
    out.print(table)
    out.print(f"model forms: {SPEC_FORMS}", markup=False, highlight=False)
