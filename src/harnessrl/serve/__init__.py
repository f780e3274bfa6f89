"""`harnessrl serve`: an OpenAI-compatible (and Anthropic Messages) HTTP server over the local engine.

    models.py    ServedModels: the base policy and the LoRA adapters loaded at run time
    protocol.py  the chat completions wire format (requests in, responses out, errors)
    responses.py the Responses API as a front of the chat path (requests, items, events)
    messages.py  Anthropic's Messages API as a front of the chat path (blocks, events, errors)
    streaming.py tokens as the engine samples them -> text deltas
    replies.py   one admitted request answered as JSON or as an event stream (both servers)
    tools.py     native tools: rendered into the prompt through a tool-call format, replies parsed
                 back into tool calls (serve's --tool-call-parser and the recording endpoint)
    app.py       create_app(models): the FastAPI app (routes)
    server.py    serving(...): a server in a background thread yielding its URL; run_server
    recording.py the recording endpoint external agent programs call (docs/external-harness.md)

Routes, what they return and what is refused: docs/serve.md.
"""

from __future__ import annotations

from harnessrl.serve.app import create_app
from harnessrl.serve.models import ServedModel, ServedModels
from harnessrl.serve.protocol import ServeError
from harnessrl.serve.server import run_server, serving

__all__ = ["ServeError", "ServedModel", "ServedModels", "create_app", "run_server", "serving"]
