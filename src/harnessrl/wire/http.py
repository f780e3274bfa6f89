"""HTTP plumbing both servers share: `BackgroundServer` (any ASGI app served by uvicorn from a
daemon thread: `harnessrl serve`'s `serving` and the recording endpoint of external harnesses),
the socket and URL helpers of `run_server`, the cap on a request's body (`limit_body`,
MAX_BODY_BYTES), and the one-line message of a request body that fails validation."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

STARTUP_TIMEOUT_S = 60.0
GRACEFUL_SHUTDOWN_S = 5
# The largest request body either server reads (`limit_body`); a larger one is answered 413. The
# first request of a real agent, its tool definitions included, is 100-200 KB, and a whole
# conversation filling a 200k-token context as JSON about 1-2 MB.
MAX_BODY_BYTES = 8 * 1024 * 1024


def limit_body(app: FastAPI, max_bytes: int = MAX_BODY_BYTES) -> None:
    """Refuse, with HTTP 413, a request whose body is larger than `max_bytes`, before more of it
    is read: one whose Content-Length says so at its first read, and a chunked one as soon as
    what came passes the cap. The refusal is an HTTPException raised where the route reads the
    body, so the app's own exception handler answers it (in the route's error shape; the
    recording endpoint records it as a refused request of the episode)."""
    app.add_middleware(_BodyLimit, max_bytes=max_bytes)


def body_too_large(size: int | None, max_bytes: int) -> str:
    """The message of the 413 (`size`: the Content-Length it declared; None: a chunked body that passed the cap)."""
    what = f"the request body is {size} bytes" if size is not None else f"the request body passed {max_bytes} bytes"
    return (
        f"{what}, more than this server reads ({max_bytes} bytes, wire.http.MAX_BODY_BYTES): "
        "send a shorter conversation (fewer or smaller messages and tool results)"
    )


class _BodyLimit:
    """The ASGI middleware of `limit_body`: the app reads the body through a `receive` that counts."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        seen = 0
        max_bytes = self.max_bytes

        async def counted() -> Message:
            nonlocal seen
            from fastapi import HTTPException

            if declared is not None and declared > max_bytes:
                raise HTTPException(413, body_too_large(declared, max_bytes))  # nothing of it read
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise HTTPException(413, body_too_large(None, max_bytes))
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) (port 0: a free one), inheritable, not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def url_host(host: str) -> str:
    """How a URL names the host a server bound: a wildcard address as the loopback one, IPv6 in brackets."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class BackgroundServer:
    """An ASGI app served by uvicorn from a daemon thread: `start()` binds (port 0: a free one)
    and returns once the server answers; `stop()` stops accepting connections, gives requests in
    flight up to GRACEFUL_SHUTDOWN_S, and joins the thread."""

    def __init__(
        self,
        app,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        name: str = "serve",
        unix_path: Path | None = None,
    ):
        self.app = app
        self.unix_path = unix_path  # also served on this Unix socket (mode 0666), when given
        self.host = host
        self.port = port
        self.log_level = log_level
        self.name = name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._unix: socket.socket | None = None

    def start(self) -> str:
        """Start serving; returns the root URL, e.g. ``http://127.0.0.1:41234``."""
        import uvicorn

        self._sock = bind_socket(self.host, self.port)
        try:
            sockets = [self._sock]
            if self.unix_path is not None:
                self._unix = _bind_unix(self.unix_path)
                sockets.append(self._unix)
            config = uvicorn.Config(
                self.app,
                log_config=None,  # leave the process's logging as it is
                log_level=self.log_level,
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            )
            server = self._server = uvicorn.Server(config)
            thread = self._thread = threading.Thread(
                target=server.run, kwargs={"sockets": sockets}, name=f"harnessrl-{self.name}", daemon=True
            )
            thread.start()
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("the server stopped while starting (see the log above)")
                if time.monotonic() > deadline:
                    server.should_exit = True
                    raise RuntimeError(f"the server did not start within {STARTUP_TIMEOUT_S:g} s")
                time.sleep(0.01)
        except BaseException:
            self.stop()
            raise
        return f"http://{url_host(self.host)}:{self._sock.getsockname()[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(GRACEFUL_SHUTDOWN_S + 10)
        for sock in (self._sock, self._unix):
            if sock is not None:
                sock.close()
        if self._unix is not None and self.unix_path is not None:
            self.unix_path.unlink(missing_ok=True)
        self._server = self._thread = self._sock = self._unix = None


def _bind_unix(path: Path) -> socket.socket:
    """A Unix stream socket bound at `path` (replacing a stale one), connectable by every uid:
    sandboxed commands run as another user and reach it through a namespace of their own."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        path.chmod(0o666)
    except OSError:
        sock.close()
        raise
    return sock


def request_error_message(exc: RequestValidationError) -> str:
    """One line saying what is wrong with a request body that fails validation (invalid JSON, or
    each field and its problem), for the 400 answer."""
    parts = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error", "")
            return f"the body is not valid JSON{f' ({detail})' if detail else ''}"
        loc = [str(x) for x in error.get("loc", ()) if x != "body"]
        where = ".".join(loc)
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return "invalid request body: " + "; ".join(parts) if parts else "invalid request body"
