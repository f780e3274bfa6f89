"""The final comparison: the held-out test tasks, once, in four cells (the baseline and each
phase's result), their paired differences, improve.json and report.md; the folder is then locked."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from harnessrl.improve.config import REPORT, RESULT
from harnessrl.improve.record import Cell, ImproveState, cell
from harnessrl.results import ImproveResult
from harnessrl.rundir import as_json, write_json

if TYPE_CHECKING:
    from harnessrl.improve.content import ContentWeights
    from harnessrl.improve.harness import EvolvedHarness
    from harnessrl.improve.weights import KeptWeights


def final_phase(
    state: ImproveState, evolved: EvolvedHarness, weights: KeptWeights, content: ContentWeights
) -> ImproveResult:
    """The held-out test tasks in four cells (the baseline and each phase's result, a cell that a
    phase left unchanged measured once), their paired differences, improve.json and report.md;
    then the folder is locked."""
    from harnessrl.jobs.study_analysis import verdict
    from harnessrl.metrics import paired_difference

    c = state.config
    seed = state.seed_spec
    cells_spec = {
        "seed-base": (seed, c.model, "seed harness + base weights"),
        "harness": (evolved.spec, c.model, "evolved harness + base weights"),
        "weights": (seed, weights["model"], f"seed harness + {weights['variant']} weights"),
        "content": (
            seed,
            content["model"],
            "seed harness + GRPO weights" if content["grpo"] else "seed harness + the weights phase's weights",
        ),
    }
    measured: dict[str, Cell] = {}
    cells: dict[str, dict[str, Any]] = {}
    for name, (spec, model, what) in cells_spec.items():
        twin = next((n for n, (s, m, _) in cells_spec.items() if n in measured and s is spec and m == model), None)
        if twin is not None:  # the phase changed nothing: the same cell, measured once
            measured[name] = measured[twin]
        else:
            measured[name] = cell(state, f"final/{name}", "test", state.test_tasks, spec, model)
        one = measured[name]
        cells[name] = {
            "what": what,
            "folder": one.folder,
            "harness": one.harness_name,
            "model": one.model,
            **({"same_as": twin} if twin is not None else {}),
            **one.record,
        }
    base = measured["seed-base"].scores
    differences = {}
    for name in ("harness", "weights", "content"):
        diff = paired_difference(base, measured[name].scores, seed=c.seed)
        differences[f"{name}_vs_seed_base"] = {**diff.model_dump(), "verdict": verdict(diff)}
    runtime = paired_difference(measured["weights"].scores, measured["harness"].scores, seed=c.seed)
    differences["harness_vs_weights"] = {**runtime.model_dump(), "verdict": verdict(runtime)}
    result = {
        "suite": c.suite,
        "model": c.model,
        "seed_harness": seed.name,
        "evolved_harness": evolved.spec.name,
        "evolved_is_seed": evolved.is_seed,
        "weights": {k: v for k, v in weights.items()},
        "content": {k: v for k, v in content.items()},
        "cells": cells,
        "paired_differences": differences,
        "runtime_only": _runtime_only(differences),
        "decisions": [d.model_dump() for d in state.decisions],
        "config": c.model_dump(),
    }
    record = as_json(result)
    write_json(state.out / RESULT, record)
    (state.out / REPORT).write_text(report_markdown(record), encoding="utf-8")
    state.folder.lock(f"{RESULT} is written: the held-out comparison is final")
    return ImproveResult.model_validate(record)


def _runtime_only(differences: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Which of the harness's gains the weights did not take along: the paired difference of the
    evolved harness (base weights) minus the seed harness with the kept weights, read as a claim."""
    d = differences["harness_vs_weights"]
    harness = differences["harness_vs_seed_base"]["verdict"]
    if d["verdict"] == "higher":
        text = (
            "some of the evolved harness's gain stayed runtime-only: with the base weights it beats the seed "
            "harness with the distilled weights"
        )
    elif harness == "higher" and d["verdict"] == "no claim":
        text = (
            "the evolved harness's gain is not shown to exceed what the distilled weights carry under the seed harness"
        )
    elif d["verdict"] == "lower":
        text = (
            "the distilled weights under the seed harness beat the evolved harness with the base weights: "
            "nothing stayed runtime-only"
        )
    else:
        text = "no claim: the held-out intervals cannot tell the evolved harness from the distilled weights"
    return {"difference": d, "text": text}


def report_markdown(result: dict[str, Any]) -> str:
    """report.md: the held-out cells, the paired differences and every decision with its evidence."""

    def num(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    def pct(x: Any) -> str:
        return "-" if x is None else f"{x:.0%}"

    cells = result["cells"]
    k = str(next(iter(cells.values()))["attempts"])
    ks = ["pass@1", f"pass@{k}", f"pass^{k}"] if k != "1" else ["pass@1"]  # with 1 attempt they are one number
    out = [
        f"# harnessrl improve: {result['suite']}, {result['model']}",
        "",
        f"Seed harness `{result['seed_harness']}`, evolved harness `{result['evolved_harness']}`"
        + (" (the seed: no edit kept)" if result["evolved_is_seed"] else "")
        + f"; weights kept: {result['weights']['variant']}.",
        "",
        "## Held-out test tasks",
        "",
        f"| cell | what | mean | 95% CI | {' | '.join(ks)} | process fail | content fail |",
        "|---|---|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    for name, c in cells.items():
        ci = c["mean_score_ci95"]
        out.append(
            f"| {name} | {c['what']}{' (= ' + c['same_as'] + ')' if 'same_as' in c else ''} | {num(c['mean_score'])} | "
            + ("-" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]")
            + f" | {num(c['pass_at_k'].get('1'))} | "
            + (f"{num(c['pass_at_k'].get(k))} | {num(c['pass_hat_k'].get(k))} | " if k != "1" else "")
            + f"{pct(c['triage']['process_rate'])} | {pct(c['triage']['content_rate'])} |"
        )
    out += [
        "",
        "## Paired differences by task (b - a)",
        "",
        "| comparison | difference | 95% CI | claim |",
        "|---|---|---|---|",
    ]
    for name, d in result["paired_differences"].items():
        ci = d["ci95"]
        diff = "-" if d["mean_difference"] is None else f"{d['mean_difference']:+.3f}"
        out.append(
            f"| {name} | {diff} | " + ("-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]") + f" | {d['verdict']} |"
        )
    out += ["", f"Runtime-only: {result['runtime_only']['text']}.", "", "## Decisions", ""]
    for d in result["decisions"]:
        out.append(f"- **{d['key']}** ({d['phase']}): `{json.dumps(d['choice'])}`")
        shown = {k: v for k, v in d["evidence"].items() if not isinstance(v, (dict, list))}
        if shown:
            out.append("  " + ", ".join(f"{k}: {v}" for k, v in shown.items()))
    out.append("")
    out.append("Every decision's full evidence is in decisions.jsonl; every stage is a run folder under this one.")
    return "\n".join(out) + "\n"
