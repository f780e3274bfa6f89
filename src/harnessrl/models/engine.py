"""Engine: continuous batching and prefix reuse for a local transformers causal LM.

Requests are token in, token out: prompt ids, a token limit, sampling settings, a seed and stop
ids go in; completion ids, the log-probability of every completion token and a finish reason
come out. `submit` returns a concurrent.futures.Future at once (from any thread); `step` does
one round of work; a background thread (`start`) can call `step` while there is work, so many
callers just wait on their futures (`asyncio.wrap_future` turns one into an awaitable).

The engine is three parts (docs/engine.md, "Layout"):

- harnessrl.models.batch_planner (`BatchPlanner`) decides each step from counts alone (no
  torch): which rows leave, whether the request on the prefill thread joins, how the next waiting
  requests are admitted, whether a decode step runs, and when a sampled token ends a request;
- harnessrl.models.forward_runner (`ForwardRunner`) runs that on the model: the batch cache of
  keys and values, the copies from and into the prefix cache, the prefills (inline, on the
  prefill thread, or in chunks between decode steps) and the batched decode forward;
- harnessrl.models.sampling draws each token from its request's own generator, with vLLM's
  sampling fields in vLLM's order (penalties, temperature, min_p, top_k, top_p), and gives its
  log-probabilities: the tempered one of the raw logits, and where the request shapes its
  distribution the one it was drawn from.

This module holds the requests' life cycle between them: the waiting queue and the running rows
(row i of the batch cache is request `_rows[i]`; a leaving row is replaced by the last one), the
prefix cache inserts (a prompt when it is prefilled, prompt + completion when it finishes, which
is what an episode's next turn starts with), the futures, the counters and the timings. What goes
in and out is in harnessrl.models.engine_api, the engine's switches in
harnessrl.models.engine_config (`EngineConfig`).

Prefix cache and weights. Cached keys/values are only valid for the weights that computed
them. Each step asks harnessrl.models.weights_watch whether the parameters changed (their
identities and in-place version counters, which optimizer steps and `load_state_dict` bump) and
drops the whole prefix cache when they did; a request running across such a change finishes on
its old prefix and is not put back into the cache. Anything else that changes what the model
computes without touching parameters in place (a peft adapter switched off, `.data` assignments)
needs `clear_cache()`.

Timings. Every EngineCompletion says where its wall time went (docs/engine.md, "Timings"):
queue_s (submitted -> taken off the waiting queue), prefill_s (-> its first token sampled, its row
in the batch), decode_s (the batched decode steps it took part in: each step's whole wall time
counts for every row in it, so a row's decode_s is the sum of the steps from its joining to its
last token) and ttft_s. They cost a few perf_counter() calls per request and one per decode step.

Only causal LMs whose every layer is full attention, with the `sdpa` or `eager` attention
implementation (the default of transformers' Llama, Qwen2, Mistral without sliding window, ...).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import asdict
from typing import Any

import torch

from harnessrl.models import packed, sampling
from harnessrl.models.batch_planner import (
    CHUNKED,
    FINISH_LENGTH,
    FINISH_STOP,
    INLINE,
    OVERLAP_TOKENS_PER_PACKED_STEP,
    OVERLAP_TOKENS_PER_STEP,
    BatchPlanner,
    BatchView,
    RequestState,
    check_request,
    finish_reason,
    shared_prefix,
)
from harnessrl.models.engine_api import EngineClosed, EngineCompletion, EngineError, EngineRequest, EngineStats
from harnessrl.models.engine_config import EngineConfig
from harnessrl.models.forward_runner import (
    ChunkedPrefill,
    ForwardRunner,
    Prefill,
    check_model,
    overlap_by_default,
    usable_cpus,
)
from harnessrl.models.prefix_cache import PrefixCache
from harnessrl.models.weights_watch import WeightsWatch

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "Engine",
    "EngineClosed",
    "EngineCompletion",
    "EngineConfig",
    "EngineError",
    "EngineRequest",
    "EngineStats",
    "usable_cpus",
]

log = logging.getLogger(__name__)

# the engines whose driver thread was started and not closed (see _close_at_exit)
_STARTED: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close every engine still driven by its daemon thread at exit: left inside a forward (a reply
    nobody awaits), it would be in torch while torch is torn down, and the process aborts."""
    for engine in list(_STARTED):
        engine.close()


class Engine:
    """Continuous batching with prefix reuse over one causal LM (see the module docstring).

    `tokenizer_or_stop_ids`: a tokenizer (the default stop ids are then the end-of-turn ids
    HFPolicy uses: <|im_end|>, the tokenizer's and the model's eos) or the stop ids themselves.
    `cache_budget_tokens`: how many tokens of keys/values the prefix cache may hold (0 turns it
    off); `kv_bytes_per_token` in `stats()` converts it to bytes. `max_context`: the longest
    prompt + completion, by default the model's max_position_embeddings.
    `config`: the engine's switches (EngineConfig; default `EngineConfig.from_env()`, the defaults
    with their environment overrides); keyword `switches` replace its fields
    (`Engine(model, stops, overlap_prefill=False)`; a switch given so is not read from the
    environment). None in a field is decided here from the model
    and the machine. The CPU-only parts (the prefill thread, the shared-prefix attention, the
    packed weights, the engine's own Llama decode forward) are off by default for a model on any
    other device; the prefill thread is never used there, and `fast_decode=True` is a ValueError. A request on the
    prefill thread joins the batch after one decode step per 64 new prompt tokens, 32 with
    `packed_decode` (waiting for the prefill if it is slower, so the schedule never depends on
    timing); while no prefill runs there, the engine thread's forwards borrow its core.
    """

    def __init__(
        self,
        model,
        tokenizer_or_stop_ids,
        *,
        max_batch: int = 8,
        cache_budget_tokens: int = 16384,
        max_context: int | None = None,
        config: EngineConfig | None = None,
        **switches: Any,
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        config = EngineConfig.from_env(**switches) if config is None else config.with_(**switches)
        self.config = config
        check_model(model)
        if isinstance(tokenizer_or_stop_ids, Sequence) and not isinstance(tokenizer_or_stop_ids, str):
            stops = [int(s) for s in tokenizer_or_stop_ids]
        else:
            from harnessrl.models.chat import end_of_turn_ids

            stops = end_of_turn_ids(model, tokenizer_or_stop_ids)
        self.model = model
        self.stop_ids = frozenset(stops)
        self.max_batch = max_batch
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        on_cpu = next(model.parameters()).device.type == "cpu"
        # The CPU-only machinery (the shared-prefix decode attention with its fused and compiled
        # kernels, the prefill thread and the borrowed core, the prepacked oneDNN weights) is
        # chosen here from the model's device. On a GPU the model's own attention (SDPA, which
        # dispatches to flash / memory-efficient kernels) reads the cache at the device's
        # bandwidth and one CUDA stream serialises the forwards anyway, so none of it is used.
        shared_prefix_attention = config.shared_prefix_attention
        if shared_prefix_attention is None:
            shared_prefix_attention = on_cpu
        overlap = config.overlap_prefill
        self.overlap_prefill = on_cpu and (overlap_by_default() if overlap is None else overlap)
        self.prefill_chunk_tokens = prefill_chunk_tokens = config.prefill_chunk_tokens
        packed_decode = config.packed_decode
        if packed_decode is None:
            packed_decode = packed.default_on(model, any_size=config.packed_any_size)
        elif packed_decode and not packed.available():
            raise ValueError("packed_decode needs a torch build with oneDNN (torch.backends.mkldnn)")
        self.prefix_cache = PrefixCache(cache_budget_tokens)
        self.runner = ForwardRunner(
            model,
            max_batch,
            self.prefix_cache,
            shared_prefix_attention=shared_prefix_attention,
            packed_decode=packed_decode,
            fast_decode=config.fast_decode,
            merge_lora=config.merge_lora,
        )
        self.device = self.runner.device
        per_step = OVERLAP_TOKENS_PER_STEP if not packed_decode else OVERLAP_TOKENS_PER_PACKED_STEP
        self.planner = BatchPlanner(max_batch, tokens_per_step=per_step, chunks=prefill_chunk_tokens > 0)
        self._inflight: Prefill | None = None
        self._chunked: ChunkedPrefill | None = None  # the request being prefilled in chunks
        self._may_overlap = False  # this step: overlap allowed (not while the model is in train mode)
        self._shared_key: tuple[int, ...] = ()
        self._shared_len = 0
        self._stats = EngineStats(
            max_batch=max_batch,
            cache_budget_tokens=cache_budget_tokens,
            kv_bytes_per_token=self.runner.kv_bytes_per_token,
        )
        self._generation = 0  # bumped when the weights change: older prefixes are stale
        self._weights = WeightsWatch(model)
        self._rows: list[RequestState] = []  # running, row i = self._rows[i]
        self._waiting: deque[RequestState] = deque()
        self._by_future: dict[Future, RequestState] = {}
        self._finished: list[tuple[Future, EngineCompletion]] = []  # completions of the running step (step())
        self._next_id = 0
        self._lock = threading.Lock()  # waiting queue, cancel flags, closed flag
        self._work = threading.Condition(self._lock)  # signalled on submit, close and idle
        self._step_lock = threading.RLock()  # one step at a time (re-entrant: clear_cache inside paused)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stepping = False  # a step runs (its requests may be out of the queue and not in a row yet)
        # Seconds of batched decode steps run so far, and the start of the one running now (None
        # outside one). Every running row takes part in every decode step, so a row's decode_s
        # is this clock when it finishes minus the clock when it joined: two stamps per request
        # and one per step, never a loop over the rows to add a step's time to each.
        self._decode_clock = 0.0
        self._decode_t0: float | None = None
        self._step_finished: list[tuple[EngineCompletion, float]] = []  # (completion, its decode mark)

    # the forward runner's settings, read and set on the engine (benchmarks compare them on and off)
    @property
    def shared_prefix_attention(self) -> bool:
        return self.runner.shared_prefix_attention

    @shared_prefix_attention.setter
    def shared_prefix_attention(self, on: bool) -> None:
        self.runner.shared_prefix_attention = on

    # (the forward runner's parts, as tests read them on the engine)
    @property
    def _kv(self):
        return self.runner.kv

    @property
    def _packed(self):
        return self.runner.packed

    @property
    def _cache_arg(self) -> str:
        return self.runner.cache_arg

    @property
    def compiled_attention(self) -> bool:
        return self.runner.compiled_attention

    @compiled_attention.setter
    def compiled_attention(self, on: bool) -> None:
        self.runner.compiled_attention = on

    # ----------------------------------------------------------------------------- public

    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int = 256, **fields: Any) -> Future:
        """Queue one request; its Future resolves to an EngineCompletion. Never raises for a bad
        request: the Future carries the ValueError (or EngineClosed) instead. `fields`: the
        other fields of EngineRequest by name (temperature, top_p, seed, stop_ids, on_token, top_k,
        min_p, the penalties, stop_token_ids); a name that is not one is a TypeError here."""
        return self.submit_request(EngineRequest(prompt_ids, max_new_tokens, **fields))

    def submit_request(self, request: EngineRequest) -> Future:
        future: Future = Future()
        with self._lock:
            self._stats.requests += 1
            if self._closed:
                self._stats.failed += 1
                future.set_exception(EngineClosed("the engine is closed"))
                return future
            try:
                prompt, stops = check_request(request, self.vocab_size, self.max_context)
            except ValueError as exc:
                self._stats.failed += 1
                future.set_exception(exc)
                return future
            sampler = sampling.for_request(request, prompt)
            req = RequestState(
                self._next_id,
                prompt,
                max_new=request.max_new_tokens,
                temperature=request.temperature,
                top_p=request.top_p,
                stops=(self.stop_ids if stops is None else stops).union(request.stop_token_ids or ()),
                future=future,
                on_token=request.on_token,
                sampler=sampler,
                shapes=sampler.shapes,
            )
            self._next_id += 1
            self._waiting.append(req)
            self._by_future[future] = req
            self._work.notify_all()
        return future

    def cancel(self, future: Future) -> bool:
        """Stop a request: a waiting one is cancelled at once, a running one leaves the batch at
        the next step (its Future then raises CancelledError). False if it already ended."""
        with self._lock:
            req = self._by_future.get(future)
            if req is None or future.done():
                return False
            if future.cancel():  # still waiting: out of the queue now
                self._waiting.remove(req)
                self._by_future.pop(future, None)
                self._stats.cancelled += 1
                return True
            req.cancel = True
            return True

    def has_work(self) -> bool:
        with self._lock:
            return self._busy()

    def step(self) -> bool:
        """Admit what fits, then one decode step for every running request. False if idle."""
        with self._step_lock, torch.inference_mode():
            self._stepping = True
            model = self.model
            was_training = model.training
            if was_training:  # (train() walks every module: not on every step when already in eval)
                model.eval()
            self._may_overlap = self.overlap_prefill and not was_training
            try:
                worked = self._step()
            finally:
                if was_training:
                    model.train()
                # answered only now: whoever waits on a completion finds the model as it left it
                finished, self._finished = self._finished, []
                for future, completion in finished:
                    future.set_result(completion)
                self._stepping = False
            if not self._rows and self._inflight is None and self._chunked is None:
                self.runner.kv.release()
            with self._lock:
                if not self._busy():
                    self._work.notify_all()
            return worked

    def run_until_done(self) -> None:
        """Block until nothing is waiting or running (stepping here unless a driver thread runs)."""
        if self._driver_alive():
            with self._work:
                while self._busy() and not self._closed:
                    self._work.wait()
            return
        while self.has_work():
            self.step()

    def generate(
        self, requests: Sequence[EngineRequest], *, timeout: float | None = None, return_exceptions: bool = False
    ) -> list:
        """Submit every request and wait for all of them; EngineCompletions in order. A failed request
        raises its exception (after all finished), or stands in the list with return_exceptions."""
        futures = [self.submit_request(r) for r in requests]
        if not self._driver_alive():
            while not all(f.done() for f in futures):
                self.step()
        results = []
        for f in futures:
            try:
                results.append(f.result(timeout=timeout))
            except Exception as exc:
                if not return_exceptions:
                    raise
                results.append(exc)
        return results

    def start(self) -> Engine:
        """Run steps in a background thread whenever there is work (until `close`)."""
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is closed")
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drive, name="harnessrl-engine", daemon=True)
                self._thread.start()
                _STARTED.add(self)
        return self

    def close(self) -> None:
        """Stop the driver thread; fail what is still waiting or running with EngineClosed. A
        step in progress in another thread is cut short at the model's next module call (a long
        prefill would otherwise hold the close, and the process's exit, for all its length)."""
        with self._lock:
            self._closed = True
            busy = self._busy() or self._stepping
            self._work.notify_all()
        _STARTED.discard(self)
        thread = self._thread
        cut_short = self.runner.forwards_refused() if busy else contextlib.nullcontext()
        with cut_short:
            if thread is not None and thread is not threading.current_thread():
                thread.join()
            with self._step_lock:
                for req in self._drop_all():
                    self._fail(req, EngineClosed("the engine was closed before the request finished"))
        with self._step_lock:
            self.prefix_cache.clear()
            self.runner.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def clear_cache(self) -> None:
        """Forget every cached prefix (call it after changing what the model computes)."""
        with self._step_lock:
            self._invalidate()
            self.runner.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No step runs inside this block: a step in progress finishes first, and requests
        submitted meanwhile wait until it ends. For training the model between generations
        (a forward or backward on the same model must never overlap a step)."""
        with self._step_lock:
            if self._inflight is not None:  # a prefill on the prefill thread uses the model too
                with contextlib.suppress(Exception):
                    self._inflight.future.result()
            yield

    def stats(self) -> EngineStats:
        s = EngineStats(**asdict(self._stats))
        s.cache_tokens = self.prefix_cache.tokens
        s.cache_nodes = self.prefix_cache.nodes
        s.evictions = self.prefix_cache.evictions
        s.evicted_tokens = self.prefix_cache.evicted_tokens
        s.mean_batch = s.decode_rows / s.decode_steps if s.decode_steps else 0.0
        return s

    # ---------------------------------------------------------------------------- internal

    def _driver_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread()

    def _busy(self) -> bool:
        return bool(self._waiting or self._rows or self._inflight is not None or self._chunked is not None)

    def _drop_all(self) -> list[RequestState]:
        """Take every waiting, prefilling and running request out of the engine (their prefill
        finished first); returns them, for failing."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            with contextlib.suppress(Exception):
                inflight.future.result()
            self._unlock(inflight.req)
        chunked, self._chunked = self._chunked, None
        if chunked is not None:
            self._unlock(chunked.req)
        with self._lock:
            pending = list(self._waiting) + list(self._rows) + ([inflight.req] if inflight is not None else [])
            pending += [chunked.req] if chunked is not None else []
            self._waiting.clear()
        self._rows.clear()
        self.runner.kv.release()
        return pending

    def _drive(self) -> None:
        while True:
            with self._work:
                while not self._closed and not self._busy():
                    self._work.wait()
                if self._closed:
                    return
            try:
                self.step()
            except Exception as exc:
                if self._closed:  # (a step cut short by `close`)
                    failure: Exception = EngineClosed("the engine was closed before the request finished")
                else:
                    failure = EngineError(f"engine step failed: {type(exc).__name__}: {exc}")
                with self._step_lock:
                    for req in self._drop_all():
                        self._fail(req, failure)

    def _invalidate(self) -> None:
        self._generation += 1
        self.prefix_cache.clear()
        self._stats.cache_clears += 1
        self.runner.weights_changed()

    def _view(self) -> BatchView:
        """What the batch planner decides from."""
        inflight = self._inflight
        return BatchView(
            running=len(self._rows),
            waiting=len(self._waiting),
            cancelled=tuple(r.row for r in self._rows if r.cancel),
            inflight_due=None if inflight is None else inflight.due,
            decode_steps=self._stats.decode_steps,
            may_overlap=self._may_overlap,
            chunking=self._chunked is not None,
        )

    def _step(self) -> bool:
        if self._weights.changed():
            self._invalidate()
        plan = self.planner.plan(self._view())
        for req in [self._rows[row] for row in plan.cancel]:
            self._stats.cancelled += 1
            self._release(req, insert=False)
            req.future.set_exception(CancelledError())
        if plan.land:
            self._land()  # (waiting for it when there is nothing to decode meanwhile)
        chunked = self._chunked is not None
        if chunked:
            self._next_chunk()  # (its slot is counted in the plan: joining now changes no admission)
        admitted = self._admit_waiting(list(plan.admit))
        worked = bool(plan.cancel or plan.land or chunked or admitted)
        if self._rows:
            self._decode()
            worked = True
        if self.planner.lands_after_decode(self._view()):
            self._land()  # it joins the next decode step
        return worked

    def _admit_waiting(self, modes: list[str]) -> bool:
        """Admit the next waiting requests as planned; when one fails to start, or requests came
        in meanwhile, the batch planner plans the rest from what the engine holds then."""
        worked = False
        while modes:
            with self._lock:
                if not self._waiting:
                    break
                req = self._waiting.popleft()
                if not req.future.set_running_or_notify_cancel():  # cancelled (Future.cancel) while waiting
                    self._by_future.pop(req.future, None)
                    self._stats.cancelled += 1
                    continue
            req.scheduled_at = time.perf_counter()
            mode = modes.pop(0)
            if mode == INLINE:
                started = self._admit(req)
            elif mode == CHUNKED:
                started = self._begin_chunked(req)
            else:
                started = self._launch(req)
            worked = True
            if not started or not modes:
                modes = list(self.planner.admissions(self._view()))
        return worked

    def _borrow(self) -> bool:
        """A forward on the engine thread may take the prefill thread's core (it is idle)."""
        return self._may_overlap and self._inflight is None

    def _admit(self, req: RequestState) -> bool:
        """Prefill `req` here and now, straight into the next free row of the batch cache."""
        t0 = time.perf_counter()
        row = len(self._rows)
        req.generation = self._generation
        try:
            cached, logits = self.runner.prefill(req, row, borrow=self._borrow())
        except Exception as exc:
            self._prefill_failed(req, exc)
            return False
        self._stats.prefill_seconds += time.perf_counter() - t0
        self._join(req, row, cached, logits)
        return True

    def _launch(self, req: RequestState) -> bool:
        """Start prefilling `req` on the prefill thread; `_land` brings it into the batch."""
        req.generation = self._generation
        try:
            job = self.runner.launch(req)
        except Exception as exc:
            self._prefill_failed(req, exc)
            return False
        job.due = self.planner.join_step(self._stats.decode_steps, len(req.prompt) - job.cached)
        self._inflight = job
        self._stats.prefills_overlapped += 1
        return True

    def _begin_chunked(self, req: RequestState) -> bool:
        """Start a chunked prefill of `req` and run its first chunk; a prompt that fits in one
        joins the batch at once."""
        req.generation = self._generation
        try:
            self._chunked = self.runner.begin_chunked(req)
        except Exception as exc:
            self._prefill_failed(req, exc)
            return False
        return self._next_chunk()

    def _next_chunk(self) -> bool:
        """One chunk of the request being prefilled in chunks (every chunk left when no row is
        decoding: nothing waits on them then); it joins the batch after its last. False when it
        failed or was cancelled."""
        job = self._chunked
        assert job is not None
        req = job.req
        if req.cancel:
            self._chunked = None
            self._cancel_unjoined(req)
            return False
        t0 = time.perf_counter()
        try:
            if req.generation != self._generation:  # the weights changed between two chunks: start again
                self._unlock(req)
                req.generation = self._generation
                job = self._chunked = self.runner.begin_chunked(req)
            while True:  # one chunk; all that are left when no row decodes beside them
                self.runner.prefill_chunk(job, self.prefill_chunk_tokens, borrow=self._borrow())
                if job.finished or self._rows:
                    break
        except Exception as exc:
            self._chunked = None
            self._prefill_failed(req, exc)
            return False
        finally:
            self._stats.prefill_seconds += time.perf_counter() - t0
        if not job.finished:
            return True
        self._chunked = None
        if job.chunks > 1:
            self._stats.prefills_chunked += 1
            self._stats.prefill_chunks += job.chunks
        row = len(self._rows)
        assert job.logits is not None
        try:
            self.runner.land(job, row)
        except Exception as exc:
            self._prefill_failed(req, exc)
            return False
        self._join(req, row, job.cached, job.logits)
        return True

    def _land(self) -> None:
        """The prefill thread's request joins the batch (its keys/values copied into a row)."""
        job, self._inflight = self._inflight, None
        assert job is not None
        req = job.req
        try:
            logits, seconds = job.future.result()
            self._stats.prefill_seconds += seconds
            if req.cancel:
                self._cancel_unjoined(req)
                return
            row = len(self._rows)
            self.runner.land(job, row)
        except Exception as exc:
            self._prefill_failed(req, exc)
            return
        self._join(req, row, job.cached, logits[0])

    def _cancel_unjoined(self, req: RequestState) -> None:
        """A request cancelled while it was being prefilled (on the prefill thread or in chunks)
        ends before it ever joined the batch."""
        self._unlock(req)
        self._stats.cancelled += 1
        with self._lock:
            self._by_future.pop(req.future, None)
        req.future.set_exception(CancelledError())

    def _unlock(self, req: RequestState) -> None:
        """Let go of the prefix-cache node the request holds (if any)."""
        if req.lock is not None:
            self.prefix_cache.unlock(req.lock)
            req.lock = None

    def _prefill_failed(self, req: RequestState, exc: BaseException) -> None:
        self._unlock(req)
        if self._closed:  # (a prefill cut short by `close`)
            self._fail(req, EngineClosed("the engine was closed before the request finished"))
            return
        self._fail(req, EngineError(f"prefill failed: {type(exc).__name__}: {exc}"))

    def _join(self, req: RequestState, row: int, cached: int, logits: torch.Tensor) -> None:
        """A prefilled request (its keys/values in `row`) takes its place in the batch, its
        prompt goes into the prefix cache, and its first token is sampled."""
        prompt = req.prompt
        req.row, req.length, req.cached = row, len(prompt), cached
        self._rows.append(req)
        self._stats.prompt_tokens += len(prompt)
        self._stats.prefilled_tokens += len(prompt) - cached
        self._stats.cached_tokens += cached
        self._stats.peak_batch = max(self._stats.peak_batch, len(self._rows))
        if self.prefix_cache.budget_tokens > 0 and req.generation == self._generation:
            node = self.prefix_cache.insert(prompt, self.runner.kv.row(row, len(prompt)))
            if node is not self.prefix_cache.root:
                self.prefix_cache.lock(node)
            self._unlock(req)
            req.lock = node if node is not self.prefix_cache.root else None
        drawn = req.sampler.draw(logits)
        req.first_at = time.perf_counter()
        req.decode_mark = self._decode_clock  # it takes part in every decode step from here on
        self._accept(req, *drawn)

    def _decode(self) -> None:
        t0 = time.perf_counter()
        rows = self._rows
        n = len(rows)
        try:
            logits = self.runner.decode(
                [r.length for r in rows], [r.out_ids[-1] for r in rows], self._shared_prefix(), borrow=self._borrow()
            )
        except Exception as exc:
            for req in list(rows):
                self._release(req, insert=False)
                self._fail(req, EngineError(f"decode failed: {type(exc).__name__}: {exc}"))
            return
        self._stats.decode_steps += 1
        self._stats.decode_rows += n
        self._stats.decode_seconds += time.perf_counter() - t0
        batch = list(rows)
        for req in batch:  # every row now holds its fed token (before any row moves)
            req.length += 1
        self._decode_t0 = t0  # rows finishing while the step samples count the whole step
        try:
            for req, row_logits in zip(batch, logits):
                self._accept(req, *req.sampler.draw(row_logits))
        finally:
            self._decode_t0 = None
            self._decode_clock += time.perf_counter() - t0
            for completion, mark in self._step_finished:
                completion.decode_s = self._decode_clock - mark
            self._step_finished.clear()

    def _shared_prefix(self) -> int:
        """How many leading cache slots hold the same tokens, computed by the same weights, in
        every running row (recomputed only when the rows change)."""
        key = tuple(r.id for r in self._rows)
        if self._shared_key != key:
            self._shared_key = key
            self._shared_len = shared_prefix([r.prompt for r in self._rows], [r.generation for r in self._rows])
        return self._shared_len

    def _accept(self, req: RequestState, token: int, logprob: float, sampled: float | None = None) -> None:
        """Record a sampled token (and its shaped log-prob); finish the request when it stops."""
        req.out_ids.append(token)
        req.out_logprobs.append(logprob)
        if req.out_sampled is not None:
            req.out_sampled.append(logprob if sampled is None else sampled)
        self._stats.completion_tokens += 1
        if req.on_token is not None:  # one attribute test per token for requests nobody streams
            try:
                req.on_token(token, logprob)
            except Exception:  # noqa: BLE001 - a listener's failure must not end the batch's step
                log.exception("a token listener failed; the request goes on without it")
                req.on_token = None
        reason = finish_reason(token, req, self.max_context)
        if reason is not None:
            self._finish(req, reason)

    def _finish(self, req: RequestState, reason: str) -> None:
        self._release(req, insert=True)
        self._stats.finished += 1
        with self._lock:
            self._by_future.pop(req.future, None)
        completion = EngineCompletion(
            list(req.out_ids),
            list(req.out_logprobs),
            reason,
            len(req.prompt),
            req.cached,
            queue_s=req.scheduled_at - req.submitted_at,
            prefill_s=req.first_at - req.scheduled_at,
            decode_s=self._decode_clock - req.decode_mark,
            ttft_s=req.first_at - req.submitted_at,
            sampled_logprobs=None if req.out_sampled is None else list(req.out_sampled),
        )
        if self._decode_t0 is not None:  # inside a decode step: its decode_s once the step ends
            self._step_finished.append((completion, req.decode_mark))
        self._finished.append((req.future, completion))

    def _release(self, req: RequestState, *, insert: bool) -> None:
        """Take the request's row out of the batch (the last row moves into it); before that,
        remember its prompt + fed completion tokens in the prefix cache."""
        cache = self.prefix_cache
        if insert and cache.budget_tokens > 0 and req.generation == self._generation:
            fed = req.prompt + tuple(req.out_ids[:-1])
            assert len(fed) == req.length, (len(fed), req.length)
            cache.insert(fed, self.runner.kv.row(req.row, req.length))
        self._unlock(req)
        last = self._rows[-1]
        if last is not req:
            self.runner.kv.move(last.row, req.row, last.length)
            self._rows[req.row] = last
            last.row = req.row
        self._rows.pop()
        req.row = -1

    def _fail(self, req: RequestState, exc: BaseException) -> None:
        with self._lock:
            self._by_future.pop(req.future, None)
        if req.future.done():
            return
        self._stats.failed += 1
        if not req.future.running():
            req.future.set_running_or_notify_cancel()
        req.future.set_exception(exc)
