"""What a spec's command line names of this machine, and which host folders an agent program is
never shown whole (the rule of docs/external-harness.md, "Never shown"): the root, the temp
folder and harnessrl's working folders in it, a home, a run folder, a source checkout. A spec
naming one is refused at load (ExternalHarnessSpec.exposure) and at each episode's start
(agent_view.host_paths). This module imports neither the spec nor the view, so both can use it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harnessrl.tasks.sandbox_exec import SYSTEM_VIEW


def system_folders() -> list[Path]:
    """The host folders every sandboxed command sees (sandbox_exec.SYSTEM_VIEW), resolved."""
    return [Path("/" + entry).resolve() for entry in SYSTEM_VIEW if os.path.isdir("/" + entry)]


def command_words(argv: list[str]) -> list[str]:
    """The words of a command line that may name a program's files: each argv word, and, for a
    word holding a shell command (a string command runs as `/bin/sh -c "..."`), the words the
    shell would split it into, with the value of each `NAME=VALUE` assignment. So a string command
    shows what the same command as an argv list shows."""
    import shlex

    words: list[str] = []
    for word in argv:
        words.append(word)
        if not any(c.isspace() for c in word) and "=" not in word:
            continue
        lexer = shlex.shlex(word, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            parts = list(lexer)
        except ValueError:  # unbalanced quotes: the shell would refuse it too; its plain words still count
            parts = word.split()
        for part in parts:
            words.append(part)
            name, sep, value = part.partition("=")
            if sep and name.isidentifier():
                words.append(value)
    return list(dict.fromkeys(words))


# ----------------------------------------------------------------- what is never shown whole

# What marks a run folder (a job's --out: its database, its options) and a source checkout.
RUN_MARKERS = ("run.db", "options.json")
CHECKOUT_MARKER = ".git"
# harnessrl's own folders in the temp folder: episodes' workspaces and control folders, the
# network relays and host sockets, task services, audits and probes (never a program's own)
WORKING_PREFIXES = (
    "harnessrl-ws-",
    "harnessrl-agent-",
    "harnessrl-net-",
    "harnessrl-audit-",
    "harnessrl-python-probe-",
    "harnessrl-bwrap-probe-",
    "harnessrl-claweval-",
    "harnessrl-harbor-",
    "harnessrl-pinchbench-",
)
# folders searched for run folders and checkouts below a shown folder, at most; past it the
# folder is refused as too large to tell
MAX_FOLDERS_SEARCHED = 20_000
# installed packages and caches: not searched (no run folder or checkout lives there)
_NOT_SEARCHED = frozenset({"node_modules", "site-packages", "dist-packages", "__pycache__", CHECKOUT_MARKER})
# the sandbox has its own of these: a word naming one (`2>/dev/null`) shows nothing of the host's
_SANDBOX_OWN = (Path("/proc"), Path("/dev"))

_OWN_FOLDER = "list the program's own folder (the one holding its files only) under read_only"


@dataclass(frozen=True)
class NeverShown:
    """Why a host path is never shown to an agent program, and what to do instead."""

    reason: str
    fix: str


def never_shown(path: Path, *, search: bool = True) -> NeverShown | None:
    """Why the host path `path` may not be shown to an agent program (as a command word names it,
    or `read_only` lists it), or None. Never shown: the root `/`; the host's temp folder or a
    folder holding it, and inside it harnessrl's working folders (WORKING_PREFIXES: other
    episodes' workspaces and control folders) — any other folder there is a program's own; a
    home folder (/root, /home/*, $HOME) or a folder holding one; a run folder (one holding
    RUN_MARKERS), what lies in one, and a folder holding one; a source checkout (a folder holding
    `.git`) and a folder holding one. `search`: look through a folder's subfolders for run
    folders and checkouts (at most MAX_FOLDERS_SEARCHED); else only at the folder itself. The
    system folders every sandbox shows anyway are never refused. `path` is taken as it is
    written (a caller checks a symlink's target too). A socket, FIFO or device is never shown,
    wherever it lies."""
    path = Path(os.path.normpath(Path(path).absolute()))
    if path.exists() and not path.is_dir() and not path.is_file():
        return NeverShown(
            "it is a socket, FIFO or device, not a program's file (a daemon's socket would let the "
            "program act as that daemon's client)",
            "leave it out of the command; the program gets what it needs through its endpoint",
        )
    if any(_within(path, system) for system in [*(Path("/" + e) for e in SYSTEM_VIEW), *system_folders()]):
        return None
    if path == Path(path.anchor):
        return NeverShown(
            "it is the root of the host's file system: the whole machine, other episodes and runs, homes and checkouts",
            f"the program starts in its workspace ($HARNESSRL_WORKSPACE); {_OWN_FOLDER}",
        )
    folder = path.is_dir()
    for temp in _temp_folders():
        if folder and _within(temp, path):
            held = "it is" if path == temp else f"it holds {temp},"
            return NeverShown(
                f"{held} the host's temp folder: every live episode's workspace and control folder, and what "
                "other programs keep there",
                "the sandbox has a /tmp of its own (empty at the start) where the program may write; " + _OWN_FOLDER,
            )
        if path != temp and _within(path, temp):
            top = temp / path.relative_to(temp).parts[0]
            if top.name.startswith(WORKING_PREFIXES):
                return NeverShown(
                    f"it is in {top}, a working folder of harnessrl (an episode's workspace or control folder, "
                    "a relay, a task's services), not the program's own",
                    _OWN_FOLDER,
                )
    if folder:
        for home in _homes():
            if _within(home, path):
                held = "it is" if path == home else f"it holds {home},"
                what = "the folder of the users' homes" if home == Path("/home") else "a home folder"
                return NeverShown(
                    f"{held} {what}: their keys, histories, settings and checkouts",
                    f"{_OWN_FOLDER}, or install the program in a folder of its own (e.g. under /opt)",
                )
    for parent in [path, *path.parents] if folder else path.parents:
        marker = _run_marker(parent)
        if marker is not None:
            where = "it is" if parent == path else "it lies in"
            return NeverShown(
                f"{where} the run folder {parent} ({marker}: its episodes, answers and grades)",
                f"keep run folders (--out) out of the program's own files; {_OWN_FOLDER}",
            )
    if not folder:
        return None
    if (path / CHECKOUT_MARKER).exists():
        return NeverShown(
            f"it is the source checkout {path} ({CHECKOUT_MARKER}: its sources, tests and graders)", _OWN_FOLDER
        )
    if not search or path.is_symlink():  # a link's target is checked on its own (exposure_problems)
        return None
    found = _search(path)
    if found is None:
        return None
    kind, below, marker = found
    if kind == "too large":
        return NeverShown(
            f"it holds more than {MAX_FOLDERS_SEARCHED} folders, too many to tell that no run folder or source "
            "checkout is among them",
            _OWN_FOLDER,
        )
    return NeverShown(
        f"it holds the {kind} {below} ({marker})",
        f"keep run folders (--out) out of the program's own files; {_OWN_FOLDER}"
        if kind == "run folder"
        else _OWN_FOLDER,
    )


def exposure_problems(argv: list[str], extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """What a command line (its words as `command_words` finds them) and `read_only` paths
    (`extra`) would show an agent program that `never_shown` refuses: one line each, naming the
    word or path, the reason and the fix; [] when there is none. A path that does not exist here
    shows nothing and is not refused."""
    problems = []
    for word in command_words(argv):
        if word.startswith("/") and os.path.exists(word):
            problem = _problem(Path(word), f"the command word {word!r}")
            if problem:
                problems.append(problem)
    for entry in extra:
        if os.path.exists(entry):
            problem = _problem(Path(entry), f"the read_only path {entry!r}")
            if problem:
                problems.append(problem)
    return problems


def _problem(path: Path, label: str) -> str:
    """The line of `exposure_problems` for `label` (the word or path as written) naming `path`,
    or "" when neither it nor the target of a symlink on its way is refused."""
    written = Path(os.path.normpath(path.absolute()))
    for candidate in dict.fromkeys([path.resolve(), written]):
        why = None if sandbox_own(candidate) else never_shown(candidate)
        if why is not None:
            what = "folder" if candidate.is_dir() else "file"
            link = f" (a link to {candidate})" if candidate != written else ""
            return (
                f"{label} names the {what} {written}{link}, which is never shown to the agent program: "
                f"{why.reason}. Fix: {why.fix}"
            )
    return ""


def sandbox_own(path: Path) -> bool:
    """`path` is under /proc or /dev, which the sandbox has of its own."""
    path = Path(os.path.normpath(path.absolute()))
    return any(_within(path, own) for own in _SANDBOX_OWN)


def _within(inner: Path, outer: Path) -> bool:
    """`inner` is `outer` or inside it (as written: no symlink is followed)."""
    return inner == outer or outer in inner.parents


def _temp_folders() -> list[Path]:
    """The host's temp folders: tempfile's (TMPDIR), /tmp and /var/tmp, as written and resolved."""
    folders = [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp")]
    out = [Path(os.path.normpath(f.absolute())) for f in folders if f.is_dir()]
    return list(dict.fromkeys([*out, *(f.resolve() for f in out)]))


def _homes() -> list[Path]:
    """The host's home folders: /root, each folder of /home, $HOME and the user's own (/ left out)."""
    homes = [Path("/root"), Path("/home")]
    try:
        homes += [p for p in Path("/home").iterdir() if p.is_dir()]
    except OSError:
        pass
    homes += [Path(h) for h in (os.environ.get("HOME"), os.path.expanduser("~")) if h and os.path.isabs(h)]
    out = [Path(os.path.normpath(h)) for h in homes]
    out = list(dict.fromkeys([*out, *(h.resolve() for h in out if h.exists())]))
    return [h for h in out if h != Path(h.anchor)]


def _run_marker(folder: Path) -> str | None:
    """The file that makes `folder` a run folder (RUN_MARKERS), or None."""
    return next((m for m in RUN_MARKERS if (folder / m).is_file()), None)


def _search(folder: Path) -> tuple[str, Path, str] | None:
    """The first run folder or source checkout below `folder` (its kind, where, the marker),
    kind "too large" past MAX_FOLDERS_SEARCHED folders, or None. Symlinks are not followed;
    installed-package folders are not searched (_NOT_SEARCHED)."""
    seen = 0
    for root, dirs, files in os.walk(folder, followlinks=False):
        seen += 1
        if seen > MAX_FOLDERS_SEARCHED:
            return "too large", Path(root), ""
        here = Path(root)
        if CHECKOUT_MARKER in dirs or CHECKOUT_MARKER in files:
            return "source checkout", here, CHECKOUT_MARKER
        marker = next((m for m in RUN_MARKERS if m in files), None)
        if marker is not None:
            return "run folder", here, marker
        dirs[:] = [d for d in dirs if d not in _NOT_SEARCHED]
    return None
