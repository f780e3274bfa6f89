"""The FastAPI app of `harnessrl serve`: OpenAI's chat completions and Responses API, Anthropic's
Messages API and Google's Gemini API over the local engine (a Responses, Messages or Gemini
request is served as the chat completion it means: wire/responses.py, wire/messages.py,
wire/gemini.py).
With a tool-call parser (ServedModels.tool_call_parser, vLLM's --enable-auto-tool-choice
--tool-call-parser P) a request's `tools` are shown in the prompt and its reply parsed into
`tool_calls` the way the recording endpoint does it (harness/prompt_tools.py).

The routes that change what the server samples (`POST /v1/load_lora_adapter`,
`/v1/unload_lora_adapter`) answer only a request that carries the admin key
(`Authorization: Bearer KEY`, wire/auth.py): 401 without a key, 403 with another one, each
refusal logged with the route and the client's address. The routes that sample stay open.

Every completion route is async and awaits the policy's `submit` future, so the requests in
flight together join the engine's running batch (continuous batching), and a request the
policy fails gets its own 500 while the others complete. Slow work that is not generation
(rendering a prompt, merging an adapter) runs in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from harnessrl.harness.prompt_tools import reply_message
from harnessrl.serve.models import ServedModel, ServedModels
from harnessrl.serve.tools import offered_tools
from harnessrl.types import ModelCall
from harnessrl.wire import gemini as gm
from harnessrl.wire import messages as ms
from harnessrl.wire.auth import ADMIN_KEY_ENV, draw_admin_key, key_matches, presented_key
from harnessrl.wire.chat import ChatCompletionRequest, ServeError, check_stop_token_ids, to_generation
from harnessrl.wire.http import limit_body, request_error_message
from harnessrl.wire.replies import Exchange, ResponseTurn, chat_reply, responses_reply
from harnessrl.wire.responses import ConversationStore, ResponsesRequest, new_id, to_chat

log = logging.getLogger(__name__)

# the completion limit of a request that sets none, for a model whose config names no context
NO_CONTEXT_MAX_TOKENS = 4096


class LoadLoraRequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoraRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None  # sent by some vLLM clients; names are what count here


def check_admin_key(request: Request, key: str) -> None:
    """Nothing for a request that carries `key` as `Authorization: Bearer KEY`; ServeError 401
    for one without a key, 403 for one with another key, logged with the route and the client."""
    presented = presented_key(request.headers.get("authorization"))
    if presented is not None and key_matches(presented, key):
        return
    client = f"{request.client.host}:{request.client.port}" if request.client else "an unknown client"
    path = request.url.path
    if presented is None:
        log.warning("refused %s %s from %s: no admin key", request.method, path, client)
        raise ServeError(
            401,
            f"{path} changes what this server samples and needs its admin key: send 'Authorization: Bearer KEY' "
            f"(the key of harnessrl serve --admin-key or ${ADMIN_KEY_ENV}, or the one it drew, in the file it named "
            "at start)",
        )
    log.warning("refused %s %s from %s: wrong admin key", request.method, path, client)
    raise ServeError(403, f"{path}: the admin key sent is not this server's")


def then(source: Future, transform: Callable[[ModelCall], ModelCall]) -> Future:
    """A future of `transform(the ModelCall of source)`, run in a thread of its own once `source`
    resolves (never on the engine's thread: a forward pass there would wait for itself); it ends
    as `source` does when that fails or is cancelled, and cancelling it cancels `source`."""
    ours: Future = Future()

    def run() -> None:
        if source.cancelled():
            ours.cancel()
            return
        error = source.exception()
        try:
            value = transform(source.result()) if error is None else None
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on `ours`
            error = exc
        if not ours.set_running_or_notify_cancel():
            return  # cancelled meanwhile
        if error is not None:
            ours.set_exception(error)
        else:
            ours.set_result(value)

    source.add_done_callback(lambda _: threading.Thread(target=run, name="harnessrl-logprobs", daemon=True).start())
    ours.add_done_callback(lambda f: source.cancel() if f.cancelled() else None)
    return ours


def create_app(models: ServedModels, *, admin_key: str | None = None) -> FastAPI:
    """The app answering for `models` (the caller closes them after the server stops).
    `admin_key`: what the adapter routes need (`check_admin_key`); None draws one that nobody
    is told, which closes those routes (adapters are then loaded on `models` directly)."""
    app = FastAPI(title="harnessrl serve", docs_url=None, redoc_url=None, openapi_url=None)
    limit_body(app)  # a body past wire.http.MAX_BODY_BYTES: 413
    app.state.models = models
    conversations = app.state.conversations = ConversationStore()  # previous_response_id
    key = admin_key or draw_admin_key()

    async def admin_only(request: Request) -> None:
        check_admin_key(request, key)

    # errors in OpenAI's shape, in Anthropic's on the Messages routes and Google's on the Gemini ones (gm.error_for)
    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
        body = gm.error_for(request.url.path, exc.status, exc.message, exc.param)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(body, status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(gm.error_for(request.url.path, 400, request_error_message(exc)), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = gm.error_for(request.url.path, exc.status_code, str(exc.detail))
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        body = gm.error_for(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(body, status_code=500)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {"object": "list", "data": [entry.card() for entry in models.entries()]}

    @app.post("/v1/load_lora_adapter", dependencies=[Depends(admin_only)])
    async def load_lora_adapter(body: LoadLoraRequest) -> PlainTextResponse:
        message = await asyncio.to_thread(
            models.load_adapter, body.lora_name, body.lora_path, inplace=body.load_inplace
        )
        return PlainTextResponse(message)

    @app.post("/v1/unload_lora_adapter", dependencies=[Depends(admin_only)])
    async def unload_lora_adapter(body: UnloadLoraRequest) -> PlainTextResponse:
        return PlainTextResponse(await asyncio.to_thread(models.unload_adapter, body.lora_name))

    def render(entry: ServedModel, body: ChatCompletionRequest):
        """(blocking) `body` as the model's request: (request, sampling, tools shown, prompt ids)."""
        policy = entry.policy
        assert policy is not None  # acquire() returns a resident model
        fmt = models.prompt_tools  # None: no native tools (to_generation refuses them)
        request, sampling = to_generation(body, 1, fmt is not None, defaults=models.sampling_defaults())
        check_stop_token_ids(request.stop_token_ids, policy.model.get_input_embeddings().num_embeddings)
        tools = offered_tools(body) if fmt is not None else []
        if fmt is not None:
            request = fmt.with_tools(request, tools)
        try:
            prompt = policy.prompt_ids(request)
        except Exception as exc:  # noqa: BLE001 - the template could not render these messages
            raise ServeError(
                400,
                f"cannot render the messages with the chat template: {type(exc).__name__}: {exc}",
                param="messages",
            ) from None
        return request, sampling, tools, prompt

    async def admit(body: ChatCompletionRequest) -> Exchange:
        """The served model's answer to `body`, ready to start (ServeError: refused)."""
        # off the event loop: an adapter evicted from the LRU is merged again from its folder first
        entry = await asyncio.to_thread(models.acquire, body.model)
        try:
            policy = entry.policy
            assert policy is not None  # acquire() returns a resident model
            fmt = models.prompt_tools
            request, sampling, tools, prompt = await asyncio.to_thread(render, entry, body)
            context = entry.max_context
            if context is not None and len(prompt) >= context:
                raise ServeError(
                    400,
                    f"This model's maximum context length is {context} tokens; the messages take {len(prompt)}.",
                    param="messages",
                )
            if body.max_tokens is None and body.max_completion_tokens is None:
                # no limit asked: up to the model's context (the engine stops there)
                limit = context - len(prompt) if context is not None else NO_CONTEXT_MAX_TOKENS
                request = request.model_copy(update={"max_new_tokens": limit})
        except BaseException:
            models.release(entry)
            raise
        # the logprobs vLLM reports that the engine's call does not hold as `logprobs`: its default
        # raw ones (recomputed by a forward pass once the reply is done), and the processed ones of
        # a request whose sampling shapes the distribution (the call's sampled_logprobs): such a
        # request's reply, streamed too, is written from the call that holds them
        raw = bool(body.logprobs) and models.logprobs_mode == "raw_logprobs"
        shaped = bool(body.logprobs) and not raw and sampling.shapes()

        def reported(call: ModelCall) -> ModelCall:
            """(blocking) `call` with the logprobs this server reports."""
            if raw and call.completion_ids:
                # vLLM's default: log softmax of the raw logits, before temperature
                return call.model_copy(update={"logprobs": entry.raw_logprobs(call.prompt_ids, call.completion_ids)})
            if shaped and call.sampled_logprobs is not None:
                # vLLM's processed_logprobs: of the distribution drawn from (penalties, min_p, top_k, top_p)
                return call.model_copy(update={"logprobs": list(call.sampled_logprobs)})
            return call

        def submit(on_token):
            if on_token is None:
                future = policy.submit(request, sampling)
            else:
                future = policy.submit(request, sampling, on_token=on_token)
            return then(future, reported) if raw or shaped else future

        def finish(call: ModelCall) -> tuple[ModelCall, dict | None]:
            if not tools or fmt is None:
                return call, None
            parsed = fmt.parse(call, tools)
            # ids in vLLM's form; unique, so an agent may keep them across requests
            return call, reply_message(parsed, [f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in parsed.calls])

        released = threading.Event()

        def release() -> None:
            if not released.is_set():
                released.set()
                models.release(entry)

        return Exchange(
            submit=submit,
            finish=finish,
            failed=lambda message: message,
            release=release,
            tokenizer=policy.tokenizer,
            model=entry.name,
            stop=list(request.stop),
            # a reply to a request with tools may be a tool call: parsed before any of it is shown
            live=not (raw or shaped) and bool(getattr(policy, "streams_tokens", False)) and not tools,
            buffered=bool(tools),
            prompt_ids=prompt,
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Any:
        exchange = await admit(body)
        return await chat_reply(exchange, body, request_id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()))

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest) -> Any:
        chat, conversation = to_chat(body, conversations.history(body.previous_response_id))
        exchange = await admit(chat)
        turn = ResponseTurn(body, conversation, conversations, new_id("resp"), time.time())
        return await responses_reply(exchange, turn)

    @app.post("/v1/messages")
    async def messages(body: ms.MessagesRequest) -> Any:
        return await ms.messages_reply(await admit(ms.to_chat(body)), body)

    async def prompt_length(chat: ChatCompletionRequest) -> int:
        """The prompt tokens `chat` would take on its model (the count_tokens routes)."""
        entry = await asyncio.to_thread(models.acquire, chat.model)
        try:
            return len((await asyncio.to_thread(render, entry, chat))[3])
        finally:
            models.release(entry)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: ms.MessagesRequest) -> dict:
        return {"input_tokens": await prompt_length(ms.to_chat(body, counting=True))}

    async def generate_content(model: str, body: gm.GenerateContentRequest) -> Any:
        return await gm.gemini_reply(await admit(gm.to_chat(body, gm.model_name(model))), body)

    async def stream_generate_content(model: str, body: gm.GenerateContentRequest, alt: str | None = None) -> Any:
        exchange = await admit(gm.to_chat(body, gm.model_name(model), stream=True))
        return await gm.gemini_reply(exchange, body, stream=True, sse=alt == "sse")

    async def gemini_count_tokens(model: str, body: gm.CountTokensRequest) -> dict:
        return {"totalTokens": await prompt_length(gm.to_chat(body.request(), gm.model_name(model), counting=True))}

    for version in gm.VERSIONS:
        app.post(f"/{version}/models/{{model:path}}:generateContent")(generate_content)
        app.post(f"/{version}/models/{{model:path}}:streamGenerateContent")(stream_generate_content)
        app.post(f"/{version}/models/{{model:path}}:countTokens")(gemini_count_tokens)

    return app
