"""The report's figures: matplotlib, saved as SVG files next to index.html.

Why SVG from matplotlib: no JavaScript chart library to ship or fetch, works offline and from
file://, stays sharp at any zoom, and a chart is a few tens of KB. Figures are built with
`matplotlib.figure.Figure` directly (no pyplot, no GUI backend, nothing global touched), text
is kept as SVG text (`svg.fonttype: none`, smaller than glyph paths) and the output is
deterministic for the same data (fixed hash salt, no date).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

from harnessrl.metrics import HarnessSummary
from harnessrl.triage import CLASSES, CONTENT, PROCESS, HarnessTriage

# Process classes in warm colours (fix the harness), content in blue (fix the weights), infra grey.
CLASS_COLORS = {
    "malformed_call": "#a63603",
    "blocked_call": "#d94801",
    "loop": "#f16913",
    "budget_exhausted": "#fd8d3c",
    "no_delivery": "#fdae6b",
    "insufficient_evidence": "#fdd0a2",
    "content": "#2171b5",
    "infra": "#9e9e9e",
}
assert set(CLASS_COLORS) == set(CLASSES)
HARNESS_COLORS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]

PLOT_STYLE: dict[RcKeyType, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "harnessrl-report",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def class_kind(cls: str) -> str:
    return "process" if cls in PROCESS else "content" if cls in CONTENT else "infra"


def save_figure(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="svg", metadata={"Date": None})
    # Drop the DOCTYPE and the RDF metadata block: they only name external URLs (never fetched,
    # but a self-contained report should not even mention them). xmlns attributes stay.
    svg = path.read_text(encoding="utf-8")
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    path.write_text(svg, encoding="utf-8")
    return path


def _width(n: int) -> float:
    return min(12.0, max(5.0, 1.1 * n + 2.5))


def _label_rotation(names: list[str]) -> int:
    return 20 if len(names) > 3 or max((len(n) for n in names), default=0) > 14 else 0


def harness_colors(names: list[str]) -> dict[str, str]:
    """One fixed colour per harness name, shared by every figure of a report."""
    return {h: HARNESS_COLORS[i % len(HARNESS_COLORS)] for i, h in enumerate(names)}


def mean_score_chart(
    summaries: dict[str, HarnessSummary],
    path: Path,
    colors: dict[str, str] | None = None,
    title: str = "Mean score per harness (95% CI)",
) -> Path:
    """Bars of mean task score with bootstrap CI whiskers; harnesses with no episode are skipped."""
    names = [h for h, m in summaries.items() if m.mean_score is not None]
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(_width(len(names)), 3.4), layout="constrained")
        ax = fig.add_subplot()
        means = np.array([summaries[h].mean_score for h in names], dtype=float)
        ci = np.array([summaries[h].mean_score_ci95 for h in names], dtype=float).reshape(-1, 2)
        err = np.vstack([means - ci[:, 0], ci[:, 1] - means]).clip(min=0) if names else None
        x = np.arange(len(names))
        colors = colors or harness_colors(names)
        ax.bar(
            x,
            means,
            yerr=err,
            color=[colors[h] for h in names],
            alpha=0.85,
            capsize=5,
            error_kw={"elinewidth": 1.2},
            zorder=2,
        )
        for xi, m, hi in zip(x, means, ci[:, 1] if names else []):
            ax.text(float(xi), min(hi, 1.0) + 0.02, f"{m:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, names, rotation=_label_rotation(names), ha="right" if _label_rotation(names) else "center")
        ax.set_ylim(0, 1.12)
        ax.set_ylabel("mean score")
        ax.set_title(title)
        ax.grid(axis="x", visible=False)
        return save_figure(fig, path)


def triage_chart(triage: dict[str, HarnessTriage], harnesses: list[str], path: Path) -> Path:
    """Stacked bars: failed episodes per harness split by first failure signal (CLASSES order)."""
    tri = {h: triage.get(h) or HarnessTriage.empty() for h in harnesses}
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(_width(len(harnesses)) + 2.2, 3.6), layout="constrained")
        ax = fig.add_subplot()
        x = np.arange(len(harnesses))
        bottom = np.zeros(len(harnesses))
        for cls in CLASSES:
            counts = np.array([tri[h].counts[cls] for h in harnesses], dtype=float)
            kind = class_kind(cls)
            ax.bar(
                x,
                counts,
                bottom=bottom,
                color=CLASS_COLORS[cls],
                edgecolor="white",
                linewidth=0.6,
                hatch="//" if kind == "process" else None,
                label=f"{kind}: {cls}",
                zorder=2,
            )
            bottom += counts
        for xi, h, total in zip(x, harnesses, bottom):
            share = tri[h].process_share
            if total:
                note = f"{int(total)}" + ("" if share is None else f"\n{share:.0%} process")
                ax.text(float(xi), total, note, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(
            x, harnesses, rotation=_label_rotation(harnesses), ha="right" if _label_rotation(harnesses) else "center"
        )
        ax.set_ylabel("failed episodes")
        ax.set_ylim(0, max(1.0, float(bottom.max(initial=0))) * 1.25)
        ax.set_title("First failure signal of failed episodes (hatched: process, blue: content)")
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        return save_figure(fig, path)


def pass_k_chart(
    summaries: dict[str, HarnessSummary], attempts: int, path: Path, colors: dict[str, str] | None = None
) -> Path:
    """pass@k (at least one of k passes) and pass^k (all k pass) over k = 1..attempts."""
    ks = list(range(1, attempts + 1))
    colors = colors or harness_colors(list(summaries))
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(9.0, 3.4), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, key, title in (
            (axes[0], "pass_at_k", "pass@k: at least one of k attempts passes"),
            (axes[1], "pass_hat_k", "pass^k: all k attempts pass"),
        ):
            for h, m in summaries.items():
                pts = [(k, getattr(m, key).get(str(k))) for k in ks]
                pts = [(k, v) for k, v in pts if v is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", markersize=4, color=colors[h], label=h)
            ax.set_xticks(ks)
            ax.set_xlim(0.7, attempts + 0.3)
            ax.set_ylim(-0.02, 1.05)
            ax.set_xlabel("k (attempts)")
            ax.set_title(title)
        axes[0].set_ylabel("rate over tasks")
        axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        return save_figure(fig, path)


def paired_chart(rows: list[dict], path: Path) -> Path:
    """Per-task differences (run B minus run A) per harness: dots for tasks, diamond for the mean,
    thick bar for its 95% CI, a line at zero."""
    rows = [r for r in rows if r["mean_difference"] is not None]
    rng = np.random.default_rng(0)
    with matplotlib.rc_context(PLOT_STYLE):
        fig = Figure(figsize=(8.0, 1.0 + 0.7 * max(1, len(rows))), layout="constrained")
        ax = fig.add_subplot()
        for i, r in enumerate(rows):
            y = len(rows) - 1 - i
            d = np.asarray(r["differences"], dtype=float)
            ax.scatter(
                d, y + rng.uniform(-0.18, 0.18, size=d.size), s=9, color="#7f7f7f", alpha=0.5, zorder=2, linewidths=0
            )
            lo, hi = r["ci95"]
            color = "#2ca02c" if lo > 0 else "#d62728" if hi < 0 else "#555555"
            ax.plot([lo, hi], [y, y], color=color, linewidth=4, solid_capstyle="butt", zorder=3)
            ax.scatter([r["mean_difference"]], [y], marker="D", s=40, color=color, edgecolors="black", zorder=4)
            ax.text(
                1.04,
                y,
                f"{r['mean_difference']:+.2f} [{lo:+.2f}, {hi:+.2f}]",
                va="center",
                fontsize=8,
                transform=ax.get_yaxis_transform(),
            )
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(rows)), [r["label"] for r in reversed(rows)])
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_xlim(-1.05, 1.05)
        ax.set_xlabel("score difference per task (B minus A); mean and 95% CI")
        ax.set_title("Paired per-task differences")
        ax.grid(axis="y", visible=False)
        return save_figure(fig, path)
