"""Serve a report folder over http (stdlib only), in a background thread.

A report also works opened straight from disk (its data files load through <script> tags, see
episodes.py); serving it gives a clean http:// URL to share on a remote machine via a tunnel.
"""

from __future__ import annotations

import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from harnessrl.report.build import ReportError


class _Handler(SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")  # a rebuilt report must not show stale pages
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        pass  # one line per file would drown the terminal: the viewer loads many small files


def serve(folder: Path, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start serving `folder` (a report folder, or a run folder holding report/) and return
    (server, url). Port 0 picks a free port. Stop it with server.shutdown(); server.server_close()."""
    folder = Path(folder)
    if not (folder / "index.html").is_file() and (folder / "report" / "index.html").is_file():
        folder = folder / "report"
    if not (folder / "index.html").is_file():
        raise ReportError(f"{folder} holds no report (no index.html); build one first")
    try:
        server = ThreadingHTTPServer((host, port), partial(_Handler, directory=str(folder)))
    except OSError as e:
        raise ReportError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="harnessrl-report-server", daemon=True)
    thread.start()
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else f"[{host}]" if ":" in host else host
    return server, f"http://{shown}:{server.server_address[1]}/index.html"
