"""`harnessrl import-traces`: another tool's recorded agent traces as a harnessrl run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from harnessrl.cli.common import fail, out

IMPORT_FORMATS = ("openenv",)


def import_traces_cmd(
    src: Annotated[Path, typer.Argument(help="a trace file (.json or .jsonl) or a folder of them")],
    output: Annotated[Path, typer.Option("--out", "-o", help="the run folder to write (new or empty)")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            "-f",
            help="openenv (OpenEnv capture traces: rollout documents, trace entries, TrainingTrace or "
            "Harbor rollout results; docs/openenv.md)",
        ),
    ] = "openenv",
    harness: Annotated[
        Optional[str], typer.Option("--harness", help="the harness name of traces that name none (default: openenv)")
    ] = None,
    pass_threshold: Annotated[
        float, typer.Option("--pass-threshold", help="a reward at or above it passes (rewards in [0, 1] are grades)")
    ] = 1.0,
) -> None:
    """Read recorded traces into a new run folder, one episode per trace (triage, report, export
    and compare then work on it)."""
    from harnessrl.integrations.openenv import TraceError, read_traces

    if fmt not in IMPORT_FORMATS:
        fail(f"unknown trace format '{fmt}' (available: {', '.join(IMPORT_FORMATS)})")
    try:
        result = read_traces(src, output, harness=harness, pass_threshold=pass_threshold)
    except TraceError as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write {output}: {e}")
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(result.kinds.items()))
    out.print(f"read {result.n_episodes} traces ({kinds}) into {output}", highlight=False)
    out.print(
        f"{result.graded} graded (a reward in [0, 1]); {result.with_tokens} with token ids and log-probs on every call",
        highlight=False,
    )
    for note in result.notes:
        out.print(note, highlight=False)
    out.print(f"next: harnessrl triage {output}; harnessrl report {output}", highlight=False)
