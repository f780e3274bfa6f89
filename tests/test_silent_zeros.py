"""No silent zeros: an episode whose agent program made no model call for a reason that is not the
model's is an infrastructure error with that reason (retried, counted in `infra`), never a scored 0.

One test per case, each through the runner with a real sandbox and recording endpoint: the first
request refused (400), the program not found (exit 127, and through the sandbox's relay), a crash
before the first call, the sandbox's own limits before the first call (file size, processes,
memory: each named with the spec field that raises it), and bubblewrap refusing a mount. Then the
jobs: `eval` and `train grpo` refuse, before any episode, a harness whose first request could not be
measured (exit 2, the reason and the fix), and with --no-preflight run it, record the infrastructure
errors and exit 3; `evolve` whose every episode failed exits 3 with the first error, not a traceback.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec
from harnessrl.jobs.measured import tally
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite, sandbox_exec
from harnessrl.tasks.sandbox_exec import ExecLimits, ExecResult, bwrap_refusal, isolation_available
from harnessrl.tasks.sandbox_limits import not_started, sandbox_limit
from harnessrl.types import Termination

# Each agent: a few lines of the standard library run by `{python} -c`; each ends in one model
# call that is never reached (or refused), so whatever it did before is what the episode shows.
ASK = (
    "import json, os, urllib.request\n"
    "body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 4})\n"
    "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=body.encode(),\n"
    "                                 headers={'Content-Type': 'application/json'})\n"
    "print(urllib.request.urlopen(request).read())\n"
)
REFUSED = (
    "import os, sys, urllib.request, urllib.error\n"
    "request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', data=b'{\"model\": 1}',\n"
    "                                 headers={'Content-Type': 'application/json'})\n"
    "try:\n"
    "    urllib.request.urlopen(request)\n"
    "except urllib.error.HTTPError as e:\n"
    "    sys.exit(f'refused: {e.code}')\n"
)
BIG_FILE = "import os\nopen(os.path.join(os.environ['HOME'], 'unpacked.bin'), 'wb').write(b'x' * (3 << 20))\n" + ASK
FORKS = (
    "import os, time\nfor _ in range(16):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)\n" + ASK
)
MEMORY = "blob = bytearray(512 << 20)\n" + ASK
CRASH = "import sys\nsys.exit('crashed while loading its settings, before any call')\n" + ASK


def spec(command, name: str = "agent", **limits) -> ExternalHarnessSpec:
    data = {
        "name": name,
        "kind": "external",
        "command": command,
        "limits": {"wall_s": 20, "max_model_calls": 2, **limits},
    }
    parsed = parse_spec(data)
    assert isinstance(parsed, ExternalHarnessSpec)
    return parsed


def python(code: str, name: str = "agent", **limits) -> ExternalHarnessSpec:
    return spec(["{python}", "-c", code], name, **limits)


def task():
    return get_suite("workspace").tasks("dev", 1)[0]


def play(agent: ExternalHarnessSpec, tokenizer, retries: int = 0):
    policy = ScriptedPolicy(["a reply"] * 8, tokenizer=tokenizer, name="replies")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, max_retries=retries, progress=False)
    [trajectory] = runner.run(make_jobs([task()], [agent], 1))
    return trajectory


def check_infra(trajectory, *words: str) -> str:
    """The episode is an infrastructure error (never graded, never a 0) whose reason holds `words`."""
    assert trajectory.termination == Termination.error and trajectory.is_infra_error, trajectory.termination_detail
    assert trajectory.grade is None and not trajectory.steps and not trajectory.submitted
    reason = trajectory.infra_error or ""
    for word in words:
        assert word in reason, reason
    return reason


# ------------------------------------------------------------------------------ one episode each


def test_a_first_request_refused_with_400_is_an_infrastructure_error_with_the_refusal(tokenizer):
    trajectory = play(python(REFUSED), tokenizer)
    check_infra(trajectory, "the agent's POST /v1/chat/completions got 400", "the agent made no model call")
    assert trajectory.refused_requests and trajectory.refused_requests[0].status == 400


@pytest.mark.parametrize(
    "command",
    [
        "no-such-agent-program-xyz --go",  # a string command: the sandbox's shell says "not found", 127
        ["no-such-agent-program-xyz", "--go"],  # an argv command: the exec itself fails
    ],
)
def test_a_program_not_found_is_an_infrastructure_error_retried_per_retries(command, tokenizer):
    trajectory = play(spec(command), tokenizer, retries=1)
    check_infra(trajectory, "'no-such-agent-program-xyz' was not found in the sandbox", "made no model call")
    assert trajectory.retries == 1  # retried like every infrastructure error, then recorded as one


def test_a_crash_before_the_first_call_is_an_infrastructure_error_with_its_stderr(tokenizer):
    check_infra(play(python(CRASH), tokenizer), "exit code 1", "crashed while loading its settings, before any call")


@pytest.mark.parametrize(
    "code, limits, named",
    [
        (BIG_FILE, {"file_size_mb": 1}, "limits.file_size_mb (1 MB)"),
        (FORKS, {"processes": 6}, "limits.processes (6 processes and threads)"),
        (MEMORY, {"memory_mb": 256}, "limits.memory_mb (256 MB of address space per process)"),
    ],
)
def test_a_sandbox_limit_before_the_first_call_names_the_limit_and_how_to_raise_it(code, limits, named, tokenizer):
    reason = check_infra(play(python(code, **limits), tokenizer), named)
    field = named.split(" ")[0]
    assert f"raise {field}" in reason


@pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap does not work here")
def test_a_mount_bubblewrap_refuses_is_an_infrastructure_error_with_its_message(tokenizer, monkeypatch):
    """A bind source gone between the checks and bwrap's start: bwrap exits 1 before the program runs."""
    argv = sandbox_exec._bwrap_argv

    def with_a_missing_source(*args, **kwargs):
        return [*argv(*args, **kwargs)[:1], "--ro-bind", "/nonexistent-harnessrl-source", "/opt/gone"] + argv(
            *args, **kwargs
        )[1:]

    monkeypatch.setattr(sandbox_exec, "_bwrap_argv", with_a_missing_source)
    check_infra(
        play(spec(["sh", "-c", "echo never reached"]), tokenizer),  # no {python}: its probe runs in a sandbox too
        "cannot start the agent program: bubblewrap refused to start the command: ",
        "bwrap: Can't find source path /nonexistent-harnessrl-source",
    )


@pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap does not work here")
def test_a_refused_sandbox_is_never_a_failed_command_of_the_shell_tool(monkeypatch):
    """The same refusal under the shell tool (and a grader, which runs the same way) raises: the
    loop records a crashed tool, an infrastructure error, where an exit status 1 would have been
    shown to the model as its command's failure."""
    from harnessrl.tasks.sandbox_exec import SandboxRefused, run_sandboxed
    from harnessrl.tasks.shell import shell_tool

    argv = sandbox_exec._bwrap_argv
    monkeypatch.setattr(
        sandbox_exec,
        "_bwrap_argv",
        lambda *a, **k: [*argv(*a, **k)[:1], "--bind", "/nonexistent-x", "/opt/x", *argv(*a, **k)[1:]],
    )
    env = task().make_env()
    try:
        with pytest.raises(SandboxRefused, match="bwrap: Can't find source path /nonexistent-x"):
            run_sandboxed(["true"], workdir=env.workspace.root)
        with pytest.raises(RuntimeError, match="the shell cannot run this task's commands: bubblewrap refused"):
            shell_tool(ExecLimits(), 1000).fn(env, "echo hi")
    finally:
        env.close()


def test_the_signs_of_each_limit_and_of_a_missing_program():
    """What real programs print: Node ignores SIGXFSZ and says EFBIG, a spawn that cannot fork
    says EAGAIN; a signal the sandbox reports names the limit too."""

    def ended(code: int | None, stderr: str = "", reason: str = "") -> ExecResult:
        return ExecResult(code, "", stderr, False, False, 1.0, "bwrap", reason=reason)

    limits = ExecLimits(file_size_mb=64, processes=64, memory_mb=4096)
    cases = {
        "Error: EFBIG: file too large, write": "limits.file_size_mb (64 MB)",
        "Error: spawn /bin/sh EAGAIN": "limits.processes (64 processes and threads)",
        "bash: fork: retry: Resource temporarily unavailable": "limits.processes (64",
        "runtime: failed to create new OS thread (have 7 already; errno=11)": "limits.processes (64",
        "Assertion `(0) == (uv_thread_create(t.get(), start_thread, this))' failed.": "limits.processes (64",
        "fatal error: runtime: out of memory": "limits.memory_mb (4096",
        "fatal error: Failed to reserve virtual memory for CodeRange": "limits.memory_mb (4096 MB",
        "OSError: [Errno 28] No space left on device": "limits.disk_mb (1024 MB)",
    }
    for stderr, named in cases.items():
        assert named in sandbox_limit(ended(1, stderr), limits), stderr
    assert "limits.file_size_mb" in sandbox_limit(ended(153, reason="file size limit of 64 MB exceeded"), limits)
    assert sandbox_limit(ended(1, "Traceback: KeyError: 'x'"), limits) == ""
    assert sandbox_limit(ended(0, "EFBIG"), limits) == ""  # a program that ended well was stopped by nothing
    assert "not found" in not_started(ended(127, "sh: 1: agent: not found"), "agent")
    assert not_started(ended(1, "ValueError: No such file or directory"), "agent") == ""  # its own error
    assert (
        bwrap_refusal(1, "bwrap: Can't mkdir /x: Read-only file system\n")
        == "bwrap: Can't mkdir /x: Read-only file system"
    )
    assert bwrap_refusal(1, "Traceback ...\nbwrap: x") == "" and bwrap_refusal(2, "bwrap: x") == ""


# ---------------------------------------------------------------------------------------- the jobs


def missing_agent(folder: Path) -> Path:
    path = folder / "missing.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "missing",
                "kind": "external",
                "command": ["no-such-agent-program-xyz"],
                "limits": {"wall_s": 20, "max_model_calls": 2},
            }
        )
    )
    return path


def infra_episodes(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT count(*), sum(infra) FROM episodes").fetchone()


def test_eval_refuses_an_agent_that_made_no_first_request_and_without_preflight_exits_3(tmp_path):
    out = tmp_path / "run"
    args = ["eval", "-H", str(missing_agent(tmp_path)), "--suite", "workspace", "--tasks", "2"]
    args += ["--model", "tiny-random", "--retries", "1", "--no-progress", "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "harness missing: no first request measured on workspace/dev/" in r.output
    assert "'no-such-agent-program-xyz' was not found in the sandbox" in r.output
    assert "Fix: the program was not found in the sandbox" in r.output and "--no-preflight" in r.output
    assert not (out / "run.db").exists()  # no episode ran
    r = CliRunner().invoke(app, [*args, "--no-preflight"])
    assert r.exit_code == 3, r.output
    assert "every episode of the run (2) was an infrastructure error, so nothing was measured" in r.output
    assert "was not found in the sandbox" in r.output  # the first error
    assert infra_episodes(out / "run.db") == (2, 2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["harnesses"]["missing"]["n_infra_errors"] == 2 and summary["harnesses"]["missing"]["n_episodes"] == 0
    r = CliRunner().invoke(app, ["triage", str(out)])
    assert r.exit_code == 0 and "infra" in r.output.lower(), r.output


def test_train_grpo_refuses_an_agent_that_made_no_first_request_and_without_preflight_exits_3(tmp_path):
    out = tmp_path / "train"
    args = ["train", "grpo", "--harnesses", str(missing_agent(tmp_path)), "--scheduler", "single:missing"]
    args += ["--suite", "workspace", "--model", "tiny-random", "--steps", "1", "--tasks-per-step", "2"]
    args += ["--retries", "0", "--no-progress", "--out", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert "harness missing: no first request measured on workspace/train/" in r.output
    assert not (out / "rollouts").exists() and not (out / "adapter").exists()  # nothing ran, nothing trained
    r = CliRunner().invoke(app, [*args, "--no-preflight"])
    assert r.exit_code == 3, r.output
    assert "was an infrastructure error, so nothing was measured; the first: the program" in r.output
    counted = tally(out)
    assert counted.episodes > 0 and counted.infra == counted.episodes and "not found" in counted.first


def test_evolve_whose_every_episode_failed_exits_3_with_the_first_error(tmp_path):
    """A model server that is not there: every episode is an infrastructure error; the noise
    estimate then has no scored task, and the run says why instead of a traceback."""
    out = tmp_path / "evo"
    args = ["evolve", "--model", "openai:m@http://127.0.0.1:9/v1", "--suite", "toolcalc", "--dev-tasks", "2"]
    args += ["--test-tasks", "2", "--iterations", "1", "--rollouts", "1", "--retries", "0", "--no-progress"]
    r = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 3, r.output
    assert "every episode of the run (4) was an infrastructure error, so nothing was measured" in r.output
    assert "model backend failed" in r.output and "evolve stopped: the noise estimate needs" in r.output
    assert tally(out).infra == 4


def test_preflight_needs_measures_what_an_agent_took_of_the_sandbox_to_make_its_first_call(tmp_path):
    """`harnessrl preflight --needs`: the agent that unpacks 3 MB into its HOME (the file-size test
    above) runs with its limits out of the way; its file, its processes and its address space are
    measured, and the first call is made."""
    agent = tmp_path / "unpacks.yaml"
    code = BIG_FILE.replace("\n" + ASK, "\nimport time\ntime.sleep(1)\n" + ASK)
    agent.write_text(
        yaml.safe_dump(
            {"name": "unpacks", "kind": "external", "command": ["{python}", "-c", code], "limits": {"file_size_mb": 1}}
        )
    )
    r = CliRunner().invoke(app, ["preflight", "--needs", "--json", "-H", str(agent), "--suite", "workspace"])
    assert r.exit_code == 0, r.output
    [needs] = json.loads(r.output[r.output.index("[") :])
    use = needs["use"]
    assert needs["harness"] == "unpacks" and needs["note"] == ""  # the first call was made under roomy limits
    assert use["largest_file"] == "home/unpacked.bin" and use["largest_file_mb"] == 3.0
    assert use["written_mb"] >= 3.0 and use["processes"] >= 2 and use["tasks"] >= use["processes"]
    assert use["address_space_mb"] > 10 and use["resident_mb"] > 5


def test_a_trainer_that_kept_no_rollouts_is_counted_from_its_metrics(tmp_path):
    """--no-save-rollouts: no run database, so the steps' episodes and infra_errors are counted."""
    from harnessrl.jobs.measured import nothing_measured

    lines = [{"step": 1, "episodes": 8, "infra_errors": 8}, {"step": 2, "episodes": 8, "infra_errors": 8}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    counted = tally(tmp_path)
    assert (counted.episodes, counted.infra) == (16, 16)
    assert nothing_measured(tmp_path) == (
        "every episode of the run (16) was an infrastructure error, so nothing was measured; the first: not kept "
        "(the run kept no episodes: see its metrics.jsonl)"
    )
    lines.append({"step": 3, "episodes": 8, "infra_errors": 7})  # one episode measured: not refused
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert nothing_measured(tmp_path) is None
    assert nothing_measured(tmp_path / "absent") is None  # no run: nothing to say


# A first request whose stop_token_ids name ids past the vocabulary, then the same request without
# them: the episode records the refusal and the second call.
BAD_STOP_IDS = (
    "import json, os, sys, urllib.request, urllib.error\n"
    "def ask(extra):\n"
    "    body = {'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 4, **extra}\n"
    "    request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions',\n"
    "                                     data=json.dumps(body).encode(),\n"
    "                                     headers={'Content-Type': 'application/json'})\n"
    "    return urllib.request.urlopen(request).read()\n"
    "try:\n"
    "    ask({'stop_token_ids': [10 ** 9]})\n"
    "except urllib.error.HTTPError as e:\n"
    "    print('refused', e.code, e.read())\n"
    "print(ask({}))\n"
)


def test_a_stop_token_id_past_the_vocabulary_is_the_agents_400_never_an_infrastructure_error(tiny_policy):
    """The engine refuses such a request; were that a backend failure, an agent could make any
    episode an infrastructure error (never scored) at will. It is a 400 to the agent instead."""
    runner = Runner(tiny_policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    [trajectory] = runner.run(make_jobs([task()], [python(BAD_STOP_IDS)], 1))
    assert not trajectory.is_infra_error, trajectory.infra_error
    assert [r.status for r in trajectory.refused_requests] == [400]
    assert "stop_token_ids" in trajectory.refused_requests[0].message
    assert len(trajectory.steps) == 1
