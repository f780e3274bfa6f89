"""GRPO's rollouts on OpenAI-compatible servers (`harnessrl train grpo --rollout-server URL`).

The trainer keeps its own copy of the model and its LoRA adapter: it computes every log-prob the
loss uses itself (`Trainer._recompute_old_logprobs`), so a server only has to sample. Before the
first rollout and after every optimizer step, the trainer saves the adapter into
OUT/rollout-adapter and asks every server to load it under one adapter name, in place
(`POST /v1/load_lora_adapter` with `load_inplace: true`, the runtime LoRA route of vLLM and of
`harnessrl serve`); then the rollouts request that name. Full-weight synchronisation is not done:
only the adapter moves.

`RolloutServers` is a Policy over one or more servers. Each request goes to the server with the
fewest requests outstanding (the first on a tie), with the request's whole 63-bit sampling seed
(both servers take it), and must come back with its token ids (`return_token_ids`): training
needs them. Every ModelCall is stamped with the policy version the servers held when it was
sent (the number of optimizer steps behind the adapter loaded), so the trainer can report how
far behind the weights it trains each call was sampled.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

from harnessrl.models.base import GenerationRequest, Policy, PolicyError, SamplingParams
from harnessrl.types import ModelCall

ADAPTER_NAME = "harnessrl-policy"  # the name the trainer's adapter is served under
ADAPTER_DIR = "rollout-adapter"  # OUT/<this>: the adapter the servers load
LOAD_TIMEOUT_S = 300.0


class RolloutServerError(RuntimeError):
    """A rollout server cannot be used: unreachable, or it refused the adapter."""


def _http(method: str, url: str, body: dict | None, timeout: float) -> tuple[int, str]:
    """(status, text) of one small admin request (the OpenAI client has no LoRA routes);
    OSError when the server cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def _root(url: str) -> str:
    """http://host:port/v1 -> http://host:port (the LoRA routes live under /v1 of the root)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class RolloutServers(Policy):
    """The trainer's adapter, served by `urls` (each an OpenAI-compatible base URL ending in /v1)."""

    def __init__(
        self,
        urls: list[str],
        *,
        adapter_name: str = ADAPTER_NAME,
        max_concurrency: int = 64,
        timeout: float = 600.0,
        max_retries: int = 2,
    ):
        from harnessrl.models.openai_compat import OpenAIPolicy

        if not urls:
            raise ValueError("no rollout server given")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--rollout-server: a URL starting with http:// or https:// (got {url!r})")
        self.urls = [u.rstrip("/") for u in urls]
        self.adapter_name = adapter_name
        self.name = f"rollout-servers:{adapter_name}"
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.clients = [
            OpenAIPolicy(
                adapter_name,
                url,
                name=f"{adapter_name}@{url}",
                max_concurrency=max_concurrency,
                max_retries=max_retries,
                timeout=timeout,
                return_token_ids=True,
                full_seeds=True,
            )
            for url in self.urls
        ]
        self._lock = threading.Lock()
        self._outstanding = [0] * len(self.urls)
        self.sent = [0] * len(self.urls)  # requests each server got (for the run's record)
        self.version: int | None = None  # optimizer steps behind the adapter the servers hold

    # -- the adapter ----------------------------------------------------------------------------------
    def check(self) -> list[dict[str, Any]]:
        """GET /v1/models of every server; RolloutServerError naming the first unreachable one."""
        found = []
        for url in self.urls:
            try:
                status, text = _http("GET", f"{url}/models", None, 30.0)
                if status != 200:
                    raise OSError(f"HTTP {status}: {text[:200]}")
                models = [m.get("id") for m in json.loads(text).get("data", []) if isinstance(m, dict)]
            except (OSError, ValueError, AttributeError) as e:
                raise RolloutServerError(f"rollout server {url} does not answer GET /v1/models: {e}") from None
            found.append({"url": url, "models": models})
        return found

    def load_adapter(self, folder: Path, version: int) -> None:
        """Every server loads (or reloads in place) the adapter in `folder` under `adapter_name`;
        from then on every ModelCall is stamped with `version`."""
        body = {"lora_name": self.adapter_name, "lora_path": str(Path(folder).resolve()), "load_inplace": True}
        for url in self.urls:
            try:
                status, text = _http("POST", f"{_root(url)}/v1/load_lora_adapter", body, LOAD_TIMEOUT_S)
            except OSError as e:
                raise RolloutServerError(f"rollout server {url}: cannot load the adapter: {e}") from None
            if status >= 400:
                raise RolloutServerError(
                    f"rollout server {url} refused the adapter {body['lora_path']} "
                    f"(HTTP {status}: {text[:300]}); it must read that folder (a shared filesystem) and "
                    "serve LoRA adapters at runtime (vLLM: --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
                )
        with self._lock:
            self.version = version

    # -- requests -------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None) -> Future[ModelCall]:
        sampling = sampling or SamplingParams()
        with self._lock:
            if self.version is None:
                raise RolloutServerError("no adapter is loaded on the rollout servers yet (load_adapter first)")
            i = min(range(len(self.urls)), key=lambda k: self._outstanding[k])
            self._outstanding[i] += 1
            self.sent[i] += 1
            version = self.version
        inner = self.clients[i].submit(request, sampling)
        outer: Future[ModelCall] = Future()

        def done(f: Future[ModelCall]) -> None:
            with self._lock:
                self._outstanding[i] -= 1
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
        futures = [self.submit(r, sampling) for r in requests]
        wait(futures)
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            raise failed
        return [f.result() for f in futures]

    def describe(self) -> dict:
        return {"name": self.name, "backend": "rollout-servers", "servers": self.urls, "adapter": self.adapter_name}
