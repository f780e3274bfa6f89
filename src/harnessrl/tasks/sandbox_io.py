"""What a sandboxed command writes while it runs: its output pipes, drained on threads and capped
(CappedReader), its input fed on a thread (feed), and what it adds to its writable folders,
measured against its disk limit (DiskWatch). Used by sandbox_exec.run_sandboxed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_MB = 1024 * 1024
_READ_CHUNK = 65536
DISK_POLL_S = 0.5  # how often the size of a command's writable folders is measured


class DiskWatch:
    """The disk limit of a command's writable folders: their size is measured when it starts and,
    at each `exceeded()`, again; more than `disk_mb` added is over the limit. A folder of many
    files is measured less often: never more than a tenth of the time goes to measuring."""

    def __init__(self, folders: Sequence[Path], disk_mb: int):
        self.folders = list(folders)
        self.limit = disk_mb * _MB
        t0 = time.monotonic()
        self.base = _disk_use(self.folders)
        self.next_at = time.monotonic() + max(DISK_POLL_S, 9 * (time.monotonic() - t0))
        self.over = ""

    def exceeded(self) -> bool:
        if not self.folders or time.monotonic() < self.next_at:
            return bool(self.over)
        t0 = time.monotonic()
        added = _disk_use(self.folders) - self.base
        self.next_at = time.monotonic() + max(DISK_POLL_S, 9 * (time.monotonic() - t0))
        if added > self.limit:
            self.over = f"disk limit of {self.limit // _MB} MB exceeded: {added // _MB} MB written to its folders"
        return bool(self.over)


def _disk_use(folders: Sequence[Path]) -> int:
    """Bytes the files under `folders` take on disk (allocated blocks: a sparse file counts what it holds)."""
    total = 0
    stack = [str(f) for f in folders]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:  # removed or unreadable meanwhile
            continue
    return total


class CappedReader:
    """Drains one pipe on a thread; keeps the first `cap` bytes and counts the rest."""

    def __init__(self, pipe, cap: int):
        self.cap = cap
        self.kept = bytearray()
        self.total = 0
        self._pipe = pipe
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        fd = self._pipe.fileno()
        while chunk := os.read(fd, _READ_CHUNK):
            self.total += len(chunk)
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
        self._pipe.close()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def text(self) -> str:
        return bytes(self.kept).decode("utf-8", "replace")


def feed(pipe, text: str) -> None:
    try:
        pipe.write(text.encode("utf-8"))
        pipe.close()
    except (BrokenPipeError, OSError):  # the command exited without reading all of it
        pass
