"""What an external agent program sees of this machine: the Python that `{python}` in its command
stands for (agent_python), and the host paths shown to it read-only or hidden (host_paths; the rule
of docs/external-harness.md, "What the agent sees"). The task's own folder and harnessrl's source
are never shown: an agent that could read them could read its grader. Nor is a folder of the host
that holds what is not the program's own (never_shown: the root, the temp folder, a home, a run
folder, a source checkout): a spec naming one is refused (exposure_problems).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harnessrl.harness.spec import PYTHON_PLACEHOLDER
from harnessrl.tasks.sandbox_exec import SANDBOX_PATH, SYSTEM_VIEW, ExecLimits, isolation_available, run_sandboxed

if TYPE_CHECKING:
    from harnessrl.tasks.base import Task


class NoAgentPython(RuntimeError):
    """No Python that the sandboxed program can run and that has harnessrl's packages."""


_python_lock = threading.Lock()


def agent_python() -> tuple[str, dict[str, str]]:
    """(interpreter, extra environment) that `{python}` in a command stands for: this process's
    own interpreter when the sandbox user can run it; else the same Python version found on the
    sandbox's PATH with this process's package folders on PYTHONPATH (harnessrl running as root
    from a folder only root can enter, e.g. /root/.venv). Probed once per process with a real
    sandboxed `import openai`. NoAgentPython says why neither works."""
    with _python_lock:
        return _probe_python(isolation_available())


@functools.cache
def _probe_python(isolation: str) -> tuple[str, dict[str, str]]:
    tried = []
    candidates: list[tuple[str, dict[str, str]]] = [(sys.executable, {})]
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    same = shutil.which(version, path=SANDBOX_PATH)
    if same is not None:
        candidates.append((same, {"PYTHONPATH": os.pathsep.join(_package_folders())}))
    for python, env in candidates:
        ok, why = _runs(python, env)
        if ok:
            return python, env
        tried.append(f"{python}: {why}")
    raise NoAgentPython(
        "no Python the sandboxed agent can run has harnessrl's packages (it needs `import openai`); tried "
        + "; ".join(tried)
        + (f"; no {version} on the sandbox's PATH" if same is None else "")
        + ". Name an interpreter the sandbox user can run in the command instead of {python}"
    )


@dataclass(frozen=True)
class AgentView:
    """What of this machine an agent program sees (run_sandboxed's `read_only` and `hidden`)."""

    read_only: list[Path]
    hidden: list[Path]


def host_paths(argv: list[str], extra: list[str] | tuple[str, ...] = (), private: tuple[Path, ...] = ()) -> AgentView:
    """What of this machine an agent program sees read-only besides the system (the rule of
    docs/external-harness.md, "What the agent sees"): its own installed files.

    - every absolute path of its command line (inside a string command too: `command_words`):
      a folder as it is; a file itself (not its folder: what a script reads beside it is named in
      `read_only`), or, for a file inside a Python environment (a folder holding `pyvenv.cfg`),
      that whole environment, inside an installed Node package (`node_modules/NAME`), that
      package; a symlink also brings its target the same way;
    - `extra` (the spec's `read_only`), as given;
    - with `{python}` in the command: this Python's environment and its package folders, less
      the folder harnessrl itself is imported from (an agent that could import harnessrl could
      rebuild its task, grader and answer from the task id): a source folder is left out, the
      package inside a site-packages folder is hidden.

    The folder harnessrl is imported from is hidden wherever it would be visible (an empty folder
    whose `__init__.py` refuses the import), however harnessrl was installed: in a virtual
    environment, a system `dist-packages` under /usr, a prefix named in `read_only`. A folder
    holding one of `private` (the task's own folder with its grader) is never shown whole. A
    `read_only` path holding one is refused (ValueError), as it would show the agent its grader,
    and so is a command word or `read_only` path that `never_shown` refuses (exposure_problems).
    A word under /proc or /dev names the sandbox's own: the host's are not shown."""
    problems = exposure_problems(argv, extra)
    if problems:
        raise ValueError(problems[0])
    shown: list[Path] = []
    words = command_words(argv)
    for word in words:
        if not word.startswith("/") or not os.path.exists(word):
            continue
        for path in dict.fromkeys([Path(word).absolute(), Path(word).resolve()]):
            if not _sandbox_own(path):
                shown.append(_program_folder(path, private))
    for word in extra:
        path = Path(word).absolute()
        holds = [p for p in private if _holds(path, p)]
        if holds:
            raise ValueError(
                f"read_only path {path} holds {holds[0]}, which the agent must not see (its task or grader)"
            )
        shown.append(path)
    # a package folder (or a path a symlink led to) holding the task's folder is not shown
    shown = [p for p in shown if p.is_file() or not any(_holds(p, q) for q in private)]
    hidden = []
    if PYTHON_PLACEHOLDER in words or any(word.startswith(sys.prefix + os.sep) for word in words):
        shown.append(Path(sys.prefix))
        for folder in map(Path, _package_folders()):
            if not _holds(folder, _HARNESSRL_SOURCE):
                shown.append(folder)
            elif "site-packages" in folder.parts or "dist-packages" in folder.parts:
                shown.append(folder)
                hidden.append(_HARNESSRL_SOURCE)
    if any(_holds(path, _HARNESSRL_SOURCE) for path in [*shown, *_system_folders()]):
        hidden.append(_HARNESSRL_SOURCE)
    return AgentView(read_only=list(dict.fromkeys(shown)), hidden=list(dict.fromkeys(hidden)))


_HARNESSRL_SOURCE = Path(__file__).resolve().parents[1]  # the harnessrl package folder


def _system_folders() -> list[Path]:
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


def _holds(folder: Path, inner: Path) -> bool:
    """`folder` is `inner` or one of its parents."""
    folder, inner = folder.resolve(), inner.resolve()
    return folder == inner or folder in inner.parents


def _program_folder(path: Path, private: tuple[Path, ...]) -> Path:
    """What a command word naming `path` shows (see host_paths): a folder itself; a file inside a
    Python environment that environment, inside an installed Node package that package's folder;
    any other file itself alone (not the folder beside it: a project's run folders and .env). An
    environment or package folder that `never_shown` refuses (at a glance, not searched through)
    gives the file alone."""
    if path.is_dir():
        return path
    for parent in path.parents:
        if (parent / "pyvenv.cfg").is_file():
            return parent if never_shown(parent, search=False) is None else path
        if parent.parent.name == "node_modules" or (
            parent.parent.parent.name == "node_modules" and parent.parent.name.startswith("@")
        ):
            hides = any(_holds(parent, p) for p in private) or never_shown(parent, search=False) is not None
            return path if hides else parent
    return path


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
    written (a caller checks a symlink's target too)."""
    path = Path(os.path.normpath(Path(path).absolute()))
    if any(_within(path, system) for system in [*(Path("/" + e) for e in SYSTEM_VIEW), *_system_folders()]):
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
        why = None if _sandbox_own(candidate) else never_shown(candidate)
        if why is not None:
            what = "folder" if candidate.is_dir() else "file"
            link = f" (a link to {candidate})" if candidate != written else ""
            return (
                f"{label} names the {what} {written}{link}, which is never shown to the agent program: "
                f"{why.reason}. Fix: {why.fix}"
            )
    return ""


def _sandbox_own(path: Path) -> bool:
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


def agent_private_paths(task: Task) -> tuple[Path, ...]:
    """Host folders of a task that its agent must never see: the imported task folder (its
    grader, expected answers, and the other tasks beside it)."""
    return (task_folder,) if (task_folder := imported_task_folder(task)) is not None else ()


def imported_task_folder(task: Task) -> Path | None:
    """The folder an imported task was read from (`data["source"]`, absolute), or None."""
    source = task.data.get("source") if isinstance(task.data, dict) else None
    return Path(source) if isinstance(source, str) and os.path.isabs(source) and os.path.isdir(source) else None


def _package_folders() -> list[str]:
    """This process's folders of installed packages, in import order: its site-packages folders
    and the folders their .pth files add (editable installs). Not the other entries of sys.path
    (a test runner's or PYTHONPATH's folders, the current folder): an agent is shown installed
    packages, not checkouts."""
    sites = [Path(p) for p in sys.path if p and Path(p).name in ("site-packages", "dist-packages") and os.path.isdir(p)]
    installed = {site.resolve() for site in sites}
    for site in sites:
        for pth in sorted(site.glob("*.pth")):
            try:
                lines = pth.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in map(str.strip, lines):
                if line and not line.startswith(("#", "import ", "import\t")) and os.path.isdir(site / line):
                    installed.add((site / line).resolve())
    out = [str(Path(e).resolve()) for e in sys.path if e and os.path.isdir(e) and Path(e).resolve() in installed]
    return list(dict.fromkeys(out))


def _runs(python: str, env: dict[str, str]) -> tuple[bool, str]:
    check = f"import sys, openai; assert sys.version_info[:2] == {tuple(sys.version_info[:2])!r}"
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-python-probe-"))
    try:
        result = run_sandboxed(
            [python, "-c", check],
            workdir=folder,
            env=env,
            limits=ExecLimits(wall_s=60, cpu_s=60, memory_mb=4096),
            read_only=(view := host_paths([PYTHON_PLACEHOLDER, python])).read_only,
            hidden=view.hidden,
        )
    except (OSError, ValueError) as e:
        return False, str(e)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if result.returncode == 0:
        return True, ""
    lines = (result.stderr or result.reason or f"exit code {result.returncode}").strip().splitlines()
    return False, lines[-1] if lines else f"exit code {result.returncode}"
