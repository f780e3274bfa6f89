"""`harnessrl export`: a run's episodes as JSONL, Inspect AI eval logs, Harbor ATIF files or
OpenEnv capture traces."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from harnessrl.cli.common import err, fail, out


def export_cmd(
    run: Annotated[Path, typer.Argument(help="run folder")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="jsonl (one trajectory per line), inspect (Inspect AI eval logs, one per harness), "
            "atif (Harbor ATIF, one JSON file per episode), "
            "openenv (OpenEnv capture traces, one JSON file per episode)",
        ),
    ] = "jsonl",
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--out",
            "--output",
            "-o",
            help="jsonl: a file (default: stdout); inspect, atif and openenv: a new or empty folder (required)",
        ),
    ] = None,
    tokens: Annotated[
        bool, typer.Option(help="jsonl and atif: include prompt/completion token ids and logprobs")
    ] = True,
    log_format: Annotated[
        str, typer.Option("--log-format", help="inspect: the log file format, eval (compact) or json")
    ] = "eval",
) -> None:
    """Export every episode of a run for other tools (docs/export.md)."""
    from harnessrl.export import (
        FORMATS,
        ExportError,
        export_atif,
        export_inspect,
        export_jsonl,
        open_run,
    )
    from harnessrl.integrations.openenv import export_openenv

    if fmt not in FORMATS:
        fail(f"unknown export format '{fmt}' (available: {', '.join(FORMATS)})")
    try:
        if fmt == "jsonl":
            if output is None:
                export_jsonl(run, sys.stdout, tokens=tokens)
                return
            open_run(run).close()  # a bad run folder is refused before the file is created
            with open(output, "w", encoding="utf-8") as fh:
                n = export_jsonl(run, fh, tokens=tokens)
            err.print(f"wrote {n} episodes to {output}", highlight=False)
            return
        if output is None:
            fail(f"--format {fmt} writes several files: give a folder with --out")
        if fmt == "inspect":
            files = export_inspect(run, output, log_format=log_format)
            out.print(f"wrote {len(files)} Inspect log(s) to {output}", highlight=False)
            out.print(f"read them with: inspect view --log-dir {output}", highlight=False)
        elif fmt == "openenv":
            if not tokens:
                fail("--format openenv always writes the token ids and log-probs: they are what its traces are for")
            summary = export_openenv(run, output)
            files, not_trainable = summary.files, summary.not_trainable
            out.print(f"wrote {len(files)} OpenEnv traces to {output}", highlight=False)
            if not_trainable:
                out.print(
                    f"{not_trainable} of them have a model call without token ids or log-probs: written "
                    "without token fields, so OpenEnv and TRL cannot train on them",
                    highlight=False,
                )
        else:
            files = export_atif(run, output, tokens=tokens)
            out.print(f"wrote {len(files)} ATIF trajectories to {output}", highlight=False)
    except ExportError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {output}: {e}")
