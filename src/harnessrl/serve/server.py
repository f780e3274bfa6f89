"""Running the app: `serving(...)`, a server in a background thread for code and tests (on
wire/http.py's `BackgroundServer`), and `run_server(...)`, the blocking server of the command line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from harnessrl.models.hf import HFPolicy
from harnessrl.serve.models import ServedModels
from harnessrl.serve.tools import check_tool_parser
from harnessrl.wire.http import GRACEFUL_SHUTDOWN_S, BackgroundServer, bind_socket, url_host


def _served_models(
    model: str | HFPolicy | ServedModels,
    *,
    served_model_name: str | None,
    max_loras: int,
    dtype: str,
    options: dict,
) -> tuple[ServedModels, bool]:
    """(the models, whether the caller of this function must close them)."""
    if isinstance(model, ServedModels):
        return model, False
    if isinstance(model, HFPolicy):
        return ServedModels(model, served_model_name, max_loras=max_loras, owns_base=False, **options), True
    if isinstance(model, str):
        return ServedModels.from_spec(
            model, served_model_name=served_model_name, max_loras=max_loras, dtype=dtype, **options
        ), True
    raise TypeError(f"serving() takes a model spec, an HFPolicy or ServedModels, not a {type(model).__name__}")


@contextlib.contextmanager
def serving(
    model: str | HFPolicy | ServedModels,
    *,
    served_model_name: str | None = None,
    max_loras: int = 4,
    dtype: str = "float32",
    host: str = "127.0.0.1",
    port: int = 0,
    lora_modules: dict[str, str] | None = None,
    log_level: str = "warning",
    max_lora_rank: int = 16,
    generation_config: str = "vllm",
    logprobs_mode: str = "processed_logprobs",
    enable_auto_tool_choice: bool = False,
    tool_call_parser: str | None = None,
    admin_key: str | None = None,
) -> Iterator[str]:
    """Serve `model` over OpenAI's chat completions API from a background thread; yields the
    base URL, e.g. ``http://127.0.0.1:41234/v1`` (for `openai.OpenAI(base_url=...)` or the
    ``openai:NAME@URL`` model spec).

    `model`: a local model spec (tiny-random, smollm2-135m, hf:PATH; loaded here and closed on
    exit, in `dtype`), an HFPolicy that is already loaded (served as it is, under
    `served_model_name` or its own name; the caller keeps it and closes it, so a trainer can
    serve the policy it trains: the engine drops cached prefixes when the weights change), or a
    ServedModels. `port=0` takes a free port. `lora_modules`: {name: adapter folder} loaded
    before the server starts; more can be loaded through POST /v1/load_lora_adapter, by a request
    that carries `admin_key` (`Authorization: Bearer KEY`; without `admin_key` a key nobody is
    told is drawn, and the adapter routes refuse every request). Adapters are closed on exit.
    `max_lora_rank`, `generation_config` ("vllm" or "auto") and `logprobs_mode`
    ("processed_logprobs" or "raw_logprobs") are vLLM's options of those names, and so are
    `enable_auto_tool_choice` with `tool_call_parser` (both or neither: native tool calls through
    that tool-call format, harness/prompt_tools.py) (ServedModels; ignored when `model` is a
    ServedModels, which has its own).

    The server stops when the block ends: it stops accepting connections, gives requests in
    flight up to a few seconds, and the thread is joined.

        with serving("tiny-random") as url:
            client = openai.OpenAI(base_url=url, api_key="EMPTY")
            client.chat.completions.create(model="tiny-random", messages=[...], max_tokens=16)
    """
    from harnessrl.serve.app import create_app

    options = {
        "max_lora_rank": max_lora_rank,
        "generation_config": generation_config,
        "logprobs_mode": logprobs_mode,
        "tool_call_parser": check_tool_parser(enable_auto_tool_choice, tool_call_parser),
    }
    models, owned = _served_models(
        model, served_model_name=served_model_name, max_loras=max_loras, dtype=dtype, options=options
    )
    try:
        for name, path in (lora_modules or {}).items():
            models.load_adapter(name, path)
        app = create_app(models, admin_key=admin_key)
        server = BackgroundServer(app, host=host, port=port, log_level=log_level)
        root = server.start()
        try:
            yield f"{root}/v1"
        finally:
            server.stop()
    finally:
        if owned:
            models.close()


def run_server(
    models: ServedModels,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    announce: Callable[[str], None] | None = None,
    admin_key: str | None = None,
) -> None:
    """Serve `models` in this thread until Ctrl-C / SIGTERM (the command line). The socket is
    bound first, so `announce` gets the base URL with the real port (`port=0`: a free one).
    `admin_key`: what the adapter routes need (None: a drawn one, told to nobody)."""
    import uvicorn

    from harnessrl.serve.app import create_app

    sock = bind_socket(host, port)
    try:
        config = uvicorn.Config(
            create_app(models, admin_key=admin_key),
            log_level=log_level,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        if announce is not None:
            announce(f"http://{url_host(host)}:{sock.getsockname()[1]}/v1")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
