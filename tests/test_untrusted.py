"""The one path for host reads and writes under an agent's folders (harnessrl/tasks/untrusted.py):
no link followed anywhere on the way, hard links, FIFOs and over-long files refused, reads capped;
the MCP task tools hold against a folder swapped for a link while they run; and the house rule
that code under tasks/ and harness/ reaches a workspace only through that module."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl.harness.mcp_tools import TaskToolServer
from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment, Workspace
from harnessrl.tasks.workspace import WORKSPACE_TOOLS

SRC = Path(__file__).resolve().parents[1] / "src" / "harnessrl"


@pytest.fixture
def box(tmp_path):
    """An agent's folder and, beside it, a host folder with a secret and a file to protect."""
    agent, host = tmp_path / "agent", tmp_path / "host"
    agent.mkdir()
    host.mkdir()
    (host / "secret.txt").write_text("SECRET-TOKEN\n")
    (host / "target.txt").write_text("host content\n")
    (agent / "ok.txt").write_text("fine\n")
    (agent / "sub").mkdir()
    return agent, host


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_link_anywhere_on_the_way_is_refused_for_reads_and_writes(box):
    agent, host = box
    os.symlink(host / "secret.txt", agent / "answer.txt")
    os.symlink(host, agent / "hole")
    os.symlink(host, agent / "sub" / "deeper")
    before = digest(host / "target.txt")
    for rel in ("answer.txt", "hole/secret.txt", "sub/deeper/secret.txt"):
        with pytest.raises(untrusted.Refused) as info:
            untrusted.read_bytes(agent, rel)
        assert info.value.reason == "link"
    for rel in ("answer.txt", "hole/target.txt", "sub/deeper/target.txt", "hole/new.txt"):
        with pytest.raises(untrusted.Refused):
            untrusted.write_bytes(agent, rel, b"overwritten")
    assert digest(host / "target.txt") == before
    assert not (host / "new.txt").exists()
    assert untrusted.read_text(agent, "ok.txt") == "fine\n"
    assert untrusted.is_file(agent, "ok.txt") and not untrusted.is_file(agent, "answer.txt")
    assert untrusted.kind(agent, "answer.txt") == "link"


def test_a_link_to_a_file_inside_is_not_followed_either(box):
    agent, _ = box
    os.symlink("ok.txt", agent / "alias.txt")
    with pytest.raises(untrusted.Refused):
        untrusted.read_text(agent, "alias.txt")


def test_absolute_and_dotdot_paths_are_refused(box):
    agent, _ = box
    for rel in ("/etc/passwd", "../host/secret.txt", "sub/../../host/secret.txt", "a\x00b", "C:\\x"):
        with pytest.raises(untrusted.Refused) as info:
            untrusted.read_bytes(agent, rel)
        assert info.value.reason == "outside"


def test_a_hard_link_is_refused_and_never_written_through(box):
    agent, host = box
    os.link(host / "target.txt", agent / "linked.txt")
    before = digest(host / "target.txt")
    with pytest.raises(untrusted.Refused) as info:
        untrusted.read_bytes(agent, "linked.txt")
    assert info.value.reason == "hardlink"
    with pytest.raises(untrusted.Refused):
        untrusted.write_bytes(agent, "linked.txt", b"overwritten")
    with pytest.raises(untrusted.Refused):
        untrusted.write_bytes(agent, "linked.txt", b"more", append=True)
    assert digest(host / "target.txt") == before


def test_a_fifo_neither_blocks_nor_is_read(box):
    agent, _ = box
    os.mkfifo(agent / "answer.txt")
    t0 = time.monotonic()
    for call in (
        lambda: untrusted.read_bytes(agent, "answer.txt"),
        lambda: untrusted.write_bytes(agent, "answer.txt", b"x"),
    ):
        with pytest.raises(untrusted.Refused) as info:
            call()
        assert info.value.reason == "not_regular"
    assert time.monotonic() - t0 < 2.0
    assert untrusted.read_optional(agent, "missing.txt") is None
    with pytest.raises(untrusted.Refused):
        untrusted.read_optional(agent, "answer.txt")


def test_reads_are_capped_whatever_size_the_file_claims(box):
    agent, _ = box
    with open(agent / "sparse.bin", "wb") as fh:  # a terabyte by its size, nothing on disk
        fh.truncate(1 << 40)
    (agent / "big.txt").write_bytes(b"x" * 5000)
    assert len(untrusted.read_bytes(agent, "sparse.bin", 1000, truncate=True)) == 1000
    with pytest.raises(untrusted.Refused) as info:
        untrusted.read_bytes(agent, "big.txt", 4999)
    assert info.value.reason == "too_large"
    assert untrusted.read_bytes(agent, "big.txt", 5000) == b"x" * 5000


def test_remove_and_rename_act_on_the_link_itself(box):
    agent, host = box
    os.symlink(host, agent / "hole")
    assert untrusted.remove(agent, "hole", tree=True)  # the link goes, the host folder stays
    assert (host / "secret.txt").exists() and (host / "target.txt").exists()
    os.symlink(host / "target.txt", agent / "l")
    untrusted.rename(agent, "l", "sub/moved")
    assert os.path.islink(agent / "sub" / "moved") and (host / "target.txt").exists()
    assert untrusted.remove(agent, "missing") is False


def test_a_walk_never_enters_a_link_and_stops_at_its_limit(box):
    agent, host = box
    os.symlink(host, agent / "hole")
    found = {e.rel: e.kind for e in untrusted.walk(agent)}
    assert found == {"hole": "link", "ok.txt": "file", "sub": "dir"}
    for i in range(20):
        (agent / "sub" / f"f{i}").write_text("")
    with pytest.raises(untrusted.Refused) as info:
        untrusted.walk(agent, limit=10)
    assert info.value.reason == "too_many"


def test_copy_in_replaces_nothing_through_a_link(box, tmp_path):
    agent, host = box
    source = tmp_path / "task_reward"
    source.mkdir()
    (source / "reward.sh").write_text("echo 1\n")
    os.symlink(host, agent / "reward")  # the agent's link where the grader's folder goes
    with pytest.raises(untrusted.Refused):
        untrusted.copy_in(source, agent, "reward")
    assert not (host / "reward.sh").exists()
    untrusted.remove(agent, "reward", tree=True)
    untrusted.copy_in(source, agent, "reward")
    assert (agent / "reward" / "reward.sh").read_text() == "echo 1\n"


# ------------------------------------------------------------------------------------ the MCP race


_SWAPPER = """
import os, sys
root = sys.argv[1]
while True:  # d is the real folder half the time, a link to the host folder the other half
    try:
        os.rename(root + "/real", root + "/d"); os.rename(root + "/d", root + "/real")
        os.rename(root + "/lnk", root + "/d"); os.rename(root + "/d", root + "/lnk")
    except OSError:
        pass
"""


def test_mcp_file_tools_hold_while_a_folder_is_swapped_for_a_link(tmp_path):
    """A program beside the MCP server swaps a folder of its workspace for a link to a host folder
    as fast as it can while the served file tools read and write under it: no call ever reads the
    host's secret or writes into the host folder (a by-name lookup after a check read it here
    within a second)."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "note.txt").write_text("HOST-SECRET\n")
    env = Environment(workspace=Workspace())
    root = env.workspace.root
    (root / "real").mkdir()
    (root / "real" / "note.txt").write_text("workspace\n")
    os.symlink(host, root / "lnk")
    server = TaskToolServer(list(WORKSPACE_TOOLS), env, lambda c, r: None, lambda m: None)
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(root)])
    outputs = []
    try:
        time.sleep(0.2)
        deadline, i = time.monotonic() + 2.0, 0
        while time.monotonic() < deadline:
            for name, args in (
                ("read_file", {"path": "d/note.txt"}),
                ("write_file", {"path": "d/written.txt", "content": "agent"}),
                ("append_file", {"path": "d/note.txt", "content": "more"}),
                ("search_text", {"query": "SECRET", "path": "d"}),
                ("list_dir", {"path": "d"}),
            ):
                i += 1
                message = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": name, "arguments": args},
                }
                outputs.append(json.dumps(server.handle(message)))
    finally:
        swapper.kill()
        swapper.wait()
        env.close()
    assert len(outputs) > 100
    assert not any("HOST-SECRET" in o for o in outputs)
    assert sorted(p.name for p in host.iterdir()) == ["note.txt"]
    assert (host / "note.txt").read_text() == "HOST-SECRET\n"


# ------------------------------------------------------------------------------------ the house rule

# What a call may do to a Path by name. A call of one of these whose text names a workspace, an
# external episode's control folder or a grader's output folder must go through untrusted.py.
_BY_NAME = {
    "read_text", "read_bytes", "write_text", "write_bytes", "open", "is_file", "is_dir", "exists", "iterdir",
    "rglob", "glob", "unlink", "mkdir", "rmdir", "touch", "symlink_to", "chmod", "stat", "lstat", "readlink",
    "is_symlink", "rename", "replace", "copytree", "copyfile", "copy2", "copy", "lexists", "isfile", "isdir",
    "walk", "listdir", "scandir", "realpath",
}  # fmt: skip
_AGENT_FOLDER = re.compile(r"\b(ws|workspace|control|verifier_dir|logs|workdir)\b|\.root\b|require_workspace")
# (file, call text) -> why it is not an agent's folder at that moment
_ALLOWED = {
    ("harness/external.py", "control.chmod(0o711)"): "the control folder, made by the host, before the program runs",
    ("harness/external.py", '(control / TASK_FILE).write_text(job.task.instruction, encoding="utf-8")'): "same",
    ("harness/external.py", '(control / "home").mkdir()'): "same",
    ("harness/external.py", "workdir.mkdir()"): "the workspace folder, made by the host before the program runs",
    ("harness/external.py", "shutil.rmtree(control, ignore_errors=True)"): "rmtree never follows a link",
    ("tasks/base.py", "shutil.rmtree(self.root, ignore_errors=True)"): "rmtree never follows a link",
    ("tasks/importers/harbor.py", '(logs / "verifier").mkdir(parents=True)'): "made by the host before test.sh runs",
    ("tasks/importers/harbor.py", '(logs / "agent").mkdir()'): "same",
}


def _by_name_calls(path: Path) -> list[tuple[int, str]]:
    src = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name not in _BY_NAME:
            continue
        if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "untrusted":
            continue
        text = ast.get_source_segment(src, node) or ""
        if _AGENT_FOLDER.search(text):
            out.append((node.lineno, text))
    return out


def test_code_under_tasks_and_harness_reaches_a_workspace_only_through_untrusted():
    offenders = []
    for path in sorted(
        [*SRC.joinpath("tasks").rglob("*.py"), *SRC.joinpath("harness").rglob("*.py"), SRC / "audit.py"]
    ):
        if path.name == "untrusted.py":
            continue
        rel = path.relative_to(SRC).as_posix()
        for lineno, text in _by_name_calls(path):
            if (rel, text) not in _ALLOWED:
                offenders.append(f"{rel}:{lineno}: {text}")
    assert not offenders, "open these through harnessrl.tasks.untrusted:\n" + "\n".join(offenders)


def test_the_house_rule_catches_a_by_name_read(tmp_path):
    """The rule can fail: a grader that reads the answer by name is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def grade(env):\n    return (env.workspace.root / 'answer.txt').read_text()\n")
    assert [t for _, t in _by_name_calls(bad)] == ["(env.workspace.root / 'answer.txt').read_text()"]
