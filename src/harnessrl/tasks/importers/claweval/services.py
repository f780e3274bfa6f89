"""The mock services of a Claw-Eval episode: started in the sandbox, called by the task's tools,
and asked for their audit data when the episode is graded.

Under bubblewrap each service runs in a network namespace of its own on its declared port, and
this process reaches it through a Unix socket that the namespace's relay listens on (HTTP over
that socket: `UnixHTTPConnection`); its siblings in the episode reach it at its declared port,
relayed to the same socket. Without bubblewrap (or with the suite's `service_network="host"`)
every service shares the host's network on a free port of its own, and URLs naming a declared
port are rewritten to it."""

from __future__ import annotations

import functools
import http.client
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
from datetime import datetime, timezone
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
from harnessrl.tasks.sandbox_net import Forward
from harnessrl.tasks.shell import head_and_tail

SHOWN_CHARS = 8000  # of a service's reply shown to the model; the store keeps it all
HTTP_TIMEOUT_S = 30.0  # Claw-Eval's dispatcher timeout
MIN_READY_S = 20.0  # a service's start on a loaded machine takes longer than the task's 10 s
SERVICE_MEMORY_MB = 4096  # RLIMIT_AS: FastAPI + pydantic map far more than they use
SERVICE_NETWORKS = ("sandbox", "host")
_SOCKET_PATH_BYTES = 100  # the kernel's limit on a Unix socket's path is 107 bytes


def free_port() -> int:
    """A loopback port nothing listens on now (the service binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shift_url(url: str, ports: dict[int, int]) -> str:
    """`url` with a declared service port replaced by the episode's port for it."""
    return LOCAL_URL.sub(lambda m: f"127.0.0.1:{ports.get(int(m.group(1)), int(m.group(1)))}", url)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # mock traffic stays local


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix stream socket: the URL's host and port only name the Host header."""

    def __init__(self, unix_path: Path, host: str, **kwargs: Any):
        super().__init__(host, **kwargs)
        self.unix_path = unix_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if isinstance(self.timeout, (int, float)):
                sock.settimeout(self.timeout)
            sock.connect(str(self.unix_path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixHandler(urllib.request.HTTPHandler):
    """urllib's http:// handler, connecting to one Unix socket whatever the URL's port."""

    def __init__(self, unix_path: Path):
        super().__init__()
        self.unix_path = unix_path

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(UnixHTTPConnection, self.unix_path), req)


def http_json(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = HTTP_TIMEOUT_S,
    headers=None,
    unix_socket: Path | None = None,
) -> tuple[int, Any]:
    """(status, decoded JSON body or the text when it is not JSON); OSError when unreachable.
    With `unix_socket` the request goes over that socket (the URL's path and Host stay)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={**(headers or {})})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    opener = _NO_PROXY
    if unix_socket is not None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _UnixHandler(unix_socket))
    try:
        with opener.open(request, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


@dataclass
class ServiceRoutes:
    """How this process reaches an episode's services, by the URLs the task declares: on the
    host's network at the episode's own port for each declared one (`ports`), or, when each
    service runs in a network namespace of its own, over the Unix socket its relay listens on
    (`sockets`, in `folder`, which the services' sandboxes show read-write)."""

    ports: dict[int, int] = field(default_factory=dict)  # declared port -> this episode's port
    sockets: dict[int, Path] = field(default_factory=dict)  # declared port -> Unix socket
    folder: Path | None = None  # holds the sockets; removed with the episode

    @classmethod
    def on_host(cls, services: list[dict[str, Any]]) -> ServiceRoutes:
        return cls(ports={svc["port"]: free_port() for svc in services})

    @classmethod
    def in_namespaces(cls, services: list[dict[str, Any]]) -> ServiceRoutes:
        folder = Path(tempfile.mkdtemp(prefix="harnessrl-claweval-net-"))
        os.chmod(folder, 0o755)
        routes = cls(sockets={svc["port"]: folder / f"{svc['port']}.sock" for svc in services}, folder=folder)
        if any(len(str(p).encode()) > _SOCKET_PATH_BYTES for p in routes.sockets.values()):
            routes.close()
            raise TaskLoadError(f"the Unix socket paths under {folder} are too long (TMPDIR is a long path)")
        return routes

    def port(self, declared: int) -> int:
        return self.ports.get(declared, declared)

    def url(self, url: str) -> str:
        """`url` as this process and the services call it (in namespaces: as declared)."""
        return shift_url(url, self.ports) if self.ports else url

    def forwards(self, declared: int) -> list[Forward]:
        """The relay of the service on `declared`: its socket to its port, and every sibling's
        declared port (inside its namespace) to that sibling's socket."""
        if not self.sockets:
            return []
        own = [Forward(listen=self.sockets[declared], connect=declared)]
        return own + [Forward(listen=p, connect=s) for p, s in self.sockets.items() if p != declared]

    def request(
        self, method: str, url: str, body: Any = None, timeout: float = HTTP_TIMEOUT_S, headers=None
    ) -> tuple[int, Any]:
        """http_json to a URL the task declares, wherever this episode's service for it is."""
        match = LOCAL_URL.search(url)
        unix_socket = self.sockets.get(int(match.group(1))) if match else None
        return http_json(method, self.url(url), body, timeout, headers, unix_socket=unix_socket)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


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


def start_service(svc: dict[str, Any], root: Path, routes: ServiceRoutes, lifetime_s: float) -> RunningService:
    """Start one mock service in the sandbox, where `routes` says (a network namespace of its own,
    or the host's network on the episode's port for it), and wait until its health check
    answers; TaskLoadError when it does not."""
    from harnessrl.tasks.sandbox_exec import ExecLimits, run_sandboxed

    port = routes.port(svc["port"])
    python, python_env = grader_python()
    argv = shlex.split(svc["command"])
    if argv and argv[0] in ("python", "python3"):  # as Claw-Eval does: the evaluating interpreter
        argv[0] = python
    env = {str(k): routes.url(str(v)) for k, v in (svc.get("env") or {}).items()}
    env.update(python_env, PORT=str(port), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    scratch = Path(tempfile.mkdtemp(prefix="harnessrl-claweval-svc-"))
    os.chmod(scratch, 0o755)
    mounts = {str(scratch): scratch}
    if routes.folder is not None:  # where its relay makes its socket
        mounts[str(routes.folder)] = routes.folder
    limits = ExecLimits(wall_s=lifetime_s, cpu_s=int(lifetime_s), memory_mb=SERVICE_MEMORY_MB, processes=64)
    stop = threading.Event()
    running = RunningService(svc["name"], port, stop, threading.Thread(), scratch)

    def serve() -> None:
        try:
            running.result.append(
                run_sandboxed(
                    argv,
                    workdir=scratch,
                    mounts=mounts,
                    env=env,
                    limits=limits,
                    network=not routes.sockets,
                    forward=routes.forwards(svc["port"]),
                    cwd_in_sandbox=str(root),
                    stop=stop,
                    read_only=read_only_paths(root),
                )
            )
        except Exception as e:  # noqa: BLE001 - reported by the readiness wait below
            running.result.append(type("Failed", (), {"stderr": str(e), "stdout": "", "reason": ""})())

    running.thread = threading.Thread(target=serve, name=f"claweval-{svc['name']}", daemon=True)
    running.thread.start()
    health = svc["health_check"]
    method = str(svc.get("health_check_method") or "POST").upper()
    deadline = time.monotonic() + max(float(svc.get("ready_timeout") or 10), MIN_READY_S)
    while time.monotonic() < deadline:
        if not running.thread.is_alive():
            running.close()
            raise TaskLoadError(f"service '{svc['name']}' exited before it was ready: {running.output()}")
        try:
            status, _ = routes.request(method, health, timeout=2.0, headers={"X-Health-Check": "1"})
            if status < 500:
                return running
        except OSError:
            pass
        time.sleep(0.2)
    running.close()
    raise TaskLoadError(f"service '{svc['name']}' did not answer {routes.url(health)} within the ready timeout")


@dataclass
class ClawEvalEnvironment(Environment):
    """An episode's environment that also owns its running mock services."""

    routes: ServiceRoutes = field(default_factory=ServiceRoutes)
    services: list[RunningService] = field(default_factory=list)
    dispatches: list[dict[str, Any]] = field(default_factory=list)

    def close(self) -> None:
        for svc in reversed(self.services):
            svc.close()
        self.services.clear()
        self.routes.close()
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
        t0 = time.monotonic()
        try:
            status, body = env.routes.request(endpoint["method"], endpoint["url"], arguments)
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
                "timestamp": datetime.now(timezone.utc).isoformat(),  # when it was answered
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
        url = reset.rsplit("/reset", 1)[0] + "/audit"
        try:
            status, body = env.routes.request("GET", url, timeout=5.0)
        except OSError as e:
            errors[svc["name"]] = str(e)
            continue
        if isinstance(body, dict):
            audit[svc["name"]] = body
        else:
            errors[svc["name"]] = f"status {status}, not a JSON object"
    return audit, errors
