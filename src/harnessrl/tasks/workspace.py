"""The file tools that act on an episode's workspace.

Every path a tool receives is resolved inside the episode's temporary workspace (`Workspace`,
the sandbox an `Environment` holds; defined in tasks/base.py and importable from here as well).
Absolute paths, `..` components, symlinks that lead outside, and oversize writes are refused
with ToolBlocked (recorded as a blocked call, with a message the model can act on).
"""

from __future__ import annotations

from harnessrl.tasks.base import Environment, Tool, ToolBlocked, ToolFailed, Workspace

MAX_READ_CHARS = 8000  # what the model is shown of one file


# ----------------------------------------------------------------------------------------------
# File tools. Each takes the Environment first; the runner validates arguments before calling.


def _ws(env: Environment) -> Workspace:
    if env.workspace is None:
        raise RuntimeError("this tool needs a workspace, and the task has none")
    return env.workspace


def _check_write(ws: Workspace, content: str, existing: int = 0) -> bytes:
    data = content.encode("utf-8")
    if len(data) > ws.max_write_bytes:
        raise ToolBlocked(
            f"write of {len(data)} bytes refused: the limit is {ws.max_write_bytes} bytes per write", "sandbox"
        )
    if ws.total_bytes() + len(data) - existing > ws.max_total_bytes:
        raise ToolBlocked(f"write refused: the workspace would exceed {ws.max_total_bytes} bytes", "sandbox")
    return data


def list_dir(env: Environment, path: str = ".") -> str:
    ws = _ws(env)
    target = ws.resolve(path)
    if not target.exists():
        raise ToolFailed(f"no such directory: {path}")
    if not target.is_dir():
        raise ToolFailed(f"not a directory: {path}")
    entries = []
    for child in sorted(target.iterdir()):
        entries.append(child.name + ("/" if child.is_dir() else ""))
    return "\n".join(entries) if entries else "(empty directory)"


def read_file(env: Environment, path: str) -> str:
    ws = _ws(env)
    target = ws.resolve(path)
    if not target.is_file():
        raise ToolFailed(f"no such file: {path}")
    text = target.read_bytes().decode("utf-8", "replace")
    if len(text) > MAX_READ_CHARS:
        return text[:MAX_READ_CHARS] + f"\n[... truncated, {len(text) - MAX_READ_CHARS} more characters]"
    return text


def write_file(env: Environment, path: str, content: str) -> str:
    ws = _ws(env)
    target = ws.resolve(path)
    if target == ws.root or target.is_dir():
        raise ToolFailed(f"{path} is a directory")
    existing = target.stat().st_size if target.is_file() else 0
    data = _check_write(ws, content, existing)
    try:  # e.g. a parent path is an existing file: an ordinary failure, not an infra error
        target.parent.mkdir(parents=True, exist_ok=True)
        ws.resolve(path)  # re-check: a parent created above must not be a symlink out
        target.write_bytes(data)
    except OSError as exc:
        raise ToolFailed(f"cannot write {path}: {exc.strerror or exc}") from None
    return f"Wrote {len(data)} bytes to {ws.rel(target)}."


def append_file(env: Environment, path: str, content: str) -> str:
    ws = _ws(env)
    target = ws.resolve(path)
    if target == ws.root or target.is_dir():
        raise ToolFailed(f"{path} is a directory")
    data = _check_write(ws, content)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab") as fh:
            fh.write(data)
    except OSError as exc:
        raise ToolFailed(f"cannot append to {path}: {exc.strerror or exc}") from None
    return f"Appended {len(data)} bytes to {ws.rel(target)}."


def move_file(env: Environment, source: str, destination: str) -> str:
    ws = _ws(env)
    src = ws.resolve(source)
    dst = ws.resolve(destination)
    if not src.exists() or src == ws.root:
        raise ToolFailed(f"no such file: {source}")
    if dst.is_dir():
        dst = dst / src.name
    if dst.exists():
        raise ToolFailed(f"destination exists: {destination}")
    try:  # e.g. a parent of the destination is a file, or a folder moved into itself
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
    except OSError as exc:
        raise ToolFailed(f"cannot move {source} to {destination}: {exc.strerror or exc}") from None
    return f"Moved {source} to {ws.rel(dst)}."


def delete_file(env: Environment, path: str) -> str:
    ws = _ws(env)
    target = ws.resolve(path)
    if target == ws.root:
        raise ToolBlocked("refusing to delete the workspace itself", "sandbox")
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir():
        if any(target.iterdir()):
            raise ToolFailed(f"directory not empty: {path}")
        target.rmdir()
    else:
        raise ToolFailed(f"no such file: {path}")
    return f"Deleted {path}."


def search_text(env: Environment, query: str, path: str = ".") -> str:
    ws = _ws(env)
    base = ws.resolve(path)
    if not query:
        raise ToolFailed("query must not be empty")
    hits = []
    candidates = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
    for f in candidates:
        if f.is_symlink():
            continue
        text = f.read_bytes().decode("utf-8", "replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if query in line:
                hits.append(f"{ws.rel(f)}:{lineno}: {line[:200]}")
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
