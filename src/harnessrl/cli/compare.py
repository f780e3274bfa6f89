"""`harnessrl compare A B`: two evaluation runs paired by task (b - a, with a 95% bootstrap
interval), e.g. the same harness before and after training, or a trained adapter against its
control run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from harnessrl.cli.common import fail, out


def _scores(run: Path, harness: str) -> dict[str, float]:
    from harnessrl.metrics import task_scores
    from harnessrl.store import RunStore

    with RunStore(run) as store:
        return task_scores(list(store.trajectories(harness=harness, with_tokens=False)))


def _mean(scores: dict[str, float], tasks: list[str]) -> float | None:
    return sum(scores[t] for t in tasks) / len(tasks) if tasks else None


def _harnesses(run: Path) -> tuple[dict, list[str]]:
    from harnessrl.store import RunStore

    if not RunStore.exists(run):
        fail(f"{run} holds no run (no run.db): give two folders of `harnessrl eval`")
    with RunStore(run) as store:
        config = store.config or {}
        names = sorted(store.harnesses())
    return config, names


def pairs(a_names: list[str], b_names: list[str], harness: str | None, against: str | None) -> list[tuple[str, str]]:
    """Which harness of A is compared with which of B: `harness` (in both, or in A with `against`
    in B); without either, every harness both hold, else the one of each when each holds one."""
    if harness is not None or against is not None:
        left = harness or against
        right = against or harness
        return [(str(left), str(right))]
    shared = sorted(set(a_names) & set(b_names))
    if shared:
        return [(h, h) for h in shared]
    if len(a_names) == 1 and len(b_names) == 1:
        return [(a_names[0], b_names[0])]
    return []


def compare_cmd(
    a: Annotated[Path, typer.Argument(help="the first run folder (the baseline)")],
    b: Annotated[Path, typer.Argument(help="the second run folder (what is compared with it)")],
    harness: Annotated[Optional[str], typer.Option("--harness", help="the harness of A to compare")] = None,
    against: Annotated[
        Optional[str], typer.Option("--against-harness", help="the harness of B (default: the same as --harness)")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the bootstrap interval")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
) -> None:
    """Compare two evaluation runs paired by task: B - A per harness, with a 95% interval.

    Each task's score is the mean of its episodes (infrastructure errors left out); the difference
    is averaged over the tasks both runs scored, and the bootstrap interval is over those
    per-task differences, so that the tasks' difficulty leaves the noise."""
    from harnessrl.metrics import paired_difference

    a_config, a_names = _harnesses(a)
    b_config, b_names = _harnesses(b)
    chosen = pairs(a_names, b_names, harness, against)
    if not chosen:
        fail(
            f"the runs share no harness ({a}: {', '.join(a_names) or 'none'}; {b}: {', '.join(b_names) or 'none'}); "
            "name them with --harness H [--against-harness H2]"
        )
    for left, right in chosen:
        if left not in a_names:
            fail(f"{a} holds no episode of harness {left} (it holds {', '.join(a_names) or 'none'})")
        if right not in b_names:
            fail(f"{b} holds no episode of harness {right} (it holds {', '.join(b_names) or 'none'})")
    rows = []
    for left, right in chosen:
        scores_a, scores_b = _scores(a, left), _scores(b, right)
        diff = paired_difference(scores_a, scores_b, seed=seed)
        shared = sorted(set(scores_a) & set(scores_b))
        means = {"mean_a": _mean(scores_a, shared), "mean_b": _mean(scores_b, shared)}
        rows.append({"harness_a": left, "harness_b": right, **means, **diff.model_dump()})
    if as_json:
        print(json.dumps({"a": str(a), "b": str(b), "comparisons": rows}, indent=1))
        return
    for key in ("suite", "split"):
        if a_config.get(key) != b_config.get(key):
            out.print(f"note: the runs differ in {key} ({a_config.get(key)} / {b_config.get(key)})", highlight=False)
    table = Table(title=f"B - A, paired by task   (A: {a}   B: {b})")
    for col in ("harness", "tasks", "A mean", "B mean", "B - A", "95% CI", "only A / only B"):
        table.add_column(col, justify="left" if col == "harness" else "right", no_wrap=col == "harness")
    for r in rows:
        name = r["harness_a"] if r["harness_a"] == r["harness_b"] else f"{r['harness_a']} -> {r['harness_b']}"
        ci = r["ci95"]
        table.add_row(
            name,
            str(r["n_tasks"]),
            "-" if r["mean_a"] is None else f"{r['mean_a']:.3f}",
            "-" if r["mean_b"] is None else f"{r['mean_b']:.3f}",
            "-" if r["mean_difference"] is None else f"{r['mean_difference']:+.3f}",
            "-" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]",
            f"{r['n_only_a']} / {r['n_only_b']}",
        )
    out.print(table)
