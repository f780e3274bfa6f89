"""`harnessrl compare A B`: two evaluation runs paired by task, per harness, with the interval the
study and improve report (metrics.paired_difference); which harnesses are paired; clear refusals."""

from __future__ import annotations

import json

from test_metrics import _traj
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.cli.compare import pairs
from harnessrl.metrics import paired_difference
from harnessrl.store import RunStore
from harnessrl.types import Termination


def _episode(task: str, attempt: int, score: float | None, harness: str):
    if score is None:  # an infrastructure error: no grade, left out of the task's score
        return _traj(task, attempt, harness=harness, termination=Termination.error, submitted=False)
    return _traj(task, attempt, score, score == 1.0, harness=harness)


def _run(folder, scores: dict[str, dict[str, list[float | None]]]):
    """A run folder whose harness h scored scores[h][task] (one entry per attempt)."""
    with RunStore(folder) as store:
        store.set_meta("config", {"suite": "toolcalc", "split": "test"})
        for harness, tasks in scores.items():
            for task, attempts in tasks.items():
                for i, s in enumerate(attempts):
                    store.add(_episode(task, i, s, harness))
    return folder


BEFORE = {"react": {"t1": [0.0, 0.0], "t2": [1.0, 0.0], "t3": [0.0, 0.0], "t4": [1.0, 1.0]}}
AFTER = {"react": {"t1": [1.0, 1.0], "t2": [1.0, 1.0], "t3": [0.0, None], "t4": [1.0, 1.0], "t5": [1.0, 1.0]}}


def test_two_runs_are_paired_by_task_with_the_interval_of_the_study(tmp_path):
    a, b = _run(tmp_path / "a", BEFORE), _run(tmp_path / "b", AFTER)
    r = CliRunner().invoke(app, ["compare", str(a), str(b), "--json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output)["comparisons"]
    # per-task means: A 0, .5, 0, 1; B 1, 1, 0 (its infra error left out), 1; t5 only in B
    assert row["harness_a"] == row["harness_b"] == "react"
    assert row["n_tasks"] == 4 and row["n_only_a"] == 0 and row["n_only_b"] == 1
    assert row["mean_a"] == 0.375 and row["mean_b"] == 0.75
    expected = paired_difference({"t1": 0, "t2": 0.5, "t3": 0, "t4": 1}, {"t1": 1, "t2": 1, "t3": 0, "t4": 1, "t5": 1})
    assert row["mean_difference"] == expected.mean_difference == 0.375
    assert row["ci95"] == expected.ci95
    table = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert table.exit_code == 0 and "+0.375" in table.output and "react" in table.output


def test_which_harnesses_are_paired():
    assert pairs(["a", "b"], ["b", "c"], None, None) == [("b", "b")]
    assert pairs(["seed"], ["improved"], None, None) == [("seed", "improved")]  # one each: those two
    assert pairs(["a", "b"], ["c", "d"], None, None) == []
    assert pairs(["a", "b"], ["a", "c"], "b", "c") == [("b", "c")]
    assert pairs(["a"], ["a"], "a", None) == [("a", "a")]


def test_a_named_harness_and_a_folder_without_a_run_are_refused_clearly(tmp_path):
    a, b = _run(tmp_path / "a", BEFORE), _run(tmp_path / "b", {"json-tools": AFTER["react"], "xml": AFTER["react"]})
    for args, words in (
        ([str(a), str(b)], "share no harness"),
        ([str(a), str(b), "--harness", "react"], "holds no episode of harness react"),
        ([str(a), str(tmp_path / "none")], "holds no run"),
    ):
        r = CliRunner().invoke(app, ["compare", *args])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, r.output
    r = CliRunner().invoke(app, ["compare", str(a), str(b), "--harness", "react", "--against-harness", "xml", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["comparisons"][0]["mean_difference"] == 0.375
