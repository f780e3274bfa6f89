"""Checks on the files a `workspace` task leaves behind, and the setup that writes its files.

Text is compared line by line with trailing whitespace and trailing blank lines removed. A check
never raises: `run_checks` scores one that does (a missing, garbled or misplaced file) 0.
"""

from __future__ import annotations

from typing import Callable

from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment


def norm_lines(text: str | None) -> list[str] | None:
    """Lines with trailing whitespace and trailing blank lines removed (None stays None)."""
    if text is None:
        return None
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def read_text(env: Environment, rel: str) -> str | None:
    """A workspace file's text, or None when it is missing, a directory, unreadable, or not a
    file the host reads (a link, a hard link, a FIFO: Workspace.read)."""
    try:
        return env.require_workspace().read(rel)
    except Exception:
        return None


def read_lines(env: Environment, rel: str) -> list[str] | None:
    return norm_lines(read_text(env, rel))


def same_text(env: Environment, rel: str, expected: str) -> bool:
    got = read_lines(env, rel)
    return got is not None and got == norm_lines(expected)


def gone(env: Environment, rel: str) -> bool:
    """Nothing is left at `rel` (a link counts as something; a link on the way is not followed)."""
    try:
        return untrusted.kind(env.require_workspace().root, rel) is None
    except untrusted.Refused:
        return False


def fraction(flags: list[bool]) -> float:
    return sum(1.0 for f in flags if f) / len(flags) if flags else 1.0


# Checks that the agent left something alone. They earn credit only alongside progress on the
# task itself: an agent that does nothing keeps every file intact, and must not score for it.
PRESERVATION_CHECKS = frozenset({"kept", "others_kept", "source_kept", "others_unchanged"})


def run_checks(checks: dict[str, Callable[[], float | bool]]) -> dict[str, float]:
    """Evaluate named checks; one that raises (garbled state) scores 0, values are clamped.
    Preservation checks count only when some other check has credit."""
    out: dict[str, float] = {}
    for name, fn in checks.items():
        try:
            value = float(fn())
        except Exception:
            value = 0.0
        out[name] = min(1.0, max(0.0, value)) if value == value else 0.0
    if not any(v > 0 for k, v in out.items() if k not in PRESERVATION_CHECKS):
        out.update({k: 0.0 for k in out if k in PRESERVATION_CHECKS})
    return out


def setup_files(files: dict[str, str]) -> Callable[[Environment], None]:
    def setup(env: Environment) -> None:
        for rel, text in files.items():
            env.require_workspace().write(rel, text)

    return setup
