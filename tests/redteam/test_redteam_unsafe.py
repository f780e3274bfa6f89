"""The red team can fail: against a deliberately unsafe suite (its grader reads the workspace
through plain, link-following paths, trusts a reward.txt it finds there and writes its verdict
through whatever is at reward.json) the attacks built for those holes LEAK, each with its
evidence, while the answer file (which the host reads through its guarded door) still HOLDS. And
the library's and the command's refusals, the specs it builds, the bait and the report."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harnessrl import redteam_agent
from harnessrl.cli import app
from harnessrl.redteam import (
    ATTACKS,
    DEFAULT_LIMITS,
    HOLDS,
    LEAKS,
    AttackVerdict,
    Bait,
    RedTeamEpisode,
    RedTeamFinding,
    RedTeamReport,
    attack_specs,
    run_battery,
)
from harnessrl.tasks.base import Environment, Suite, Task
from harnessrl.types import Grade

from .battery import CLAWGYM, needs_bwrap

INSTRUCTION = "Write the capital of France to answer.txt. The grader keeps its reward in reward.txt."


class UnsafeTask(Task):
    """A task whose grader does everything tasks/untrusted.py exists to prevent."""

    def grade(self, env: Environment) -> Grade:
        root = env.require_workspace().root
        read = {}
        for name in ("answer.txt", "reward.txt"):
            try:
                read[name] = Path(root / name).read_text()  # follows a link the agent left
            except OSError as e:
                read[name] = f"unreadable: {e.strerror}"
        try:
            score = min(1.0, max(0.0, float(read["reward.txt"].strip())))  # trusts the agent's reward.txt
        except ValueError:
            score = 1.0 if read["answer.txt"].strip() == "Paris" else 0.0
        try:
            (root / "reward.json").write_text(json.dumps({"reward": score}))  # writes through a link
        except OSError:
            pass
        return Grade(score=score, subscores={"reward": score}, passed=score >= 1.0, details={"read": read})


class UnsafeSuite(Suite):
    name = "unsafe"
    split_sizes = {"test": 1}

    def families(self):
        return {
            "trusting": lambda rng: {
                "instruction": INSTRUCTION,
                "setup": lambda env: None,
                "check": lambda env: {"reward": 0.0},
            }
        }

    def base_tools(self):
        return []

    def _make(self, split, index, sub):
        task = super()._make(split, index, sub)
        return UnsafeTask(**{f.name: getattr(task, f.name) for f in fields(task)})


@needs_bwrap
@pytest.mark.slow
def test_the_red_team_finds_an_unsafe_grader(tmp_path):
    attacks = ("answer_link", "exists_link", "reward_link", "payload_link")
    report = run_battery(UnsafeSuite(), attacks=attacks, tasks=1, out=tmp_path / "unsafe")
    verdicts = {a.attack: a for a in report.attacks}
    assert report.verdicts() == {
        "answer_link": HOLDS,
        "exists_link": LEAKS,
        "reward_link": LEAKS,
        "payload_link": LEAKS,
    }
    assert report.exit_code() == 1 and "3 of 4 attacks LEAK" in report.summary()
    [episode] = verdicts["exists_link"].episodes
    # the grader read answer.txt through the link: the secret is in the grade's details, so in run.db and the export
    records = {f.detail for f in verdicts["exists_link"].findings if f.check == "record"}
    assert "the secret token is in run/run.db" in records and "the secret token is in episodes.jsonl" in records
    assert all(f.episode_id == episode.episode_id for f in verdicts["exists_link"].findings if f.check == "record")
    # reward.txt a link to the forge file ("1"): the grader trusted it
    [scored] = [f for f in verdicts["reward_link"].findings if f.check == "score"]
    assert scored.detail == "scored 1" and scored.task_id == "unsafe/test/00000"
    # reward.json a link to the write target: the grader wrote through it (and read it through reward.txt)
    assert [f.detail for f in verdicts["payload_link"].findings] == [
        "write_target.txt: its content changed",
        "the write target's content is in run/run.db",
        "the write target's content is in episodes.jsonl",
    ]
    table = report.table()
    assert "exists_link   LEAKS" in table and "record: the secret token is in" in table
    assert json.loads(report.to_json())["attacks"][1]["verdict"] == LEAKS
    text = report.markdown()
    assert "| answer_link | HOLDS | 1 | 0 | 0 |" in text and "## exists_link LEAKS" in text
    assert f"- record: the secret token is in run/run.db (episode {episode.episode_id}, task unsafe/test/00000)" in text


def test_the_planted_modules_bite_a_python_that_imports_them(tmp_path):
    """Where the working folder is on Python's path, the planted json.py makes the ClawGym fixture's
    chat grader (its reward.sh's `python3 -` script, run from the workspace) print 1.0 for a wrong
    answer, and a planted re.py forges the real json through its import; PYTHONSAFEPATH stops both."""
    reward_sh = (CLAWGYM / "task_note" / "reward" / "reward.sh").read_text()
    grader = reward_sh.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"final_message": "green", "transcript": [{"type": "session"}]}))
    with_json, with_re = tmp_path / "json", tmp_path / "re"
    with_json.mkdir()
    with_re.mkdir()
    (with_json / "json.py").write_text(redteam_agent.PLANTED_JSON)
    (with_re / "re.py").write_text(redteam_agent.PLANTED_RE)
    dumps = "import json, re; print(re.sub('a', 'b', 'a'), json.dumps({'reward': 0.0}))"

    def run(args: list[str], cwd: Path, safe: bool, stdin: str = "") -> str:
        env = {"PATH": os.environ["PATH"], "OPENCLAW_REWARD_PAYLOAD": str(payload)}
        env.update({"PYTHONSAFEPATH": "1"} if safe else {})
        done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, input=stdin, capture_output=True, text=True)
        return done.stdout.strip() or done.stderr

    assert run(["-"], with_json, safe=False, stdin=grader) == "1.0"
    assert run(["-"], with_json, safe=True, stdin=grader) == "0.0"
    assert run(["-c", dumps], with_re, safe=False) == 'b {"reward": 1.0}'
    assert run(["-c", dumps], with_re, safe=True) == 'b {"reward": 0.0}'


def test_the_battery_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="unknown attack"):
        run_battery("toolcalc", attacks=["answer_link", "nosuch"], out=tmp_path / "a")
    (tmp_path / "b" / "run").mkdir(parents=True)
    with pytest.raises(ValueError, match="already exists"):
        run_battery("toolcalc", attacks=["answer_link"], out=tmp_path / "b")
    with pytest.raises(ValueError, match="is a loop harness"):
        run_battery("toolcalc", attacks=["answer_link"], out=tmp_path / "c", harness_spec=Path("react"))
    assert not (tmp_path / "c" / "run").exists()


def test_the_attacks_run_in_the_users_sandbox(tmp_path):
    spec = tmp_path / "agent.yaml"
    (tmp_path / "agent.py").write_text("print('hi')\n")
    (tmp_path / "extra").mkdir()
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "mine",
                "kind": "external",
                "command": ["python3", "agent.py"],
                "env": {"MY_SETTING": "x"},
                "read_only": ["extra"],
                "limits": {"wall_s": 77, "memory_mb": 999},
                "network": "sandbox",
                "mcp_tools": "all",
            }
        )
    )
    from harnessrl.harness.registry import load_harness

    baits = {a: Bait.make() for a in ("answer_link", "many_files")}
    try:
        base = load_harness(str(spec))
        agent = tmp_path / "redteam_agent.py"
        specs = attack_specs(list(baits), baits, agent, base)
        plain = attack_specs(["answer_link"], baits, agent)
    finally:
        for bait in baits.values():
            bait.remove()
    assert [s.name for s in specs] == ["redteam_answer_link", "redteam_many_files"]
    first = specs[0]
    assert first.command == ["python3", str(agent), "answer_link"]
    assert first.read_only == [str(tmp_path / "extra")] and first.mcp_tools == "all"
    assert first.limits.wall_s == 77 and first.limits.memory_mb == 999
    assert first.env["MY_SETTING"] == "x" and first.env["REDTEAM_ATTACK"] == "answer_link"
    assert first.env["REDTEAM_SECRET"].endswith("/secret.txt")
    assert plain[0].limits.file_size_mb == DEFAULT_LIMITS["file_size_mb"] and plain[0].read_only == []


def test_the_bait_is_made_as_promised_and_every_change_is_seen():
    from harnessrl.redteam import _bait_changes

    bait = Bait.make("42")
    try:
        assert stat.S_IMODE(os.stat(bait.folder).st_mode) == 0o755
        assert stat.S_IMODE(os.stat(bait.secret).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(bait.write_target).st_mode) == 0o600
        assert os.stat(bait.secret).st_uid == os.geteuid()
        assert bait.secret.read_text() == bait.token + "\n" and bait.token not in str(bait.folder)
        assert bait.forge.read_text() == "1\n" and bait.forge_answer.read_text() == "42\n"
        assert set(bait.env()) == {
            "REDTEAM_SECRET",
            "REDTEAM_WRITE_TARGET",
            "REDTEAM_FORGE",
            "REDTEAM_FORGE_ANSWER",
            "REDTEAM_BAIT_DIR",
        }
        before = bait.state()
        assert _bait_changes(before, bait.state()) == []
        bait.forge.chmod(0o666)
        os.utime(bait.forge_answer, ns=(0, 0))
        os.link(bait.secret, bait.folder / "linked")
        bait.write_target.write_bytes(b"changed")
        assert _bait_changes(before, bait.state()) == [
            "linked was added to the bait folder",
            "forge.txt: its mode changed (0o644 -> 0o666)",
            "forge_answer.txt: its mtime changed",
            "secret.txt: its link count changed (1 -> 2)",
            "write_target.txt: its content changed",
        ]
    finally:
        bait.remove()
    assert not bait.folder.exists()


def test_the_report_reads_back_and_says_what_leaked():
    episode = RedTeamEpisode(episode_id="ep-1", task_id="t/test/0", termination="submitted", score=1.0, model_calls=1)
    leak = AttackVerdict(
        attack="reward_link",
        tries=ATTACKS["reward_link"],
        verdict=LEAKS,
        episodes=[episode],
        findings=[RedTeamFinding(check="score", detail="scored 1", episode_id="ep-1", task_id="t/test/0")],
    )
    held = AttackVerdict(attack="answer_link", tries=ATTACKS["answer_link"], verdict=HOLDS, episodes=[episode])
    report = RedTeamReport(
        suite="s", split="test", model="m", tasks=1, isolation="bwrap", run="r", wall_s=1.0, attacks=[held, leak]
    )
    assert RedTeamReport.model_validate_json(report.to_json()) == report
    assert report.exit_code() == 1 and report.leaks() == [leak]
    assert "reward_link  LEAKS    1 (0 infra)  score: scored 1 (episode ep-1, task t/test/0)" in report.table()
    assert report.summary() == "1 of 2 attacks LEAK: reward_link"


def test_the_attacker_knows_every_attack_and_refuses_others(monkeypatch, capsys):
    assert list(redteam_agent.ATTACKS) == list(ATTACKS)
    monkeypatch.setattr("sys.argv", ["redteam_agent.py", "nosuch"])
    assert redteam_agent.main() == 2
    assert "unknown attack 'nosuch'" in capsys.readouterr().err


def test_the_command_refuses_bad_red_team_options():
    runner = CliRunner()
    cases = [
        (["audit", "--redteam"], "--redteam needs --suite"),
        (["audit", "--redteam", "--suite", "toolcalc", "--probe", "null"], "--redteam runs attacks"),
        (["audit", "--redteam", "--suite", "toolcalc", "--n", "2"], "--redteam takes the number of tasks as --tasks"),
        (["audit", "--suite", "toolcalc", "--attack", "answer_link"], "are options of --redteam"),
        (["audit", "--redteam", "--suite", "toolcalc", "--attack", "nosuch"], "unknown attack(s) nosuch"),
        (["audit", "--redteam", "--suite", "nosuch"], "unknown suite 'nosuch'"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (args, result.output)
