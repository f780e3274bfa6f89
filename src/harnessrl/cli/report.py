"""`harnessrl triage`, `report`, `view`: diagnose and show a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from harnessrl.cli.common import fail, out


def triage_cmd(run: Annotated[Path, typer.Argument(help="run folder")]) -> None:
    """Classify every failed episode by its first failure signal; writes RUN/triage.json."""
    from harnessrl.store import RunStore
    from harnessrl.triage import CONTENT, PROCESS, triage, write_triage

    if not RunStore.exists(run):
        fail(f"{run} is not a run folder (no run.db)")
    with RunStore(run) as store:
        result = triage(store.trajectories(with_tokens=False))
    path = write_triage(result, run)
    table = Table(title=f"first failure signal per harness ({run})")
    table.add_column("harness", no_wrap=True)
    for col in ("failed", *PROCESS, *CONTENT, "infra", "process share"):
        table.add_column(col.replace("_", " "), justify="right")
    for name, h in result.items():
        share = h["process_share"]
        table.add_row(
            name,
            f"{h['n_failed']}/{h['n_valid']}",
            *[str(h["counts"][c]) for c in (*PROCESS, *CONTENT, "infra")],
            "-" if share is None else f"{share:.0%}",
        )
    out.print(table)
    out.print(f"wrote {path}", highlight=False)


def report_cmd(
    runs: Annotated[
        list[Path], typer.Argument(help="one run folder (or a study folder), or two run folders to compare (B - A)")
    ],
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="report folder (default: FIRST_RUN/report)")
    ] = None,
) -> None:
    """Build the static HTML report (metrics, plots, triage, trajectory viewer)."""
    from harnessrl.report import ReportError, build_report

    try:
        index = build_report(list(runs), out_dir)
    except ReportError as e:
        fail(str(e))
    out.print(f"wrote {index}", highlight=False)
    out.print(f"view it with: harnessrl view {runs[0]}  (or open the file in a browser)", highlight=False)


def view_cmd(
    run: Annotated[Path, typer.Argument(help="run folder (its report is built if missing) or report folder")],
    port: Annotated[int, typer.Option(help="port on 127.0.0.1 (0 = any free port)")] = 0,
) -> None:
    """Serve a run's report on 127.0.0.1 and print the URL; Ctrl-C stops."""
    import time

    from harnessrl.report import ReportError, build_report, serve
    from harnessrl.report.study import is_study_folder

    try:
        is_run = (run / "run.db").is_file() or is_study_folder(run)
        if is_run and not (run / "report" / "index.html").is_file():
            build_report([run])
        server, url = serve(run, port=port)
    except (ReportError, OSError) as e:
        fail(str(e))
    out.print(f"serving {run} at {url}  (Ctrl-C to stop)", highlight=False)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
