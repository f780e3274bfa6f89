"""bench/bandit_gain.py: the survey's rule, the per-task records bench/write_doc.py recomputes its
intervals from, and the experiment resuming after an interruption without redoing finished work."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from helpers import shrunk_file

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bandit_gain  # noqa: E402
import write_doc  # noqa: E402

from harnessrl.metrics import paired_difference  # noqa: E402


def _row(harness: str, task: str, passed: list[bool]) -> dict:
    return {"harness": harness, "task": task, "scores": [float(p) for p in passed], "passed": passed}


def _records(folder: Path, evaluations: dict[str, list[dict]]) -> Path:
    folder.mkdir(parents=True)
    run = {
        "harnesses": {"trained": ["react", "xml-tags"], "held_out": "hermes-tools"},
        "test": "3 test tasks x 2 attempts",
        "evaluations": list(evaluations),
        "comparisons": [["bandit - mixed", "mixed-s0", "bandit-s0"]],
    }
    (folder / "run.json").write_text(json.dumps(run))
    for name, rows in evaluations.items():
        (folder / f"eval-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _text(diff) -> str:
    return f"{diff.mean_difference:+.3f} [{diff.ci95[0]:+.3f}, {diff.ci95[1]:+.3f}]"


def _page(tmp_path: Path, text: str) -> str:
    doc = tmp_path / "doc"
    doc.mkdir(exist_ok=True)
    (doc / "00-head.md").write_text("# Page\n")
    (doc / "01-section.md").write_text(text)
    return write_doc.build(doc, tmp_path / "results")


def test_a_doc_interval_is_recomputed_from_the_per_task_records(tmp_path):
    mixed = [_row("react", "t1", [False, False]), _row("react", "t2", [True, False]), _row("react", "t3", [True, True])]
    bandit = [_row("react", "t1", [True, False]), _row("react", "t2", [True, True]), _row("react", "t3", [True, True])]
    mixed += [_row("xml-tags", t, [False, False]) for t in ("t1", "t2", "t3")]
    bandit += [_row("xml-tags", "t1", [True, True]), _row("xml-tags", "t2", [False, False])]  # t3: no episode
    records = _records(
        tmp_path / "results" / "records" / "bandit_gain" / "fx", {"mixed-s0": mixed, "bandit-s0": bandit}
    )

    page = _page(
        tmp_path,
        "React: {{interval bandit_gain/fx mixed-s0 bandit-s0 react}}; pooled pass^2: "
        "{{interval bandit_gain/fx mixed-s0 bandit-s0 trained pass^2}}.\n\n{{differences bandit_gain/fx}}\n",
    )
    react = _text(paired_difference({"t1": 0.0, "t2": 0.5, "t3": 1.0}, {"t1": 0.5, "t2": 1.0, "t3": 1.0}))
    # pooled over the trained harnesses task by task (t3 of bandit-s0: react's alone); pass^2
    pooled_hat = _text(paired_difference({"t1": 0.0, "t2": 0.0, "t3": 0.5}, {"t1": 0.5, "t2": 0.5, "t3": 1.0}))
    assert f"React: {react}; pooled pass^2: {pooled_hat}." in page
    assert react == "+0.333 [+0.000, +0.500]"  # diffs 0.5, 0.5, 0
    xml = _text(paired_difference({"t1": 0.0, "t2": 0.0}, {"t1": 1.0, "t2": 0.0}))
    pooled = _text(paired_difference({"t1": 0.0, "t2": 0.25, "t3": 0.5}, {"t1": 0.75, "t2": 0.5, "t3": 1.0}))
    table = [line for line in page.splitlines() if line.startswith("| bandit - mixed")]
    assert table == [f"| bandit - mixed | {react} | {xml} | {pooled} | - |"]  # no held-out episode: no interval

    # the records are what the page says: change one attempt and the interval moves
    path = records / "eval-bandit-s0.jsonl"
    path.write_text(path.read_text().replace('"t1", "scores": [1.0, 0.0]', '"t1", "scores": [0.0, 0.0]'))
    assert react not in _page(tmp_path, "{{interval bandit_gain/fx mixed-s0 bandit-s0 react}}\n")
    with pytest.raises(write_doc.DocError, match="no per-task records of evaluation 'mixed-s1'"):
        _page(tmp_path, "{{interval bandit_gain/fx mixed-s1 bandit-s0 react}}\n")
    with pytest.raises(write_doc.DocError, match="run.json is missing"):
        _page(tmp_path, "{{interval bandit_gain/none mixed-s0 bandit-s0 react}}\n")


def test_the_survey_rule_trains_signal_and_flat_harnesses_and_holds_out_the_second_by_signal():
    table = {
        "react": {"mean": 0.219, "signal": 0.25},
        "hermes-tools": {"mean": 0.109, "signal": 0.25},
        "xml-tags-demo": {"mean": 0.125, "signal": 0.0},
        "xml-tags": {"mean": 0.0, "signal": 0.0},
        "plan-execute": {"mean": 0.05, "signal": 0.0625},
    }
    choice = bandit_gain.choose_harnesses(table, trained_count=3)
    assert choice["trained"] == ["react", "xml-tags-demo", "plan-execute"]
    assert choice["held_out"] == "hermes-tools" and choice["reference"] == "react"
    assert bandit_gain.choose_harnesses(table, trained_count=5)["trained"] == [
        "react", "xml-tags-demo", "plan-execute", "xml-tags",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="needs two with signal and one flat"):
        bandit_gain.choose_harnesses({h: table[h] for h in ("react", "hermes-tools", "plan-execute")})
    with pytest.raises(ValueError, match="1 harness"):
        bandit_gain.choose_harnesses({h: table[h] for h in ("react", "xml-tags", "xml-tags-demo")})


def _files(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.iterdir()):
        text = path.read_text()
        if path.name == "run.json":  # the command and the stages' dates and seconds differ
            run = json.loads(text)
            text = json.dumps({k: v for k, v in run.items() if k not in ("command", "stages")}, sort_keys=True)
        out[path.name] = text
    return out


def test_the_experiment_resumes_after_an_interruption_and_redoes_nothing_finished(tmp_path, monkeypatch, capsys):
    """Tiny random model, one-step harnesses, a 2-step budget: a run stopped after the survey,
    then killed inside the mixed arm's second step, finishes with the same records as a run that
    was never stopped, without running a finished stage or training run again."""
    monkeypatch.setenv("HARNESSRL_THREADS", "1")
    monkeypatch.setattr(bandit_gain, "SUBPROCESS", False)  # (many tiny commands: in this process)
    specs = [
        str(shrunk_file(tmp_path, h, max_steps=1, max_new_tokens=8)) for h in ("react", "xml-tags", "plan-execute")
    ]
    args = [
        "--model", "tiny-random", "--candidates", ",".join(specs), "--trained", ",".join(specs[:2]),
        "--held-out", specs[2], "--survey-tasks", "2", "--survey-attempts", "2", "--steps", "2",
        "--tasks-per-step", "2", "--group-size", "2", "--test-tasks", "2", "--attempts", "2",
    ]  # fmt: skip
    whole = bandit_gain.main([*args, "--out", str(tmp_path / "a"), "--until", "evaluation"])
    assert whole["stages"] == ["warm-start", "survey", "arms", "evaluation"]

    b = tmp_path / "b"
    b_args = [*args, "--out", str(b), "--records", "--records-dir", str(tmp_path / "results" / "records")]
    bandit_gain.main([*b_args, "--until", "survey"])
    survey_marker = (b / "done" / "survey.json").read_text()
    assert not (b / "done" / "arms.json").exists()
    capsys.readouterr()

    run = bandit_gain.harnessrl

    def killed(*command: str) -> None:
        if "mixed" in command and command[command.index("--steps") + 1] == "2":
            raise KeyboardInterrupt  # a kill inside the mixed arm, after its first step
        run(*command)

    monkeypatch.setattr(bandit_gain, "harnessrl", killed)
    with pytest.raises(KeyboardInterrupt):
        bandit_gain.main([*b_args, "--until", "evaluation"])
    monkeypatch.setattr(bandit_gain, "harnessrl", run)
    assert json.loads((b / "mixed-s0" / "checkpoint" / "state.json").read_text())["step"] == 1
    capsys.readouterr()

    bandit_gain.main([*b_args, "--until", "evaluation"])
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ harnessrl")]
    assert not any("--split dev" in c or "harness-bandit" in c for c in commands)  # finished: not run again
    trained = [c for c in commands if "train grpo" in c]
    assert len(trained) == 1 and "--scheduler mixed --steps 2" in trained[0] and "--resume" in trained[0]
    assert sum("eval " in c for c in commands) == 3
    assert (b / "done" / "survey.json").read_text() == survey_marker

    same = _files(tmp_path / "a" / "records")
    assert _files(b / "records") == same == _files(tmp_path / "results" / "records" / "bandit_gain" / "b")
    assert {f"train-{arm}-s0.jsonl" for arm in ("bandit", "mixed")} | {"survey.jsonl", "run.json"} <= set(same)
    steps = [json.loads(line) for line in same["train-bandit-s0.jsonl"].splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(sum(h["count"] for h in s["harnesses"].values()) == s["step"] for s in steps)
    with pytest.raises(SystemExit, match=r"other options \(--steps 2 -> 3\)"):  # finished stages used 2
        bandit_gain.main([*b_args, "--steps", "3"])
    page = _page(
        tmp_path,
        "{{steps bandit_gain/b bandit-s0}}\n\n{{differences bandit_gain/b pass@2}}\n\n{{signal bandit_gain/b start}}\n",
    )
    assert f"| 1 | {steps[0]['harness']} | 0/2 | 0.00 |" in page and "| bandit - mixed, seed 0 |" in page
    # what each arm's steps spent (groups with signal / groups, over its steps) beside what it moved
    signal_rows = [line for line in page.splitlines() if line.startswith("| bandit-s0 | ")]
    assert len(signal_rows) == 1
    pooled = signal_rows[0].split(" | ")[-1]
    assert pooled.startswith(f"{sum(s['signal_groups'] for s in steps)}/{sum(s['groups'] for s in steps)}: ")


def test_each_command_runs_in_a_process_of_its_own_and_a_failure_stops_the_experiment(tmp_path, capsys):
    """The experiment's commands run as child processes (its memory would grow over hours in one);
    a command that fails stops it with a message that says how to resume."""
    assert bandit_gain.SUBPROCESS
    assert "HARNESSRL_MERGE_LORA" not in os.environ  # (set for its commands only, never here)
    bandit_gain.harnessrl("models", "list")
    assert "$ harnessrl models list" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"`harnessrl eval` exited 2 .*run this again to resume"):
        bandit_gain.harnessrl("eval", "--no-such-option")


def test_the_committed_records_give_the_pages_seed_0_interval():
    """The seed-0 comparison in docs/BENCHMARKS.md, recomputed here from the committed per-attempt
    records alone: each task's mean over its attempts, averaged over the trained harnesses, then
    paired by task."""
    root = BENCH / "results" / "records" / "bandit_gain" / "bandit-gain"
    if not (root / "eval-mixed-s0.jsonl").is_file():
        pytest.skip("the seed-0 evaluations' records are not in this checkout")
    trained = json.loads((root / "run.json").read_text())["harnesses"]["trained"]

    def pooled(name: str) -> dict[str, float]:
        per_task: dict[str, list[float]] = {}
        for line in (root / f"eval-{name}.jsonl").read_text().splitlines():
            row = json.loads(line)
            scores = [s for s in row["scores"] if s is not None]
            if row["harness"] in trained and scores:
                per_task.setdefault(row["task"], []).append(sum(scores) / len(scores))
        return {task: sum(v) / len(v) for task, v in per_task.items()}

    mixed, bandit = pooled("mixed-s0"), pooled("bandit-s0")
    assert len(mixed) == len(bandit) == 72
    text = _text(paired_difference(mixed, bandit))
    assert text == "+0.044 [+0.012, +0.076]"
    # the page's first table of differences is the mean score's; its pooled column is the 5th
    page = (BENCH.parent / "docs" / "BENCHMARKS.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| bandit - mixed, seed 0 |"))
    assert [cell.strip() for cell in row.split("|")][5] == text
