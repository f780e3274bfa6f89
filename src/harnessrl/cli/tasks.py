"""`harnessrl tasks ...` and `harnessrl models ...`: what can be run."""

from __future__ import annotations

import json
from pathlib import Path
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


@models_app.command("folder")
def models_folder(
    model: Annotated[str, typer.Argument(help="smollm2-135m, tiny-random or hf:PATH")],
) -> None:
    """Print the transformers folder of a model (config, weights, tokenizer and chat template), for
    an engine outside this process, such as vLLM, to serve the same weights: smollm2-135m's
    converted cache folder, the tiny random model written into the cache, or PATH itself."""
    from harnessrl.models import check_spec
    from harnessrl.models.embedded import model_folder

    try:
        spec = check_spec(model, oracle=True)  # the oracle, like a server, has no folder: said below
    except ValueError as e:
        fail(str(e))
    if spec.kind == "hf":
        path = Path(spec.path).expanduser()
        if not (path / "config.json").is_file():
            fail(f"{spec.path}: not a transformers model folder (no config.json)")
        print(path.resolve())
        return
    if spec.kind != "named":
        fail(f"{model!r} is not a local model: give smollm2-135m, tiny-random or hf:PATH")
    try:
        print(model_folder(spec.name))
    except Exception as e:  # noqa: BLE001 - a model that cannot be built is one line, not a traceback
        fail(f"{model}: {e}")
