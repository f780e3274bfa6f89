"""What an agent program's sandbox lets it read, reach and import: `harnessrl audit --harness`.

An external harness spec (`kind: external`) runs its command in a sandbox whose view of this
machine is built from the spec: the host paths of its command line and `read_only`, the Python
environment `{python}` stands for, a network namespace of its own (or the host's, `network:
host`) reaching the recording endpoint. This audit starts a probe program (audit_probe.py, the
standard library only) in that same sandbox, with the same view, environment variables and
network, and reports what a program there can

    read    every tree of host files outside the system folders and the workspace, each with
            its file count and why it is there (shown by the command, by `read_only`, for
            `{python}`, the episode's own folders) or `exposed` (nothing in the spec asked for
            it); harnessrl's source, files named like its modules, the task folders of a suite
            (`--suite`), the user's home (a marker file planted there for the audit), the files
            beside the command's own files
    reach   each TCP port that listens on the host's loopback when the audit starts, a port the
            audit opens itself, and the episode's endpoint (a stand-in listening the way the
            recording endpoint does: a TCP port, and a Unix socket relayed into the namespace)
    import  `import harnessrl`, by the Python `{python}` (or a python command) stands for and by
            the system's python3 (a shell-script agent may start any interpreter it finds)

and whether the command's program and files are there for it to start. Each finding is `ok`,
`exposed`, one of the reasons a path is shown on purpose, or `problem` (the agent could not work
as configured: a missing installation, no endpoint). The audit's exit code is 1 when anything is
exposed, 2 when no probe could run (the problems say why), else 0.

The probe is started as harness/external.py starts an episode's program (`_run` builds the same
view, environment and limits), with no task: its workspace is an empty folder of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import selectors
import shutil
import socket
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import harnessrl
from harnessrl import audit_probe
from harnessrl.harness.agent_view import NoAgentPython, agent_private_paths, agent_python, host_paths
from harnessrl.harness.exposure import command_words
from harnessrl.harness.external import TASK_FILE, agent_environment, agent_limits
from harnessrl.harness.spec import PYTHON_PLACEHOLDER, AnyHarnessSpec, ExternalHarnessSpec
from harnessrl.tasks.sandbox_exec import (
    SANDBOX_PATH,
    SYSTEM_VIEW,
    ExecResult,
    isolation_available,
    run_sandboxed,
)
from harnessrl.tasks.sandbox_net import Forward, net_folder, socket_path

if TYPE_CHECKING:
    from harnessrl.tasks.base import Task

OK = "ok"
EXPOSED = "exposed"
PROBLEM = "problem"
BY_COMMAND = "shown by command"
BY_READ_ONLY = "shown by read_only"
BY_PYTHON = "shown for {python}"
CHECKS = ("start", "read", "reach", "import")

PROBE_FILE = "view_probe.py"
JOB_FILE = "probe_job.json"
PROBE_WALL_S = 120.0  # the probe's wall clock (the spec's, when shorter)
WALK_S = 30.0  # the probe's walk of the file system stops here; its counts are then lower bounds
MAX_PORTS = 200  # host ports tried
MAX_SIBLINGS = 200  # files beside a command file looked for
SHOWN_NAMES = 5  # paths named in a finding's detail
_SKIP = ("/proc", "/dev", *("/" + entry for entry in SYSTEM_VIEW))
_SPEC_PYTHON = "the spec's {python}"
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
_WITHOUT_BWRAP = (
    "bubblewrap does not work here: every agent program runs with the host's whole file system "
    "(whatever its uid may read) and the host's network, and so did the probe; the list below is what "
    "any agent program run here can read and reach"
)


class LoopHarnessError(ValueError):
    """The spec is a loop harness: there is no agent program to audit."""


@dataclass
class Finding:
    check: str  # one of CHECKS
    what: str
    where: str  # a path, a port, an interpreter
    verdict: str  # OK, EXPOSED, PROBLEM or a BY_* reason
    detail: str = ""


@dataclass
class HarnessAudit:
    """What a probe started the way the spec starts its agent found."""

    harness: str
    spec: str  # how it was named: a path or a built-in name
    command: list[str]
    network: str  # what the spec asks for: "sandbox" or "host"
    isolation: str  # "bwrap" or "rlimits-only"
    suite: str | None = None
    tasks: int = 0
    interpreters: list[str] = field(default_factory=list)  # the Pythons the probe ran on
    findings: list[Finding] = field(default_factory=list)
    probed: bool = False  # a probe ran and reported

    @property
    def network_had(self) -> str:
        """The network the agent gets here: its own namespace only under bubblewrap."""
        return self.network if self.isolation == "bwrap" else "host"

    def exposed(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == EXPOSED]

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == PROBLEM]

    def warning(self) -> str:
        return "" if self.isolation == "bwrap" else _WITHOUT_BWRAP

    def exit_code(self) -> int:
        """1: something is exposed; 2: no probe could run (the findings say why); 0: neither."""
        if self.exposed():
            return 1
        return 0 if self.probed else 2

    def add(self, check: str, what: str, where: str, verdict: str, detail: str = "") -> None:
        finding = Finding(check, what, where, verdict, detail)
        if finding not in self.findings:
            self.findings.append(finding)

    def sorted_findings(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: CHECKS.index(f.check))

    def to_json(self) -> dict[str, Any]:
        return {
            "harness": self.harness,
            "spec": self.spec,
            "command": self.command,
            "network": self.network,
            "network_had": self.network_had,
            "isolation": self.isolation,
            "warning": self.warning(),
            "suite": self.suite,
            "tasks": self.tasks,
            "interpreters": self.interpreters,
            "probed": self.probed,
            "exit_code": self.exit_code(),
            "exposed": [asdict(f) for f in self.exposed()],
            "problems": [asdict(f) for f in self.problems()],
            "findings": [asdict(f) for f in self.sorted_findings()],
        }

    def summary(self) -> str:
        exposed, problems = len(self.exposed()), len(self.problems())
        if not self.probed:
            return "not audited: no probe could run in the agent's sandbox (see the problems above)"
        head = f"{exposed} exposed" if exposed else "nothing exposed"
        return head + (f"; {problems} problem(s): the agent could not work as configured" if problems else "")

    def markdown(self) -> str:
        lines = [
            f"# Agent view audit: {self.harness} ({self.spec})",
            "",
            f"Command: `{' '.join(self.command)}`. Network: {self.network_had}. Sandbox isolation: {self.isolation}."
            + (f" Suite: {self.suite} ({self.tasks} tasks)." if self.suite else ""),
            "",
        ]
        if self.warning():
            lines += [f"**{self.warning()}.**", ""]
        lines += ["| check | what | where | verdict | detail |", "|---|---|---|---|---|"]
        for f in self.sorted_findings():
            cells = [f.check, f.what, f.where, f.verdict, f.detail]
            lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        return "\n".join([*lines, "", self.summary() + ".", ""])


# ------------------------------------------------------------------------------------------------


def audit_harness(
    spec: AnyHarnessSpec, named: str, tasks: Sequence[Task] = (), suite: str | None = None
) -> HarnessAudit:
    """Probe what the agent program of `spec` (named `named`) can read, reach and import, in the
    sandbox its episodes get; with `tasks` (of `suite`), whether their task folders are visible."""
    if not isinstance(spec, ExternalHarnessSpec):
        raise LoopHarnessError(
            f"harness '{spec.name}' is a loop harness: loop harnesses run in-process, and their tools go "
            "through the shell sandbox, which `harnessrl audit --suite SUITE` covers (the grader probe); "
            "`--harness` audits an agent program (kind: external)"
        )
    argv = spec.argv()
    audit = HarnessAudit(
        harness=spec.name,
        spec=named,
        command=argv,
        network=spec.network,
        isolation=isolation_available(),
        suite=suite,
        tasks=len(tasks),
    )
    for word in spec.read_only:
        if not os.path.lexists(word):
            audit.add("start", "read_only path", word, PROBLEM, "not on this machine (not installed?): not shown")
    views = _views(spec, argv, tasks, audit)
    if not views:
        return audit
    token = secrets.token_hex(8)
    marker = _plant(Path.home() / f".harnessrl-audit-{token}")
    try:
        with _Listeners(token) as listeners:
            ports = [p for p in listening_ports() if p[1] not in listeners.ports()][:MAX_PORTS]
            for view in views:
                _probe(spec, argv, view, tasks, audit, listeners, ports, marker)
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
    return audit


View = tuple[tuple[Path, ...], tuple[Path, ...]]  # (read_only, hidden)


def _views(
    spec: ExternalHarnessSpec, argv: list[str], tasks: Sequence[Task], audit: HarnessAudit
) -> dict[View, list[str]]:
    """The distinct views the spec's episodes get (by task: its own folder is never shown), each
    with its tasks' ids; a task whose view is refused is a problem finding."""
    views: dict[View, list[str]] = {}
    refused: dict[str, list[str]] = {}
    cases: list[tuple[str, tuple[Path, ...]]] = [(t.id, agent_private_paths(t)) for t in tasks] or [("", ())]
    for task_id, private in cases:
        try:
            view = host_paths(argv, spec.read_only, private)
        except ValueError as e:
            refused.setdefault(str(e), []).append(task_id)
            continue
        views.setdefault((tuple(view.read_only), tuple(view.hidden)), []).append(task_id)
    for message, ids in refused.items():
        on = f" (on {len(ids)} task(s): {_names(ids)})" if ids != [""] else ""
        audit.add("start", "the agent's view", "read_only", PROBLEM, f"cannot start the agent program{on}: {message}")
    return views


def _probe(
    spec: ExternalHarnessSpec,
    argv: list[str],
    view: View,
    tasks: Sequence[Task],
    audit: HarnessAudit,
    listeners: _Listeners,
    ports: list[tuple[str, int]],
    marker: Path | None,
) -> None:
    """Run the probe in one view, by each Python of `_interpreters`, and note what it found."""
    read_only, hidden = view
    control = Path(tempfile.mkdtemp(prefix="harnessrl-audit-"))
    control.chmod(0o711)  # as for an episode: the sandbox user reaches what is made inside it
    try:
        (control / "home").mkdir()
        workdir = control / "workspace"
        workdir.mkdir()
        (control / TASK_FILE).write_text("(the audit's probe: no task)\n", encoding="utf-8")
        shutil.copyfile(audit_probe.__file__, control / PROBE_FILE)
        (control / PROBE_FILE).chmod(0o644)
        roots = _roots(spec, argv, read_only, control)
        pythons = _interpreters(argv, audit)
        program: str | None = argv[0]
        if argv[0] == PYTHON_PLACEHOLDER:  # checked by running the probe on it, when it resolved
            program = None
        job = _job(argv, tasks, roots, listeners, ports, marker, str(workdir), program)
        (control / JOB_FILE).write_text(json.dumps(job), encoding="utf-8")
        (control / JOB_FILE).chmod(0o644)
        first = True
        for label, python, extra in pythons:
            if not first:
                job["import_only"] = True
                (control / JOB_FILE).write_text(json.dumps(job), encoding="utf-8")
            found = _run(
                spec,
                [python, str(control / PROBE_FILE), str(control / JOB_FILE)],
                extra,
                control,
                workdir,
                view,
                listeners,
                audit,
                label,
            )
            if found is None:
                continue
            if f"{python} ({label})" not in audit.interpreters:
                audit.interpreters.append(f"{python} ({label})")
            if label == _SPEC_PYTHON:
                audit.add("start", "the command's program", PYTHON_PLACEHOLDER, OK, f"{python} runs in the sandbox")
            _note_import(found["import"], python, label, audit)
            if first:
                audit.probed = True
                _note_found(found, job, roots, listeners, spec, audit)
                first = False
    finally:
        shutil.rmtree(control, ignore_errors=True)


def _interpreters(argv: list[str], audit: HarnessAudit) -> list[tuple[str, str, dict[str, str]]]:
    """(what it is, interpreter, extra environment) of each Python the probe runs on: the one the
    command names (`{python}`, or a python command word), then the system's python3."""
    out: list[tuple[str, str, dict[str, str]]] = []
    if PYTHON_PLACEHOLDER in argv:
        try:
            python, extra = agent_python()
            out.append((_SPEC_PYTHON, python, extra))
        except NoAgentPython as e:
            audit.add("start", "{python}", PYTHON_PLACEHOLDER, PROBLEM, f"cannot start the agent program: {e}")
    else:
        named = [w for w in command_words(argv) if _PYTHON_NAME.match(os.path.basename(w))]
        if named:
            out.append(("the command's python", named[0], {}))
    system = shutil.which("python3", path=SANDBOX_PATH)
    if system is None:
        audit.add("start", "python3", "(none)", PROBLEM, "no python3 on the sandbox's PATH: the probe needs one")
    elif not out or out[0][1:] != (system, {}):
        out.append(("the system's python3", system, {}))
    return out


def _roots(
    spec: ExternalHarnessSpec, argv: list[str], read_only: Sequence[Path], control: Path
) -> dict[str, tuple[str, str]]:
    """{host path: (verdict, why it is shown)} of everything the view shows on purpose."""
    asked = {str(Path(p).absolute()) for p in spec.read_only}
    for_python: set[str] = set()
    if PYTHON_PLACEHOLDER in command_words(argv):
        for_python = {str(p) for p in host_paths([PYTHON_PLACEHOLDER]).read_only}
    roots: dict[str, tuple[str, str]] = {}
    for path in map(str, read_only):
        if path in asked:
            roots[path] = (BY_READ_ONLY, "named in the spec's read_only")
        elif path in for_python:
            roots[path] = (BY_PYTHON, "the Python environment {python} stands for")
        else:
            roots[path] = (BY_COMMAND, "a file or folder of the command line")
    roots[str(control)] = (OK, "the episode's own folder (task file, home, answer file)")
    roots[str(net_folder())] = (OK, "the network relay and the endpoint's socket")
    return roots


def _job(
    argv: list[str],
    tasks: Sequence[Task],
    roots: dict[str, tuple[str, str]],
    listeners: _Listeners,
    ports: list[tuple[str, int]],
    marker: Path | None,
    workspace: str,
    program: str | None,
) -> dict[str, Any]:
    """What the probe looks for (audit_probe.py); `task_folders` and `command_files` are read
    back here."""
    source = Path(harnessrl.__file__).resolve().parent
    modules = sorted(p for p in source.rglob("*.py") if p.name != "__init__.py")
    look = [str(source), str(Path.home()), *(str(p) for p in modules)]
    look += [str(marker)] if marker is not None else []
    task_folders = [str(f) for t in tasks for f in agent_private_paths(t)]
    command_files = [str(f) for f in _siblings(argv)]
    look += task_folders + command_files + [str(s) for siblings in _siblings(argv).values() for s in siblings]
    return {
        "skip": [*_SKIP, workspace],
        "roots": list(roots),
        "modules": sorted({"/harnessrl/" + p.relative_to(source).as_posix() for p in modules}),
        "walk_s": WALK_S,
        "look": list(dict.fromkeys(look)),
        "ports": [list(p) for p in ports] + [["127.0.0.1", listeners.own_port]],
        "tokens": listeners.tokens(),
        "program": program,
        "task_folders": list(dict.fromkeys(task_folders)),
        "command_files": command_files,
    }


def _siblings(argv: list[str]) -> dict[Path, list[Path]]:
    """{command file: the files beside it}, for each absolute command word naming a file."""
    out: dict[Path, list[Path]] = {}
    system = tuple(f"/{entry}/" for entry in SYSTEM_VIEW)
    for word in command_words(argv):
        path = Path(word)
        if not word.startswith("/") or not path.is_file() or str(path.resolve()).startswith(system):
            continue  # the system's own programs (/bin/sh) are the system's
        try:
            names = sorted(os.listdir(path.parent))
        except OSError:
            continue
        out[path] = [path.parent / n for n in names if n != path.name][:MAX_SIBLINGS]
    return out


def _run(
    spec: ExternalHarnessSpec,
    probe: list[str],
    extra: dict[str, str],
    control: Path,
    workdir: Path,
    view: View,
    listeners: _Listeners,
    audit: HarnessAudit,
    label: str,
) -> dict[str, Any] | None:
    """Start the probe the way harness/external.py starts the spec's program; what it printed, or
    None (a problem finding says why)."""
    inside = str(workdir)
    url = f"http://127.0.0.1:{listeners.endpoint_port}/episodes/audit/v1"
    variables = agent_environment(
        spec, extra, control=control, inside=inside, url=url, model="audit", task_id="audit", attempt=0
    )
    limits = dataclasses.replace(
        agent_limits(spec, PROBE_WALL_S), output_bytes=max(spec.limits.output_bytes, 1_000_000)
    )
    try:
        result: ExecResult = run_sandboxed(
            probe,
            workdir=workdir,
            mounts={inside: workdir, str(control): control},
            env=variables,
            limits=limits,
            network=spec.network == "host",
            forward=[listeners.forward()],
            cwd_in_sandbox=inside,
            read_only=list(view[0]),
            hidden=list(view[1]),
        )
    except (ValueError, OSError) as e:
        audit.add("start", "the sandbox", probe[0], PROBLEM, f"cannot start the agent program: {e}")
        return None
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        why = result.reason or " ".join(result.stderr.strip()[-300:].split()) or f"exit code {result.returncode}"
        audit.add("start", f"the probe on {label}", probe[0], PROBLEM, f"did not run: {why}")
        return None


# ------------------------------------------------------------------------------------------------ findings


def _note_import(found: dict[str, Any], python: str, label: str, audit: HarnessAudit) -> None:
    what = f"import harnessrl ({label})"
    if found["imported"] and found.get("code"):
        audit.add("import", what, python, EXPOSED, f"imports harnessrl from {found['from']}")
    elif found["imported"]:
        audit.add("import", what, python, OK, "finds only an empty folder of that name (no code)")
    else:
        audit.add("import", what, python, OK, f"fails: {found['error']}")


def _note_found(
    found: dict[str, Any],
    job: dict[str, Any],
    roots: dict[str, tuple[str, str]],
    listeners: _Listeners,
    spec: ExternalHarnessSpec,
    audit: HarnessAudit,
) -> None:
    look: dict[str, dict[str, Any]] = found["look"]
    program = found["program"]
    if job["program"] is not None:
        verdict, detail = (
            (OK, f"found at {program['at']}") if program["found"] else (PROBLEM, "not found in the sandbox")
        )
        audit.add("start", "the command's program", job["program"], verdict, detail)
    for path in job["command_files"]:
        if look[path]["there"]:
            audit.add("start", "a file of the command line", path, OK, "visible")
        else:
            audit.add("start", "a file of the command line", path, PROBLEM, "not visible in the sandbox")
    walk = found["walk"]
    lower = " or more (the walk stopped at its time limit)" if walk["stopped"] else ""
    for tree, files in sorted(walk["trees"].items()):
        verdict, why = roots.get(tree, (EXPOSED, "nothing in the spec asks for it"))
        audit.add("read", "visible tree", tree, verdict, f"{_files(files)}{lower}; {why}")
    _note_source(look, walk, audit)
    _note_private(look, job["task_folders"], audit)
    _note_siblings(look, roots, audit)
    _note_ports(found, listeners, spec, audit)


def _note_source(look: dict[str, dict[str, Any]], walk: dict[str, Any], audit: HarnessAudit) -> None:
    source = str(Path(harnessrl.__file__).resolve().parent)
    modules = [p for p, seen in look.items() if p.startswith(source + "/") and p.endswith(".py") and seen["there"]]
    if modules:
        audit.add("read", "harnessrl's source", source, EXPOSED, f"{len(modules)} of its modules readable")
    else:
        there = look[source]["there"]
        audit.add("read", "harnessrl's source", source, OK, "an empty folder in its place" if there else "not there")
    copies = {folder: n for folder, n in walk["modules"].items() if folder != source}
    if copies:
        where = _names(sorted(copies))
        audit.add("read", "files named like harnessrl's modules", where, EXPOSED, _files(sum(copies.values())))
    else:
        audit.add("read", "files named like harnessrl's modules", "(anywhere walked)", OK, "none")


def _note_private(look: dict[str, dict[str, Any]], task_folders: list[str], audit: HarnessAudit) -> None:
    home = str(Path.home())
    markers = [p for p in look if p.startswith(home + "/.harnessrl-audit-")]
    if markers and look[markers[0]]["there"]:
        audit.add("read", "the user's home", home, EXPOSED, "a file planted there for the audit is readable")
    elif not markers and look[home]["files"]:
        audit.add("read", "the user's home", home, EXPOSED, f"{_files(look[home]['files'])} readable")
    else:
        audit.add("read", "the user's home", home, OK, "a file planted there for the audit is not visible")
    if audit.suite is None:
        return
    folders = task_folders
    if not folders:
        audit.add(
            "read",
            "task folders",
            audit.suite,
            OK,
            "its tasks have no folder (built in: harnessrl's source holds them)",
        )
        return
    seen = [p for p in folders if look[p]["there"] and look[p]["files"]]
    for path in seen:
        audit.add("read", "task folder", path, EXPOSED, f"{_files(look[path]['files'])} readable (its grader)")
    if not seen:
        audit.add("read", "task folders", audit.suite, OK, f"none of {len(folders)} visible")


def _note_siblings(look: dict[str, dict[str, Any]], roots: dict[str, tuple[str, str]], audit: HarnessAudit) -> None:
    """The files beside each command file that the probe saw, by why the view shows them."""
    for command_file, siblings in _siblings(audit.command).items():
        if not siblings:
            continue
        what, where = f"files beside {command_file.name}", str(command_file.parent)
        by_reason: dict[tuple[str, str], list[str]] = {}
        for sibling in siblings:
            if look.get(str(sibling), {}).get("there"):
                by_reason.setdefault(_reason(str(sibling), roots), []).append(sibling.name)
        if not by_reason:
            audit.add("read", what, where, OK, f"none of {len(siblings)} visible")
        for (verdict, why), names in by_reason.items():
            audit.add("read", what, where, verdict, f"{len(names)} of {len(siblings)} visible ({_names(names)}); {why}")


def _note_ports(found: dict[str, Any], listeners: _Listeners, spec: ExternalHarnessSpec, audit: HarnessAudit) -> None:
    endpoint = found["endpoint"]
    where = f"127.0.0.1:{listeners.endpoint_port}"
    if endpoint.get("reached") and endpoint.get("answered"):
        audit.add("reach", "the episode's endpoint", where, OK, "reached (the stand-in answered)")
    else:
        why = endpoint.get("error") or "something else answered"
        audit.add(
            "reach",
            "the episode's endpoint",
            where,
            PROBLEM,
            f"not reached ({why}): the agent could make no model call",
        )
    host = " (the spec asks for the host's network)" if spec.network == "host" else ""
    refused = []
    for address, port, seen in found["ports"]:
        own = port == listeners.own_port
        what = "a port the audit opened" if own else "a host port listening at audit time"
        if seen["reached"]:
            audit.add("reach", what, f"{address}:{port}", EXPOSED, f"connected{host}")
        elif own:
            audit.add("reach", what, f"{address}:{port}", OK, f"refused ({seen['error']})")
        else:
            refused.append(f"{address}:{port}")
    if refused:
        audit.add("reach", "host ports listening at audit time", _names(refused, 12), OK, f"{len(refused)} refused")


def _reason(path: str, roots: dict[str, tuple[str, str]]) -> tuple[str, str]:
    """Why the view shows `path`: the verdict of the deepest root holding it, else EXPOSED."""
    for root in sorted(roots, key=len, reverse=True):
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return roots[root]
    return EXPOSED, "nothing in the spec asks for it"


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _names(items: Sequence[str], limit: int = SHOWN_NAMES) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _plant(path: Path) -> Path | None:
    """A marker file at `path` for the probe to look for (None where it cannot be written)."""
    try:
        path.write_text("planted by harnessrl audit --harness; removed when it ends\n", encoding="utf-8")
        path.chmod(0o644)
    except OSError:
        return None
    return path


def listening_ports() -> list[tuple[str, int]]:
    """(address to connect to, port) of every TCP socket listening on this machine's loopback
    (127.0.0.0/8, ::1) or on every address, from /proc/net/tcp and tcp6."""
    found: dict[int, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, _, port = fields[1].partition(":")
            host = _loopback(address)
            if host is not None:
                found.setdefault(int(port, 16), host)
    return sorted(((host, port) for port, host in found.items()), key=lambda p: p[1])


def _loopback(address: str) -> str | None:
    """The address to reach a listener bound to `address` (/proc's hex) on loopback, or None."""
    if len(address) == 8:
        if address == "00000000":
            return "127.0.0.1"
        raw = bytes.fromhex(address)[::-1]
        return socket.inet_ntoa(raw) if raw[0] == 127 else None
    if address in ("0" * 32, "0" * 24 + "01000000"):  # :: and ::1
        return "::1"
    return None


class _Listeners:
    """What the probe tries to reach: the endpoint's stand-in (a TCP port and a Unix socket
    relayed into the agent's namespace, as the recording endpoint listens) and a TCP port of the
    audit's own. Each answers a connection with its token and closes it."""

    def __init__(self, token: str):
        self._endpoint_token = f"endpoint-{token}"
        self._own_token = f"audit-{token}"
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._socket = socket_path(f"audit-{token}.sock")
        self.endpoint_port = self._listen(socket.AF_INET, ("127.0.0.1", 0), self._endpoint_token)
        self.own_port = self._listen(socket.AF_INET, ("127.0.0.1", 0), self._own_token)
        self._listen(socket.AF_UNIX, str(self._socket), self._endpoint_token)
        self._socket.chmod(0o666)  # the relay runs as the sandbox's user
        self._thread = threading.Thread(target=self._serve, name="harnessrl-audit-listeners", daemon=True)

    def _listen(self, family: int, address: Any, token: str) -> int:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind(address)
        sock.listen(16)
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, token)
        return sock.getsockname()[1] if family == socket.AF_INET else 0

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    conn, _ = sock.accept()
                except OSError:
                    continue
                with conn:
                    conn.setblocking(True)
                    conn.settimeout(2.0)
                    try:
                        conn.sendall(key.data.encode() + b"\n")
                    except OSError:
                        pass

    def ports(self) -> set[int]:
        return {self.endpoint_port, self.own_port}

    def tokens(self) -> dict[str, str]:
        return {str(self.endpoint_port): self._endpoint_token, str(self.own_port): self._own_token}

    def forward(self) -> Forward:
        return Forward(listen=self.endpoint_port, connect=self._socket)

    def __enter__(self) -> _Listeners:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()
        self._socket.unlink(missing_ok=True)
