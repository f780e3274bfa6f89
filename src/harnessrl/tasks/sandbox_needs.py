"""What a sandboxed program takes of the sandbox's limits while it runs, seen from the host:
`TreeWatch` samples the process tree under one host process (every sandbox this process starts
is in it, bwrap's pid namespace included) for its processes, its processes and threads (what
`processes` counts), the largest address space one process reserved (`VmPeak`: what `memory_mb`,
RLIMIT_AS, bounds) and the largest resident set (`VmHWM`), and the folder its `HOME` lies in (the
control folder of an agent program) for the bytes written there and its largest file (what
`file_size_mb` and `disk_mb` bound). harnessrl.preflight.sandbox_needs runs an agent program to
its first model call under it (`harnessrl preflight --needs`).

It reads /proc: on Linux, as a user who may read the tree's /proc/PID/status and environ (root,
or the same user without bubblewrap's uid change). Every sandbox this process runs meanwhile is
counted together: watch one program at a time.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_MB = 1024 * 1024
SAMPLE_S = 0.02  # how often the tree is sampled
# the HOME folder is walked with the samples, but never more than a tenth of the time goes to it
WALK_SHARE = 10


@dataclass
class TreeUse:
    """The most a watched tree took at once (counts) or in one process (sizes, in MB)."""

    processes: int = 0
    tasks: int = 0  # processes and threads
    address_space_mb: float = 0.0
    address_space_of: str = ""  # the name of the process that reserved it
    resident_mb: float = 0.0
    written_mb: float = 0.0  # under the folder holding HOME
    largest_file_mb: float = 0.0
    largest_file: str = ""  # relative to that folder


class TreeWatch(threading.Thread):
    """Samples the tree under `root` (default: this process) until `stop()`; `use` holds the peaks."""

    def __init__(self, root: int | None = None):
        super().__init__(name="tree-watch", daemon=True)
        self.root = os.getpid() if root is None else root
        self.use = TreeUse()
        self._done = threading.Event()
        self._home: Path | None = None

    def stop(self) -> TreeUse:
        self._done.set()
        self.join()
        self._walk_home()
        return self.use

    def run(self) -> None:
        next_walk = 0.0
        while not self._done.wait(SAMPLE_S):
            self._sample()
            if time.monotonic() >= next_walk:
                t0 = time.monotonic()
                self._walk_home()
                next_walk = time.monotonic() + WALK_SHARE * (time.monotonic() - t0)

    def _sample(self) -> None:
        use = self.use
        processes = tasks = 0
        for pid in _descendants(self.root):
            status = _status(pid)
            if not status:
                continue
            processes += 1
            tasks += int(status.get("Threads", "1") or 1)
            peak = _kb(status.get("VmPeak")) / 1024
            if peak > use.address_space_mb:
                use.address_space_mb, use.address_space_of = peak, status.get("Name", "")
            use.resident_mb = max(use.resident_mb, _kb(status.get("VmHWM")) / 1024)
            if self._home is None:
                self._home = _home_of(pid)
        use.processes, use.tasks = max(use.processes, processes), max(use.tasks, tasks)

    def _walk_home(self) -> None:
        """The bytes under the folder holding HOME, and its largest file (kept at their most)."""
        if self._home is None:
            return
        folder = self._home.parent
        total, largest, name = 0, 0, ""
        for where, _dirs, files in os.walk(folder):
            for file in files:
                try:
                    info = os.lstat(os.path.join(where, file))
                except OSError:
                    continue
                total += info.st_blocks * 512
                if info.st_size > largest:
                    largest, name = info.st_size, os.path.relpath(os.path.join(where, file), folder)
        use = self.use
        use.written_mb = max(use.written_mb, total / _MB)
        if largest / _MB > use.largest_file_mb:
            use.largest_file_mb, use.largest_file = largest / _MB, name


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _status(pid: int) -> dict[str, str]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        return {}
    return fields


def _kb(value: str | None) -> int:
    try:
        return int((value or "0").split()[0])
    except (ValueError, IndexError):
        return 0


def _home_of(pid: int) -> Path | None:
    """The HOME of a process of the tree, where it is a folder this host has (an agent's control
    folder is bound at its own path)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            variables = f.read().split(b"\0")
    except OSError:
        return None
    for variable in variables:
        if variable.startswith(b"HOME="):
            home = Path(variable[5:].decode("utf-8", "replace"))
            return home if home.is_dir() and home.parent.name.startswith("harnessrl-agent-") else None
    return None
