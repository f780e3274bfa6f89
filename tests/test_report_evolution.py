"""The report's evolution section, built from an evolve run folder's files (formats: docs/evolve.md)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from helpers import oracle_policy

from harnessrl.harness.registry import load_harness
from harnessrl.models.base import SamplingParams
from harnessrl.report import build_report
from harnessrl.report.evolution import load_evolution
from harnessrl.rollout import Job, Runner
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite


def _episodes(folder: Path, tokenizer, labels: list[str]) -> None:
    tasks = get_suite("toolcalc").tasks("dev", 2)
    with RunStore(folder) as store:
        store.set_meta("config", {"suite": "toolcalc", "model": "scripted", "attempts": 1, "seed": 0})
        for label in labels:
            spec = load_harness("json-tools").model_copy(update={"name": label})
            Runner(oracle_policy(tasks, spec, tokenizer), SamplingParams(), progress=False, on_episode=store.add).run(
                [Job(t, spec, 0) for t in tasks]
            )


def _dev(label: str, mean: float) -> dict:
    return {
        "label": label,
        "mean": mean,
        "ci95": [mean - 0.1, mean + 0.1],
        "n_episodes": 8,
        "delivery_rate": 0.9,
        "n_infra_errors": 0,
    }


def _record(iteration: int, k: int, parent: str, mean: float, incumbent: float, accepted: bool, **extra) -> dict:
    label = f"i{iteration:02d}.c{k}"
    return {
        "iteration": iteration,
        "candidate": label,
        "parent": parent,
        "proposer": "rules",
        "edit": extra.pop("edit", "loop-guard"),
        "hypothesis": extra.pop("hypothesis", "a guard stops repeated calls"),
        "target": "loop",
        "diff": [{"path": "rules.loop_guard.enabled", "from": False, "to": True}],
        "spec_fingerprint": "abc",
        "status": "measured",
        "error": None,
        "dev": _dev(label, mean),
        "incumbent_dev": _dev(f"i{iteration:02d}.incumbent", incumbent),
        "delta": mean - incumbent,
        "delta_ci95": [mean - incumbent - 0.05, mean - incumbent + 0.05],
        "threshold": 0.04,
        "beats_threshold": mean - incumbent > 0.04,
        "accepted": accepted,
        **extra,
    }


def _triage(n_failed: int, rates: dict) -> dict:
    return {
        "n_failed": n_failed,
        "counts": {},
        "rates": rates,
        "process_share": sum(v for k, v in rates.items() if k != "content"),
        "content_share": rates.get("content", 0.0),
    }


def _held_out(label: str, mean: float, triage: dict) -> dict:
    return {
        "label": label,
        "mean_score": mean,
        "mean_score_ci95": [mean - 0.1, mean + 0.1],
        "pass_at_k": {"1": mean},
        "pass_hat_k": {"1": mean},
        "delivery_rate": 0.5,
        "n_tasks": 2,
        "n_episodes": 2,
        "n_infra_errors": 0,
        "triage": triage,
    }


def _write_log(folder: Path, records: list[dict], tail: str = "") -> None:
    (folder / "evolution.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


def test_finished_evolution_run_gets_its_section(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    _episodes(folder, tokenizer, ["test.seed", "test.best"])
    _write_log(
        folder,
        [
            _record(1, 1, "seed", 0.30, 0.20, True, hypothesis="HYPOTHESIS-ACCEPTED-ONE"),
            _record(1, 2, "seed", 0.21, 0.20, False, edit="budget-notice", hypothesis="HYPOTHESIS-REJECTED"),
            _record(2, 1, "i01.c1", 0.26, 0.27, False, edit="state-ledger", hypothesis="HYPOTHESIS-REJECTED-TWO"),
            {
                "iteration": 2,
                "candidate": "i02.c2",
                "parent": "i01.c1",
                "proposer": "llm",
                "edit": "llm",
                "hypothesis": "garbage",
                "target": "unspecified",
                "diff": [],
                "status": "invalid",
                "error": "not YAML",
                "dev": None,
                "incumbent_dev": _dev("i02.incumbent", 0.27),
                "delta": None,
                "delta_ci95": None,
                "threshold": 0.04,
                "beats_threshold": False,
                "accepted": False,
            },
        ],
    )
    (folder / "noise.json").write_text(json.dumps({"threshold": 0.04}))
    (folder / "state.json").write_text(json.dumps({"phase": "finished"}))
    final = {
        "suite": "toolcalc",
        "model": "scripted",
        "seed_harness": "react",
        "best": "i01.c1",
        "accepted_edits": ["i01.c1"],
        "threshold": 0.04,
        "seed": _held_out("test.seed", 0.25, _triage(6, {"loop": 0.5, "content": 0.5})),
        "best_harness": _held_out("test.best", 0.40, _triage(4, {"loop": 0.25, "content": 0.75})),
        "paired_difference": {
            "mean_difference": 0.15,
            "ci95": [0.05, 0.25],
            "n_tasks": 2,
            "n_only_a": 0,
            "n_only_b": 0,
        },
    }
    (folder / "final.json").write_text(json.dumps(final))

    index = build_report([folder])
    html = index.read_text(encoding="utf-8")
    section = html[
        html.index('<section id="evolution">') : html.index("</section>", html.index('<section id="evolution">'))
    ]
    assert '<a href="#evolution">evolution</a>' in html
    assert "2 iterations, 4 candidates (3 measured, 1 accepted, 1 invalid, 0 crashed)" in section
    assert "best minus seed = +0.150, 95% CI +0.050 to +0.250 (better beyond noise)" in section
    accepted = section[section.index("<h3>Accepted edits</h3>") : section.index("<details>")]
    assert "HYPOTHESIS-ACCEPTED-ONE" in accepted and "HYPOTHESIS-REJECTED" not in accepted
    assert "rules.loop_guard.enabled: true" in accepted  # the spec change is shown
    every = section[section.index("<details>") :]
    assert all(h in every for h in ("HYPOTHESIS-REJECTED", "HYPOTHESIS-REJECTED-TWO", "garbage"))
    assert "Search in progress" not in section
    # held-out table: seed vs best, process share before and after
    assert "0.250" in section and "0.400" in section and "50%" in section and "25%" in section
    for name in ("evolution.svg", "evolution_triage.svg"):
        svg = index.parent / "plots" / name
        ET.parse(svg)  # well-formed
        assert f'src="plots/{name}"' in section
    # the episodes of the run are still reported as usual
    assert "test.seed" in html and "test.best" in html


def test_search_in_progress_and_a_cut_line(tmp_path, tokenizer):
    folder = tmp_path / "evo"
    _episodes(folder, tokenizer, ["noise.a"])
    _write_log(folder, [_record(1, 1, "seed", 0.3, 0.2, True)], tail='{"iteration": 2, "cand')
    (folder / "state.json").write_text(json.dumps({"phase": "search"}))
    evo = load_evolution(folder)
    assert len(evo.records) == 1 and evo.skipped_lines == 1 and evo.final is None
    assert evo.threshold == 0.04  # from the records when noise.json is missing
    html = build_report([folder]).read_text(encoding="utf-8")
    assert "Search in progress or interrupted (phase: search)" in html
    assert "1 line(s) of evolution.jsonl could not be read" in html
    assert "Held-out: seed vs best" not in html


def test_an_eval_run_has_no_evolution_section(tmp_path, tokenizer):
    folder = tmp_path / "run"
    _episodes(folder, tokenizer, ["json-tools"])
    html = build_report([folder]).read_text(encoding="utf-8")
    assert 'id="evolution"' not in html and "#evolution" not in html
