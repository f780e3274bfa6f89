"""`harnessrl harness ...`: list, show, validate harness specs; list the tool-call formats."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from harnessrl.cli.common import err, fail, out

harness_app = typer.Typer(no_args_is_help=True, help="List, show, validate harness specs; list the tool-call formats.")


@harness_app.command("list")
def harness_list() -> None:
    """The built-in harnesses and how they differ."""
    from harnessrl.harness.registry import builtin_names, load_harness
    from harnessrl.harness.spec import require_loop_harness

    table = Table("name", "protocol", "loop", "steps", "history", "demos", "guards", "description")
    for name in builtin_names():
        s = require_loop_harness(load_harness(name), "a built-in harness")
        r = s.rules
        c = s.capabilities
        guards = [
            g
            for g, on in (
                ("loop", r.loop_guard.enabled),
                ("budget", r.budget_notice.enabled),
                ("memory", s.bootstrap.memory_tool),
                ("verify", r.submit_checkpoint.enabled),
                ("shell", r.shell.enabled),
                ("ledger", c.ledger.enabled),
                ("lessons", bool(c.experiences)),
                ("helpers", bool(c.helper_tools)),
            )
            if on
        ]
        history = "all" if r.history_window is None else f"last {r.history_window}"
        if r.observation_window is not None:
            history += f", {r.observation_window} obs."
        table.add_row(
            s.name,
            s.protocol.format + ("" if s.protocol.lenient else " (strict)"),
            s.loop.kind,
            str(r.max_steps),
            history,
            str(len(r.demonstrations)),
            ",".join(guards) or "-",
            " ".join(s.description.split()),  # the table wraps it; a cut mid-word reads badly
        )
    out.print(table)


@harness_app.command("protocols")
def harness_protocols() -> None:
    """The tool-call formats a spec can name in protocol.format: built in, and plugins of installed packages."""
    from rich.text import Text

    from harnessrl.harness.protocols import PROTOCOL_CLASSES, protocol_class, protocol_plugins

    table = Table("format", "from", "call")
    for name, cls in PROTOCOL_CLASSES.items():
        table.add_row(name, "built-in", Text(cls.shape))
    skipped = []
    for plugin in protocol_plugins():
        if plugin.error is None:
            table.add_row(plugin.name, f"plugin: {plugin.distribution}", Text(protocol_class(plugin.name).shape))
        else:
            skipped.append(plugin.error)
    out.print(table)
    for error in skipped:
        err.print("[yellow]skipped:[/] ", end="")
        err.print(error, markup=False, highlight=False, soft_wrap=True)


@harness_app.command("show")
def harness_show(name: Annotated[str, typer.Argument(help="built-in name or spec path")]) -> None:
    """Print a harness spec as YAML."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import SpecError

    try:
        spec = load_harness(name)
    except SpecError as e:
        fail(str(e))
    sys.stdout.write(spec.to_yaml())


@harness_app.command("validate")
def harness_validate(paths: Annotated[list[Path], typer.Argument(help="spec files")]) -> None:
    """Validate spec files; exits 1 if any is invalid."""
    from harnessrl.harness.spec import SpecError, load_spec

    bad = 0
    for p in paths:
        try:
            spec = load_spec(p)
            out.print(f"[green]ok[/] {p} ({spec.name})", highlight=False)
        except SpecError as e:
            err.print("[bold red]invalid:[/] ", end="")
            err.print(str(e), markup=False, highlight=False, soft_wrap=True)
            bad += 1
    if bad:
        raise typer.Exit(1)


@harness_app.command("schema")
def harness_schema() -> None:
    """Print the JSON schema of harness specs."""
    from harnessrl.harness.spec import spec_json_schema

    sys.stdout.write(json.dumps(spec_json_schema(), indent=2) + "\n")
