"""The recording endpoint: OpenAI's chat completions and Responses API, Anthropic's Messages API
and Google's Gemini API for external agent programs, one route prefix per episode, every request
answered by the run's policy and recorded as a step.

    http://127.0.0.1:PORT/episodes/<token>/v1/chat/completions
    http://127.0.0.1:PORT/episodes/<token>/v1/responses
    http://127.0.0.1:PORT/episodes/<token>/v1/messages   (+ /count_tokens, recorded as nothing)
    http://127.0.0.1:PORT/episodes/<token>/v1beta/models/MODEL:generateContent
                       (+ :streamGenerateContent, :countTokens recorded as nothing; the same under /v1)
    http://127.0.0.1:PORT/episodes/<token>/v1/models
    http://127.0.0.1:PORT/episodes/<token>/mcp           (the task's tools over MCP: harness/mcp_tools.py)

The token is drawn per episode (`secrets`), so an agent reaches its own episode only; a token
that names no running episode is a 404. What a request becomes, which limits apply and what is
recorded is the episode's business (harness/external.py, `RecordedEpisode`): this module only
routes, awaits the policy and writes the wire format (wire/chat.py, wire/responses.py,
wire/replies.py, wire/messages.py, wire/gemini.py). A Responses, Messages or Gemini request is
admitted as the chat completion it means, so it is limited and recorded exactly as one; the
conversations behind `previous_response_id` are kept per episode and dropped with it. Every
request the endpoint refuses under a running episode's address (an unknown route, a malformed
body, a request past a limit) is told to the episode (`refused`), which keeps it in the
trajectory.

Limits of the endpoint's own: a request body past wire.http.MAX_BODY_BYTES is refused with 413
before more of it is read (`limit_body`), and an episode's token counts (Anthropic's
count_tokens, Gemini's countTokens: a prompt rendered, no model call) are at most
COUNT_TOKENS_PER_MODEL_CALL per model call of its budget (`limits.max_model_calls`); past that
each is refused with 429, as a model call past the budget is (the episode goes on: its model
calls are still answered).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from typing import Protocol as Interface

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from harnessrl.harness.mcp_tools import serve as serve_mcp
from harnessrl.models.base import Policy, SamplingParams
from harnessrl.tasks.sandbox_net import Forward
from harnessrl.types import ModelCall
from harnessrl.wire import gemini
from harnessrl.wire.chat import ChatCompletionRequest, ServeError
from harnessrl.wire.gemini import error_for
from harnessrl.wire.http import BackgroundServer, limit_body, request_error_message
from harnessrl.wire.messages import MessagesRequest, messages_reply
from harnessrl.wire.messages import to_chat as to_messages_chat
from harnessrl.wire.pending import PendingReplies
from harnessrl.wire.replies import Exchange, ResponseTurn, chat_reply, responses_reply
from harnessrl.wire.responses import ConversationStore, ResponsesRequest, new_id, to_chat
from harnessrl.wire.streaming import token_streaming

if TYPE_CHECKING:
    from harnessrl.harness.spec import ExternalLimits

log = logging.getLogger(__name__)

_EPISODE_PATH = re.compile(r"^/episodes/(?P<token>[^/]+)(?P<route>/.*)?$")
ROUTES_SERVED = (
    "GET /v1/models, POST /v1/chat/completions, POST /v1/responses, POST /v1beta/models/MODEL:generateContent, "
    ":streamGenerateContent and :countTokens (or /v1/models/MODEL:...), POST /v1/messages and "
    "POST /v1/messages/count_tokens"
)
# The token counts an episode may ask for, per model call of its budget (limits.max_model_calls):
# an agent that counts before each call has room for a second count, and no more is rendered.
COUNT_TOKENS_PER_MODEL_CALL = 2


class RecordedEpisode(Interface):
    """What the endpoint needs of an episode (harness/external.py's ExternalEpisode)."""

    token: str  # the secret part of its address
    model_name: str
    limits: ExternalLimits  # max_model_calls also bounds its token counts (COUNT_TOKENS_PER_MODEL_CALL)
    policy: Policy
    sampling: SamplingParams

    def admit(self, body: ChatCompletionRequest) -> Any:
        """Check a request and make the turn to submit (`.request`); ServeError to refuse it."""

    def count_tokens(self, body: ChatCompletionRequest) -> int:
        """The prompt tokens `body` would take, admitting nothing; ServeError when not known here."""

    def record(self, turn: Any, call: ModelCall, latency: float) -> dict:
        """Record the reply; returns the response's assistant message."""

    def backend_failed(self, message: str, latency: float) -> None:
        """The policy could not answer the turn."""

    def refused(self, method: str, route: str, status: int, message: str) -> None:
        """The endpoint refused one of the agent's requests (answered `status` with `message`)."""


def _error(request: Request, status: int, message: str, param: str | None = None) -> JSONResponse:
    # 429 is a limit of the episode, not a busy server: tell OpenAI and Anthropic clients not to retry it
    headers = {"x-should-retry": "false"} if status == 429 else None
    body = error_for(request.url.path, status, message, param)
    return JSONResponse(body, status_code=status, headers=headers)


class RecordingEndpoint:
    """One HTTP server for a run's external episodes; `register` an episode to open its routes,
    `unregister` to close them. `start()` returns the server's root URL."""

    def __init__(self, host: str = "127.0.0.1", unix_path: Path | None = None):
        self._episodes: dict[str, RecordedEpisode] = {}
        self._stores: dict[str, ConversationStore] = {}  # per episode: previous_response_id
        self._counted: dict[str, int] = {}  # per episode: the token counts asked for
        self._lock = threading.Lock()
        # the replies each episode waits for: given up when it ends (its program was stopped, by
        # its wall clock say, while the model still generated) and when the endpoint stops
        self._replies = PendingReplies()
        self._server = BackgroundServer(self._app(), host=host, name="recording", unix_path=unix_path)
        self.root: str | None = None

    def start(self) -> str:
        self.root = self._server.start()
        return self.root

    def forward(self) -> Forward | None:
        """How a sandboxed agent in a network namespace of its own reaches this endpoint: its
        port inside, relayed to the endpoint's Unix socket (None without one)."""
        if self.root is None or self._server.unix_path is None:
            return None
        return Forward(listen=int(self.root.rsplit(":", 1)[1]), connect=self._server.unix_path)

    def stop(self) -> None:
        self._replies.abandon_all("the run ended before the reply")  # nothing holds the shutdown
        self._server.stop()
        self.root = None

    def url(self, episode: RecordedEpisode) -> str:
        """The base URL an agent gives its OpenAI client (OPENAI_BASE_URL)."""
        if self.root is None:
            raise RuntimeError("the recording endpoint is not running")
        return f"{self.root}/episodes/{episode.token}/v1"

    def mcp_url(self, episode: RecordedEpisode) -> str:
        """The URL of the episode's task tools over MCP ($HARNESSRL_MCP_URL)."""
        return self.url(episode).removesuffix("/v1") + "/mcp"

    def register(self, episode: RecordedEpisode) -> None:
        with self._lock:
            self._episodes[episode.token] = episode
        self._replies.open(episode.token)

    def unregister(self, episode: RecordedEpisode) -> None:
        with self._lock:
            self._episodes.pop(episode.token, None)
            self._stores.pop(episode.token, None)
            self._counted.pop(episode.token, None)
        self._replies.abandon(episode.token, "the episode ended before the reply")

    def _live(self, episode: RecordedEpisode) -> bool:
        """Whether `episode` still runs here (after it ended, nothing more is recorded in it)."""
        with self._lock:
            return self._episodes.get(episode.token) is episode

    def _conversations(self, token: str) -> ConversationStore:
        with self._lock:
            return self._stores.setdefault(token, ConversationStore())

    def _refused(self, request: Request, status: int, message: str) -> None:
        """Tell the episode whose address the refused request used (none for a wrong token)."""
        found = _EPISODE_PATH.match(request.url.path)
        if found is None:
            return
        with self._lock:
            episode = self._episodes.get(found.group("token"))
        if episode is not None:
            episode.refused(request.method, found.group("route") or "/", status, message)

    def _exchange(self, episode: RecordedEpisode, turn: Any, model: str | None) -> Exchange:
        """How the episode's admitted turn is generated and recorded."""
        policy = episode.policy
        streaming = token_streaming(policy)
        started = [time.monotonic()]

        def submit(on_token):
            started[0] = time.monotonic()
            # submit may render the prompt in the calling thread: the caller keeps it off the event loop
            if on_token is None:
                generation = policy.submit(turn.request, episode.sampling)
            else:
                assert streaming is not None  # on_token is given only to a `live` exchange
                generation = streaming.submit(turn.request, episode.sampling, on_token=on_token)
            return self._replies.follow(episode.token, generation)

        def finish(call: ModelCall) -> tuple[ModelCall, dict | None]:
            latency = time.monotonic() - started[0]
            # the policy's own timings (queue, prefill, decode, ttft, latency) are recorded as
            # they came; a policy that times nothing gets the latency this endpoint saw
            if call.latency_s is None:
                call = call.model_copy(update={"latency_s": latency})
            if not self._live(episode):  # it ended meanwhile: its trajectory is being written
                return call, None
            return call, episode.record(turn, call, latency)

        def failed(message: str) -> str:
            if not self._live(episode):  # an abandoned reply, not the backend's failure
                return message
            episode.backend_failed(message, time.monotonic() - started[0])
            return f"the model backend failed: {message}"

        return Exchange(
            submit=submit,
            finish=finish,
            failed=failed,
            release=lambda: None,
            tokenizer=getattr(policy, "tokenizer", None),
            model=model or episode.model_name,
            stop=list(turn.request.stop),
            # a reply to a request that offered tools may be a tool call: parsed before it is shown
            live=streaming is not None and not turn.tools,
            buffered=bool(turn.tools),
        )

    def _episode(self, token: str) -> RecordedEpisode:
        with self._lock:
            episode = self._episodes.get(token)
        if episode is None:
            raise ServeError(404, "no running episode has this address (it ended, or the token is wrong)")
        return episode

    def _count_tokens(self, token: str, chat: ChatCompletionRequest) -> int:
        """(blocking) The prompt tokens `chat` would take for the episode of `token`: one token
        count of its budget (COUNT_TOKENS_PER_MODEL_CALL per model call); ServeError 429 past it."""
        episode = self._episode(token)
        cap = COUNT_TOKENS_PER_MODEL_CALL * episode.limits.max_model_calls
        with self._lock:
            asked = self._counted[token] = self._counted.get(token, 0) + 1
        if asked > cap:
            raise ServeError(
                429,
                f"the agent asked for more than {cap} token counts ({COUNT_TOKENS_PER_MODEL_CALL} per model call of "
                f"limits.max_model_calls = {episode.limits.max_model_calls}); no more are answered (model calls are)",
            )
        return episode.count_tokens(chat)

    async def _gemini(
        self, token: str, model: str, body: gemini.GenerateContentRequest, *, stream: bool, alt: str | None
    ) -> Any:
        """A Gemini generateContent request, admitted as the chat completion it means."""
        episode = self._episode(token)
        name = gemini.model_name(model)
        chat = gemini.to_chat(body, name, stream=stream)
        turn = await asyncio.to_thread(episode.admit, chat)  # ServeError: refused (limits, bad input)
        return await gemini.gemini_reply(self._exchange(episode, turn, name), body, stream=stream, sse=alt == "sse")

    # -- the app ------------------------------------------------------------------------------------
    def _app(self) -> FastAPI:
        app = FastAPI(title="harnessrl recording endpoint", docs_url=None, redoc_url=None, openapi_url=None)
        limit_body(app)  # a body past wire.http.MAX_BODY_BYTES: 413, refused in the episode (http_error)

        @app.exception_handler(ServeError)
        async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
            self._refused(request, exc.status, exc.message)
            return _error(request, exc.status, exc.message, exc.param)

        @app.exception_handler(RequestValidationError)
        async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
            message = request_error_message(exc)
            self._refused(request, 400, message)
            return _error(request, 400, message)

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            message = str(exc.detail)
            if exc.status_code == 404 and message == "Not Found":
                message = f"route not served: this endpoint serves {ROUTES_SERVED}"
            elif exc.status_code == 405:
                message = f"method not allowed: this endpoint serves {ROUTES_SERVED}"
            self._refused(request, exc.status_code, message)
            return _error(request, exc.status_code, message)

        @app.exception_handler(Exception)
        async def unexpected(request: Request, exc: Exception) -> JSONResponse:
            log.exception("unexpected error in the recording endpoint")
            return _error(request, 500, f"internal error: {type(exc).__name__}: {exc}")

        @app.get("/episodes/{token}/v1/models")
        async def models(token: str) -> dict:
            episode = self._episode(token)
            card = {"id": episode.model_name, "object": "model", "created": int(time.time()), "owned_by": "harnessrl"}
            return {"object": "list", "data": [card]}

        @app.post("/episodes/{token}/v1/chat/completions")
        async def chat_completions(token: str, body: ChatCompletionRequest) -> Any:
            episode = self._episode(token)
            turn = await asyncio.to_thread(episode.admit, body)  # ServeError: refused (limits, bad input)
            exchange = self._exchange(episode, turn, body.model)
            return await chat_reply(exchange, body, request_id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()))

        @app.post("/episodes/{token}/v1/responses")
        async def responses(token: str, body: ResponsesRequest) -> Any:
            episode = self._episode(token)
            store = self._conversations(token)
            chat, conversation = to_chat(body, store.history(body.previous_response_id))
            turn = await asyncio.to_thread(episode.admit, chat)  # ServeError: refused (limits, bad input)
            exchange = self._exchange(episode, turn, body.model)
            return await responses_reply(exchange, ResponseTurn(body, conversation, store, new_id("resp"), time.time()))

        @app.post("/episodes/{token}/v1/messages")
        async def messages(token: str, body: MessagesRequest) -> Any:
            episode = self._episode(token)
            chat = to_messages_chat(body)
            turn = await asyncio.to_thread(episode.admit, chat)  # ServeError: refused (limits, bad input)
            return await messages_reply(self._exchange(episode, turn, body.model), body)

        @app.post("/episodes/{token}/v1/messages/count_tokens")
        async def count_tokens(token: str, body: MessagesRequest) -> dict:
            self._episode(token)  # 404 for an address no episode has, before the body is converted
            chat = to_messages_chat(body, counting=True)
            return {"input_tokens": await asyncio.to_thread(self._count_tokens, token, chat)}

        async def generate_content(token: str, model: str, body: gemini.GenerateContentRequest) -> Any:
            return await self._gemini(token, model, body, stream=False, alt=None)

        async def stream_generate_content(
            token: str, model: str, body: gemini.GenerateContentRequest, alt: str | None = None
        ) -> Any:
            return await self._gemini(token, model, body, stream=True, alt=alt)

        async def gemini_count_tokens(token: str, model: str, body: gemini.CountTokensRequest) -> dict:
            self._episode(token)  # 404 for an address no episode has, before the body is converted
            chat = gemini.to_chat(body.request(), gemini.model_name(model), counting=True)
            return {"totalTokens": await asyncio.to_thread(self._count_tokens, token, chat)}

        for version in gemini.VERSIONS:
            app.post(f"/episodes/{{token}}/{version}/models/{{model:path}}:generateContent")(generate_content)
            app.post(f"/episodes/{{token}}/{version}/models/{{model:path}}:streamGenerateContent")(
                stream_generate_content
            )
            app.post(f"/episodes/{{token}}/{version}/models/{{model:path}}:countTokens")(gemini_count_tokens)

        @app.api_route("/episodes/{token}/mcp", methods=["GET", "POST", "DELETE"])
        async def mcp(token: str, request: Request) -> Response:
            episode = self._episode(token)
            server = getattr(episode, "tool_server", None)
            if server is None:
                raise ServeError(404, "this episode serves no task tools over MCP (mcp_tools: none, or none to serve)")
            return await serve_mcp(request, server, lambda s, m: episode.refused(request.method, "/mcp", s, m))

        return app
