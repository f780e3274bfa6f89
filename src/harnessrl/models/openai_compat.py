"""OpenAIPolicy: any OpenAI-compatible chat completions server behind the Policy interface.

Spec: ``openai:MODEL@BASE_URL``, e.g. ``openai:Qwen/Qwen3-1.7B@http://127.0.0.1:8000/v1`` (vLLM,
SGLang, llama.cpp's server, a hosted API...), parsed by harnessrl.models.spec.ModelSpec.

**For evaluation.** Token in, token out is what training needs, and a chat API is text in, text
out. This backend never re-tokenizes model text, so unless the server reports token ids:
- ``completion_ids == []`` and ``prompt_ids == []``: the ids are unavailable, not zero tokens;
- ``logprobs`` holds the server's per-token log-probabilities when it returns them (one float
  per generated token, so ``len(logprobs) != len(completion_ids)``), or ``[]`` when it does not.
Token ids are used when the server sends them: vLLM's ``return_token_ids`` (``token_ids`` on the
choice, ``prompt_token_ids`` on the response; asked for with ``return_token_ids=True``, which a
policy made from a model spec sets: a server that answers 400 to it is asked again without it,
once, and never asked again if that works) or logprob tokens of the form ``token_id:123``
(vLLM's ``return_tokens_as_token_ids``). Then
``completion_ids`` and ``logprobs`` line up as with the hf backend. Training needs token ids:
use a server that returns them, or the hf backend.
Note that a server's logprobs need not be the hf backend's: vLLM reports raw logprobs (before
temperature) by default.

**Calls.** One chat completion per request, ``max_concurrency`` at a time (a pool of threads that
``submit`` hands requests to, in the order they come; no batching of ours: the server batches), with
temperature / top_p from SamplingParams, ``max_tokens`` and ``stop`` from the request and the
request's own ``seed`` (its low 31 bits: every server accepts that; the runner sets one per
request, see ``harnessrl.models.base.request_seed``; ``full_seeds=True`` sends all 63 bits, for
servers that take them: ``harnessrl serve`` then samples exactly what the local engine would). A
request without one gets a seed derived from (``sampling.seed``, number of earlier requests of this
policy), so attempts of the same prompt get different noise and a fresh policy replays a run's seeds.
``logprobs=True`` is asked for; a server that answers 400 to that is asked again without it,
once, and never asked again if that works.
The other fields of SamplingParams that shape the distribution are sent when the run sets them
(not neutral): ``presence_penalty`` and ``frequency_penalty`` as OpenAI's parameters, and, in
the JSON body beside ``return_token_ids``, vLLM's ``top_k``, ``min_p`` and
``repetition_penalty``; a request's ``stop_token_ids`` go there too. A server that does not know
one refuses the request (never silently ignored here). A request whose sampling shapes the
distribution (``SamplingParams.shapes()``) records the server's per-token logprobs also as
``sampled_logprobs``: vLLM with ``--logprobs-mode processed_logprobs`` reports the log-probability
under the distribution each token was drawn from (after penalties, min_p, top_k and top_p).
``explicit_sampling=True`` (the rollout servers of training) also sends every one of those fields
that the run leaves neutral, at its neutral value: ``presence_penalty=0``,
``frequency_penalty=0``, ``top_k=0``, ``min_p=0`` and ``repetition_penalty=1``. vLLM fills each
field a request does not send from the model's generation_config.json (instruct models ship a
top_k or a repetition penalty there) unless it runs with ``--generation-config vllm``; sent, they
are what the request says. Off by default: hosted APIs refuse the fields that are not OpenAI's.

**Failures are infrastructure errors.** 429, 5xx, connection errors, timeouts and malformed
responses (not JSON, no choices, no content and no tool calls) are retried with exponential
backoff and jitter (``backoff_base_s * 2**k``, at most ``backoff_max_s``, then a random
fraction between 1/2 and 1 of that), ``max_retries`` times; any other 4xx is not retried. Then
that request's outcome is a PolicyError, which the runner records as an infrastructure error of
that request's episode alone (termination ``error``), never as a model failure. A failure
belongs to its request: ``submit`` gives each request its own future, and every other request
completes as usual; ``complete`` (all or nothing) raises the first request's error once every
request has its outcome.

**Native tools** (``GenerationRequest.native_tools``: a harness's ``protocol.native_tools``,
or an agent's tools on the recording endpoint): the request's tools are sent as OpenAI
``tools``, and the ``tool_calls`` the server returns are the ModelCall's ``tool_calls``, as data
(``text`` is the message's content, the prose around them); no tool-call text is written or
read here. Calls whose arguments are not a JSON object give no calls and a ``tool_call_error``
saying so: the harness records a malformed reply (a model failure), not a crash.
In the history, an assistant Message with ``tool_calls`` is sent with them (each call's own id,
else ``call_<message>_<k>``), and a ``tool`` message answers a call: the one its
``tool_call_id`` names, else the first unanswered call of the message before it, the others
then answered "(see the previous tool result)" (a harness sends one observation for all of a
reply's calls). A call left unanswered when the next message comes is answered "(no result was
sent for this call)", as chat completions require. A ``tool`` message that answers no call is
sent as a ``user`` message starting ``Tool result (NAME):``, as the local backends do for SmolLM2.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal

import openai

from harnessrl.models.base import GenerationRequest, Policy, PolicyError, SamplingParams
from harnessrl.models.chat import tool_message_as_user
from harnessrl.models.spec import OPENAI_FORM, ModelSpec
from harnessrl.types import Message, ModelCall, ToolCall, ToolSchema

log = logging.getLogger(__name__)

NO_KEY = "EMPTY"  # what vLLM and most local servers accept when they check no key
_TOKEN_ID = re.compile(r"token_id:(\d+)")
_ERROR_CHARS = 300  # how much of a server's error message goes into PolicyError


def resolve_api_key(api_key_env: str | None = None) -> str:
    """The key from $api_key_env (which must be set), else $OPENAI_API_KEY, else "EMPTY"."""
    if api_key_env:
        value = os.environ.get(api_key_env)
        if not value:
            state = "is empty" if value == "" else "is not set"
            raise ValueError(
                f"the API key variable ${api_key_env} {state} (export {api_key_env}=... or drop the option)"
            )
        return value
    return os.environ.get("OPENAI_API_KEY") or NO_KEY


SEED_MASK = 0x7FFFFFFF  # 31-bit seeds: every server accepts them
# vLLM's sampling fields beyond OpenAI's, at the values that leave the distribution untouched
NEUTRAL_VLLM_SAMPLING: dict[str, Any] = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def counter_seed(seed: int, request_index: int) -> int:
    """The 31-bit seed of a request without its own: from (sampling seed, request number)."""
    digest = hashlib.sha256(f"harnessrl-openai:{seed}:{request_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & SEED_MASK


# ----------------------------------------------------------------------------------- messages


def tool_definitions(tools: list[ToolSchema]) -> list[dict]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


UNANSWERED = "(no result was sent for this call)"
ANSWERED_ABOVE = "(see the previous tool result)"


def to_openai_messages(messages: list[Message]) -> list[dict]:
    """harnessrl messages -> OpenAI chat messages (see the module docstring for tool turns)."""
    out: list[dict] = []
    pending: list[str] = []  # ids of the previous assistant message's calls still unanswered

    def answer_the_rest(content: str) -> None:
        out.extend({"role": "tool", "tool_call_id": call_id, "content": content} for call_id in pending)
        pending.clear()

    for i, m in enumerate(messages):
        if m.role == "tool":
            if m.tool_call_id is not None:  # it answers one call, by its id
                out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
                if m.tool_call_id in pending:
                    pending.remove(m.tool_call_id)
            elif pending:  # one result for all of the previous message's calls: on the first id
                out.append({"role": "tool", "tool_call_id": pending.pop(0), "content": m.content})
                answer_the_rest(ANSWERED_ABOVE)
            else:
                out.append({"role": "user", "content": tool_message_as_user(m)})
            continue
        answer_the_rest(UNANSWERED)  # every call needs an answer before the next message
        if m.role == "assistant" and m.tool_calls:
            ids = [c.id or f"call_{i}_{k}" for k, c in enumerate(m.tool_calls)]
            pending.extend(ids)
            out.append(
                {
                    "role": "assistant",
                    "content": m.content or None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
                        }
                        for call_id, c in zip(ids, m.tool_calls)
                    ],
                }
            )
            continue
        out.append({"role": m.role, "content": m.content})
    answer_the_rest(UNANSWERED)
    return out


def read_tool_calls(entries: list[Any]) -> tuple[list[ToolCall] | None, str | None]:
    """OpenAI ``message.tool_calls`` -> (the calls, None), or (None, what was wrong) when some
    call's arguments are not a JSON object (the model's failure: the harness records a malformed
    reply). (None, None) for no calls. Raises _Malformed on entries that are not shaped like tool
    calls at all (a server fault, retried)."""
    calls: list[ToolCall] = []
    problems: list[str] = []
    for tc in entries:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _Malformed(f"a tool call without a function name: {str(tc)[:120]}")
        raw = fn.get("arguments")
        args: Any = raw
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            args = {}
        elif isinstance(raw, str):
            try:
                args = json.loads(raw)
            except ValueError:
                pass
        if not isinstance(args, dict):
            shown = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
            problems.append(f"the arguments of the {fn['name']} call are not a JSON object: {shown[:200]}")
            continue
        call_id = tc.get("id")
        calls.append(ToolCall(name=fn["name"], arguments=args, id=call_id if isinstance(call_id, str) else None))
    if problems:
        return None, "; ".join(problems)
    return calls or None, None


# ----------------------------------------------------------------------------------- responses


class _Malformed(Exception):
    """The server answered 200 with something that is not a usable chat completion."""


class _Retryable(Exception):
    """A failure worth another try (429, 5xx, connection, timeout, malformed response)."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _number_list(values: Any) -> list[int] | None:
    if isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return list(values)
    return None


def usage_counts(data: Any) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from the response's `usage`, when the server sends it."""
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(usage, dict):
        return None, None

    def count(key: str) -> int | None:
        v = usage.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    return count("prompt_tokens"), count("completion_tokens")


@dataclass
class Completion:
    """What one chat completion body says (`read_completion`)."""

    text: str  # the message's content ("" when it has none)
    finish_reason: Literal["stop", "length"]
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    tool_calls: list[ToolCall] | None = None  # the message's tool calls, as data
    tool_call_error: str | None = None  # tool calls whose arguments are not a JSON object


def parse_completion(data: Any) -> tuple[str, str, list[int], list[int], list[float]]:
    """A chat completion body -> (content, finish_reason, prompt_ids, completion_ids, logprobs)."""
    c = read_completion(data)
    return c.text, c.finish_reason, c.prompt_ids, c.completion_ids, c.logprobs


def read_completion(data: Any) -> Completion:
    """A chat completion body -> its Completion; _Malformed for a body that is not one."""
    if not isinstance(data, dict):
        raise _Malformed(f"the body is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        err = data.get("error")
        raise _Malformed("no choices in the response" + (f" (error: {str(err)[:_ERROR_CHARS]})" if err else ""))
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _Malformed("the first choice has no message")
    finish: Literal["stop", "length"] = "length" if choice.get("finish_reason") == "length" else "stop"
    content = message.get("content")
    entries = message.get("tool_calls") or []
    if not isinstance(entries, list):
        raise _Malformed("message.tool_calls is not a list")
    if content is None and not entries:
        if finish != "length":  # a reasoning model that spent every token thinking has no content
            raise _Malformed("the message has neither content nor tool calls")
        content = ""
    if not isinstance(content, (str, type(None))):
        raise _Malformed(f"message.content is a {type(content).__name__}, not a string")
    tool_calls, tool_call_error = read_tool_calls(entries)

    logprobs: list[float] = []
    token_strings: list[Any] = []
    lp = choice.get("logprobs")
    lp_entries = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(lp_entries, list):
        try:
            logprobs = [float(e["logprob"]) for e in lp_entries]
            token_strings = [e.get("token") for e in lp_entries]
        except (TypeError, KeyError, ValueError):
            log.debug("unreadable logprobs in the response; recording none")
            logprobs, token_strings = [], []
    completion_ids = _number_list(choice.get("token_ids")) or []
    if not completion_ids and token_strings:
        found = [_TOKEN_ID.fullmatch(t) if isinstance(t, str) else None for t in token_strings]
        if all(found):
            completion_ids = [int(f.group(1)) for f in found]  # type: ignore[union-attr]
    if completion_ids and logprobs and len(completion_ids) != len(logprobs):
        log.warning(
            "server sent %d token ids but %d logprobs; keeping the ids only", len(completion_ids), len(logprobs)
        )
        logprobs = []
    prompt_ids = _number_list(data.get("prompt_token_ids")) or []
    return Completion(content or "", finish, prompt_ids, completion_ids, logprobs, tool_calls, tool_call_error)


# ------------------------------------------------------------------------------------ policy


class OpenAIPolicy(Policy):
    """A model served behind an OpenAI-compatible ``/chat/completions`` endpoint.

    ``api_key``: used as given; else ``$api_key_env`` (must be set), else ``$OPENAI_API_KEY``,
    else "EMPTY". ``sleep`` replaces time.sleep between retries (tests).
    """

    native_tool_calls = True
    token_ids_required = False  # see _without_optional_fields

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        name: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        default_sampling: SamplingParams | None = None,
        max_concurrency: int = 16,
        max_retries: int = 4,
        timeout: float = 300.0,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
        logprobs: bool = True,
        return_token_ids: bool = False,
        full_seeds: bool = False,
        explicit_sampling: bool = False,
        sleep: Callable[[float], None] | None = None,
    ):
        if not model:
            raise ValueError(f"no model name: {OPENAI_FORM}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the base URL must start with http:// or https://, got {base_url!r}")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.name = name or f"openai:{model}@{self.base_url}"
        self.api_key_env = api_key_env
        self.default_sampling = default_sampling or SamplingParams()
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.logprobs = logprobs  # turned off for good once the server rejects the parameter
        self.return_token_ids = return_token_ids
        # send a request's whole 63-bit seed, not its low 31 bits: for servers known to take it
        # (harnessrl serve, vLLM), so that they sample exactly what the in-process engine would
        self.full_seeds = full_seeds
        # every sampling field at its neutral value, so no server default (vLLM's
        # generation_config.json) changes the distribution a trainer recomputes (module docstring)
        self.explicit_sampling = explicit_sampling
        self._sleep = sleep
        self._lock = threading.Lock()
        self._requests_issued = 0
        self._pool: ThreadPoolExecutor | None = None  # made by the first submit
        self._rng = random.Random()
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key if api_key is not None else resolve_api_key(api_key_env),
            max_retries=0,  # retries are ours: backoff, and PolicyError when they run out
            timeout=timeout,
        )

    @classmethod
    def from_spec(cls, spec: str | ModelSpec, sampling: SamplingParams | None = None, **kwargs) -> OpenAIPolicy:
        """The policy of an ``openai:MODEL@BASE_URL`` model spec; ValueError for another form.
        It asks for token ids (``return_token_ids``, unless `kwargs` says otherwise): vLLM and
        `harnessrl serve` send them, and a server that refuses the field is asked without it."""
        parsed = spec if isinstance(spec, ModelSpec) else ModelSpec.parse(spec)
        if parsed.kind != "openai":
            raise ValueError(f"{parsed.text!r} is not an openai: spec: {OPENAI_FORM}")
        kwargs.setdefault("return_token_ids", True)
        return cls(parsed.name, parsed.base_url, default_sampling=sampling, **kwargs)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "backend": "openai",
            "model": self.model,
            "base_url": self.base_url,
            "logprobs": self.logprobs,
            "return_token_ids": self.return_token_ids,
            "full_seeds": self.full_seeds,
            "explicit_sampling": self.explicit_sampling,
            "api_key_env": self.api_key_env,
            "max_concurrency": self.max_concurrency,
            "max_retries": self.max_retries,
            "sampling": self.default_sampling.model_dump(),
        }

    # -------------------------------------------------------------------------------- calls

    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None) -> Future[ModelCall]:
        """Send one request (on one of ``max_concurrency`` threads; the rest wait their turn).

        The future holds its ModelCall or its PolicyError. Cancelling it withdraws the request:
        one still waiting is never sent, one waiting to retry gives up (the reply of one on the
        wire is dropped)."""
        sampling = sampling or self.default_sampling
        with self._lock:
            index = self._requests_issued
            self._requests_issued += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="harnessrl-openai")
            pool = self._pool
        if request.seed is None:
            seed = counter_seed(sampling.seed, index)
        else:
            seed = request.seed if self.full_seeds else request.seed & SEED_MASK
        future: Future[ModelCall] = Future()
        pool.submit(self._serve, request, sampling, seed, future, time.perf_counter())
        return future

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        """All requests at once (up to the cap); raises the first failed request's PolicyError
        once every request has its outcome. Interrupted, it withdraws the requests not done."""
        futures = [self.submit(r, sampling) for r in requests]
        try:
            wait(futures)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            raise failed
        return [f.result() for f in futures]

    def _serve(
        self, request: GenerationRequest, sampling: SamplingParams, seed: int, future: Future, submitted_at: float
    ) -> None:
        """Runs on a pool thread: answers `future` unless it was cancelled meanwhile. The future
        stays pending until then, so the caller can cancel it at any point.

        The call's latency_s runs from `submit` (the wait for a free pool thread and every retry
        included) to the parsed reply. A server's own queue, prefill and decode are not in a chat
        completion's reply, and it is not streamed, so those (and ttft_s) stay None."""
        if future.cancelled():
            return
        withdrawn = threading.Event()
        future.add_done_callback(lambda _: withdrawn.set())  # a cancel wakes a retry's wait
        try:
            done = self._complete_one(request, sampling, seed, withdrawn)
            done.latency_s = time.perf_counter() - submitted_at
            call: ModelCall | None = done
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - the caller gets it from the future
            call, error = None, exc
        if not future.set_running_or_notify_cancel():
            return  # cancelled while it ran: nobody waits for it
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(call)

    def _complete_one(
        self, request: GenerationRequest, sampling: SamplingParams, seed: int, abort: threading.Event
    ) -> ModelCall:
        attempt = 0
        while True:
            if abort.is_set():
                raise PolicyError(f"{self.name}: request withdrawn")
            try:
                data = self._request_once(request, sampling, seed)
                c = read_completion(data)
                n_prompt, n_completion = usage_counts(data)
                # the server's per-token log-probs of a shaped request are of the distribution
                # the tokens were drawn from (vLLM with --logprobs-mode processed_logprobs)
                shaped = sampling.shapes() and bool(c.logprobs) and len(c.logprobs) == len(c.completion_ids)
                return ModelCall(
                    prompt_ids=c.prompt_ids,
                    completion_ids=c.completion_ids,
                    logprobs=c.logprobs,
                    sampled_logprobs=list(c.logprobs) if shaped else None,
                    text=c.text,
                    finish_reason=c.finish_reason,
                    messages=list(request.messages),
                    tool_calls=c.tool_calls,
                    tool_call_error=c.tool_call_error,
                    n_prompt_tokens=None if c.prompt_ids else n_prompt,
                    n_completion_tokens=None if c.completion_ids else n_completion,
                )
            except _Retryable as exc:
                if attempt >= self.max_retries:
                    tries = f"{attempt + 1} attempt{'s' if attempt else ''}"
                    raise PolicyError(f"{self.name}: {exc} (gave up after {tries})") from None
                delay = self._backoff(attempt, exc.retry_after)
                log.info("%s: %s; retry %d/%d in %.2f s", self.name, exc, attempt + 1, self.max_retries, delay)
                if self._sleep is not None:
                    self._sleep(delay)
                elif abort.wait(delay):
                    raise PolicyError(f"{self.name}: {exc} (stopped: the request was withdrawn)") from None
                attempt += 1
            except PolicyError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever the client raised is a backend failure
                raise PolicyError(f"{self.name}: request failed: {type(exc).__name__}: {exc}") from exc

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        delay *= 0.5 + 0.5 * self._rng.random()  # jitter: clients failing together retry apart
        if retry_after is not None and 0 < retry_after <= 60:
            delay = max(delay, retry_after)  # the server said when; believe it (within reason)
        return delay

    def _body(
        self, request: GenerationRequest, sampling: SamplingParams, seed: int, logprobs: bool, token_ids: bool = True
    ) -> dict:
        native = bool(request.native_tools and request.tools)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(request.messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
            "max_tokens": request.max_new_tokens,
        }
        if request.stop:
            kwargs["stop"] = list(request.stop)
        if native:
            kwargs["tools"] = tool_definitions(request.tools or [])
        if logprobs:
            kwargs["logprobs"] = True
        extra: dict[str, Any] = {}
        # OpenAI's penalties as parameters, vLLM's own sampling fields in the JSON body (the openai
        # client has no parameters for them; top_k 0 is "off", vLLM also takes -1 but prefers 0):
        # each one the run sets, and every one at its neutral value with explicit_sampling
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(sampling, name)
            if value != 0.0 or self.explicit_sampling:
                kwargs[name] = value
        for name, neutral in NEUTRAL_VLLM_SAMPLING.items():
            value = 0 if name == "top_k" and sampling.top_k == -1 else getattr(sampling, name)
            if value != neutral or self.explicit_sampling:
                extra[name] = value
        if request.stop_token_ids:
            extra["stop_token_ids"] = list(request.stop_token_ids)
        if self.return_token_ids and token_ids:
            extra["return_token_ids"] = True
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _request_once(self, request: GenerationRequest, sampling: SamplingParams, seed: int):
        try:
            data = self._post(self._body(request, sampling, seed, self.logprobs))
        except openai.BadRequestError as exc:
            data = self._without_optional_fields(request, sampling, seed, exc)
        try:
            read_completion(data)  # validated here so a malformed body is retried like a 5xx
            return data
        except _Malformed as exc:
            raise _Retryable(f"malformed response: {exc}") from None

    def _without_optional_fields(
        self, request: GenerationRequest, sampling: SamplingParams, seed: int, refused: openai.BadRequestError
    ) -> Any:
        """A 400 to a request asking for token ids or logprobs: maybe the server does not know
        those fields (a hosted API refuses `return_token_ids`, some servers refuse logprobs).
        Ask again without `return_token_ids`, then also without logprobs; the first that works
        is remembered (those fields are never asked for again). None works: the first 400 is
        the request's PolicyError. A policy whose `token_ids_required` (training's rollout
        servers) never drops token ids: without them there is nothing to train on."""
        drop_ids = self.return_token_ids and not self.token_ids_required
        if drop_ids:
            try:
                data = self._post(self._body(request, sampling, seed, self.logprobs, token_ids=False))
            except openai.BadRequestError:
                pass
            else:
                self._forget("return_token_ids", refused)
                return data
        if self.logprobs:
            try:
                data = self._post(self._body(request, sampling, seed, False, token_ids=not drop_ids))
            except openai.BadRequestError:
                pass
            else:
                if drop_ids:
                    self._forget("return_token_ids", refused)
                self._forget("logprobs", refused)
                return data
        raise PolicyError(self._status_message(refused)) from None

    def _forget(self, field: str, refused: openai.BadRequestError) -> None:
        if getattr(self, field):
            log.warning("%s rejected %s=True (%s); asking without it from now on", self.name, field, refused)
        setattr(self, field, False)

    def _post(self, body: dict) -> Any:
        """POST /chat/completions -> the decoded JSON body. Retryable failures raise _Retryable,
        other HTTP errors raise openai.APIStatusError subclasses."""
        try:
            raw = self.client.chat.completions.with_raw_response.create(**body)
        except openai.APITimeoutError:
            raise _Retryable(f"timed out after {self.timeout:g} s") from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise _Retryable(f"cannot connect to {self.base_url}: {type(cause).__name__}: {cause}") from None
        except openai.APIStatusError as exc:
            if exc.status_code == 429 or exc.status_code >= 500:
                raise _Retryable(self._status_message(exc, prefix=False), _retry_after(exc)) from None
            if isinstance(exc, openai.BadRequestError):
                raise
            raise PolicyError(self._status_message(exc)) from None
        try:
            return json.loads(raw.http_response.content)
        except ValueError as exc:
            raise _Retryable(f"malformed response: the body is not JSON ({exc})") from None

    def _status_message(self, exc: openai.APIStatusError, prefix: bool = True) -> str:
        detail = exc.message
        body = exc.body
        if isinstance(body, dict):
            inner = body.get("error", body)
            if isinstance(inner, dict) and inner.get("message"):
                detail = str(inner["message"])
            elif isinstance(inner, str):
                detail = inner
        detail = " ".join(str(detail).split())[:_ERROR_CHARS]
        msg = f"HTTP {exc.status_code}: {detail}"
        return f"{self.name}: {msg}" if prefix else msg


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
