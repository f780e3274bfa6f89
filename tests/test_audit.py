"""`harnessrl audit`: the probes find graders that a null, instruction-only or junk-writing agent
passes, the grader probe sees no grader file under bubblewrap (and does without it), the report
lists every finding in JSON and Markdown, and no built-in task is passed by an answer-only probe."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harnessrl.audit import audit_suite, audit_task, named_files
from harnessrl.cli import app
from harnessrl.tasks import get_suite, sandbox_exec
from harnessrl.tasks.base import Environment, Suite, TaskParts
from harnessrl.tasks.importers.clawgym import ClawGymSuite
from harnessrl.tasks.sandbox_exec import isolation_available
from harnessrl.tasks.workspace import WORKSPACE_TOOLS

ROOT = Path(__file__).resolve().parents[1]
CLAWGYM = ROOT / "tests" / "fixtures" / "importers" / "clawgym"
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is missing or does not work here")


def _parts(instruction: str, check) -> TaskParts:
    return {"instruction": instruction, "setup": lambda env: None, "check": check}


def always(rng: random.Random) -> TaskParts:
    return _parts("Tidy the workspace.", lambda env: {"ok": 1.0})


def echo_number(rng: random.Random) -> TaskParts:
    return _parts("Add 0 to 7 with the tools and submit the sum.", lambda env: {"ok": float(env.answer == "7")})


def any_file(rng: random.Random) -> TaskParts:
    def check(env: Environment) -> dict[str, float]:
        return {"ok": float((env.require_workspace().root / "out" / "result.json").is_file())}

    return _parts("Compute the totals and write them to out/result.json.", check)


def honest(rng: random.Random) -> TaskParts:
    def check(env: Environment) -> dict[str, float]:
        return {"ok": float(env.answer == "42" and env.require_workspace().read("answer.txt") == "42")}

    return _parts("What is 6 times 7? Write it to answer.txt and submit it.", check)


class WeakSuite(Suite):
    name = "weak"
    split_sizes = {"test": 4}

    def families(self):
        return {"a_always": always, "b_echo": echo_number, "c_any_file": any_file, "d_honest": honest}

    def base_tools(self):
        return list(WORKSPACE_TOOLS)


def test_the_probes_find_the_weak_graders_and_pass_the_honest_one():
    report = audit_suite("weak", WeakSuite().tasks("test"), "test", ("null", "empty", "instruction", "junk"))
    found = {(p["family"], p["probe"], p["variant"]) for p in report.passed_by_probe()}
    assert found == {
        ("a_always", "null", "nothing"),
        ("a_always", "empty", "empty answer"),
        ("a_always", "instruction", "whole instruction"),
        ("a_always", "junk", "junk in named files"),
        ("b_echo", "instruction", "last number"),
        ("c_any_file", "junk", "junk in named files"),
    }
    data = json.loads(json.dumps(report.to_json()))
    assert data["tasks_audited"] == 4 and data["errors"] == [] and len(data["passed_by_probe"]) == 6
    text = report.markdown()
    assert "## Tasks passed by a probe: 6" in text
    assert "| weak/test/00002 | c_any_file | junk | junk in named files | 1 |" in text


def test_a_grader_that_crashes_is_an_error_of_the_probe_never_a_pass():
    suite = WeakSuite()
    task = suite.tasks("test")[3]
    task.check = lambda env: 1 / 0
    audit = audit_task(task, ("null", "instruction"))
    assert [r.passed for r in audit.results] == [False, False]
    assert all("ZeroDivisionError" in r.error for r in audit.results)


def test_named_files_are_the_paths_an_instruction_names():
    text = (
        "Read input/numbers.txt and write the sum to output/total.txt; also /app/result.json, "
        "report.md. See https://example.com/page.html. Version 1.5 is fine."
    )
    assert named_files(text) == ["input/numbers.txt", "output/total.txt", "/app/result.json", "report.md"]


@needs_bwrap
def test_the_grader_probe_finds_nothing_under_bubblewrap():
    task = next(t for t in ClawGymSuite(CLAWGYM).tasks("test") if t.data["native_id"] == "task_sum")
    [grader] = audit_task(task, ("grader",)).results
    assert grader.error == "" and grader.seen == [] and grader.note == "isolation bwrap"
    assert not grader.passed and grader.score is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="without bubblewrap the probe's uid is ours: it would see anyway")
def test_without_bubblewrap_the_grader_probe_lists_the_grader_files(monkeypatch):
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    task = next(t for t in ClawGymSuite(CLAWGYM).tasks("test") if t.data["native_id"] == "task_sum")
    report = audit_suite("clawgym", [task], "test", ("grader",))
    [exposed] = report.exposed()
    assert str(CLAWGYM / "task_sum" / "reward" / "reward.sh") in exposed["seen"]
    assert str(CLAWGYM / "task_note" / "data_entry.json") in exposed["seen"]  # the task beside it too
    assert exposed["writable"] == []  # root's files: the probe's own uid may not write them
    assert report.isolation.startswith("rlimits-only") and "## Grader files an agent could see: 1" in report.markdown()
    # and ClawGym's grader needs bubblewrap's mounts: an error of the probe, not a pass
    assert "bubblewrap" in report.errors()[0]["error"]


@pytest.mark.parametrize("name", ["toolcalc", "workspace", "browse", "planning"])
def test_no_built_in_task_is_passed_by_an_answer_only_probe(name):
    suite = get_suite(name)
    tasks = suite.tasks("test") + suite.tasks("dev") + suite.tasks("train", 300)
    report = audit_suite(name, tasks, "all", ("null", "empty", "instruction"))
    assert report.passed_by_probe() == [] and report.errors() == []


def test_the_cli_writes_json_and_markdown_and_refuses_bad_input(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        app, ["audit", "--suite", f"clawgym:{CLAWGYM}", "--probe", "null", "--probe", "junk", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "audit.json").read_text())
    assert data["probes"] == ["null", "junk"] and data["tasks_audited"] == 2 and data["passed_by_probe"] == []
    assert "# Reward-hacking audit: clawgym:" in (tmp_path / "audit.md").read_text()
    bad = runner.invoke(app, ["audit", "--suite", "toolcalc", "--n", "1", "--probe", "oracle"])
    assert bad.exit_code == 2 and "unknown probe(s) oracle" in bad.output
    missing = runner.invoke(app, ["audit", "--suite", "nosuch"])
    assert missing.exit_code == 2 and "unknown suite 'nosuch'" in missing.output
