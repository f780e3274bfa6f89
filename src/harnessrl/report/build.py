"""Build the HTML report of one run folder, or the comparison report of two.

    build_report([run])          -> run/report/index.html
    build_report([run_a, run_b]) -> run_a/report/index.html, with paired per-task differences
    build_report([evolve_run])   -> also the evolution section (report/evolution.py)
    build_report([study_folder]) -> the study's page over its study.json (report/study.py)

One pass over each run, one harness at a time (memory stays flat): metrics per harness
(`harness_summary`, attempts from the run config), triage (`triage`, also written to the run
folder as triage.json), per-task scores for the paired comparison, and the viewer's episode files.
"""

from __future__ import annotations

import json
import shutil
import time
from importlib import resources
from pathlib import Path

from harnessrl.metrics import harness_summary, paired_difference, task_scores
from harnessrl.report import evolution, plots, study
from harnessrl.report.episodes import PAGE_SIZE, EpisodeWriter
from harnessrl.report.page import render_index
from harnessrl.report.rundata import RunData
from harnessrl.store import DB_NAME, RunStore, StoreError
from harnessrl.triage import CLASSES, HarnessTriage, triage_by_harness, write_triage

MARKER = ".harnessrl-report"  # a folder with this file is a report we may overwrite
STATIC_FILES = ("report.css", "viewer.js")


class ReportError(Exception):
    """Bad input for a report: not a run folder, no episodes to compare, ..."""


def _open_run(folder: Path) -> RunStore:
    if not folder.is_dir():
        raise ReportError(f"{folder} is not a run folder (no such directory)")
    if not RunStore.exists(folder):
        if (folder / "stages.json").is_file():  # a study's folder: its stages are the run folders
            raise ReportError(
                f"{folder} is a study folder (harnessrl study): report it alone (harnessrl report {folder}), "
                f"or compare two of its cells, e.g. harnessrl report {folder / 'cells' / 'seed-base'} "
                f"{folder / 'cells' / 'seed-distilled'}"
            )
        raise ReportError(f"{folder} is not a run folder (no {DB_NAME})")
    try:
        return RunStore(folder)
    except StoreError as e:
        raise ReportError(str(e)) from None


def _load_run(folder: Path, label: str, writer: EpisodeWriter) -> RunData:
    store = _open_run(folder)
    try:
        config = store.config or {}
        found_harnesses = store.harnesses()
        notes = []
        if config.get("attempts"):
            attempts = int(config["attempts"])
        else:
            last = store.max_attempt()
            attempts = last + 1 if last is not None else 1
            notes.append(f"The run database holds no config: attempts ({attempts}) inferred from the episodes.")
        planned_harnesses = list(config.get("harnesses") or {})
        harnesses = planned_harnesses + [h for h in found_harnesses if h not in planned_harnesses]
        data = RunData(folder=folder, label=label, config=config, attempts=attempts, harnesses=harnesses, notes=notes)
        data.n_found = store.count()
        if config.get("task_ids") is not None and planned_harnesses:
            data.n_planned = len(config["task_ids"]) * attempts * len(planned_harnesses)
        data.has_summary = (folder / "summary.json").is_file()
        if data.partial:
            data.notes.insert(
                0,
                f"Partial run: {data.n_found} of {data.n_planned} planned episodes found "
                f"({len(config['task_ids'])} tasks x {attempts} attempts x {len(planned_harnesses)} harnesses)"
                + ("" if data.has_summary else "; no summary.json, so the run was interrupted or is still going")
                + ". Every number below covers only the episodes found.",
            )
        for h in harnesses:
            trajs = list(store.trajectories(harness=h, with_tokens=False))
            data.summaries[h] = harness_summary(trajs, attempts)
            tri = data.triage[h] = triage_by_harness(trajs).get(h) or HarnessTriage.empty()
            data.task_scores[h] = task_scores(trajs)
            verdicts = {v.episode_id: v for v in tri.episodes}
            lengths = store.completion_lengths(h)
            for t in trajs:
                data.families.add(t.family)
                v = verdicts.get(t.episode_id)
                shown = None if v is None else {"class": v.cls, "kind": v.kind, "step": v.step, "evidence": v.evidence}
                writer.add(t, shown, run=label, subdir=label, completion_tokens=lengths.get(t.episode_id))
            del trajs
    finally:
        store.close()
    try:
        write_triage({h: tri.to_json() for h, tri in data.triage.items()}, folder)
    except OSError as e:
        raise ReportError(f"cannot write triage.json into {folder}: {e.strerror or e}") from None
    return data


def _comparison(a: RunData, b: RunData) -> dict:
    """Paired per-task differences (B minus A) for every harness present in both runs."""
    pairs = [(h, h) for h in a.harnesses if h in b.harnesses and a.task_scores.get(h) and b.task_scores.get(h)]
    notes = []
    if not pairs:
        scored_a = [h for h in a.harnesses if a.task_scores.get(h)]
        scored_b = [h for h in b.harnesses if b.task_scores.get(h)]
        if len(scored_a) == 1 and len(scored_b) == 1:
            pairs = [(scored_a[0], scored_b[0])]  # one harness each under different names: compare them
            notes.append(f"No harness name is in both runs; comparing {scored_a[0]} (A) with {scored_b[0]} (B).")
        else:
            raise ReportError(
                f"cannot compare {a.folder} and {b.folder}: no harness with scored episodes is in both runs "
                f"(A: {', '.join(scored_a) or 'none'}; B: {', '.join(scored_b) or 'none'})"
            )
    rows = []
    for ha, hb in pairs:
        sa, sb = a.task_scores[ha], b.task_scores[hb]
        pd = paired_difference(sa, sb)
        shared = sorted(set(sa) & set(sb))
        rows.append(
            {
                "label": ha if ha == hb else f"{ha} \u2192 {hb}",
                "harness_a": ha,
                "harness_b": hb,
                "score_a": sum(sa[t] for t in shared) / len(shared) if shared else None,
                "score_b": sum(sb[t] for t in shared) / len(shared) if shared else None,
                "differences": [sb[t] - sa[t] for t in shared],
                **pd.model_dump(),
            }
        )
    if all(r["n_tasks"] == 0 for r in rows):
        raise ReportError(
            f"cannot compare {a.folder} and {b.folder}: the runs share no task (a comparison pairs scores task by task)"
        )
    for r in rows:
        if r["n_only_a"] or r["n_only_b"]:
            notes.append(
                f"{r['label']}: {r['n_only_a']} tasks only in A and {r['n_only_b']} only in B "
                "are left out of the pairing."
            )
    return {"rows": rows, "sentence": change_sentence(rows), "notes": notes}


def change_sentence(rows: list[dict]) -> str:
    """'On 48 shared tasks, json-tools improved by +0.12 (95% CI +0.05 to +0.19); ...'"""
    counts = {r["n_tasks"] for r in rows}
    clauses = []
    for r in rows:
        name = r["label"]
        where = "" if len(counts) == 1 else f" on {r['n_tasks']} shared tasks"
        if r["mean_difference"] is None:
            clauses.append(f"{name} has no task in both runs")
            continue
        d, (lo, hi) = r["mean_difference"], r["ci95"]
        ci = f"95% CI {lo:+.2f} to {hi:+.2f}"
        if lo > 0:
            clauses.append(f"{name} improved by {d:+.2f}{where} ({ci})")
        elif hi < 0:
            clauses.append(f"{name} got worse by {d:+.2f}{where} ({ci})")
        elif lo == hi == 0:
            clauses.append(f"{name} did not change on any task{where}")
        else:
            clauses.append(f"{name} changed by {d:+.2f}{where} ({ci}; within noise)")
    head = f"On {counts.pop()} shared tasks, " if len(counts) == 1 else ""
    text = head + "; ".join(clauses) + "."
    return text[0].upper() + text[1:]


def _prepare_out_dir(out_dir: Path) -> None:
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ReportError(f"{out_dir} exists and is not a folder")
        if any(out_dir.iterdir()) and not (out_dir / MARKER).is_file():
            raise ReportError(f"{out_dir} is not empty and is not a harnessrl report; refusing to overwrite it")
        for name in ("episodes", "plots"):
            if (out_dir / name).is_dir():
                shutil.rmtree(out_dir / name)  # stale episode files of an earlier build
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text("written by harnessrl.report; rebuilding replaces this folder's content\n")
    static = resources.files("harnessrl.report") / "static"
    for name in STATIC_FILES:
        src = static / name
        if not src.is_file():
            raise ReportError(f"harnessrl is installed without its report assets ({name}); reinstall the package")
        (out_dir / name).write_bytes(src.read_bytes())


def build_report(run_folders: list[Path], out_dir: Path | None = None) -> Path:
    """Write the report folder and return its index.html.

    One folder: the run's report. Two: a comparison report (B = second folder, differences are
    B minus A, per task, per harness present in both). Default out_dir: first folder / "report".
    """
    run_folders = [Path(f) for f in run_folders]
    if not 1 <= len(run_folders) <= 2:
        raise ReportError(f"give one run folder, or two to compare (got {len(run_folders)})")
    if len(run_folders) == 1 and not RunStore.exists(run_folders[0]) and study.is_study_folder(run_folders[0]):
        return _build_study_report(run_folders[0], out_dir)
    for f in run_folders:
        _open_run(f).close()  # every input error before any writing
    if len(run_folders) == 2 and run_folders[0].resolve() == run_folders[1].resolve():
        raise ReportError(f"cannot compare {run_folders[0]} with itself")
    out_dir = Path(out_dir) if out_dir is not None else run_folders[0] / "report"
    t0 = time.monotonic()
    _prepare_out_dir(out_dir)
    (out_dir / "plots").mkdir()

    writer = EpisodeWriter(out_dir, PAGE_SIZE)
    labels = [""] if len(run_folders) == 1 else ["A", "B"]
    runs = [_load_run(f, label, writer) for f, label in zip(run_folders, labels)]
    writer.flush()

    figures: dict[str, dict[str, str]] = {}
    colors = plots.harness_colors(sorted({h for r in runs for h in r.harnesses}))
    for r in runs:
        sfx = f"-{r.label}" if r.label else ""
        figs = {}
        scored = {h: m for h, m in r.summaries.items() if m.n_episodes}
        if scored:
            figs["mean_score"] = _rel(
                plots.mean_score_chart(scored, out_dir / "plots" / f"mean_score{sfx}.svg", colors), out_dir
            )
            figs["pass_k"] = _rel(
                plots.pass_k_chart(scored, r.attempts, out_dir / "plots" / f"pass_k{sfx}.svg", colors), out_dir
            )
            figs["triage"] = _rel(
                plots.triage_chart(r.triage, list(scored), out_dir / "plots" / f"triage{sfx}.svg"), out_dir
            )
        figures[r.label] = figs
    evolution_html = ""
    if len(runs) == 1 and evolution.is_evolution_folder(runs[0].folder):
        evo = evolution.load_evolution(runs[0].folder)
        evolution.write_figures(evo, out_dir / "plots", out_dir)
        evolution_html = evolution.render_section(evo)
    comparison = None
    if len(runs) == 2:
        comparison = _comparison(*runs)
        comparison["figure"] = _rel(plots.paired_chart(comparison["rows"], out_dir / "plots" / "paired.svg"), out_dir)

    viewer = {
        "runs": [{"label": r.label, "folder": str(r.folder), "title": r.title} for r in runs],
        "harnesses": sorted({h for r in runs for h in r.harnesses}),
        "families": sorted({f for r in runs for f in r.families}),
        "classes": [{"name": c, "kind": plots.class_kind(c), "color": plots.CLASS_COLORS[c]} for c in CLASSES],
        "n_episodes": writer.n,
        "page_size": writer.page_size,
        "pages": writer.pages,
    }
    index = out_dir / "index.html"
    index.write_text(
        render_index(
            runs=runs,
            figures=figures,
            comparison=comparison,
            viewer=viewer,
            built_s=time.monotonic() - t0,
            evolution=evolution_html,
        ),
        encoding="utf-8",
    )
    return index


def _build_study_report(folder: Path, out_dir: Path | None) -> Path:
    """A study folder's page (default FOLDER/report/index.html) and each finished evaluation
    stage's own report (FOLDER/<stage>/report, linked from the page)."""
    t0 = time.monotonic()
    try:
        data = study.load_study(folder)
    except study.StudyReportError as e:
        raise ReportError(str(e)) from None
    out_dir = Path(out_dir) if out_dir is not None else folder / "report"
    _prepare_out_dir(out_dir)
    links: dict[str, str] = {}
    notes: list[str] = []
    stages = {name: folder / "cells" / name for name in data["cells"]}
    stages.update({name: folder / name for name in study.EVAL_STAGES})
    for name, stage in stages.items():
        if not RunStore.exists(stage):
            if name in data["cells"]:
                notes.append(f"The run folder of cell {name} ({stage}) is missing: its episodes cannot be shown.")
            continue
        try:
            links[name] = study.relative(build_report([stage]), out_dir)
        except ReportError as e:
            notes.append(f"The report of {name} could not be built: {e}")
    page = out_dir / "index.html"
    page.write_text(study.render_study_page(data, links, notes, time.monotonic() - t0), encoding="utf-8")
    return page


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def report_json(index: Path) -> dict:
    """The viewer summary embedded in a built index.html (for tests and tools)."""
    html = Path(index).read_text(encoding="utf-8")
    start = html.index('<script type="application/json" id="hr-summary">') + len(
        '<script type="application/json" id="hr-summary">'
    )
    return json.loads(html[start : html.index("</script>", start)])
