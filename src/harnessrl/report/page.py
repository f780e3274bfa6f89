"""index.html: the static part of the report (tables, figures, comparison) and the viewer's shell.

Everything here is rendered once, in Python, with every value escaped. The viewer (viewer.js)
only receives the small summary embedded as JSON at the bottom; its episode data stays in the
paged files under episodes/ (see episodes.py).
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any

from harnessrl import __version__
from harnessrl.report.plots import CLASS_COLORS, class_kind
from harnessrl.report.rundata import RunData
from harnessrl.triage import CLASSES, CONTENT, PROCESS


def _num(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x:.0%}"


def _metrics_table(run: RunData) -> str:
    k = run.attempts
    head = (
        "<tr><th>harness</th><th>tasks</th><th>episodes</th><th>mean score</th><th>95% CI</th><th>pass@1</th>"
        + (f"<th>pass@{k}</th><th>pass^{k}</th>" if k > 1 else "")
        + "<th>delivery</th><th>infra errors</th><th>failed</th><th>process share</th></tr>"
    )
    rows = []
    for h in run.harnesses:
        m, t = run.summaries[h], run.triage[h]
        ci = m.mean_score_ci95
        notes = m.k_notes

        def k_cell(rates: dict[str, float | None], kk: int) -> str:
            v = rates.get(str(kk))
            note = notes.get(str(kk))
            return (
                f'<td class="num" title="{escape(note)}">-*</td>'
                if v is None and note
                else f'<td class="num">{_num(v)}</td>'
            )

        rows.append(
            "<tr>"
            f'<th class="harness"><a href="#episodes" data-harness="{escape(h)}" '
            f'data-run="{escape(run.label)}">{escape(h)}</a></th>'
            f'<td class="num">{m.n_tasks}</td><td class="num">{m.n_episodes}</td>'
            f'<td class="num strong">{_num(m.mean_score)}</td>'
            f'<td class="num">{"-" if not ci else f"{ci[0]:.3f} to {ci[1]:.3f}"}</td>'
            + k_cell(m.pass_at_k, 1)
            + (k_cell(m.pass_at_k, k) + k_cell(m.pass_hat_k, k) if k > 1 else "")
            + f'<td class="num">{_num(m.delivery_rate)}</td><td class="num">{m.n_infra_errors}</td>'
            f'<td class="num">{t.n_failed}</td><td class="num">{_pct(t.process_share)}</td>'
            "</tr>"
        )
    foot = ""
    if any(run.summaries[h].k_notes for h in run.harnesses):
        foot = (
            '<p class="note">-* : not estimated (hover for the reason): some task has fewer valid attempts than k.</p>'
        )
    return f'<table class="metrics"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>{foot}'


def _class_head(cls: str) -> str:
    return (
        f'<th class="cls {class_kind(cls)}"><span class="swatch" style="background:{CLASS_COLORS[cls]}"></span>'
        f"{escape(cls)}</th>"
    )


def _triage_table(run: RunData) -> str:
    groups = (
        f'<tr><th></th><th colspan="2"></th>'
        f'<th colspan="{len(PROCESS)}" class="group process">process: fix the harness</th>'
        f'<th colspan="{len(CONTENT)}" class="group content">content: fix the weights</th>'
        '<th class="group infra"></th><th></th></tr>'
    )
    head = (
        "<tr><th>harness</th><th>passed</th><th>failed</th>"
        + "".join(_class_head(c) for c in CLASSES)
        + "<th>process share</th></tr>"
    )
    rows = []
    for h in run.harnesses:
        t = run.triage[h]
        cells = []
        for c in CLASSES:
            n = t.counts[c]
            link = (
                f'<a href="#episodes" data-harness="{escape(h)}" data-run="{escape(run.label)}" '
                f'data-class="{c}">{n}</a>'
                if n
                else "0"
            )
            cells.append(f'<td class="num {class_kind(c)}">{link}</td>')
        rows.append(
            f'<tr><th class="harness">{escape(h)}</th><td class="num">{t.n_passed}</td>'
            f'<td class="num">{t.n_failed}</td>' + "".join(cells) + f'<td class="num">{_pct(t.process_share)}</td></tr>'
        )
    return f'<table class="triage"><thead>{groups}{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _figure(src: str | None, alt: str) -> str:
    if not src:
        return ""
    return f'<figure><img src="{escape(src)}" alt="{escape(alt)}" loading="lazy"></figure>'


def _config_block(run: RunData) -> str:
    c = dict(run.config)
    if not c:
        return ""
    shown = {k: v for k, v in c.items() if k not in ("task_ids", "harnesses")}
    shown["harnesses"] = list(c.get("harnesses") or {})
    if "task_ids" in c:
        ids = c["task_ids"]
        shown["task_ids"] = ids if len(ids) <= 12 else ids[:12] + [f"... {len(ids) - 12} more"]
    return (
        '<details class="config"><summary>Run configuration</summary>'
        f"<pre>{escape(json.dumps(shown, indent=2))}</pre></details>"
    )


def _run_section(run: RunData, figs: dict[str, str], several: bool) -> str:
    name = f"Run {run.label}: " if several else ""
    anchor = f"run-{run.label}" if run.label else "overview"
    found = f"{run.n_found} episodes" + (f" of {run.n_planned} planned" if run.n_planned is not None else "")
    notes = "".join(
        f'<div class="banner {"partial" if i == 0 and run.partial else "info"}">{escape(n)}</div>'
        for i, n in enumerate(run.notes)
    )
    if not run.harnesses:
        body = "<p>No episodes yet.</p>"
    else:
        body = (
            "<h3>Metrics per harness</h3>"
            + _metrics_table(run)
            + '<div class="figures">'
            + _figure(figs.get("mean_score"), "mean score per harness with 95% CI")
            + _figure(figs.get("pass_k"), "pass@k and pass^k over k")
            + "</div><h3>Triage: first failure signal of failed episodes</h3>"
            + _triage_table(run)
            + '<div class="figures">'
            + _figure(figs.get("triage"), "triage classes per harness")
            + "</div>"
        )
    return (
        f'<section class="run" id="{anchor}"><h2>{escape(name + run.title)}</h2>'
        f'<p class="sub">{escape(str(run.folder))} &middot; {found} &middot; attempts per task: {run.attempts}</p>'
        f"{notes}{body}{_config_block(run)}</section>"
    )


def _comparison_section(cmp: dict, runs: list[RunData]) -> str:
    rows = []
    for r in cmp["rows"]:
        ci = r["ci95"]
        verdict = "-" if ci is None else "better" if ci[0] > 0 else "worse" if ci[1] < 0 else "within noise"
        cls = {"better": "good", "worse": "bad"}.get(verdict, "")
        rows.append(
            f'<tr><th class="harness">{escape(r["label"])}</th><td class="num">{r["n_tasks"]}</td>'
            f'<td class="num">{_num(r["score_a"])}</td><td class="num">{_num(r["score_b"])}</td>'
            f'<td class="num strong">{_num(r["mean_difference"], "+.3f")}</td>'
            f'<td class="num">{"-" if ci is None else f"{ci[0]:+.3f} to {ci[1]:+.3f}"}</td>'
            f'<td class="{cls}">{verdict}</td></tr>'
        )
    notes = "".join(f'<div class="banner info">{escape(n)}</div>' for n in cmp["notes"])
    return (
        '<section id="comparison"><h2>Comparison: B against A</h2>'
        f'<p class="sub">A = {escape(str(runs[0].folder))} ({escape(runs[0].title)}) &middot; '
        f"B = {escape(str(runs[1].folder))} ({escape(runs[1].title)})</p>"
        f'<p class="sentence">{escape(cmp["sentence"])}</p>{notes}'
        '<table class="metrics"><thead><tr><th>harness</th><th>shared tasks</th><th>mean A</th><th>mean B</th>'
        "<th>B minus A</th><th>95% CI (paired bootstrap)</th><th>verdict</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        '<p class="note">Per task: d = score_B(task) - score_A(task) over the tasks both runs scored; '
        "the CI is a bootstrap over the d values, so task difficulty cancels out of the noise.</p>"
        f'<div class="figures">{_figure(cmp.get("figure"), "paired per-task differences")}</div></section>'
    )


_VIEWER = """
<section id="episodes">
  <h2>Episodes</h2>
  <form id="filters" class="filters" autocomplete="off">
    <label class="run-filter">run <select name="run"><option value="">all</option></select></label>
    <label>harness <select name="harness"><option value="">all</option></select></label>
    <label>outcome <select name="outcome"><option value="">all</option><option value="failed">failed</option>\
<option value="passed">passed</option></select></label>
    <label>triage class <select name="cls"><option value="">all</option></select></label>
    <label>family <select name="family"><option value="">all</option></select></label>
    <label>task <input name="task" type="search" placeholder="task id contains"></label>
  </form>
  <div class="viewer">
    <div class="list-pane">
      <p id="list-status" class="status">loading episodes...</p>
      <table id="episode-list" class="episodes"><thead><tr><th></th><th>harness</th><th>task</th><th>try</th>\
<th>score</th><th>triage</th><th>steps</th><th>end</th></tr></thead><tbody></tbody></table>
      <button id="more" type="button" hidden>show more</button>
    </div>
    <div id="detail" class="detail-pane"><p class="hint">Pick an episode on the left to see every step: \
the prompt, the completion, the parsed action, the tool results, guard interventions and the grade.</p></div>
  </div>
</section>
"""


def render_index(
    runs: list[RunData], figures: dict, comparison: dict | None, viewer: dict, built_s: float, evolution: str = ""
) -> str:
    several = len(runs) > 1
    title = "harnessrl comparison" if several else f"harnessrl report: {runs[0].title}"
    nav = ['<a href="#comparison">comparison</a>'] if comparison else []
    nav += ['<a href="#evolution">evolution</a>'] if evolution else []
    nav += (
        [f'<a href="#run-{r.label}">run {r.label}</a>' for r in runs]
        if several
        else ['<a href="#overview">overview</a>']
    )
    nav.append('<a href="#episodes">episodes</a>')
    sections = (
        (_comparison_section(comparison, runs) if comparison else "")
        + evolution
        + "".join(_run_section(r, figures.get(r.label, {}), several) for r in runs)
    )
    summary_json = json.dumps(viewer, separators=(",", ":")).replace("</", "<\\/")
    footer = (
        f"built {time.strftime('%Y-%m-%d %H:%M:%S')} in {built_s:.1f} s &middot; {viewer['n_episodes']} episodes "
        f"in {len(viewer['pages'])} index pages of {viewer['page_size']}"
    )
    scripts = (
        f'<script type="application/json" id="hr-summary">{summary_json}</script>\n<script src="viewer.js"></script>\n'
    )
    return page_shell(title, " &middot; ".join(nav), sections + "\n" + _VIEWER, footer, scripts)


def page_shell(title: str, nav: str, main: str, footer: str, scripts: str = "") -> str:
    """A whole report page around its parts (`nav`, `main`, `footer` and `scripts` are HTML;
    `title` is text)."""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="harnessrl {escape(__version__)}">
<title>{escape(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="report.css">
</head>
<body>
<header><h1>{escape(title)}</h1><nav>{nav}</nav></header>
<main>
{main}
</main>
<footer>harnessrl {escape(__version__)} &middot; {footer}</footer>
{scripts}</body>
</html>
"""
