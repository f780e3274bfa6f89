"""Per-task records of a finished `harnessrl study` folder, for bench/results/records/.

A study's five cells are ordinary evaluation folders (OUT/cells/CELL); this writes each cell's
per-task scores (`eval-CELL.jsonl`, the format of bench/results/records/README.md) and a run.json
whose comparisons are the study's own paired differences (study.json's `paired_differences`), so
that `bench/write_doc.py` recomputes the self-distillation study's intervals from committed files:

    .venv/bin/python bench/study_records.py runs/self-distill --name self-distill
    .venv/bin/python bench/study_records.py runs/self-distill --name self-distill --record \
        --command "harnessrl study ... --out runs/self-distill"   # also the cells' table, study.jsonl
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
from results import RECORDS_DIR, eval_rows, record_run, this_machine, write_lines  # noqa: E402

POOL = "cells"  # the pool name of every cell's harness, in run.json's "pools"


def _in_order(differences: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    from harnessrl.jobs.study_analysis import COMPARISONS

    names = [n for n in COMPARISONS if n in differences] + [n for n in differences if n not in COMPARISONS]
    return [differences[n] for n in names]


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
        # "B - A", in the study's own order (harnessrl.jobs.study_analysis.COMPARISONS)
        "comparisons": [[f"{d['b']} - {d['a']}", d["a"], d["b"]] for d in _in_order(study["paired_differences"])],
    }
    (records / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    return run


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}".replace("%", " %")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def cell_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per cell of study.json, for the `study` benchmark's table (docs/BENCHMARKS.md)."""
    from harnessrl.jobs.study_analysis import CELLS

    rows = []
    order = [c for c in CELLS if c in study["cells"]] + [c for c in study["cells"] if c not in CELLS]
    for name in order:
        cell = study["cells"][name]
        k = str(cell["attempts"])
        lo, hi = cell["mean_score_ci95"] or (None, None)
        mean = "-" if cell["mean_score"] is None else f"{cell['mean_score']:.3f} [{_number(lo)}, {_number(hi)}]"
        triage = cell["triage"]
        rows.append(
            {
                "cell": name,
                "harness": cell["harness_name"],
                "weights": cell["weights"],
                f"mean [95% CI] ({cell['n_tasks']} test tasks x {k})": mean,
                f"pass@{k}": _number(cell["pass_at_k"].get(k)),
                f"pass^{k}": _number(cell["pass_hat_k"].get(k)),
                "delivery": _number(cell["delivery_rate"]),
                "process-failure rate": _share(triage["process_rate"]),
                "content-failure rate": _share(triage["content_rate"]),
                "malformed calls": triage["counts"].get("malformed_call", 0),
            }
        )
    return rows


def record_study(
    out: Path, name: str, command: str, machine: str | None = None, results_dir: Path | None = None
) -> Path:
    """Append the study in `out` to bench/results/study.jsonl (table `name`): its cells' rows,
    and as results its paired differences, the content-failure rate difference and the collection."""
    study = json.loads((out / "study.json").read_text(encoding="utf-8"))
    results = {
        "paired_differences": study["paired_differences"],
        "content_failures_rate_difference": study["content_failures"]["rate_difference"],
        "collect": study.get("collect"),
    }
    note = f"{this_machine()}; {machine}" if machine else None
    return record_run(
        "study", cell_rows(study), table=name, results=results, command=command, machine=note, results_dir=results_dir
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the study's folder (its --out)")
    p.add_argument("--name", default=None, help="the records' RUN name (default: the folder's name)")
    p.add_argument("--records-dir", type=Path, default=RECORDS_DIR, help="default: bench/results/records")
    p.add_argument(
        "--record",
        action="store_true",
        help="also append the cells' table to bench/results/study.jsonl (table: the RUN name)",
    )
    p.add_argument("--command", default=None, help="with --record: the `harnessrl study` command that ran it")
    p.add_argument("--machine", default=None, help="with --record: how the machine was (e.g. 'nothing else running')")
    args = p.parse_args(argv)
    if args.record and not args.command:
        p.error("--record needs --command: the `harnessrl study` command line whose run this is")
    given = list(sys.argv[1:] if argv is None else argv)
    records = args.records_dir / "study" / (args.name or args.out.resolve().name)
    # run.json's command: the study's, where --command names it; else this one
    this = " ".join([".venv/bin/python bench/study_records.py", *map(shlex.quote, given)])
    run = study_records(args.out, records, args.command or this)
    print(f"wrote {len(run['evaluations'])} cells' records and run.json to {records}")
    if args.record:
        record_study(args.out, records.name, args.command, args.machine)
    return run


if __name__ == "__main__":
    main()
