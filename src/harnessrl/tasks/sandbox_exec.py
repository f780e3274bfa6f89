"""Run an untrusted command (an agent's shell call, a third-party grader) inside limits.

Two isolation levels, chosen once per process by `isolation_available()`:

- "bwrap": bubblewrap builds a new mount namespace on an empty root and shows the command only
  what it is given (isolation by construction; docs/suites.md, "What a sandboxed command sees"):
  the system folders (SYSTEM_VIEW: /usr, /bin, /sbin, /lib*, /etc, /sys, /nix where they exist)
  read-only, a fresh `/proc`, a fresh `/dev` (read-only but for its devices, /dev/pts and
  /dev/shm), two fresh tmpfs, `/tmp` and `/dev/shm`, that together hold at most `limits.disk_mb`
  (`scratch_sizes`), the `read_only` paths the caller names (a program's own files, a Python
  environment) read-only at their own path, and the workspace folder(s) read-write at their
  mount points. Nothing else of the host exists in it: not /home, /root, /opt, /srv, /var, /run,
  /work, not other tasks or run folders. The rest of the root is read-only, so a mount point
  such as `/workspace` or `/root/.openclaw/workspace` is made in the empty root. New user, pid,
  ipc, uts and (unless network=True) network namespaces; killing the outer bwrap process tears
  down the pid namespace.
- "rlimits-only": bubblewrap is missing or does not work here. The command runs directly, in its
  own session, with the same resource limits and no filesystem or network isolation: it sees
  every file of the host that its uid may read (`WEAKER_ISOLATION` says so to a run's reader).

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

from harnessrl.tasks.sandbox_io import DISK_POLL_S, CappedReader, DiskWatch, feed
from harnessrl.tasks.sandbox_net import (
    HIDDEN_PACKAGE_INIT,
    Forward,
    NoRelayPython,
    RelayPython,
    net_folder,
    relay_argv,
    relay_python,
)

_OWN_PACKAGE = Path(__file__).resolve().parents[1]  # harnessrl's package folder
SANDBOX_UID = 65534  # "nobody": the uid a command runs as under bwrap when we are root
# The uids (and gids) a command gets one of, for the call, when its process limit must be set
# outside a user namespace (see the module docstring). 1.9e9 lies in the span no distribution,
# systemd or container manager assigns: above systemd's container ranges (which end at
# 1879048191) and below 2**31, from where many programs mishandle uids.
PRIVATE_UID_POOL = range(1_900_000_000, 1_901_000_000)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MB = 1024 * 1024
_STOP_POLL_S = 0.05  # how often a command with a `stop` event looks at it
# The sandbox's pid 1: a shell that runs the command as its child and exits with its status.
# The command must not be pid 1 itself: the kernel drops signals such as SIGXCPU and SIGTERM
# sent to a namespace's init that has no handler for them. (`; exit $?` keeps sh from exec'ing.)
_SANDBOX_INIT = ["sh", "-c", '"$@"; exit $?', "sandbox-init"]
# The host's top-level folders every sandboxed command sees, read-only at their own path: the
# system it runs on (programs, libraries, configuration, the kernel's /sys). Where one is a symlink
# (/bin -> usr/bin) the sandbox has the same symlink.
SYSTEM_VIEW = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "sys", "nix")
# Top-level folders nothing is mounted at or inside: the system's, and those bwrap makes itself.
SYSTEM_TOP_LEVEL = frozenset({*SYSTEM_VIEW, "boot", "dev", "proc"})
# What sandboxed commands see without bubblewrap ({who}: whose files, by isolation_description).
WITHOUT_BWRAP = (
    "run with resource limits only, {who}, and see the host's whole file system (whatever that uid may "
    "read: other tasks, graders, checkouts, harnessrl's source) and its network (every local server, the "
    "trainer's adapter routes, the internet)"
)
# What a run says of the isolation when bubblewrap does not work here.
WEAKER_ISOLATION = (
    "rlimits-only: bubblewrap is missing or does not work here, so sandboxed commands (the shell tool, "
    "agent programs, graders) " + WITHOUT_BWRAP + "; install bubblewrap (e.g. `apt-get install bubblewrap`) "
    "for isolation by construction, or pass `--isolation required` to refuse to run without it"
)
# The most of `disk_mb` that /dev/shm takes under bubblewrap (Docker's default size of it), and the
# share of it at most: the rest is /tmp's (`scratch_sizes`).
SHM_MAX_MB = 64
SHM_SHARE = 4  # a quarter
_PAGE = 4096


@dataclass(frozen=True)
class ExecLimits:
    wall_s: float = 30.0  # wall clock; the whole process tree is killed at the limit
    cpu_s: int = 30  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS
    file_size_mb: int = 64  # RLIMIT_FSIZE
    processes: int = 64  # process count limit
    output_bytes: int = 1_000_000  # stdout/stderr kept (each); more is cut and flagged
    # what the command may add to the disk: under bubblewrap its /tmp and /dev/shm, two tmpfs that
    # together hold this much (`scratch_sizes`; a write past them fails with ENOSPC), and,
    # measured twice a second while it runs, its writable folders (it is killed past the limit)
    disk_mb: int = 1024


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
    return "bwrap" if isolation == "bwrap" else WEAKER_ISOLATION.format(who=_whose())


def _whose() -> str:
    """As whom a command runs without bubblewrap."""
    if os.geteuid() == 0:
        return "as a uid of their own (we run as root)"
    return f"as this user (uid {os.geteuid()}: everything it may read and write, its home included)"


class SandboxRefused(ValueError):
    """bubblewrap refused to build the sandbox (a bind source gone since it was checked, a mount
    point it cannot make): the command never ran. A ValueError, as every argument the sandbox
    cannot honour here: callers report it as their side's failure, never as the command's."""


class IsolationRequired(RuntimeError):
    """`--isolation required`, and bubblewrap does not work here."""


_required = threading.Event()  # set by require_isolation(): run_sandboxed refuses rlimits-only


def require_isolation() -> None:
    """Refuse, from now on in this process, to run a sandboxed command without bubblewrap (the
    `--isolation required` of every job). Raises IsolationRequired at once when it does not work
    here, saying what would be visible without it."""
    _required.set()
    if isolation_available() != "bwrap":
        raise IsolationRequired(_refusal())


def _refusal() -> str:
    return (
        "--isolation required, but bubblewrap is missing or does not work here, so agent programs, the shell "
        "tool and graders would " + WITHOUT_BWRAP.format(who=_whose()) + ". Install bubblewrap (e.g. "
        "`apt-get install bubblewrap`) and check that `bwrap --ro-bind / / --unshare-all true` runs"
    )


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
    except (OSError, SandboxRefused):
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
    hidden: Sequence[Path] = (),
    forward: Sequence[Forward] = (),
) -> ExecResult:
    """Run argv under `limits`, writable only in `workdir` (or the `mounts`), and wait for it.

    `mounts` maps absolute sandbox paths to host folders, each bound read-write; without it
    `workdir` is bound at its own path. The command starts in `cwd_in_sandbox`, by default where
    `workdir` appears in the sandbox. Its environment is PATH, HOME (= that folder), LANG, plus
    `env`; nothing is inherited from this process. Setting `stop` (from another thread) kills
    the command's whole tree at once, as the wall clock does; the result then has `stopped`.
    `read_only`: host files and folders the command needs beyond the system (SYSTEM_VIEW): a
    program's own files, a Python environment. Under bubblewrap they are bound read-only at their
    own path and nothing else of the host is visible; missing ones are left out. `hidden`:
    folders inside those that the command must not see, each covered by an empty tmpfs (under
    bubblewrap only; a Python package's folder gets an `__init__.py` that refuses the import).
    `network`: False (the default) gives the command a network namespace of its own under
    bubblewrap (loopback only); `forward` then lists the host services it reaches through it and
    the sandbox services the host reaches (tasks/sandbox_net.py). True keeps the host's network
    (and ignores `forward`); so does rlimits-only isolation, where a forwarded port is the host's
    port itself.

    Raises ValueError for arguments that cannot be honoured (an empty argv, a relative mount
    point or one `mount_point_problem` refuses, a folder or `read_only` path the sandbox user
    cannot reach, with what to do about it; SandboxRefused, with bubblewrap's message, where
    bubblewrap itself refused to build the sandbox) and, in rlimits-only mode, for mounts at a
    path other than their host path (they need bubblewrap).
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
        hidden=hidden,
        forward=forward,
    )


# ----------------------------------------------------------------------------------------------


def _run(
    argv,
    *,
    workdir,
    mounts,
    env,
    limits,
    network,
    stdin,
    cwd_in_sandbox,
    isolation,
    stop=None,
    read_only=(),
    hidden=(),
    forward=(),
) -> ExecResult:
    if not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
    if _required.is_set() and isolation != "bwrap":
        raise ValueError(_refusal())
    workdir = Path(workdir).resolve()
    binds = _check_mounts({str(workdir): workdir} if mounts is None else mounts)
    cwd = cwd_in_sandbox or next((dst for dst, src in binds.items() if src == workdir), next(iter(binds)))
    if isolation != "bwrap":
        moved = [dst for dst, src in binds.items() if Path(dst) != src]
        if moved:
            raise ValueError(f"mounts at {moved} need bubblewrap, which does not work here (isolation: rlimits-only)")
    child_env = {"PATH": SANDBOX_PATH, "HOME": cwd, "LANG": "C.UTF-8", **(env or {})}
    relay: list[str] = []
    if forward and isolation == "bwrap" and not network:
        try:
            relay, relay_paths = relay_argv(list(forward), _relay_python())
        except NoRelayPython as e:
            raise ValueError(str(e)) from None
        read_only = [*read_only, *relay_paths]
        # the relay's Python prefix may hold harnessrl itself (installed without a venv): hidden
        hidden = [*hidden, *(p for p in [_OWN_PACKAGE] if any(p.is_relative_to(r) for r in relay_paths))]
    visible = [Path(p).absolute() for p in read_only if os.path.exists(p)]
    if os.geteuid() == 0:  # the command runs as an unprivileged uid (below): it must reach these
        for path in visible:
            problem = unreadable_by_others(path)
            if problem:
                raise ValueError(problem)
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
                _bwrap_argv(binds, cwd, network, visible, limits.disk_mb, [p for p in hidden if os.path.isdir(p)])
                + (["prlimit", f"--nproc={limits.processes}:{limits.processes}", "--"] if nproc_in_sandbox else [])
                + _SANDBOX_INIT
                + relay
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
            writable=list(dict.fromkeys(binds.values())),
        )
    finally:
        identity.release()


def _relay_python() -> RelayPython:
    """The Python that runs a command's network relay here (tasks/sandbox_net.py)."""
    system = tuple(Path("/" + entry) for entry in SYSTEM_VIEW)
    return relay_python(system, SANDBOX_PATH, unreadable_by_others if os.geteuid() == 0 else _readable)


def _readable(path: Path) -> None:
    """Not root: the command runs as this user, who reads what this process reads."""
    return None


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
    command, argv, *, env, cwd, stdin, limits: ExecLimits, identity: _Identity, isolation, stop=None, writable=()
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
    out, err = CappedReader(proc.stdout, limits.output_bytes), CappedReader(proc.stderr, limits.output_bytes)
    if stdin is not None:
        threading.Thread(target=feed, args=(proc.stdin, stdin), daemon=True).start()
    timed_out = stopped = False
    disk = DiskWatch(writable, limits.disk_mb)
    deadline = start + limits.wall_s
    while True:
        left = deadline - time.monotonic()
        poll = min(left, DISK_POLL_S if stop is None else _STOP_POLL_S)
        try:
            proc.wait(timeout=max(0.0, poll))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            if stop is not None and stop.is_set():
                stopped = True
                break
            if disk.exceeded():
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
    if disk.over:  # killed for it: not the signal's usual meaning
        reason = "; ".join([disk.over, *filter(None, [_reason(None, False, limits, out, err)])])
    else:
        reason = _reason(returncode, timed_out, limits, out, err)
    if stopped:
        reason = "; ".join(["stopped by the caller", *([reason] if reason else [])])
    refused = bwrap_refusal(returncode, err.text()) if isolation == "bwrap" else ""
    if refused:  # the command never ran: not its exit status to report
        raise SandboxRefused(
            f"bubblewrap refused to start the command: {refused} (a path the sandbox shows is missing or cannot be "
            "mounted there)"
        )
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


def bwrap_refusal(returncode: int | None, stderr: str) -> str:
    """bubblewrap's message when it failed to set the sandbox up (it exits 1 with a first line
    `bwrap: ...` before anything of the command runs), else "". The command's own output cannot
    start that way: bwrap writes before it starts the sandbox's init."""
    first = stderr.lstrip().split("\n", 1)[0].strip()
    if returncode != 1 or not first.startswith("bwrap: "):
        return ""
    return first


def mount_point_problem(dst: str) -> str | None:
    """Why a folder cannot be mounted at the absolute sandbox path `dst`, or None.

    The sandbox's root is empty but for the system folders (SYSTEM_VIEW), so any other absolute
    path can be a mount point (/app, /workspace, /root/..., /opt/..., /tmp/...): bubblewrap makes
    the folders leading to it. Refused: `/` and the system folders (SYSTEM_TOP_LEVEL).
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
    return None


def unreadable_by_others(path: Path) -> str | None:
    """Why a user other than the owner (the sandbox's unprivileged uid) cannot read `path`, with
    what to do about it; None when it can (every folder above it searchable by others, the path
    itself readable by others, and a folder also searchable). The advice never opens more than
    `path` itself: a closed folder above it (a home such as /root, a `mktemp -d` folder) is to be
    left closed and the program put elsewhere."""
    path = Path(path).absolute()
    why = "we run as root, so the sandbox runs the command as an unprivileged user, which cannot read it"
    for parent in reversed(path.parents):
        if not os.stat(parent).st_mode & 0o001:
            shown = oct(os.stat(parent).st_mode & 0o777)[2:]
            where = (
                f"cannot show {path} in the sandbox: it is inside {parent} (mode {shown}, closed to other users), "
                f"and {why}"
            )
            if parent != path.parent or _is_home(parent):
                return (
                    f"{where}. Leave {parent} closed (opening it would show other users all it holds): install or "
                    "copy the program into a folder other users can read, e.g. under /opt (`mktemp -d` makes "
                    "mode-0700 folders: `chmod 755` the one it made)"
                )
            return (
                f"{where}. If {parent} holds the program's own files only, open that one folder "
                f"(`chmod o+rx {parent}`; `mktemp -d` makes mode-0700 folders), else move the program to a folder "
                "other users can read"
            )
    mode = os.stat(path).st_mode
    needs = 0o005 if stat.S_ISDIR(mode) else 0o004
    if mode & needs != needs:
        fix = f"chmod -R o+rX {path}" if stat.S_ISDIR(mode) else f"chmod o+r {path}"
        return (
            f"cannot show {path} in the sandbox: it is mode {oct(mode & 0o777)[2:]}, and {why}. "
            f"Make it (and it alone) readable by others: `{fix}` (`mktemp -d` makes mode-0700 folders)"
        )
    return None


def _is_home(folder: Path) -> bool:
    """`folder` is a user's home (of an account, or this process's HOME)."""
    homes = {Path(entry.pw_dir) for entry in pwd.getpwall() if entry.pw_dir not in ("/", "")}
    return folder in homes or folder == Path.home()


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


def _hand_over(folder: Path, uid: int) -> None:
    """Give a folder to the sandbox uid (we are root), after checking that uid can reach it."""
    for parent in folder.parents:
        if not os.stat(parent).st_mode & 0o001:
            raise ValueError(
                f"the sandbox user (uid {uid}) cannot reach {folder}: {parent} is not searchable by others "
                f"(`chmod o+x {parent}`, or use a folder outside /root and private temporary folders)"
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


def scratch_sizes(disk_mb: int) -> tuple[int, int]:
    """(bytes of /tmp, bytes of /dev/shm) of a sandbox under bubblewrap: two tmpfs that together
    hold `disk_mb`, /dev/shm a quarter of it up to SHM_MAX_MB (a POSIX semaphore or shared memory
    segment lives there: Python's multiprocessing, a browser), /tmp the rest. The kernel holds
    each size, so whatever the command writes there, both together never exceed `disk_mb`."""
    total = disk_mb * _MB
    shm = min(SHM_MAX_MB * _MB, total // SHM_SHARE) // _PAGE * _PAGE
    return total - shm, shm


def _bwrap_argv(
    binds: dict[str, Path],
    cwd: str,
    network: bool,
    read_only: Sequence[Path] = (),
    disk_mb: int = 1024,
    hidden: Sequence[Path] = (),
) -> list[str]:
    """The bubblewrap command line of the view the module docstring describes."""
    args = ["bwrap"]
    for entry in SYSTEM_VIEW:
        path = "/" + entry
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    tmp_bytes, shm_bytes = scratch_sizes(disk_mb)
    # bwrap's /dev is a tmpfs of no set size whose /dev/shm is a plain folder of it: /dev/shm gets a
    # sized tmpfs of its own and /dev is read-only (its device nodes and /dev/pts are mounts of
    # their own, which stay writable), so nothing written there escapes `disk_mb`
    args += ["--dev", "/dev", "--proc", "/proc", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    args += ["--size", str(shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    system = tuple(f"/{entry}/" for entry in SYSTEM_VIEW)
    mounts = [(str(p), str(p), "--ro-bind") for p in read_only if not (str(p) + "/").startswith(system)]
    mounts += [(dst, str(src), "--bind") for dst, src in binds.items()]
    # Outer mount points first, so a mount inside another one is not covered by it (a writable
    # one after a read-only one at the same path).
    for dst, src, how in sorted(mounts, key=lambda m: (m[0].rstrip("/").count("/"), m[2] == "--bind")):
        args += [how, src, dst]
    for folder in hidden:  # an empty, read-only folder in its place (a package: one that refuses imports)
        args += ["--tmpfs", str(folder)]
        if (Path(folder) / "__init__.py").is_file():
            args += ["--ro-bind", str(net_folder() / HIDDEN_PACKAGE_INIT), str(Path(folder) / "__init__.py")]
        args += ["--remount-ro", str(folder)]
    args += ["--remount-ro", "/", "--chdir", cwd]
    args += ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not network:
        args.append("--unshare-net")
    # --as-pid-1: no bwrap reaper inside. That reaper outlives the outer bwrap process and is
    # left as a zombie for the host's init to collect (slowly or never in a container), so the
    # namespace's init is _SANDBOX_INIT instead; its exit tears the namespace down.
    args += ["--die-with-parent", "--new-session", "--as-pid-1", "--"]
    return args


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reason(returncode: int | None, timed_out: bool, limits: ExecLimits, out: CappedReader, err: CappedReader) -> str:
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
