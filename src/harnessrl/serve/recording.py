"""The recording endpoint: OpenAI's chat completions for external agent programs, one route
prefix per episode, every request answered by the run's policy and recorded as a step.

    http://127.0.0.1:PORT/episodes/<token>/v1/chat/completions
    http://127.0.0.1:PORT/episodes/<token>/v1/models

The token is drawn per episode (`secrets`), so an agent reaches its own episode only; a token
that names no running episode is a 404. What a request becomes, which limits apply and what is
recorded is the episode's business (harness/external.py, `RecordedEpisode`): this module only
routes, awaits the policy and writes the wire format (serve/protocol.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from concurrent.futures import CancelledError
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from harnessrl.models.base import Policy, PolicyError, SamplingParams
from harnessrl.serve.app import _validation_message
from harnessrl.serve.protocol import ChatCompletionRequest, ServeError, completion_body, error_body, stream_chunks
from harnessrl.serve.server import BackgroundServer
from harnessrl.types import ModelCall

log = logging.getLogger(__name__)


class RecordedEpisode(Protocol):
    """What the endpoint needs of an episode (harness/external.py's ExternalEpisode)."""

    token: str  # the secret part of its address
    model_name: str
    policy: Policy
    sampling: SamplingParams

    def admit(self, body: ChatCompletionRequest) -> Any:
        """Check a request and make the turn to submit (`.request`); ServeError to refuse it."""

    def record(self, turn: Any, call: ModelCall, latency: float) -> dict:
        """Record the reply; returns the response's assistant message."""

    def backend_failed(self, message: str, latency: float) -> None:
        """The policy could not answer the turn."""


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    # 429 is a limit of the episode, not a busy server: tell OpenAI clients not to retry it
    headers = {"x-should-retry": "false"} if status == 429 else None
    return JSONResponse(error_body(status, message, param=param), status_code=status, headers=headers)


class RecordingEndpoint:
    """One HTTP server for a run's external episodes; `register` an episode to open its routes,
    `unregister` to close them. `start()` returns the server's root URL."""

    def __init__(self, host: str = "127.0.0.1"):
        self._episodes: dict[str, RecordedEpisode] = {}
        self._lock = threading.Lock()
        self._server = BackgroundServer(self._app(), host=host, name="recording")
        self.root: str | None = None

    def start(self) -> str:
        self.root = self._server.start()
        return self.root

    def stop(self) -> None:
        self._server.stop()
        self.root = None

    def url(self, episode: RecordedEpisode) -> str:
        """The base URL an agent gives its OpenAI client (OPENAI_BASE_URL)."""
        if self.root is None:
            raise RuntimeError("the recording endpoint is not running")
        return f"{self.root}/episodes/{episode.token}/v1"

    def register(self, episode: RecordedEpisode) -> None:
        with self._lock:
            self._episodes[episode.token] = episode

    def unregister(self, episode: RecordedEpisode) -> None:
        with self._lock:
            self._episodes.pop(episode.token, None)

    def _episode(self, token: str) -> RecordedEpisode:
        with self._lock:
            episode = self._episodes.get(token)
        if episode is None:
            raise ServeError(404, "no running episode has this address (it ended, or the token is wrong)")
        return episode

    # -- the app ------------------------------------------------------------------------------------
    def _app(self) -> FastAPI:
        app = FastAPI(title="harnessrl recording endpoint", docs_url=None, redoc_url=None, openapi_url=None)

        @app.exception_handler(ServeError)
        async def serve_error(_: Request, exc: ServeError) -> JSONResponse:
            return _error(exc.status, exc.message, exc.param)

        @app.exception_handler(RequestValidationError)
        async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
            return _error(400, _validation_message(exc))

        @app.exception_handler(StarletteHTTPException)
        async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
            return _error(exc.status_code, str(exc.detail))

        @app.exception_handler(Exception)
        async def unexpected(_: Request, exc: Exception) -> JSONResponse:
            log.exception("unexpected error in the recording endpoint")
            return _error(500, f"internal error: {type(exc).__name__}: {exc}")

        @app.get("/episodes/{token}/v1/models")
        async def models(token: str) -> dict:
            episode = self._episode(token)
            card = {"id": episode.model_name, "object": "model", "created": int(time.time()), "owned_by": "harnessrl"}
            return {"object": "list", "data": [card]}

        @app.post("/episodes/{token}/v1/chat/completions")
        async def chat_completions(token: str, body: ChatCompletionRequest) -> Any:
            episode = self._episode(token)
            turn = await asyncio.to_thread(episode.admit, body)  # ServeError: refused (limits, bad input)
            t0 = time.monotonic()
            try:
                # submit may render the prompt in the calling thread: keep it off the event loop
                future = await asyncio.to_thread(episode.policy.submit, turn.request, episode.sampling)
                call = await asyncio.wrap_future(future)
            except (PolicyError, CancelledError) as exc:
                message = str(exc) or type(exc).__name__
                episode.backend_failed(message, time.monotonic() - t0)
                return _error(500, f"the model backend failed: {message}")
            message = await asyncio.to_thread(episode.record, turn, call, time.monotonic() - t0)
            request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            name = body.model or episode.model_name
            tokenizer = getattr(episode.policy, "tokenizer", None)
            if body.stream:
                chunks = stream_chunks(
                    body, call, tokenizer, model=name, request_id=request_id, created=created, message=message
                )

                async def events():
                    for chunk in chunks:
                        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
                    yield "data: [DONE]\n\n"

                return StreamingResponse(events(), media_type="text/event-stream")
            return JSONResponse(
                completion_body(
                    body, call, tokenizer, model=name, request_id=request_id, created=created, message=message
                )
            )

        return app
