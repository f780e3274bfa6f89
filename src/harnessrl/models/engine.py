"""Engine: continuous batching and prefix reuse for a local transformers causal LM.

Requests are token in, token out: prompt ids, a token limit, sampling settings, a seed and stop
ids go in; completion ids, the log-probability of every completion token and a finish reason
come out. `submit` returns a concurrent.futures.Future at once (from any thread); `step` does
one round of work; a background thread (`start`) can call `step` while there is work, so many
callers just wait on their futures (`asyncio.wrap_future` turns one into an awaitable).

One step:
1. admit waiting requests while fewer than `max_batch` run. Admitting prefills the prompt for
   that request alone: the longest prefix of the prompt whose keys and values are in the
   prefix cache is copied into the request's row of the batch cache, and only the remaining
   tokens run through the model (at positions after the prefix). The prompt's last logits give
   the first completion token. The prompt then goes into the prefix cache, so a request
   admitted next (in the same step or later) reuses it.
2. one decode step for every running request at once: each row feeds its last token at its own
   position; rows of different lengths share one forward through a 4D attention mask that
   hides each row's unused cache slots, and a prefix every row shares is read once
   (harnessrl.models.attention). A request leaves the batch as soon as it samples a stop
   id or reaches its own max_new_tokens (or the model's context), so no forward is spent on a
   finished row; its prompt + completion then goes into the prefix cache, which is what an
   episode's next turn starts with.

The batch cache is one tensor (layers, 2, rows, kv_heads, capacity, head_dim): row r holds the
keys and values of request r's tokens at slots 0..length-1, and a forward writes the new
token's key/value at slot `length` of each row (a small transformers Cache adapter does the
writing, so the model's own attention code runs unchanged). A leaving row is replaced by the
last row (one copy), so the running rows are always rows 0..n-1.

Sampling and log-probabilities are those of HFPolicy: the recorded log-probability of a sampled
token is log softmax(z / T)[token] of the raw logits z (T = 0: log softmax(z)), top_p applied
only to the sampling distribution afterwards, so it is what a teacher-forced forward pass of
prompt + completion gives. Every request samples from its own torch.Generator seeded with its
own seed: what else is in flight changes its logits only by float rounding of the batched
matmuls, never its random draws. Greedy (T = 0) takes the arg max, as model.generate does.

Prefix cache and weights. Cached keys/values are only valid for the weights that computed
them. Each step compares a fingerprint of the parameters (their identities and in-place
version counters, which optimizer steps and `load_state_dict` bump) and drops the whole prefix
cache when it changed; a request running across such a change finishes on its old prefix and
is not put back into the cache. Anything else that changes what the model computes without
touching parameters in place (a peft adapter switched off, `.data` assignments) needs
`clear_cache()`.

Timings. Every Completion says where its wall time went (docs/engine.md, "Timings"): queue_s
(submitted -> taken off the waiting queue), prefill_s (-> its first token sampled, its row in the
batch), decode_s (the batched decode steps it took part in: each step's whole wall time counts
for every row in it, so a row's decode_s is the sum of the steps from its joining to its last
token) and ttft_s. They cost a few perf_counter() calls per request and one per decode step.

Only causal LMs whose every layer is full attention, with the `sdpa` or `eager` attention
implementation (the default of transformers' Llama, Qwen2, Mistral without sliding window, ...).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import torch
from transformers import DynamicCache

from harnessrl.models import packed
from harnessrl.models.attention import decode_plan, make_plan, uses_compiled_kernel, uses_fused_kernel
from harnessrl.models.prefix_cache import PrefixCache, PrefixNode

log = logging.getLogger(__name__)

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
_CAPACITY_STEP = 256  # batch cache capacity grows in multiples of this many tokens
# A request prefilled on the prefill thread joins the batch after one decode step per this many
# uncached prompt tokens (waiting for its prefill if that is slower). A fixed schedule, not "when
# it is done": which rows decode together then never depends on timing, so the same requests
# give the same floats every run. About what one core prefills while the other decodes a step
# of ~8-12 rows (smollm2-135m, float32, 1 thread each): 64 with the plain products; 32 with
# prepacked decode weights, whose steps are faster (on the rollout benchmark 32 beat 64 in 5 of 7
# paired runs, by 8% in the median; 16, 24, 40 and 48 did worse than 32).
_OVERLAP_TOKENS_PER_STEP = 64
_OVERLAP_TOKENS_PER_PACKED_STEP = 32
# While the prefill thread is busy and at most this many rows decode (the start of a run, when
# every episode's first request queues at once), the engine thread prefills the next waiting
# request itself: a step of so few rows costs nearly as much as a full one, so both cores
# prefill instead.
_FEW_ROWS = 4


class EngineClosed(RuntimeError):
    """The engine was closed before the request finished."""


class EngineError(RuntimeError):
    """The model failed while the request was running (the request, not the engine, ends)."""


@dataclass(frozen=True)
class EngineRequest:
    """One completion to generate. `stop_ids=None`: the engine's default stop ids."""

    prompt_ids: Sequence[int]
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: Sequence[int] | None = None
    # called from the engine's thread with (token id, logprob) as each token is sampled (a
    # server streams them); it must be quick and must not block: it runs inside the decode step
    on_token: Callable[[int, float], None] | None = None


@dataclass
class Completion:
    """What a request produced. `ids` keeps the stop token when finish_reason is "stop"."""

    ids: list[int]
    logprobs: list[float]
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
    decode_seconds: float = 0.0
    cache_budget_tokens: int = 0
    cache_tokens: int = 0  # tokens held by the prefix cache now
    cache_nodes: int = 0
    evictions: int = 0  # prefix cache nodes evicted
    evicted_tokens: int = 0
    cache_clears: int = 0  # weights changed (or clear_cache)
    kv_bytes_per_token: int = 0
    mean_batch: float = field(default=0.0)  # decode_rows / decode_steps


# ------------------------------------------------------------------------------ batch cache


class _BatchKV:
    """The running rows' keys and values: (layers, 2, rows, kv_heads, capacity, head_dim)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (layers, kv_heads, head_dim)
        self.dtype = dtype
        self.device = device
        self.buf: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return 0 if self.buf is None else self.buf.shape[2]

    @property
    def capacity(self) -> int:
        return 0 if self.buf is None else self.buf.shape[4]

    def reserve(self, rows: int, capacity: int, max_rows: int) -> None:
        """Make room for `rows` rows of `capacity` tokens, growing geometrically. New slots are
        zeros: masked slots must hold finite numbers (0 x NaN would leak through the mask)."""
        if rows <= self.rows and capacity <= self.capacity:
            return
        new_rows = max(rows, self.rows) if rows <= self.rows else min(max_rows, max(rows, 2 * self.rows))
        new_cap = self.capacity
        if capacity > self.capacity:
            new_cap = max(capacity, self.capacity + self.capacity // 2)
            new_cap = -(-new_cap // _CAPACITY_STEP) * _CAPACITY_STEP
        layers, heads, dim = self.shape
        grown = torch.zeros((layers, 2, new_rows, heads, new_cap, dim), dtype=self.dtype, device=self.device)
        if self.buf is not None:
            grown[:, :, : self.rows, :, : self.capacity] = self.buf
        self.buf = grown

    def row(self, r: int, length: int) -> torch.Tensor:
        """Row r's first `length` slots: (layers, 2, kv_heads, length, head_dim), a view."""
        return self.buf[:, :, r, :, :length]

    def move(self, src: int, dst: int, length: int) -> None:
        self.buf[:, :, dst, :, :length] = self.buf[:, :, src, :, :length]

    def release(self) -> None:
        self.buf = None


class _ForwardCache(DynamicCache):
    """What the model sees as its cache during one engine forward.

    Each attention layer hands over the keys/values of the new tokens; they are written into
    the batch cache at the rows' own positions, and the layer gets back the rows' cached slots
    up to `kv_len` (unused slots are hidden by the engine's attention mask). Two shapes:
    prefill (one row `row`, tokens at `start`..) and decode (rows 0..n-1, one token each at
    `positions`).
    """

    def __init__(self, kv: _BatchKV, *, kv_len: int, row: int = 0, start: int = 0, positions=None):
        super().__init__()
        self.kv = kv
        self.kv_len = kv_len
        self.row = row
        self.start = start
        self.positions = positions  # (n,) long, decode only

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        buf = self.kv.buf[layer_idx]  # (2, rows, heads, capacity, dim)
        if key_states.shape[1] != buf.shape[2] or key_states.shape[-1] != buf.shape[-1]:
            raise ValueError(
                f"layer {layer_idx} returned keys of shape {tuple(key_states.shape)}; the engine expected "
                f"{buf.shape[2]} kv heads of size {buf.shape[-1]}"
            )
        if self.positions is None:
            end = self.start + key_states.shape[2]
            buf[0, self.row, :, self.start : end] = key_states[0]
            buf[1, self.row, :, self.start : end] = value_states[0]
            return buf[0, self.row : self.row + 1, :, :end], buf[1, self.row : self.row + 1, :, :end]
        n = key_states.shape[0]
        rows = torch.arange(n, device=buf.device)
        buf[0, :n][rows, :, self.positions] = key_states[:, :, 0]
        buf[1, :n][rows, :, self.positions] = value_states[:, :, 0]
        return buf[0, :n, :, : self.kv_len], buf[1, :n, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.start if self.positions is None else self.kv_len - 1


# ------------------------------------------------------------------------------- requests


class _Request:
    __slots__ = (
        "cached",
        "cancel",
        "decode_mark",
        "first_at",
        "future",
        "generation",
        "generator",
        "id",
        "length",
        "lock",
        "max_new",
        "on_token",
        "out_ids",
        "out_logprobs",
        "prompt",
        "row",
        "scheduled_at",
        "stops",
        "submitted_at",
        "temperature",
        "top_p",
    )

    def __init__(self, rid: int, prompt: tuple[int, ...], req: EngineRequest, stops: frozenset[int], future: Future):
        self.id = rid
        self.prompt = prompt
        self.max_new = req.max_new_tokens
        self.temperature = float(req.temperature)
        self.top_p = float(req.top_p)
        self.stops = stops
        self.generator = torch.Generator().manual_seed(req.seed) if req.temperature > 0 else None
        self.future = future
        self.on_token = req.on_token
        self.out_ids: list[int] = []
        self.out_logprobs: list[float] = []
        self.row = -1
        self.length = 0  # tokens with keys/values in the row
        self.cached = 0
        self.lock: PrefixNode | None = None
        self.generation = 0
        self.cancel = False
        # perf_counter stamps: three per request, and the engine's decode clock when it joined
        self.submitted_at = time.perf_counter()
        self.scheduled_at = self.first_at = self.submitted_at
        self.decode_mark = 0.0


def _check_request(req: EngineRequest, vocab: int, max_context: int | None) -> tuple[tuple[int, ...], frozenset]:
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
    stops = frozenset(int(s) for s in req.stop_ids) if req.stop_ids is not None else None
    return prompt, stops


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The ids of the most probable tokens until their mass reaches top_p (the first always).

    Looks at the top 64 first and widens only when the nucleus does not end inside them, so the
    usual case costs a top-k instead of sorting the whole vocabulary.
    """
    k = min(64, probs.numel())
    while True:
        top, ids = torch.topk(probs, k)
        before = torch.cumsum(top, dim=0) - top
        if k == probs.numel() or bool(before[-1] >= top_p):
            return ids[before < top_p]
        k = min(probs.numel(), 8 * k)


def _sample(logits: torch.Tensor, req: _Request) -> tuple[int, float]:
    """One token from one row's raw logits (vocab,), float32, and its log-probability."""
    if req.temperature == 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logp = torch.log_softmax(logits / req.temperature, dim=-1)
    candidates, ids = logp, None
    if req.top_p < 1.0:
        ids = _nucleus(logp.exp(), req.top_p)
        candidates = logp[ids]
    # Exponential race (the Gumbel-max trick): the arg max of log p_i - log E_i, with one
    # E_i ~ Exp(1) per candidate from the request's own generator, is a draw from p. Rounding
    # noise in the logits (another batch size, another prefill split) flips it only where two
    # candidates' scores tie within that noise. An inverse CDF over the vocabulary instead
    # flips whenever the rounding of every probability before the pick, summed, crosses the
    # uniform draw: on a flat distribution that happened about once per thousand tokens.
    uniform = torch.rand(candidates.shape, generator=req.generator, dtype=candidates.dtype)
    pick = int(torch.argmax(candidates - torch.log(-torch.log(uniform))))
    token = int(ids[pick]) if ids is not None else pick
    return token, float(logp[token])


# --------------------------------------------------------------------------------- engine


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "process_cpu_count"):
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _overlap_by_default() -> bool:
    """$HARNESSRL_PREFILL_THREAD (1 or 0) when set; else on with one torch thread and a second CPU."""
    wanted = os.environ.get("HARNESSRL_PREFILL_THREAD", "").strip()
    if wanted in ("0", "1"):
        return wanted == "1"
    if wanted:
        raise ValueError(f"HARNESSRL_PREFILL_THREAD must be 0 or 1, got {wanted!r}")
    return torch.get_num_threads() == 1 and usable_cpus() >= 2


@dataclass
class _Prefill:
    """A prefill running on the prefill thread: into its own one-row cache `kv`, `cached`
    prompt tokens of which came from the prefix cache."""

    req: _Request
    kv: _BatchKV
    cached: int
    future: Future  # (last-position logits (1, vocab), seconds)
    due: int  # joins the batch once this many decode steps have run


def _forward_parameters(model) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


class Engine:
    """Continuous batching with prefix reuse over one causal LM (see the module docstring).

    `tokenizer_or_stop_ids`: a tokenizer (the default stop ids are then the end-of-turn ids
    HFPolicy uses: <|im_end|>, the tokenizer's and the model's eos) or the stop ids themselves.
    `cache_budget_tokens`: how many tokens of keys/values the prefix cache may hold (0 turns it
    off); `kv_bytes_per_token` in `stats()` converts it to bytes. `max_context`: the longest
    prompt + completion, by default the model's max_position_embeddings.
    `shared_prefix_attention`: in a decode step, read the keys/values of a prefix every running
    row shares once instead of once per row (harnessrl.models.attention; equal up to float
    rounding, so off only for comparisons). None: on for a model on the CPU; on any other device
    the model's own attention runs every forward. `overlap_prefill`: prefill an admitted request on a
    second thread while the running rows keep decoding (one such prefill at a time; the request
    joins the batch after one decode step per 64 new prompt tokens, 32 with `packed_decode`,
    waiting for the prefill if it is slower, so the schedule never depends on timing; while no
    prefill runs there, the engine thread's forwards borrow its core as a second intra-op
    thread). None: on when torch runs one intra-op thread and the machine has a second core
    (harnessrl leaves one free; two forwards of several threads each would only fight over the
    cores); $HARNESSRL_PREFILL_THREAD=1 or 0 decides instead when set; off for a model that is
    not on the CPU. `packed_decode`: the engine's forwards (decode steps and its prefills) use
    oneDNN-prepacked copies of the float32 linear weights (harnessrl.models.packed; as many
    bytes again as those weights; equal up to float rounding). None: $HARNESSRL_PACKED_DECODE (0
    or 1) when set, else on for a float32 CPU model whose linear weights take at most 2 GiB, on a
    torch with oneDNN.
    """

    def __init__(
        self,
        model,
        tokenizer_or_stop_ids,
        *,
        max_batch: int = 8,
        cache_budget_tokens: int = 16384,
        max_context: int | None = None,
        shared_prefix_attention: bool | None = None,
        overlap_prefill: bool | None = None,
        packed_decode: bool | None = None,
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        config = model.config
        attn = getattr(config, "_attn_implementation", None) or "eager"
        if attn not in ("sdpa", "eager"):
            raise ValueError(f"the engine needs sdpa or eager attention; this model uses {attn!r}")
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            raise ValueError("the engine does not handle sliding-window attention")
        if isinstance(tokenizer_or_stop_ids, Sequence) and not isinstance(tokenizer_or_stop_ids, str):
            stops = [int(s) for s in tokenizer_or_stop_ids]
        else:
            from harnessrl.models.chat import end_of_turn_ids

            stops = end_of_turn_ids(model, tokenizer_or_stop_ids)
        self.model = model
        self.stop_ids = frozenset(stops)
        self.max_batch = max_batch
        self.max_context = max_context or getattr(config, "max_position_embeddings", None)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self._bool_mask = attn == "sdpa"
        self._attn = attn
        first = next(model.parameters())
        on_cpu = first.device.type == "cpu"
        # The CPU-only machinery (the shared-prefix decode attention with its fused and compiled
        # kernels, the prefill thread and the borrowed core, the prepacked oneDNN weights) is
        # chosen here from the model's device. On a GPU the model's own attention (SDPA, which
        # dispatches to flash / memory-efficient kernels) reads the cache at the device's
        # bandwidth and one CUDA stream serialises the forwards anyway, so none of it is used.
        if shared_prefix_attention is None:
            shared_prefix_attention = on_cpu
        self.shared_prefix_attention = shared_prefix_attention
        # the rows' own slots in the compiled kernel where it runs (harnessrl.models.decode_kernel);
        # off (torch's fused kernel in runs) only for comparisons
        self.compiled_attention = True
        if overlap_prefill is None:
            overlap_prefill = on_cpu and _overlap_by_default()
        self.overlap_prefill = overlap_prefill
        if packed_decode is None:
            packed_decode = packed.default_on(model)
        elif packed_decode and not packed.available():
            raise ValueError("packed_decode needs a torch build with oneDNN (torch.backends.mkldnn)")
        self._packed = packed.PackedLinears(model, max_batch) if packed_decode else None
        self._pool: ThreadPoolExecutor | None = None  # the prefill thread, started on first use
        self._inflight: _Prefill | None = None
        self._may_overlap = False  # this step: overlap allowed (not while the model is in train mode)
        self._shared_key: tuple[int, ...] = ()
        self._shared_len = 0
        params = _forward_parameters(model)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in params
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self._kv = _BatchKV(config.num_hidden_layers, kv_heads, head_dim, first.dtype, first.device)
        self.device = first.device
        self.prefix_cache = PrefixCache(cache_budget_tokens)
        self._stats = EngineStats(
            max_batch=max_batch,
            cache_budget_tokens=cache_budget_tokens,
            kv_bytes_per_token=config.num_hidden_layers * 2 * kv_heads * head_dim * first.element_size(),
        )
        self._generation = 0  # bumped when the weights change: older prefixes are stale
        self._weights = self._weights_fingerprint()
        self._rows: list[_Request] = []  # running, row i = self._rows[i]
        self._waiting: deque[_Request] = deque()
        self._by_future: dict[Future, _Request] = {}
        self._finished: list[tuple[Future, Completion]] = []  # completions of the running step (step())
        self._next_id = 0
        self._lock = threading.Lock()  # waiting queue, cancel flags, closed flag
        self._work = threading.Condition(self._lock)  # signalled on submit, close and idle
        self._step_lock = threading.RLock()  # one step at a time (re-entrant: clear_cache inside paused)
        self._thread: threading.Thread | None = None
        self._closed = False
        # Seconds of batched decode steps run so far, and the start of the one running now (None
        # outside one). Every running row takes part in every decode step, so a row's decode_s
        # is this clock when it finishes minus the clock when it joined: two stamps per request
        # and one per step, never a loop over the rows to add a step's time to each.
        self._decode_clock = 0.0
        self._decode_t0: float | None = None
        self._step_finished: list[tuple[Completion, float]] = []  # (completion, its decode mark)

    # ----------------------------------------------------------------------------- public

    def submit(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 256,
        *,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_ids: Sequence[int] | None = None,
        on_token: Callable[[int, float], None] | None = None,
    ) -> Future:
        """Queue one request; its Future resolves to a Completion. Never raises for a bad
        request: the Future carries the ValueError (or EngineClosed) instead. `on_token`: see
        EngineRequest."""
        return self.submit_request(
            EngineRequest(prompt_ids, max_new_tokens, temperature, top_p, seed, stop_ids, on_token)
        )

    def submit_request(self, request: EngineRequest) -> Future:
        future: Future = Future()
        with self._lock:
            self._stats.requests += 1
            if self._closed:
                self._stats.failed += 1
                future.set_exception(EngineClosed("the engine is closed"))
                return future
            try:
                prompt, stops = _check_request(request, self.vocab_size, self.max_context)
            except ValueError as exc:
                self._stats.failed += 1
                future.set_exception(exc)
                return future
            req = _Request(self._next_id, prompt, request, self.stop_ids if stops is None else stops, future)
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
            if not self._rows and self._inflight is None:
                self._kv.release()
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
        """Submit every request and wait for all of them; Completions in order. A failed request
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
        return self

    def close(self) -> None:
        """Stop the driver thread; fail what is still waiting or running with EngineClosed."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._step_lock:
            for req in self._drop_all():
                self._fail(req, EngineClosed("the engine was closed before the request finished"))
            self.prefix_cache.clear()
            if self._packed is not None:
                self._packed.clear()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def clear_cache(self) -> None:
        """Forget every cached prefix (call it after changing what the model computes)."""
        with self._step_lock:
            self._invalidate()
            if self._packed is not None:
                self._packed.clear()  # (a `.data` assignment keeps a weight's identity and version)

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
        return bool(self._waiting or self._rows or self._inflight is not None)

    def _drop_all(self) -> list[_Request]:
        """Take every waiting, prefilling and running request out of the engine (their prefill
        finished first); returns them, for failing."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            with contextlib.suppress(Exception):
                inflight.future.result()
            self._unlock(inflight.req)
        with self._lock:
            pending = list(self._waiting) + list(self._rows) + ([inflight.req] if inflight is not None else [])
            self._waiting.clear()
        self._rows.clear()
        self._kv.release()
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
                with self._step_lock:
                    for req in self._drop_all():
                        self._fail(req, EngineError(f"engine step failed: {type(exc).__name__}: {exc}"))

    def _weights_fingerprint(self) -> tuple[int, int, int]:
        ids = versions = count = 0
        for p in self.model.parameters():
            ids += id(p)
            versions += p._version
            count += 1
        return count, ids, versions

    def _invalidate(self) -> None:
        self._generation += 1
        self.prefix_cache.clear()
        self._stats.cache_clears += 1
        if self._packed is not None:
            self._packed.weights_changed()

    def _step(self) -> bool:
        weights = self._weights_fingerprint()
        if weights != self._weights:
            self._weights = weights
            self._invalidate()
        worked = False
        for req in [r for r in self._rows if r.cancel]:
            self._stats.cancelled += 1
            self._release(req, insert=False)
            req.future.set_exception(CancelledError())
            worked = True
        if self._inflight is not None and (not self._rows or self._stats.decode_steps >= self._inflight.due):
            self._land()  # (waiting for it when there is nothing to decode meanwhile)
            worked = True
        while len(self._rows) + (self._inflight is not None) < self.max_batch:
            if self._inflight is not None and len(self._rows) > _FEW_ROWS:
                break  # one prefill beside the decode steps at a time
            with self._lock:
                if not self._waiting:
                    break
                req = self._waiting.popleft()
                if not req.future.set_running_or_notify_cancel():  # cancelled (Future.cancel) while waiting
                    self._by_future.pop(req.future, None)
                    self._stats.cancelled += 1
                    continue
            req.scheduled_at = time.perf_counter()
            if self._may_overlap and self._rows and self._inflight is None:
                self._launch(req)
            else:
                self._admit(req)
            worked = True
        if self._rows:
            self._decode()
            worked = True
        if self._inflight is not None and self._stats.decode_steps >= self._inflight.due:
            self._land()  # it joins the next decode step
        return worked

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """The model's last-position logits (rows, vocab), float32, on the CPU: each request
        samples there from its own CPU generator, so a seed draws the same noise on any device
        (and the batch's logits cross to the host once per step, not once per row)."""
        # (the callers build their inputs on the model's device already: .to() is a no-op then)
        mask = mask.to(self.device)
        if not self._bool_mask:  # eager attention adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=self._kv.dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(self._kv.dtype).min
            )
        kwargs = {self._cache_arg: cache, "use_cache": True}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=mask,
            position_ids=positions.to(self.device),
            **kwargs,
        )
        return out.logits[:, -1].float().cpu()

    def _admit(self, req: _Request) -> None:
        """Prefill `req` here and now, straight into the next free row of the batch cache."""
        t0 = time.perf_counter()
        row = len(self._rows)
        try:
            self._kv.reserve(row + 1, len(req.prompt) + 1, self.max_batch)
            cached = self._reuse_prefix(req, self._kv, row)
            with self._idle_core_borrowed(), self._packed_forward():
                logits = self._forward(*self._prefill_inputs(req, self._kv, row, cached))[0]
        except Exception as exc:
            self._prefill_failed(req, exc)
            return
        self._stats.prefill_seconds += time.perf_counter() - t0
        self._join(req, row, cached, logits)

    def _launch(self, req: _Request) -> None:
        """Start prefilling `req` on the prefill thread, into a one-row cache of its own (the
        batch cache may grow meanwhile); `_land` brings it into the batch."""
        kv = _BatchKV(*self._kv.shape, self._kv.dtype, self._kv.device)
        try:
            kv.reserve(1, len(req.prompt) + 1, 1)
            cached = self._reuse_prefix(req, kv, 0)
            inputs = self._prefill_inputs(req, kv, 0, cached)
        except Exception as exc:
            self._prefill_failed(req, exc)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harnessrl-prefill")
        per_step = _OVERLAP_TOKENS_PER_STEP if self._packed is None else _OVERLAP_TOKENS_PER_PACKED_STEP
        steps = max(1, -(-(len(req.prompt) - cached) // per_step))
        if self._packed is not None:
            self._packed.acquire()  # released by the prefill thread when its forward is done
        try:
            future = self._pool.submit(self._timed_forward, inputs)
        except BaseException:
            if self._packed is not None:
                self._packed.release()
            raise
        self._inflight = _Prefill(req, kv, cached, future, self._stats.decode_steps + steps)
        self._stats.prefills_overlapped += 1

    @contextlib.contextmanager
    def _idle_core_borrowed(self) -> Iterator[None]:
        """A forward on the engine thread while the prefill thread is idle runs on one more
        intra-op thread: the prefill thread's core. The count is restored before the step goes
        on, and no prefill is launched inside the block, so the two never overlap."""
        if not (self._may_overlap and self._inflight is None):
            yield
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def _timed_forward(self, inputs) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        try:
            # (thread-local, both: the prefill thread sets its own)
            with torch.inference_mode(), packed.engine_forward():
                logits = self._forward(*inputs)
        finally:
            if self._packed is not None:
                self._packed.release()
        return logits, time.perf_counter() - t0

    @contextlib.contextmanager
    def _packed_forward(self) -> Iterator[None]:
        """The packed weights for a forward run here on the engine thread (when packed)."""
        if self._packed is None:
            yield
            return
        with self._packed.swapped_in(), packed.engine_forward():
            yield

    def _land(self) -> None:
        """The prefill thread's request joins the batch (its keys/values copied into a row)."""
        job, self._inflight = self._inflight, None
        req = job.req
        try:
            logits, seconds = job.future.result()
            self._stats.prefill_seconds += seconds
            if req.cancel:
                self._unlock(req)
                self._stats.cancelled += 1
                with self._lock:
                    self._by_future.pop(req.future, None)
                req.future.set_exception(CancelledError())
                return
            row = len(self._rows)
            n = len(req.prompt)
            self._kv.reserve(row + 1, n + 1, self.max_batch)
            self._kv.row(row, n).copy_(job.kv.row(0, n))
        except Exception as exc:
            self._prefill_failed(req, exc)
            return
        self._join(req, row, job.cached, logits[0])

    def _reuse_prefix(self, req: _Request, kv: _BatchKV, row: int) -> int:
        """Copy the longest cached prefix of the prompt into `row` of `kv` and lock it there;
        how many tokens that was."""
        req.generation = self._generation
        if self.prefix_cache.budget_tokens <= 0:
            return 0
        prompt = req.prompt
        match = self.prefix_cache.match(prompt, limit=len(prompt) - 1)
        cached = 0
        for node, take in match.pieces:
            kv.row(row, cached + take)[:, :, :, cached:] = node.kv[:, :, :, :take]
            cached += take
        if cached:
            self.prefix_cache.lock(match.node)
            req.lock = match.node
        return cached

    def _prefill_inputs(self, req: _Request, kv: _BatchKV, row: int, cached: int) -> tuple:
        """(input ids, positions, mask, cache) of the prompt's uncached tokens, for `_forward`."""
        prompt = req.prompt
        width = len(prompt)
        device = kv.device  # the model's: a long prompt's mask is never built on the host and copied
        new = torch.tensor([prompt[cached:]], dtype=torch.long, device=device)
        positions = torch.arange(cached, width, device=device).unsqueeze(0)
        mask = (torch.arange(width, device=device).unsqueeze(0) <= positions.T).view(1, 1, width - cached, width)
        return new, positions, mask, _ForwardCache(kv, kv_len=width, row=row, start=cached)

    def _unlock(self, req: _Request) -> None:
        """Let go of the prefix-cache node the request holds (if any)."""
        if req.lock is not None:
            self.prefix_cache.unlock(req.lock)
            req.lock = None

    def _prefill_failed(self, req: _Request, exc: BaseException) -> None:
        self._unlock(req)
        self._fail(req, EngineError(f"prefill failed: {type(exc).__name__}: {exc}"))

    def _join(self, req: _Request, row: int, cached: int, logits: torch.Tensor) -> None:
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
            node = self.prefix_cache.insert(prompt, self._kv.row(row, len(prompt)))
            if node is not self.prefix_cache.root:
                self.prefix_cache.lock(node)
            self._unlock(req)
            req.lock = node if node is not self.prefix_cache.root else None
        token, logprob = _sample(logits, req)
        req.first_at = time.perf_counter()
        req.decode_mark = self._decode_clock  # it takes part in every decode step from here on
        self._accept(req, token, logprob)

    def _decode(self) -> None:
        t0 = time.perf_counter()
        rows = self._rows
        n = len(rows)
        # `lengths` stays on the host (the attention plan reads it there); the model's inputs are
        # made on its device
        lengths = torch.tensor([r.length for r in rows], dtype=torch.long)
        kv_len = int(lengths.max()) + 1
        self._kv.reserve(n, kv_len, self.max_batch)
        device = self.device
        at = lengths.to(device)
        input_ids = torch.tensor([[r.out_ids[-1]] for r in rows], dtype=torch.long, device=device)
        mask = (torch.arange(kv_len, device=device).unsqueeze(0) <= at.unsqueeze(1)).view(n, 1, 1, kv_len)
        cache = _ForwardCache(self._kv, kv_len=kv_len, positions=at)
        try:
            with contextlib.ExitStack() as stack:
                if self.shared_prefix_attention:
                    runs = uses_fused_kernel(self._kv.dtype, self.device)
                    kernel = self.compiled_attention and uses_compiled_kernel(self._kv.dtype, self.device)
                    plan = make_plan(
                        lengths, kv_len, self._shared_prefix(), self._attn, runs=runs, kernel=kernel, device=self.device
                    )
                    stack.enter_context(decode_plan(self.model, plan))
                stack.enter_context(self._packed_forward())
                stack.enter_context(self._idle_core_borrowed())
                logits = self._forward(input_ids, at.unsqueeze(1), mask, cache)
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
                self._accept(req, *_sample(row_logits, req))
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
            rows = self._rows
            same_weights = len({r.generation for r in rows}) == 1
            self._shared_key = key
            self._shared_len = len(os.path.commonprefix([r.prompt for r in rows])) if same_weights else 0
        return self._shared_len

    def _accept(self, req: _Request, token: int, logprob: float) -> None:
        """Record a sampled token; finish the request when it stops."""
        req.out_ids.append(token)
        req.out_logprobs.append(logprob)
        self._stats.completion_tokens += 1
        if req.on_token is not None:  # one attribute test per token for requests nobody streams
            try:
                req.on_token(token, logprob)
            except Exception:  # noqa: BLE001 - a listener's failure must not end the batch's step
                log.exception("a token listener failed; the request goes on without it")
                req.on_token = None
        if token in req.stops:
            self._finish(req, FINISH_STOP)
        elif len(req.out_ids) >= req.max_new or (
            self.max_context is not None and len(req.prompt) + len(req.out_ids) >= self.max_context
        ):
            self._finish(req, FINISH_LENGTH)

    def _finish(self, req: _Request, reason: str) -> None:
        self._release(req, insert=True)
        self._stats.finished += 1
        with self._lock:
            self._by_future.pop(req.future, None)
        completion = Completion(
            list(req.out_ids),
            list(req.out_logprobs),
            reason,
            len(req.prompt),
            req.cached,
            queue_s=req.scheduled_at - req.submitted_at,
            prefill_s=req.first_at - req.scheduled_at,
            decode_s=self._decode_clock - req.decode_mark,
            ttft_s=req.first_at - req.submitted_at,
        )
        if self._decode_t0 is not None:  # inside a decode step: its decode_s once the step ends
            self._step_finished.append((completion, req.decode_mark))
        self._finished.append((req.future, completion))

    def _release(self, req: _Request, *, insert: bool) -> None:
        """Take the request's row out of the batch (the last row moves into it); before that,
        remember its prompt + fed completion tokens in the prefix cache."""
        cache = self.prefix_cache
        if insert and cache.budget_tokens > 0 and req.generation == self._generation:
            fed = req.prompt + tuple(req.out_ids[:-1])
            assert len(fed) == req.length, (len(fed), req.length)
            cache.insert(fed, self._kv.row(req.row, req.length))
        self._unlock(req)
        last = self._rows[-1]
        if last is not req:
            self._kv.move(last.row, req.row, last.length)
            self._rows[req.row] = last
            last.row = req.row
        self._rows.pop()
        req.row = -1

    def _fail(self, req: _Request, exc: BaseException) -> None:
        with self._lock:
            self._by_future.pop(req.future, None)
        if req.future.done():
            return
        self._stats.failed += 1
        if not req.future.running():
            req.future.set_running_or_notify_cancel()
        req.future.set_exception(exc)
