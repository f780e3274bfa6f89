"""HFPolicy: a local transformers causal LM behind the Policy interface.

Every request goes through one continuous-batching engine (`harnessrl.models.engine.Engine`)
that a background thread drives: `submit` queues one request and returns a Future at once,
`complete` and `generate_ids` submit a list and wait. Requests join the running batch between
decode steps and leave as soon as they stop, and the keys and values of earlier prompts and
completions are reused from the engine's prefix cache (a shared system prompt, an episode's
previous turn), so concurrent episodes never wait for each other's longest row.

Logprobs. For every sampled token we record log softmax(z / T)[token], where z are the model's
raw logits at that step and T the sampling temperature (T = 0, greedy: log softmax(z)[token]).
No shaping (penalties, min_p, top_k, top_p) is applied to these numbers: they are the
log-probabilities a teacher-forced forward pass of prompt + completion gives at the same
temperature (up to float rounding, which batching and prefix reuse change by ~1e-7), which is
what an importance ratio in training compares against. When the sampling parameters shape the
distribution (`SamplingParams.shapes()`), the ModelCall also holds `sampled_logprobs`: each
token's log-probability under the distribution it was actually drawn from (vLLM's fields in
vLLM's order, renormalised; docs/engine.md, "Sampling fields"), what a rollout-trainer mismatch
correction compares the trainer against.

Sampling and seeds. Every request samples with its own torch.Generator, seeded from its
`seed` (the runner sets one per request: see `harnessrl.models.base.request_seed`), so a
request's completion depends on its own prompt and seed only: the same request gives the same
sample alone or beside any others (up to float rounding of batched arithmetic, which could
flip a near-tie), and a resumed process replays it. A request without a seed (a library caller)
gets a hash of (sampling.seed, number of previous calls on this policy, row): a fresh policy
replays the same sequence of calls, successive calls draw fresh noise, and identical requests
in one `complete` call get different samples. The global RNG is never touched.

Stopping. A request stops at the first end-of-turn id (<|im_end|> if the vocabulary has it, the
tokenizer's eos and the model's configured eos ids) or of its own `stop_token_ids` (vLLM's: on
top of the end-of-turn ids), at its own max_new_tokens, or (in `complete` and `submit`) at the
first of its stop strings. The stop token is kept in completion_ids (training sees the stop);
the end-of-turn token is not in the text.

Training the same model. A trainer may wrap `policy.model` (LoRA injected in place) and step an
optimizer between rollouts. The engine drops its prefix cache when the parameters change in
place (it fingerprints their version counters); `paused()` guarantees no engine step overlaps a
training forward or backward.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from harnessrl.models import chat  # noqa: E402
from harnessrl.models.base import (  # noqa: E402
    GenerationRequest,
    ModelUnavailable,
    Policy,
    PolicyError,
    SamplingParams,
)
from harnessrl.models.engine import Engine, EngineCompletion, EngineConfig, usable_cpus  # noqa: E402
from harnessrl.types import ModelCall  # noqa: E402

log = logging.getLogger(__name__)

_threads_configured = False


def configure_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads once per process: `threads` (EngineConfig.threads, whose
    environment override is $HARNESSRL_THREADS), else every CPU this process may run on but one.

    One core is left to the episodes themselves: while the engine thread runs a step, the
    episodes' own threads render prompts, decode completions, run tools and grade, and torch
    threads competing with them for the last core stall the step (an OpenMP region waits for
    its slowest thread). On a 2-core machine, 4 episodes x 2 turns of smollm2-135m through the
    engine ran at 19 (17-21) completion tok/s with 1 thread and 19 (12-20) with 2; without prefix
    reuse, where prefill dominates, 9.3 vs 7.9 tok/s (medians of 3-4 runs, shared machine). A
    single-core machine keeps its one thread.
    """
    global _threads_configured
    if not _threads_configured:
        n = threads if threads is not None else usable_cpus() - 1
        torch.set_num_threads(max(1, n))
        _threads_configured = True
    return torch.get_num_threads()


def call_seed(seed: int, call_index: int, row: int | None = None) -> int:
    """The seed of a request without its own: from (sampling seed, generate call number, row)."""
    key = f"harnessrl:{seed}:{call_index}" + ("" if row is None else f":{row}")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


DEFAULT_MAX_BATCH = 16
DEFAULT_CACHE_BUDGET_TOKENS = 32768


class _EngineSlot:
    """The engine of a model, shared by the policies over it (`HFPolicy.with_sampling`): built
    when the policy is, its thread started by the first request, rebuilt after `close`."""

    def __init__(self, model, stop_ids: Sequence[int], max_batch: int, cache_budget_tokens: int, config: EngineConfig):
        self.model, self.stop_ids = model, list(stop_ids)
        self.max_batch, self.cache_budget_tokens = max_batch, cache_budget_tokens
        self.config = config
        self.lock = threading.Lock()
        self.engine: Engine | None = self._build()
        self.started = False

    def _build(self) -> Engine:
        return Engine(
            self.model,
            self.stop_ids,
            max_batch=self.max_batch,
            cache_budget_tokens=self.cache_budget_tokens,
            config=self.config,
        )

    def running(self) -> Engine:
        with self.lock:
            if self.engine is None:
                self.engine = self._build()
            if not self.started:
                self.engine.start()
                self.started = True
            return self.engine

    def close(self) -> None:
        with self.lock:
            engine, self.engine, self.started = self.engine, None, False
        if engine is not None:
            engine.close()


class HFPolicy(Policy):
    """A transformers causal LM with its tokenizer and chat template, served by an Engine.

    `max_batch`: how many requests decode together (the engine's batch rows; more wait in its
    queue); also this policy's `max_concurrency`. `cache_budget_tokens`: how many tokens of keys
    and values the prefix cache may hold (0 turns prefix reuse off). `engine`: the engine's switches
    (default `EngineConfig.from_env()`); its `threads` sets torch's threads if no policy did yet
    (`configure_threads`). Steps run the model in eval
    mode and restore its mode afterwards; generation_config is never read (SamplingParams are the
    whole story), so the model may be shared with a trainer.
    """

    streams_tokens = True  # `submit` takes on_token: a server can stream tokens as they are sampled

    def __init__(
        self,
        model,
        tokenizer,
        name: str = "hf",
        *,
        tool_role: chat.ToolRole | None = None,
        default_sampling: SamplingParams | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        cache_budget_tokens: int = DEFAULT_CACHE_BUDGET_TOKENS,
        engine: EngineConfig | None = None,
    ):
        engine = engine if engine is not None else EngineConfig.from_env()
        configure_threads(engine.threads)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if cache_budget_tokens < 0:
            raise ValueError(f"cache_budget_tokens must be >= 0, got {cache_budget_tokens}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.tool_role: chat.ToolRole = tool_role or chat.default_tool_role(tokenizer)
        self.default_sampling = default_sampling or SamplingParams()
        self.stop_ids = chat.end_of_turn_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.stop_ids[0] if self.stop_ids else 0)
        self.generate_calls = 0  # calls so far: seeds requests that carry none (saved by the trainer)
        self._calls_lock = threading.Lock()
        self.max_concurrency = max_batch
        self.quantization: dict | None = None  # what `quantize_int8` did, if it ran
        # continue each episode's prompts from the tokens as sampled (`prompt_ids`): every call's
        # prompt then extends the previous call's prompt and completion, which trainers that take an
        # episode as one sequence need (harnessrl.train.episode_sequence); off: the history is
        # rendered from the messages' text, as a server that takes messages would
        self.sampled_history = False
        self._slot = _EngineSlot(model, self.stop_ids, max_batch, cache_budget_tokens, engine)

    @property
    def max_batch(self) -> int:
        return self._slot.max_batch

    @property
    def cache_budget_tokens(self) -> int:
        return self._slot.cache_budget_tokens

    @property
    def engine_config(self) -> EngineConfig:
        return self._slot.config

    def with_sampling(self, sampling: SamplingParams, name: str | None = None) -> HFPolicy:
        """Another policy over the same model AND the same engine (one batch, one prefix cache),
        with its own default sampling and its own call counter."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.__dict__.pop("_submit_pool", None)
        other.name = name or self.name
        other.default_sampling = sampling
        other.generate_calls = 0
        other._calls_lock = threading.Lock()
        return other

    # ----------------------------------------------------------------------------- loading

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        name: str | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
        engine: EngineConfig | None = None,
    ) -> HFPolicy:
        """Any local transformers causal LM folder (config.json, weights, tokenizer), or a
        local .gguf file (dequantized on every load). Never downloads. `engine`: as HFPolicy's."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = Path(path).expanduser()
        if p.is_dir() and (p / "adapter_config.json").is_file():
            return cls.from_adapter(p, name=name, dtype=dtype, device=device, engine=engine)
        if p.is_file() and p.suffix == ".gguf":
            folder, extra = p.parent, {"gguf_file": p.name}
        elif p.is_dir() and (p / "config.json").is_file():
            folder, extra = p, {}
        elif p.is_dir():
            raise ModelUnavailable(f"{p} is not a transformers model folder (no config.json)")
        else:
            raise ModelUnavailable(f"{p} does not exist (hf:PATH wants a local model folder or .gguf file)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **extra)
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True, **extra)
        except Exception as exc:  # noqa: BLE001
            raise ModelUnavailable(f"cannot load a causal LM from {p}: {type(exc).__name__}: {exc}") from exc
        if not getattr(tokenizer, "chat_template", None):
            log.warning("%s has no chat template; using plain ChatML", p)
            tokenizer.chat_template = chat.CHATML_TEMPLATE
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if device is not None:
            model = model.to(device)
        try:
            return cls(model, tokenizer, name=name or f"hf:{p}", engine=engine)
        except ValueError as exc:  # the engine cannot serve this architecture
            raise ModelUnavailable(f"{p}: {exc}") from exc

    @classmethod
    def from_adapter(
        cls,
        folder: str | os.PathLike,
        *,
        name: str | None = None,
        dtype: torch.dtype = torch.float32,
        device=None,
        engine: EngineConfig | None = None,
    ) -> HFPolicy:
        """A peft (LoRA) adapter folder: load its base model (in `dtype`, on `device`), apply the
        adapter, merge it.

        The base is the model spec in the folder's harnessrl.json ("base_model", written by
        `harnessrl train`: tiny-random, smollm2-135m or hf:PATH), else the adapter_config.json's
        base_model_name_or_path when that is a local folder. Never downloads.
        """
        import json

        p = Path(folder).expanduser()
        base_spec = None
        meta = p / "harnessrl.json"
        if meta.is_file():
            try:
                base_spec = json.loads(meta.read_text(encoding="utf-8")).get("base_model")
            except ValueError as exc:
                raise ModelUnavailable(f"{meta} is not valid JSON ({exc})") from exc
        if not base_spec:
            try:
                base_path = json.loads((p / "adapter_config.json").read_text(encoding="utf-8")).get(
                    "base_model_name_or_path"
                )
            except ValueError as exc:
                raise ModelUnavailable(f"{p / 'adapter_config.json'} is not valid JSON ({exc})") from exc
            if not base_path or not Path(base_path).expanduser().is_dir():
                raise ModelUnavailable(
                    f"{p} is a LoRA adapter whose base model ({base_path or 'not named'}) is not a local folder; "
                    f'write {{"base_model": "hf:PATH"}} into {meta}'
                )
            base_spec = f"hf:{base_path}"
        if base_spec.startswith("hf:") and Path(base_spec[3:]).expanduser().resolve() == p.resolve():
            raise ModelUnavailable(f"{p}: the adapter names itself as its base model")
        from peft import PeftModel

        try:
            base = load_local(
                base_spec, device=device, dtype="bfloat16" if dtype == torch.bfloat16 else "float32", engine=engine
            )
        except ValueError as exc:
            raise ModelUnavailable(
                f"{p}: the base model {base_spec!r} is not a local transformers model ({exc})"
            ) from exc
        try:
            model = PeftModel.from_pretrained(base.model, str(p)).merge_and_unload()
        except Exception as exc:  # noqa: BLE001
            raise ModelUnavailable(f"cannot apply the adapter {p} to {base_spec}: {type(exc).__name__}: {exc}") from exc
        model.eval()
        base.close()  # its engine was over the unmerged model
        return cls(model, base.tokenizer, name=name or f"hf:{p}", tool_role=base.tool_role, engine=engine)

    def quantize_int8(self) -> dict:
        """Make every linear layer of this policy's float32 model int8 (`harnessrl.models.int8`),
        in place, for generation only; the engine restarts with the next request. Its outlier
        channels are chosen on the built-in calibration chat, rendered with this tokenizer."""
        from harnessrl.models.int8 import CALIBRATION, Int8Unavailable, quantize_int8
        from harnessrl.types import Message

        if self.quantization is not None:
            raise Int8Unavailable(f"{self.name} is already {self.quantization['kind']}")
        calibration = [
            self.prompt_ids(GenerationRequest(messages=[Message(role=r, content=c) for r, c in turns]))
            for turns in CALIBRATION
        ]
        parameters = self._parameter_count()
        self.close()
        self.quantization = {**quantize_int8(self.model, calibration), "parameters": parameters}
        return self.quantization

    def _parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> dict:
        out = {
            "name": self.name,
            "backend": "transformers",
            "parameters": self._parameter_count(),
            "dtype": str(next(self.model.parameters()).dtype),
            "tool_role": self.tool_role,
            "sampling": self.default_sampling.model_dump(),
            "engine": {"max_batch": self.max_batch, "cache_budget_tokens": self.cache_budget_tokens},
        }
        where = next(self.model.parameters()).device
        if where.type != "cpu":  # (CPU runs describe themselves as they always did)
            out["device"] = str(where)
        if self.quantization is not None:  # linear layers int8, the rest (dtype above) float32
            out["parameters"] = self.quantization["parameters"]
            out["quantization"] = {k: v for k, v in self.quantization.items() if k != "parameters"}
        return out

    # ----------------------------------------------------------------------------- engine

    def engine_stats(self) -> dict:
        """The engine's counters (`EngineStats`: requests, prefilled and cached prompt tokens,
        mean batch occupancy, prefix cache size, ...) since it was built, as a dict."""
        engine = self._slot.engine
        return asdict(engine.stats()) if engine is not None else {}

    def clear_cache(self) -> None:
        """Forget every cached prefix. The engine does this itself when parameters change in
        place; call it after changes it cannot see (an adapter switched off, `.data` assigned),
        or to free the cache's memory before training."""
        engine = self._slot.engine
        if engine is not None:
            engine.clear_cache()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No generation step runs inside this block (requests submitted meanwhile wait): wrap
        training forwards and backwards of this policy's model in it."""
        engine = self._slot.engine
        if engine is None:
            yield
            return
        with engine.paused():
            yield

    def close(self) -> None:
        """Stop the engine thread; requests still in flight fail with PolicyError. A later
        request starts a new engine."""
        self._slot.close()

    # ---------------------------------------------------------------------------- prompts

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt: its conversation rendered by the chat template, or, with
        `sampled_history` and a request that carries the previous call's tokens, those tokens as
        sampled followed by the rendering of the new messages (chat.continue_prompt_ids)."""
        if self.sampled_history and request.sampled_prefix is not None:
            ids = chat.continue_prompt_ids(
                self.tokenizer, request.sampled_prefix, request.messages, self.stop_ids, self.tool_role, request.tools
            )
            if ids is not None:
                return ids
        return chat.render_prompt_ids(self.tokenizer, request.messages, self.tool_role, request.tools)

    def decode(self, ids: Sequence[int]) -> str:
        return chat.decode(self.tokenizer, ids)

    # ------------------------------------------------------------------------- generation

    def _next_call(self) -> int:
        with self._calls_lock:
            index = self.generate_calls
            self.generate_calls += 1
            return index

    def _submit_ids(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        seed: int,
        stop_ids: Sequence[int],
        on_token: Callable[[int, float], None] | None = None,
        stop_token_ids: Sequence[int] = (),
    ) -> Future[EngineCompletion]:
        """One request on the engine with every sampling field of `sampling`; `stop_token_ids`
        stop it too, on top of `stop_ids`."""
        try:
            engine = self._slot.running()
        except Exception as exc:  # noqa: BLE001 - e.g. the engine cannot serve this model
            failed: Future[EngineCompletion] = Future()
            failed.set_exception(exc)
            return failed
        return engine.submit(
            prompt,
            max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            frequency_penalty=sampling.frequency_penalty,
            presence_penalty=sampling.presence_penalty,
            seed=seed,
            stop_ids=list(stop_ids),
            stop_token_ids=list(stop_token_ids),
            on_token=on_token,
        )

    def _failure(self, exc: BaseException) -> PolicyError:
        if isinstance(exc, PolicyError):
            return exc
        return PolicyError(f"{self.name}: generation failed: {type(exc).__name__}: {exc}")

    def submit(
        self,
        request: GenerationRequest,
        sampling: SamplingParams | None = None,
        *,
        on_token: Callable[[int, float], None] | None = None,
    ) -> Future[ModelCall]:
        """Queue one request on the engine; never blocks on generation, safe from any thread.

        The future holds the ModelCall, or a PolicyError that belongs to this request alone
        (a prompt that cannot be rendered, a prompt longer than the model's context, a model
        error while it ran). Cancelling the future takes the request out of the engine.
        `on_token(id, logprob)` is called from the engine's thread for every sampled token, the
        end-of-turn token and tokens past a stop string included (the ModelCall is the truth):
        what `harnessrl serve` streams.
        """
        got_at = time.perf_counter()  # latency_s and ttft_s count the prompt's rendering too
        sampling = sampling or self.default_sampling
        call_index = self._next_call()
        out: Future[ModelCall] = Future()
        try:
            prompt = self.prompt_ids(request)
        except Exception as exc:  # noqa: BLE001
            out.set_exception(PolicyError(f"{self.name}: cannot render the prompt: {type(exc).__name__}: {exc}"))
            return out
        seed = call_seed(sampling.seed, call_index) if request.seed is None else request.seed
        submitted_at = time.perf_counter()
        inner = self._submit_ids(
            prompt, request.max_new_tokens, sampling, seed, self.stop_ids, on_token, request.stop_token_ids
        )
        engine = self._slot.engine

        def resolve(done: Future[EngineCompletion]) -> None:
            if out.cancelled():
                return
            try:
                completion = done.result()
                call = _finished(self.tokenizer, request, prompt, completion)
                _timed(call, completion, got_at, submitted_at)
            except CancelledError:
                out.cancel()
                return
            except Exception as exc:  # noqa: BLE001 - the request's own failure
                _settle(out, exception=self._failure(exc))
                return
            _settle(out, result=call)

        def cancelled(done: Future[ModelCall]) -> None:
            if done.cancelled() and engine is not None:
                engine.cancel(inner)

        out.add_done_callback(cancelled)
        inner.add_done_callback(resolve)
        return out

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        got_at = time.perf_counter()
        if not requests:
            return []
        sampling = sampling or self.default_sampling
        try:
            prompts = [self.prompt_ids(r) for r in requests]
        except Exception as exc:  # noqa: BLE001
            raise PolicyError(f"{self.name}: cannot render the prompt: {type(exc).__name__}: {exc}") from exc
        limits, seeds = [r.max_new_tokens for r in requests], [r.seed for r in requests]
        submitted_at = time.perf_counter()
        outputs = self._completions(prompts, limits, sampling, None, seeds, [r.stop_token_ids for r in requests])
        calls = []
        for request, prompt, (completion, done_at) in zip(requests, prompts, outputs):
            call = _finished(self.tokenizer, request, prompt, completion)
            calls.append(_timed(call, completion, got_at, submitted_at, done_at))
        return calls

    def generate_ids(
        self,
        prompt_ids_batch: list[list[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams | None = None,
        stop_ids: Sequence[int] | None = None,
        seeds: Sequence[int | None] | None = None,
    ) -> list[tuple[list[int], list[float], str]]:
        """Token in, token out: one (completion_ids, logprobs, finish_reason) per prompt.

        `max_new_tokens` is one limit or one per prompt. `stop_ids` defaults to the end-of-turn
        ids; a row ends at the first of them (kept, finish_reason "stop") or at its limit
        ("length"). `seeds`: one sampling seed per prompt (None: derived from sampling.seed and
        the call counter, see the module docstring). All prompts go to the engine at once; a
        backend failure of any of them raises PolicyError (after all have finished).
        """
        outputs = self._completions(prompt_ids_batch, max_new_tokens, sampling, stop_ids, seeds)
        return [(done.ids, done.logprobs, done.finish_reason) for done, _ in outputs]

    def _completions(
        self,
        prompt_ids_batch: list[list[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams | None,
        stop_ids: Sequence[int] | None,
        seeds: Sequence[int | None] | None,
        stop_token_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[tuple[EngineCompletion, float]]:
        """`generate_ids`' work: the engine's EngineCompletion of each prompt, and the perf_counter
        time its future resolved (each request's own end, not the batch's). `stop_token_ids`:
        each prompt's own further stop ids (a request's `stop_token_ids`)."""
        if not prompt_ids_batch:
            return []
        sampling = sampling or self.default_sampling
        n = len(prompt_ids_batch)
        limits = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(limits) != n or min(limits) < 1:
            raise ValueError("max_new_tokens must be >= 1, one value or one per prompt")
        row_seeds = [None] * n if seeds is None else list(seeds)
        if len(row_seeds) != n:
            raise ValueError(f"{len(row_seeds)} seeds for {n} prompts")
        if any(len(p) == 0 for p in prompt_ids_batch):
            raise ValueError("empty prompt")
        stops = self.stop_ids if stop_ids is None else list(stop_ids)
        extra = [()] * n if stop_token_ids is None else list(stop_token_ids)
        call_index = self._next_call()
        futures = [
            self._submit_ids(
                prompt,
                limit,
                sampling,
                call_seed(sampling.seed, call_index, row) if s is None else s,
                stops,
                stop_token_ids=extra[row],
            )
            for row, (prompt, limit, s) in enumerate(zip(prompt_ids_batch, limits, row_seeds))
        ]
        done_at: dict[int, float] = {}

        def stamp(i: int) -> Callable[[Future], None]:
            return lambda _: done_at.__setitem__(i, time.perf_counter())

        for i, future in enumerate(futures):
            future.add_done_callback(stamp(i))
        results, failure = [], None
        for i, future in enumerate(futures):
            try:
                done = future.result()
            except BaseException as exc:  # noqa: BLE001 - raised below, once every request ended
                failure = failure or exc
                continue
            results.append((done, done_at.get(i, time.perf_counter())))
        if failure is not None:
            raise self._failure(failure) from failure
        return results


def _finished(tokenizer, request: GenerationRequest, prompt: list[int], completion: EngineCompletion) -> ModelCall:
    """The ModelCall of a finished request: cut at its stop strings, with the sampled
    distribution's log-probs where its sampling shaped it (cut with the ids)."""
    call = chat.finish_call(tokenizer, request, prompt, completion.ids, completion.logprobs, completion.finish_reason)
    if completion.sampled_logprobs is not None:
        call.sampled_logprobs = list(completion.sampled_logprobs[: len(call.completion_ids)])
    return call


def _timed(
    call: ModelCall, completion: EngineCompletion, got_at: float, submitted_at: float, done_at: float | None = None
) -> ModelCall:
    """`call` with its timings: the engine's queue, prefill and decode seconds; ttft and latency
    from when the policy got the request (the prompt's rendering included) to its first token
    and to now (or `done_at`)."""
    call.latency_s = (time.perf_counter() if done_at is None else done_at) - got_at
    call.queue_s = completion.queue_s
    call.prefill_s = completion.prefill_s
    call.decode_s = completion.decode_s
    call.ttft_s = (submitted_at - got_at) + completion.ttft_s
    return call


def _settle(future: Future, *, result=None, exception: BaseException | None = None) -> None:
    """Resolve `future` unless it was resolved or cancelled meanwhile."""
    if not future.set_running_or_notify_cancel():
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


LOCAL_FORMS = "tiny-random, smollm2-135m, hf:PATH"


def load_local(
    spec: str,
    sampling: SamplingParams | None = None,
    *,
    device=None,
    dtype: str = "float32",
    engine: EngineConfig | None = None,
) -> HFPolicy:
    """A local model spec (tiny-random, smollm2-135m, hf:PATH) as an HFPolicy; ValueError for
    any other form. `sampling` becomes the policy's default SamplingParams; `engine` its engine's
    switches (HFPolicy). `device` (a
    torch.device, default the CPU) and `dtype` ("float32" or "bfloat16"): where the weights go,
    and in what precision, BEFORE the policy (and its engine, whose key/value cache takes the
    model's device and dtype) is built. A float32 CPU model is never moved or cast."""
    spec = spec.strip()
    target = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"load_local takes float32 or bfloat16, not {dtype!r}")

    def placed(model):
        if next(model.parameters()).dtype != target or (device is not None and torch.device(device).type != "cpu"):
            model = model.to(device=device, dtype=target)
        return model

    if spec == "tiny-random":
        from harnessrl.models.embedded import load_tokenizer, tiny_random_model

        return HFPolicy(
            placed(tiny_random_model()), load_tokenizer(), name=spec, default_sampling=sampling, engine=engine
        )
    if spec == "smollm2-135m":
        from harnessrl.models.embedded import load_smollm2, load_tokenizer

        return HFPolicy(placed(load_smollm2()), load_tokenizer(), name=spec, default_sampling=sampling, engine=engine)
    if spec.startswith("hf:"):
        if not spec[3:]:
            raise ValueError("hf:PATH needs a path, e.g. hf:./my-model")
        # read in the target precision straight away: a 9B model never exists in float32 here
        policy = HFPolicy.from_pretrained(spec[3:], dtype=target, device=device, engine=engine)
        if sampling is not None:
            policy.default_sampling = sampling
        return policy
    raise ValueError(f"{spec!r} is not a local model ({LOCAL_FORMS})")
