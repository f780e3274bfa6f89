"""The final comparison: the held-out test tasks, once, in four cells (the baseline and each
phase's result), their paired differences, improve.json and report.md; the folder is then locked."""

from __future__ import annotations

import json
from typing import Any

from harnessrl.improve.config import REPORT, RESULT
from harnessrl.improve.record import JobBase
from harnessrl.results import ImproveResult
from harnessrl.rundir import as_json, write_json


class FinalPhase(JobBase):
    """The final phase of the job (Improve)."""

    def _final(self, evolved, weights: dict[str, Any], content: dict[str, Any]) -> ImproveResult:
        from harnessrl.jobs.study_analysis import verdict
        from harnessrl.metrics import paired_difference

        c = self.config
        cells_spec = {
            "seed-base": (self.seed_spec, c.model, "seed harness + base weights"),
            "harness": (evolved, c.model, "evolved harness + base weights"),
            "weights": (self.seed_spec, weights["model"], f"seed harness + {weights['variant']} weights"),
            "content": (
                self.seed_spec,
                content["model"],
                "seed harness + GRPO weights" if content.get("grpo") else "seed harness + the weights phase's weights",
            ),
        }
        cells: dict[str, dict[str, Any]] = {}
        same_as: dict[str, str] = {}
        for name, (spec, model, what) in cells_spec.items():
            twin = next((n for n, (s, m, _) in cells_spec.items() if n in cells and s is spec and m == model), None)
            if twin is not None:  # the phase changed nothing: the same cell, measured once
                same_as[name] = twin
                cells[name] = {**cells[twin], "same_as": twin, "what": what}
                continue
            cells[name] = {**self._cell(f"final/{name}", "test", self.test_tasks, spec, model), "what": what}
        base = cells["seed-base"]["scores"]
        differences = {}
        for name in ("harness", "weights", "content"):
            diff = paired_difference(base, cells[name]["scores"], seed=c.seed)
            differences[f"{name}_vs_seed_base"] = {**diff.model_dump(), "verdict": verdict(diff)}
        runtime = paired_difference(cells["weights"]["scores"], cells["harness"]["scores"], seed=c.seed)
        differences["harness_vs_weights"] = {**runtime.model_dump(), "verdict": verdict(runtime)}
        result = {
            "suite": c.suite,
            "model": c.model,
            "seed_harness": self.seed_spec.name,
            "evolved_harness": evolved.name,
            "evolved_is_seed": self.evolved_is_seed,
            "weights": {k: v for k, v in weights.items()},
            "content": {k: v for k, v in content.items()},
            "cells": {
                n: {
                    "what": cell["what"],
                    "folder": cell["folder"],
                    "harness": cell["harness_name"],
                    "model": cell["model"],
                    **({"same_as": cell["same_as"]} if "same_as" in cell else {}),
                    **cell["record"],
                }
                for n, cell in cells.items()
            },
            "paired_differences": differences,
            "runtime_only": _runtime_only(differences),
            "decisions": [d.model_dump() for d in self.decisions],
            "config": c.model_dump(),
        }
        record = as_json(result)
        write_json(self.out / RESULT, record)
        (self.out / REPORT).write_text(report_markdown(record), encoding="utf-8")
        self.folder.lock(f"{RESULT} is written: the held-out comparison is final")
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
