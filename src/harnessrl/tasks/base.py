"""The Task / Tool / Environment / Suite API, and the Workspace sandbox an environment holds.

A task makes a fresh environment, exposes tools that act on it and grades the final state.
A suite is a deterministic, seeded generator of tasks, split into train / dev / test with no
instance shared between splits. Suites know nothing about harnesses.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, NotRequired, TypedDict

from harnessrl.tasks import untrusted
from harnessrl.types import Grade, ToolSchema


class ToolBlocked(Exception):
    """Raised by a tool to refuse a call (sandbox escape, oversize write, ...).

    The message is shown to the model and the call is recorded as a *blocked call*.
    """

    def __init__(self, message: str, reason: str = "sandbox"):
        super().__init__(message)
        self.reason = reason


class ToolFailed(Exception):
    """Raised by a tool for an ordinary failure the model should see (file not found, ...).

    Not a blocked call and not an infrastructure error: the model just gets the message.
    """


@dataclass(frozen=True)
class ToolOutput:
    """A tool's answer when the model is shown less than what happened.

    `shown` goes to the model, `full` to the run store (e.g. a long command output cut for the
    model); `ok` is False for a failure the model should see (a command that exited non-zero).
    """

    shown: str
    full: str
    ok: bool = True


@dataclass
class Tool:
    """A tool: what the model is shown (name, description, JSON-schema arguments) and its code.

    `fn(env, **arguments) -> str | ToolOutput`. It raises ToolBlocked / ToolFailed for refusals
    and ordinary failures; any other exception is an infrastructure error of the episode.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str | ToolOutput]

    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(name=self.name, description=self.description, parameters=self.parameters)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def validate_arguments(parameters: dict[str, Any], arguments: Any) -> tuple[dict[str, Any], str | None]:
    """Check call arguments against a tool's (flat) JSON schema.

    Returns (clean_arguments, error). Unknown keys are dropped (small models add them often and
    they carry no meaning); missing required keys and wrong types are errors. `bool` is never
    accepted where a number is expected.
    """
    if not isinstance(arguments, dict):
        return {}, f"arguments must be an object, got {type(arguments).__name__}"
    props: dict[str, Any] = parameters.get("properties", {})
    clean: dict[str, Any] = {}
    for key in parameters.get("required", []):
        if key not in arguments:
            return {}, f"missing required argument '{key}'"
    for key, value in arguments.items():
        if key not in props:
            continue
        expected = props[key].get("type")
        if expected is not None:
            types = _JSON_TYPES.get(expected, (object,))
            ok = isinstance(value, types) and not (expected in ("integer", "number") and isinstance(value, bool))
            if expected == "integer" and isinstance(value, float) and value.is_integer():
                value, ok = int(value), True
            if not ok:
                return {}, f"argument '{key}' must be {expected}, got {type(value).__name__}"
        if "enum" in props[key] and value not in props[key]["enum"]:
            return {}, f"argument '{key}' must be one of {props[key]['enum']}"
        clean[key] = value
    return clean, None


MAX_WRITE_BYTES = 64 * 1024  # per write; a workspace task never needs more
MAX_WORKSPACE_BYTES = 4 * 1024 * 1024


class Workspace:
    """A temporary directory that the agent's tools may touch, and nothing else.

    Every host read and write under it goes through harnessrl.tasks.untrusted (no link followed,
    no FIFO or device opened, reads capped). `parts` turns a model-given path into the
    components those calls take, refusing absolute paths and `..` with ToolBlocked; the byte
    limits are enforced by the file tools (tasks/workspace.py).
    """

    def __init__(self, max_write_bytes: int = MAX_WRITE_BYTES, max_total_bytes: int = MAX_WORKSPACE_BYTES):
        self.root = Path(tempfile.mkdtemp(prefix="harnessrl-ws-")).resolve()
        self.max_write_bytes = max_write_bytes
        self.max_total_bytes = max_total_bytes

    # -- path checking --------------------------------------------------------------------------
    def parts(self, path: str) -> list[str]:
        """A model-given relative path as its components ([] for the workspace itself), or
        ToolBlocked for a non-string, a NUL byte, an absolute path or `..`."""
        if not isinstance(path, str):
            raise ToolBlocked(f"path must be a string, got {type(path).__name__}", "invalid_arguments")
        try:
            return untrusted.parts_of(path.strip())
        except untrusted.Refused as e:
            if "NUL" in str(e):
                raise ToolBlocked("path contains a NUL byte", "sandbox") from None
            if e.reason == "outside" and ".." in str(e):
                raise ToolBlocked(f"'{path}' leaves the workspace ('..' is not allowed)", "sandbox") from None
            raise ToolBlocked(
                f"'{path}' is an absolute path; use a path relative to the workspace", "sandbox"
            ) from None

    # -- helpers used by task setup and graders ---------------------------------------------------
    def write(self, rel_path: str, content: str) -> None:
        untrusted.write_text(self.root, rel_path, content)

    def read(self, rel_path: str) -> str | None:
        """The text of a regular file, None when it is missing or not one the host will read
        (a link, a hard link, a FIFO...: an agent's leftovers are never followed)."""
        try:
            return untrusted.read_text(self.root, rel_path, self.max_total_bytes)
        except untrusted.Refused:
            return None

    def files(self) -> list[str]:
        """All regular files, relative, sorted (links are not files)."""
        return [e.rel for e in untrusted.walk(self.root) if e.kind == "file"]

    def total_bytes(self) -> int:
        return untrusted.total_file_bytes(self.root)

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Environment:
    """The live state of one episode: a workspace and/or simulated service state."""

    workspace: Workspace | None = None
    state: dict[str, Any] = field(default_factory=dict)
    submitted: bool = False
    answer: str | None = None
    calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)  # (tool, args, output)
    workspace_mount: str | None = None  # where a sandboxed command sees the workspace (Task.workspace_mount)

    def require_workspace(self) -> Workspace:
        """The workspace of a task that has one; a RuntimeError for an environment without."""
        if self.workspace is None:
            raise RuntimeError("this task needs an environment with a workspace (Task.needs_workspace)")
        return self.workspace

    def close(self) -> None:
        if self.workspace is not None:
            self.workspace.cleanup()


def _submit(env: Environment, answer: str = "") -> str:
    env.submitted = True
    env.answer = answer
    return "Submitted."


SUBMIT_TOOL = Tool(
    name="submit",
    description="Finish the task. Call it once, when the work is done, "
    "with your final answer if the task asks for one.",
    parameters={
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "final answer (optional)"}},
        "required": [],
    },
    fn=_submit,
)


@dataclass
class Task:
    """One task instance.

    `setup(env)` fills a fresh environment; `check(env)` returns named sub-scores in [0, 1]; the
    score is their mean (partial credit) and the task passes when score >= pass_threshold.
    `required_observations` names tools whose output the agent must have seen before a correct
    submission is credible (used by triage to flag insufficient evidence).
    """

    id: str
    suite: str
    family: str
    split: str
    seed: int
    instruction: str
    tools: list[Tool]
    setup: Callable[[Environment], None]
    check: Callable[[Environment], dict[str, float]]
    pass_threshold: float = 1.0
    needs_workspace: bool = True
    required_observations: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # what makes the instance (for fingerprints)
    # A known-good sequence of tool calls [{"name": ..., "arguments": {...}}, ...] ending with
    # submit; scripted policies and tests use it to check the grader gives full credit.
    solution: list[dict[str, Any]] = field(default_factory=list)
    # The environment supports the sandboxed `shell` tool (a harness turns it on with
    # rules.shell); a task knows no harness, so it only says that it can host one.
    offers_shell: bool = False
    # The absolute path at which a sandboxed command (the `shell` tool) sees the workspace and
    # starts, for a task written for a fixed path (an imported task: /app, /root/...); None:
    # the workspace's own temporary path.
    workspace_mount: str | None = None
    # What make_env builds: an imported format whose episodes own more (running services) has
    # its own subclass of Environment.
    environment_class: ClassVar[type[Environment]] = Environment

    def make_env(self) -> Environment:
        env = self.environment_class(
            workspace=Workspace() if self.needs_workspace else None, workspace_mount=self.workspace_mount
        )
        try:
            self.setup(env)
        except BaseException:
            env.close()
            raise
        return env

    def tool(self, name: str) -> Tool | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def grade(self, env: Environment) -> Grade:
        subscores = {k: float(v) for k, v in self.check(env).items()}
        for k, v in subscores.items():
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"task {self.id}: sub-score {k}={v} is outside [0, 1]")
        score = sum(subscores.values()) / len(subscores) if subscores else 0.0
        return Grade(
            score=score,
            subscores=subscores,
            passed=score >= self.pass_threshold - 1e-9,
            threshold=self.pass_threshold,
        )

    @property
    def fingerprint(self) -> str:
        blob = json.dumps(
            {"family": self.family, "instruction": self.instruction, "data": self.data},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class TaskParts(TypedDict):
    """What a family makes of one seed: the parts of a Task (see Task for each field's meaning).
    `data` defaults to the instruction alone, `pass_threshold` to the suite's, `tools` adds to
    the suite's base tools."""

    instruction: str
    setup: Callable[[Environment], None]
    check: Callable[[Environment], dict[str, float]]
    solution: NotRequired[list[dict[str, Any]]]
    data: NotRequired[dict[str, Any]]
    pass_threshold: NotRequired[float]
    required_observations: NotRequired[list[str]]
    tools: NotRequired[list[Tool]]


# A family turns a random generator into one task's parts.
Family = Callable[[random.Random], TaskParts]

SPLITS = ("train", "dev", "test")


class Suite:
    """A deterministic, seeded task generator with disjoint splits.

    Instance i of a split comes from family i % n_families with a seed derived from
    (suite, split, i). Instances whose fingerprint already occurs in an earlier split (order:
    test, dev, train) are regenerated with the next sub-seed, so splits never share an instance.
    """

    name: str = ""
    description: str = ""
    split_sizes: dict[str, int] = {"train": 2000, "dev": 48, "test": 72}
    pass_threshold: float = 1.0
    needs_workspace: bool = True
    offers_shell: bool = False  # its tasks can host the sandboxed shell (see Task.offers_shell)

    def __init__(self) -> None:
        self._cache: dict[str, list[Task]] = {}

    # -- to implement -------------------------------------------------------------------------
    def families(self) -> dict[str, Family]:
        raise NotImplementedError

    def base_tools(self) -> list[Tool]:
        """Tools every task of the suite gets (a family may add more)."""
        raise NotImplementedError

    # -- generic machinery ----------------------------------------------------------------------
    def family_names(self) -> list[str]:
        return list(self.families())

    def _make(self, split: str, index: int, sub: int) -> Task:
        fams = self.families()
        names = sorted(fams)
        fam_name = names[index % len(names)]
        seed_src = f"{self.name}/{split}/{index}/{sub}"
        seed = int(hashlib.sha256(seed_src.encode()).hexdigest()[:12], 16)
        parts = fams[fam_name](random.Random(seed))
        tools = list(self.base_tools()) + list(parts.get("tools", []))
        if not any(t.name == "submit" for t in tools):
            tools.append(SUBMIT_TOOL)
        return Task(
            id=f"{self.name}/{split}/{index:05d}",
            suite=self.name,
            family=fam_name,
            split=split,
            seed=seed,
            instruction=parts["instruction"],
            tools=tools,
            setup=parts["setup"],
            check=parts["check"],
            pass_threshold=parts.get("pass_threshold", self.pass_threshold),
            needs_workspace=self.needs_workspace,
            required_observations=parts.get("required_observations", []),
            data=parts.get("data", {"instruction": parts["instruction"]}),
            solution=parts.get("solution", []),
            offers_shell=self.offers_shell,
        )

    def _generate(self, split: str, n: int, taken: set[str]) -> list[Task]:
        out = []
        for i in range(n):
            for sub in range(1000):
                task = self._make(split, i, sub)
                if task.fingerprint not in taken:
                    break
            else:  # pragma: no cover - only for degenerate families
                raise RuntimeError(f"{self.name}: cannot make a unique instance {split}/{i}")
            taken.add(task.fingerprint)
            out.append(task)
        return out

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        """The first n tasks of a split (all of it by default), in a fixed order."""
        if split not in self.split_sizes:
            raise ValueError(f"unknown split '{split}' for suite '{self.name}' (have: {', '.join(self.split_sizes)})")
        size = self.split_sizes[split]
        if n is None:
            n = size
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"number of tasks must be a non-negative integer, got {n!r}")
        if n > size:
            raise ValueError(f"split '{split}' of suite '{self.name}' has {size} tasks; asked for {n}")
        taken: set[str] = set()
        for earlier in SPLITS:
            if earlier == split:
                break
            if earlier in self.split_sizes:
                taken |= {t.fingerprint for t in self._full(earlier)}
        if split in self._cache and len(self._cache[split]) >= n:
            return self._cache[split][:n]
        tasks = self._generate(split, n, taken)
        if n == size:
            self._cache[split] = tasks
        return tasks

    def _full(self, split: str) -> list[Task]:
        if split not in self._cache:
            self.tasks(split)
        return self._cache[split]

    def task(self, task_id: str) -> Task:
        """Rebuild one task from its id (`suite/split/index`)."""
        try:
            suite, split, idx = task_id.split("/")
            index = int(idx)
        except ValueError:
            raise ValueError(f"malformed task id '{task_id}' (expected suite/split/index)") from None
        if suite != self.name:
            raise ValueError(f"task id '{task_id}' is not from suite '{self.name}'")
        return self.tasks(split, index + 1)[index]


def generate_from_seed(family: Family, seed: Any) -> TaskParts:
    """Run one family generator on an explicit seed; a clear error for an invalid seed."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"task seed must be a non-negative integer, got {seed!r}")
    return family(random.Random(seed))


def solution_call(name: str, **arguments: Any) -> dict[str, Any]:
    """One tool call of a task's known-good solution, as suites write them."""
    return {"name": name, "arguments": arguments}
