"""The engine's batch planner: what one step does, decided from counts, with no model and no torch.

`BatchPlanner.plan(view)` takes what the engine holds at the start of a step (`BatchView`: how many
rows decode, which of them were cancelled, the request on the prefill thread and the decode step
it joins at, how many requests wait) and returns a `BatchPlan`: which rows leave, whether the
prefill thread's request joins now, how each of the next waiting requests is admitted (prefilled
inline on the engine thread, or on the prefill thread beside the decode steps), and whether a
decode step runs. The engine (harnessrl.models.engine) carries the plan out on the model through
its forward runner (harnessrl.models.forward_runner); when an admission fails it asks for the rest of the
step again from what it holds then (`admissions`), so a failure leaves room exactly as if that
request had never been waiting. After the decode step `lands_after_decode` says whether the
prefill thread's request joins for the next one. `join_step` fixes that step when a prefill is
launched, and `finish_reason` says when a sampled token ends its request.

The rules, in order:

1. cancelled rows leave the batch;
2. the prefill thread's request joins when its join step has come, or at once when nothing else
   decodes (waiting for its prefill then costs no decode step);
3. requests are admitted while rows + the one on the prefill thread + the one being prefilled
   in chunks < `max_batch`: on the prefill thread when overlap is allowed this step, rows are
   decoding and the thread is free; else in chunks between the decode steps (CHUNKED) when
   chunks are on, more than `few_rows` rows decode and no request is being chunked; else inline.
   While the prefill thread is busy, or a request is being chunked, a further request is
   admitted (inline) only while at most `few_rows` rows decode: a step of so few rows costs
   nearly what a full one does, so both cores prefill instead (and a whole prefill beside them
   stalls little);
4. a decode step runs when any row runs.

The join step is a fixed schedule, one decode step per `tokens_per_step` uncached prompt tokens,
not "when the prefill is done": which rows decode together then never depends on timing, so the
same requests give the same floats every run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
INLINE = "inline"  # prefilled on the engine thread, straight into a row of the batch
OVERLAP = "overlap"  # prefilled on the prefill thread while the rows decode; joins at its join step
CHUNKED = "chunked"  # prefilled a chunk per step on the engine thread, between decode steps; joins after its last

# A request prefilled on the prefill thread joins the batch after one decode step per this many
# uncached prompt tokens (waiting for its prefill if that is slower). About what one core
# prefills while the other decodes a step of ~8-12 rows (smollm2-135m, float32, 1 thread each):
# 64 with the plain products; 32 with prepacked decode weights, whose steps are faster (on the
# rollout benchmark 32 beat 64 in 5 of 7 paired runs, by 8% in the median; 16, 24, 40 and 48 did
# worse than 32).
OVERLAP_TOKENS_PER_STEP = 64
OVERLAP_TOKENS_PER_PACKED_STEP = 32
# While the prefill thread is busy and at most this many rows decode (the start of a run, when
# every episode's first request queues at once), the engine thread prefills the next waiting
# request itself.
FEW_ROWS = 4


@dataclass(frozen=True)
class BatchView:
    """What the engine holds at a point of a step, as counts."""

    running: int  # rows in the batch
    waiting: int = 0  # requests in the waiting queue
    cancelled: tuple[int, ...] = ()  # rows whose request was cancelled
    inflight_due: int | None = None  # the prefill thread's request joins at this decode step; None: idle
    decode_steps: int = 0  # decode steps run so far
    may_overlap: bool = False  # the prefill thread may be used this step
    chunking: bool = False  # a request is being prefilled in chunks between decode steps


@dataclass(frozen=True)
class BatchPlan:
    """What one engine step does to the batch (`BatchPlanner.plan`)."""

    cancel: tuple[int, ...]  # rows that leave first
    land: bool  # the prefill thread's request joins the batch before the admissions
    admit: tuple[str, ...]  # INLINE, OVERLAP or CHUNKED for each of the next waiting requests, in order
    decode: bool  # a decode step runs (when every admission succeeds)


class BatchPlanner:
    """The step rules above for a batch of at most `max_batch` rows; `chunks`: CHUNKED admissions
    are allowed (the engine's prefill_chunk_tokens is on)."""

    def __init__(
        self,
        max_batch: int,
        *,
        tokens_per_step: int = OVERLAP_TOKENS_PER_STEP,
        few_rows: int = FEW_ROWS,
        chunks: bool = False,
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if tokens_per_step < 1:
            raise ValueError("tokens_per_step must be >= 1")
        self.max_batch = max_batch
        self.tokens_per_step = tokens_per_step
        self.few_rows = few_rows
        self.chunks = chunks  # long prompts may be prefilled in chunks (CHUNKED admissions)

    def plan(self, view: BatchView) -> BatchPlan:
        running = view.running - len(view.cancelled)
        due = view.inflight_due
        inflight = due is not None
        land = due is not None and (running == 0 or view.decode_steps >= due)
        if land:
            running, inflight = running + 1, False
        admit = self._admissions(running, inflight, view.waiting, view.may_overlap, view.chunking)
        running += admit.count(INLINE)
        return BatchPlan(tuple(view.cancelled), land, admit, running > 0)

    def admissions(self, view: BatchView) -> tuple[str, ...]:
        """How the next waiting requests are admitted from `view` on (rule 3)."""
        return self._admissions(
            view.running, view.inflight_due is not None, view.waiting, view.may_overlap, view.chunking
        )

    def _admissions(
        self, running: int, inflight: bool, waiting: int, may_overlap: bool, chunking: bool = False
    ) -> tuple[str, ...]:
        modes: list[str] = []
        while len(modes) < waiting and running + inflight + chunking < self.max_batch:
            if (inflight or chunking) and running > self.few_rows:
                break  # one prefill beside the decode steps at a time (on the thread, and in chunks)
            if may_overlap and running and not inflight:
                modes.append(OVERLAP)
                inflight = True
            elif self.chunks and running > self.few_rows and not chunking:
                modes.append(CHUNKED)
                chunking = True
            else:
                modes.append(INLINE)
                running += 1
        return tuple(modes)

    def join_step(self, decode_steps: int, new_tokens: int) -> int:
        """The decode step at which a prefill of `new_tokens` launched now joins the batch."""
        return decode_steps + max(1, -(-new_tokens // self.tokens_per_step))

    @staticmethod
    def lands_after_decode(view: BatchView) -> bool:
        """Whether the prefill thread's request joins the batch now, after a decode step."""
        due = view.inflight_due
        return due is not None and view.decode_steps >= due


def finish_reason(token: int, req: RequestState, max_context: int | None) -> str | None:
    """Why the request ends with `token` (already appended to its output), or None."""
    if token in req.stops:
        return FINISH_STOP
    if len(req.out_ids) >= req.max_new or (
        max_context is not None and len(req.prompt) + len(req.out_ids) >= max_context
    ):
        return FINISH_LENGTH
    return None


class RequestState:
    """One request inside the engine: its settings, its output so far, its row and its stamps.
    `sampler`: its sampling (harnessrl.models.sampling.RowSampler: its fields, its own random
    stream, its penalty state over the prompt and the completion so far), opaque here.
    `out_sampled`: the log-prob of each token under the distribution it was drawn from, for a
    request whose sampler shapes it (None otherwise)."""

    __slots__ = (
        "cached",
        "cancel",
        "decode_mark",
        "first_at",
        "future",
        "generation",
        "id",
        "length",
        "lock",
        "max_new",
        "on_token",
        "out_ids",
        "out_logprobs",
        "out_sampled",
        "prompt",
        "row",
        "sampler",
        "scheduled_at",
        "stops",
        "submitted_at",
        "temperature",
        "top_p",
    )

    def __init__(
        self,
        rid: int,
        prompt: tuple[int, ...],
        *,
        max_new: int,
        temperature: float,
        top_p: float,
        stops: frozenset[int],
        future,
        on_token: Callable[[int, float], None] | None = None,
        sampler=None,
        shapes: bool = False,
    ):
        self.id = rid
        self.prompt = prompt
        self.max_new = max_new
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.stops = stops
        self.sampler = sampler
        self.future = future
        self.on_token = on_token
        self.out_ids: list[int] = []
        self.out_logprobs: list[float] = []
        self.out_sampled: list[float] | None = [] if shapes else None
        self.row = -1
        self.length = 0  # tokens with keys/values in the row
        self.cached = 0
        self.lock: Any = None  # the prefix-cache node it holds (harnessrl.models.prefix_cache.PrefixNode)
        self.generation = 0
        self.cancel = False
        # perf_counter stamps: three per request, and the engine's decode clock when it joined
        self.submitted_at = time.perf_counter()
        self.scheduled_at = self.first_at = self.submitted_at
        self.decode_mark = 0.0


def check_request(req, vocab: int, max_context: int | None) -> tuple[tuple[int, ...], frozenset | None]:
    """The prompt and stop ids of an EngineRequest, or a ValueError saying what is wrong."""
    try:
        prompt = tuple(int(t) for t in req.prompt_ids)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"prompt_ids must be token ids (integers): {exc}") from None
    if not prompt:
        raise ValueError("empty prompt")
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    if max_context is not None and len(prompt) >= max_context:
        raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context is {max_context}")
    if isinstance(req.max_new_tokens, bool) or not isinstance(req.max_new_tokens, int) or req.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {req.max_new_tokens!r}")
    if not (isinstance(req.temperature, (int, float)) and math.isfinite(req.temperature) and req.temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {req.temperature!r}")
    if not (isinstance(req.top_p, (int, float)) and 0 < req.top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {req.top_p!r}")
    if not isinstance(req.seed, int):
        raise ValueError(f"seed must be an integer, got {req.seed!r}")
    check_shaping(req, vocab)
    stops = frozenset(int(s) for s in req.stop_ids) if req.stop_ids is not None else None
    return prompt, stops


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_shaping(req, vocab: int) -> None:
    """ValueError naming the first of vLLM's sampling fields (top_k, min_p, the penalties,
    stop_token_ids) of an EngineRequest whose value is not one vLLM accepts; a request built
    without them (their neutral defaults) passes."""
    top_k = getattr(req, "top_k", 0)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1:
        raise ValueError(f"top_k must be an integer >= 1, or 0 or -1 (off), got {top_k!r}")
    min_p = getattr(req, "min_p", 0.0)
    if not (_number(min_p) and 0 <= min_p <= 1):
        raise ValueError(f"min_p must be in [0, 1], got {min_p!r}")
    repetition = getattr(req, "repetition_penalty", 1.0)
    if not (_number(repetition) and repetition > 0):
        raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition!r}")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(req, name, 0.0)
        if not (_number(value) and -2 <= value <= 2):
            raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
    for token in getattr(req, "stop_token_ids", None) or ():
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise ValueError(f"stop_token_ids: {token!r} is not a token id of the vocabulary (0..{vocab - 1})")


def shared_prefix(prompts: Sequence[tuple[int, ...]], generations: Sequence[int]) -> int:
    """How many leading tokens every running row's prompt shares, when all were computed by the
    same weights (0 otherwise): their cache slots then hold the same keys and values."""
    if len(set(generations)) != 1:
        return 0
    return len(os.path.commonprefix(list(prompts)))
