"""The benchmarks' record: one JSON line per run in `bench/results/<benchmark>.jsonl`.

A bench script given `--record` appends its run here (`record_run`), and `bench/write_doc.py`
turns the records into docs/BENCHMARKS.md: one table per benchmark table, each row the latest
run of its configuration, with the commands and dates that produced them.

A record:

    {"benchmark": "rollout_mismatch",          # the file's stem
     "table": "main",                          # which of the benchmark's tables (default "main")
     "date": "2026-12-02",                     # UTC date of the run
     "command": "HARNESSRL_THREADS=1 .venv/bin/python bench/rollout_mismatch.py",
     "machine": "2 cores, ...",                # where it ran (optional)
     "rows": [{"sampler": "float32", "tokens": 318, ...}, ...],   # column header -> value
     "replace_table": false,                   # true: this run's rows replace every older row
     "entered": false,                         # true: entered from a run's printed table, not by --record
     "results": {...}}                         # the script's whole JSON output (optional)

A row's first column is its label: a newer record's row with the same label replaces the older
one. Values are numbers or strings; `write_doc.py` prints numbers as they were recorded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help="append this run to bench/results/<benchmark>.jsonl (`make benchmarks-doc` then rewrites the page)",
    )


def this_command() -> str:
    """The command line that started this process, as a user would type it."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    env = [f"{k}={os.environ[k]}" for k in ("HARNESSRL_THREADS",) if k in os.environ]
    args = [a for a in sys.argv[1:] if a != "--record"]
    return " ".join([*env, ".venv/bin/python", shlex.quote(str(script)), *map(shlex.quote, args)])


def this_machine() -> str:
    threads = os.environ.get("HARNESSRL_THREADS", "default")
    return f"{os.cpu_count()} cores ({platform.machine()}), torch threads {threads}"


def record_run(
    benchmark: str,
    rows: list[dict[str, Any]],
    *,
    table: str = "main",
    results: Any = None,
    replace_table: bool = False,
    results_dir: Path | None = None,
) -> Path:
    """Append one run of `benchmark` to its results file; returns the file."""
    if not rows:
        raise ValueError("a record needs at least one row")
    record: dict[str, Any] = {
        "benchmark": benchmark,
        "table": table,
        "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "command": this_command(),
        "machine": this_machine(),
        "rows": rows,
    }
    if replace_table:
        record["replace_table"] = True
    if results is not None:
        record["results"] = results
    folder = results_dir or RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{benchmark}.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False, default=float) + "\n")
    print(f"recorded in {path}", file=sys.stderr)
    return path


def read_records(results_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every record of every results file, in file order; a malformed line is an error naming it."""
    folder = results_dir or RESULTS_DIR
    out: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            missing = [k for k in ("date", "command", "rows") if k not in rec]
            if missing or not isinstance(rec.get("rows"), list) or not rec["rows"]:
                raise ValueError(f"{path}:{n}: a record needs date, command and a non-empty rows list")
            rec.setdefault("benchmark", path.stem)
            rec.setdefault("table", "main")
            out.append(rec)
    return out
