"""What an episode may see: an agent program and the shell tool see their workspace, the system
and their own installed files, and nothing of the task's grader, other tasks, the user's home or
checkouts (under bubblewrap); without bubblewrap the run says that isolation is weaker and how;
a program the sandbox user cannot read is refused with what to do about it.

The searching agent is tests/fixtures/agents/behave.py `search`; the same search without
bubblewrap (as root: a uid of its own, everything world-readable visible) finds what it looks
for, so the test can tell isolation from a search that finds nothing anywhere.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

import pytest
from helpers import replies_policy

from harnessrl.harness.spec import ExternalHarnessSpec, load_spec, parse_spec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.rundir import RunFolder
from harnessrl.tasks import get_suite, sandbox_exec
from harnessrl.tasks.importers.clawgym import ClawGymSuite
from harnessrl.tasks.sandbox_exec import ExecLimits, isolation_available
from harnessrl.tasks.shell import shell_tool
from harnessrl.types import Termination

ROOT = Path(__file__).resolve().parents[1]
BEHAVE = ROOT / "tests" / "fixtures" / "agents" / "behave.py"
CLAWGYM = ROOT / "tests" / "fixtures" / "importers" / "clawgym"
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is missing or does not work here")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox changes the uid only when we are root")


def search_agent(names: list[str], paths: list[str], walk: bool) -> ExternalHarnessSpec:
    spec = parse_spec(
        {
            "name": "search",
            "kind": "external",
            "command": ["{python}", str(BEHAVE), "search"],
            "env": {"SEARCH_NAMES": ":".join(names), "SEARCH_PATHS": ":".join(paths), "SEARCH_WALK": str(int(walk))},
            "limits": {"wall_s": 60, "max_model_calls": 2},
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def run(specs, tasks, tokenizer):
    runner = Runner(replies_policy(["ok"], tokenizer), SamplingParams(temperature=0.0), max_in_flight=4, progress=False)
    return runner.run(make_jobs(tasks, specs, 1))


@pytest.fixture
def planted():
    """Marker files in the user's home and in a world-readable stand-in for another user's home
    (as root the real home is mode 0700: only bubblewrap's view could hide a readable one)."""
    name = f"harnessrl-marker-{uuid.uuid4().hex[:8]}"
    other_home = Path("/home") / f"harnessrl-test-home-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        other_home.mkdir(parents=True)
        other_home.chmod(0o755)
        made.append(other_home)
        (other_home / name).write_text("secret")
        (other_home / name).chmod(0o644)
    except OSError:  # /home not writable here: the real home alone
        pass
    home_marker = Path.home() / name
    home_marker.write_text("secret")
    made.append(home_marker)
    try:
        yield name, [other_home / name, home_marker]
    finally:
        for path in made:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def task_sum():
    suite = ClawGymSuite(CLAWGYM)
    return next(t for t in suite.tasks("dev") if t.data["native_id"] == "task_sum")


def search_targets(marker: str, markers: list[Path]) -> tuple[list[str], list[str]]:
    """(names, absolute paths) an agent looking for its grader would try."""
    grader = CLAWGYM / "task_sum" / "reward" / "check.py"
    names = ["reward.sh", "data_entry.json", "task_note", "task_sum", "importers", marker, "test_isolation.py"]
    paths = [str(grader), str(CLAWGYM / "task_note" / "data_entry.json"), str(ROOT / "pyproject.toml")]
    return names, paths + [str(m) for m in markers if m.exists()]


@needs_bwrap
def test_an_agent_searching_for_its_grader_other_tasks_and_the_users_home_finds_none(tokenizer, planted):
    marker, markers = planted
    names, paths = search_targets(marker, markers)
    [traj] = run([search_agent(names, paths, walk=True)], [task_sum()], tokenizer)
    out = traj.meta["agent"]["stdout"]
    assert traj.termination == Termination.submitted and traj.meta["agent"]["isolation"] == "bwrap", traj.meta["agent"]
    assert "found" not in out, out  # no grader, no other task, no marker, no checkout file
    assert "no harnessrl" in out, out  # it cannot rebuild its task from harnessrl's source either
    # the grader ran after it, in its own sandbox, with its files: the agent wrote nothing, so 0
    assert traj.grade is not None and not traj.grade.passed


@as_root
def test_without_bubblewrap_the_same_search_finds_them_and_the_run_says_so(tokenizer, planted, monkeypatch, tmp_path):
    marker, markers = planted
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    names, paths = search_targets(marker, markers)
    # a built-in task: the ClawGym one's workspace path needs bubblewrap's mounts
    task = next(t for t in get_suite("workspace").tasks("dev", 4))
    [traj] = run([search_agent(names, paths, walk=False)], [task], tokenizer)
    out = traj.meta["agent"]["stdout"]
    assert traj.meta["agent"]["isolation"] == "rlimits-only"
    grader = CLAWGYM / "task_sum" / "reward" / "check.py"
    assert f"found {grader}" in out and f"found {ROOT / 'pyproject.toml'}" in out, out
    if markers[0].exists():  # the stand-in home is world-readable: only file permissions guard it
        assert f"found {markers[0]}" in out
    folder = RunFolder(tmp_path / "run", "eval", {})
    with caplog_at_warning() as records:
        folder.record_shell_isolation([search_agent([], [], walk=False)], offers_shell=False)
    said = folder.config["shell_isolation"]
    assert said.startswith("rlimits-only") and "see the host's whole file system" in said and "bubblewrap" in said
    assert any("see the host's whole file system" in r.getMessage() for r in records)


class caplog_at_warning:
    """The warnings logged inside the block (rundir's logger)."""

    def __enter__(self) -> list[logging.LogRecord]:
        self.records: list[logging.LogRecord] = []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = self.records.append  # type: ignore[method-assign]
        logging.getLogger("harnessrl").addHandler(self.handler)
        return self.records

    def __exit__(self, *exc) -> None:
        logging.getLogger("harnessrl").removeHandler(self.handler)


@needs_bwrap
def test_the_shell_tool_sees_its_workspace_and_the_system_only(planted):
    marker, markers = planted
    task = task_sum()
    env = task.make_env()
    try:
        shell = shell_tool(ExecLimits(wall_s=20, processes=32), shown_chars=4000)
        grader = CLAWGYM / "task_sum" / "reward" / "check.py"
        command = (
            "pwd; ls input; ls -A /work /home /root /opt /srv 2>&1; "
            f"cat {grader} {markers[-1]} 2>&1; find / -xdev \\( -name reward.sh -o -name {marker} \\) 2>/dev/null; "
            "python3 -c 'print(2 + 3)'"
        )
        output = shell.fn(env, command=command).full
    finally:
        env.close()
    lines = output.splitlines()
    assert lines[:2] == ["/root/.openclaw/workspace", "numbers.txt"], output
    assert (
        "main" not in lines and "reward.sh" not in output and f"/{marker}" not in output.replace(str(markers[-1]), "")
    )
    assert "No such file or directory" in output and "5" in lines  # the system's python3 runs


@as_root
@pytest.mark.parametrize("isolation", ["bwrap", "rlimits-only"])
def test_a_program_the_sandbox_user_cannot_read_is_refused_with_what_to_do(tokenizer, isolation, monkeypatch):
    if isolation == "bwrap" and isolation_available() != "bwrap":
        pytest.skip("bubblewrap is missing or does not work here")
    if isolation == "rlimits-only":
        monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    private = Path(tempfile.mkdtemp(prefix="harnessrl-test-private-"))  # mode 0700, as `mktemp -d` makes
    try:
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        shutil.copy(BEHAVE, private / "agent.py")
        spec = parse_spec(
            {"name": "private", "kind": "external", "command": ["{python}", str(private / "agent.py"), "ask"]}
        )
        task = task_sum() if isolation == "bwrap" else get_suite("workspace").tasks("dev", 1)[0]
        [traj] = run([spec], [task], tokenizer)
    finally:
        shutil.rmtree(private)
    assert traj.termination == Termination.error and not traj.steps
    error = traj.infra_error or ""
    assert error.startswith("cannot start the agent program: cannot show")
    # the advice names the closed folder and never opens it (nor anything above the program)
    assert f"inside {private} (mode 700" in error and f"`chmod o+rx {private}`" in error, error
    assert "chmod -R" not in error and "mktemp -d" in error


def test_the_advice_for_a_program_in_a_closed_home_never_opens_the_home(monkeypatch):
    from harnessrl.tasks.sandbox_exec import unreadable_by_others

    top = Path(tempfile.mkdtemp(prefix="harnessrl-home-", dir="/tmp"))
    top.chmod(0o755)
    home = top / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").write_text("")
    home.chmod(0o700)
    monkeypatch.setenv("HOME", str(home))
    try:
        advice = unreadable_by_others(home / "venv" / "bin" / "python") or ""
    finally:
        shutil.rmtree(top)
    assert f"Leave {home} closed" in advice and "chmod" not in advice.replace("`chmod 755` the one it made", ""), advice


def test_an_agents_view_is_its_own_files_and_never_its_task_folder(tmp_path):
    """host_paths: a script shows itself, not its folder; a folder holding the task's folder is
    not shown whole, a read_only path holding it is refused, harnessrl's own source stays out."""
    from harnessrl.harness.agent_view import _HARNESSRL_SOURCE, host_paths

    tasks = tmp_path / "tasks"
    (tasks / "t1").mkdir(parents=True)
    script = tmp_path / "agent.py"
    script.write_text("")
    view = host_paths([str(script)], private=(tasks / "t1",))
    assert view.read_only == [script]  # tmp_path holds the task folder: the script alone
    own = tmp_path / "agent"
    own.mkdir()
    (own / "agent.py").write_text("")
    assert host_paths([str(own / "agent.py")], private=(tasks / "t1",)).read_only == [own / "agent.py"]
    package = tmp_path / "node_modules" / "@scope" / "cli"
    (package / "dist").mkdir(parents=True)
    (package / "dist" / "cli.js").write_text("")
    assert host_paths([str(package / "dist" / "cli.js")]).read_only == [package]  # its installed package
    with pytest.raises(ValueError, match="holds .*t1, which the agent must not see"):
        host_paths([], extra=[str(tasks)], private=(tasks / "t1",))
    python = host_paths(["{python}", "x.py"])
    assert Path(os.sys.prefix) in python.read_only
    assert not any(p == _HARNESSRL_SOURCE.parent or p == _HARNESSRL_SOURCE for p in python.read_only)


def test_a_string_command_shows_what_the_same_argv_command_shows(tmp_path):
    from harnessrl.harness.agent_view import host_paths

    own = tmp_path / "agent"
    own.mkdir()
    (own / "agent.py").write_text("")
    argv = host_paths(["/usr/bin/python3", str(own / "agent.py"), "--fast"])
    string = host_paths(["/bin/sh", "-c", f"AGENT_MODE=fast /usr/bin/python3 '{own / 'agent.py'}' --fast | cat"])
    assert own / "agent.py" in string.read_only and set(argv.read_only) <= set(string.read_only)
    assert host_paths(["/bin/sh", "-c", f"DATA={own} run-it"]).read_only[-1] == own  # an assignment's path


@needs_bwrap
def test_a_string_command_runs_its_script_in_the_sandbox(tokenizer):
    """A documented string command (`python3 /abs/agent.py`, run by /bin/sh -c, a variable set in
    it) sees its script under bubblewrap and makes its model call."""
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-string-agent-", dir="/tmp"))
    try:
        folder.chmod(0o755)  # the sandbox's user must be able to read it
        shutil.copy(BEHAVE, folder / "behave.py")
        (folder / "behave.py").chmod(0o644)
        spec = parse_spec(
            {
                "name": "string-agent",
                "kind": "external",
                "command": f"AGENT_MAX_TOKENS=8 /usr/bin/python3 {folder / 'behave.py'} ask",
                "limits": {"wall_s": 60, "max_model_calls": 2},
            }
        )
        (traj,) = run([spec], get_suite("toolcalc").tasks("dev", 1), tokenizer)
    finally:
        shutil.rmtree(folder)
    assert not traj.is_infra_error, traj.infra_error
    assert len(traj.steps) == 1 and traj.answer == "ok", (traj.termination, traj.termination_detail)


def test_openclaw_example_names_its_installed_files():
    spec = load_spec(ROOT / "examples" / "agents" / "openclaw.yaml")
    assert isinstance(spec, ExternalHarnessSpec)
    assert spec.read_only == [str(ROOT / ".agents" / "node"), str(ROOT / ".agents" / "openclaw")]  # not the others


def connect_agent(name: str, network: str, ports: list[int], bind: int | None = None) -> ExternalHarnessSpec:
    spec = parse_spec(
        {
            "name": name,
            "kind": "external",
            "command": ["{python}", str(BEHAVE), "connect"],
            "env": {"CONNECT_PORTS": ":".join(map(str, ports)), "BIND_PORT": str(bind or "")},
            "network": network,
            "limits": {"wall_s": 60, "max_model_calls": 2},
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


@pytest.fixture
def host_service():
    """A TCP port listening on the host's loopback (what a local server, `harnessrl serve` or
    vLLM, is to an agent)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@needs_bwrap
def test_an_agent_reaches_its_endpoint_and_no_other_host_port(tokenizer, host_service):
    [traj] = run([connect_agent("netns", "sandbox", [host_service])], [task_sum()], tokenizer)
    out = traj.meta["agent"]["stdout"]
    assert traj.termination == Termination.submitted and len(traj.steps) == 1, traj.meta["agent"]
    assert f"unreachable {host_service}" in out, out
    assert traj.meta["agent"]["network"] == "sandbox"


@needs_bwrap
def test_a_spec_may_ask_for_the_host_network_and_the_run_records_it(tokenizer, host_service):
    [traj] = run([connect_agent("hostnet", "host", [host_service])], [task_sum()], tokenizer)
    assert f"reached {host_service}" in traj.meta["agent"]["stdout"], traj.meta["agent"]
    assert traj.meta["agent"]["network"] == "host"


@needs_bwrap
def test_agents_binding_the_same_fixed_port_run_side_by_side(tokenizer):
    """Each agent's namespace has its own loopback: two programs listening on port 8080 at once
    both bind it (on the host's network the second would get 'address in use')."""
    specs = [connect_agent(f"bind{i}", "sandbox", [], bind=8080) for i in range(2)]
    trajs = run(specs, [task_sum()], tokenizer)
    assert [t.meta["agent"]["stdout"].count("bound 8080") for t in trajs] == [1, 1], [t.meta["agent"] for t in trajs]


@pytest.fixture
def project(tmp_path_factory):
    """An agent kept beside a project: its run folders and .env next to the command file."""
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-project-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        shutil.copy(BEHAVE, folder / "behave.py")
        (folder / "runs" / "old-run").mkdir(parents=True)
        (folder / "runs" / "old-run" / "trajectories.jsonl").write_text("{}")
        (folder / ".env").write_text("OPENAI_API_KEY=sk-secret")
        for path in (folder / "behave.py", folder / ".env", folder / "runs" / "old-run" / "trajectories.jsonl"):
            path.chmod(0o644)
        for path in (folder / "runs", folder / "runs" / "old-run"):
            path.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder)


@needs_bwrap
def test_a_command_file_shows_itself_and_not_the_project_beside_it(tokenizer, project):
    spec = parse_spec(
        {
            "name": "beside",
            "kind": "external",
            "command": ["/usr/bin/python3", str(project / "behave.py"), "search"],
            "env": {
                "SEARCH_PATHS": ":".join(str(project / p) for p in (".env", "runs", "behave.py")),
                "SEARCH_WALK": "0",
            },
            "limits": {"wall_s": 60, "max_model_calls": 2},
        }
    )
    [traj] = run([spec], [task_sum()], tokenizer)
    out = traj.meta["agent"]["stdout"]
    assert traj.termination == Termination.submitted, traj.meta["agent"]
    assert f"found {project / 'behave.py'}" in out and "found" not in out.replace(
        f"found {project / 'behave.py'}", ""
    ), out


@needs_bwrap
def test_harnessrl_installed_in_a_system_prefix_is_hidden_and_cannot_be_imported(monkeypatch):
    """harnessrl in a system-wide dist-packages (a scratch prefix standing for /usr, shown to the
    agent as /usr is): a program there finds its folder empty and `import harnessrl` refused."""
    import subprocess

    from harnessrl.harness import agent_view
    from harnessrl.tasks.sandbox_exec import run_sandboxed

    prefix = Path(tempfile.mkdtemp(prefix="harnessrl-prefix-", dir="/tmp"))
    try:
        prefix.chmod(0o755)
        site = prefix / "lib" / "python3" / "dist-packages"
        site.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(agent_view._HARNESSRL_SOURCE), str(site / "harnessrl")], check=True)
        subprocess.run(["chmod", "-R", "o+rX", str(prefix)], check=True)
        (prefix / "work").mkdir()
        monkeypatch.setattr(agent_view, "_HARNESSRL_SOURCE", site / "harnessrl")  # imported from there
        view = agent_view.host_paths(["/bin/sh", "-c", "python3 -c 'import harnessrl'"], extra=[str(prefix)])
        assert site / "harnessrl" in view.hidden
        probe = (
            "import os, sys; sys.path.insert(0, sys.argv[1]); print(sorted(os.listdir(sys.argv[1] + '/harnessrl')))\n"
            "try:\n import harnessrl; print('imported', harnessrl.__file__)\n"
            "except ImportError as e: print('refused:', e)"
        )
        result = run_sandboxed(
            ["/usr/bin/python3", "-c", probe, str(site)],
            workdir=prefix / "work",
            read_only=view.read_only,
            hidden=view.hidden,
            limits=ExecLimits(wall_s=30),
        )
    finally:
        shutil.rmtree(prefix)
    assert result.returncode == 0, result
    assert "['__init__.py']" in result.stdout and "refused: this package is hidden" in result.stdout, result.stdout


def test_isolation_required_refuses_to_run_without_bubblewrap(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from harnessrl.cli import app

    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    monkeypatch.setattr(sandbox_exec, "_required", type(sandbox_exec._required)())  # this test's own switch
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["eval", "--suite", "toolcalc", "--tasks", "1", "--isolation", "required", "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "--isolation required, but bubblewrap is missing" in message
    assert "harnessrl's source" in message and "every local server" in message  # what would be visible
    assert not out.exists()  # refused before anything ran
    # and a sandboxed command of this process refuses too
    with pytest.raises(ValueError, match="--isolation required"):
        sandbox_exec.run_sandboxed(["true"], workdir=tmp_path)


def test_isolation_required_holds_for_a_library_call_through_the_job_entries(monkeypatch, tmp_path):
    from harnessrl.config import EvalConfig, RunOptions
    from harnessrl.errors import JobError
    from harnessrl.jobs import entries

    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    monkeypatch.setattr(sandbox_exec, "_required", type(sandbox_exec._required)())
    out = tmp_path / "run"
    with pytest.raises(JobError, match="--isolation required, but bubblewrap is missing"):
        entries.evaluate(EvalConfig(suite="toolcalc", tasks=1), RunOptions(out=out, isolation="required"))
    assert not out.exists()


def test_the_warning_without_bubblewrap_says_as_whom_commands_run(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "as this user (uid 1000" in sandbox_exec.isolation_description("rlimits-only")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "a uid of their own (we run as root)" in sandbox_exec.isolation_description("rlimits-only")
