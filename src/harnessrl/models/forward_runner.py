"""The engine's forward runner: runs what the batch planner planned on the model.

It owns the running rows' keys and values (`BatchKV`: one tensor of shape (layers, 2, rows,
kv_heads, capacity, head_dim); row r holds request r's tokens at slots 0..length-1), the small
transformers Cache adapter through which the model's own attention code writes into them
(`ForwardCache`), the copies between the batch and the prefix cache, the prefill thread, and the
forwards themselves: a prefill of one request's uncached prompt tokens (inline, on the
prefill thread into a one-row cache of its own, or in chunks between decode steps into one),
and a decode step of every row at once, each
row feeding its last token at its own position, rows of different lengths sharing one forward
through a 4D mask that hides each row's unused slots (with the shared-prefix decode attention of
harnessrl.models.attention on a CPU, and the prepacked weights of harnessrl.models.packed where
they are on).

It decides nothing about which request runs when (harnessrl.models.batch_planner) and keeps no
request state but the keys and values: the engine tells it which row and how long.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from harnessrl.models import llama_forward, packed
from harnessrl.models.attention import (
    attention_function,
    decode_plan,
    make_plan,
    uses_compiled_kernel,
    uses_fused_kernel,
)
from harnessrl.models.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from harnessrl.models.batch_planner import RequestState

_CAPACITY_STEP = 256  # batch cache capacity grows in multiples of this many tokens


class ForwardRefused(RuntimeError):
    """A module of the model was called while its engine was closing (`forwards_refused`)."""


class BatchKV:
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

    @property
    def tensor(self) -> torch.Tensor:
        """The buffer (after `reserve`)."""
        if self.buf is None:
            raise RuntimeError("the batch cache holds no rows: reserve() first")
        return self.buf

    def row(self, r: int, length: int) -> torch.Tensor:
        """Row r's first `length` slots: (layers, 2, kv_heads, length, head_dim), a view."""
        return self.tensor[:, :, r, :, :length]

    def move(self, src: int, dst: int, length: int) -> None:
        buf = self.tensor
        buf[:, :, dst, :, :length] = buf[:, :, src, :, :length]

    def release(self) -> None:
        self.buf = None


class ForwardCache(DynamicCache):
    """What the model sees as its cache during one engine forward.

    Each attention layer hands over the keys/values of the new tokens; they are written into
    the batch cache at the rows' own positions, and the layer gets back the rows' cached slots
    up to `kv_len` (unused slots are hidden by the engine's attention mask). Two shapes:
    prefill (one row `row`, tokens at `start`..) and decode (rows 0..n-1, one token each at
    `positions`).
    """

    def __init__(self, kv: BatchKV, *, kv_len: int, row: int = 0, start: int = 0, positions=None):
        super().__init__()
        self.kv = kv
        self.kv_len = kv_len
        self.row = row
        self.start = start
        self.positions = positions  # (n,) long, decode only

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        buf = self.kv.tensor[layer_idx]  # (2, rows, heads, capacity, dim)
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


@dataclass
class Prefill:
    """A prefill running on the prefill thread: into its own one-row cache `kv`, `cached`
    prompt tokens of which came from the prefix cache."""

    req: RequestState
    kv: BatchKV
    cached: int
    future: Future  # (last-position logits (1, vocab), seconds)
    due: int = 0  # joins the batch once this many decode steps have run


@dataclass
class ChunkedPrefill:
    """A prefill run in chunks on the engine thread, one chunk per engine step, into its own
    one-row cache `kv` (the rows keep decoding between its chunks): `cached` prompt tokens came
    from the prefix cache, `done` tokens have keys and values so far; `logits` (vocab,) of the
    last prompt position once the last chunk ran."""

    req: RequestState
    kv: BatchKV
    cached: int
    done: int
    logits: torch.Tensor | None = None
    chunks: int = 0  # chunks run so far

    @property
    def finished(self) -> bool:
        return self.logits is not None


def _forward_parameters(model) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def check_model(model) -> str:
    """The model's attention implementation, or a ValueError when the engine cannot run it."""
    config = model.config
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn not in ("sdpa", "eager"):
        raise ValueError(f"the engine needs sdpa or eager attention; this model uses {attn!r}")
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise ValueError("the engine does not handle sliding-window attention")
    return attn


class ForwardRunner:
    """Forwards of one causal LM for the engine (see the module docstring). `prefix_cache`: where
    prompts' keys and values are copied from (`reuse_prefix`); the engine inserts into it."""

    def __init__(
        self,
        model,
        max_batch: int,
        prefix_cache: PrefixCache,
        *,
        shared_prefix_attention: bool,
        packed_decode: bool,
        fast_decode: bool | None = None,
        merge_lora: bool = True,
    ):
        self._attn = check_model(model)
        config = model.config
        self.model = model
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self.shared_prefix_attention = shared_prefix_attention
        # the rows' own slots in the compiled kernel where it runs (harnessrl.models.decode_kernel);
        # off (torch's fused kernel in runs) only for comparisons
        self.compiled_attention = True
        self._bool_mask = self._attn == "sdpa"
        first = next(model.parameters())
        self.device = first.device
        self.packed = packed.PackedLinears(model, max_batch) if packed_decode else None
        # the engine's own decode forward for Llama models on a CPU (harnessrl.models.llama_forward)
        if fast_decode is None:
            fast_decode = llama_forward.supports(model)
        elif fast_decode and not llama_forward.supports(model):
            raise ValueError("fast_decode needs a float32 Llama model on the CPU (harnessrl.models.llama_forward)")
        self.fast = (
            llama_forward.LlamaDecode(
                model, merge_lora=merge_lora, packed=self.packed, attention_function=attention_function(self._attn)
            )
            if fast_decode
            else None
        )
        self._pool: ThreadPoolExecutor | None = None  # the prefill thread, started on first use
        params = _forward_parameters(model)
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self._logits_to_keep = "logits_to_keep" in params
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.kv = BatchKV(config.num_hidden_layers, kv_heads, head_dim, first.dtype, first.device)
        self.kv_bytes_per_token = config.num_hidden_layers * 2 * kv_heads * head_dim * first.element_size()

    # ------------------------------------------------------------------------- forwards

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """The model's last-position logits (rows, vocab), float32, on the CPU: each request
        samples there from its own CPU generator, so a seed draws the same noise on any device
        (and the batch's logits cross to the host once per step, not once per row)."""
        # (the callers build their inputs on the model's device already: .to() is a no-op then)
        mask = self._model_mask(mask)
        kwargs = {self.cache_arg: cache, "use_cache": True}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=mask,
            position_ids=positions.to(self.device),
            **kwargs,
        )
        return out.logits[:, -1].float().cpu()

    def _model_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A boolean mask as the model's attention implementation takes it."""
        mask = mask.to(self.device)
        if not self._bool_mask:  # eager attention adds the mask to the scores
            mask = torch.zeros(mask.shape, dtype=self.kv.dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(self.kv.dtype).min
            )
        return mask

    def prefill(self, req, row: int, *, borrow: bool) -> tuple[int, torch.Tensor]:
        """Prefill `req.prompt` here and now into `row` of the batch cache: (cached tokens, the
        last position's logits (vocab,)). `borrow`: run on one more intra-op thread."""
        self.kv.reserve(row + 1, len(req.prompt) + 1, self.max_batch)
        cached = self.reuse_prefix(req, self.kv, row)
        with self._idle_core_borrowed(borrow), self._packed_forward():
            logits = self.forward(*self._prefill_inputs(req.prompt, self.kv, row, cached))[0]
        return cached, logits

    def launch(self, req) -> Prefill:
        """Start prefilling `req` on the prefill thread into a one-row cache of its own (the batch
        cache may grow meanwhile); `land` brings it into the batch. The caller sets its `due`."""
        kv, cached = self._own_row(req)
        inputs = self._prefill_inputs(req.prompt, kv, 0, cached)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harnessrl-prefill")
        if self.packed is not None:
            self.packed.acquire()  # released by the prefill thread when its forward is done
        try:
            future = self._pool.submit(self._timed_forward, inputs)
        except BaseException:
            if self.packed is not None:
                self.packed.release()
            raise
        return Prefill(req, kv, cached, future)

    def begin_chunked(self, req) -> ChunkedPrefill:
        """A chunked prefill of `req` into a one-row cache of its own (its cached prefix copied in);
        `prefill_chunk` runs its chunks, `land` brings it into the batch."""
        kv, cached = self._own_row(req)
        return ChunkedPrefill(req, kv, cached, cached)

    def _own_row(self, req) -> tuple[BatchKV, int]:
        """A one-row cache for `req` beside the batch (which may grow meanwhile), its prompt's
        cached prefix copied in: (the cache, cached tokens)."""
        kv = BatchKV(*self.kv.shape, self.kv.dtype, self.kv.device)
        kv.reserve(1, len(req.prompt) + 1, 1)
        return kv, self.reuse_prefix(req, kv, 0)

    def prefill_chunk(self, job: ChunkedPrefill, tokens: int, *, borrow: bool) -> None:
        """The next `tokens` prompt tokens of a chunked prefill (fewer at the end); the last
        chunk sets `job.logits`."""
        prompt = job.req.prompt
        end = min(len(prompt), job.done + tokens)
        with self._idle_core_borrowed(borrow), self._packed_forward():
            logits = self.forward(*self._prefill_inputs(prompt[:end], job.kv, 0, job.done))[0]
        job.done, job.chunks = end, job.chunks + 1
        if end == len(prompt):
            job.logits = logits

    def land(self, job: Prefill | ChunkedPrefill, row: int) -> None:
        """Copy a finished prefill's keys and values into `row` of the batch cache."""
        n = len(job.req.prompt)
        self.kv.reserve(row + 1, n + 1, self.max_batch)
        self.kv.row(row, n).copy_(job.kv.row(0, n))

    def decode(self, lengths: list[int], last_tokens: list[int], shared: int, *, borrow: bool) -> torch.Tensor:
        """One decode step of rows 0..n-1: row r holds `lengths[r]` tokens and feeds
        `last_tokens[r]` at that position; `shared` leading slots hold the same keys and values in
        every row. The logits (n, vocab)."""
        n = len(lengths)
        # `lengths` stays on the host (the attention plan reads it there); the model's inputs are
        # made on its device
        lengths_t = torch.tensor(lengths, dtype=torch.long)
        kv_len = int(lengths_t.max()) + 1
        self.kv.reserve(n, kv_len, self.max_batch)
        device = self.device
        at = lengths_t.to(device)
        input_ids = torch.tensor(last_tokens, dtype=torch.long, device=device).unsqueeze(1)
        fast = self.fast if self.fast is not None and self.fast.usable() else None
        mask = None
        if not (fast is not None and self.shared_prefix_attention):
            mask = (torch.arange(kv_len, device=device).unsqueeze(0) <= at.unsqueeze(1)).view(n, 1, 1, kv_len)
        with contextlib.ExitStack() as stack:
            plan = None
            if self.shared_prefix_attention:
                runs = uses_fused_kernel(self.kv.dtype, device)
                kernel = self.compiled_attention and uses_compiled_kernel(self.kv.dtype, device)
                if n == 1 and kernel:
                    shared = 0  # one row reads its slots once anyway: all of them in the compiled kernel
                plan = make_plan(lengths_t, kv_len, shared, self._attn, runs=runs, kernel=kernel, device=device)
                if fast is None:
                    stack.enter_context(decode_plan(self.model, plan))
            # (the fast forward calls the packed products itself, unless a wrapper calls a layer)
            wrapped = fast is not None and fast.prepare()
            if fast is None or wrapped:
                stack.enter_context(self._packed_forward())
            # A step through wrapped layers (a LoRA adapter's: the base product, then two small
            # ones and their sum per adapted projection) runs on the engine's own threads: on a
            # borrowed core every small product is an OpenMP region that waits for the second
            # thread, which on a busy machine waits for a core (docs/engine.md, "A prefill thread")
            stack.enter_context(self._idle_core_borrowed(borrow and not wrapped))
            if fast is not None:
                return fast(
                    input_ids.view(n),
                    at,
                    self.kv.tensor,
                    kv_len,
                    plan,
                    None if mask is None else self._model_mask(mask),
                ).cpu()
            assert mask is not None  # (made above for the model's own forward)
            cache = ForwardCache(self.kv, kv_len=kv_len, positions=at)
            return self.forward(input_ids, at.unsqueeze(1), mask, cache)

    def _timed_forward(self, inputs) -> tuple[torch.Tensor, float]:
        t0 = time.perf_counter()
        try:
            # (thread-local, both: the prefill thread sets its own)
            with torch.inference_mode(), packed.engine_forward():
                logits = self.forward(*inputs)
        finally:
            if self.packed is not None:
                self.packed.release()
        return logits, time.perf_counter() - t0

    @contextlib.contextmanager
    def _idle_core_borrowed(self, borrow: bool) -> Iterator[None]:
        """A forward on the engine thread while the prefill thread is idle runs on one more
        intra-op thread: the prefill thread's core. The count is restored before the step goes
        on, and no prefill is launched inside the block, so the two never overlap."""
        if not borrow:
            yield
            return
        threads = torch.get_num_threads()
        torch.set_num_threads(threads + 1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    @contextlib.contextmanager
    def _packed_forward(self) -> Iterator[None]:
        """The packed weights for a forward run here on the engine thread (when packed)."""
        if self.packed is None:
            yield
            return
        with self.packed.swapped_in(), packed.engine_forward():
            yield

    # ------------------------------------------------------------------ keys and values

    def reuse_prefix(self, req, kv: BatchKV, row: int) -> int:
        """Copy the longest cached prefix of the prompt into `row` of `kv` and lock it there
        (`req.lock`); how many tokens that was."""
        if self.prefix_cache.budget_tokens <= 0:
            return 0
        prompt = req.prompt
        match = self.prefix_cache.match(prompt, limit=len(prompt) - 1)
        cached = 0
        for node, take in match.pieces:
            assert node.kv is not None, "a matched piece is never the root"
            kv.row(row, cached + take)[:, :, :, cached:] = node.kv[:, :, :, :take]
            cached += take
        if cached:
            self.prefix_cache.lock(match.node)
            req.lock = match.node
        return cached

    @staticmethod
    def _prefill_inputs(prompt: tuple[int, ...], kv: BatchKV, row: int, cached: int) -> tuple:
        """(input ids, positions, mask, cache) of the prompt's uncached tokens, for `forward`."""
        width = len(prompt)
        device = kv.device  # the model's: a long prompt's mask is never built on the host and copied
        new = torch.tensor([prompt[cached:]], dtype=torch.long, device=device)
        positions = torch.arange(cached, width, device=device).unsqueeze(0)
        mask = (torch.arange(width, device=device).unsqueeze(0) <= positions.T).view(1, 1, width - cached, width)
        return new, positions, mask, ForwardCache(kv, kv_len=width, row=row, start=cached)

    def weights_changed(self) -> None:
        if self.packed is not None:
            self.packed.weights_changed()
        if self.fast is not None:
            self.fast.weights_changed()

    def clear(self) -> None:
        """Forget the packed and fused weights (a `.data` assignment keeps a weight's identity and
        version)."""
        if self.packed is not None:
            self.packed.clear()
        if self.fast is not None:
            self.fast.clear()

    @contextlib.contextmanager
    def forwards_refused(self) -> Iterator[None]:
        """Inside this block every module call of the model raises ForwardRefused, so a forward
        running on another thread (a step, a prefill on the prefill thread) stops at its next
        layer instead of running to its end: what closing the engine needs. Nothing is left on
        the model after the block."""

        def refuse(module: torch.nn.Module, args: object) -> None:
            raise ForwardRefused("the engine is closing")

        handles = [m.register_forward_pre_hook(refuse) for m in self.model.modules()]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def close(self) -> None:
        self.kv.release()
        self.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    if hasattr(os, "process_cpu_count"):
        return os.process_cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def overlap_by_default() -> bool:
    """Whether a CPU model's engine prefills on a second thread when not told: with one torch
    thread and a second CPU (two forwards of several threads each would only fight over the cores)."""
    return torch.get_num_threads() == 1 and usable_cpus() >= 2
