"""The mock services of a Claw-Eval episode: started in the sandbox on ports of their own, called
by the task's tools, and asked for their audit data when the episode is graded."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.tasks.base import Environment, Tool, ToolOutput
from harnessrl.tasks.importers.claweval.sandbox import (
    grader_python,
    read_only_paths,
)
from harnessrl.tasks.importers.claweval.taskfile import (
    LOCAL_URL,
    TaskFile,
)
from harnessrl.tasks.importers.common import (
    ImportedTask,
    TaskLoadError,
)
from harnessrl.tasks.shell import head_and_tail

SHOWN_CHARS = 8000  # of a service's reply shown to the model; the store keeps it all
HTTP_TIMEOUT_S = 30.0  # Claw-Eval's dispatcher timeout
MIN_READY_S = 20.0  # a service's start on a loaded machine takes longer than the task's 10 s
SERVICE_MEMORY_MB = 4096  # RLIMIT_AS: FastAPI + pydantic map far more than they use


def free_port() -> int:
    """A loopback port nothing listens on now (the service binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shift_url(url: str, ports: dict[int, int]) -> str:
    """`url` with a declared service port replaced by the episode's port for it."""
    return LOCAL_URL.sub(lambda m: f"127.0.0.1:{ports.get(int(m.group(1)), int(m.group(1)))}", url)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # mock traffic stays local


def http_json(
    method: str, url: str, body: Any = None, timeout: float = HTTP_TIMEOUT_S, headers=None
) -> tuple[int, Any]:
    """(status, decoded JSON body or the text when it is not JSON); OSError when unreachable."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={**(headers or {})})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with _NO_PROXY.open(request, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


@dataclass
class RunningService:
    name: str
    port: int
    stop: threading.Event
    thread: threading.Thread
    scratch: Path
    result: list[Any] = field(default_factory=list)  # the ExecResult once it has ended

    def output(self) -> str:
        if not self.result:
            return ""
        r = self.result[0]
        return (r.stderr.strip() or r.stdout.strip() or r.reason)[-600:]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=15)
        shutil.rmtree(self.scratch, ignore_errors=True)


def start_service(svc: dict[str, Any], root: Path, ports: dict[int, int], lifetime_s: float) -> RunningService:
    """Start one mock service in the sandbox (sharing this machine's loopback, which is how the
    tools reach it) and wait until its health check answers; TaskLoadError when it does not."""
    from harnessrl.tasks.sandbox_exec import ExecLimits, run_sandboxed

    port = ports[svc["port"]]
    python, python_env = grader_python()
    argv = shlex.split(svc["command"])
    if argv and argv[0] in ("python", "python3"):  # as Claw-Eval does: the evaluating interpreter
        argv[0] = python
    env = {str(k): shift_url(str(v), ports) for k, v in (svc.get("env") or {}).items()}
    env.update(python_env, PORT=str(port), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    scratch = Path(tempfile.mkdtemp(prefix="harnessrl-claweval-svc-"))
    os.chmod(scratch, 0o755)
    limits = ExecLimits(wall_s=lifetime_s, cpu_s=int(lifetime_s), memory_mb=SERVICE_MEMORY_MB, processes=64)
    stop = threading.Event()
    running = RunningService(svc["name"], port, stop, threading.Thread(), scratch)

    def serve() -> None:
        try:
            running.result.append(
                run_sandboxed(
                    argv,
                    workdir=scratch,
                    env=env,
                    limits=limits,
                    network=True,
                    cwd_in_sandbox=str(root),
                    stop=stop,
                    read_only=read_only_paths(root),
                )
            )
        except Exception as e:  # noqa: BLE001 - reported by the readiness wait below
            running.result.append(type("Failed", (), {"stderr": str(e), "stdout": "", "reason": ""})())

    running.thread = threading.Thread(target=serve, name=f"claweval-{svc['name']}", daemon=True)
    running.thread.start()
    health = shift_url(svc["health_check"], ports)
    method = str(svc.get("health_check_method") or "POST").upper()
    deadline = time.monotonic() + max(float(svc.get("ready_timeout") or 10), MIN_READY_S)
    while time.monotonic() < deadline:
        if not running.thread.is_alive():
            running.close()
            raise TaskLoadError(f"service '{svc['name']}' exited before it was ready: {running.output()}")
        try:
            status, _ = http_json(method, health, timeout=2.0, headers={"X-Health-Check": "1"})
            if status < 500:
                return running
        except OSError:
            pass
        time.sleep(0.2)
    running.close()
    raise TaskLoadError(f"service '{svc['name']}' did not answer {health} within the ready timeout")


@dataclass
class ClawEvalEnvironment(Environment):
    """An episode's environment that also owns its running mock services."""

    ports: dict[int, int] = field(default_factory=dict)  # declared port -> this episode's port
    services: list[RunningService] = field(default_factory=list)
    dispatches: list[dict[str, Any]] = field(default_factory=list)

    def close(self) -> None:
        for svc in reversed(self.services):
            svc.close()
        self.services.clear()
        super().close()


@dataclass
class ClawEvalTask(ImportedTask):
    """An imported task whose environment runs mock services (stopped when it closes)."""

    environment_class = ClawEvalEnvironment


def service_tool(spec: dict[str, Any], endpoint: dict[str, str]) -> Tool:
    """A task tool: its arguments POSTed as JSON to its mock endpoint, the reply shown as JSON."""
    declared = spec.get("input_schema")
    schema: dict[str, Any] = declared if isinstance(declared, dict) else {}
    parameters = {"type": "object", "properties": {}, **schema}

    def call(env: Environment, **arguments: Any) -> ToolOutput:
        if not isinstance(env, ClawEvalEnvironment):
            raise RuntimeError("a Claw-Eval tool needs its task's environment")
        url = shift_url(endpoint["url"], env.ports)
        t0 = time.monotonic()
        try:
            status, body = http_json(endpoint["method"], url, arguments)
            text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
        except OSError as e:  # the dispatcher's answer to an unreachable service
            status, body, text = 500, {"error": str(e)}, f"Error: {e}"
        env.dispatches.append(
            {
                "call_index": len(env.calls),  # the index the runner gives this call next
                "tool_name": spec["name"],
                "endpoint_url": endpoint["url"],
                "request_body": dict(arguments),
                "response_status": status,
                "response_body": body,
                "latency_ms": (time.monotonic() - t0) * 1000,
            }
        )
        return ToolOutput(shown=head_and_tail(text, SHOWN_CHARS), full=text, ok=status < 400)

    return Tool(spec["name"], str(spec.get("description") or spec["name"]), parameters, call)


def audit_data(tf: TaskFile, env: ClawEvalEnvironment) -> tuple[dict[str, Any], dict[str, str]]:
    """Each service's `/audit` data (the URL beside its reset endpoint), best-effort as in
    Claw-Eval; what could not be fetched is noted in the grade's details."""
    audit: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for svc in tf.services:
        reset = svc.get("reset_endpoint")
        if not isinstance(reset, str):
            continue
        url = shift_url(reset, env.ports).rsplit("/reset", 1)[0] + "/audit"
        try:
            status, body = http_json("GET", url, timeout=5.0)
        except OSError as e:
            errors[svc["name"]] = str(e)
            continue
        if isinstance(body, dict):
            audit[svc["name"]] = body
        else:
            errors[svc["name"]] = f"status {status}, not a JSON object"
    return audit, errors
