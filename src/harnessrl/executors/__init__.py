"""Executors: where a run's episodes live.

The Runner drives every episode from a thread of its own: it asks the episode for its next
model request, submits that to the policy, and hands the reply back, until the episode ends.
The executor decides where the episode itself lives (its environment, tools, sandbox and grader):

- `local` (LocalExecutor, the default): in this process, in the episode's own thread;
- `ray` (ray_actors.py, RayExecutor): in a Ray actor on a node of a Ray cluster, one
  episode at a time per actor. Ray is an optional extra, imported only when asked for.

The model calls stay with the policy, in the process that runs the Runner, whatever the executor,
and a turn runs the same code (EpisodeRun) in both places: the executor never changes what an
episode computes. Every trajectory comes back to the Runner's thread, which alone records it.

An episode is driven through an EpisodeHandle:
    start() -> first request | None;  reply(call, latency) -> next request | None;
    model_failed(latency, message);  finish() -> Trajectory;  close() (not to be graded).
A request of None means the episode has ended (submitted, a limit, a crash of a hook or a tool).
`executor.open(...)` raises InfraError when the environment cannot be set up, and a handle's
methods raise EpisodeLost (an InfraError) when the worker that held the episode is gone: both are
infrastructure errors of that episode alone, which the Runner re-runs from scratch.
"""

from __future__ import annotations

from harnessrl.config import EXECUTORS
from harnessrl.executors.base import (
    EpisodeHandle,
    EpisodeLost,
    EpisodeRun,
    Executor,
    ExecutorError,
    LocalExecutor,
)

RAY_EXTRA = "pip install 'harnessrl[ray]'"

__all__ = [
    "EXECUTORS",
    "EpisodeHandle",
    "EpisodeLost",
    "EpisodeRun",
    "Executor",
    "ExecutorError",
    "LocalExecutor",
    "make_executor",
]


def make_executor(kind: str = "local", address: str | None = None) -> Executor:
    """An executor by name: `local`, or `ray` (`address`: the cluster, as `ray.init` takes it;
    None: RAY_ADDRESS, else a cluster started on this machine, else a new local one). Cheap: a
    Ray executor connects at `start()`. Raises ExecutorError (unknown name, Ray not installed)."""
    if kind not in EXECUTORS:
        raise ExecutorError(f"unknown executor '{kind}' (known: {', '.join(EXECUTORS)})")
    if address is not None and kind != "ray":
        raise ExecutorError("--ray-address needs --executor ray")
    if kind == "local":
        return LocalExecutor()
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise ExecutorError(f"--executor ray needs Ray, an optional extra: {RAY_EXTRA} ({e})") from None
    from harnessrl.executors.ray_actors import RayExecutor

    return RayExecutor(address)
