"""Why a sandboxed program stopped, in the words of its limits: which of the sandbox's limits
(`ExecLimits`: file size, processes, memory, CPU, disk) it met, told from the signal the sandbox
reports or the program's own error (a Node program that ignores SIGXFSZ says `EFBIG: file too
large`; one that cannot fork says `spawn EAGAIN`), and whether the program was found at all. The
caller names the field that sets each limit (`limits.` for an agent spec), so the reason says
what to raise.
"""

from __future__ import annotations

import re
from typing import Any

from harnessrl.tasks.sandbox_exec import ExecResult

# The signs of each limit: the words of the program's own error (or the sandbox's reason), the
# field that sets the limit, and its unit; the first that matches is named. (Threads count as
# processes: Go's and libuv's thread creation fail there; MemoryError finds Java's OutOfMemoryError.)
_LIMIT_SIGNS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"disk limit of \d+ MB exceeded|ENOSPC|No space left on device"), "disk_mb", "MB"),
    (re.compile(r"file size limit of \d+ MB exceeded|EFBIG|[Ff]ile too large"), "file_size_mb", "MB"),
    (re.compile(r"CPU time limit of \d+ s exceeded"), "cpu_s", "s"),
    (
        re.compile(
            r"(fork|spawn|thread|clone)\w*[^\n]{0,80}(EAGAIN|Resource temporarily unavailable)"
            r"|(EAGAIN|Resource temporarily unavailable)[^\n]{0,80}(fork|spawn|thread|clone)"
            r"|can't fork|[Cc]annot fork|can't start new thread|BlockingIOError|uv_thread_create"
            r"|failed to create new OS thread|failed to spawn thread"
        ),
        "processes",
        "processes and threads",
    ),
    (
        re.compile(
            r"MemoryError|Cannot allocate memory|ENOMEM|[Oo]ut of memory|Failed to reserve virtual memory"
            r"|std::bad_alloc|memory allocation of \d+ bytes failed|mmap\(?\)? failed"
        ),
        "memory_mb",
        "MB of address space per process",
    ),
)
# How a program that was never found ends: a shell's "not found" (exit 127), or an exec that
# failed in the sandbox's relay (FileNotFoundError / PermissionError from execvp).
_NOT_FOUND = re.compile(r"FileNotFoundError: \[Errno 2\]|: not found|No such file or directory")
_NOT_EXECUTABLE = re.compile(r"PermissionError: \[Errno 13\]|Permission denied")
_SHELL_NOT_FOUND = re.compile(r"sh: (?:line )?\d+: (?:exec: )?([^\s:]+): (?:command )?not found")  # dash, bash


def sandbox_limit(result: ExecResult, limits: Any, field_prefix: str = "limits.") -> str:
    """Which of the sandbox's limits stopped a program that failed, and how to raise it (the
    field `field_prefix + name` of `limits`); "" when none shows."""
    if result.returncode == 0 or result.stopped or result.timed_out:
        return ""
    text = f"{result.reason}\n{result.stderr[-4000:]}\n{result.stdout[-1000:]}"
    for pattern, name, unit in _LIMIT_SIGNS:
        if pattern.search(text):
            field = f"{field_prefix}{name}"
            return f"the sandbox's limit {field} ({getattr(limits, name):g} {unit}) stopped the program: raise {field}"
    return ""


def not_started(result: ExecResult, program: str) -> str:
    """ "the program 'x' was not found in the sandbox" (or could not be executed) for a program
    that never ran; "" when it ran."""
    tail = result.stderr[-2000:]
    named = _SHELL_NOT_FOUND.search(tail)
    if named is not None:  # a string command: the shell names the word it could not find
        program = named.group(1)
    if result.returncode == 127 or (result.returncode == 1 and "execvp" in tail and _NOT_FOUND.search(tail)):
        return f"the program {program!r} was not found in the sandbox (not on its PATH, or a path it does not show)"
    if result.returncode == 126 or (result.returncode == 1 and "execvp" in tail and _NOT_EXECUTABLE.search(tail)):
        return (
            f"the program {program!r} could not be executed in the sandbox (not executable, or not readable by "
            "its user)"
        )
    return ""
