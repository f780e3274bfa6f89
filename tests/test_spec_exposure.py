"""What an external harness spec may show its program of this machine, and its network.

A command word (in a string command too) or a `read_only` path naming the root, the temp folder,
harnessrl's working folders in it, a home folder, a run folder or a folder holding one, or a
source checkout or a folder holding one is refused when the spec is loaded (one line naming the
word, the reason and the fix) and when an episode would start (host_paths). A relative word is
made a host path only where `read_only` lists it, or where it names the program's own file
beside the spec. `network: host` needs `--allow-host-network` (then a warning names the spec),
and is refused under `--isolation required` whatever the flag says.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.config import EvalConfig, RunOptions
from harnessrl.errors import JobError
from harnessrl.harness.agent_view import host_paths
from harnessrl.harness.spec import ExternalHarnessSpec, SpecError, load_spec, parse_spec
from harnessrl.jobs import entries
from harnessrl.kernel import enter
from harnessrl.tasks import sandbox_exec


def spec_file(folder: Path, command, **fields) -> Path:
    path = folder / "agent.yaml"
    path.write_text(yaml.safe_dump({"name": "agent", "kind": "external", "command": command, **fields}))
    return path


def refused(path: Path, *words: str) -> str:
    """The one line load_spec refuses `path` with; it names each of `words`."""
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert "never shown to the agent program" in message and "Fix: " in message and "read_only" in message
    for word in words:
        assert word in message, message
    return message


def not_shown(argv: list[str], extra: list[str] | None = None) -> str:
    """The ValueError host_paths (an episode's start) refuses `argv` with."""
    with pytest.raises(ValueError) as caught:
        host_paths(argv, extra or [])
    return str(caught.value)


# ------------------------------------------------------------------------------ command words


def test_the_temp_folder_as_a_command_word_is_refused(tmp_path):
    path = spec_file(tmp_path, "python3 agent.py --scratch /tmp")
    message = refused(path, "'/tmp'", "temp folder")
    assert "a /tmp of its own" in message  # the fix: the sandbox's own /tmp
    assert "temp folder" in not_shown(["/bin/sh", "-c", "python3 agent.py --scratch /tmp"])
    with pytest.raises(SpecError, match="'/tmp/' names the folder /tmp"):  # a spec given as data too
        parse_spec({"name": "a", "kind": "external", "command": ["python3", "agent.py", "--scratch", "/tmp/"]})


def test_harnessrls_working_folders_in_the_temp_folder_are_refused_a_programs_own_is_shown(tmp_path):
    other = Path(tempfile.mkdtemp(prefix="harnessrl-agent-"))  # another episode's control folder
    try:
        (other / "workspace").mkdir()
        refused(spec_file(tmp_path, ["python3", "agent.py", str(other / "workspace")]), str(other), "working folder")
    finally:
        shutil.rmtree(other)
    own = tmp_path / "agent"
    own.mkdir()
    (own / "agent.py").write_text("")
    spec = load_spec(spec_file(tmp_path, f"DATA={own} python3 {own / 'agent.py'}"))
    assert own in host_paths(spec.argv()).read_only


def test_cd_root_in_a_string_command_is_refused(tmp_path):
    path = spec_file(tmp_path, "cd / && python3 agent.py")
    refused(path, "'/'", "root of the host's file system")
    assert "root of the host" in not_shown(["/bin/sh", "-c", "cd / && python3 agent.py"])
    assert "root of the host" in not_shown(["/bin/sh", "-c", "cd /. && ls"])


def test_a_home_folder_and_a_folder_holding_homes_are_refused(tmp_path, monkeypatch):
    home = tmp_path / "home" / "someone"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    refused(spec_file(tmp_path, ["python3", "agent.py", "--data", str(home)]), str(home), "home folder")
    refused(spec_file(tmp_path, ["python3", "agent.py", str(tmp_path / "home")]), "holds", "home folder")
    refused(spec_file(tmp_path, ["python3"], read_only=[str(home)]), "read_only", "home folder")
    (home / "agent").mkdir()  # a folder of its own inside a home is the program's own
    assert load_spec(spec_file(tmp_path, ["python3", str(home / "agent")])).command[1] == str(home / "agent")


def test_a_run_folder_what_lies_in_it_and_a_folder_holding_one_are_refused(tmp_path):
    run = tmp_path / "project" / "runs" / "ext"
    (run / "episodes").mkdir(parents=True)
    (run / "run.db").write_text("")
    for word in (run, run.parent, run / "episodes"):
        refused(spec_file(tmp_path, ["python3", "agent.py", str(word)]), f"'{word}'", "run folder")
    refused(spec_file(tmp_path, f"python3 agent.py --db {run / 'run.db'}"), "run folder")  # its database
    options = tmp_path / "other"
    options.mkdir()
    (options / "options.json").write_text("{}")
    assert "run folder" in not_shown(["python3", str(options)])
    assert "run folder" in not_shown(["python3"], [str(tmp_path / "project")])  # read_only too


def test_a_source_checkout_and_a_folder_holding_one_are_refused(tmp_path):
    checkout = tmp_path / "src" / "project"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "agent").mkdir()
    refused(spec_file(tmp_path, ["python3", "-m", "agent", str(checkout)]), str(checkout), "source checkout")
    refused(spec_file(tmp_path, f"cd {tmp_path / 'src'} && python3 -m agent"), "holds the source checkout")
    # the program's own folder inside the checkout is shown
    spec = load_spec(spec_file(tmp_path, ["python3", str(checkout / "agent")]))
    assert checkout / "agent" in host_paths(spec.argv()).read_only


def test_a_symlink_to_a_refused_folder_is_refused(tmp_path):
    (tmp_path / "link").symlink_to("/")
    assert "a link to /" in not_shown(["python3", str(tmp_path / "link")])


def test_a_socket_or_fifo_named_by_a_command_word_is_refused(tmp_path):
    """A daemon's socket named in a command (docker's, say) would make the program its client."""
    import os
    import socket

    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "daemon.sock"))
    os.mkfifo(tmp_path / "pipe")
    try:
        for word in (tmp_path / "daemon.sock", tmp_path / "pipe"):
            assert "socket, FIFO or device" in not_shown(["python3", "agent.py", "--connect", str(word)])
    finally:
        server.close()


def test_words_under_proc_and_dev_name_the_sandboxs_own(tmp_path):
    argv = ["/bin/sh", "-c", "python3 agent.py 2>/dev/null; cat /proc/self/status"]
    view = host_paths(argv)
    assert not any(str(p).startswith(("/proc", "/dev")) for p in view.read_only)


# ------------------------------------------------------------------------------ relative words


def test_a_relative_word_not_listed_is_not_made_a_host_path(tmp_path):
    (tmp_path / "agent.sh").write_text("exit 0\n")
    (tmp_path / "runs" / "ext").mkdir(parents=True)
    (tmp_path / ".env").write_text("OPENAI_API_KEY=secret\n")
    (tmp_path / "data").mkdir()
    spec = load_spec(spec_file(tmp_path, "sh agent.sh runs .env data"))
    assert spec.command == f"sh {tmp_path / 'agent.sh'} runs .env data"  # the program's own file only
    listed = load_spec(spec_file(tmp_path, ["sh", "agent.sh", "runs", ".env", "../x"]))
    assert isinstance(listed, ExternalHarnessSpec)
    assert listed.command == ["sh", str(tmp_path / "agent.sh"), "runs", ".env", "../x"]
    shown = host_paths(spec.argv(), spec.read_only).read_only
    assert [p for p in shown if p.is_relative_to(tmp_path)] == [tmp_path / "agent.sh"]


def test_a_relative_word_listed_under_read_only_is_made_a_host_path_and_shown(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "main.py").write_text("")
    (tmp_path / ".agentrc").write_text("")
    (tmp_path / "data").mkdir()  # beside them, not listed
    spec = load_spec(
        spec_file(tmp_path, ["python3", "tools/main.py", ".agentrc", "data"], read_only=["tools", ".agentrc"])
    )
    assert isinstance(spec, ExternalHarnessSpec)
    assert spec.command == ["python3", str(tmp_path / "tools" / "main.py"), str(tmp_path / ".agentrc"), "data"]
    shown = host_paths(spec.argv(), spec.read_only).read_only
    assert tmp_path / "tools" in shown and tmp_path / ".agentrc" in shown and tmp_path / "data" not in shown


def test_a_listed_relative_word_naming_a_refused_folder_is_refused(tmp_path):
    (tmp_path / "runs" / "ext").mkdir(parents=True)
    (tmp_path / "runs" / "ext" / "options.json").write_text("{}")
    refused(spec_file(tmp_path, ["python3", "agent.py", "runs"], read_only=["runs"]), "read_only", "run folder")


# ------------------------------------------------------------------------------ network: host


@pytest.fixture
def host_spec(tmp_path) -> Path:
    (tmp_path / "agent.py").write_text("")
    return spec_file(tmp_path, ["python3", "agent.py"], network="host")


def test_network_host_without_consent_is_refused_before_any_episode(host_spec, tmp_path):
    out = tmp_path / "run"
    args = ["eval", "--suite", "toolcalc", "--tasks", "1", "--harness", str(host_spec), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert str(host_spec) in message and "--allow-host-network" in message and "network: host" in message
    assert not out.exists()  # refused before anything ran
    with pytest.raises(JobError, match="--allow-host-network"):  # a library call through the entries
        entries.evaluate(EvalConfig(suite="toolcalc", tasks=1, harness=[str(host_spec)]), RunOptions(out=out))


def test_network_host_with_consent_is_warned_naming_the_spec(host_spec, tmp_path):
    said: list[str] = []
    config = EvalConfig(suite="toolcalc", tasks=1, harness=f"react,{host_spec}", model="oracle")
    with enter("eval", config, tmp_path / "run", allow_host_network=True, log=said.append) as ctx:
        assert [s.name for s in ctx.inputs.harnesses["harness"]] == ["react", "agent"]
    [warning] = [m for m in said if "host's network" in m]
    assert warning.startswith("warning:") and str(host_spec) in warning and "--allow-host-network" in warning


def test_network_host_under_isolation_required_is_refused_whatever_the_flag(host_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "bwrap")  # bubblewrap works
    monkeypatch.setattr(sandbox_exec, "_required", type(sandbox_exec._required)())  # this test's own switch
    out = tmp_path / "run"
    config = EvalConfig(suite="toolcalc", tasks=1, harness=[str(host_spec)], model="oracle")
    for allowed in (True, False):
        with pytest.raises(JobError, match="--isolation required refuses") as caught:
            entries.evaluate(config, RunOptions(out=out, isolation="required", allow_host_network=allowed))
        assert str(host_spec) in str(caught.value)
    assert not out.exists()
