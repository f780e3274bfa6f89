"""The replies a server still waits for, grouped by who asked (an episode of the recording
endpoint), so they can be given up when the asker goes away.

A generation is followed through a future of the server's own (`follow`): it resolves as the
policy's future does, or, once its asker is gone (`abandon`: the episode ended, the server
stops), at once with `Abandoned`, whether or not the policy can stop the work: the request
handler waiting on it answers and ends instead of holding the server's shutdown, and the
policy's future is cancelled (HFPolicy then takes the request out of its engine; a policy that
cannot cancel a running request finishes it for nobody). Cancelling the server's future (a
streaming client went away) cancels the policy's too.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, Future

from harnessrl.models.base import PolicyError


class Abandoned(PolicyError):
    """The reply is no longer wanted: whoever asked for it is gone."""


def _settle(ours: Future, source: Future | None = None, exception: BaseException | None = None) -> None:
    """Resolve `ours` as `source` ended (or with `exception`), unless it is resolved or cancelled."""
    if ours.done() or not ours.set_running_or_notify_cancel():
        return
    if exception is None and source is not None:
        if source.cancelled():
            exception = CancelledError()
        else:
            exception = source.exception()
            if exception is None:
                ours.set_result(source.result())
                return
    ours.set_exception(exception if exception is not None else Abandoned("no reply"))


class PendingReplies:
    """Replies in flight by asker (any hashable key, e.g. an episode's token). An asker is
    `open`ed before it asks; what it asks after it was abandoned is abandoned at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # every resolution of one of our futures happens under it
        self._waiting: dict[str, dict[Future, Future]] = {}  # asker -> {our future: the policy's}

    def open(self, asker: str) -> None:
        with self._lock:
            self._waiting.setdefault(asker, {})

    def follow(self, asker: str, inner: Future) -> Future:
        """A future that resolves as `inner` does, or with Abandoned when `asker` goes first."""
        ours: Future = Future()
        with self._lock:
            waiting = self._waiting.get(asker)
            if waiting is not None:
                waiting[ours] = inner
        if waiting is None:  # the asker is gone already
            inner.cancel()
            _settle(ours, exception=Abandoned("its asker is gone"))
            return ours
        ours.add_done_callback(lambda done: inner.cancel() if done.cancelled() else None)
        inner.add_done_callback(lambda done: self._relay(asker, ours, done))
        return ours

    def _relay(self, asker: str, ours: Future, inner: Future) -> None:
        with self._lock:
            waiting = self._waiting.get(asker)
            if waiting is not None:
                waiting.pop(ours, None)
            _settle(ours, inner)

    def abandon(self, asker: str, why: str) -> int:
        """Give up every reply `asker` waits for (and what it asks later); returns how many."""
        with self._lock:
            waiting = self._waiting.pop(asker, {})
            for ours in waiting:
                _settle(ours, exception=Abandoned(why))
        for inner in waiting.values():
            inner.cancel()
        return len(waiting)

    def abandon_all(self, why: str) -> int:
        """Give up every reply in flight (the server stops); returns how many."""
        with self._lock:
            askers = list(self._waiting)
        return sum(self.abandon(asker, why) for asker in askers)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiting.values())
