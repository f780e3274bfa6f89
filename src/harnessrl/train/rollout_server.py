"""GRPO's rollouts on OpenAI-compatible servers (`harnessrl train grpo --rollout-server URL`).

The trainer keeps its own copy of the model and its LoRA adapter: it computes every log-prob the
loss uses itself (`harnessrl.train.update.recompute_old_logprobs`), so a server only has to sample, from
exactly the distribution the trainer recomputes. Three things make that true on vLLM (docs/scale.md):

**Every policy version under a name and a path never used before** (`publish`). Before the
first rollout and after every optimizer step the trainer's adapter is written into
OUT/rollout-adapters/v{version}-{run_id}/ and every server loads it under the name
`harnessrl-policy-{run_id}-v{version}` (`POST /v1/load_lora_adapter`, never in place). vLLM keys
its prefix-cache blocks by the adapter's name and path: an in-place reload from one folder
would keep serving keys and values computed under older weights, so a rollout would mix policy
versions while its calls say "current". `run_id` is drawn once per launch (a resumed run
gets a new one, so it never meets the names its crashed predecessor left on a long-lived
server) and must be the same in every training process: the name of a version is a pure
function of (run_id, version), so processes that do not publish (`version` is set on them)
request the same name. A version is removed from the servers (`POST /v1/unload_lora_adapter`)
and its folder deleted once no request of this process uses it (`release`, called by every
`publish`) and no collection is bound to it (`pin`). With synchronous rollouts they end before
the optimizer step that makes the next version, so the other processes' requests are over by then
too; with --max-off-policy-steps a collection is bound to the version it was planned under
(`at_version`), pinned by every process until its batch has been gathered from all of them.

**Every sampling field sent** (OpenAIPolicy's `explicit_sampling`): temperature, top_p and the
run's top_k, min_p, repetition_penalty and presence/frequency_penalty (their neutral values,
top_k=0, min_p=0, repetition_penalty=1 and 0, unless the run sets them), so no server default
(vLLM's generation_config.json) changes the distribution. The start-up probe samples with the
neutral values whatever the run sets.

**A start-up probe** (`probe`): one fixed prompt at the run's temperature, the completion's
logprobs compared with the trainer's own teacher-forced recomputation; a server whose
logprobs are raw (vLLM's default), whose defaults truncate or penalise, or that refuses
native tools a harness needs is refused, naming the server flag to add.

**The admin key** (`admin_key`, $HARNESSRL_ADMIN_KEY in the trainer): sent as
`Authorization: Bearer KEY` with every request, so `harnessrl serve` lets the trainer, and only
the trainer, load and unload adapters (its adapter routes need the key), and a vLLM started with
the key as its API key (which then guards every /v1 route) answers it at all. A server that
refuses the key stops the run with one message naming the variable.

`RolloutServers` is a Policy over one or more servers. Each request goes to the server with the
fewest requests outstanding (the first on a tie), with the request's whole 63-bit sampling seed
(both servers take it), and must come back with its token ids (`return_token_ids`): training
needs them. Every ModelCall is stamped with the policy version it was sent under (the current
one, or the version a collection is bound to), so the trainer can report, and bound, how far
behind the weights it trains each call was sampled. `idle_seconds` says how long each server had
no request of this process in flight (the trainer logs it per step).
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.models.base import GenerationRequest, Policy, PolicyError, SamplingParams
from harnessrl.models.openai_compat import OpenAIPolicy, parse_completion
from harnessrl.types import Message, ModelCall
from harnessrl.wire.auth import ADMIN_KEY_ENV, bearer_headers

log = logging.getLogger(__name__)

ADAPTER_PREFIX = "harnessrl-policy"  # adapter names: harnessrl-policy-{run_id}-v{version}
ADAPTERS_DIR = "rollout-adapters"  # OUT/<this>/v{version}-{run_id}: the folders the servers load
LOAD_TIMEOUT_S = 300.0
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")

# The probe. Mean |server - trainer| per token above PROBE_TOLERANCE nats is refused. PPO's clip
# (epsilon 0.2) is a log-ratio band of about +-0.18; a bf16 engine and a trainer's forward over
# the same weights disagree by about 0.01-0.03 nats per token on average (fp32 on a CPU: 1e-5).
# Raw instead of processed logprobs at T = 0.7 are off by |log p| * 0.43 plus a normaliser
# (tenths of a nat at least), and a top_k or top_p that cuts the distribution adds -log(kept
# mass) to every token: 0.05 sits between the precision noise and anything that changes what is
# sampled by more than a quarter of the clip band. The mean, not the max, decides: one token of
# low probability can be off by more in bf16 alone; the max is reported.
PROBE_TOLERANCE = 0.05
PROBE_MAX_TOKENS = 24
PROBE_SEED = 20240601
PROBE_MESSAGES = (
    Message(role="system", content="You are a helpful assistant."),
    Message(role="user", content="Write the numbers from one to twenty in words, separated by commas."),
)
TOOL_PARSER_HINT = "hermes for Qwen2.5/Qwen3, llama3_json for Llama 3.x, mistral for Mistral"

Recompute = Callable[[list[int], list[int], float], list[float]]


class RolloutServerError(RuntimeError):
    """A rollout server cannot be used: unreachable, it refused the adapter, or it does not
    sample what the trainer learns from (the probe)."""


def _http(method: str, url: str, body: dict | None, timeout: float, key: str | None = None) -> tuple[int, str]:
    """(status, text) of one small admin request (the OpenAI client has no LoRA routes), with
    the admin `key` when there is one; OSError when the server cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json", **bearer_headers(key)}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def _root(url: str) -> str:
    """http://host:port/v1 -> http://host:port (the LoRA routes live under /v1 of the root)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _key_refused(request: str, status: int, text: str, sent_key: bool) -> RolloutServerError:
    """The error of a server that answered `request` ("POST URL") with a 401 or 403: which key it
    wants and how to give it."""
    if sent_key:
        why = f"the key in ${ADMIN_KEY_ENV} is not the one it was started with"
    else:
        why = f"it needs its admin key and ${ADMIN_KEY_ENV} is not set"
    return RolloutServerError(
        f"a rollout server refused {request} (HTTP {status}: {text[:200]}): {why}. Set {ADMIN_KEY_ENV} "
        f"to the server's key: harnessrl serve's --admin-key or its own ${ADMIN_KEY_ENV} (a key it drew is "
        "in the 0600 file its start names); vLLM's --api-key (VLLM_API_KEY)"
    )


def new_run_id() -> str:
    """A fresh run id (8 hex digits): draw it once per launch, in one process, and share it."""
    return secrets.token_hex(4)


def adapter_name(run_id: str, version: int) -> str:
    """The name policy `version` of the launch `run_id` is served under (the same in every process)."""
    return f"{ADAPTER_PREFIX}-{run_id}-v{version}"


class _ServerClient(OpenAIPolicy):
    """OpenAIPolicy whose `model` (the adapter name) is chosen per request at submit time, so a
    request is sent under the version it was stamped with even if a new version is published
    before a pool thread builds its body."""

    token_ids_required = True  # a server that refuses return_token_ids cannot serve rollouts

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._names: dict[int, str] = {}
        self._names_lock = threading.Lock()

    def submit_as(self, name: str, request: GenerationRequest, sampling: SamplingParams) -> Future[ModelCall]:
        request = request.model_copy()  # an object of its own: its id names this submission while it lives
        key = id(request)
        with self._names_lock:
            self._names[key] = name
        future = self.submit(request, sampling)

        def forget(_: Future) -> None:  # holds `request` alive until then, so the id stays unique
            with self._names_lock:
                self._names.pop(key, None)

        future.add_done_callback(forget)
        return future

    def _body(
        self, request: GenerationRequest, sampling: SamplingParams, seed: int, logprobs: bool, token_ids: bool = True
    ) -> dict:
        body = super()._body(request, sampling, seed, logprobs, token_ids)
        with self._names_lock:
            body["model"] = self._names.get(id(request), self.model)
        return body


# ------------------------------------------------------------------------------------------ probe


@dataclass
class ProbeCheck:
    """One probe request's comparison: the server's logprobs against the trainer's at T."""

    request: str  # "explicit": the rollouts' own body; "defaults": only OpenAI's fields
    tokens: int
    max_abs_diff: float
    mean_abs_diff: float
    verdict: str  # ok | raw_logprobs | truncated | penalised | mismatch
    evidence: str = ""


@dataclass
class ServerProbe:
    url: str
    checks: list[ProbeCheck] = field(default_factory=list)
    native_tools: bool | None = None  # None: not needed by any harness, not checked


@dataclass
class ProbeReport:
    """What `probe` found; `max_abs_diff` (over every server and request) is what to log."""

    temperature: float
    tolerance: float
    servers: list[ServerProbe]

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for s in self.servers for c in s.checks), default=0.0)

    @property
    def mean_abs_diff(self) -> float:
        return max((c.mean_abs_diff for s in self.servers for c in s.checks), default=0.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "tolerance": self.tolerance,
            "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff,
            "servers": [asdict(s) for s in self.servers],
        }


def diagnose(
    server: Sequence[float],
    at_t: Sequence[float],
    at_1: Sequence[float],
    context: Sequence[int],
    completion: Sequence[int],
    temperature: float,
    tolerance: float = PROBE_TOLERANCE,
) -> tuple[str, str]:
    """(verdict, evidence) for a server's per-token logprobs against the trainer's recomputation
    at the run's temperature (`at_t`) and untempered (`at_1`); `context` is the prompt's ids.

    - ok: the mean |server - at_t| is within `tolerance`;
    - raw_logprobs: they are log softmax(z), before temperature (vLLM's default raw_logprobs);
    - penalised: the tokens the server gives less probability than the trainer are mostly tokens
      already in the prompt or earlier in the completion (a repetition/presence/frequency penalty);
    - truncated: no token has less probability and the rest have more: the distribution was cut
      and renormalised (top_k, top_p, min_p), or a penalty steered the completion to new tokens;
    - mismatch: none of these (another model or adapter, another chat template...).
    """
    n = len(server)
    diff = [s - t for s, t in zip(server, at_t)]
    mean_t = sum(abs(d) for d in diff) / n
    if mean_t <= tolerance:
        return "ok", ""
    if abs(temperature - 1.0) > 1e-6:
        mean_1 = sum(abs(s - u) for s, u in zip(server, at_1)) / n
        if mean_1 <= tolerance:
            return "raw_logprobs", (
                f"they match the untempered log-probs (mean |diff| {mean_1:.4f}) and not those at "
                f"T={temperature:g} (mean |diff| {mean_t:.4f})"
            )
    lower = [i for i, d in enumerate(diff) if d < -tolerance]
    seen_before = [i for i in lower if completion[i] in set(context) or completion[i] in completion[:i]]
    if lower and len(seen_before) * 2 >= len(lower):
        return "penalised", (
            f"{len(seen_before)} of the {len(lower)} tokens the server finds less likely than the trainer "
            "already occur in the prompt or earlier in the completion"
        )
    if not lower:
        # a penalty shows the same way when the completion avoids the penalised tokens (it then
        # samples new ones, each made more likely by the renormalisation): one verdict for both
        return "truncated", (
            f"every token is at least as likely on the server as under the trainer, by {mean_t:.3f} nats on "
            "average: the distribution was cut and renormalised (a top_k, top_p or min_p), or penalised away "
            "from tokens already seen (a repetition, presence or frequency penalty)"
        )
    return "mismatch", f"mean |diff| {mean_t:.4f}, with no pattern of temperature, truncation or penalty"


def teacher_forced(model) -> Recompute:
    """`recompute` for `probe` from the trainer's model (peft or plain): the completion's
    per-token log softmax(z / T), teacher-forced, exactly as the GRPO loss computes them."""

    def recompute(prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
        import torch

        from harnessrl.train.grpo import token_logprobs

        ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
        mask = torch.tensor([[0] * len(prompt_ids) + [1] * len(completion_ids)])
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": mask}
        with torch.no_grad():
            logp = token_logprobs(model, batch, temperature)
        return logp[0, len(prompt_ids) :].tolist()

    return recompute


# ---------------------------------------------------------------------------------------- servers


class RolloutServers(Policy):
    """The trainer's adapter, served by `urls` (each an OpenAI-compatible base URL ending in /v1).

    `run_id`: this launch's id, the same in every training process (`new_run_id()` in one
    process, shared); default: a fresh one, right for a single process. `admin_key`: sent with
    every request (`Authorization: Bearer KEY`; the trainer gives $HARNESSRL_ADMIN_KEY); None
    sends none, for a server without one."""

    def __init__(
        self,
        urls: list[str],
        *,
        run_id: str | None = None,
        max_concurrency: int = 64,
        timeout: float = 600.0,
        max_retries: int = 2,
        admin_key: str | None = None,
    ):
        if not urls:
            raise ValueError("no rollout server given")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--rollout-server: a URL starting with http:// or https:// (got {url!r})")
        run_id = new_run_id() if run_id is None else run_id
        if not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"run_id must be 1-32 letters, digits, '-' or '_' (got {run_id!r})")
        self.urls = [u.rstrip("/") for u in urls]
        self.run_id = run_id
        self.name = f"rollout-servers:{ADAPTER_PREFIX}-{run_id}"
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self._key = admin_key or None  # never in describe() or the run's records
        self.clients = [
            _ServerClient(
                ADAPTER_PREFIX,
                url,
                name=f"{ADAPTER_PREFIX}@{url}",
                max_concurrency=max_concurrency,
                max_retries=max_retries,
                timeout=timeout,
                return_token_ids=True,
                full_seeds=True,
                explicit_sampling=True,
                api_key=self._key,  # None: $OPENAI_API_KEY or EMPTY, as any openai: model
            )
            for url in self.urls
        ]
        self._lock = threading.Lock()
        self._outstanding = [0] * len(self.urls)
        self._in_flight: Counter[int] = Counter()  # version -> this process's requests in flight
        # version -> collections bound to it (`pin`): kept on the servers between their requests
        self._pinned: Counter[int] = Counter()
        # per server: seconds with no request of this process in flight, and since when it is idle
        self._idle_total = [0.0] * len(self.urls)
        self._idle_since: list[float | None] = [time.monotonic()] * len(self.urls)
        self._published: dict[int, Path] = {}  # versions this process loaded and has not removed
        self.sent = [0] * len(self.urls)  # requests each server got (for the run's record)
        self._version: int | None = None

    # -- versions -------------------------------------------------------------------------------------
    @property
    def version(self) -> int | None:
        """Optimizer steps behind the adapter the servers hold (None: none loaded yet). Set it in
        the processes that do not publish, to the version the publishing one loaded."""
        with self._lock:
            return self._version

    @version.setter
    def version(self, value: int | None) -> None:
        with self._lock:
            self._version = value

    @property
    def adapter_name(self) -> str | None:
        """The name requests use now."""
        version = self.version
        return None if version is None else adapter_name(self.run_id, version)

    def folder_of(self, out: Path, version: int) -> Path:
        return Path(out) / ADAPTERS_DIR / f"v{version}-{self.run_id}"

    def _call(self, method: str, url: str, body: dict | None, timeout: float) -> tuple[int, str]:
        """`_http` with the admin key; RolloutServerError naming $HARNESSRL_ADMIN_KEY for a 401 or
        403 (a key does not come right by retrying)."""
        status, text = _http(method, url, body, timeout, self._key)
        if status in (401, 403):
            raise _key_refused(f"{method} {url}", status, text, self._key is not None)
        return status, text

    def check(self) -> list[dict[str, Any]]:
        """GET /v1/models of every server; RolloutServerError naming the first unreachable one."""
        found = []
        for url in self.urls:
            try:
                status, text = self._call("GET", f"{url}/models", None, 30.0)
                if status != 200:
                    raise OSError(f"HTTP {status}: {text[:200]}")
                models = [m.get("id") for m in json.loads(text).get("data", []) if isinstance(m, dict)]
            except (OSError, ValueError, AttributeError) as e:
                raise RolloutServerError(f"rollout server {url} does not answer GET /v1/models: {e}") from None
            found.append({"url": url, "models": models})
        return found

    def publish(self, save: Callable[[Path], None], out: Path, version: int) -> float:
        """Policy `version` on every server: `save(folder)` writes the adapter into a folder of
        its own (OUT/rollout-adapters/v{version}-{run_id}), every server loads it under
        `adapter_name(run_id, version)`, requests use that name from now on, and the versions
        no request uses any more are removed (`release`). Returns the seconds spent."""
        t0 = time.perf_counter()
        folder = self.folder_of(out, version)
        if folder.exists():  # left by an attempt of this launch that failed half way
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        save(folder)
        if not (folder / "adapter_config.json").is_file():
            raise RolloutServerError(f"no peft adapter was written into {folder} (no adapter_config.json)")
        with self._lock:
            self._published[version] = folder  # recorded first: a partial load is still removed later
        # never load_inplace: a new name at a new path is what keeps vLLM's prefix cache honest
        body = {"lora_name": adapter_name(self.run_id, version), "lora_path": str(folder.resolve())}
        for url in self.urls:
            try:
                status, text = self._call("POST", f"{_root(url)}/v1/load_lora_adapter", body, LOAD_TIMEOUT_S)
            except OSError as e:
                raise RolloutServerError(f"rollout server {url}: cannot load the adapter: {e}") from None
            if status >= 400:
                raise RolloutServerError(
                    f"rollout server {url} refused the adapter {body['lora_path']} "
                    f"(HTTP {status}: {text[:300]}); it must read that folder (a shared filesystem) and "
                    "serve LoRA adapters at runtime (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, --enable-lora, "
                    "--max-lora-rank at least the adapter's rank)"
                )
        self.version = version
        self.release()
        return time.perf_counter() - t0

    def release(self) -> list[int]:
        """Remove from every server, and delete the folder of, each version this process
        published that is not the current one and has no request of this process in flight
        (vLLM reloads an evicted adapter from its path, so a folder goes only after its name).
        A server that cannot unload keeps the version for the next call. A pinned version
        (`pin`: a collection still bound to it) stays. Returns those removed."""
        with self._lock:
            idle = [
                v for v in self._published if v != self._version and self._in_flight[v] == 0 and self._pinned[v] == 0
            ]
        removed = []
        for version in sorted(idle):
            body = {"lora_name": adapter_name(self.run_id, version)}
            unloaded = True
            for url in self.urls:
                try:
                    status, text = self._call("POST", f"{_root(url)}/v1/unload_lora_adapter", body, LOAD_TIMEOUT_S)
                except (OSError, RolloutServerError) as e:  # a refused key too: warned, the version kept
                    status, text = 0, str(e)
                if status == 0 or (status >= 400 and status != 404):  # 404: that server never loaded it
                    log.warning("rollout server %s did not unload %s: %s", url, body["lora_name"], text[:500])
                    unloaded = False
            if not unloaded:
                continue
            with self._lock:
                folder = self._published.pop(version)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(version)
        return removed

    def pin(self, version: int) -> None:
        """Keep `version` on the servers until as many `unpin` calls: a collection bound to it
        (`at_version`) may be between two requests, with none in flight, when a newer version is
        published, and it must still find its adapter loaded afterwards."""
        with self._lock:
            self._pinned[version] += 1

    def unpin(self, version: int) -> None:
        with self._lock:
            if self._pinned[version] <= 0:
                raise RuntimeError(f"policy version {version} is not pinned")
            self._pinned[version] -= 1

    def at_version(self, version: int) -> Policy:
        """A Policy whose requests all go to policy `version`, whatever is published meanwhile
        (pin it for as long as the policy is used)."""
        return _AtVersion(self, version)

    def idle_seconds(self) -> list[float]:
        """Per server, the seconds so far (since this object was made) with no request of this
        process in flight."""
        now = time.monotonic()
        with self._lock:
            return [
                total + (now - since if since is not None else 0.0)
                for total, since in zip(self._idle_total, self._idle_since)
            ]

    # -- the probe ------------------------------------------------------------------------------------
    def probe(
        self,
        recompute: Recompute,
        temperature: float,
        *,
        native_tools: bool = False,
        tolerance: float = PROBE_TOLERANCE,
    ) -> ProbeReport:
        """Check that every server samples what the trainer learns from; RolloutServerError (one
        message, naming the server flag to add) when one does not. Call it after the first
        `publish` (it asks for the current adapter) and before the first rollout.

        Per server, one fixed prompt at the run's `temperature` (greedy: compared at 1.0, as the
        trainer does), with logprobs and token ids, twice: with the rollouts' own body (every
        sampling field sent) and with only OpenAI's fields (the server's defaults fill the rest).
        `recompute(prompt_ids, completion_ids, T)` gives the trainer's teacher-forced per-token
        log-probs (`teacher_forced(model)`). Verdicts: `diagnose`. With `native_tools` (some
        harness sends its tools natively) a request with `tools` must be accepted too.
        At T = 1 raw and processed logprobs are the same numbers when nothing cuts the
        distribution, so then the probe cannot, and need not, tell those modes apart."""
        name = self.adapter_name
        if name is None:
            raise RolloutServerError("probe: no adapter is published on the rollout servers yet (publish first)")
        t = temperature if temperature > 0 else 1.0
        report = ProbeReport(temperature=t, tolerance=tolerance, servers=[])
        request = GenerationRequest(messages=list(PROBE_MESSAGES), max_new_tokens=PROBE_MAX_TOKENS, seed=PROBE_SEED)
        sampling = SamplingParams(temperature=temperature, top_p=1.0, seed=PROBE_SEED)
        for url, client in zip(self.urls, self.clients):
            found = ServerProbe(url=url)
            report.servers.append(found)
            explicit = client._body(request, sampling, PROBE_SEED, True)
            explicit = {**{k: v for k, v in explicit.items() if k != "extra_body"}, **explicit.get("extra_body", {})}
            explicit["model"] = name
            defaults = {
                "model": name,
                "messages": explicit["messages"],
                "max_tokens": PROBE_MAX_TOKENS,
                "temperature": temperature,
                "seed": PROBE_SEED,
                "logprobs": True,
                "return_token_ids": True,
            }
            for kind, body in (("explicit", explicit), ("defaults", defaults)):
                check = self._probe_one(url, kind, body, recompute, t, tolerance)
                found.checks.append(check)
                if check.verdict != "ok":
                    raise RolloutServerError(self._refusal(url, check, t, tolerance))
            if native_tools:
                found.native_tools = True
                self._probe_tools(url, name, explicit["messages"])
        log.info("rollout servers probed: max |logprob diff| %.3g at T=%g", report.max_abs_diff, t)
        return report

    def _probe_one(
        self, url: str, kind: str, body: dict, recompute: Recompute, t: float, tolerance: float
    ) -> ProbeCheck:
        try:
            status, text = self._call("POST", f"{url}/chat/completions", body, self.timeout)
        except OSError as e:
            raise RolloutServerError(f"rollout server {url}: the probe request failed: {e}") from None
        if status != 200:
            raise RolloutServerError(f"rollout server {url} refused the probe request (HTTP {status}: {text[:300]})")
        try:
            _, _, prompt_ids, completion_ids, logprobs = parse_completion(json.loads(text))
        except Exception as e:  # noqa: BLE001 - any unreadable answer is the server's fault
            raise RolloutServerError(f"rollout server {url}: unreadable probe answer: {e}") from None
        if not prompt_ids or not completion_ids or len(logprobs) != len(completion_ids):
            raise RolloutServerError(
                f"rollout server {url} answered the probe without token ids and one logprob per token; training "
                "needs both (vLLM and harnessrl serve return them for return_token_ids and logprobs)"
            )
        at_t = recompute(prompt_ids, completion_ids, t)
        at_1 = at_t if t == 1.0 else recompute(prompt_ids, completion_ids, 1.0)
        diffs = [abs(s - r) for s, r in zip(logprobs, at_t)]
        finite = [d for d in diffs if math.isfinite(d)]
        verdict, evidence = diagnose(logprobs, at_t, at_1, prompt_ids, completion_ids, t, tolerance)
        return ProbeCheck(
            request=kind,
            tokens=len(completion_ids),
            max_abs_diff=max(finite) if len(finite) == len(diffs) else math.inf,
            mean_abs_diff=sum(diffs) / len(diffs),
            verdict=verdict,
            evidence=evidence,
        )

    @staticmethod
    def _refusal(url: str, check: ProbeCheck, t: float, tolerance: float) -> str:
        head = (
            f"rollout server {url} does not sample what the trainer learns from: its logprobs for a probe "
            f"completion ({check.tokens} tokens at T={t:g}) differ from the trainer's by {check.mean_abs_diff:.3f} "
            f"nats per token on average (max {check.max_abs_diff:.3f}; tolerance {tolerance:g}): "
            f"{check.evidence}. "
        )
        if check.verdict == "raw_logprobs":
            return head + (
                "It returns raw logprobs (before temperature): restart it with --logprobs-mode processed_logprobs "
                "(and --generation-config vllm, which the recipe also needs; docs/scale.md)."
            )
        if check.request == "defaults":
            return head + (
                "With only OpenAI's fields sent, its own defaults (the model's generation_config.json: a top_k, "
                "top_p, min_p or penalty) change the distribution: restart it with --generation-config vllm."
            )
        if check.verdict in ("truncated", "penalised"):
            return head + (
                "It applies a top_k/top_p/min_p or a penalty although the request sets them neutral (top_k=0, min_p=0, "
                "repetition_penalty=1, presence/frequency_penalty=0): use a server that honours vLLM's sampling fields "
                "(vLLM with --generation-config vllm --logprobs-mode processed_logprobs)."
            )
        return head + (
            "It serves other weights than the trainer's model with its adapter (another base model, dtype or chat "
            "template), or alters sampling in another way."
        )

    def _probe_tools(self, url: str, name: str, messages: list[dict]) -> None:
        tool = {
            "type": "function",
            "function": {
                "name": "probe",
                "description": "A tool of the start-up probe.",
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            },
        }
        body = {"model": name, "messages": messages, "tools": [tool], "max_tokens": 1, "temperature": 0.0}
        try:
            status, text = self._call("POST", f"{url}/chat/completions", body, self.timeout)
        except OSError as e:
            raise RolloutServerError(f"rollout server {url}: the tool probe failed: {e}") from None
        if status >= 400:
            raise RolloutServerError(
                f"rollout server {url} refuses native tool calls (HTTP {status}: {text[:200]}), and a harness of this "
                "run sends its tools natively (protocol.native_tools): restart it with --enable-auto-tool-choice "
                f"--tool-call-parser <parser> ({TOOL_PARSER_HINT}), or use harnesses without native tools."
            )

    # -- requests -------------------------------------------------------------------------------------
    def submit(
        self, request: GenerationRequest, sampling: SamplingParams | None = None, *, version: int | None = None
    ) -> Future[ModelCall]:
        """One request, under policy `version` (default: the version current now)."""
        sampling = sampling or SamplingParams()
        with self._lock:
            if self._version is None:
                raise RolloutServerError("no adapter is loaded on the rollout servers yet (publish first)")
            i = min(range(len(self.urls)), key=lambda k: self._outstanding[k])
            since = self._idle_since[i]
            if self._outstanding[i] == 0 and since is not None:
                self._idle_total[i] += time.monotonic() - since
                self._idle_since[i] = None
            self._outstanding[i] += 1
            self.sent[i] += 1
            version = self._version if version is None else version
            self._in_flight[version] += 1
        inner = self.clients[i].submit_as(adapter_name(self.run_id, version), request, sampling)
        outer: Future[ModelCall] = Future()

        def done(f: Future[ModelCall]) -> None:
            with self._lock:
                self._outstanding[i] -= 1
                if self._outstanding[i] == 0:
                    self._idle_since[i] = time.monotonic()
                self._in_flight[version] -= 1
            if f.cancelled():
                outer.cancel()
                return
            if not outer.set_running_or_notify_cancel():
                return
            exc = f.exception()
            if exc is not None:
                outer.set_exception(exc)
                return
            call = f.result()
            if not call.completion_ids or not call.prompt_ids:
                outer.set_exception(
                    PolicyError(
                        f"rollout server {self.urls[i]} returned no token ids; training needs them "
                        "(the server must honour return_token_ids, as vLLM and harnessrl serve do)"
                    )
                )
                return
            outer.set_result(call.model_copy(update={"policy_version": version}))

        inner.add_done_callback(done)

        def withdraw(f: Future[ModelCall]) -> None:
            if f.cancelled():
                inner.cancel()

        outer.add_done_callback(withdraw)
        return outer

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        return _all_results([self.submit(r, sampling) for r in requests])

    def describe(self) -> dict:
        return {
            "name": self.name,
            "backend": "rollout-servers",
            "servers": self.urls,
            "adapter": self.adapter_name,
            "run_id": self.run_id,
        }


def _all_results(futures: list[Future[ModelCall]]) -> list[ModelCall]:
    """Every future's ModelCall, in order, once all are done; the first failure is raised."""
    wait(futures)
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        raise failed
    return [f.result() for f in futures]


class _AtVersion(Policy):
    """RolloutServers with every request bound to one policy version (`RolloutServers.at_version`)."""

    def __init__(self, servers: RolloutServers, version: int):
        self.servers = servers
        self.version = version
        self.name = f"{servers.name}-v{version}"
        self.max_concurrency = servers.max_concurrency

    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None) -> Future[ModelCall]:
        return self.servers.submit(request, sampling, version=self.version)

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        return _all_results([self.submit(r, sampling) for r in requests])

    def describe(self) -> dict:
        return {**self.servers.describe(), "adapter": adapter_name(self.servers.run_id, self.version)}
