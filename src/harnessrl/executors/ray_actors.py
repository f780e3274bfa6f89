"""The Ray executor: episodes in Ray actors on a cluster's nodes, the model with the Runner.

Imported only by `make_executor("ray")`, once Ray is known to be installed (`harnessrl[ray]`).

A pool of actors (EpisodeHost), created as episodes need them and spread over the nodes, each
holding one episode at a time: the episode's environment, tools, sandbox and grader run there.
The Runner's thread of an episode drives it remotely, one round trip per turn: the actor returns
a request, the Runner submits it to the policy in the driver, sends the reply back, and the actor
applies it (runs the tools) and returns the next request; at the end the actor grades and returns
the trajectory. Tasks and harness specs travel to the actors pickled (cloudpickle), the same
objects the local executor uses, so an episode computes the same thing wherever it runs.

Failures: a dead actor (its process killed, its node lost) raises EpisodeLost on the episode's
next call: an infrastructure error of that episode, re-run from scratch on another actor by the
Runner's retries, and recorded once (only the driver records). The pool drops the dead actor. A
worker that cannot start an actor at all, or that runs another harnessrl version, is an
ExecutorError: the cluster is set up wrongly and every episode would fail the same way.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import TYPE_CHECKING, Any, Iterable

import ray
from ray import cloudpickle
from ray.exceptions import (
    GetTimeoutError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

from harnessrl import __version__
from harnessrl.executors.base import EpisodeLost, EpisodeRun, Executor, ExecutorError
from harnessrl.harness.loops import InfraError
from harnessrl.models.base import GenerationRequest
from harnessrl.types import ModelCall, Trajectory

if TYPE_CHECKING:
    from harnessrl.harness.spec import AnyHarnessSpec, HarnessSpec
    from harnessrl.tasks.base import Task

# what Ray raises when the process or node that held an actor is gone
_LOST = (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError)
# how long the first actor may take to start (a node's first worker process imports harnessrl)
PROBE_TIMEOUT_S = 180


class EpisodeHost:
    """One episode at a time, inside a Ray actor (`ray.remote` wraps this class at start)."""

    def __init__(self) -> None:
        self._run: EpisodeRun | None = None

    def where(self) -> dict[str, Any]:
        return {"node": ray.util.get_node_ip_address(), "pid": os.getpid(), "version": __version__}

    def open(
        self, task: Task, harness: HarnessSpec, attempt: int, retries: int, seed: int
    ) -> tuple[str | None, GenerationRequest | None]:
        """(None, first request), or (the setup error, None)."""
        self.close()
        try:
            self._run = EpisodeRun(task, harness, attempt, retries, seed)
        except InfraError as e:
            return str(e), None
        return None, self._run.start()

    def reply(self, call: ModelCall, latency: float) -> GenerationRequest | None:
        return self._episode().reply(call, latency)

    def model_failed(self, latency: float, message: str) -> None:
        self._episode().model_failed(latency, message)

    def finish(self) -> Trajectory:
        run, self._run = self._episode(), None
        return run.finish()

    def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.close()

    def _episode(self) -> EpisodeRun:
        if self._run is None:
            raise RuntimeError("no episode is open in this actor")
        return self._run


class _Worker:
    """An actor of the pool and where it runs."""

    def __init__(self, actor: Any, where: dict[str, Any]):
        self.actor = actor
        self.node = where.get("node")
        self.pid = where.get("pid")

    def __str__(self) -> str:
        return f"node {self.node}, pid {self.pid}"


class RayExecutor(Executor):
    kind = "ray"

    def __init__(self, address: str | None = None):
        self.address = address
        self._lock = threading.Lock()  # the pool
        self._start_lock = threading.Lock()
        self._ready = False
        self._host: Any = None  # the actor class, once connected
        self._idle: list[_Worker] = []
        self._workers: list[_Worker] = []  # every live actor of the pool, idle or busy
        self._initialized_ray = False
        self._closed = False

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "address": self.address}

    # -- connecting ---------------------------------------------------------------------------------
    def start(self) -> None:
        with self._start_lock:
            if self._closed:
                raise ExecutorError("the Ray executor is closed")
            if self._ready:
                return
            if not ray.is_initialized():  # a connection made by the caller is used as it is
                where = f" at {self.address}" if self.address else ""
                try:
                    ray.init(address=self.address, include_dashboard=False, logging_level=logging.WARNING)
                except Exception as e:  # noqa: BLE001 - every way of failing to connect reads the same
                    raise ExecutorError(f"cannot start or join a Ray cluster{where}: {type(e).__name__}: {e}") from None
                self._initialized_ray = True
            self._host = ray.remote(max_restarts=0, max_task_retries=0)(EpisodeHost)
            # one actor now: a cluster whose workers cannot host an episode fails here, not per episode
            self._release(self._new_worker(probe=True))
            self._ready = True

    def prepare(self, tasks: Iterable[Task], harnesses: Iterable[AnyHarnessSpec]) -> None:
        self.start()
        seen: set[int] = set()
        named: list[tuple[str, str, object]] = [("task", t.id, t) for t in tasks]
        named += [("harness", h.name, h) for h in harnesses]
        for what, name, item in named:
            if id(item) in seen:
                continue
            seen.add(id(item))
            try:
                cloudpickle.dumps(item)
            except Exception as e:  # noqa: BLE001 - any pickling failure: name the object
                raise ExecutorError(
                    f"{what} '{name}' cannot be sent to the Ray workers (it does not pickle: "
                    f"{type(e).__name__}: {e}); run it with --executor local"
                ) from None

    # -- the pool -----------------------------------------------------------------------------------
    def _new_worker(self, probe: bool = False) -> _Worker:
        actor = self._host.options(scheduling_strategy="SPREAD").remote()
        try:
            where = ray.get(actor.where.remote(), timeout=PROBE_TIMEOUT_S if probe else None)
        except GetTimeoutError:
            _kill(actor)
            raise ExecutorError(
                f"no node of the Ray cluster started an episode actor within {PROBE_TIMEOUT_S} s: an actor needs a "
                "node with at least one CPU (a node started with --num-cpus=0 hosts none)"
            ) from None
        except _LOST as e:
            _kill(actor)
            if probe:
                raise ExecutorError(
                    f"a Ray worker could not start an episode actor (is harnessrl {__version__} installed on "
                    f"every node?): {_first_line(e)}"
                ) from None
            raise EpisodeLost(f"a Ray worker could not start an episode actor: {_first_line(e)}") from None
        worker = _Worker(actor, where)
        if where.get("version") != __version__:
            _kill(actor)
            raise ExecutorError(
                f"the Ray worker on node {worker.node} runs harnessrl {where.get('version')}, this process "
                f"{__version__}: install the same version on every node"
            )
        with self._lock:
            if self._closed:
                _kill(actor)
                raise ExecutorError("the Ray executor is closed")
            self._workers.append(worker)
        return worker

    def _acquire(self) -> tuple[_Worker, bool]:
        """An idle actor, or a new one; and whether it is new."""
        with self._lock:
            if self._closed:
                raise ExecutorError("the Ray executor is closed")
            if self._idle:
                return self._idle.pop(), False
        return self._new_worker(), True

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._workers:
                self._idle.append(worker)

    def _discard(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            if worker in self._idle:
                self._idle.remove(worker)
        _kill(worker.actor)

    # -- episodes -----------------------------------------------------------------------------------
    def open(self, task: Task, harness: HarnessSpec, attempt: int, retries: int, seed: int) -> RayEpisode:
        self.start()
        while True:
            worker, new = self._acquire()
            episode = RayEpisode(self, worker)
            try:
                error, first = episode.call("open", task, harness, attempt, retries, seed)
            except EpisodeLost:
                if new:
                    raise
                continue  # an idle actor died while it waited (its node was lost): the episode had not begun
            except RayTaskError as e:  # the task did not load on the worker (a module it needs is missing there)
                self._release(worker)
                raise ExecutorError(
                    f"task '{task.id}' could not be opened on the Ray worker ({worker}): {_first_line(e)}"
                ) from None
            except BaseException:
                self._release(worker)
                raise
            if error is not None:
                self._release(worker)
                raise InfraError(error)
            episode.first = first
            return episode

    def close(self) -> None:
        """Kill every actor of the pool (episodes still running end as lost); disconnect from Ray
        if this executor connected."""
        with self._lock:
            self._closed = True
            workers, self._workers, self._idle = self._workers, [], []
        for worker in workers:
            _kill(worker.actor)
        if self._initialized_ray and ray.is_initialized():
            ray.shutdown()
        self._initialized_ray = False


class RayEpisode:
    """The handle of one episode held by an actor of the pool."""

    def __init__(self, executor: RayExecutor, worker: _Worker):
        self.executor = executor
        self.worker = worker
        self.first: GenerationRequest | None = None
        self._released = False

    def call(self, method: str, *args: Any) -> Any:
        """One remote call; EpisodeLost (and the actor out of the pool) if the actor is gone."""
        try:
            return ray.get(getattr(self.worker.actor, method).remote(*args))
        except _LOST as e:
            self._released = True
            self.executor._discard(self.worker)
            raise EpisodeLost(
                f"the Ray worker that held the episode was lost ({self.worker}): {_first_line(e)}"
            ) from None

    def start(self) -> GenerationRequest | None:
        return self.first

    def reply(self, call: ModelCall, latency: float) -> GenerationRequest | None:
        return self.call("reply", call, latency)

    def model_failed(self, latency: float, message: str) -> None:
        self.call("model_failed", latency, message)

    def finish(self) -> Trajectory:
        trajectory = self.call("finish")
        self._release()
        return trajectory

    def close(self) -> None:
        if self._released:
            return
        try:
            self.call("close")
        except EpisodeLost:
            return
        except Exception:  # noqa: BLE001 - closing an episode that will not be recorded changes nothing
            pass
        self._release()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self.executor._release(self.worker)


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray shut down
        pass


def _first_line(e: BaseException) -> str:
    """The gist of a Ray error: the remote exception of a task error, else the first line."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # Ray colours the names in its messages
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
