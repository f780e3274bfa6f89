"""The workspace sandbox: every file tool refuses to leave the workspace, and works inside it."""

from __future__ import annotations

import os
import tempfile

import pytest

from harnessrl.tasks.base import Environment, ToolBlocked, ToolFailed, validate_arguments
from harnessrl.tasks.workspace import WORKSPACE_TOOLS, Workspace

TOOLS = {t.name: t for t in WORKSPACE_TOOLS}


def use(env: Environment, name: str, **arguments) -> str:
    tool = TOOLS[name]
    args, err = validate_arguments(tool.parameters, arguments)
    assert err is None, err
    return tool.fn(env, **args)


@pytest.fixture
def box(tmp_path, monkeypatch):
    """A workspace created under tmp_path/base, next to an `outside` folder holding a sentinel."""
    base = tmp_path / "base"
    base.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("sentinel\n")
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    env = Environment(workspace=Workspace())
    assert env.workspace.root.parent == base.resolve()
    env.workspace.write("inside.txt", "hello\n")
    env.workspace.write("sub/inner.txt", "deep\n")
    yield env, base, outside
    env.close()
    # nothing was written outside the workspace: base holds only the (now removed) workspace,
    # and the outside folder is exactly as it was
    assert os.listdir(base) == []
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "sentinel\n"
    assert sorted(os.listdir(tmp_path)) == ["base", "outside"]


def every_tool_with(path: str) -> list[tuple[str, dict]]:
    """One call per tool (and per path argument) that puts `path` where a path goes."""
    return [
        ("list_dir", {"path": path}),
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": "pwned\n"}),
        ("append_file", {"path": path, "content": "pwned\n"}),
        ("move_file", {"source": path, "destination": "stolen.txt"}),
        ("move_file", {"source": "inside.txt", "destination": path}),
        ("delete_file", {"path": path}),
        ("search_text", {"query": "sentinel", "path": path}),
    ]


ESCAPES = [
    "../escape.txt",
    "..",
    "a/../../escape.txt",
    "sub/../../escape.txt",
    "./../escape.txt",
    "..\\escape.txt",
    "/etc/passwd",
    "/tmp/escape.txt",
    "\\etc\\passwd",
    "~/escape.txt",
    "C:\\escape.txt",
]


def test_tools_cover_every_workspace_tool():
    assert {name for name, _ in every_tool_with("x")} == set(TOOLS)


@pytest.mark.parametrize("path", ESCAPES)
def test_escapes_are_blocked_for_every_tool(box, path):
    env, base, outside = box
    for name, args in every_tool_with(path):
        with pytest.raises(ToolBlocked) as info:
            use(env, name, **args)
        assert info.value.reason == "sandbox", (name, path)
    assert env.workspace.read("inside.txt") == "hello\n"


def test_escape_to_the_sentinel_itself_is_blocked(box, tmp_path):
    env, base, outside = box
    rel = os.path.relpath(outside / "secret.txt", env.workspace.root)  # ../../outside/secret.txt
    for name, args in every_tool_with(rel) + every_tool_with(str(outside / "secret.txt")):
        with pytest.raises(ToolBlocked):
            use(env, name, **args)


@pytest.mark.parametrize("link_kind", ["dir", "file", "dangling"])
def test_symlink_pointing_outside_is_blocked(box, link_kind):
    env, base, outside = box
    root = env.workspace.root
    if link_kind == "dir":
        os.symlink(outside, root / "link")
        paths = ["link", "link/secret.txt", "link/new.txt", "./link/secret.txt"]
    elif link_kind == "file":
        os.symlink(outside / "secret.txt", root / "link")
        paths = ["link"]
    else:
        os.symlink(outside / "missing.txt", root / "link")
        paths = ["link"]
    for path in paths:
        for name, args in every_tool_with(path):
            with pytest.raises(ToolBlocked):
                use(env, name, **args)
    # a symlinked folder inside a real folder is caught too
    os.symlink(outside, root / "sub" / "hole")
    for name, args in every_tool_with("sub/hole/secret.txt"):
        with pytest.raises(ToolBlocked):
            use(env, name, **args)
    # searching the whole workspace does not follow the links out
    assert use(env, "search_text", query="sentinel").startswith("no matches")
    assert not (outside / "missing.txt").exists()
    assert not (outside / "new.txt").exists()
    os.unlink(root / "link")
    os.unlink(root / "sub" / "hole")


def test_symlink_inside_the_workspace_is_not_followed_either(box):
    # a link is never followed, wherever it points: the host cannot tell a link that points
    # inside from one that will be swapped to point outside between its check and its use
    env, _, _ = box
    os.symlink(env.workspace.root / "sub", env.workspace.root / "alias")
    with pytest.raises(ToolBlocked):
        use(env, "read_file", path="alias/inner.txt")
    assert use(env, "read_file", path="sub/inner.txt") == "deep\n"


def test_oversize_writes_are_blocked(box):
    env, _, _ = box
    limit = env.workspace.max_write_bytes
    big = "x" * (limit + 1)
    for name in ("write_file", "append_file"):
        with pytest.raises(ToolBlocked) as info:
            use(env, name, path="big.txt", content=big)
        assert info.value.reason == "sandbox"
    assert env.workspace.read("big.txt") is None
    # multi-byte characters count as bytes, not characters
    with pytest.raises(ToolBlocked):
        use(env, "write_file", path="big.txt", content="é" * (limit // 2 + 1))
    use(env, "write_file", path="ok.txt", content="x" * limit)
    assert len(env.workspace.read("ok.txt")) == limit


def test_small_write_limit_and_total_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = Environment(workspace=Workspace(max_write_bytes=10, max_total_bytes=25))
    try:
        use(env, "write_file", path="a.txt", content="0123456789")
        with pytest.raises(ToolBlocked):
            use(env, "write_file", path="b.txt", content="0123456789A")
        use(env, "write_file", path="b.txt", content="0123456789")
        with pytest.raises(ToolBlocked):  # 20 + 10 > 25
            use(env, "append_file", path="c.txt", content="0123456789")
        use(env, "write_file", path="a.txt", content="short")  # overwriting frees space
    finally:
        env.close()


def test_normal_use(box):
    env, _, _ = box
    assert use(env, "write_file", path="notes/todo.txt", content="buy milk\ncall Alice\n").startswith("Wrote")
    assert use(env, "read_file", path="notes/todo.txt") == "buy milk\ncall Alice\n"
    use(env, "append_file", path="notes/todo.txt", content="pay rent\n")
    assert use(env, "read_file", path="./notes//todo.txt") == "buy milk\ncall Alice\npay rent\n"
    assert use(env, "list_dir").split("\n") == ["inside.txt", "notes/", "sub/"]
    assert use(env, "list_dir", path="notes") == "todo.txt"

    hits = use(env, "search_text", query="Alice")
    assert hits == "notes/todo.txt:2: call Alice"
    assert "no matches" in use(env, "search_text", query="zebra", path="notes")

    use(env, "move_file", source="notes/todo.txt", destination="archive/2024/todo.txt")
    assert env.workspace.read("notes/todo.txt") is None
    assert env.workspace.read("archive/2024/todo.txt").startswith("buy milk")
    use(env, "move_file", source="inside.txt", destination="sub")  # into an existing folder
    assert env.workspace.read("sub/inside.txt") == "hello\n"

    use(env, "delete_file", path="archive/2024/todo.txt")
    assert env.workspace.read("archive/2024/todo.txt") is None
    use(env, "delete_file", path="archive/2024")  # an empty folder
    assert use(env, "list_dir", path="archive") == "(empty directory)"
    assert env.workspace.files() == ["sub/inner.txt", "sub/inside.txt"]


def test_ordinary_failures_are_tool_failed_not_crashes(box):
    env, _, _ = box
    cases = [
        ("read_file", {"path": "missing.txt"}),
        ("read_file", {"path": "sub"}),
        ("list_dir", {"path": "missing"}),
        ("list_dir", {"path": "inside.txt"}),
        ("write_file", {"path": "sub", "content": "x"}),
        ("write_file", {"path": "inside.txt/child.txt", "content": "x"}),  # a parent is a file
        ("append_file", {"path": "inside.txt/child.txt", "content": "x"}),
        ("move_file", {"source": "missing.txt", "destination": "b.txt"}),
        ("move_file", {"source": "sub/inner.txt", "destination": "inside.txt"}),  # destination exists
        ("move_file", {"source": "sub/inner.txt", "destination": "inside.txt/x.txt"}),
        ("move_file", {"source": "sub", "destination": "sub/deeper/sub2"}),  # a folder into itself
        ("delete_file", {"path": "missing.txt"}),
        ("delete_file", {"path": "."}),
        ("search_text", {"query": ""}),
    ]
    for name, args in cases:
        with pytest.raises((ToolFailed, ToolBlocked)):
            use(env, name, **args)
    with pytest.raises(ToolFailed):  # a non-empty folder is not deleted
        use(env, "delete_file", path="sub")
    assert env.workspace.read("inside.txt") == "hello\n"
    assert env.workspace.read("sub/inner.txt") == "deep\n"


def test_cleanup_removes_everything(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = Environment(workspace=Workspace())
    use(env, "write_file", path="a/b/c.txt", content="x")
    root = env.workspace.root
    env.close()
    assert not root.exists()
    assert os.listdir(tmp_path) == []
