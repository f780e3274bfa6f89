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

from harnessrl.harness.exposure import command_words, exposure_problems, never_shown, sandbox_own, system_folders
from harnessrl.harness.spec import PYTHON_PLACEHOLDER
from harnessrl.tasks.sandbox_exec import SANDBOX_PATH, ExecLimits, isolation_available, run_sandboxed

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
            if not sandbox_own(path):
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
    if any(_holds(path, _HARNESSRL_SOURCE) for path in [*shown, *system_folders()]):
        hidden.append(_HARNESSRL_SOURCE)
    return AgentView(read_only=list(dict.fromkeys(shown)), hidden=list(dict.fromkeys(hidden)))


_HARNESSRL_SOURCE = Path(__file__).resolve().parents[1]  # the harnessrl package folder


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
