"""What an agent leaves in its workspace cannot forge its reward or touch the host: each way found
to do it on real benchmark formats, run against the task's own grader after a wrong episode.

- ClawGym: a link at the reward payload's name does not overwrite the host file it points at; a
  `json.py` planted in the workspace is not imported by the grader's `python3 -`.
- Any suite: an answer file that is a link to a host file is not read (external agents).
- Harbor: a `reward.txt` left as a link by the agent's program (the tests run it) to a host
  file holding 1 is refused, not followed.
- Claw-Eval: a snapshot file that is a link to a host file holding the expected answer is not read.
- Built-in `workspace` suite: an expected output that is a link to a host file with the right
  content earns nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from harnessrl.harness.external import ANSWER_FILE, _read_answer
from harnessrl.tasks import get_suite
from harnessrl.tasks.importers import ClawGymSuite, GraderError, HarborSuite
from harnessrl.tasks.importers.claweval.grading import _read_for_snapshot
from harnessrl.tasks.sandbox_exec import isolation_available
from harnessrl.tasks.workspace import write_file

FIXTURES = Path(__file__).parent / "fixtures"
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap does not work here")


@pytest.fixture
def bait(tmp_path):
    """Host files an attacker aims at: a root-only target to overwrite, a secret, a forged '1'."""
    folder = tmp_path / "bait"
    folder.mkdir()
    files = {"target": "host target content\n", "secret": "SECRET-7f3a\n", "forge": "1\n"}
    for name, text in files.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o600)
    return {name: folder / name for name in files}


def fingerprint(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_mode


@needs_bwrap
def test_clawgym_payload_link_does_not_overwrite_a_host_file(bait):
    task = ClawGymSuite(FIXTURES / "importers" / "clawgym").task("clawgym/dev/task_note")
    env = task.make_env()
    before = fingerprint(bait["target"])
    try:
        os.symlink(bait["target"], env.workspace.root / ".openclaw_reward_payload.json")
        os.symlink(bait["target"].parent, env.workspace.root / "reward")
        env.submitted, env.answer = True, "red"
        grade = task.grade(env)
    finally:
        env.close()
    assert fingerprint(bait["target"]) == before
    assert sorted(p.name for p in bait["target"].parent.iterdir()) == ["forge", "secret", "target"]
    assert grade.score < 1.0


@needs_bwrap
def test_clawgym_grader_does_not_import_a_module_planted_in_the_workspace():
    task = ClawGymSuite(FIXTURES / "importers" / "clawgym").task("clawgym/dev/task_note")
    env = task.make_env()
    try:  # imported by `python3 -` run in the workspace, this prints a reward of 1.0 and stops
        for name in ("json.py", "os.py", "sitecustomize.py"):
            (env.workspace.root / name).write_text("import sys\nprint(1.0)\nsys.exit(0)\n")
        env.submitted, env.answer = True, "red"
        grade = task.grade(env)
    finally:
        env.close()
    assert grade.score == 0.0


def test_an_answer_file_linked_to_a_host_file_is_not_read(tmp_path, bait):
    control = tmp_path / "control"
    control.mkdir()
    os.symlink(bait["secret"], control / ANSWER_FILE)
    answer, why = _read_answer(control)
    assert answer is None and "symbolic link" in why
    (control / ANSWER_FILE).unlink()
    os.symlink("/proc/self/root" + str(bait["secret"]), control / ANSWER_FILE)
    assert _read_answer(control)[0] is None
    (control / ANSWER_FILE).unlink()
    os.mkfifo(control / ANSWER_FILE)  # would block a host that opened it for reading
    assert _read_answer(control)[0] is None
    (control / ANSWER_FILE).unlink()
    (control / ANSWER_FILE).write_text("42\n")
    assert _read_answer(control) == ("42", "")


HARBOR_TEST = """#!/bin/bash
# Runs the agent's program, then writes the reward from its own check.
bash /app/solution.sh > /dev/null 2>&1
reward=0
[ "$(cat /app/out.txt 2>/dev/null)" = "42" ] && reward=1
echo $reward > /logs/verifier/reward.txt
"""


@needs_bwrap
def test_harbor_reward_left_as_a_link_by_the_agents_program_is_refused(tmp_path, bait):
    task_dir = tmp_path / "harbor" / "runs-solution"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "instruction.md").write_text("Write a program /app/solution.sh that writes 42 to /app/out.txt.\n")
    (task_dir / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n')
    (task_dir / "tests" / "test.sh").write_text(HARBOR_TEST)
    task = HarborSuite(tmp_path / "harbor").tasks("dev")[0]
    env = task.make_env()
    try:  # a wrong program that plants its own reward as a link to a host file holding 1
        write_file(
            env,
            "solution.sh",
            f"echo 7 > /app/out.txt\nln -sf {bait['forge']} /logs/verifier/reward.txt\n",
        )
        env.submitted, env.answer = True, ""
        try:
            grade = task.grade(env)
        except GraderError as e:  # refused: an infrastructure error of the episode, never a score
            assert "symbolic link" in str(e) or "not read" in str(e)
            assert "SECRET" not in str(e)
        else:
            assert grade.score < 1.0
    finally:
        env.close()


def test_claweval_snapshot_does_not_follow_a_link_to_a_host_file(bait):
    from harnessrl.tasks.base import Workspace

    ws = Workspace()
    try:
        os.symlink(bait["forge"], ws.root / "report.txt")
        got = _read_for_snapshot("/workspace/report.txt", ws)
        assert "content" not in got and "1" not in got.get("error", "").replace("/workspace", "")
        (ws.root / "report.txt").unlink()
        (ws.root / "report.txt").write_text("14\n")
        assert _read_for_snapshot("/workspace/report.txt", ws)["content"] == "14\n"
    finally:
        ws.cleanup()


def test_builtin_workspace_output_linked_to_a_host_file_earns_nothing(tmp_path):
    suite = get_suite("workspace")
    task = next(t for t in suite.tasks("dev", 40) if t.family == "create_file")
    path, content = task.data["path"], task.data["content"]
    host = tmp_path / "host_copy.txt"
    host.write_text(content + "\n")  # the right content, outside the workspace
    env = task.make_env()
    try:
        (env.workspace.root / path).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(host, env.workspace.root / path)
        env.submitted, env.answer = True, ""
        grade = task.grade(env)
    finally:
        env.close()
    assert grade.score == 0.0 and grade.subscores["exists"] == 0.0


def test_a_hard_linked_output_earns_nothing(tmp_path):
    suite = get_suite("workspace")
    task = next(t for t in suite.tasks("dev", 40) if t.family == "create_file")
    env = task.make_env()
    try:
        host = env.workspace.root.parent / f"{env.workspace.root.name}-host.txt"
        host.write_text(task.data["content"] + "\n")
        (env.workspace.root / task.data["path"]).parent.mkdir(parents=True, exist_ok=True)
        os.link(host, env.workspace.root / task.data["path"])
        env.submitted, env.answer = True, ""
        grade = task.grade(env)
        host.unlink()
    finally:
        env.close()
    assert grade.score == 0.0
    shutil.rmtree(tmp_path, ignore_errors=True)


@needs_bwrap
def test_a_grader_broken_by_what_the_agent_left_scores_zero_not_an_infrastructure_error():
    """Deleting the input a grader reads makes it fail; that failure is the agent's (the grader
    grades a fresh setup of the task), so the episode scores 0 instead of dropping out as an
    infrastructure error, which a policy under RL could learn to cause."""
    import time

    task = ClawGymSuite(FIXTURES / "importers" / "clawgym").task("clawgym/dev/task_sum")
    env = task.make_env()
    try:
        (env.workspace.root / "input" / "numbers.txt").unlink()
        (env.workspace.root / "input").rmdir()
        os.symlink("/nonexistent", env.workspace.root / "input")
        env.submitted, env.answer = True, ""
        grade = task.grade(env)
    finally:
        env.close()
    assert grade.score == 0.0 and not grade.passed
    assert "reward/reward.sh failed" in grade.details["grader_failed"]
    # a FIFO where the grader reads is removed before it runs: no hang, and it is listed
    env = task.make_env()
    try:
        (env.workspace.root / "input" / "numbers.txt").unlink()
        os.mkfifo(env.workspace.root / "input" / "numbers.txt")
        env.submitted, env.answer = True, ""
        t0 = time.monotonic()
        grade = task.grade(env)
        assert time.monotonic() - t0 < 60
    finally:
        env.close()
    assert grade.score < 1.0
    assert grade.details["removed_special_files"] == ["input/numbers.txt"]


@needs_bwrap
def test_a_grader_that_fails_on_a_fresh_setup_too_stays_an_infrastructure_error(tmp_path):
    root = tmp_path / "clawgym" / "task_bad"
    (root / "reward").mkdir(parents=True)
    (root / "data_entry.json").write_text('{"task_id": "bad", "user_query": "Say hi.", "metadata": {}}')
    (root / "reward" / "reward.sh").write_text("echo 'not a number'\n")
    task = ClawGymSuite(tmp_path / "clawgym").tasks("dev")[0]
    env = task.make_env()
    try:
        env.submitted, env.answer = True, "hi"
        with pytest.raises(GraderError, match="not a number"):
            task.grade(env)
    finally:
        env.close()
