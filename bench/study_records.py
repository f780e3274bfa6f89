"""Per-task records of a finished `harnessrl study` folder, for bench/results/records/.

A study's five cells are ordinary evaluation folders (OUT/cells/CELL); this writes each cell's
per-task scores (`eval-CELL.jsonl`, the format of bench/results/records/README.md) and a run.json
whose comparisons are the study's own paired differences (study.json's `paired_differences`), so
that `bench/write_doc.py` recomputes the self-distillation study's intervals from committed files:

    .venv/bin/python bench/study_records.py runs/self-distill --name self-distill
    # then, in a bench/doc fragment: {{differences study/self-distill}}
    #                                {{interval study/self-distill seed-base seed-distilled cells}}

Each cell runs one harness (the seed or the evolved one), so the records pool the two under the
name "cells": a comparison of two cells pairs each task's score in one with its score in the other,
as the study's own differences do.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import RECORDS_DIR, eval_rows, write_lines  # noqa: E402

POOL = "cells"  # the pool name of every cell's harness, in run.json's "pools"


def study_records(out: Path, records: Path, command: str = "") -> dict[str, Any]:
    """Write `records`/eval-CELL.jsonl for each cell of the study in `out`, and run.json; returns run.json."""
    path = out / "study.json"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: the study has not finished (`harnessrl study ... --resume` ends it)")
    study = json.loads(path.read_text(encoding="utf-8"))
    cells: dict[str, dict[str, Any]] = study["cells"]
    harnesses = sorted({c["harness_name"] for c in cells.values()})
    for name, cell in cells.items():
        folder = out / cell["folder"]
        if not (folder / "run.db").is_file():
            raise SystemExit(f"{folder} holds no run.db: the cell {name!r} cannot be read")
        write_lines(records / f"eval-{name}.jsonl", eval_rows(folder))
    any_cell = next(iter(cells.values()))
    run = {
        "experiment": "study",
        "command": command,
        "model": cells.get("seed-base", any_cell)["model"],  # the base model; each cell's is in "cells"
        "test": f"{any_cell['n_tasks']} test tasks x {any_cell['attempts']} attempts",
        "attempts": any_cell["attempts"],
        # every cell's harness in one pool: a cell is compared with a cell, whatever its harness
        "harnesses": {"trained": harnesses, "held_out": None},
        "pools": {POOL: harnesses},
        "columns": [["the cell's harness", POOL]],  # the one column of its tables
        "cells": {n: {k: c[k] for k in ("harness", "harness_name", "weights", "model")} for n, c in cells.items()},
        "evaluations": list(cells),
        "comparisons": [[name, d["a"], d["b"]] for name, d in study["paired_differences"].items()],
    }
    (records / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the study's folder (its --out)")
    p.add_argument("--name", default=None, help="the records' RUN name (default: the folder's name)")
    p.add_argument("--records-dir", type=Path, default=RECORDS_DIR, help="default: bench/results/records")
    args = p.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    records = args.records_dir / "study" / (args.name or args.out.resolve().name)
    run = study_records(
        args.out, records, " ".join([".venv/bin/python bench/study_records.py", *map(shlex.quote, given)])
    )
    print(f"wrote {len(run['evaluations'])} cells' records and run.json to {records}")
    return run


if __name__ == "__main__":
    main()
