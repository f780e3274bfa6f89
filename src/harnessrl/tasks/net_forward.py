"""The port forwarder a sandboxed command's own network namespace gets (tasks/sandbox_net.py).

Run inside the sandbox by the Python found there, with the standard library only (harnessrl's
own source is hidden from sandboxed commands, so this file is copied beside the sockets):

    python -I -S net_forward.py LISTEN=CONNECT [LISTEN=CONNECT ...] -- COMMAND [ARG ...]

Each LISTEN and CONNECT is `tcp:PORT` (127.0.0.1 of the namespace) or `unix:PATH` (a Unix
socket, which crosses network namespaces through the file system). It binds every LISTEN
address first, then forks: the child relays each accepted connection to its CONNECT address,
one thread-free event loop for all of them, and the parent becomes COMMAND (exec), so the
command starts only once every address answers. The relay dies with the sandbox's pid
namespace. Exit status 125 (before the command runs): an address could not be bound, with the
reason on stderr.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

_CHUNK = 65536
_BACKLOG = 128
BIND_FAILED = 125  # the exit status when a LISTEN address cannot be bound


def _address(spec: str) -> tuple[int, tuple[str, int] | str]:
    kind, _, where = spec.partition(":")
    if kind == "tcp" and where.isdigit():
        return socket.AF_INET, ("127.0.0.1", int(where))
    if kind == "unix" and where.startswith("/"):
        return socket.AF_UNIX, where
    raise ValueError(f"not an address (tcp:PORT or unix:/PATH): {spec!r}")


def _listen(spec: str) -> socket.socket:
    family, where = _address(spec)
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_INET:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(where)
    if family == socket.AF_UNIX:
        os.chmod(str(where), 0o666)  # the host side may be another uid
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


class _Pipe:
    """One direction of a relayed connection: bytes read from `src` wait in `buffer` for `dst`."""

    def __init__(self, src: socket.socket, dst: socket.socket):
        self.src, self.dst = src, dst
        self.buffer = b""
        self.eof = False  # src has no more to send
        self.shut = False  # dst was told so

    @property
    def done(self) -> bool:
        return self.shut


class Relay:
    """Relays every connection accepted on the listeners to its target, in one event loop."""

    def __init__(self, routes: list[tuple[socket.socket, str]]):
        self.selector = selectors.DefaultSelector()
        self.pipes: dict[socket.socket, tuple[_Pipe, _Pipe]] = {}  # sock -> (from it, to it)
        for listener, target in routes:
            self.selector.register(listener, selectors.EVENT_READ, target)

    def run(self) -> None:
        while True:
            for key, events in self.selector.select():
                if key.fileobj in self.pipes:
                    self._pump(key.fileobj, events)
                else:
                    self._accept(key.fileobj, key.data)

    def _accept(self, listener, target: str) -> None:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        family, where = _address(target)
        upstream = socket.socket(family, socket.SOCK_STREAM)
        try:
            upstream.connect(where)
        except OSError:  # nothing there: the client sees its connection closed
            client.close()
            upstream.close()
            return
        up, down = _Pipe(client, upstream), _Pipe(upstream, client)
        self.pipes[client], self.pipes[upstream] = (up, down), (down, up)
        for sock in (client, upstream):
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)

    def _pump(self, sock, events: int) -> None:
        incoming, outgoing = self.pipes[sock]
        try:
            if events & selectors.EVENT_READ:
                chunk = sock.recv(_CHUNK)
                if chunk:
                    incoming.buffer += chunk
                else:
                    incoming.eof = True
            for pipe in (incoming, outgoing):
                self._flush(pipe)
        except BlockingIOError:
            pass
        except OSError:  # reset by either side: drop the connection
            self._close(sock)
            return
        if incoming.done and outgoing.done:
            self._close(sock)
            return
        for s in (sock, incoming.dst):
            self._arm(s)

    @staticmethod
    def _flush(pipe: _Pipe) -> None:
        if pipe.buffer:
            sent = pipe.dst.send(pipe.buffer)
            pipe.buffer = pipe.buffer[sent:]
        if pipe.eof and not pipe.buffer and not pipe.shut:
            pipe.shut = True
            pipe.dst.shutdown(socket.SHUT_WR)

    def _arm(self, sock) -> None:
        """Wait on `sock` for reading while what it sent is passed on, for writing while bytes wait for it."""
        incoming, outgoing = self.pipes[sock]
        events = (0 if incoming.eof or incoming.buffer else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if outgoing.buffer else 0
        )
        registered = self.selector.get_map().get(sock)
        if registered is None and events:
            self.selector.register(sock, events)
        elif registered is not None and not events:
            self.selector.unregister(sock)
        elif registered is not None and registered.events != events:
            self.selector.modify(sock, events)

    def _close(self, sock) -> None:
        incoming, _ = self.pipes.pop(sock)
        other = incoming.dst
        self.pipes.pop(other, None)
        for s in (sock, other):
            if self.selector.get_map().get(s) is not None:
                self.selector.unregister(s)
            s.close()


def main(args: list[str]) -> int:
    if "--" not in args:
        print("usage: net_forward.py LISTEN=CONNECT ... -- COMMAND [ARG ...]", file=sys.stderr)
        return 2
    cut = args.index("--")
    pairs, command = args[:cut], args[cut + 1 :]
    routes = []
    try:
        for pair in pairs:
            listen, sep, connect = pair.partition("=")
            if not sep:
                raise ValueError(f"not LISTEN=CONNECT: {pair!r}")
            _address(connect)
            routes.append((_listen(listen), connect))
    except (OSError, ValueError) as e:
        print(f"sandbox network: cannot listen on {pair}: {e}", file=sys.stderr)
        return BIND_FAILED
    if os.fork() == 0:
        os.setsid()
        try:
            Relay(routes).run()
        finally:
            os._exit(0)
    for listener, _ in routes:
        listener.close()
    if not command:
        return 0
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
