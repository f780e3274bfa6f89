"""The Policy interface: a model behind one door.

The runner hands a policy a batch of GenerationRequests (one per episode in flight) and gets
one ModelCall back per request, in order: prompt token ids, completion token ids and the
log-probability of every sampled token. Token in, token out: nothing downstream re-tokenizes
text the model produced.

Random streams are per request: the runner gives every request its own sampling seed
(`request_seed`), so what an episode samples depends on the episode alone, not on what else
was in the batch or on how many calls the process made before (a resumed run replays it).
Failures are per request too: `complete_each` returns one outcome per request, so a request the
backend cannot serve fails only its own episode.
"""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.types import Message, ModelCall, ToolSchema


class SamplingParams(BaseModel):
    """Sampling settings of a run; recorded in the run config."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.7, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0


class GenerationRequest(BaseModel):
    """One pending model call of one episode."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    max_new_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list)  # cut the completion after the first of these
    tools: list[ToolSchema] | None = None  # for backends with native function calling
    # send `tools` as the server's native function calling (openai backend; json protocol only)
    native_tools: bool = False
    # this request's own sampling seed (the runner sets it with `request_seed`); None: the
    # backend derives one from SamplingParams.seed and its own call counter
    seed: int | None = Field(None, ge=0, lt=2**64)


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
    # how many `submit`ted requests this backend serves at once (the rest wait in its queue)
    max_concurrency: int = 16

    def submit(self, request: GenerationRequest, sampling: SamplingParams) -> Future[ModelCall]:
        """Start one request; the future holds its ModelCall, or the PolicyError it got (a failure
        belongs to this request only).

        This default runs `complete([request])` on a pool of `max_concurrency` threads (no
        batching across requests); backends that can do better override it.
        """
        with _POOL_LOCK:
            pool = self.__dict__.get("_submit_pool")
            if pool is None:
                pool = ThreadPoolExecutor(max_workers=max(1, self.max_concurrency), thread_name_prefix="policy")
                self.__dict__["_submit_pool"] = pool

        def one() -> ModelCall:
            return _checked(self.complete([request], sampling), 1)[0]

        return pool.submit(one)

    @abstractmethod
    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[ModelCall]:
        """One ModelCall per request, same order. Raises PolicyError on backend failure (all or
        nothing: use `complete_each` to learn which requests failed)."""

    def complete_each(
        self, requests: list[GenerationRequest], sampling: SamplingParams
    ) -> list[ModelCall | PolicyError]:
        """One outcome per request, same order: its ModelCall, or the PolicyError that request got.

        This default runs the batch through `complete`; if that raises PolicyError on more than
        one request, it asks again one request at a time, so only the request(s) that fail on
        their own fail. (A request with a seed gets the same sample alone as in the batch.) Any
        other exception is a bug, not a backend failure, and propagates. Backends that serve
        requests independently (openai), or whose answer depends on how often they were asked
        (scripted), override this with one outcome per request directly.
        """
        if not requests:
            return []
        try:
            return list(_checked(self.complete(requests, sampling), len(requests)))
        except PolicyError as exc:
            if len(requests) == 1:
                return [exc]
        outcomes: list[ModelCall | PolicyError] = []
        for request in requests:
            try:
                outcomes.append(_checked(self.complete([request], sampling), 1)[0])
            except PolicyError as exc:
                outcomes.append(exc)
        return outcomes

    def describe(self) -> dict:
        """What to record about this model in the run config."""
        return {"name": self.name}


_POOL_LOCK = threading.Lock()


def _checked(calls: list[ModelCall], n: int) -> list[ModelCall]:
    if len(calls) != n:
        raise PolicyError(f"backend returned {len(calls)} completions for {n} requests")
    return calls


class ModelUnavailable(RuntimeError):
    """A model cannot be loaded at all (missing package, not a model folder, unreadable weights).

    A configuration problem, not a transient backend failure: retrying will not help.
    """
