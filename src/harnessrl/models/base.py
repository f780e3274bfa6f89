"""The Policy interface: a model behind one door.

The runner hands a policy one GenerationRequest at a time (`submit`, from the thread of the
episode that asks) and gets a future of its ModelCall: prompt token ids, completion token ids
and the log-probability of every sampled token. Token in, token out: nothing downstream
re-tokenizes text the model produced. How concurrent requests are batched is the backend's
business.

Random streams are per request: the runner gives every request its own sampling seed
(`request_seed`), so what an episode samples depends on the episode alone, not on what else
was in flight or on how many calls the process made before (a resumed run replays it).
Failures are per request too: a request the backend cannot serve gets a PolicyError in its own
future, which fails only its own episode.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.types import Message, ModelCall, ToolSchema


class SamplingParams(BaseModel):
    """Sampling settings of a run; recorded in the run config."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.7, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0
    # vLLM's sampling fields, with vLLM's meaning (docs/engine.md, "Sampling fields"); each default
    # is the field's neutral value, so a run that sets none samples exactly as before.
    top_k: int = Field(0, ge=-1)  # keep the k most probable tokens; 0 or -1: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)  # drop tokens below min_p x the most probable's probability
    repetition_penalty: float = Field(1.0, gt=0.0)  # on prompt and completion tokens (> 1 discourages)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # x the count of each completion token
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)  # once for each token in the completion

    def shapes(self) -> bool:
        """Whether anything but the temperature shapes the distribution sampled from."""
        return (
            self.top_p < 1.0
            or self.top_k not in (0, -1)
            or self.min_p > 0.0
            or self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


class SampledPrefix(BaseModel):
    """The conversation so far as the model sampled it: the previous call's prompt ids and
    completion ids, and how many of the request's messages they stand for (the previous request's
    messages and the assistant reply to them). A policy that renders prompts itself may continue
    from these ids instead of re-rendering that history from its text (`HFPolicy.sampled_history`),
    so every call's prompt extends the previous call's tokens; any other policy ignores it."""

    model_config = ConfigDict(extra="forbid")

    ids: list[int]
    messages: int = Field(ge=1)


class GenerationRequest(BaseModel):
    """One pending model call of one episode."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    max_new_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list)  # cut the completion after the first of these
    # end the completion at the first of these token ids too (vLLM's stop_token_ids; kept in it)
    stop_token_ids: list[int] = Field(default_factory=list)
    tools: list[ToolSchema] | None = None  # for backends with native function calling
    # send `tools` as the backend's native function calling (where it has it: Policy.native_tool_calls)
    native_tools: bool = False
    # this request's own sampling seed (the runner sets it with `request_seed`); None: the
    # backend derives one from SamplingParams.seed and its own call counter
    seed: int | None = Field(None, ge=0, lt=2**64)
    # the history as sampled, where the harness's messages extend the previous request's by its reply
    sampled_prefix: SampledPrefix | None = None


def request_seed(run_seed: int, task_id: str, attempt: int, turn: int) -> int:
    """The sampling seed of one model call of one episode: a 63-bit hash of (run seed, task id,
    attempt, turn index within the episode).

    The harness is deliberately not an input: the same task, attempt and turn under two harnesses
    draws the same random numbers (common random numbers), so a paired comparison of harnesses
    is not blurred by sampling noise the harnesses do not cause. Different attempts, turns, tasks
    or run seeds get independent streams. An infrastructure retry of an episode replays its seeds.
    """
    digest = hashlib.sha256(f"harnessrl-request:{run_seed}:{task_id}:{attempt}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class PolicyError(RuntimeError):
    """The backend failed to produce a completion (infrastructure, not a model failure)."""


class Policy(ABC):
    """A model that completes chat prompts.

    The runner sends single requests with `submit` (each episode advances on its own); a backend
    decides how to batch them: the local engine joins them into its running batch, an HTTP backend
    sends them concurrently and lets the server batch. `complete` takes a list and waits for all.
    """

    name: str = "policy"
    # how many `submit`ted requests a concurrent backend serves at once (the rest wait in its
    # queue); the default `submit` serves one at a time
    max_concurrency: int = 16
    # the backend has native function calling: a request's tools go to it as data
    # (`GenerationRequest.native_tools`) and its tool calls come back as data (`ModelCall.tool_calls`);
    # False: it reads and writes text only, and the harness renders and parses calls in its protocol
    native_tool_calls: bool = False

    def submit(self, request: GenerationRequest, sampling: SamplingParams) -> Future[ModelCall]:
        """Start one request; the future holds its ModelCall, or the PolicyError it got (a failure
        belongs to this request only).

        Called from many threads at once (the runner calls it from every episode's own thread):
        it must be thread-safe and return without waiting for the completion. Cancelling the
        future (`Future.cancel`) withdraws a request that has not started.

        This default needs nothing of `complete` but that it works when called from one thread
        at a time: one background thread per policy serves the requests in the order they came,
        each alone (`complete([request])`). So a request's outcome never depends on which others
        were in flight (no batch padding, no batch-wide failure), at the price of no batching:
        backends that can do better (join a running batch, send requests concurrently) override it.
        """
        future: Future[ModelCall] = Future()
        with _POOL_LOCK:
            server = self.__dict__.get("_serial_server")
            if server is None:
                server = self.__dict__["_serial_server"] = _SerialServer(self)
        server.put(request, sampling, future)
        return future

    @abstractmethod
    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[ModelCall]:
        """One ModelCall per request, same order. Raises PolicyError on backend failure (all or
        nothing: `submit` each request to learn which ones failed)."""

    def describe(self) -> dict:
        """What to record about this model in the run config."""
        return {"name": self.name}


_POOL_LOCK = threading.Lock()


class _SerialServer:
    """The default `Policy.submit`: a daemon thread that serves queued requests one at a time."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.queue: queue.SimpleQueue[tuple[GenerationRequest, SamplingParams, Future, float]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"policy-{policy.name}", daemon=True)
        self.thread.start()

    def put(self, request: GenerationRequest, sampling: SamplingParams, future: Future) -> None:
        self.queue.put((request, sampling, future, time.perf_counter()))

    def _loop(self) -> None:
        while True:
            request, sampling, future, put_at = self.queue.get()
            if not future.set_running_or_notify_cancel():  # cancelled while it waited
                continue
            started_at = time.perf_counter()
            try:
                call = _checked(self.policy.complete([request], sampling), 1)[0]
            except BaseException as exc:  # noqa: BLE001 - the caller gets it from the future
                future.set_exception(exc)
                continue
            # the wait behind earlier requests is this server's queue; a backend that timed the
            # call itself keeps its own numbers
            if call.queue_s is None:
                call.queue_s = started_at - put_at
            if call.latency_s is None:
                call.latency_s = time.perf_counter() - put_at
            future.set_result(call)


def _checked(calls: list[ModelCall], n: int) -> list[ModelCall]:
    if len(calls) != n:
        raise PolicyError(f"backend returned {len(calls)} completions for {n} requests")
    return calls


class ModelUnavailable(RuntimeError):
    """A model cannot be loaded at all (missing package, not a model folder, unreadable weights).

    A configuration problem, not a transient backend failure: retrying will not help.
    """
