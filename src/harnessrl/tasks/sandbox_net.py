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
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harnessrl.tasks import net_forward

RELAY_FILE = "net_forward.py"
# what a hidden Python package's folder holds in the sandbox (sandbox_exec's `hidden`): an import
# of it fails instead of finding an empty namespace package
HIDDEN_PACKAGE_INIT = "hidden_package_init.py"
_HIDDEN_INIT_TEXT = 'raise ImportError("this package is hidden from sandboxed programs")\n'
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
    (folder / HIDDEN_PACKAGE_INIT).write_text(_HIDDEN_INIT_TEXT, encoding="utf-8")
    for name in (RELAY_FILE, HIDDEN_PACKAGE_INIT):
        (folder / name).chmod(0o644)
    return folder


def net_folder() -> Path:
    """This process's folder of the relay program, the hidden packages' `__init__.py` and the
    Unix sockets of host services (made once, mode 0755, removed when the process exits)."""
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


def relay_python(system: tuple[Path, ...], search_path: str, unreadable: Callable[[Path], str | None]) -> RelayPython:
    """The interpreter that runs the relay in the sandbox, and the host folders to show for it:
    this Python's base interpreter where the sandbox user can read it (`unreadable` says why
    not; as root, of another user), else a python3 of the system folders (`system`, searched on
    `search_path`). Raises NoRelayPython when there is neither."""
    return _relay_python(system, search_path, unreadable)


@dataclass(frozen=True)
class RelayPython:
    python: str
    shown: tuple[Path, ...]  # host folders the sandbox shows for it (its prefix when not a system one)


@functools.cache
def _relay_python(system: tuple[Path, ...], search_path: str, unreadable: Callable[[Path], str | None]) -> RelayPython:
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    prefix = Path(sys.base_prefix).resolve()
    tried = []
    if base.is_file() and base.is_relative_to(prefix):
        shown = () if any(prefix.is_relative_to(s) for s in system) else (prefix,)
        problem = unreadable(prefix) if shown else None
        if problem is None:
            return RelayPython(str(base), shown)
        tried.append(problem)
    for name in ("python3", "python"):
        found = shutil.which(name, path=search_path)
        if found is not None and any(Path(found).resolve().is_relative_to(s) for s in system):
            return RelayPython(found, ())
    raise NoRelayPython(
        "no Python the sandbox can run for its network relay: "
        + ("; ".join(tried) + "; " if tried else "")
        + "and no python3 in the system folders; install python3 (e.g. `apt-get install python3`) "
        "or let the agent use the host network (`network: host` in its spec)"
    )


def relay_argv(forwards: list[Forward], relay: RelayPython) -> tuple[list[str], list[Path]]:
    """(the argv words that start the relay before a command, host paths the sandbox must show
    read-only for it: the relay's folder and its Python's)."""
    folder = net_folder()
    words = [relay.python, "-I", "-S", str(folder / RELAY_FILE), *(f.argument() for f in forwards), "--"]
    return words, [folder, *relay.shown]


RELAY_BIND_FAILED = net_forward.BIND_FAILED
