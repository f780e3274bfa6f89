"""Run an untrusted command (an agent's shell call, a third-party grader) inside limits.

Two isolation levels, chosen once per process by `isolation_available()`:

- "bwrap": bubblewrap builds a new mount namespace whose root is the host filesystem read-only
  (every top-level entry bind-mounted read-only, so a mount point such as `/workspace` can be
  created even where the host has none), a fresh tmpfs `/tmp`, fresh `/dev` and `/proc`, the
  workspace folder(s) bound read-write, and new user, pid, ipc, uts and (unless network=True)
  network namespaces. Killing the outer bwrap process tears down the whole pid namespace.
  A mount point inside an existing home or data folder (`/root/.openclaw/workspace`,
  `/home/user/app`) gets a fresh tmpfs in place of that top-level folder, like `/tmp`: the host's
  folder is hidden and the mount is made inside the empty one (see `mount_point_problem`).
- "rlimits-only": bubblewrap is missing or does not work here. The command runs directly, in its
  own session, with the same resource limits and no filesystem or network isolation.

Resource limits are rlimits: CPU seconds, address space, file size, and the process count.
RLIMIT_NPROC is never enforced for uid 0 (the kernel exempts root even inside a user namespace
mapped to root), and it counts the processes of a *uid*, machine-wide, not those of one command.
So when we are root the command never runs as root, and its uid is chosen so that the count is
this sandbox's alone:

- bwrap (with `prlimit`): the child drops to the unprivileged uid/gid 65534 ("nobody") before
  bwrap starts, and `prlimit` sets the process limit *after* the user namespace exists. The
  kernel then counts the processes of that namespace's uid, i.e. of this one sandbox; other
  processes of uid 65534 on the machine (sandboxes side by side, a daemon) do not count.
- rlimits-only (or bwrap without `prlimit`): the limit is set before exec, outside any user
  namespace, where every process of the uid counts. The command therefore gets a uid (and gid)
  of its own for the call, drawn from PRIVATE_UID_POOL, one that no process on the machine has
  and no user account names. A dedicated uid is the one choice that holds as root on any Linux:
  a limit relative to the uid's current count would let a fork bomb in one sandbox starve the
  commands of another sharing the uid, and a cgroup pids controller is not writable (or not
  there) on many machines and containers. The price: the uid has no name (`whoami` fails).
  Where the pool is not mapped in our user namespace (a rootless container mapping only 0-65535)
  the command runs as 65534 with the limit set to that uid's current task count plus
  `processes`, and when we are not root it keeps our uid with the same relative limit: both
  are approximate, as other processes of the uid that start or end during the call move it.

The folders the command may write are chowned to its uid first. Measured here (kernel 6.18,
bwrap 0.8, root, 20 other processes of uid 65534 alive): a fork bomb under processes=16 peaks at
16 live processes rlimits-only and 17 under bwrap (bwrap's own, outside the namespace), and the
call returns at the wall limit.

The wall clock kills the whole process group (and with bwrap the pid namespace) with SIGKILL.
Both output pipes are drained by reader threads, so a chatty command never blocks; only the first
`output_bytes` of each stream are kept.
"""

from __future__ import annotations

import functools
import os
import pwd
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # "nobody": the uid a command runs as under bwrap when we are root
# The uids (and gids) a command gets one of, for the call, when its process limit must be set
# outside a user namespace (see the module docstring). 1.9e9 lies in the span no distribution,
# systemd or container manager assigns: above systemd's container ranges (which end at
# 1879048191) and below 2**31, from where many programs mishandle uids.
PRIVATE_UID_POOL = range(1_900_000_000, 1_901_000_000)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MB = 1024 * 1024
_READ_CHUNK = 65536
_STOP_POLL_S = 0.05  # how often a command with a `stop` event looks at it
# The sandbox's pid 1: a shell that runs the command as its child and exits with its status.
# The command must not be pid 1 itself: the kernel drops signals such as SIGXCPU and SIGTERM
# sent to a namespace's init that has no handler for them. (`; exit $?` keeps sh from exec'ing.)
_SANDBOX_INIT = ["sh", "-c", '"$@"; exit $?', "sandbox-init"]
# Paths bwrap provides itself; they are not bound from the host.
_FRESH_ROOT_ENTRIES = ("proc", "dev", "tmp")
# Top-level folders every command runs on (programs, libraries, configuration, kernel views):
# nothing is mounted at or inside them.
SYSTEM_TOP_LEVEL = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "usr"}
)
# Top-level folders that may hold software or state a command needs: they stay visible, so a
# mount inside one must be at a folder that already exists there (it hides only that folder).
KEPT_TOP_LEVEL = frozenset({"nix", "opt", "run", "snap", "var"})


@dataclass(frozen=True)
class ExecLimits:
    wall_s: float = 30.0  # wall clock; the whole process tree is killed at the limit
    cpu_s: int = 30  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    file_size_mb: int = 64  # RLIMIT_FSIZE
    processes: int = 64  # process count limit
    output_bytes: int = 1_000_000  # stdout/stderr kept (each); more is cut and flagged


@dataclass
class ExecResult:
    returncode: int | None  # None when killed by the wall clock
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    duration_s: float
    isolation: str  # "bwrap" or "rlimits-only"
    reason: str = ""  # why it was killed / limited, human readable, "" when clean
    stopped: bool = False  # killed because the caller set its `stop` event (returncode None)


def isolation_description(isolation: str) -> str:
    """How a run config states the isolation level to a reader."""
    return "bwrap" if isolation == "bwrap" else "rlimits-only: no filesystem isolation"


@functools.cache
def isolation_available() -> str:
    """ "bwrap" if bubblewrap works here (probed once with a real sandboxed `true`), else "rlimits-only"."""
    if shutil.which("bwrap") is None:
        return "rlimits-only"
    probe_dir = Path(tempfile.mkdtemp(prefix="harnessrl-bwrap-probe-"))
    try:
        result = _run(
            ["true"],
            workdir=probe_dir,
            mounts=None,
            env=None,
            limits=ExecLimits(wall_s=10.0),
            network=False,
            stdin=None,
            cwd_in_sandbox=None,
            isolation="bwrap",
        )
        return "bwrap" if result.returncode == 0 else "rlimits-only"
    except OSError:
        return "rlimits-only"
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


def run_sandboxed(
    argv: list[str],
    *,
    workdir: Path,
    mounts: dict[str, Path] | None = None,
    env: dict[str, str] | None = None,
    limits: ExecLimits = ExecLimits(),
    network: bool = False,
    stdin: str | None = None,
    cwd_in_sandbox: str | None = None,
    stop: threading.Event | None = None,
    read_only: Sequence[Path] = (),
) -> ExecResult:
    """Run argv under `limits`, writable only in `workdir` (or the `mounts`), and wait for it.

    `mounts` maps absolute sandbox paths to host folders, each bound read-write; without it
    `workdir` is bound at its own path. The command starts in `cwd_in_sandbox`, by default where
    `workdir` appears in the sandbox. Its environment is PATH, HOME (= that folder), LANG, plus
    `env`; nothing is inherited from this process. Setting `stop` (from another thread) kills
    the command's whole tree at once, as the wall clock does; the result then has `stopped`.
    `read_only`: host paths the command must see although they lie where the sandbox puts a
    fresh tmpfs (under /tmp, e.g. a checkout and its virtual environment there): bound read-only
    at their own path. Paths elsewhere are visible anyway (the root is bound read-only).

    Raises ValueError for arguments that cannot be honoured (an empty argv, a relative mount
    point or one `mount_point_problem` refuses, a folder the sandbox user cannot reach) and, in
    rlimits-only mode, for mounts at a path other than their host path (they need bubblewrap).
    """
    return _run(
        argv,
        workdir=workdir,
        mounts=mounts,
        env=env,
        limits=limits,
        network=network,
        stdin=stdin,
        cwd_in_sandbox=cwd_in_sandbox,
        isolation=isolation_available(),
        stop=stop,
        read_only=read_only,
    )


# ----------------------------------------------------------------------------------------------


def _run(
    argv, *, workdir, mounts, env, limits, network, stdin, cwd_in_sandbox, isolation, stop=None, read_only=()
) -> ExecResult:
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
    workdir = Path(workdir).resolve()
    binds = _check_mounts({str(workdir): workdir} if mounts is None else mounts)
    cwd = cwd_in_sandbox or next((dst for dst, src in binds.items() if src == workdir), next(iter(binds)))
    if isolation != "bwrap":
        moved = [dst for dst, src in binds.items() if Path(dst) != src]
        if moved:
            raise ValueError(f"mounts at {moved} need bubblewrap, which does not work here (isolation: rlimits-only)")
    child_env = {"PATH": SANDBOX_PATH, "HOME": cwd, "LANG": "C.UTF-8", **(env or {})}
    nproc_in_sandbox = isolation == "bwrap" and shutil.which("prlimit") is not None
    if nproc_in_sandbox:
        identity = _Identity(uid=SANDBOX_UID if os.geteuid() == 0 else None, nproc=None)
    else:
        # our reader threads (and the stdin feeder) start after the count and are of our uid
        identity = _claim_identity(limits.processes, own_threads=2 + (stdin is not None))
    try:
        if identity.uid is not None:
            for src in binds.values():
                _hand_over(src, identity.uid)
        if isolation == "bwrap":
            command = (
                _bwrap_argv(binds, cwd, network, read_only)
                + (["prlimit", f"--nproc={limits.processes}:{limits.processes}", "--"] if nproc_in_sandbox else [])
                + _SANDBOX_INIT
                + list(argv)
            )
            host_cwd = None
        else:
            command, host_cwd = list(argv), cwd
        return _launch(
            command,
            argv,
            env=child_env,
            cwd=host_cwd,
            stdin=stdin,
            limits=limits,
            identity=identity,
            isolation=isolation,
            stop=stop,
        )
    finally:
        identity.release()


@dataclass(frozen=True)
class _Identity:
    """Who a command runs as, and the RLIMIT_NPROC set before its exec."""

    uid: int | None  # the uid and gid to drop to; None: keep ours (we are not root)
    nproc: int | None  # None: `prlimit` sets the process limit inside bwrap's user namespace
    claimed: bool = False  # a uid of PRIVATE_UID_POOL, held for this call

    def release(self) -> None:
        if self.claimed:
            with _claimed_lock:
                _claimed_uids.discard(self.uid)


_claimed_uids: set[int] = set()  # private uids of the calls running in this process now
_claimed_lock = threading.Lock()


def _claim_identity(processes: int, own_threads: int) -> _Identity:
    """The uid and process limit for a command whose limit is set before exec (see the docstring)."""
    if os.geteuid() == 0:
        if _pool_is_mapped():
            return _Identity(uid=_claim_private_uid(), nproc=processes, claimed=True)
        return _Identity(uid=SANDBOX_UID, nproc=_tasks_of(SANDBOX_UID) + processes)
    return _Identity(uid=None, nproc=_tasks_of(os.getuid()) + own_threads + processes)


def _claim_private_uid() -> int:
    """A uid of PRIVATE_UID_POOL that no process has, no account names and no other call holds."""
    in_use = _process_owners()
    first = secrets.randbelow(len(PRIVATE_UID_POOL))  # random: other harnessrl processes draw too
    with _claimed_lock:
        for i in range(len(PRIVATE_UID_POOL)):
            uid = PRIVATE_UID_POOL[(first + i) % len(PRIVATE_UID_POOL)]
            if uid in in_use or uid in _claimed_uids or _has_account(uid):
                continue
            _claimed_uids.add(uid)
            return uid
    raise OSError(f"no free uid for a sandboxed command: every uid of {PRIVATE_UID_POOL} is in use")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


@functools.cache
def _pool_is_mapped() -> bool:
    """Whether this user namespace can setuid/setgid to the whole PRIVATE_UID_POOL."""
    for ids in ("uid_map", "gid_map"):
        try:
            lines = Path(f"/proc/self/{ids}").read_text().splitlines()
        except OSError:
            return False
        spans = [tuple(map(int, line.split())) for line in lines if len(line.split()) == 3]
        if not any(
            inside <= PRIVATE_UID_POOL.start and PRIVATE_UID_POOL.stop <= inside + count
            for inside, _outside, count in spans
        ):
            return False
    return True


def _process_owners() -> set[int]:
    """The effective uids of the processes this one can see.

    From the owner of /proc/PID: a tenth of a millisecond per hundred processes, where reading
    /proc/PID/status (real uids) costs ten. A process that made itself non-dumpable shows as
    root; if a sandbox's did and outlived its call, a later call that drew its uid again (one
    chance in len(PRIVATE_UID_POOL)) would count it against its limit: one process too many.
    """
    owners = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            owners.add(os.stat(f"/proc/{pid}").st_uid)
        except OSError:  # it ended meanwhile
            continue
    return owners


def _tasks_of(uid: int) -> int:
    """The tasks (processes and threads) whose real uid is `uid`: what RLIMIT_NPROC counts."""
    tasks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        real_uid, threads = None, 1
        try:
            with open(f"/proc/{pid}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        real_uid = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
        except (OSError, ValueError):  # it ended meanwhile
            continue
        if real_uid == uid:
            tasks += threads
    return tasks


def _launch(
    command, argv, *, env, cwd, stdin, limits: ExecLimits, identity: _Identity, isolation, stop=None
) -> ExecResult:
    def limit_child() -> None:  # runs in the child between fork and exec
        # The CPU hard limit is one second above the soft one, so a busy command gets SIGXCPU
        # (reported as a CPU limit) and only one that ignores it gets SIGKILL.
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        for res, value in (
            (resource.RLIMIT_AS, limits.memory_mb * _MB),
            (resource.RLIMIT_FSIZE, limits.file_size_mb * _MB),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(res, (value, value))
        if identity.nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (identity.nproc, identity.nproc))
        if identity.uid is not None:
            os.setgroups([])
            os.setgid(identity.uid)
            os.setuid(identity.uid)

    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=limit_child,
        )
    except BlockingIOError as e:  # EAGAIN at exec: the uid is already at the process limit
        who = f"uid {identity.uid}" if identity.uid is not None else "this user"
        raise OSError(
            e.errno,
            f"cannot start {argv[0]!r}: {who} already has {identity.nproc} processes "
            f"(the process limit, counted over every process of that uid; isolation: {isolation})",
        ) from None
    out, err = _CappedReader(proc.stdout, limits.output_bytes), _CappedReader(proc.stderr, limits.output_bytes)
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    timed_out = stopped = False
    deadline = start + limits.wall_s
    while True:
        left = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(0.0, left if stop is None else min(left, _STOP_POLL_S)))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            if stop is not None and stop.is_set():
                stopped = True
                break
    # Kill what is left either way: at the wall limit the whole tree, after a clean exit any
    # background process that would otherwise keep running and hold the output pipes open.
    _kill_group(proc.pid)
    proc.wait()
    duration = time.monotonic() - start
    for reader in (out, err):
        reader.join(timeout=2.0)
    truncated = out.truncated or err.truncated
    returncode = None if timed_out or stopped else proc.returncode
    reason = _reason(returncode, timed_out, limits, out, err)
    if stopped:
        reason = "; ".join(["stopped by the caller", *([reason] if reason else [])])
    return ExecResult(
        returncode=returncode,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        output_truncated=truncated,
        duration_s=duration,
        isolation=isolation,
        reason=reason,
        stopped=stopped,
    )


def mount_point_problem(dst: str) -> str | None:
    """Why a folder cannot be mounted at the absolute sandbox path `dst` on this machine, or None.

    Possible: a path under /tmp (fresh in the sandbox), under a top-level folder this machine
    lacks (/app, /workspace: made in the sandbox), at an existing folder inside /opt, /var, /run
    (binding over it hides only it), and anywhere at or inside another existing top-level folder
    (/root/..., /home/..., /srv/..., /mnt/...): a mount strictly inside one gets a fresh tmpfs in
    place of that folder. Refused: `/` and the system folders (SYSTEM_TOP_LEVEL).
    """
    if not isinstance(dst, str) or not dst.startswith("/"):
        return f"the mount point must be an absolute path, got {dst!r}"
    norm = os.path.normpath(dst)
    top = norm.strip("/").split("/")[0]
    if norm == "/":
        return "cannot mount a folder at /: it would replace the whole file system"
    if top in SYSTEM_TOP_LEVEL:
        return (
            f"cannot mount at {dst}: /{top} holds this machine's system files, which every command "
            "in the sandbox runs on; choose a path such as /app, /workspace, /root/... or /tmp/..."
        )
    if top == "tmp" or not os.path.lexists("/" + top):
        return None
    if not os.path.isdir("/" + top):
        return f"cannot mount at {dst}: /{top} exists on this machine and is not a folder"
    if top in KEPT_TOP_LEVEL and (norm == "/" + top or not os.path.isdir(norm)):
        return (
            f"cannot mount at {dst}: /{top} stays visible in the sandbox (it may hold software or state "
            "commands use), so a mount there must be at a folder that exists inside it; choose a path such "
            "as /app, /workspace, /root/... or /tmp/..."
        )
    return None


def _check_mounts(mounts: dict[str, Path]) -> dict[str, Path]:
    """Validate sandbox mount points; returns {sandbox path: resolved host folder}."""
    binds: dict[str, Path] = {}
    for dst, src in mounts.items():
        problem = mount_point_problem(dst)
        if problem:
            raise ValueError(problem)
        host = Path(src).resolve()
        if not host.is_dir():
            raise ValueError(f"mount source {src} is not a folder")
        binds[os.path.normpath(dst)] = host
    return binds


def _shadowed_top_level(binds: dict[str, Path]) -> set[str]:
    """Existing top-level folders that get a fresh tmpfs because a mount point lies inside one."""
    tops = set()
    for dst in binds:
        top, _, rest = dst.strip("/").partition("/")
        if rest and top != "tmp" and top not in KEPT_TOP_LEVEL and os.path.lexists("/" + top):
            tops.add(top)
    return tops


def _hand_over(folder: Path, uid: int) -> None:
    """Give a folder to the sandbox uid (we are root), after checking that uid can reach it."""
    for parent in folder.parents:
        if not os.stat(parent).st_mode & 0o001:
            raise ValueError(
                f"the sandbox user (uid {uid}) cannot reach {folder}: {parent} is not searchable by others"
            )
    for root, dirs, files in os.walk(folder):
        os.lchown(root, uid, uid)
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            # A file with several links may be a hard link a command made to a file outside the
            # folder: chowning it would hand that file over. (Those a command made are its own,
            # or an earlier call's, whose private uid owned it anyway: they are handed over.)
            if info.st_uid != uid and (
                stat.S_ISDIR(info.st_mode) or info.st_nlink == 1 or info.st_uid in PRIVATE_UID_POOL
            ):
                os.lchown(path, uid, uid)


def _bwrap_argv(binds: dict[str, Path], cwd: str, network: bool, read_only: Sequence[Path] = ()) -> list[str]:
    args = ["bwrap"]
    shadowed = _shadowed_top_level(binds)
    for entry in sorted(os.listdir("/")):
        if entry in _FRESH_ROOT_ENTRIES or entry in shadowed:
            continue
        path = "/" + entry
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        else:
            args += ["--ro-bind", path, path]
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for top in sorted(shadowed):
        args += ["--tmpfs", "/" + top]
    fresh = ("tmp", *shadowed)  # top-level folders the sandbox replaces with an empty tmpfs
    for path in sorted({str(Path(p).absolute()) for p in read_only}):
        if Path(path).parts[1:2] and Path(path).parts[1] in fresh and os.path.exists(path):
            args += ["--ro-bind", path, path]
    # Outer mount points first, so a mount inside another one is not covered by it.
    for dst, src in sorted(binds.items(), key=lambda item: item[0].count("/")):
        args += ["--bind", str(src), dst]
    args += ["--remount-ro", "/", "--chdir", cwd]
    args += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not network:
        args.append("--unshare-net")
    # --as-pid-1: no bwrap reaper inside. That reaper outlives the outer bwrap process and is
    # left as a zombie for the host's init to collect (slowly or never in a container), so the
    # namespace's init is _SANDBOX_INIT instead; its exit tears the namespace down.
    args += ["--die-with-parent", "--new-session", "--as-pid-1", "--"]
    return args


class _CappedReader:
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


def _feed(pipe, text: str) -> None:
    try:
        pipe.write(text.encode("utf-8"))
        pipe.close()
    except (BrokenPipeError, OSError):  # the command exited without reading all of it
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reason(returncode: int | None, timed_out: bool, limits: ExecLimits, out: _CappedReader, err: _CappedReader) -> str:
    parts = []
    if timed_out:
        parts.append(f"killed at the wall-clock limit of {limits.wall_s:g} s")
    elif returncode is not None:
        # A signal death shows as -N from Popen, or 128+N when reported by bwrap or a shell.
        sig = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else 0
        if sig == signal.SIGXCPU:
            parts.append(f"CPU time limit of {limits.cpu_s} s exceeded")
        elif sig == signal.SIGXFSZ:
            parts.append(f"file size limit of {limits.file_size_mb} MB exceeded")
        elif sig == signal.SIGKILL:
            parts.append("killed by SIGKILL (out of memory, or past the CPU hard limit)")
        elif returncode < 0:
            parts.append(f"killed by signal {signal.Signals(sig).name if sig in signal.valid_signals() else sig}")
    for name, reader in (("stdout", out), ("stderr", err)):
        if reader.truncated:
            parts.append(f"{name} cut at {limits.output_bytes} bytes of {reader.total}")
    return "; ".join(parts)
