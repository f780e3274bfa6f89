"""The task file of a Claw-Eval task: `task.yaml` checked at load, and whether its grader asks an
LLM judge."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harnessrl.tasks.importers.common import (
    TaskLoadError,
    relative_inside,
)

# Claw-Eval's own sandbox tools, which some tasks list without an endpoint: harnessrl's shell
# and file tools take their place.
SANDBOX_TOOL_NAMES = frozenset({"Bash", "Read", "Write", "Edit", "Glob", "Grep"})
LOCAL_URL = re.compile(r"(?:localhost|127\.0\.0\.1):(\d+)")


@dataclass
class TaskFile:
    """What the importer needs of one task.yaml (checked at load)."""

    task_id: str
    folder: Path
    raw: dict[str, Any]
    tools: list[dict[str, Any]]
    endpoints: dict[str, dict[str, str]]  # tool name -> {url, method}
    services: list[dict[str, Any]]
    sandbox_files: list[str]
    grader_files: list[str]
    snapshot_files: list[str]
    snapshot_commands: list[str]
    local_grader_files: list[str]
    timeout_s: int
    snapshot_timeout_s: int


def _str_list(raw: dict[str, Any], key: str, name: str) -> list[str]:
    value = raw.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskLoadError(f"{name}: '{key}' must be a list of strings")
    return value


def parse_task_file(folder: Path, reserved_tools: set[str]) -> TaskFile:
    """The checked contents of `folder/task.yaml`, or TaskLoadError saying what is wrong."""
    name = f"{folder.name}/task.yaml"
    try:
        raw = yaml.safe_load((folder / "task.yaml").read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise TaskLoadError(f"{name}: malformed YAML: {' '.join(str(e).split())}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskLoadError(f"cannot read {name}: {e}") from None
    if not isinstance(raw, dict):
        raise TaskLoadError(f"{name}: the file must be a mapping")
    task_id = raw.get("task_id")
    if not isinstance(task_id, str) or not re.fullmatch(r"[\w.\-]+", task_id):
        raise TaskLoadError(f"{name}: 'task_id' must be a name of letters, digits, '_', '-' or '.'")
    prompt = raw.get("prompt")
    if not isinstance(prompt, dict) or not isinstance(prompt.get("text"), str) or not prompt["text"].strip():
        raise TaskLoadError(f"{name}: 'prompt.text' is missing")
    if prompt.get("attachments"):
        raise TaskLoadError(f"{name}: prompt attachments (media given with the prompt) are not supported")
    if isinstance(raw.get("user_agent"), dict) and raw["user_agent"].get("enabled"):
        raise TaskLoadError(f"{name}: multi-turn tasks with a simulated user (user_agent) are not supported")
    if not (folder / "grader.py").is_file():
        raise TaskLoadError(f"missing grader: {folder / 'grader.py'}")

    services = raw.get("services") or []
    if not isinstance(services, list):
        raise TaskLoadError(f"{name}: 'services' must be a list")
    ports: set[int] = set()
    for svc in services:
        if not isinstance(svc, dict) or not all(isinstance(svc.get(k), str) for k in ("name", "command")):
            raise TaskLoadError(f"{name}: each service needs a 'name' and a 'command'")
        if not isinstance(svc.get("port"), int) or not isinstance(svc.get("health_check"), str):
            raise TaskLoadError(f"{name}: service '{svc['name']}' needs a 'port' and a 'health_check' URL")
        if not isinstance(svc.get("env") or {}, dict):
            raise TaskLoadError(f"{name}: service '{svc['name']}': 'env' must be a mapping")
        ports.add(svc["port"])

    tools = raw.get("tools") or []
    endpoints_raw = raw.get("tool_endpoints") or []
    if not isinstance(tools, list) or not isinstance(endpoints_raw, list):
        raise TaskLoadError(f"{name}: 'tools' and 'tool_endpoints' must be lists")
    endpoints: dict[str, dict[str, str]] = {}
    for ep in endpoints_raw:
        if not isinstance(ep, dict) or not isinstance(ep.get("tool_name"), str) or not isinstance(ep.get("url"), str):
            raise TaskLoadError(f"{name}: each tool endpoint needs 'tool_name' and 'url'")
        endpoints[ep["tool_name"]] = {"url": ep["url"], "method": str(ep.get("method") or "POST").upper()}
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise TaskLoadError(f"{name}: each tool needs a 'name'")
    tools = [t for t in tools if not (t["name"] in SANDBOX_TOOL_NAMES and t["name"] not in endpoints)]
    for tool in tools:
        tname = tool["name"]
        if tname in reserved_tools:
            raise TaskLoadError(f"{name}: tool '{tname}' has the name of one of harnessrl's own tools")
        if tname not in endpoints:
            raise TaskLoadError(f"{name}: tool '{tname}' has no entry in tool_endpoints")
        match = LOCAL_URL.search(endpoints[tname]["url"])
        if not match or int(match.group(1)) not in ports:
            raise TaskLoadError(
                f"{name}: tool '{tname}' calls {endpoints[tname]['url']}, which is no declared service's port"
            )
    environment = raw.get("environment") or {}
    if not isinstance(environment, dict):
        raise TaskLoadError(f"{name}: 'environment' must be a mapping")
    sandbox_files = _str_list(raw, "sandbox_files", name) or _str_list(environment, "fixtures", name)
    for rel in (
        sandbox_files + _str_list(raw, "sandbox_grader_files", name) + _str_list(raw, "local_grader_files", name)
    ):
        relative_inside(rel, f"{name}: file")
        if not (folder / rel).is_file():
            raise TaskLoadError(f"{name}: file not found: {folder / rel}")
    return TaskFile(
        task_id=task_id,
        folder=folder,
        raw=raw,
        tools=tools,
        endpoints=endpoints,
        services=services,
        sandbox_files=sandbox_files,
        grader_files=_str_list(raw, "sandbox_grader_files", name),
        snapshot_files=_str_list(raw, "env_snapshot_files", name),
        snapshot_commands=_str_list(raw, "env_snapshot_commands", name),
        local_grader_files=_str_list(raw, "local_grader_files", name),
        timeout_s=int(environment.get("timeout_seconds") or 300),
        snapshot_timeout_s=int(environment.get("env_snapshot_timeout") or 10),
    )


def grader_uses_judge(grader: Path, tasks_dir: Path, seen: frozenset[Path] = frozenset()) -> bool:
    """Whether a grader.py may call its LLM judge: the name `judge` read anywhere in it (a call,
    an attribute, passing it on), the same for a peer grader it loads
    (`load_peer_grader("<id>")`), or a grader class that inherits grade() from the framework,
    whose shared graders judge. Erring towards True only leaves a task out without a judge."""
    if grader in seen:
        return False
    try:
        tree = ast.parse(grader.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False  # the load check reports it
    if any(isinstance(n, ast.Name) and n.id == "judge" and isinstance(n.ctx, ast.Load) for n in ast.walk(tree)):
        return True
    peers = [
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", getattr(n.func, "attr", None)) == "load_peer_grader"
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and isinstance(n.args[0].value, str)
    ]
    if any(grader_uses_judge(tasks_dir / p / "grader.py", tasks_dir, seen | {grader}) for p in peers):
        return True
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    defines_grade = any(isinstance(f, ast.FunctionDef) and f.name == "grade" for c in classes for f in c.body)
    return bool(classes) and not defines_grade and not peers
