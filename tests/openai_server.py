"""A small OpenAI-compatible server for tests: stdlib ThreadingHTTPServer on 127.0.0.1, a random
free port, answering POST /v1/chat/completions with the tiny random model (HFPolicy) and
GET /v1/models.

It answers like vLLM: choices[0].message.content, finish_reason, logprobs.content (one entry per
completion token, the token decoded from its id), and, when asked, vLLM's extras
(`return_token_ids`: choices[0].token_ids and prompt_token_ids; `return_tokens_as_token_ids`:
logprob tokens written "token_id:N"). Faults are switched on through `ServerOptions`:

    fail_first / fail_status   the first N completion requests get that status (500, 429, ...)
    always_fail                every completion request gets fail_status
    fail_matching              every completion request with this text in a message gets fail_status
    malformed                  200 with a body that is not JSON
    no_choices                 200 with {"choices": []}
    no_logprobs                never send logprobs
    reject_logprobs            400 to any request with logprobs=true (like a server without them)
    reject_token_ids           400 to any request with return_token_ids (like a hosted API)
    tool_call                  (name, arguments) or None: answer with message.tool_calls for it
    delay_s                    sleep before answering (to see concurrency)

Every request body and its headers are kept in `server.requests`; `server.max_in_flight` is the
largest number of completion requests handled at once.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.types import Message


@dataclass
class ServerOptions:
    fail_first: int = 0
    fail_status: int = 500
    always_fail: bool = False
    fail_matching: str | None = None
    malformed: bool = False
    no_choices: bool = False
    no_logprobs: bool = False
    reject_logprobs: bool = False
    reject_token_ids: bool = False
    tool_call: tuple[str, Any] | None = None
    tool_call_content: str | None = None
    delay_s: float = 0.0


@dataclass
class Recorded:
    body: dict
    headers: dict[str, str]


@dataclass
class OpenAITestServer:
    policy: Any  # an HFPolicy
    model_name: str = "tiny-random"
    options: ServerOptions = field(default_factory=ServerOptions)

    def __post_init__(self) -> None:
        self.requests: list[Recorded] = []
        self.completion_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()  # HFPolicy is not thread-safe
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found"}})
                    return
                body = json.loads(raw)
                with server._lock:
                    server.requests.append(Recorded(body, {k.lower(): v for k, v in self.headers.items()}))
                    server.completion_requests += 1
                    n = server.completion_requests
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    server._answer(self, body, n)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _send(self, status: int, payload: Any, raw: bytes | None = None):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="openai-test-server", daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def spec(self) -> str:
        return f"openai:{self.model_name}@{self.base_url}"

    def __enter__(self) -> OpenAITestServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # ------------------------------------------------------------------------------ answering

    def _answer(self, handler, body: dict, n: int) -> None:
        o = self.options
        if o.delay_s:
            time.sleep(o.delay_s)
        texts = [str(m.get("content")) for m in body["messages"]]
        matching = o.fail_matching is not None and any(o.fail_matching in t for t in texts)
        if o.always_fail or n <= o.fail_first or matching:
            handler._send(
                o.fail_status, {"error": {"message": f"injected failure {o.fail_status}", "type": "server_error"}}
            )
            return
        for refused, name in ((o.reject_logprobs, "logprobs"), (o.reject_token_ids, "return_token_ids")):
            if refused and body.get(name):
                error = {"message": f"{name} is not supported by this server", "type": "invalid_request_error"}
                handler._send(400, {"error": {**error, "param": name}})
                return
        if o.malformed:
            handler._send(200, None, raw=b'{"id": "x", "choices": [ {"message": ')
            return
        if o.no_choices:
            handler._send(200, {"id": "x", "object": "chat.completion", "choices": []})
            return
        handler._send(200, self._completion(body))

    def _completion(self, body: dict) -> dict:
        policy, tok = self.policy, self.policy.tokenizer
        request = GenerationRequest(
            messages=[_message(m) for m in body["messages"]],
            max_new_tokens=int(body.get("max_tokens") or 16),
            stop=body.get("stop") or [],
        )
        sampling = SamplingParams(
            temperature=body.get("temperature", 0.7), top_p=body.get("top_p", 1.0), seed=body.get("seed") or 0
        )
        with self._model_lock:
            (call,) = policy.complete([request], sampling)
        message: dict[str, Any] = {"role": "assistant", "content": call.text}
        finish = call.finish_reason
        o = self.options
        if o.tool_call is not None:
            name, arguments = o.tool_call
            args = arguments if isinstance(arguments, str) else json.dumps(arguments)
            message = {
                "role": "assistant",
                "content": o.tool_call_content,
                "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": args}}],
            }
            finish = "tool_calls"
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs") and not o.no_logprobs:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {
                "content": [
                    {
                        "token": f"token_id:{i}" if as_ids else tok.decode([i]),
                        "logprob": lp,
                        "bytes": None,
                        "top_logprobs": [],
                    }
                    for i, lp in zip(call.completion_ids, call.logprobs)
                ]
            }
        else:
            choice["logprobs"] = None
        response: dict[str, Any] = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model_name),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(call.prompt_ids),
                "completion_tokens": len(call.completion_ids),
                "total_tokens": len(call.prompt_ids) + len(call.completion_ids),
            },
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(call.completion_ids)
            response["prompt_token_ids"] = list(call.prompt_ids)
        return response


def _message(m: dict) -> Message:
    role = m["role"]
    content = m.get("content") or ""
    if role == "assistant" and m.get("tool_calls"):
        calls = [
            json.dumps({"tool": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])})
            for c in m["tool_calls"]
        ]
        content = "\n".join([content, *calls]) if content else "\n".join(calls)
    return Message(role=role, content=content)


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
