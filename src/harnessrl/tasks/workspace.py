"""The file tools that act on an episode's workspace.

Every path a tool receives is a path relative to the episode's temporary workspace (`Workspace`,
the sandbox an `Environment` holds; defined in tasks/base.py and importable from here as well),
and every read and write goes through harnessrl.tasks.untrusted: each folder on the way is
opened relative to the one before without following a link, so a link the agent (or a program
it started) left, or swaps in while a call runs, is refused and never followed. Absolute paths,
`..`, links, hard-linked files, FIFOs and devices, and oversize writes are refused with
ToolBlocked (recorded as a blocked call, with a message the model can act on).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment, Tool, ToolBlocked, ToolFailed, Workspace

MAX_READ_CHARS = 8000  # what the model is shown of one file
MAX_READ_BYTES = 4 * MAX_READ_CHARS  # what is read of one file to show those characters
MAX_SEARCH_BYTES = 1 << 20  # what search_text reads of one file


# ----------------------------------------------------------------------------------------------
# File tools. Each takes the Environment first; the runner validates arguments before calling.


def _ws(env: Environment) -> Workspace:
    if env.workspace is None:
        raise RuntimeError("this tool needs a workspace, and the task has none")
    return env.workspace


def _blocked(path: str, e: untrusted.Refused) -> ToolBlocked | ToolFailed:
    """A refusal of the untrusted-file layer as the model sees it: a link or a linked file is a
    blocked call (it points outside, or may), a missing file an ordinary failure."""
    if e.reason == "missing":
        return ToolFailed(f"no such file or directory: {path}")
    if e.reason == "link":
        return ToolBlocked(f"'{path}' resolves outside the workspace (symlink): links are not followed", "sandbox")
    if e.reason == "hardlink":
        return ToolBlocked(f"'{path}' is a hard-linked file: it is not read or written", "sandbox")
    if e.reason == "not_regular":
        return ToolFailed(f"{path}: {e}")
    return ToolBlocked(f"'{path}': {e}", "sandbox")


def _rel(ws: Workspace, path: str) -> PurePosixPath:
    return PurePosixPath(*ws.parts(path)) if ws.parts(path) else PurePosixPath(".")


def _check_write(ws: Workspace, content: str, existing: int = 0) -> bytes:
    data = content.encode("utf-8")
    if len(data) > ws.max_write_bytes:
        raise ToolBlocked(
            f"write of {len(data)} bytes refused: the limit is {ws.max_write_bytes} bytes per write", "sandbox"
        )
    try:
        used = ws.total_bytes()
    except untrusted.Refused as e:  # more entries than a walk visits: refused, not a crash
        raise ToolBlocked(f"write refused: {e}", "sandbox") from None
    if used + len(data) - existing > ws.max_total_bytes:
        raise ToolBlocked(f"write refused: the workspace would exceed {ws.max_total_bytes} bytes", "sandbox")
    return data


def list_dir(env: Environment, path: str = ".") -> str:
    ws = _ws(env)
    rel = _rel(ws, path)
    try:
        found = untrusted.entries(ws.root, rel)
    except untrusted.Refused as e:
        if e.reason == "missing":
            raise ToolFailed(f"no such directory: {path}") from None
        if e.reason == "not_regular":
            raise ToolFailed(f"not a directory: {path}") from None
        raise _blocked(path, e) from None
    names = [PurePosixPath(x.rel).name + ("/" if x.kind == "dir" else "") for x in found]
    return "\n".join(names) if names else "(empty directory)"


def read_file(env: Environment, path: str) -> str:
    ws = _ws(env)
    rel = _rel(ws, path)
    if str(rel) == ".":
        raise ToolFailed(f"no such file: {path}")
    try:
        text = untrusted.read_text(ws.root, rel, MAX_READ_BYTES, truncate=True)
    except untrusted.Refused as e:
        if e.reason in ("missing", "not_regular"):
            raise ToolFailed(f"no such file: {path}") from None
        raise _blocked(path, e) from None
    if len(text) > MAX_READ_CHARS:
        return text[:MAX_READ_CHARS] + "\n[... truncated: the file is longer than shown]"
    return text


def _existing_size(ws: Workspace, rel: PurePosixPath, path: str) -> int:
    try:
        st = untrusted.lstat(ws.root, rel)
    except untrusted.Refused as e:
        raise _blocked(path, e) from None
    if st is not None and untrusted.kind(ws.root, rel) == "dir":
        raise ToolFailed(f"{path} is a directory")
    return st.st_size if st is not None else 0


def write_file(env: Environment, path: str, content: str) -> str:
    ws = _ws(env)
    rel = _rel(ws, path)
    if str(rel) == ".":
        raise ToolFailed(f"{path} is a directory")
    data = _check_write(ws, content, _existing_size(ws, rel, path))
    _write(ws, rel, path, data, append=False)
    return f"Wrote {len(data)} bytes to {rel.as_posix()}."


def append_file(env: Environment, path: str, content: str) -> str:
    ws = _ws(env)
    rel = _rel(ws, path)
    if str(rel) == ".":
        raise ToolFailed(f"{path} is a directory")
    _existing_size(ws, rel, path)
    data = _check_write(ws, content)
    _write(ws, rel, path, data, append=True)
    return f"Appended {len(data)} bytes to {rel.as_posix()}."


def _write(ws: Workspace, rel: PurePosixPath, path: str, data: bytes, append: bool) -> None:
    try:  # e.g. a parent path is an existing file: an ordinary failure, not an infra error
        untrusted.write_bytes(ws.root, rel, data, append=append)
    except untrusted.Refused as e:
        if e.reason in ("missing", "not_regular"):
            raise ToolFailed(f"cannot write {path}: {e}") from None
        raise _blocked(path, e) from None
    except OSError as exc:
        raise ToolFailed(f"cannot write {path}: {exc.strerror or exc}") from None


def move_file(env: Environment, source: str, destination: str) -> str:
    ws = _ws(env)
    src, dst = _rel(ws, source), _rel(ws, destination)
    try:
        src_kind = untrusted.kind(ws.root, src) if str(src) != "." else None
        if src_kind is None:
            raise ToolFailed(f"no such file: {source}")
        if src_kind == "link":
            raise untrusted.Refused(f"{source} is a symbolic link", "link")
        if str(dst) == "." or untrusted.kind(ws.root, dst) == "dir":
            dst = (dst / src.name) if str(dst) != "." else PurePosixPath(src.name)
        dst_kind = untrusted.kind(ws.root, dst)
        if dst_kind == "link":
            raise untrusted.Refused(f"{destination} is a symbolic link", "link")
        if dst_kind is not None:
            raise ToolFailed(f"destination exists: {destination}")
        untrusted.rename(ws.root, src, dst)
    except untrusted.Refused as e:
        raise _blocked(f"{source} -> {destination}", e) from None
    except OSError as exc:  # e.g. a folder moved into itself
        raise ToolFailed(f"cannot move {source} to {destination}: {exc.strerror or exc}") from None
    return f"Moved {source} to {dst.as_posix()}."


def delete_file(env: Environment, path: str) -> str:
    ws = _ws(env)
    rel = _rel(ws, path)
    if str(rel) == ".":
        raise ToolBlocked("refusing to delete the workspace itself", "sandbox")
    try:
        if untrusted.kind(ws.root, rel) == "link":
            raise untrusted.Refused(f"{path} is a symbolic link", "link")
        removed = untrusted.remove(ws.root, rel)
    except untrusted.Refused as e:
        raise _blocked(path, e) from None
    except OSError as exc:
        if exc.errno == 39:  # ENOTEMPTY
            raise ToolFailed(f"directory not empty: {path}") from None
        raise ToolFailed(f"cannot delete {path}: {exc.strerror or exc}") from None
    if not removed:
        raise ToolFailed(f"no such file: {path}")
    return f"Deleted {path}."


def search_text(env: Environment, query: str, path: str = ".") -> str:
    ws = _ws(env)
    rel = _rel(ws, path)
    if not query:
        raise ToolFailed("query must not be empty")
    hits = []
    try:
        k = untrusted.kind(ws.root, rel)
        if k is None:
            raise ToolFailed(f"no such file or directory: {path}")
        if k == "link":
            raise untrusted.Refused(f"{path} is a symbolic link", "link")
        if k == "dir":
            candidates = [PurePosixPath(e.rel) for e in untrusted.walk(ws.root, rel) if e.kind == "file"]
        else:
            candidates = [rel] if k == "file" else []
    except untrusted.Refused as e:
        raise _blocked(path, e) from None
    for f in candidates:
        try:
            text = untrusted.read_text(ws.root, f, MAX_SEARCH_BYTES, truncate=True)
        except untrusted.Refused:
            continue  # a link, a hard link, a FIFO, or swapped since the walk: never read
        for lineno, line in enumerate(text.splitlines(), 1):
            if query in line:
                hits.append(f"{f.as_posix()}:{lineno}: {line[:200]}")
                if len(hits) >= 50:
                    return "\n".join(hits) + "\n[... more matches not shown]"
    return "\n".join(hits) if hits else f"no matches for '{query}'"


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


_PATH = {"type": "string", "description": "path relative to the workspace"}

WORKSPACE_TOOLS: list[Tool] = [
    Tool("list_dir", "List the files in a directory of the workspace.", _obj({"path": _PATH}, []), list_dir),
    Tool("read_file", "Read a text file.", _obj({"path": _PATH}, ["path"]), read_file),
    Tool(
        "write_file",
        "Create or overwrite a text file.",
        _obj({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
        write_file,
    ),
    Tool(
        "append_file",
        "Append text to the end of a file (creates it if missing).",
        _obj({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
        append_file,
    ),
    Tool(
        "move_file",
        "Move or rename a file.",
        _obj({"source": _PATH, "destination": _PATH}, ["source", "destination"]),
        move_file,
    ),
    Tool("delete_file", "Delete a file or an empty directory.", _obj({"path": _PATH}, ["path"]), delete_file),
    Tool(
        "search_text",
        "Find lines containing a text in the files under a path.",
        _obj({"query": {"type": "string"}, "path": _PATH}, ["query"]),
        search_text,
    ),
]
