"""What goes into the engine and what comes out of it: `EngineRequest` (one completion to
generate), `EngineCompletion` (what it produced and where its time went), `EngineStats` (the
engine's counters) and the two errors a request's future can carry besides a ValueError for a bad
request. Plain data, no torch: harnessrl.models.engine re-exports all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["EngineClosed", "EngineCompletion", "EngineError", "EngineRequest", "EngineStats"]


class EngineClosed(RuntimeError):
    """The engine was closed before the request finished."""


class EngineError(RuntimeError):
    """The model failed while the request was running (the request, not the engine, ends)."""


@dataclass(frozen=True)
class EngineRequest:
    """One completion to generate. `stop_ids=None`: the engine's default stop ids.

    The sampling fields have vLLM's meaning and order (docs/engine.md, "Sampling fields"); each
    default is neutral, and a request whose fields are all neutral samples as it always did."""

    prompt_ids: Sequence[int]
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: Sequence[int] | None = None
    # called from the engine's thread with (token id, logprob) as each token is sampled (a
    # server streams them); it must be quick and must not block: it runs inside the decode step
    on_token: Callable[[int, float], None] | None = None
    top_k: int = 0  # keep the k most probable tokens (ties at the k-th kept); 0 or -1: off
    min_p: float = 0.0  # drop tokens below min_p x the most probable one's probability
    repetition_penalty: float = 1.0  # tokens in the prompt or the completion: logit / rp if > 0, else x rp
    frequency_penalty: float = 0.0  # minus this x the token's count in the completion so far
    presence_penalty: float = 0.0  # minus this once for each token present in the completion
    # more stop ids, on top of `stop_ids` (or the engine's defaults): vLLM's stop_token_ids; the
    # stop token is kept in the completion's ids, finish_reason "stop"
    stop_token_ids: Sequence[int] = ()


@dataclass
class EngineCompletion:
    """What a request produced. `ids` keeps the stop token when finish_reason is "stop"."""

    ids: list[int]
    logprobs: list[float]  # log softmax(z / T)[token] of the raw logits z (T = 0: log softmax(z))
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose keys/values came from the prefix cache
    # Where its time went, in seconds of wall clock (docs/engine.md, "Timings"):
    queue_s: float = 0.0  # submitted -> taken off the waiting queue to be prefilled
    # taken off the queue -> its first token sampled and its row in the batch: the prefix-cache
    # copy and its prompt's forward (each prompt is prefilled alone, never batched with others),
    # and on the prefill thread also the wait for the decode step it joins at
    prefill_s: float = 0.0
    # the sum of the wall time (forward and sampling) of every batched decode step it took part
    # in: a step of n rows counts whole for each of them, so the rows' decode_s add up to n times
    # the step. 0 for a completion of one token (the prefill samples the first)
    decode_s: float = 0.0
    ttft_s: float = 0.0  # submitted -> its first token sampled (= queue_s + prefill_s)
    # each token's log-prob under the distribution it was drawn from (after penalties, min_p,
    # top_k, top_p, renormalised) for a request that shapes it; None when none did (then
    # `logprobs` are both)
    sampled_logprobs: list[float] | None = None


@dataclass
class EngineStats:
    """Counters since the engine was built (a snapshot: `Engine.stats()`)."""

    max_batch: int = 0
    requests: int = 0  # submitted
    finished: int = 0
    failed: int = 0  # rejected at submit or failed while running
    cancelled: int = 0
    prompt_tokens: int = 0  # of admitted requests = prefilled_tokens + cached_tokens
    prefilled_tokens: int = 0  # prompt tokens run through the model
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    completion_tokens: int = 0
    decode_steps: int = 0  # batched forwards of one token per running row
    decode_rows: int = 0  # rows summed over decode steps
    peak_batch: int = 0
    prefill_seconds: float = 0.0  # spent in prefill forwards (overlapped ones included)
    prefills_overlapped: int = 0  # prefills that ran on the prefill thread beside decode steps
    prefills_chunked: int = 0  # prefills run in chunks between decode steps (more than one chunk)
    prefill_chunks: int = 0  # the chunks of those prefills
    decode_seconds: float = 0.0
    cache_budget_tokens: int = 0
    cache_tokens: int = 0  # tokens held by the prefix cache now
    cache_nodes: int = 0
    evictions: int = 0  # prefix cache nodes evicted
    evicted_tokens: int = 0
    cache_clears: int = 0  # weights changed (or clear_cache)
    kv_bytes_per_token: int = 0
    mean_batch: float = field(default=0.0)  # decode_rows / decode_steps
