"""The probe of `harnessrl audit --harness` (audit_agent.py): run in the sandbox an agent program
gets, by the Python the agent would use. Standard library only: harnessrl's source is hidden
there, so this file is copied beside the episode's task file and run as a script:

    python view_probe.py JOB.json

JOB (written by audit_agent.py) says what to look for; the probe prints one JSON line of what it
found. It reads and connects; it writes nothing.

    import   whether `import harnessrl` works for this Python, and whether what it finds holds
             any of harnessrl's code (an empty folder of that name imports as an empty package)
    walk     every file outside the system folders, the workspace and `skip` (symlinks aside),
             counted per tree: the longest of `roots` holding it, else its first two path
             components (a time budget, `walk_s`; past it the counts are lower bounds); and the
             files whose path ends like one of harnessrl's modules (`modules`), counted per
             folder named harnessrl that holds them
    look     for each path of `look`: whether it is there and how many files it holds
    ports    for each [host, port] of `ports`: whether a TCP connection is accepted; a port of
             `tokens` is also read for the token its listener sends
    endpoint whether OPENAI_BASE_URL's host and port accept a connection and send `tokens`' token
    program  whether the command's program is found (on PATH when it is a bare name; null: not
             looked for)

With `import_only` set it does the first alone.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import sys
import time
from urllib.parse import urlsplit

_LOOK_CAP = 10_000  # files counted under one looked-at path


def _import() -> dict:
    try:
        module = importlib.import_module("harnessrl")
    except BaseException as e:  # noqa: BLE001 - a package put in its place may refuse in any way
        return {"imported": False, "error": f"{type(e).__name__}: {e}"[:300]}
    folders = [str(p) for p in getattr(module, "__path__", [])]
    code = [
        os.path.join(folder, name)
        for folder in folders
        if os.path.isdir(folder)
        for name in sorted(os.listdir(folder))
        if name.endswith(".py") and name != "__init__.py"
    ]
    return {"imported": True, "from": getattr(module, "__file__", None) or folders, "code": code[:5]}


def _group(folder: str, roots: list[str]) -> str:
    for root in roots:
        if folder == root or folder.startswith(root + "/"):
            return root
    parts = [p for p in folder.split("/") if p]
    return "/" + "/".join(parts[:2])


def _walk(job: dict) -> dict:
    skip = set(job["skip"])
    roots = sorted(job["roots"], key=len, reverse=True)
    file_roots = {r for r in roots if os.path.isfile(r)}
    endings = job["modules"]
    names = {e.rsplit("/", 1)[-1] for e in endings}
    counts: dict = {}
    modules: dict = {}
    deadline = time.monotonic() + job["walk_s"]
    stack = ["/"]
    stopped = False
    while stack:
        if time.monotonic() > deadline:
            stopped = True
            break
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        group = _group(folder, roots)
        for entry in entries:
            try:
                if entry.is_symlink():  # what it points to is counted where it is, if visible
                    continue
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                if entry.path not in skip:
                    stack.append(entry.path)
                continue
            where = entry.path if entry.path in file_roots else group
            counts[where] = counts.get(where, 0) + 1
            if entry.name in names and any(entry.path.endswith(e) for e in endings):
                package = entry.path[: entry.path.rindex("/harnessrl/") + len("/harnessrl")]
                modules[package] = modules.get(package, 0) + 1
    return {"trees": counts, "modules": modules, "stopped": stopped}


def _look(path: str, deadline: float) -> dict:
    if not os.path.lexists(path):
        return {"there": False, "files": 0}
    if not os.path.isdir(path):
        return {"there": True, "files": 1}
    files = 0
    for _, _, names in os.walk(path):
        files += len(names)
        if files >= _LOOK_CAP or time.monotonic() > deadline:
            break
    return {"there": True, "files": files}


def _connect(host: str, port: int, token: str | None) -> dict:
    try:
        sock = socket.create_connection((host, port), timeout=2.0)
    except OSError as e:
        return {"reached": False, "error": e.strerror or type(e).__name__}
    heard = ""
    if token:
        sock.settimeout(2.0)
        try:
            heard = sock.recv(256).decode("utf-8", "replace").strip()
        except OSError:
            pass
    sock.close()
    return {"reached": True, "answered": heard == token if token else None}


def _endpoint(tokens: dict) -> dict:
    url = urlsplit(os.environ.get("OPENAI_BASE_URL", ""))
    if not url.hostname or not url.port:
        return {"reached": False, "error": "no OPENAI_BASE_URL"}
    return {"url": url.geturl(), **_connect(url.hostname, url.port, tokens.get(str(url.port)))}


def _program(job: dict) -> dict:
    program = job["program"]
    if program is None:
        return {"found": None, "at": None}
    if "/" in program:
        return {"found": os.access(program, os.X_OK), "at": program}
    found = shutil.which(program)
    return {"found": found is not None, "at": found}


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    found: dict = {"python": sys.executable, "version": sys.version.split()[0], "import": _import()}
    if not job.get("import_only"):
        started = time.monotonic()
        found["walk"] = _walk(job)
        deadline = started + 2 * job["walk_s"]
        found["look"] = {path: _look(path, deadline) for path in job["look"]}
        tokens = job["tokens"]
        found["ports"] = [[host, port, _connect(host, port, tokens.get(str(port)))] for host, port in job["ports"]]
        found["endpoint"] = _endpoint(tokens)
        found["program"] = _program(job)
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
