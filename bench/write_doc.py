"""Write docs/BENCHMARKS.md from the benchmarks' records and the page's prose.

    .venv/bin/python bench/write_doc.py            # rewrite docs/BENCHMARKS.md (also `make benchmarks-doc`)
    .venv/bin/python bench/write_doc.py --check    # exit 1 if the page is not what the records give

The prose lives in `bench/doc/*.md` (one file per section, in name order; the first is the page's
head). A line `{{table BENCHMARK}}` or `{{table BENCHMARK/TABLE}}` in it becomes that table,
built from `bench/results/BENCHMARK.jsonl` (bench/results.py says what a record holds): one row
per configuration (its first column), each from the latest run that measured it, followed by
the commands that produced the rows, their dates and machines. A record no section places, or a
placeholder with no record, is an error: nothing measured is dropped silently.

Intervals recomputed from per-task records (`bench/results/records/RUN/`, records/README.md):
`{{interval RUN A B HARNESS [METRIC]}}` anywhere in a line is B - A paired by task with its 95 %
bootstrap interval; a line `{{differences RUN [METRIC]}}` is the table of run.json's comparisons
per harness, `{{levels RUN [METRIC]}}` each evaluation's mean with its interval,
`{{steps RUN ARM}}` a training arm's steps (the scheduler's choice and estimates per harness), and
`{{signal RUN BASE}}` each arm's groups with signal per trained harness beside its adapter's
change from the evaluation BASE (what the steps spent against what they moved).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import (  # noqa: E402
    RESULTS_DIR,
    interval_text,
    read_lines,
    read_records,
    records_difference,
    records_level,
    records_run,
)

BENCH = Path(__file__).resolve().parent
DOC_DIR = BENCH / "doc"
PAGE = BENCH.parent / "docs" / "BENCHMARKS.md"
PLACEHOLDER = re.compile(r"^(?P<indent>\s*)\{\{table (?P<name>[\w.-]+(?:/[\w.-]+)?)\}\}\s*$")
BANNER = (
    "<!-- Written by bench/write_doc.py from bench/results/*.jsonl (the runs) and bench/doc/*.md (the prose):\n"
    "     edit those and run `make benchmarks-doc`; a bench script's --record appends a run. -->"
)
INTERVAL = re.compile(r"\{\{interval (?P<args>[^{}]+)\}\}")
RECORDS_TABLE = re.compile(r"^(?P<indent>\s*)\{\{(?P<kind>differences|levels|steps|signal) (?P<args>[^{}]+)\}\}\s*$")
NUMERIC = re.compile(r"^[-+]?[\d,./]+(e[-+]?\d+)?\s*(x|%|s|ms|us|MB|GB|GiB|MiB|tok/s)?$", re.IGNORECASE)


class DocError(ValueError):
    pass


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return format(value, ".4g")
    return str(value).replace("|", "\\|").replace("\n", " ")


def _numeric(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True
    return isinstance(value, str) and bool(NUMERIC.match(value.strip().replace("**", "")))


def table_rows(records: list[dict[str, Any]]) -> tuple[list[str], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """The columns and (row, its record) of one table: the latest row of each label, in the order
    labels first appeared (a record with replace_table starts the table over). Records are taken
    in date order, file order breaking ties."""
    ordered = sorted(enumerate(records), key=lambda ir: (ir[1]["date"], ir[0]))
    columns: list[str] = []
    rows: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for _, rec in ordered:
        if rec.get("replace_table"):
            rows, columns = {}, []
        for row in rec["rows"]:
            if not isinstance(row, dict) or not row:
                raise DocError(f"{rec['benchmark']}: a row must be a non-empty object, not {row!r}")
            for col in row:
                if col not in columns:
                    columns.append(col)
            label = _cell(next(iter(row.values())))
            rows.pop(label, None)  # a re-measured row moves to where the newest run puts it
            rows[label] = (row, rec)
    # labels keep their first position unless re-measured; order: by first appearance of the record
    return columns, list(rows.values())


def render_table(name: str, records: list[dict[str, Any]], indent: str = "") -> str:
    columns, rows = table_rows(records)
    used = []
    for _, rec in rows:
        if not any(rec is u for u in used):
            used.append(rec)
    right = [all(_numeric(r.get(c)) for r, _ in rows if c in r and r.get(c) not in (None, "")) for c in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    for row, _ in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) if c in row else "" for c in columns) + " |")
    lines.append("")
    dates = sorted({rec["date"] for rec in used})
    machines = list(dict.fromkeys(rec.get("machine") for rec in used if rec.get("machine")))
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    about = f"Run{'s' if len(used) > 1 else ''}: {when}."
    if len(machines) == 1:
        about += f" Machine: {machines[0]}."
    if any(rec.get("entered") for rec in used):
        about += " Figures entered from the runs' printed output."
    lines.append(about)
    lines.append("")
    lines.append("```bash")
    groups: dict[str, list[dict[str, Any]]] = {}  # one entry per distinct command, in the rows' order
    for rec in used:
        groups.setdefault(rec["command"], []).append(rec)
    for command, recs in groups.items():
        if len(groups) > 1:
            labels = [_cell(next(iter(r.values()))) for r, rr in rows if any(rr is g for g in recs)]
            head = f"# {', '.join(sorted({g['date'] for g in recs}))}: {'; '.join(labels)}"
            if len(machines) > 1 and recs[-1].get("machine"):
                head += f" ({recs[-1]['machine']})"
            lines.append(head)
        for note in dict.fromkeys(g["note"] for g in recs if g.get("note")):
            lines.append(f"# {note}")
        lines.append(command)
    lines.append("```")
    return "\n".join(indent + line if line else line for line in lines)


def _records_dir(results_dir: Path, run: str) -> Path:
    folder = results_dir / "records" / run
    if not (folder / "run.json").is_file():
        raise DocError(f"no per-task records {run!r} in {results_dir / 'records'} (run.json is missing)")
    return folder


def render_interval(args: str, results_dir: Path) -> str:
    """`RUN A B HARNESS [METRIC]` -> "+0.012 [-0.050, +0.070]" (B - A, paired by task)."""
    parts = args.split()
    if len(parts) not in (4, 5):
        raise DocError(f"{{{{interval {args}}}}}: give RUN A B HARNESS [METRIC]")
    run, a, b, harness = parts[:4]
    try:
        return interval_text(records_difference(_records_dir(results_dir, run), a, b, harness, *parts[4:]))
    except (ValueError, KeyError) as e:
        raise DocError(f"{{{{interval {args}}}}}: {e}") from None


def _columns(run: dict[str, Any]) -> list[tuple[str, str]]:
    """(header, harness or pool) of a records table: each trained harness, the trained ones
    pooled (when more than one), the held-out one; or run.json's "columns" ([header, harness or
    pool], ...)."""
    if run.get("columns"):
        return [(header, pool) for header, pool in run["columns"]]
    trained = run["harnesses"]["trained"]
    columns = [(h, h) for h in trained]
    if len(trained) > 1:
        columns.append(("trained, pooled", "trained"))
    if run["harnesses"].get("held_out"):
        columns.append((f"held out: {run['harnesses']['held_out']}", "held-out"))
    return columns


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render_records_table(kind: str, args: str, results_dir: Path, indent: str = "") -> str:
    parts = args.split()
    try:
        folder = _records_dir(results_dir, parts[0])
        run = records_run(folder)
        where = f"bench/results/records/{parts[0]}/"
        if kind == "steps":
            if len(parts) != 2:
                raise DocError(f"{{{{steps {args}}}}}: give RUN ARM")
            lines = _steps_table(folder, run, parts[1])
            about = (
                f"Per step of `{parts[1]}`, from {where}train-{parts[1]}.jsonl: p the scheduler's probability at "
                "selection; signal the harness's groups with signal / its groups; L its learnability (mean "
                "|advantage|); T the step's transferability (mean cosine of its gradient sketch with the other "
                "harnesses' average sketches); s HarnessBandit's score after the step."
            )
        elif kind == "signal":
            if len(parts) != 2:
                raise DocError(f"{{{{signal {args}}}}}: give RUN BASE")
            lines = _signal_table(folder, run, parts[1])
            about = (
                f"Per arm, from {where}: each trained harness's groups with signal / its groups over the arm's "
                f"steps (from train-ARM.jsonl), then the arm's adapter - {parts[1]} in mean score on that "
                "harness, paired by task with its 95 % bootstrap interval (from eval-ARM.jsonl)."
            )
        else:
            metric = parts[1] if len(parts) > 1 else "mean"
            columns = _columns(run)
            first = "evaluation" if kind == "levels" else "B - A"
            lines = ["| " + " | ".join([first, *(c for c, _ in columns)]) + " |"]
            lines.append("|---|" + "---:|" * len(columns))
            if kind == "differences":
                for label, a, b in run["comparisons"]:
                    cells = [interval_text(records_difference(folder, a, b, h, metric)) for _, h in columns]
                    lines.append(f"| {label} | " + " | ".join(cells) + " |")
            else:
                for name in run["evaluations"]:
                    cells = [records_level(folder, name, h, metric) for _, h in columns]
                    lines.append(f"| {name} | " + " | ".join(cells) + " |")
            test = f" ({run['test']})" if run.get("test") else ""
            paired = ", paired by task" if kind == "differences" else ""
            about = f"{metric} per task, recomputed from {where}{test}; 95 % bootstrap intervals over tasks{paired}."
    except (ValueError, KeyError) as e:
        raise DocError(f"{{{{{kind} {args}}}}}: {e}") from None
    return "\n".join(indent + line if line else line for line in [*lines, "", about])


def _steps_table(folder: Path, run: dict[str, Any], arm: str) -> list[str]:
    rows = read_lines(folder / f"train-{arm}.jsonl")
    if not rows:
        raise DocError(f"no per-step records of {arm!r} in {folder}")
    names = list(rows[0]["harnesses"])
    lines = ["| step | harness | groups with signal | reward | " + " | ".join(names) + " |"]
    lines.append("|---:|---|---:|---:|" + "---|" * len(names))
    for r in rows:
        cells = []
        for h in names:
            c = r["harnesses"][h]
            parts = [f"p {_fmt(c.get('p'))}"]
            if c.get("groups"):
                parts.append(f"signal {c['signal_groups']}/{c['groups']}, L {_fmt(c.get('learnability'))}")
            if "transfer" in c:
                parts.append(f"T {_fmt(c['transfer'])}")
            if "score" in c:
                parts.append(f"s {_fmt(c['score'])}")
            cells.append(", ".join(parts))
        signal = f"{r['signal_groups']}/{r['groups']}"
        lines.append(f"| {r['step']} | {r['harness']} | {signal} | {_fmt(r['reward'])} | " + " | ".join(cells) + " |")
    return lines


def _signal_table(folder: Path, run: dict[str, Any], base: str) -> list[str]:
    trained = run["harnesses"]["trained"]
    lines = ["| arm | " + " | ".join(trained) + " | trained, pooled |", "|---|" + "---:|" * (len(trained) + 1)]
    for arm in run.get("arms", []):
        steps = read_lines(folder / f"train-{arm}.jsonl")
        if not steps:
            raise DocError(f"no per-step records of {arm!r} in {folder}")
        totals = {h: [0, 0] for h in trained}
        for step in steps:
            for h in trained:
                cell = step["harnesses"].get(h, {})
                totals[h][0] += cell.get("signal_groups", 0)
                totals[h][1] += cell.get("groups", 0)
        totals["trained"] = [sum(t[0] for t in totals.values()), sum(t[1] for t in totals.values())]
        cells = []
        for h, (signal, groups) in totals.items():
            cells.append(f"{signal}/{groups}: {interval_text(records_difference(folder, base, arm, h))}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def _anchor(title: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
    return slug


def build(doc_dir: Path = DOC_DIR, results_dir: Path = RESULTS_DIR) -> str:
    fragments = sorted(doc_dir.glob("*.md"))
    if not fragments:
        raise DocError(f"no prose fragments in {doc_dir}")
    records = read_records(results_dir)
    by_table: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_table.setdefault(f"{rec['benchmark']}/{rec['table']}", []).append(rec)
    placed: set[str] = set()
    parts: list[str] = []
    headings: list[tuple[int, str]] = []
    for i, path in enumerate(fragments):
        out = []
        in_code = False
        for line in path.read_text(encoding="utf-8").rstrip("\n").split("\n"):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            if not in_code:
                line = INTERVAL.sub(lambda i: render_interval(i.group("args"), results_dir), line)
                r = RECORDS_TABLE.match(line)
                if r:
                    out.append(render_records_table(r.group("kind"), r.group("args"), results_dir, r.group("indent")))
                    continue
            m = PLACEHOLDER.match(line)
            if m and not in_code:
                name = m.group("name") if "/" in m.group("name") else f"{m.group('name')}/main"
                if name not in by_table:
                    raise DocError(f"{path.name}: {{{{table {m.group('name')}}}}} has no record in {results_dir}")
                placed.add(name)
                out.append(render_table(name, by_table[name], m.group("indent")))
                continue
            h = re.match(r"^(##+) (.+)$", line)
            if h and not in_code and i > 0 and len(h.group(1)) <= 3:
                headings.append((len(h.group(1)), h.group(2)))
            out.append(line)
        parts.append("\n".join(out))
    unplaced = sorted(set(by_table) - placed)
    if unplaced:
        raise DocError("records that no section of bench/doc places: " + ", ".join(unplaced))
    contents = ["## Contents", ""]
    for level, title in headings:
        contents.append(f"{'  ' * (level - 2)}- [{title}](#{_anchor(title)})")
    head, rest = parts[0], parts[1:]
    return "\n\n".join([head, BANNER, "\n".join(contents), *rest]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare: exit 1 if docs/BENCHMARKS.md is stale")
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args()
    try:
        text = build()
    except (DocError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(
                f"{args.out} is not what bench/results and bench/doc give: run `make benchmarks-doc`", file=sys.stderr
            )
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
