"""`harnessrl serve`: an OpenAI-compatible (and Anthropic Messages) HTTP server over the local engine.

    models.py    ServedModels: the base policy and the LoRA adapters loaded at run time
    tools.py     --enable-auto-tool-choice / --tool-call-parser, and the tools `tool_choice` shows
    app.py       create_app(models): the FastAPI app (routes)
    server.py    serving(...): a server in a background thread yielding its URL; run_server

The wire formats (chat completions, Responses, Messages), the replies and the streaming are
the package `harnessrl.wire`, shared with the recording endpoint external agent programs call
(harness/recording.py, docs/external-harness.md); native tools are rendered and parsed by
harness/prompt_tools.py on both.

Routes, what they return and what is refused: docs/serve.md.
"""

from __future__ import annotations

from harnessrl.serve.app import create_app
from harnessrl.serve.models import ServedModel, ServedModels
from harnessrl.serve.server import run_server, serving
from harnessrl.wire.chat import ServeError

__all__ = ["ServeError", "ServedModel", "ServedModels", "create_app", "run_server", "serving"]
