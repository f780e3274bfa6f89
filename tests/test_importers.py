"""Importers of ClawGym, PinchBench and Harbor task folders: loading, grading in the sandbox
through the real runner with scripted agents, LLM-judge parts left ungraded without a judge, and
broken tasks recorded as infrastructure errors while the rest of the run finishes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import oracle_policy
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.tasks.importers import ClawGymSuite, GraderError, HarborSuite, PinchBenchSuite, TaskLoadError
from harnessrl.tasks.importers.common import openclaw_transcript
from harnessrl.tasks.importers.harbor import dockerfile_instructions, resolve_verifier_env
from harnessrl.tasks.importers.pinchbench import parse_judge_reply, policy_judge
from harnessrl.tasks.sandbox_exec import ExecLimits, isolation_available
from harnessrl.types import Termination

FIXTURES = Path(__file__).parent / "fixtures" / "importers"
# Graders see the workspace at the path they were written for: that needs bubblewrap's mounts.
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap does not work here")


def _spec(shell: bool = False) -> HarnessSpec:
    data = load_harness("json-tools").to_dict()
    data["rules"].update(max_steps=8, max_new_tokens=512, max_total_tokens=None)
    if shell:
        data["rules"]["shell"] = {"enabled": True, "wall_s": 5.0, "processes": 16, "memory_mb": 256}
    return HarnessSpec.model_validate(data)


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def run_scripted(tasks, solutions: dict[str, list[dict]], tokenizer, shell: bool = False):
    """Each task replays solutions[native id] through the real runner; {native id: trajectory}."""
    for t in tasks:
        t.solution = solutions.get(t.data["native_id"], [call("submit")])
    spec = _spec(shell)
    runner = Runner(
        oracle_policy(tasks, spec, tokenizer), SamplingParams(temperature=0.0), max_retries=0, progress=False
    )
    return {t.task_id.rsplit("/", 1)[-1]: t for t in runner.run(make_jobs(tasks, [spec], 1))}


def run_broken(suite, solution: list[dict], good: str, expected: dict[str, str], tokenizer) -> dict:
    """Run every task of a suite with broken tasks in it: the good one still scores 1, and each
    named one ends in an infrastructure error whose reason contains the text given."""
    out = run_scripted(suite.tasks("dev"), {e.native_id: solution for e in suite.entries}, tokenizer)
    assert out[good].grade.score == 1.0, out[good].infra_error
    for name, reason in expected.items():
        t = out[name]
        assert t.termination == Termination.error and t.grade is None, name
        assert reason in t.infra_error, (name, t.infra_error)
    return out


def copy_fixture(src: Path, dst: Path) -> Path:
    """A copy of a fixture task whose instruction names the copy (the scripted agent tells tasks
    apart by their instruction)."""
    shutil.copytree(src, dst)
    for name, rewrite in (
        ("data_entry.json", lambda text: text.replace('"user_query": "', f'"user_query": "({dst.name}) ')),
        ("instruction.md", lambda text: f"({dst.name}) {text}"),
    ):
        if (dst / name).is_file():
            (dst / name).write_text(rewrite((dst / name).read_text()))
    return dst


# -- ClawGym ------------------------------------------------------------------------------------

CLAWGYM_RIGHT = {
    "task_sum": [
        call("read_file", path="input/numbers.txt"),
        call("write_file", path="output/total.txt", content="12\n"),
        call("submit"),
    ],
    "task_note": [call("submit", answer="Blue.")],
}
CLAWGYM_WRONG = {
    "task_sum": [call("write_file", path="output/total.txt", content="13\n"), call("submit")],
    "task_note": [call("submit", answer="Green.")],
}


def test_clawgym_loads_the_folder_layout():
    suite = get_suite(f"clawgym:{FIXTURES / 'clawgym'}")
    assert suite.split_sizes == {"train": 2, "dev": 2, "test": 2}  # every task in every split
    tasks = suite.tasks("test")
    assert [t.id for t in tasks] == ["clawgym/test/task_note", "clawgym/test/task_sum"]
    assert suite.family_names() == ["arithmetic", "chat"]
    task = suite.task("clawgym/dev/task_sum")
    assert task.instruction.startswith("Add up the numbers in input/numbers.txt")
    assert "/root/.openclaw/workspace" in task.instruction
    assert task.offers_shell
    env = task.make_env()
    try:  # input_files/ copied to input_mount_dir (here the workspace itself); reward/ is not shown
        assert env.workspace.files() == ["input/numbers.txt"]
    finally:
        env.close()


@needs_bwrap
def test_clawgym_reward_sh_grades_right_and_wrong_agents(tokenizer):
    suite = ClawGymSuite(FIXTURES / "clawgym")
    right = run_scripted(suite.tasks("dev"), CLAWGYM_RIGHT, tokenizer)
    wrong = run_scripted(suite.tasks("dev"), CLAWGYM_WRONG, tokenizer)
    for name in CLAWGYM_RIGHT:
        assert right[name].termination == Termination.submitted, right[name].infra_error
        assert right[name].grade.score == 1.0 and right[name].grade.passed
        assert wrong[name].grade.score < 1.0 and not wrong[name].grade.passed
    # check.py reads /root/.openclaw/workspace: the file exists (1/3) but the total is wrong
    assert wrong["task_sum"].grade.score == pytest.approx(2 / 3)
    assert wrong["task_note"].grade.score == 0.0  # graded from the payload's final_message


@needs_bwrap
def test_clawgym_shell_works_at_the_absolute_workspace_path_and_the_grader_sees_its_writes(tokenizer):
    ws = "/root/.openclaw/workspace"
    suite = ClawGymSuite(FIXTURES / "clawgym")
    (task,) = [t for t in suite.tasks("dev") if t.data["native_id"] == "task_sum"]
    assert task.workspace_mount == ws
    solution = [
        call("shell", command="pwd"),
        call(
            "shell",
            command=f"cd / && mkdir -p {ws}/output && "
            f"awk '{{s += $1}} END {{print s}}' {ws}/input/numbers.txt > {ws}/output/total.txt",
        ),
        call("read_file", path="output/total.txt"),
        call("submit"),
    ]
    traj = run_scripted([task], {"task_sum": solution}, tokenizer, shell=True)["task_sum"]
    assert traj.infra_error is None and traj.termination == Termination.submitted
    pwd, write, read = (s.tool_results[0] for s in traj.steps[:3])
    assert pwd.output == f"{ws}\n[exit code 0]"  # commands start in the workspace, at its own path
    assert write.ok, write.output
    assert read.ok and read.output.strip().startswith("12"), read.output  # the file tools see the write
    assert traj.grade.score == 1.0 and traj.grade.passed  # and so does reward.sh


# -- PinchBench -----------------------------------------------------------------------------------

SHOUT = "HELLO FROM THE FIXTURE"


def test_pinchbench_loads_and_leaves_judge_only_tasks_out_without_a_judge():
    suite = get_suite(f"pinchbench:{FIXTURES / 'pinchbench'}")
    assert [t.id for t in suite.tasks("dev")] == ["pinchbench/dev/task_01_shout", "pinchbench/dev/task_02_summary"]
    assert "task_03_poem" in suite.skipped and "no judge" in suite.skipped["task_03_poem"]
    assert "1 left out" in suite.description
    env = suite.tasks("dev")[0].make_env()
    try:  # workspace_files: source in assets/ -> dest in the workspace
        assert env.workspace.read("input/greeting.txt") == "hello from the fixture\n"
        # the shell sees the workspace where PinchBench's graders are told it is
        assert env.workspace_mount == "/tmp/pinchbench/harnessrl/agent_workspace"
    finally:
        env.close()
    # the tasks folder itself works too (assets/ next to it)
    assert len(PinchBenchSuite(FIXTURES / "pinchbench" / "tasks").tasks("dev")) == 2


@needs_bwrap
def test_pinchbench_grade_runs_on_transcript_and_workspace(tokenizer):
    suite = PinchBenchSuite(FIXTURES / "pinchbench")
    summary = [
        call("write_file", path="summary.txt", content="Meeting moved to Thursday.\nBring the budget sheet.\n"),
        call("submit"),
    ]
    right = run_scripted(
        suite.tasks("dev"),
        {
            "task_01_shout": [
                call("read_file", path="input/greeting.txt"),
                call("write_file", path="shout.txt", content=SHOUT),
                call("submit"),
            ],
            "task_02_summary": summary,
        },
        tokenizer,
    )
    shout = right["task_01_shout"].grade
    assert shout.score == 1.0 and shout.passed
    assert shout.subscores == {"shout_correct": 1.0, "read_input": 1.0}  # "note" is not a number
    assert shout.details["ignored_non_numeric"] == ["note"]
    # the agent never read the input (the transcript shows it): partial credit
    wrong = run_scripted(
        suite.tasks("dev"),
        {"task_01_shout": [call("write_file", path="shout.txt", content=SHOUT), call("submit")]},
        tokenizer,
    )
    assert wrong["task_01_shout"].grade.score == 0.5

    hybrid = right["task_02_summary"].grade
    # the judge part is ungraded, not zero: the score is the automated part, flagged as partial
    assert hybrid.score == 1.0
    assert hybrid.subscores == {"automated.two_lines": 1.0}
    assert hybrid.details["partially_graded"] is True
    assert hybrid.details["ungraded"] == ["llm_judge"]
    assert hybrid.details["ungraded_weight"] == pytest.approx(0.6)


@needs_bwrap
def test_pinchbench_judge_grades_the_judged_parts(tokenizer):
    prompts: list[str] = []

    def judge(prompt: str) -> str:
        prompts.append(prompt)
        return 'Here you go: {"scores": {"faithful": 0.5}, "total": 0.5, "notes": "one fact lost"}'

    suite = PinchBenchSuite(FIXTURES / "pinchbench", judge=judge)
    assert [t.data["native_id"] for t in suite.tasks("dev")] == ["task_01_shout", "task_02_summary", "task_03_poem"]
    out = run_scripted(
        suite.tasks("dev")[1:],
        {
            "task_02_summary": [call("write_file", path="summary.txt", content="a\nb\n"), call("submit")],
            "task_03_poem": [call("submit", answer="done")],
        },
        tokenizer,
    )
    hybrid = out["task_02_summary"].grade
    assert hybrid.score == pytest.approx((1.0 * 0.4 + 0.5 * 0.6) / 1.0)
    assert hybrid.subscores == {"automated.two_lines": 1.0, "llm_judge.faithful": 0.5}
    assert hybrid.details["partially_graded"] is False and hybrid.details["ungraded_weight"] == 0.0
    assert out["task_03_poem"].grade.score == 0.5
    assert any("Tool: write_file" in p and "## Grading Rubric" in p for p in prompts)
    with pytest.raises(Exception, match="no JSON score"):
        parse_judge_reply("looks fine to me")


def test_a_model_as_judge(tokenizer):
    from harnessrl.models.scripted import ScriptedPolicy

    seen = []

    def reply(messages):
        seen.append(messages[-1].content)
        return '{"scores": {"quality": 0.25, "tides": 0.75}, "notes": "ok"}'

    judge = policy_judge(ScriptedPolicy(reply, tokenizer=tokenizer))
    assert parse_judge_reply(judge("grade this")) == (0.5, {"quality": 0.25, "tides": 0.75}, "ok")
    assert seen == ["grade this"]


def test_transcript_is_openclaw_session_events():
    from harnessrl.tasks.base import Environment

    env = Environment(
        calls=[("read_file", {"path": "a.txt"}, "text"), ("submit", {"answer": "ok"}, "Submitted.")], answer="ok"
    )
    events = openclaw_transcript(env, "do it", "/w")
    assert events[0]["type"] == "session" and events[0]["cwd"] == "/w"
    roles = [e["message"]["role"] for e in events[1:]]
    assert roles == ["user", "assistant", "toolResult", "assistant"]
    tool_call = events[2]["message"]["content"][0]
    assert tool_call["type"] == "toolCall" and tool_call["name"] == "read_file"
    assert tool_call["arguments"] == tool_call["params"] == {"path": "a.txt"}
    assert events[3]["message"]["toolCallId"] == tool_call["id"]
    assert events[4]["message"]["content"] == [{"type": "text", "text": "ok"}]
    json.dumps(events)


# -- Harbor ---------------------------------------------------------------------------------------


def test_harbor_loads_and_refuses_a_task_that_needs_its_image_built(tokenizer):
    suite = get_suite(f"harbor:{FIXTURES / 'harbor'}")
    by_name = {t.data["native_id"]: t for t in suite.tasks("dev")}
    assert set(by_name) == {"copy-config", "json-reward", "needs-build"}
    assert "1 not runnable" in suite.description
    with pytest.raises(TaskLoadError, match=r"needs its Docker environment built.*line 3: RUN apt-get"):
        by_name["needs-build"].make_env()
    env = by_name["copy-config"].make_env()
    try:  # COPY service.ini /app/service.ini -> into the workspace shown at /app
        assert env.workspace.read("service.ini").startswith("[service]")
    finally:
        env.close()
    # through the runner: an infrastructure error with the reason, before any model call
    out = run_scripted([by_name["needs-build"]], {}, tokenizer)
    assert out["needs-build"].termination == Termination.error
    assert "needs its Docker environment built" in out["needs-build"].infra_error
    assert out["needs-build"].steps == []


@needs_bwrap
def test_harbor_test_sh_writes_the_reward(tokenizer):
    tasks = [t for t in HarborSuite(FIXTURES / "harbor").tasks("dev") if t.data["native_id"] != "needs-build"]
    right = run_scripted(
        tasks,
        {
            "copy-config": [
                call("read_file", path="service.ini"),
                call("write_file", path="port.txt", content="8080\n"),
                call("submit"),
            ],
            "json-reward": [
                call("write_file", path="done.txt", content="done\n"),
                call("write_file", path="extra.txt", content="x"),
                call("submit"),
            ],
        },
        tokenizer,
    )
    # test.sh checks its cwd is /app, the Dockerfile ENV, [verifier].env and /tests; exit 1 is not the score
    assert right["copy-config"].grade.score == 1.0, right["copy-config"].infra_error
    assert right["copy-config"].grade.details["test_sh_exit_status"] == 1
    assert right["json-reward"].grade.score == 1.0
    assert right["json-reward"].grade.details["rewards"] == {"reward": 1.0, "done_file": 1.0, "runtime_sec": 1.5}
    wrong = run_scripted(
        tasks,
        {
            "copy-config": [call("write_file", path="port.txt", content="80\n"), call("submit")],
            "json-reward": [call("write_file", path="done.txt", content="done\n"), call("submit")],
        },
        tokenizer,
    )
    assert wrong["copy-config"].grade.score == 0.0
    assert wrong["json-reward"].grade.score == 0.5


@needs_bwrap
def test_harbor_shell_starts_in_the_working_directory(tokenizer):
    (task,) = [t for t in HarborSuite(FIXTURES / "harbor").tasks("dev") if t.data["native_id"] == "copy-config"]
    assert task.workspace_mount == "/app"
    solution = [
        call("shell", command="pwd; ls"),
        call("shell", command="sed -n 's/^port = //p' service.ini > /app/port.txt"),
        call("submit"),
    ]
    traj = run_scripted([task], {"copy-config": solution}, tokenizer, shell=True)["copy-config"]
    assert traj.infra_error is None, traj.infra_error
    listing = traj.steps[0].tool_results[0]
    assert listing.output == "/app\nservice.ini\n[exit code 0]"
    assert traj.grade.score == 1.0  # test.sh reads /app/port.txt


@pytest.mark.parametrize(
    "dockerfile, refused",
    [
        ("FROM python:3.12\nWORKDIR /srv/app\nCOPY . .\n", None),  # /srv: a data folder, shadowed
        ("FROM a AS build\nFROM b\n", "multi-stage"),
        ("FROM a\nCOPY --from=build /x /app/x\n", "another image"),
        ("FROM a\nWORKDIR /app\nCOPY data.txt /etc/data.txt\n", "outside the working directory"),
        ("FROM a\nADD https://example.com/x.tar /app/\n", "downloads"),
        ("FROM a\nWORKDIR /app\nADD data.tar.gz /app/\n", "unpacks the archive"),
        ("FROM a\n# comment\nRUN echo \\\n  hi\n", "line 3: RUN echo"),
        ("FROM a\nWORKDIR /usr/src/app\n", "cannot run in the sandbox"),
        ("FROM a\nWORKDIR /home/dev/app\n", None),  # /home: hidden behind a fresh tmpfs
        ("FROM a\nWORKDIR /logs/app\n", "reserved path"),
    ],
)
def test_harbor_dockerfile_rule(tmp_path, dockerfile, refused):
    task = copy_fixture(FIXTURES / "harbor" / "json-reward", tmp_path / "t")
    (task / "environment").mkdir()
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "environment" / "data.txt").write_text("x")
    (entry,) = HarborSuite(task).entries
    if refused is None:
        workdir = dockerfile.split("WORKDIR ")[1].split("\n")[0]
        assert entry.error is None and entry.data["workdir"] == workdir and entry.workspace_mount == workdir
    else:
        assert entry.error is not None and refused in entry.error


def test_harbor_refuses_prebuilt_images_and_compose(tmp_path):
    task = copy_fixture(FIXTURES / "harbor" / "json-reward", tmp_path / "image")
    (task / "task.toml").write_text('version = "1.0"\n[environment]\ndocker_image = "org/img:1"\n')
    compose = copy_fixture(FIXTURES / "harbor" / "json-reward", tmp_path / "compose")
    (compose / "environment").mkdir()
    (compose / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    errors = {e.native_id: e.error for e in HarborSuite(tmp_path).entries}
    assert "pre-built image" in errors["image"]
    assert "docker-compose.yaml defines services" in errors["compose"]


def test_harbor_verifier_env_takes_variables_from_this_process(monkeypatch):
    monkeypatch.setenv("HARNESSRL_FIXTURE_KEY", "k-123")
    monkeypatch.delenv("HARNESSRL_FIXTURE_UNSET", raising=False)
    env = {"A": "plain", "B": "${HARNESSRL_FIXTURE_KEY}", "C": "${HARNESSRL_FIXTURE_UNSET:-fallback}", "D": 3}
    assert resolve_verifier_env(env, "t") == {"A": "plain", "B": "k-123", "C": "fallback", "D": "3"}
    with pytest.raises(GraderError, match=r"needs \$\{HARNESSRL_FIXTURE_UNSET\}, which is not set"):
        resolve_verifier_env({"E": "${HARNESSRL_FIXTURE_UNSET}"}, "t")


def test_dockerfile_continuations_and_comments():
    text = "# top\nFROM a\nRUN one \\\n  # inner comment\n  two\nENV A=1 B=2\n"
    assert dockerfile_instructions(text) == [(2, "FROM", "a"), (3, "RUN", "one two"), (6, "ENV", "A=1 B=2")]


# -- bad input ------------------------------------------------------------------------------------


def _clawgym_broken(root: Path) -> Path:
    good = FIXTURES / "clawgym" / "task_sum"
    copy_fixture(good, root / "a_good")
    variants = {
        "b_missing_reward": lambda d: (d / "reward" / "reward.sh").unlink(),
        "c_malformed_json": lambda d: (d / "data_entry.json").write_text('{"task_id": "x", '),
        "d_crash": lambda d: (d / "reward" / "reward.sh").write_text("echo boom >&2\nexit 3\n"),
        "e_hang": lambda d: (d / "reward" / "reward.sh").write_text("sleep 30\necho 1\n"),
        "f_garbage": lambda d: (d / "reward" / "reward.sh").write_text("echo 'all good!'\n"),
        "g_out_of_range": lambda d: (d / "reward" / "reward.sh").write_text("echo 1.5\n"),
        "h_no_query": lambda d: (d / "data_entry.json").write_text('{"task_id": "x", "metadata": {}}'),
    }
    for name, breaks in variants.items():
        breaks(copy_fixture(good, root / name))
    return root


@needs_bwrap
def test_broken_clawgym_tasks_are_infra_errors_and_the_rest_finishes(tmp_path, tokenizer):
    suite = ClawGymSuite(_clawgym_broken(tmp_path / "clawgym"), grader_limits=ExecLimits(wall_s=2.0, cpu_s=5))
    assert "3 not runnable" in suite.description  # missing file, malformed JSON, no user_query
    expected = {
        "b_missing_reward": "missing reward/reward.sh",
        "c_malformed_json": "malformed data_entry.json",
        "d_crash": "exit status 3",
        "e_hang": "grader hung: no result within 2 s",
        "f_garbage": "not a number: 'all good!'",
        "g_out_of_range": "1.5 is outside [0, 1]",
        "h_no_query": "'user_query' must be a str",
    }
    out = run_broken(suite, CLAWGYM_RIGHT["task_sum"], "a_good", expected, tokenizer)
    assert "boom" in out["d_crash"].infra_error  # the grader's stderr is part of the reason
    assert out["b_missing_reward"].steps == [] and len(out["d_crash"].steps) > 0


PB_TASK = (FIXTURES / "pinchbench" / "tasks" / "task_01_shout.md").read_text()


@needs_bwrap
def test_broken_pinchbench_tasks_are_infra_errors(tmp_path, tokenizer):
    tasks_dir = tmp_path / "skill" / "tasks"
    tasks_dir.mkdir(parents=True)
    shutil.copytree(FIXTURES / "pinchbench" / "assets", tmp_path / "skill" / "assets")
    body = PB_TASK.split("def grade(transcript: list, workspace_path: str) -> dict:")[0]
    files = {
        "task_a.md": PB_TASK,
        "task_b.md": "no front matter here\n## Prompt\nhi\n",
        "task_c.md": PB_TASK.replace("id: task_01_shout", "id: [unclosed"),
        "task_d.md": body + "def grade(transcript, workspace_path):\n    raise RuntimeError('grader bug')\n```\n",
        "task_e.md": body + "def grade(transcript, workspace_path):\n    while True:\n        pass\n```\n",
        "task_f.md": body + "def grade(transcript, workspace_path):\n    return 'perfect'\n```\n",
        "task_g.md": PB_TASK.replace("source: greeting.txt", "source: missing.txt"),
        "task_h.md": PB_TASK.replace("```python", "```text"),
        "task_i.md": PB_TASK.replace("id: task_01_shout", "id: task_a"),  # task_a.md's id again
    }
    for name, text in files.items():
        text = text.replace("id: task_01_shout", f"id: {name[:-3]}").replace("## Prompt\n", f"## Prompt\n({name})")
        (tasks_dir / name).write_text(text)
    suite = PinchBenchSuite(tmp_path / "skill", grader_limits=ExecLimits(wall_s=2.0, cpu_s=5))
    solution = [
        call("read_file", path="input/greeting.txt"),
        call("write_file", path="shout.txt", content=SHOUT),
        call("submit"),
    ]
    expected = {
        "task_b": "no YAML front matter",
        "task_c": "malformed YAML front matter",
        "task_d": "RuntimeError: grader bug",
        "task_e": "grader hung",
        "task_f": "grade() returned str, not a dict",
        "task_g": "workspace file source not found",
        "task_h": "needs a ```python block",
        "task_a-2": "task id 'task_a' occurs more than once",
    }
    run_broken(suite, solution, "task_a", expected, tokenizer)


@needs_bwrap
def test_broken_harbor_tasks_are_infra_errors(tmp_path, tokenizer):
    good = FIXTURES / "harbor" / "json-reward"
    copy_fixture(good, tmp_path / "a_good")
    (copy_fixture(good, tmp_path / "b_bad_toml") / "task.toml").write_text("[verifier\ntimeout_sec = 1\n")
    (copy_fixture(good, tmp_path / "c_no_test") / "tests" / "test.sh").unlink()
    (copy_fixture(good, tmp_path / "d_no_reward") / "tests" / "test.sh").write_text("echo ran; exit 0\n")
    (copy_fixture(good, tmp_path / "e_garbage") / "tests" / "test.sh").write_text(
        "echo great > /logs/verifier/reward.txt\n"
    )
    (copy_fixture(good, tmp_path / "f_hang") / "tests" / "test.sh").write_text("sleep 30\n")
    (copy_fixture(good, tmp_path / "g_no_instruction") / "instruction.md").unlink()
    suite = HarborSuite(tmp_path, grader_limits=ExecLimits(wall_s=2.0, cpu_s=5))
    solution = [
        call("write_file", path="done.txt", content="done\n"),
        call("write_file", path="extra.txt", content="x"),
        call("submit"),
    ]
    expected = {
        "b_bad_toml": "malformed task.toml",
        "c_no_test": "missing tests/test.sh",
        "d_no_reward": "wrote no /logs/verifier/reward.txt or reward.json",
        "e_garbage": "reward.txt is not a number: 'great'",
        "f_hang": "grader hung",
        "g_no_instruction": "missing instruction.md",
    }
    out = run_broken(suite, solution, "a_good", expected, tokenizer)
    assert "ran" in out["d_no_reward"].infra_error


def test_a_folder_without_tasks_is_an_error_at_start(tmp_path):
    (tmp_path / "empty").mkdir()
    for kind in ("clawgym", "pinchbench", "harbor"):
        with pytest.raises(ValueError, match=f"{kind}: no tasks found in .*expected layout"):
            get_suite(f"{kind}:{tmp_path / 'empty'}")
    with pytest.raises(ValueError, match="is not a folder"):
        get_suite(f"harbor:{tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match="give the folder after the colon"):
        get_suite("clawgym:")


def test_cli_lists_an_imported_suite(tmp_path):
    cli = CliRunner()
    r = cli.invoke(app, ["tasks", "list", "--suite", f"clawgym:{FIXTURES / 'clawgym'}"])
    assert r.exit_code == 0, r.output
    assert "arithmetic" in r.output and "2 tasks from" in r.output
    r = cli.invoke(app, ["tasks", "list", "--suite", f"harbor:{tmp_path}"])
    assert r.exit_code != 0 and "no tasks found" in r.output
