"""`harnessrl audit --harness SPEC`: a probe started the way the spec starts its agent reports what
it can read, reach and import. Under bubblewrap an agent on `{python}` sees no harnessrl source,
no task folder, no home and no host port but its endpoint, and cannot import harnessrl; the host
network is reported as exposed (exit 1); a `read_only` folder is reported as shown on purpose; a
loop harness and a spec that cannot start are reported in words, never a traceback."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harnessrl import audit_agent
from harnessrl.audit_agent import BY_READ_ONLY, EXPOSED, OK, PROBLEM, audit_harness, listening_ports
from harnessrl.cli import app
from harnessrl.harness.spec import parse_spec
from harnessrl.tasks import sandbox_exec
from harnessrl.tasks.importers.clawgym import ClawGymSuite
from harnessrl.tasks.sandbox_exec import isolation_available

ROOT = Path(__file__).resolve().parents[1]
BEHAVE = ROOT / "tests" / "fixtures" / "agents" / "behave.py"
CLAWGYM = ROOT / "tests" / "fixtures" / "importers" / "clawgym"
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is missing or does not work here")


def _spec(**fields):
    return parse_spec({"name": "behave", "kind": "external", "command": ["{python}", str(BEHAVE), "ask"], **fields})


def _spec_file(folder: Path, **fields) -> Path:
    path = folder / "agent.yaml"
    path.write_text(
        yaml.safe_dump({"name": "behave", "kind": "external", "command": ["{python}", str(BEHAVE), "ask"], **fields})
    )
    return path


def _by_what(report) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in report.findings:
        out.setdefault(f.what, []).append(f)
    return out


@needs_bwrap
def test_under_bubblewrap_an_agent_sees_nothing_of_ours():
    tasks = ClawGymSuite(CLAWGYM).tasks("test")
    with socket.create_server(("127.0.0.1", 0)) as host_service:  # a host service the agent must not reach
        port = host_service.getsockname()[1]
        assert ("127.0.0.1", port) in listening_ports()
        report = audit_harness(_spec(), "behave", tasks, f"clawgym:{CLAWGYM}")
    assert report.exposed() == [] and report.problems() == [] and report.exit_code() == 0, report.markdown()
    found = _by_what(report)
    [source] = found["harnessrl's source"]
    assert source.verdict == OK and source.where == str(ROOT / "src" / "harnessrl")
    assert found["files named like harnessrl's modules"][0].verdict == OK
    [folders] = found["task folders"]
    assert folders.verdict == OK and folders.detail == "none of 1 visible"  # both tasks read from the one folder
    [home] = found["the user's home"]
    assert home.verdict == OK and "not visible" in home.detail
    [endpoint] = found["the episode's endpoint"]
    assert endpoint.verdict == OK and endpoint.detail.startswith("reached")
    assert found["a port the audit opened"][0].verdict == OK
    assert not any(f.check == "reach" and f.verdict == EXPOSED for f in report.findings)
    imports = [f for f in report.findings if f.check == "import"]
    assert len(imports) == 2 and all(f.verdict == OK and "No module named 'harnessrl'" in f.detail for f in imports)
    assert {f.what for f in imports} == {
        "import harnessrl (the spec's {python})",
        "import harnessrl (the system's python3)",
    }
    # nothing of the host is visible but what the view shows on purpose
    trees = found["visible tree"]
    assert all(f.verdict != EXPOSED for f in trees)
    assert any(f.where == str(BEHAVE) for f in trees)


@needs_bwrap
def test_the_host_network_reaches_the_audits_own_port(tmp_path):
    spec = _spec_file(tmp_path, network="host")
    result = CliRunner().invoke(app, ["audit", "--harness", str(spec), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["network_had"] == "host" and data["exit_code"] == 1
    own = [f for f in data["exposed"] if f["what"] == "a port the audit opened"]
    assert len(own) == 1 and own[0]["detail"] == "connected (the spec asks for the host's network)"
    endpoint = next(f for f in data["findings"] if f["what"] == "the episode's endpoint")
    assert endpoint["verdict"] == OK


@needs_bwrap
def test_a_read_only_folder_is_shown_as_the_spec_asks():
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-test-read-only-"))
    try:
        folder.chmod(0o755)  # the sandbox user (as root: another uid) must read it
        (folder / "notes.txt").write_text("the agent's own notes\n")
        (folder / "notes.txt").chmod(0o644)
        report = audit_harness(_spec(read_only=[str(folder)]), "behave")
    finally:
        shutil.rmtree(folder)
    [tree] = [f for f in report.findings if f.what == "visible tree" and f.where == str(folder)]
    assert tree.verdict == BY_READ_ONLY and tree.detail.startswith("1 file;")
    assert report.exposed() == [] and report.exit_code() == 0


def test_a_loop_harness_is_refused_in_words():
    result = CliRunner().invoke(app, ["audit", "--harness", "react"])
    assert result.exit_code == 2
    assert "loop harness" in result.output and "audit --suite" in result.output and "Traceback" not in result.output
    neither = CliRunner().invoke(app, ["audit"])
    assert neither.exit_code == 2 and "--harness SPEC" in neither.output


def test_a_spec_that_cannot_start_is_reported_not_raised(tmp_path):
    # read_only naming the suite's folder would show each task its grader: no episode starts
    spec = _spec_file(tmp_path, read_only=[str(CLAWGYM), str(tmp_path / "not-installed")])
    result = CliRunner().invoke(app, ["audit", "--harness", str(spec), "--suite", f"clawgym:{CLAWGYM}", "--json"])
    assert result.exit_code == 2, result.output
    data = json.loads(result.stdout)
    assert data["probed"] is False and data["exposed"] == []
    problems = {f["what"]: f["detail"] for f in data["problems"]}
    assert "not on this machine" in problems["read_only path"]
    assert "cannot start the agent program (on 2 task(s)" in problems["the agent's view"]


def test_loopback_listeners_are_read_from_proc():
    assert audit_agent._loopback("0100007F") == "127.0.0.1"
    assert audit_agent._loopback("3500007F") == "127.0.0.53"
    assert audit_agent._loopback("00000000") == "127.0.0.1"  # every address: loopback too
    assert audit_agent._loopback("0A00000A") is None
    assert audit_agent._loopback("0" * 24 + "01000000") == "::1"


def test_without_bubblewrap_it_says_so_and_lists_what_it_sees(monkeypatch):
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    monkeypatch.setattr(audit_agent, "isolation_available", lambda: "rlimits-only")
    monkeypatch.setattr(audit_agent, "WALK_S", 1.0)  # the whole machine: a lower bound is enough here
    report = audit_harness(_spec(), "behave")
    assert report.isolation == "rlimits-only" and report.network_had == "host"
    assert "bubblewrap does not work here" in report.warning() and report.warning() in report.markdown()
    assert any(f.what == "a port the audit opened" and f.verdict == EXPOSED for f in report.findings)
    assert report.exit_code() == 1
    assert PROBLEM not in {f.verdict for f in report.findings if f.check == "reach"}
