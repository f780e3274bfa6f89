"""The `claweval:PATH` suite: Claw-Eval task folders loaded as harnessrl tasks."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment
from harnessrl.tasks.importers.claweval.grading import (
    PASS_THRESHOLD,
    JudgeBridge,
    claw_dispatches,
    claw_messages,
    env_snapshot,
    grade_from_scores,
)
from harnessrl.tasks.importers.claweval.sandbox import (
    CHECK_SCRIPT,
    DRIVER_SCRIPT,
    GRADER_DIR,
    GRADER_MEMORY_MB,
    WORKSPACE,
    grader_python,
    read_only_paths,
)
from harnessrl.tasks.importers.claweval.services import (
    SERVICE_NETWORKS,
    ClawEvalEnvironment,
    ClawEvalTask,
    ServiceRoutes,
    audit_data,
    service_tool,
    start_service,
)
from harnessrl.tasks.importers.claweval.taskfile import (
    TaskFile,
    grader_uses_judge,
    parse_task_file,
)
from harnessrl.tasks.importers.common import (
    GraderError,
    GraderUnavailable,
    ImportedSuite,
    TaskEntry,
    TaskLoadError,
    agent_tools,
    broken,
    copy_file_into,
    grader_failed,
    isolated_python,
    read_grader_output,
    run_grader,
    scratch_folder,
    working_directory_note,
)
from harnessrl.tasks.importers.pinchbench import Judge
from harnessrl.types import Grade


class ClawEvalSuite(ImportedSuite):
    kind = "claweval"
    layout = "PATH/tasks/<id>/task.yaml + grader.py, with the framework in PATH/src/claw_eval"
    pass_threshold = PASS_THRESHOLD

    def __init__(
        self, path: str | Path, grader_limits=None, judge: Judge | None = None, service_network: str = "sandbox"
    ):
        """`service_network`: "sandbox" runs each mock service in a network namespace of its own
        under bubblewrap (on its declared port; nothing beyond the episode's services reachable),
        "host" on the host's network at a free port (what happens without bubblewrap anyway)."""
        if service_network not in SERVICE_NETWORKS:
            raise ValueError(f"service_network must be one of {SERVICE_NETWORKS}, got {service_network!r}")
        self.judge = judge
        self.service_network = service_network
        super().__init__(path, grader_limits)

    def _task(self, entry: TaskEntry, split: str) -> ClawEvalTask:
        task = super()._task(entry, split)
        made = ClawEvalTask(**{f.name: getattr(task, f.name) for f in fields(task) if f.init})
        made.offers_shell, made.workspace_mount = task.offers_shell, task.workspace_mount
        made.tools = task.tools + list(entry.data.get("_tools", ()))
        made.data = {k: v for k, v in task.data.items() if k != "_tools"}
        made.pass_threshold = self.pass_threshold
        return made

    def load_entries(self) -> list[TaskEntry]:
        tasks_dir = self.path / "tasks" if (self.path / "tasks").is_dir() else self.path
        self.root = tasks_dir.parent
        self.tasks_dir = tasks_dir
        framework = self.root / "src" / "claw_eval"
        reserved = {t.name for t in agent_tools()} | {"shell"}
        parsed: list[TaskFile | TaskEntry] = []
        for folder in sorted(p for p in tasks_dir.iterdir() if (p / "task.yaml").is_file()):
            try:
                parsed.append(parse_task_file(folder, reserved))
            except TaskLoadError as e:
                parsed.append(broken(folder.name, "claweval", str(e)))
        files = [p for p in parsed if isinstance(p, TaskFile)]
        problems: dict[str, str | None]
        if not framework.is_dir():
            problems = {f.task_id: f"the Claw-Eval framework that graders import is not at {framework}" for f in files}
        else:
            problems = self._check_graders(files)
        entries = []
        for item in parsed:
            if isinstance(item, TaskEntry):
                entries.append(item)
                continue
            family = str(item.raw.get("category") or "claweval")
            if problems.get(item.task_id):
                entries.append(broken(item.task_id, family, f"{item.task_id}: grader.py: {problems[item.task_id]}"))
                continue
            judged = grader_uses_judge(item.folder / "grader.py", tasks_dir)
            if judged and self.judge is None:
                self.skipped[item.task_id] = f"{item.task_id}: its grader asks an LLM judge, and no judge is configured"
                continue
            entries.append(self._entry(item, family, judged))
        return entries

    def _check_graders(self, files: list[TaskFile]) -> dict[str, str | None]:
        """{task id: why its grader cannot be loaded, or None}, from one sandboxed process."""
        if not files:
            return {}
        with scratch_folder("harnessrl-claweval-check-") as scratch:
            (scratch / "check.py").write_text(CHECK_SCRIPT, encoding="utf-8")
            tasks = [[f.task_id, str(f.folder)] for f in files]
            (scratch / "tasks.json").write_text(json.dumps(tasks), encoding="utf-8")
            try:
                result = run_grader(
                    [
                        grader_python()[0],
                        f"{GRADER_DIR}/check.py",
                        f"{GRADER_DIR}/tasks.json",
                        f"{GRADER_DIR}/out.json",
                    ],
                    workdir=scratch,
                    mounts={GRADER_DIR: scratch},
                    cwd=GRADER_DIR,
                    env=self._python_env(),
                    limits=self.limits_for(120, GRADER_MEMORY_MB),
                    read_only=self._read_only(),
                )
            except GraderError as e:
                return {f.task_id: f"the load check of the graders failed: {e}" for f in files}
            if result.returncode != 0:
                reason = str(grader_failed("the load check of the graders failed", result))
                return {f.task_id: reason for f in files}
            return json.loads(read_grader_output(scratch, "out.json", "the load check's result") or "{}")

    def _python_env(self) -> dict[str, str]:
        extra = grader_python()[1].get("PYTHONPATH")
        return {
            # the grader's Python reads the workspace as data: its working folder (not the
            # workspace either) and script folder are kept off its path, the framework is on it
            **isolated_python(),
            "PYTHONPATH": os.pathsep.join([str(self.root / "src"), str(self.root)] + ([extra] if extra else [])),
            "HOME": "/tmp",
            "LC_ALL": "C.UTF-8",
        }

    def _read_only(self) -> list[Path]:
        return read_only_paths(self.root)

    def _entry(self, tf: TaskFile, family: str, judged: bool) -> TaskEntry:
        tools = [service_tool(spec, tf.endpoints[spec["name"]]) for spec in tf.tools]
        lifetime = max(3600.0, 3.0 * tf.timeout_s)

        def setup(env: Environment) -> None:
            from harnessrl.tasks.sandbox_exec import isolation_available

            if not isinstance(env, ClawEvalEnvironment) or env.workspace is None:
                raise RuntimeError("a Claw-Eval task needs its own environment (ClawEvalTask.make_env)")
            for rel in tf.sandbox_files:
                copy_file_into(tf.folder / rel, env.workspace.root, rel)
            if self.service_network == "sandbox" and tf.services and isolation_available() == "bwrap":
                env.routes = ServiceRoutes.in_namespaces(tf.services)
            else:
                env.routes = ServiceRoutes.on_host(tf.services)
            for svc in tf.services:
                env.services.append(start_service(svc, self.root, env.routes, lifetime))

        def grader(env: Environment) -> Grade:
            return self._grade(tf, judged, env)

        return TaskEntry(
            native_id=tf.task_id,
            family=family,
            instruction=tf.raw["prompt"]["text"].strip() + working_directory_note(WORKSPACE),
            setup=setup,
            grader=grader,
            data={
                "judged": judged,
                "category": family,
                "difficulty": str(tf.raw.get("difficulty") or ""),
                "services": [s["name"] for s in tf.services],
                "timeout_seconds": tf.timeout_s,
                "_tools": tools,  # moved onto the task by _task (not part of its data)
            },
            workspace_mount=WORKSPACE,
        )

    # -- grading --------------------------------------------------------------------------------
    def _grade(self, tf: TaskFile, judged: bool, env: Environment) -> Grade:
        if not isinstance(env, ClawEvalEnvironment) or env.workspace is None:
            raise GraderError("a Claw-Eval task is graded on its own environment")
        details: dict[str, Any] = {}
        audit, audit_errors = audit_data(tf, env)
        if audit_errors:
            details["audit_errors"] = audit_errors
        for rel in tf.grader_files:  # after the episode, as Claw-Eval injects them: never through a link
            try:
                untrusted.remove(env.workspace.root, rel, tree=True)
                copy_file_into(tf.folder / rel, env.workspace.root, rel)
            except (untrusted.Refused, TaskLoadError) as e:
                raise GraderError(f"cannot put the grader's file {rel} into the workspace: {e}") from None
        snapshot = env_snapshot(tf, env.workspace)
        trace = {
            "messages": claw_messages(env, tf.raw["prompt"]["text"]),
            "dispatches": claw_dispatches(env),
            "audit_data": audit,
            "env_snapshot": snapshot,
            "judge": self.judge is not None,
        }
        with scratch_folder("harnessrl-claweval-") as scratch:
            (scratch / "driver.py").write_text(DRIVER_SCRIPT, encoding="utf-8")
            (scratch / "trace.json").write_text(json.dumps(trace), encoding="utf-8")
            bridge = JudgeBridge(scratch / "judge.sock", self.judge) if self.judge is not None else None
            try:
                result = run_grader(
                    [grader_python()[0], f"{GRADER_DIR}/driver.py", GRADER_DIR, str(tf.folder), tf.task_id],
                    workdir=scratch,
                    mounts={GRADER_DIR: scratch, WORKSPACE: env.workspace.root},
                    cwd=GRADER_DIR,
                    env=self._python_env(),
                    limits=self.limits_for(600 if judged else 120, GRADER_MEMORY_MB),
                    read_only=self._read_only(),
                )
            finally:
                if bridge is not None:
                    bridge.close()
            if result.returncode != 0:
                raise grader_failed("the task's grader failed", result)
            try:
                out = json.loads(read_grader_output(scratch, "result.json", "the grader's result") or "")
            except json.JSONDecodeError as e:
                raise GraderError(f"the grader left no readable result: {e}") from None
        if out.get("problem") == "judge_needed":
            raise GraderUnavailable("the grader asked for an LLM judge, and none is configured (use --judge-model)")
        if out.get("problem") == "judge_failed":
            raise GraderUnavailable(f"the judge failed: {out.get('message')}")
        if bridge is not None and bridge.error:
            raise GraderUnavailable(f"the judge failed: {bridge.error}")
        return grade_from_scores(out.get("scores"), details, judge_calls=bridge.calls if bridge else 0)
