"""Every host read and write under a folder an agent could write: a workspace, an external
episode's control folder, a grader's output folder.

What an agent (or a program a grader ran) left in such a folder is hostile data, also after it
stopped, and the host process reading it is often root. So this module never resolves a path by
name: it opens the folder it is given (a path the host made), then each component below it
relative to the descriptor of the one before, with `O_NOFOLLOW`, so that a symbolic link
anywhere on the way is refused (`ELOOP` / `ENOTDIR`) instead of followed, and a folder swapped for
a link between a check and a use has no window to exploit: there is no second lookup by name.

Beyond links it refuses:
- anything but a regular file where a file is read or written (a FIFO would block the host, a
  device or socket is not data); opens are non-blocking so a FIFO cannot hang the open itself;
- a regular file with more than one hard link (it may be a host file linked in from outside; a
  write through it would change that file) or on another device than the folder;
- more bytes than the caller's cap: sizes an agent wrote are never trusted, a read stops at the
  cap whatever `st_size` says (a sparse file of a terabyte costs one capped read).

Callers turn `Refused` into what fits them: a blocked tool call (the file tools), no answer with
the reason (an external agent's answer file), or an infrastructure error naming the file (a
grader's reward). `tests/test_untrusted.py` holds the house rule: the code under tasks/ and
harness/ reaches a workspace only through here.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
DEFAULT_READ_CAP = 1 << 20  # bytes read of one file unless the caller says otherwise
MAX_LISTED = 100_000  # entries a walk of an agent's folder visits before it refuses


class Refused(Exception):
    """A path under an agent's folder that the host will not follow, open or trust.

    `reason`: `link` (a symbolic link on the way or at the end), `hardlink`, `not_regular` (a
    FIFO, device, socket, or a folder where a file was asked), `too_large`, `outside` (an
    absolute path or `..`), `missing`, `too_many` (a walk over MAX_LISTED entries).
    """

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Entry:
    """A file or folder found under an agent's folder, with its own (not followed) status."""

    rel: str  # relative to the folder, '/'-separated
    kind: str  # file | dir | link | other
    size: int  # st_size as the agent left it: a hint, never a read length


def parts_of(rel: str | PurePosixPath) -> list[str]:
    """The components of a relative path, or Refused (`outside`) for an absolute path, `..`, a
    NUL byte or a drive letter. `.` and empty components are dropped; `\\` separates as `/`."""
    text = str(rel)
    if "\x00" in text:
        raise Refused(f"'{text[:80]}' holds a NUL byte", "outside")
    if text.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", text):
        raise Refused(f"'{text}' is an absolute path", "outside")
    parts = [p for p in re.split(r"[\\/]+", text) if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"'{text}' leaves the folder ('..')", "outside")
    return parts


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _shown(parts: list[str]) -> str:
    return "/".join(parts) or "."


@contextmanager
def _opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _open_root(root: Path) -> int:
    """The folder itself: a path the host made, opened without following a final link."""
    try:
        return os.open(root, _DIR_FLAGS)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise Refused(f"the folder {root} does not exist", "missing") from None
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Refused(f"the folder {root} is a link or not a folder", "link") from None
        raise


def _step(fd: int, name: str, shown: str, create: bool) -> int:
    """The folder `name` under descriptor `fd`, never through a link (created when asked)."""
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ENOENT and create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                continue
            if e.errno == errno.ENOENT:
                raise Refused(f"no such folder: {shown}", "missing") from None
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                kind = _lkind(fd, name)
                if kind == "link":
                    raise Refused(f"{shown} is a symbolic link; it is not followed", "link") from None
                raise Refused(f"{shown} is not a folder", "not_regular") from None
            raise
    raise Refused(f"no such folder: {shown}", "missing")


def _lkind(fd: int, name: str) -> str | None:
    try:
        return _kind(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return None


@contextmanager
def folder(root: Path, rel: str | PurePosixPath = ".", *, create: bool = False) -> Iterator[int]:
    """A descriptor of the folder `rel` under `root`, reached component by component without
    following a link (missing folders made when `create`); closed on exit."""
    parts = parts_of(rel)
    fd = _open_root(root)
    try:
        for i, name in enumerate(parts):
            nxt = _step(fd, name, _shown(parts[: i + 1]), create)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _split(rel: str | PurePosixPath) -> tuple[list[str], str]:
    parts = parts_of(rel)
    if not parts:
        raise Refused("the folder itself is not a file", "not_regular")
    return parts[:-1], parts[-1]


def _check_regular(st: os.stat_result, root_dev: int, shown: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise Refused(f"{shown} is not a regular file ({_kind(st.st_mode)})", "not_regular")
    if st.st_nlink > 1:
        raise Refused(f"{shown} has {st.st_nlink} hard links; a linked file is not read or written", "hardlink")
    if st.st_dev != root_dev:
        raise Refused(f"{shown} lies on another device than its folder", "hardlink")


def _open_file(dfd: int, name: str, flags: int, shown: str) -> int:
    try:
        return os.open(name, flags | _FILE_FLAGS, 0o644, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise Refused(f"no such file: {shown}", "missing") from None
        if e.errno == errno.ELOOP:
            raise Refused(f"{shown} is a symbolic link; it is not followed", "link") from None
        if e.errno in (errno.EISDIR, errno.ENXIO, errno.ENOTDIR):
            raise Refused(f"{shown} is not a regular file", "not_regular") from None
        raise


def lstat(root: Path, rel: str | PurePosixPath) -> os.stat_result | None:
    """The status of `rel` itself (a link is reported as a link), or None when it is missing or
    a folder on the way is missing; Refused when a link or a non-folder is on the way."""
    parts = parts_of(rel)
    if not parts:
        with _opened(_open_root(root)) as fd:
            return os.fstat(fd)
    try:
        with folder(root, PurePosixPath(*parts[:-1]) if parts[:-1] else ".") as dfd:
            return os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except Refused as e:
        if e.reason == "missing":
            return None
        raise


def kind(root: Path, rel: str | PurePosixPath) -> str | None:
    """`file`, `dir`, `link` or `other` for `rel` itself; None when missing. A link on the way
    is Refused."""
    st = lstat(root, rel)
    return None if st is None else _kind(st.st_mode)


def is_file(root: Path, rel: str | PurePosixPath) -> bool:
    """`rel` is a regular file with one link (what `read_bytes` would read); False for a link,
    a hard-linked file, anything else, a missing path or one behind a link."""
    try:
        st = lstat(root, rel)
    except Refused:
        return False
    return st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def read_bytes(root: Path, rel: str | PurePosixPath, cap: int = DEFAULT_READ_CAP, *, truncate: bool = False) -> bytes:
    """The bytes of the regular file `rel`: at most `cap` of them when `truncate`, else Refused
    (`too_large`) when it holds more. Refused for a link, a hard link, a FIFO or device."""
    dirs, name = _split(rel)
    shown = str(rel)
    with folder(root, PurePosixPath(*dirs) if dirs else ".") as dfd:
        root_dev = os.fstat(dfd).st_dev
        with _opened(_open_file(dfd, name, os.O_RDONLY, shown)) as fd:
            _check_regular(os.fstat(fd), root_dev, shown)
            chunks, got = [], 0
            while got <= cap:
                chunk = os.read(fd, min(1 << 16, cap + 1 - got))
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
    data = b"".join(chunks)
    if len(data) > cap:
        if not truncate:
            raise Refused(f"{shown} holds more than {cap} bytes", "too_large")
        data = data[:cap]
    return data


def read_text(root: Path, rel: str | PurePosixPath, cap: int = DEFAULT_READ_CAP, *, truncate: bool = False) -> str:
    """`read_bytes` decoded as UTF-8 (undecodable bytes replaced)."""
    return read_bytes(root, rel, cap, truncate=truncate).decode("utf-8", "replace")


def read_optional(root: Path, rel: str | PurePosixPath, cap: int = DEFAULT_READ_CAP) -> str | None:
    """`read_text`, or None when the file is missing; any other refusal is raised."""
    try:
        return read_text(root, rel, cap)
    except Refused as e:
        if e.reason == "missing":
            return None
        raise


def write_bytes(
    root: Path, rel: str | PurePosixPath, data: bytes, *, append: bool = False, make_parents: bool = True
) -> None:
    """Write (or append) `data` to the regular file `rel`, creating it and, when `make_parents`,
    its folders; a link anywhere on the way, a hard-linked file or a non-regular file is
    Refused and nothing is written."""
    dirs, name = _split(rel)
    shown = str(rel)
    with folder(root, PurePosixPath(*dirs) if dirs else ".", create=make_parents) as dfd:
        root_dev = os.fstat(dfd).st_dev
        with _opened(_open_file(dfd, name, os.O_WRONLY | os.O_CREAT, shown)) as fd:
            _check_regular(os.fstat(fd), root_dev, shown)
            if append:
                os.lseek(fd, 0, os.SEEK_END)
            else:
                os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]


def write_text(root: Path, rel: str | PurePosixPath, text: str, *, append: bool = False) -> None:
    write_bytes(root, rel, text.encode("utf-8"), append=append)


def make_folder(root: Path, rel: str | PurePosixPath) -> None:
    """Make the folder `rel` and its parents; Refused where a link or a file stands on the way."""
    with folder(root, rel, create=True):
        pass


def remove(root: Path, rel: str | PurePosixPath, *, tree: bool = False) -> bool:
    """Remove `rel` itself (a link is removed, never followed); a folder only when empty, or with
    everything under it when `tree` (descriptor-relative, links inside are removed, not
    followed). False when it was missing."""
    dirs, name = _split(rel)
    try:
        with folder(root, PurePosixPath(*dirs) if dirs else ".") as dfd:
            k = _lkind(dfd, name)
            if k is None:
                return False
            if k != "dir":
                os.unlink(name, dir_fd=dfd)
            elif tree:
                shutil.rmtree(name, dir_fd=dfd)
            else:
                os.rmdir(name, dir_fd=dfd)
            return True
    except Refused as e:
        if e.reason == "missing":
            return False
        raise


def rename(root: Path, source: str | PurePosixPath, destination: str | PurePosixPath) -> None:
    """Move `source` (the entry itself, a link as a link) to `destination` inside the folder,
    making the destination's parent folders; Refused when a link stands on either way."""
    sdirs, sname = _split(source)
    ddirs, dname = _split(destination)
    with folder(root, PurePosixPath(*sdirs) if sdirs else ".") as sfd:
        with folder(root, PurePosixPath(*ddirs) if ddirs else ".", create=True) as dfd:
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)


def entries(root: Path, rel: str | PurePosixPath = ".") -> list[Entry]:
    """The entries of the folder `rel`, sorted by name, each with its own kind (not followed)."""
    base = parts_of(rel)
    out = []
    with folder(root, rel) as fd:
        with os.scandir(fd) as it:
            for i, item in enumerate(it):
                if i >= MAX_LISTED:
                    raise Refused(f"{_shown(base)} holds more than {MAX_LISTED} entries", "too_many")
                st = item.stat(follow_symlinks=False)
                out.append(Entry("/".join([*base, item.name]), _kind(st.st_mode), st.st_size))
    return sorted(out, key=lambda e: e.rel)


def walk(root: Path, rel: str | PurePosixPath = ".", *, limit: int = MAX_LISTED) -> list[Entry]:
    """Every entry under the folder `rel`, depth first, sorted; links are listed as links and
    never entered; Refused (`too_many`) past `limit` entries."""
    base = parts_of(rel)
    out: list[Entry] = []
    with folder(root, rel) as top:
        for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            prefix = [p for p in PurePosixPath(dirpath).parts if p != "."]
            for name in dirnames + filenames:
                if len(out) >= limit:
                    raise Refused(f"{_shown(base)} holds more than {limit} entries", "too_many")
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                out.append(Entry("/".join([*base, *prefix, name]), _kind(st.st_mode), st.st_size))
    return sorted(out, key=lambda e: e.rel)


def copy_in(source: Path, root: Path, rel: str | PurePosixPath = ".") -> None:
    """Copy the trusted host folder (or file) `source` into `rel` under the agent's folder,
    merging into what is there; every destination component is reached without following a
    link, so a link the agent left where a copied file goes is Refused, not written through.
    Links inside `source` (the task's own files) are copied as links."""
    if source.is_dir() and not source.is_symlink():
        make_folder(root, rel)
        for child in sorted(source.iterdir()):
            copy_in(child, root, PurePosixPath(*parts_of(rel), child.name))
        return
    dirs, name = _split(rel)
    if source.is_symlink():
        with folder(root, PurePosixPath(*dirs) if dirs else ".", create=True) as dfd:
            if _lkind(dfd, name) is not None:
                raise Refused(f"{rel} already exists", "not_regular")
            os.symlink(os.readlink(source), name, dir_fd=dfd)
        return
    write_bytes(root, rel, source.read_bytes())
    mode = source.stat().st_mode & 0o777
    with folder(root, PurePosixPath(*dirs) if dirs else ".") as dfd:
        _chmod_at(dfd, name, mode)


def _chmod_at(dfd: int, name: str, mode: int) -> None:
    """chmod of a file just written, through a descriptor opened without following a link."""
    with _opened(_open_file(dfd, name, os.O_RDONLY, name)) as fd:
        os.fchmod(fd, mode)


def total_file_bytes(root: Path, rel: str | PurePosixPath = ".") -> int:
    """The bytes the regular files under `rel` take on disk by their status (a quota check:
    fail-closed, a sparse file counts its full size)."""
    return sum(e.size for e in walk(root, rel) if e.kind == "file")
