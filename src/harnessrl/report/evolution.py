"""The evolution section of a report: what `harnessrl evolve` tried, what it kept, and what the
held-out tasks said at the end.

Read from an evolve run folder (see docs/evolve.md for the formats): `evolution.jsonl` (one
line per candidate), `noise.json`, `state.json` and, once the run is finished, `final.json`.
A run still searching gets the same page without the held-out part. Lines that do not parse
(a line cut by a kill) are skipped and counted, never fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from harnessrl.report.plots import CLASS_COLORS, PLOT_STYLE, class_kind, save_figure
from harnessrl.triage import CLASSES

LOG = "evolution.jsonl"


@dataclass
class EvolutionHistory:
    """What an evolve run folder records, as read for the report (the search itself is
    evolve/loop.py's `Evolution`)."""

    records: list[dict[str, Any]]
    final: dict[str, Any] | None
    noise: dict[str, Any] | None
    state: dict[str, Any] | None
    skipped_lines: int = 0
    figures: dict[str, str] = field(default_factory=dict)

    @property
    def threshold(self) -> float | None:
        for source in (self.final, self.noise):
            if source and source.get("threshold") is not None:
                return float(source["threshold"])
        known = [r["threshold"] for r in self.records if r.get("threshold") is not None]
        return float(known[-1]) if known else None

    def incumbent_per_iteration(self) -> list[tuple[int, dict]]:
        """(iteration, the re-measured incumbent's dev record), one per iteration, in order."""
        seen: dict[int, dict] = {}
        for r in self.records:
            if r.get("incumbent_dev") and r.get("iteration") is not None:
                seen.setdefault(int(r["iteration"]), r["incumbent_dev"])
        return sorted(seen.items())


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_evolution_folder(folder: Path) -> bool:
    return (Path(folder) / LOG).is_file()


def load_evolution(folder: Path) -> EvolutionHistory:
    folder = Path(folder)
    records, skipped = [], 0
    for line in (folder / LOG).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            skipped += 1
    return EvolutionHistory(
        records=records,
        final=_read_json(folder / "final.json"),
        noise=_read_json(folder / "noise.json"),
        state=_read_json(folder / "state.json"),
        skipped_lines=skipped,
    )


# ---------------------------------------------------------------------------------------- figures


def progress_chart(evo: EvolutionHistory, path: Path) -> Path:
    """Left: dev score per iteration (re-measured incumbent with CI; candidates as dots, accepted
    ones as stars). Right: each candidate's paired delta vs the incumbent, with the threshold."""
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(10.0, 3.6), layout="constrained")
        left, right = fig.subplots(1, 2)
        inc = evo.incumbent_per_iteration()
        if inc:
            it = np.array([i for i, _ in inc], dtype=float)
            mean = np.array([d.get("mean", np.nan) for _, d in inc], dtype=float)
            ci = np.array([d.get("ci95") or [np.nan, np.nan] for _, d in inc], dtype=float).reshape(-1, 2)
            left.fill_between(
                it, ci[:, 0], ci[:, 1], color="#1f77b4", alpha=0.15, linewidth=0, label="incumbent 95% CI"
            )
            left.plot(it, mean, color="#1f77b4", marker="o", markersize=4, label="incumbent (re-measured)")
        measured = [r for r in evo.records if r.get("dev") and r.get("iteration") is not None]
        for accepted, style in (
            (False, {"marker": "o", "s": 18, "color": "#7f7f7f", "label": "candidate"}),
            (True, {"marker": "*", "s": 110, "color": "#2ca02c", "label": "accepted", "edgecolors": "black"}),
        ):
            pts = [
                (r["iteration"], r["dev"].get("mean"))
                for r in measured
                if bool(r.get("accepted")) == accepted and r["dev"].get("mean") is not None
            ]
            if pts:
                left.scatter(*zip(*pts), zorder=3, **style)
        left.set_xlabel("iteration")
        left.set_ylabel("dev mean score")
        left.set_ylim(-0.02, 1.02)
        left.set_title("Dev score per iteration")
        left.legend(fontsize=7, frameon=False, loc="best")

        deltas = [r for r in measured if r.get("delta") is not None]
        for r in deltas:
            color = "#2ca02c" if r.get("accepted") else "#d62728" if r["delta"] < 0 else "#7f7f7f"
            lo, hi = r.get("delta_ci95") or (r["delta"], r["delta"])
            right.plot([r["iteration"], r["iteration"]], [lo, hi], color=color, alpha=0.5, linewidth=1)
            right.scatter(
                [r["iteration"]],
                [r["delta"]],
                color=color,
                s=22 if not r.get("accepted") else 60,
                zorder=3,
                marker="*" if r.get("accepted") else "o",
            )
        if evo.threshold is not None:
            right.axhline(
                evo.threshold, color="#d62728", linestyle="--", linewidth=1, label=f"threshold {evo.threshold:.3f}"
            )
            right.legend(fontsize=7, frameon=False, loc="best")
        right.axhline(0, color="black", linewidth=0.6)
        right.set_xlabel("iteration")
        right.set_ylabel("paired delta vs incumbent")
        right.set_title("Candidate minus re-measured incumbent (95% CI)")
        for ax in (left, right):
            its = sorted({int(r["iteration"]) for r in evo.records if r.get("iteration") is not None})
            if its:
                ax.set_xticks(its if len(its) <= 20 else its[:: max(1, len(its) // 10)])
        return save_figure(fig, path)


def triage_shares_chart(final: dict, path: Path) -> Path:
    """How the failed held-out episodes split by first failure signal, seed vs best (each bar
    sums to 1 over its failed episodes; the number failed is in the label)."""
    sides = [("seed", final.get("seed") or {}), ("best", final.get("best_harness") or {})]
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(7.5, 3.2), layout="constrained")
        ax = fig.add_subplot()
        bottom = np.zeros(len(sides))
        for cls in CLASSES:
            vals = np.array([float(((s.get("triage") or {}).get("rates") or {}).get(cls) or 0.0) for _, s in sides])
            ax.barh(
                range(len(sides)),
                vals,
                left=bottom,
                color=CLASS_COLORS[cls],
                edgecolor="white",
                hatch="//" if class_kind(cls) == "process" else None,
                label=f"{class_kind(cls)}: {cls}",
            )
            bottom += vals
        ax.set_yticks(
            range(len(sides)), [f"{name} ({(s.get('triage') or {}).get('n_failed', '-')} failed)" for name, s in sides]
        )
        ax.invert_yaxis()
        ax.set_xlim(0, max(1.0, float(bottom.max()) if bottom.size else 1.0))
        ax.set_xlabel("share of the failed held-out episodes, by first failure signal")
        ax.set_title("Held-out triage: seed vs best harness")
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return save_figure(fig, path)


def write_figures(evo: EvolutionHistory, plots_dir: Path, root: Path) -> None:
    if evo.records:
        evo.figures["progress"] = progress_chart(evo, plots_dir / "evolution.svg").relative_to(root).as_posix()
    if evo.final:
        evo.figures["triage"] = (
            triage_shares_chart(evo.final, plots_dir / "evolution_triage.svg").relative_to(root).as_posix()
        )


# -------------------------------------------------------------------------------------------- HTML


def _n(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _ci(ci: Any, fmt: str = ".3f") -> str:
    return "-" if not ci or ci[0] is None else f"{format(ci[0], fmt)} to {format(ci[1], fmt)}"


def _img(src: str | None, alt: str) -> str:
    return f'<figure><img src="{escape(src)}" alt="{escape(alt)}" loading="lazy"></figure>' if src else ""


def _diff_text(diff: Any) -> str:
    if not isinstance(diff, list) or not diff:
        return ""
    parts = []
    for d in diff[:6]:
        if isinstance(d, dict):
            to = json.dumps(d.get("to"), ensure_ascii=False)
            parts.append(f"{d.get('path')}: {to if len(to) <= 80 else to[:77] + '...'}")
    more = f" (+{len(diff) - 6} more)" if len(diff) > 6 else ""
    return "; ".join(parts) + more


def _candidate_rows(records: list[dict], only_accepted: bool) -> str:
    rows = []
    for r in records:
        if only_accepted and not r.get("accepted"):
            continue
        status = "accepted" if r.get("accepted") else r.get("status") or "-"
        cls = "good" if r.get("accepted") else "bad" if status in ("invalid", "crashed") else ""
        dev = r.get("dev") or {}
        rows.append(
            f'<tr><td class="num">{escape(str(r.get("iteration", "-")))}</td>'
            f'<th class="harness">{escape(str(r.get("candidate", "-")))}</th>'
            f"<td>{escape(str(r.get('edit', '-')))}</td><td>{escape(str(r.get('target', '-')))}</td>"
            f"<td>{escape(str(r.get('hypothesis') or ''))}"
            f'<div class="note">{escape(_diff_text(r.get("diff")))}</div></td>'
            f'<td class="num">{_n(dev.get("mean"))}</td><td class="num">{_n(r.get("delta"), "+.3f")}</td>'
            f'<td class="num">{_ci(r.get("delta_ci95"), "+.3f")}</td><td class="num">{_n(r.get("threshold"))}</td>'
            f'<td class="{cls}">{escape(status)}</td></tr>'
        )
    if not rows:
        return '<p class="note">None.</p>'
    head = (
        "<tr><th>iter.</th><th>candidate</th><th>edit</th><th>targets</th><th>hypothesis and spec change</th>"
        "<th>dev mean</th><th>delta</th><th>delta 95% CI</th><th>threshold</th><th>verdict</th></tr>"
    )
    return f'<table class="metrics evolution"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _final_table(final: dict) -> str:
    seed, best = final.get("seed") or {}, final.get("best_harness") or {}
    rows = []
    for label, key, fmt in (
        ("mean score", "mean_score", ".3f"),
        ("pass@1", None, ".3f"),
        ("delivery rate", "delivery_rate", ".3f"),
        ("process-failure share", "process", ".0%"),
        ("content-failure share", "content", ".0%"),
        ("tasks / episodes", "n", ""),
    ):
        cells = []
        for side in (seed, best):
            if key == "n":
                cells.append(f"{side.get('n_tasks', '-')} / {side.get('n_episodes', '-')}")
            elif key is None:
                cells.append(_n((side.get("pass_at_k") or {}).get("1")))
            elif key in ("process", "content"):
                cells.append(_n((side.get("triage") or {}).get(f"{key}_share"), fmt))
            elif key == "mean_score":
                cells.append(f'{_n(side.get(key))} <span class="note">({_ci(side.get("mean_score_ci95"))})</span>')
            else:
                cells.append(_n(side.get(key), fmt))
        rows.append(f'<tr><th>{label}</th><td class="num">{cells[0]}</td><td class="num">{cells[1]}</td></tr>')
    return (
        '<table class="metrics"><thead><tr><th></th><th>seed</th><th>best</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def render_section(evo: EvolutionHistory) -> str:
    state, final = evo.state or {}, evo.final
    n_meas = sum(1 for r in evo.records if r.get("status") == "measured")
    n_acc = sum(1 for r in evo.records if r.get("accepted"))
    iterations = max((int(r["iteration"]) for r in evo.records if r.get("iteration") is not None), default=0)
    counts = (
        f"{iterations} iterations, {len(evo.records)} candidates ({n_meas} measured, {n_acc} accepted, "
        f"{sum(1 for r in evo.records if r.get('status') == 'invalid')} invalid, "
        f"{sum(1 for r in evo.records if r.get('status') == 'crashed')} crashed); "
        f"acceptance threshold {_n(evo.threshold)}"
    )
    banners = []
    if final is None:
        banners.append(
            f"Search in progress or interrupted (phase: {state.get('phase', 'unknown')}): the held-out tasks have "
            "not been run yet, so there is no held-out comparison."
        )
    if evo.skipped_lines:
        banners.append(f"{evo.skipped_lines} line(s) of {LOG} could not be read and are left out.")
    parts = [
        '<section id="evolution"><h2>Harness evolution</h2>',
        f'<p class="sub">{escape(counts)}</p>',
        "".join(
            f'<div class="banner {"partial" if i == 0 and final is None else "info"}">{escape(b)}</div>'
            for i, b in enumerate(banners)
        ),
    ]
    if final is not None:
        pd = final.get("paired_difference") or {}
        ci = pd.get("ci95")
        verdict = (
            ""
            if not ci
            else " (better beyond noise)"
            if ci[0] > 0
            else " (worse beyond noise)"
            if ci[1] < 0
            else " (within noise)"
        )
        parts.append(
            f'<p class="sentence">On {escape(str(pd.get("n_tasks", "-")))} held-out tasks, best minus seed = '
            f"{_n(pd.get('mean_difference'), '+.3f')}, 95% CI {_ci(ci, '+.3f')}{escape(verdict)}. "
            f"Best harness: {escape(str(final.get('best', '-')))}; accepted edits: "
            f"{escape(', '.join(final.get('accepted_edits') or []) or 'none')}.</p>"
        )
        parts.append("<h3>Held-out: seed vs best (run once, at the end)</h3>" + _final_table(final))
    parts.append(
        '<div class="figures">'
        + _img(evo.figures.get("progress"), "dev score per iteration and paired deltas")
        + _img(evo.figures.get("triage"), "held-out triage shares, seed vs best")
        + "</div>"
    )
    parts.append("<h3>Accepted edits</h3>" + _candidate_rows(evo.records, only_accepted=True))
    parts.append(
        "<details><summary>Every candidate</summary>" + _candidate_rows(evo.records, only_accepted=False) + "</details>"
    )
    parts.append("</section>")
    return "".join(parts)
