"""A sandboxed command's own network: under bubblewrap, every command that does not ask for the
host network runs in a network namespace of its own, which has a loopback interface and nothing
else. What it may reach of the host is forwarded into it, port by port:

- a host service it must call (the recording endpoint of external agents) listens on a Unix
  socket as well as on its TCP port; inside the namespace, `127.0.0.1:PORT` is relayed to that
  socket (`Forward(tcp PORT, unix PATH)`), so the agent uses the same URL as outside and reaches
  that service only: no other host port, no other machine;
- a service that runs inside a sandbox (a task's mock service on its fixed port) is reached from
  the host through a Unix socket the relay listens on (`Forward(unix PATH, tcp PORT)`): two such
  services on the same port in two namespaces do not meet.

The relay (tasks/net_forward.py, standard library only) is copied into a folder of this process
(`net_folder()`, readable by the sandbox user) and run by a Python the sandbox can execute
(`relay_python()`), before the command, which it then becomes: the command starts only once
every forwarded address answers. Unix sockets cross namespaces through the file system: the
folder holding one is shown to the command (read-only to connect, read-write to listen).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from harnessrl.tasks import net_forward

RELAY_FILE = "net_forward.py"
_folder_lock = threading.Lock()


class NoRelayPython(RuntimeError):
    """No Python the sandbox can run was found for the port relay."""


@dataclass(frozen=True)
class Forward:
    """One forwarded address: connections to `listen` (inside the sandbox when `listen` is a
    port, on the host's file system when it is a socket path) are relayed to `connect`."""

    listen: int | Path
    connect: int | Path

    def argument(self) -> str:
        return f"{_spec(self.listen)}={_spec(self.connect)}"

    def sockets(self) -> list[Path]:
        return [p for p in (self.listen, self.connect) if isinstance(p, Path)]


def _spec(where: int | Path) -> str:
    return f"tcp:{where}" if isinstance(where, int) else f"unix:{where}"


@functools.cache
def _net_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-net-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    folder.chmod(0o755)  # mkdtemp's 0700 would hide it from the sandbox user
    shutil.copyfile(net_forward.__file__, folder / RELAY_FILE)
    (folder / RELAY_FILE).chmod(0o644)
    return folder


def net_folder() -> Path:
    """This process's folder of the relay program and of the Unix sockets of host services
    (made once, mode 0755, removed with the machine's temporary files)."""
    with _folder_lock:
        folder = _net_folder()
        if not (folder / RELAY_FILE).is_file():  # a temp-folder cleaner removed it meanwhile
            _net_folder.cache_clear()
            folder = _net_folder()
        return folder


def socket_path(name: str) -> Path:
    """A path for a host service's Unix socket in net_folder(): short, as the kernel limits a
    socket path to 107 bytes."""
    path = net_folder() / name
    if len(str(path).encode()) > 100:
        raise OSError(f"the Unix socket path {path} is too long (TMPDIR is a long path)")
    return path


def relay_python() -> tuple[str, list[Path]]:
    """(interpreter, host folders to show) that runs the relay in the sandbox: this Python's
    base interpreter where others can read it, else a python3 of the system (in /usr). Raises
    NoRelayPython when there is neither."""
    return _relay_python(os.geteuid() == 0)


@functools.cache
def _relay_python(as_root: bool) -> tuple[str, list[Path]]:
    from harnessrl.tasks.sandbox_exec import SANDBOX_PATH, SYSTEM_VIEW, unreadable_by_others

    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    prefix = Path(sys.base_prefix).resolve()
    system = tuple(Path("/" + entry) for entry in SYSTEM_VIEW)
    tried = []
    if base.is_file() and base.is_relative_to(prefix):
        shown = [] if any(prefix.is_relative_to(s) for s in system) else [prefix]
        problem = unreadable_by_others(prefix) if as_root and shown else None
        if problem is None:
            return str(base), shown
        tried.append(problem)
    for name in ("python3", "python"):
        found = shutil.which(name, path=SANDBOX_PATH)
        if found is not None and any(Path(found).resolve().is_relative_to(s) for s in system):
            return found, []
    raise NoRelayPython(
        "no Python the sandbox can run for its network relay: "
        + ("; ".join(tried) + "; " if tried else "")
        + "and no python3 in the system folders; install python3 (e.g. `apt-get install python3`) "
        "or let the agent use the host network (`network: host` in its spec)"
    )


def relay_argv(forwards: list[Forward]) -> tuple[list[str], list[Path]]:
    """(the argv words that start the relay before a command, host paths the sandbox must show
    read-only for it: the relay's folder and its Python)."""
    python, shown = relay_python()
    folder = net_folder()
    words = [python, "-I", "-S", str(folder / RELAY_FILE), *(f.argument() for f in forwards), "--"]
    return words, [folder, *shown]


RELAY_BIND_FAILED = net_forward.BIND_FAILED
