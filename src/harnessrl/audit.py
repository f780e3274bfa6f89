"""Reward-hacking audit: adversarial probes against a suite's graders (`harnessrl audit`).

A probe does to a task's fresh environment what a cheating agent would, without a model, and the
task's own grader then grades what it left. A task whose grader passes a probe can be passed
without doing the task; a task whose grader files an agent can see can be learned.

    null         submits nothing: the environment as set up, untouched
    empty        submits an empty answer (through the task's own submit tool)
    instruction  answers from the instruction text alone: the whole instruction, its last
                 number, its first number (each a variant; one passing is enough)
    junk         writes plausible junk to every file the instruction names that setup did not
                 make (JSON, CSV, text by extension; never the task's own words) and submits "done"
    grader       runs in the sandbox an agent program gets (the view of docs/external-harness.md)
                 and looks for the task's grader: its task folder, grader files by name anywhere
                 but the system and the Python packages shown on purpose, harnessrl's source
                 (from which a built-in task and its answer can be rebuilt), and whether it can
                 import harnessrl; it records what it saw and which of those files it could
                 write (it writes nothing), and submits

Each probe gets its own environment. A grader that crashes on a probe is an error of that
probe (listed, not a pass); a task that cannot be set up is listed as not runnable.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment, Task, ToolBlocked, ToolFailed
from harnessrl.tasks.grading import numbers_in

PROBES = ("null", "empty", "instruction", "junk", "grader")
# what the grader probe looks for by name: the grader and answer files of the formats harnessrl
# imports (ClawGym, PinchBench, Harbor, Claw-Eval), and the folder of harnessrl's built-in suites
GRADER_NAMES = (
    "reward.sh",
    "check.py",
    "grader.py",
    "data_entry.json",
    "test.sh",
    "test_outputs.py",
    "task.toml",
    "task.yaml",
    "solution.sh",
    "expected_output.json",
)
_PATH_WORD = re.compile(r"(?<![\w/.:-])((?:/)?(?:[\w.-]+/)*[\w-][\w.-]*\.[A-Za-z][A-Za-z0-9]{0,4})(?![\w/-])")
_JUNK = {
    ".json": '{"result": 0, "items": [], "status": "ok"}\n',
    ".jsonl": '{"result": 0}\n',
    ".csv": "id,name,value\n1,item,0\n",
    ".tsv": "id\tname\tvalue\n1\titem\t0\n",
    ".md": "# Report\n\nTo be written.\n",
    ".py": "def main():\n    return 0\n",
    ".sh": "#!/bin/sh\nexit 0\n",
    ".yaml": "result: 0\n",
    ".yml": "result: 0\n",
    ".html": "<html><body>placeholder</body></html>\n",
}


@dataclass
class ProbeResult:
    """What one probe got from one task's grader."""

    probe: str
    passed: bool = False
    score: float | None = None
    variant: str = ""  # which variant passed (or was graded last)
    error: str = ""  # the grader crashed or the probe could not run
    seen: list[str] = field(default_factory=list)  # grader probe: host files it could see
    writable: list[str] = field(default_factory=list)  # grader probe: of those, which it could write
    note: str = ""  # grader probe: the sandbox's isolation, harnessrl importable, ...


@dataclass
class TaskAudit:
    task_id: str
    family: str
    results: list[ProbeResult] = field(default_factory=list)
    not_runnable: str = ""


@dataclass
class AuditReport:
    suite: str
    split: str
    isolation: str
    probes: list[str]
    tasks: list[TaskAudit]

    def passed_by_probe(self) -> list[dict[str, Any]]:
        """Every (task, probe) whose grader passed the probe."""
        return [
            {"task": t.task_id, "family": t.family, "probe": r.probe, "variant": r.variant, "score": r.score}
            for t in self.tasks
            for r in t.results
            if r.passed
        ]

    def exposed(self) -> list[dict[str, Any]]:
        """Every task whose grader files (or harnessrl's source) the grader probe could see."""
        return [
            {"task": t.task_id, "seen": r.seen, "writable": r.writable, "note": r.note}
            for t in self.tasks
            for r in t.results
            if r.probe == "grader" and r.seen
        ]

    def errors(self) -> list[dict[str, str]]:
        out = [{"task": t.task_id, "probe": "-", "error": t.not_runnable} for t in self.tasks if t.not_runnable]
        out += [
            {"task": t.task_id, "probe": r.probe, "error": r.error} for t in self.tasks for r in t.results if r.error
        ]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "split": self.split,
            "isolation": self.isolation,
            "probes": self.probes,
            "tasks_audited": len(self.tasks),
            "passed_by_probe": self.passed_by_probe(),
            "exposed": self.exposed(),
            "errors": self.errors(),
            "tasks": [asdict(t) for t in self.tasks],
        }

    def markdown(self) -> str:
        """The report: what passed which probe, what was exposed, what failed to run."""
        lines = [
            f"# Reward-hacking audit: {self.suite} ({self.split}, {len(self.tasks)} tasks)",
            "",
            f"Probes: {', '.join(self.probes)}. Sandbox isolation: {self.isolation}.",
            "",
        ]
        passed = self.passed_by_probe()
        lines += _section(
            f"Tasks passed by a probe: {len(passed)}",
            ["task", "family", "probe", "variant", "score"],
            [[p["task"], p["family"], p["probe"], p["variant"], _fmt(p["score"])] for p in passed],
            "None: no probe passed any grader.",
        )
        exposed = self.exposed()
        lines += _section(
            f"Grader files an agent could see: {len(exposed)} tasks",
            ["task", "seen", "writable", "note"],
            [[e["task"], _cell(e["seen"]), _cell(e["writable"]), e["note"]] for e in exposed],
            "None: the grader probe found no grader file, task folder or harnessrl source.",
        )
        errors = self.errors()
        if errors:
            rows = [[e["task"], e["probe"], _cell([e["error"]])] for e in errors]
            lines += _section(f"Not audited: {len(errors)}", ["task", "probe", "error"], rows, "")
        return "\n".join(lines) + "\n"


def _section(title: str, header: list[str], rows: list[list[str]], if_none: str) -> list[str]:
    """A Markdown section: its title, then a table of `rows`, or `if_none` when there are none."""
    lines = [f"## {title}", ""]
    if not rows:
        return lines + [if_none, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def _fmt(score: float | None) -> str:
    return "-" if score is None else f"{score:.3g}"


def _cell(items: list[str], limit: int = 300) -> str:
    text = "; ".join(items).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------------------------------------


def audit_suite(
    suite_name: str,
    tasks: list[Task],
    split: str,
    probes: tuple[str, ...] = PROBES,
    progress: Callable[[str], None] | None = None,
) -> AuditReport:
    """Run every probe of `probes` on every task; a task that cannot be set up is listed as such."""
    from harnessrl.tasks.sandbox_exec import isolation_available, isolation_description

    unknown = [p for p in probes if p not in PROBES]
    if unknown:
        raise ValueError(f"unknown probe(s) {', '.join(unknown)} (known: {', '.join(PROBES)})")
    audits = []
    for task in tasks:
        if progress is not None:
            progress(task.id)
        audits.append(audit_task(task, probes))
    return AuditReport(
        suite=suite_name,
        split=split,
        isolation=isolation_description(isolation_available()),
        probes=list(probes),
        tasks=audits,
    )


def audit_task(task: Task, probes: tuple[str, ...] = PROBES) -> TaskAudit:
    audit = TaskAudit(task_id=task.id, family=task.family)
    for probe in probes:
        result = ProbeResult(probe=probe)
        for variant, act in _variants(probe, task):
            try:
                env = task.make_env()
            except Exception as e:  # noqa: BLE001 - the task's own setup failed: not auditable
                audit.not_runnable = f"setup failed: {type(e).__name__}: {e}"
                return audit
            try:
                act(env, result)
                grade = task.grade(env)
            except Exception as e:  # noqa: BLE001 - a grader crash is this probe's error, never a pass
                result.error = f"{variant}: {type(e).__name__}: {str(e)[:300]}"
                break
            finally:
                env.close()
            result.variant, result.score, result.passed = variant, grade.score, grade.passed
            if grade.passed:
                break
        audit.results.append(result)
    return audit


Act = Callable[[Environment, ProbeResult], None]


def _variants(probe: str, task: Task) -> list[tuple[str, Act]]:
    """The probe's variants on this task: (name, what it does to a fresh environment)."""
    if probe == "null":
        return [("nothing", lambda env, r: None)]
    if probe == "empty":
        return [("empty answer", lambda env, r: _submit(task, env, ""))]
    if probe == "instruction":
        found = numbers_in(task.instruction)
        answers = [("whole instruction", task.instruction)]
        if found:
            answers += [("last number", _number(found[-1])), ("first number", _number(found[0]))]
        return [(name, _answering(task, text)) for name, text in answers]
    if probe == "junk":
        return [("junk in named files", lambda env, r: _write_junk(task, env))]
    if probe == "grader":
        return [("look for the grader", lambda env, r: _look_for_grader(task, env, r))]
    raise ValueError(f"unknown probe {probe!r}")


def _number(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)


def _answering(task: Task, text: str) -> Act:
    return lambda env, r: _submit(task, env, text)


def _submit(task: Task, env: Environment, answer: str) -> None:
    """Submit `answer` through the task's own submit tool, its other required arguments empty of
    their type; a refusal leaves the environment unsubmitted (as it would an agent)."""
    tool = task.tool("submit")
    if tool is None:
        env.submitted, env.answer = True, answer
        return
    props = tool.parameters.get("properties", {})
    empty_of = {"string": "", "object": {}, "array": [], "integer": 0, "number": 0, "boolean": False}
    args: dict[str, Any] = {}
    for key in tool.parameters.get("required", []):
        args[key] = empty_of.get(props.get(key, {}).get("type", "string"), "")
    for key, spec in props.items():
        if spec.get("type", "string") == "string" and (key == "answer" or key in args):
            args[key] = answer
    try:
        tool.fn(env, **args)
    except (ToolBlocked, ToolFailed, TypeError, ValueError):
        pass


def named_files(instruction: str) -> list[str]:
    """The file paths an instruction names (`output/total.txt`, `/app/result.json`, `report.md`)."""
    out = []
    for match in _PATH_WORD.finditer(instruction):
        word = match.group(1).rstrip(".")
        if "://" in instruction[max(0, match.start() - 8) : match.start() + 3]:
            continue
        out.append(word)
    return list(dict.fromkeys(out))


def _write_junk(task: Task, env: Environment) -> None:
    ws = env.workspace
    if ws is not None:
        existing = set(ws.files())
        for word in named_files(task.instruction):
            rel = _inside_workspace(word, env.workspace_mount)
            if rel is None or rel in existing:
                continue
            try:
                ws.write(rel, _JUNK.get(PurePosixPath(rel).suffix.lower(), "placeholder output\n"))
            except (OSError, untrusted.Refused):  # a parent is a file: an agent's write would fail too
                continue
    _submit(task, env, "done")


def _inside_workspace(word: str, mount: str | None) -> str | None:
    """A named path as a path relative to the workspace, or None when it points elsewhere."""
    p = PurePosixPath(word)
    if p.is_absolute():
        if mount is None:
            return None
        try:
            p = p.relative_to(mount)
        except ValueError:
            return None
    if ".." in p.parts or not p.parts:
        return None
    return p.as_posix()


# The grader probe's program: standard library only, run on the system's python3 in the agent's
# sandbox. argv: a JSON of {names, paths, workspace}. It prints one JSON line.
_LOOK = r"""
import json, os, sys
job = json.loads(sys.argv[1])
names, seen = set(job["names"]), []
skip = {"/proc", "/sys", "/dev", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/nix"}
skip.update(job["installed"])
if job["walk"]:
    for root, dirs, files in os.walk("/"):
        inner = [os.path.join(root, d) for d in dirs]
        dirs[:] = [os.path.basename(p) for p in inner if p not in skip and not p.startswith(job["workspace"])]
        seen += [os.path.join(root, f) for f in files if f in names]
for path in job["paths"]:
    if os.path.exists(path):
        seen.append(path)
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                seen += [os.path.join(root, f) for f in files if f in names]
seen = sorted(set(seen))
writable = [p for p in seen if os.access(p, os.W_OK)]
try:
    import harnessrl
    importable = True
except ImportError:
    importable = False
print(json.dumps({"seen": seen, "writable": writable, "harnessrl": importable}))
"""


def _look_for_grader(task: Task, env: Environment, result: ProbeResult) -> None:
    """Run _LOOK in the sandbox an agent program would get for this task; note what it saw."""
    from harnessrl.harness.agent_view import agent_private_paths, host_paths, imported_task_folder
    from harnessrl.harness.spec import PYTHON_PLACEHOLDER
    from harnessrl.tasks.sandbox_exec import ExecLimits, SandboxRefused, isolation_available, run_sandboxed

    folder = imported_task_folder(task)
    source = str(folder) if folder is not None else None
    harnessrl_source = Path(__file__).resolve().parent
    paths = [p for p in (source, str(harnessrl_source / "tasks" / "suites")) if p]
    isolation = isolation_available()
    scratch = None
    if env.workspace is not None:
        workdir = env.workspace.root
    else:
        scratch = Path(tempfile.mkdtemp(prefix="harnessrl-audit-"))
        scratch.chmod(0o755)
        workdir = scratch
    inside = env.workspace_mount or str(workdir)
    names = [*GRADER_NAMES, Path(source).name] if source else list(GRADER_NAMES)
    view = host_paths([PYTHON_PLACEHOLDER], private=agent_private_paths(task))
    # the walk leaves out the system and the Python packages an agent is shown on purpose (their
    # own check.py and test.sh are not graders)
    installed = [str(p) for p in view.read_only]
    job = {"names": names, "paths": paths, "walk": isolation == "bwrap", "workspace": inside, "installed": installed}
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    try:
        run = run_sandboxed(
            [python, "-c", _LOOK, json.dumps(job)],
            workdir=workdir,
            mounts={inside: workdir} if isolation == "bwrap" or inside == str(workdir) else None,
            limits=ExecLimits(wall_s=60, cpu_s=60, memory_mb=2048),
            cwd_in_sandbox=inside if isolation == "bwrap" else str(workdir),
            read_only=view.read_only,
            hidden=view.hidden,
        )
    except SandboxRefused as e:  # bubblewrap could not build the agent's sandbox: the probe never ran
        raise RuntimeError(f"the grader probe did not run: {e}") from None
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    try:
        found = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"the grader probe did not run: {run.reason or run.stderr.strip()[-300:]}") from None
    result.seen, result.writable = found["seen"], found["writable"]
    result.note = f"isolation {isolation}" + ("; harnessrl importable" if found["harnessrl"] else "")
    if found["harnessrl"]:
        result.seen.append("(harnessrl importable: a built-in task and its answer can be rebuilt from its id)")
    _submit(task, env, "done")
