"""Reading OpenEnv trace files as hostile data: size caps, no links, strict value checks.

A trace file comes from an agent's sandbox or someone else's disk. Nothing in it is executed or
followed: a file or folder that is a symbolic link is refused, a file larger than the cap is
refused before it is parsed, JSON's NaN/Infinity are refused, and every value this package uses
is checked for its type and size before it is used. Every refusal names the file (and the line of
a JSONL file) and what was wrong.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

SUFFIXES = (".json", ".jsonl")


class TraceError(ValueError):
    """A trace cannot be read (malformed, over a limit, a link, ...) or written as asked."""


@dataclass(frozen=True)
class TraceLimits:
    """Caps on what one import reads; a trace over one is refused, never cut short."""

    max_file_bytes: int = 256 * 2**20  # one trace file
    max_files: int = 10_000  # trace files under one folder
    max_traces: int = 100_000  # traces (episodes) in one import
    max_calls: int = 4_096  # model calls in one trace
    max_tokens: int = 1_048_576  # token ids of one call (prompt + completion)
    max_messages: int = 4_096  # messages of one call's request
    max_text_chars: int = 4 * 2**20  # one text field (a message's content, a reply's text)
    max_name_chars: int = 256  # ids and names: session, task, harness, node, tool
    max_depth: int = 32  # folders below the source folder


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise TraceError(f"{where}: not valid JSON ({e})") from None


def _read_capped(path: Path, limits: TraceLimits) -> str:
    """The text of a regular file, opened without following a link, at most max_file_bytes."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if path.is_symlink():
            raise TraceError(f"{path}: a symbolic link; trace files are read only as regular files") from None
        raise TraceError(f"{path}: cannot open ({e.strerror or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceError(f"{path}: not a regular file")
        if info.st_size > limits.max_file_bytes:
            raise TraceError(f"{path}: {info.st_size} bytes, over the limit of {limits.max_file_bytes}")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limits.max_file_bytes:  # grew while being read
                raise TraceError(f"{path}: over the limit of {limits.max_file_bytes} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None


def trace_files(src: Path, limits: TraceLimits) -> list[Path]:
    """The trace files to read: `src` itself, or every .json/.jsonl file under the folder `src`
    in sorted order (links, hidden entries and other suffixes left alone; a link is not followed)."""
    if src.is_symlink():
        raise TraceError(f"{src}: a symbolic link; give the file or folder itself")
    if not src.exists():
        raise TraceError(f"{src} does not exist")
    if src.is_file():
        return [src]
    if not src.is_dir():
        raise TraceError(f"{src}: neither a file nor a folder")
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        if depth > limits.max_depth:
            raise TraceError(f"{folder}: more than {limits.max_depth} folders deep")
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise TraceError(f"{folder}: cannot list ({e.strerror or e})") from None
        for entry in entries:
            if entry.name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_dir(follow_symlinks=False):
                walk(Path(entry.path), depth + 1)
            elif entry.is_file(follow_symlinks=False) and entry.name.endswith(SUFFIXES):
                found.append(Path(entry.path))
                if len(found) > limits.max_files:
                    raise TraceError(f"{src}: more than {limits.max_files} trace files")

    walk(src, 0)
    if not found:
        raise TraceError(f"{src}: no .json or .jsonl trace file in it")
    return found


def documents(path: Path, limits: TraceLimits) -> Iterator[tuple[str, Any]]:
    """(where, parsed document) for each document of a trace file: a .json file holds one (an
    object, or a list of trace entries); a .jsonl file one per non-empty line."""
    text = _read_capped(path, limits)
    if path.suffix == ".jsonl":
        # "\n" only: splitlines() would also break at U+2028 and the like, which JSON strings may hold
        for n, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                where = f"{path}:{n}"
                yield where, _parse_json(line, where)
    else:
        yield str(path), _parse_json(text, str(path))


# -- value checks -----------------------------------------------------------------------------------


class Checked:
    """Typed reads of one document's values under the import's limits; errors name `where`."""

    def __init__(self, where: str, limits: TraceLimits):
        self.where = where
        self.limits = limits

    def fail(self, what: str) -> TraceError:
        return TraceError(f"{self.where}: {what}")

    def obj(self, value: Any, what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"{what} is not a JSON object")
        return value

    def opt_obj(self, value: Any, what: str) -> dict[str, Any]:
        return {} if value is None else self.obj(value, what)

    def arr(self, value: Any, what: str, cap: int) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(f"{what} is not a JSON array")
        if len(value) > cap:
            raise self.fail(f"{what} has {len(value)} items, over the limit of {cap}")
        return value

    def ids(self, value: Any, what: str) -> list[int]:
        items = self.arr(value, what, self.limits.max_tokens)
        if any(type(v) is not int or v < 0 for v in items):
            raise self.fail(f"{what} holds something other than non-negative integer token ids")
        return items

    def logprobs(self, value: Any, what: str) -> list[float]:
        items = self.arr(value, what, self.limits.max_tokens)
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in items):
            raise self.fail(f"{what} holds something other than finite numbers")
        if any(v > 0 for v in items):
            raise self.fail(f"{what} holds a positive log-probability")
        return [float(v) for v in items]

    def mask(self, value: Any, what: str) -> list[int]:
        items = self.arr(value, what, 2 * self.limits.max_tokens)
        if any(type(v) is not int or v not in (0, 1) for v in items):
            raise self.fail(f"{what} holds something other than 0 and 1")
        return items

    def text(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise self.fail(f"{what} is not a string")
        if len(value) > self.limits.max_text_chars:
            raise self.fail(f"{what} has {len(value)} characters, over the limit of {self.limits.max_text_chars}")
        return value

    def opt_text(self, value: Any, what: str) -> str | None:
        return None if value is None else self.text(value, what)

    def name(self, value: Any, what: str) -> str | None:
        """An id or name (a string, or an integer written as one); None when absent or empty."""
        if value is None or value == "":
            return None
        if type(value) is int:
            value = str(value)
        if not isinstance(value, str):
            raise self.fail(f"{what} is not a string")
        if len(value) > self.limits.max_name_chars:
            raise self.fail(f"{what} is longer than {self.limits.max_name_chars} characters")
        if any(ord(c) < 32 for c in value):
            raise self.fail(f"{what} holds a control character")
        return value

    def number(self, value: Any, what: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{what} is not a finite number")
        return float(value)

    def count(self, value: Any, what: str) -> int | None:
        if value is None:
            return None
        if type(value) is not int or value < 0:
            raise self.fail(f"{what} is not a non-negative integer")
        return value

    def json_size(self, value: Any, what: str) -> Any:
        """A free-form JSON value kept as it is (metadata, sampling parameters), capped in size."""
        size = len(json.dumps(value, default=str))
        if size > self.limits.max_text_chars:
            raise self.fail(f"{what} is {size} characters of JSON, over the limit of {self.limits.max_text_chars}")
        return value
