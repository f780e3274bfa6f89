"""What the three importers share: the imported suite, broken-task records, the transcript, and
running a third-party grader in the sandbox.

An imported folder is a fixed list of tasks, not a generator: every task is in every split
(`train`, `dev` and `test` each hold all of them, in the folder's sorted order), because a folder
of benchmark tasks has no split of its own and inventing one would silently drop tasks from an
evaluation. Task ids are `<kind>/<split>/<native id>`.

A task whose files are missing or malformed, or that cannot run here (a Harbor task that needs
its Docker image), is still listed: its environment setup raises `TaskLoadError`, so the runner
records it as an infrastructure error with that reason before any model call, and the other tasks
run. A grader that crashes, hangs or prints something that is not a score raises `GraderError`
from `Task.grade`, which the runner records as an infrastructure error too (never as a zero).
"""

from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from harnessrl.tasks import untrusted
from harnessrl.tasks.base import SPLITS, SUBMIT_TOOL, Environment, Suite, Task, Tool
from harnessrl.tasks.workspace import WORKSPACE_TOOLS
from harnessrl.types import Grade

if TYPE_CHECKING:  # the sandbox module is imported when a grader runs
    from harnessrl.tasks.sandbox_exec import ExecLimits, ExecResult

MAX_REASON_CHARS = 600  # of grader output quoted in an error
MAX_GRADER_OUTPUT_BYTES = 1 << 20  # what is read of a file a grader wrote
PYTHON = "python3"  # Python graders run on the system interpreter (stdlib only), as at home


class TaskLoadError(Exception):
    """A task folder that cannot be turned into a runnable task (missing/malformed file, refused)."""


class GraderError(Exception):
    """A task's own grader crashed, hung or printed something that is not a score."""


class GraderUnavailable(GraderError):
    """The grader could not be asked at all, whatever the agent left: the judge it needs is not
    configured or failed, the sandbox cannot run it. Never blamed on the agent."""


# Whether each task's grader works on the workspace as set up (a fresh environment, no answer),
# asked at most once per task in a process: None when it does, else why it does not.
_FRESH_SETUP: dict[tuple[str, str], str | None] = {}


@dataclass
class ImportedTask(Task):
    """A Task whose grade comes from the task's own grader (a subprocess in the sandbox).

    What the agent left can break a grader on purpose (a FIFO where it reads an input, an input
    deleted or made a link, a file it does not expect): were that an infrastructure error, it would
    never be scored, and a policy under RL could learn to turn its failures into "no sample". So a
    grader that fails on the agent's workspace is asked once more, on a fresh setup of the task:
    when it grades that, the failure came from what the agent left and the episode scores 0 with
    the reason in `details.grader_failed`; when it fails there too, the grader itself is broken and
    the GraderError stands (an infrastructure error). FIFOs, sockets and devices the agent left in
    its workspace are removed before the grader runs (listed in `details.removed_special_files`):
    no task's output is one, and a grader reading one would hang.
    """

    grader: Callable[[Environment], Grade] | None = None

    def grade(self, env: Environment) -> Grade:
        if self.grader is None:
            raise GraderError(f"task {self.id} has no grader")
        removed = _remove_special_files(env)
        try:
            grade = self.grader(env)
        except GraderUnavailable:
            raise
        except GraderError as e:
            broken = self._fresh_setup_problem()
            if broken is not None:
                raise
            return Grade(
                score=0.0,
                passed=False,
                threshold=self.pass_threshold,
                details={
                    "grader_failed": str(e)[:MAX_REASON_CHARS],
                    "blamed_on": "what the agent left: the grader grades a fresh setup of this task",
                    **({"removed_special_files": removed} if removed else {}),
                },
            )
        if removed:
            grade = grade.model_copy(update={"details": {**grade.details, "removed_special_files": removed}})
        return grade

    def _fresh_setup_problem(self) -> str | None:
        """Why the grader fails on a fresh setup of this task (no answer), or None when it grades."""
        key = (str(self.data.get("source", "")), self.id)
        if key not in _FRESH_SETUP:
            assert self.grader is not None
            try:
                env = self.make_env()
            except Exception as e:  # noqa: BLE001 - a setup that fails is the task's, not the agent's
                _FRESH_SETUP[key] = f"setup failed: {e}"
            else:
                try:
                    self.grader(env)
                    _FRESH_SETUP[key] = None
                except GraderError as e:
                    _FRESH_SETUP[key] = str(e)
                finally:
                    env.close()
        return _FRESH_SETUP[key]


def _remove_special_files(env: Environment) -> list[str]:
    """Remove the FIFOs, sockets and devices under the workspace (never following a link)."""
    if env.workspace is None:
        return []
    try:
        special = [e.rel for e in untrusted.walk(env.workspace.root) if e.kind == "other"]
    except untrusted.Refused:
        return []  # past the walk's limit: the grader meets what is there
    for rel in special:
        try:
            untrusted.remove(env.workspace.root, rel)
        except (untrusted.Refused, OSError):
            continue
    return special


@dataclass
class TaskEntry:
    """One task of a folder as the importer read it: the parts of a Task minus its split.

    `error` set means the folder could not be loaded; the task is kept so that the run reports
    it as an infrastructure error with this reason.
    """

    native_id: str
    family: str
    instruction: str = ""
    setup: Callable[[Environment], None] | None = None
    grader: Callable[[Environment], Grade] | None = None
    data: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    workspace_mount: str | None = None  # the absolute path the task's files refer to (Task.workspace_mount)


def _refuse_setup(reason: str) -> Callable[[Environment], None]:
    def setup(env: Environment) -> None:
        raise TaskLoadError(reason)

    return setup


def _never_checked(env: Environment) -> dict[str, float]:  # ImportedTask.grade replaces check
    raise GraderError("imported tasks are graded by their own grader")


def agent_tools() -> list[Tool]:
    """The workspace file tools and submit (a harness adds `shell`: imported tasks offer it)."""
    return list(WORKSPACE_TOOLS) + [SUBMIT_TOOL]


class ImportedSuite(Suite):
    """A folder of tasks in a foreign format, every task in every split."""

    kind: str = ""  # clawgym | pinchbench | harbor
    offers_shell = True  # real benchmark tasks expect to run commands

    def __init__(self, path: str | Path, grader_limits: "ExecLimits | None" = None):
        super().__init__()
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise ValueError(f"{self.kind}: '{path}' is not a folder")
        self.path = self.path.resolve()
        self.grader_limits = grader_limits
        self.name = self.kind
        self.skipped: dict[str, str] = {}  # native id -> why it is not part of the suite
        self.entries: list[TaskEntry] = _unique_ids(self.load_entries(), self.path)
        if not self.entries:
            extra = f" ({len(self.skipped)} left out: {'; '.join(self.skipped.values())})" if self.skipped else ""
            raise ValueError(f"{self.kind}: no tasks found in '{self.path}'{extra}; expected layout: {self.layout}")
        self.split_sizes = {s: len(self.entries) for s in SPLITS}
        broken = sum(e.error is not None for e in self.entries)
        self.description = f"{len(self.entries)} tasks from {self.path}" + (
            f", {broken} not runnable" if broken else ""
        )
        if self.skipped:
            self.description += f", {len(self.skipped)} left out"

    # -- to implement -------------------------------------------------------------------------
    layout: str = ""  # one line saying what folder layout the importer accepts

    def load_entries(self) -> list[TaskEntry]:
        raise NotImplementedError

    # -- Suite API ------------------------------------------------------------------------------
    def family_names(self) -> list[str]:
        return sorted({e.family for e in self.entries})

    def _task(self, entry: TaskEntry, split: str) -> Task:
        task = ImportedTask(
            id=f"{self.name}/{split}/{entry.native_id}",
            suite=self.name,
            family=entry.family,
            split=split,
            seed=0,
            instruction=entry.instruction or f"(task {entry.native_id} could not be loaded)",
            tools=agent_tools(),
            setup=_refuse_setup(entry.error) if entry.error is not None else (entry.setup or (lambda env: None)),
            check=_never_checked,
            needs_workspace=True,
            data={"source": str(self.path), "native_id": entry.native_id, **entry.data},
            grader=entry.grader,
        )
        task.offers_shell = self.offers_shell
        task.workspace_mount = entry.workspace_mount
        return task

    def _generate(self, split: str, n: int, taken: set[str]) -> list[Task]:
        # Suite.tasks checks the split and n; every split holds the same tasks, so `taken` (the
        # instances of earlier splits) does not apply.
        return [self._task(e, split) for e in self.entries[:n]]

    def task(self, task_id: str) -> Task:
        kind, _, rest = task_id.partition("/")
        split, _, native = rest.partition("/")
        if kind != self.name or not native:
            raise ValueError(f"task id '{task_id}' is not of the form {self.name}/<split>/<task id>")
        for entry in self.entries:
            if entry.native_id == native:
                if split not in self.split_sizes:
                    raise ValueError(f"unknown split '{split}' for suite '{self.name}'")
                return self._task(entry, split)
        raise ValueError(f"no task '{native}' in {self.path}")

    # -- grader limits --------------------------------------------------------------------------
    def limits_for(self, own_wall_s: float | None, memory_mb: int | None = None) -> "ExecLimits":
        """The suite's grader limits when given, else the sandbox defaults with the wall clock (and
        memory) the task format itself allows its grader."""
        from harnessrl.tasks.sandbox_exec import ExecLimits

        if self.grader_limits is not None:
            return self.grader_limits
        base = ExecLimits()
        wall = float(own_wall_s) if own_wall_s else base.wall_s
        return replace(
            base, wall_s=wall, cpu_s=max(base.cpu_s, int(wall)), memory_mb=max(base.memory_mb, memory_mb or 0)
        )


def broken(native_id: str, family: str, reason: str) -> TaskEntry:
    return TaskEntry(native_id=native_id, family=family, error=reason)


def _unique_ids(entries: list[TaskEntry], path: Path) -> list[TaskEntry]:
    """A task id used again (two PinchBench files with one `id`) makes the later task a broken
    one under a numbered id: the run keys episodes by task id."""
    seen: dict[str, int] = {}
    out = []
    for entry in entries:
        n = seen[entry.native_id] = seen.get(entry.native_id, 0) + 1
        if n > 1:
            entry = broken(
                f"{entry.native_id}-{n}", entry.family, f"task id '{entry.native_id}' occurs more than once in {path}"
            )
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------------
# Files


def read_text(path: Path, what: str) -> str:
    """A required text file, or TaskLoadError saying which one is missing or unreadable."""
    if not path.is_file():
        raise TaskLoadError(f"missing {what}: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskLoadError(f"cannot read {what} {path}: {e}") from None


def copy_tree_into(source: Path, root: Path, rel: str | PurePosixPath = ".") -> None:
    """Copy the contents of the task's folder `source` into `rel` under the workspace `root`
    (merging, like `cp -r source/. target`), through harnessrl.tasks.untrusted: no link that
    stands in the workspace on the way is followed."""
    try:
        untrusted.copy_in(source, root, rel)
    except untrusted.Refused as e:
        raise TaskLoadError(f"cannot copy {source.name} into the workspace: {e}") from None


def copy_file_into(source: Path | str | bytes, root: Path, rel: str | PurePosixPath) -> None:
    """A task file (or its text or bytes) written to `rel` under the workspace `root`, its
    folders made, through harnessrl.tasks.untrusted."""
    try:
        if isinstance(source, Path):
            untrusted.copy_in(source, root, rel)
        else:
            untrusted.write_bytes(root, rel, source.encode("utf-8") if isinstance(source, str) else source)
    except untrusted.Refused as e:
        raise TaskLoadError(f"cannot write {rel} into the workspace: {e}") from None


def isolated_python(*trusted: str) -> dict[str, str]:
    """The environment that keeps a Python a grader starts from importing what the agent left:
    its working folder and its script's folder are not put on its path (PYTHONSAFEPATH, Python
    3.11 and later), no user site, no byte-code written; only the `trusted` folders (the task's
    own grader files, inside the sandbox) are on PYTHONPATH."""
    out = {"PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if trusted:
        out["PYTHONPATH"] = ":".join(trusted)
    return out


def read_grader_output(folder: Path, rel: str, what: str, cap: int = MAX_GRADER_OUTPUT_BYTES) -> str | None:
    """A file a grader wrote in its own folder (a program it ran may have been the agent's), read
    through harnessrl.tasks.untrusted; None when it is missing, GraderError when it is a link, a
    hard link, a FIFO or device, or larger than `cap`."""
    try:
        return untrusted.read_text(folder, rel, cap)
    except untrusted.Refused as e:
        if e.reason == "missing":
            return None
        raise GraderError(f"{what} is not read: {e}") from None


def relative_inside(path: str, what: str) -> PurePosixPath:
    """A task-given relative path that stays inside the workspace, or TaskLoadError."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts:
        raise TaskLoadError(f"{what} '{path}' must be a relative path inside the workspace")
    return p


def working_directory_note(path: str) -> str:
    """Appended to an instruction: the task's files refer to this absolute working directory."""
    return f"\n\n(Your working directory is {path}; the file tools take paths relative to it.)"


@contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder for grader files; searchable by others, because a sandboxed command
    runs as an unprivileged user when this process is root."""
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        os.chmod(name, 0o755)
        yield Path(name)


def mount_point_problem(at: str) -> str | None:
    """Why the sandbox cannot show a workspace at the absolute path `at`, or None (the sandbox's
    own rules, plus the folders a Harbor verifier gets)."""
    from harnessrl.tasks.sandbox_exec import mount_point_problem as sandbox_problem

    p = PurePosixPath(at)
    if ".." in p.parts:
        return f"'{at}' is not a plain absolute path"
    if p.is_absolute() and len(p.parts) > 1 and p.parts[1] in ("tests", "logs"):
        return f"'{at}' is a reserved path"
    return sandbox_problem(at)


# ----------------------------------------------------------------------------------------------
# The transcript a grader sees


def openclaw_transcript(env: Environment, instruction: str, cwd: str) -> list[dict[str, Any]]:
    """The episode as OpenClaw session events (the JSONL that ClawGym and PinchBench graders read).

    A `session` header, the user's instruction, then for every executed tool call an assistant
    message with one `toolCall` item (its arguments under both `arguments`, OpenClaw's key, and
    `params`, which several graders read) and a `toolResult` message; the submitted answer ends it
    as an assistant `text` item. Only executed calls are recorded by the environment, so refused
    calls and the model's prose between calls are not part of it.
    """
    now = time.time()
    events: list[dict[str, Any]] = [
        {"type": "session", "version": 3, "id": "harnessrl", "timestamp": _iso(now), "cwd": cwd}
    ]

    def message(role: str, content: list[dict[str, Any]], **extra: Any) -> None:
        n = len(events)
        events.append(
            {
                "type": "message",
                "id": f"m{n:04d}",
                "parentId": events[-1].get("id"),
                "timestamp": _iso(now),
                "message": {"role": role, "content": content, "timestamp": int(now * 1000), **extra},
            }
        )

    message("user", [{"type": "text", "text": instruction}])
    for i, (name, args, output) in enumerate(env.calls):
        if name == SUBMIT_TOOL.name:
            continue
        call_id = f"call_{i:04d}"
        message(
            "assistant",
            [{"type": "toolCall", "id": call_id, "name": name, "arguments": dict(args), "params": dict(args)}],
        )
        message("toolResult", [{"type": "text", "text": output}], toolCallId=call_id, toolName=name, isError=False)
    if env.answer:
        message("assistant", [{"type": "text", "text": env.answer}])
    return events


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


# ----------------------------------------------------------------------------------------------
# Running a grader


def run_grader(
    argv: list[str],
    *,
    workdir: Path,
    mounts: dict[str, Path],
    cwd: str,
    env: dict[str, str],
    limits: "ExecLimits",
    read_only: "Sequence[Path]" = (),
) -> "ExecResult":
    """Run a task's grader in the sandbox; GraderError when it did not run to completion.
    `read_only`: host folders the grader reads that may lie under /tmp (a checkout of the
    benchmark's framework, a virtual environment), which the sandbox would otherwise hide."""
    from harnessrl.tasks.sandbox_exec import run_sandboxed

    try:
        result = run_sandboxed(
            argv,
            workdir=workdir,
            mounts=mounts,
            env=env,
            limits=limits,
            network=False,
            cwd_in_sandbox=cwd,
            read_only=read_only,
        )
    except ValueError as e:  # a mount the sandbox cannot make here
        raise GraderUnavailable(f"the sandbox cannot run the grader: {e}") from None
    if result.timed_out:
        raise GraderError(f"grader hung: no result within {limits.wall_s:g} s{output_tail(result)}")
    if result.returncode is None:
        raise GraderError(f"grader did not run: {result.reason or 'no exit status'}{output_tail(result)}")
    return result


def output_tail(result: "ExecResult") -> str:
    text = (result.stderr.strip() or result.stdout.strip())[-MAX_REASON_CHARS:]
    return f"; output: {text}" if text else ""


def grader_failed(what: str, result: "ExecResult") -> GraderError:
    return GraderError(f"{what} (exit status {result.returncode}){output_tail(result)}")


def parse_unit_float(text: str, what: str) -> float:
    """A score in [0, 1] from a grader's text, or GraderError quoting what it printed instead."""
    shown = text.strip()[:200] or "(nothing)"
    try:
        value = float(text.strip())
    except ValueError:
        raise GraderError(f"{what} is not a number: {shown!r}") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise GraderError(f"{what} {value!r} is outside [0, 1]")
    return value
