"""The report of a study folder (`harnessrl study`): one page over its study.json, linking to
the ordinary report of every evaluation stage.

    build_report([study])  -> study/report/index.html (`render_study_page`), and
                              study/<stage>/report/index.html for every evaluation stage that
                              finished (the cells, seed-eval, collect)

The page shows what study.json holds, nothing recomputed: the cells ({seed, evolved} harness x
{base, distilled} weights, and the placebo under the seed harness) with mean, CI, pass@k, pass^k,
delivery and triage shares; the paired differences with their intervals; the content-failure
rate before and after; the failure-class effects; and the recommendation.
"""

from __future__ import annotations

import json
import os
import time
from html import escape
from pathlib import Path
from typing import Any

from harnessrl.report.page import page_shell
from harnessrl.rundir import STAGES_JSON, STUDY_JSON

# the evaluation stages whose folders get a report of their own (relative to the study folder)
EVAL_STAGES = ("seed-eval", "collect")
CELL_ORDER = ("seed-base", "evolved-base", "seed-distilled", "evolved-distilled", "seed-placebo")
VERDICT_CLASS = {"higher": "good", "lower": "bad"}


class StudyReportError(Exception):
    """A study folder that cannot be reported (no study.json yet, unreadable)."""


def is_study_folder(folder: Path) -> bool:
    return (Path(folder) / STAGES_JSON).is_file()


def load_study(folder: Path) -> dict[str, Any]:
    path = Path(folder) / STUDY_JSON
    if not path.is_file():
        stages = _stages(folder)
        done = ", ".join(stages) or "none"
        raise StudyReportError(
            f"{folder} is a study folder without {STUDY_JSON} yet (finished stages: {done}); the study writes it "
            f"after its last cell: resume it with harnessrl study ... --out {folder} --resume, or report a finished "
            f"stage on its own, e.g. harnessrl report {Path(folder) / 'seed-eval'}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise StudyReportError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), dict):
        raise StudyReportError(f"{path} is not a study result (no cells)")
    return data


def _stages(folder: Path) -> list[str]:
    try:
        stages = json.loads((Path(folder) / STAGES_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return list(stages) if isinstance(stages, dict) else []


def _n(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _ci(ci: Any, fmt: str = ".3f") -> str:
    return "-" if not ci or ci[0] is None else f"{format(ci[0], fmt)} to {format(ci[1], fmt)}"


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:.0%}"


def _link(href: str | None, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>' if href else escape(text)


def _cells_table(study: dict[str, Any], links: dict[str, str]) -> str:
    cells = study["cells"]
    names = [c for c in CELL_ORDER if c in cells] + [c for c in cells if c not in CELL_ORDER]
    ks = sorted({int(k) for c in cells.values() for k in (c.get("pass_at_k") or {})})
    head = (
        "<tr><th>cell</th><th>harness</th><th>weights</th><th>tasks</th><th>episodes</th><th>mean score</th>"
        "<th>95% CI</th>"
        + "".join(f"<th>pass@{k}</th>" for k in ks)
        + "".join(f"<th>pass^{k}</th>" for k in ks if k > 1)
        + "<th>delivery</th><th>process share</th><th>content share</th><th>content rate</th></tr>"
    )
    rows = []
    for name in names:
        c = cells[name]
        t = c.get("triage") or {}
        harness = f"{c.get('harness', '-')} ({c.get('harness_name', '-')})"
        rows.append(
            f'<tr><th class="harness">{_link(links.get(name), name)}</th><td>{escape(harness)}</td>'
            f"<td>{escape(str(c.get('weights', '-')))}</td>"
            f'<td class="num">{_n(c.get("n_tasks"), "")}</td><td class="num">{_n(c.get("n_episodes"), "")}</td>'
            f'<td class="num">{_n(c.get("mean_score"))}</td><td class="num">{_ci(c.get("mean_score_ci95"))}</td>'
            + "".join(f'<td class="num">{_n((c.get("pass_at_k") or {}).get(str(k)))}</td>' for k in ks)
            + "".join(f'<td class="num">{_n((c.get("pass_hat_k") or {}).get(str(k)))}</td>' for k in ks if k > 1)
            + f'<td class="num">{_pct(c.get("delivery_rate"))}</td><td class="num">{_pct(t.get("process_share"))}</td>'
            f'<td class="num">{_pct(t.get("content_share"))}</td><td class="num">{_pct(t.get("content_rate"))}</td>'
            "</tr>"
        )
    return f'<table class="metrics"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _verdict_cell(diff: dict[str, Any]) -> str:
    v = str(diff.get("verdict", "-"))
    return f'<td class="{VERDICT_CLASS.get(v, "")}">{escape(v)}</td>'


def _differences_table(study: dict[str, Any]) -> str:
    from harnessrl.jobs.study_analysis import LABELS

    rows = []
    for name, d in (study.get("paired_differences") or {}).items():
        rows.append(
            f"<tr><th>{escape(LABELS.get(name, name))}</th><td>{escape(str(d.get('b')))} &minus; "
            f'{escape(str(d.get("a")))}</td><td class="num">{_n(d.get("n_tasks"), "")}</td>'
            f'<td class="num">{_n(d.get("mean_difference"), "+.3f")}</td>'
            f'<td class="num">{_ci(d.get("ci95"), "+.3f")}</td>{_verdict_cell(d)}</tr>'
        )
    head = "<tr><th>comparison</th><th>cells</th><th>tasks</th><th>mean difference</th><th>95% CI</th><th>verdict</th>"
    return f'<table class="metrics"><thead>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _effects_table(study: dict[str, Any]) -> str:
    effects = study.get("class_effects") or {}
    if not effects:
        return '<p class="note">None.</p>'
    rows = []
    for cls, e in effects.items():
        cells = []
        for key in ("harness", "weights", "placebo"):
            d = e.get(key) or {}
            cells.append(
                f'<td class="num">{_n(d.get("mean_difference"), "+.3f")} '
                f'<span class="note">({_ci(d.get("ci95"), "+.3f")})</span></td>{_verdict_cell(d)}'
            )
        rows.append(
            f"<tr><th>{escape(cls.replace('_', ' '))}</th><td>{escape(str(e.get('kind')))}</td>{''.join(cells)}"
        )
    head = (
        "<tr><th>failure class</th><th>kind</th><th>evolved vs seed (base)</th><th></th>"
        "<th>distilled vs base (seed)</th><th></th><th>placebo vs base (seed)</th><th></th></tr>"
    )
    return (
        '<p class="note">Change in the rate of episodes whose first failure is of each class, paired by task '
        "(negative: rarer).</p>"
        f'<table class="metrics"><thead>{head}</thead><tbody>{"</tr>".join(rows)}</tr></tbody></table>'
    )


def _content_block(study: dict[str, Any]) -> str:
    c = study.get("content_failures")
    if not c:
        return ""
    before, after, d = c.get("before") or {}, c.get("after") or {}, c.get("rate_difference") or {}
    return (
        '<table class="metrics"><thead><tr><th></th><th>cell</th><th>content rate (of episodes)</th>'
        "<th>content share (of failures)</th></tr></thead><tbody>"
        f"<tr><th>before</th><td>{escape(str(before.get('cell')))}</td>"
        f'<td class="num">{_pct(before.get("content_rate"))}</td>'
        f'<td class="num">{_pct(before.get("content_share"))}</td></tr>'
        f"<tr><th>after</th><td>{escape(str(after.get('cell')))}</td>"
        f'<td class="num">{_pct(after.get("content_rate"))}</td><td class="num">{_pct(after.get("content_share"))}</td>'
        "</tr></tbody></table>"
        f'<p class="sub">Paired by task, after minus before: {_n(d.get("mean_difference"), "+.3f")}, 95% CI '
        f"{_ci(d.get('ci95'), '+.3f')} ({escape(str(d.get('verdict', '-')))}).</p>"
    )


def _recommendation(study: dict[str, Any]) -> str:
    rec = study.get("recommendation") or {}
    text = rec.get("text") or []
    parts = ["<ul>" + "".join(f"<li>{escape(str(t))}</li>" for t in text) + "</ul>" if text else ""]
    no_claim = rec.get("no_claim") or []
    if no_claim:
        rows = "".join(
            f'<tr><td>{escape(str(x.get("what")))}</td><td class="num">{_ci(x.get("ci95"), "+.3f")}</td>'
            f"<td>{escape(str(x.get('why')))}</td></tr>"
            for x in no_claim
        )
        parts.append(
            f"<details><summary>No claim ({len(no_claim)})</summary>"
            '<table class="metrics"><thead><tr><th>effect</th><th>95% CI</th><th>why</th></tr></thead>'
            f"<tbody>{rows}</tbody></table></details>"
        )
    return "".join(parts)


def _context(study: dict[str, Any], links: dict[str, str]) -> str:
    cfg = study.get("config") or {}
    evo = study.get("evolution") or {}
    training = study.get("training") or {}
    collect = study.get("collect") or {}
    seed_eval = study.get("seed_eval") or {}
    items = [
        f"Suite {escape(str(study.get('suite')))}, model {escape(str(study.get('model')))}, seed harness "
        f"{escape(str(study.get('seed_harness')))}, evolved harness {escape(str(study.get('evolved_harness')))}"
        + (" (the seed harness itself)" if study.get("evolved_is_seed") else "")
        + f"; {escape(str(cfg.get('test_tasks', '-')))} test tasks x {escape(str(cfg.get('attempts', '-')))} attempts "
        "per cell.",
    ]
    if seed_eval:
        items.append(
            f"{_link(links.get('seed-eval'), 'Seed harness on dev tasks')}: mean "
            f"{_n(seed_eval.get('mean_score'))} ({_ci(seed_eval.get('mean_score_ci95'))}) on "
            f"{_n(seed_eval.get('n_tasks'), '')} tasks."
        )
    if evo:
        accepted = ", ".join(str(x) for x in evo.get("accepted_edits") or []) or "none"
        items.append(
            f"Evolution: {escape(str(evo.get('iterations_run', '-')))} iterations, acceptance threshold "
            f"{_n(evo.get('threshold'))}, accepted edits: {escape(accepted)}; best: {escape(str(evo.get('best')))}."
        )
    if collect:
        items.append(
            f"{_link(links.get('collect'), 'Collection')} (evolved harness, base weights, train tasks): "
            f"{_n(collect.get('passed'), '')} passing of {_n(collect.get('episodes'), '')} episodes "
            f"({_n(collect.get('passed_tasks'), '')} of {_n(collect.get('tasks'), '')} tasks)."
        )
    for name in ("sft", "placebo"):
        t = training.get(name)
        if t:
            items.append(
                f"{'Distilled' if name == 'sft' else 'Placebo'} adapter: {_n(t.get('examples'), '')} examples from "
                f"{_n(t.get('episodes_replayed'), '')} episodes, {_n(t.get('steps'), '')} steps, final loss "
                f"{_n(t.get('final_loss'))} ({escape(str(t.get('adapter')))})."
            )
    return "<ul>" + "".join(f"<li>{x}</li>" for x in items) + "</ul>"


def render_study_page(study: dict[str, Any], links: dict[str, str], notes: list[str], built_s: float) -> str:
    title = f"harnessrl study: {study.get('suite', '?')} from {study.get('seed_harness', '?')}"
    banners = "".join(f'<div class="banner info">{escape(n)}</div>' for n in notes)
    sections = (
        f'<section id="study"><h2>Setup</h2>{banners}{_context(study, links)}</section>'
        '<section id="recommendation"><h2>Recommendation</h2>'
        '<p class="note">Computed from the paired differences and failure-class effects below: an effect is '
        "claimed only when its 95% interval excludes 0.</p>"
        f"{_recommendation(study)}</section>"
        '<section id="cells"><h2>Cells (held-out test tasks)</h2>'
        '<p class="note">Each cell name links to the full report of its episodes.</p>'
        f"{_cells_table(study, links)}</section>"
        f'<section id="differences"><h2>Paired differences</h2>{_differences_table(study)}</section>'
        f'<section id="content"><h2>Content failures before and after</h2>{_content_block(study)}</section>'
        f'<section id="effects"><h2>Failure-class effects</h2>{_effects_table(study)}</section>'
    )
    nav = " &middot; ".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (
            ("study", "setup"),
            ("recommendation", "recommendation"),
            ("cells", "cells"),
            ("differences", "differences"),
            ("content", "content failures"),
            ("effects", "failure classes"),
        )
    )
    return page_shell(title, nav, sections, f"built {time.strftime('%Y-%m-%d %H:%M:%S')} in {built_s:.1f} s")


def relative(target: Path, start: Path) -> str:
    """`target` as a link from a page in `start`."""
    return Path(os.path.relpath(Path(target).resolve(), Path(start).resolve())).as_posix()
