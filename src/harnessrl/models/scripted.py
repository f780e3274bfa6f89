"""ScriptedPolicy: a policy whose answers are written in advance, for tests and demos.

It goes through the real tokenizer and chat template, so its ModelCalls look exactly like a
model's: prompt_ids from the template, completion_ids = tokens of the scripted text followed by
<|im_end|>, cut by max_new_tokens and stop strings the way HFPolicy cuts them.
Logprobs are all 0.0: a scripted policy is deterministic, every token has probability 1.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from harnessrl.models import chat
from harnessrl.models.base import GenerationRequest, Policy, PolicyError, SamplingParams
from harnessrl.models.embedded import END_OF_TURN
from harnessrl.types import Message, ModelCall

Script = Callable[[list[Message]], str] | Sequence[str]


class ScriptedPolicy(Policy):
    """`script` is either a function (conversation so far -> reply) or a list of replies.

    With a list, the reply to a request is ``script[k]`` where k is the number of assistant
    messages already in the request's conversation: each conversation consumes the list in
    order, independently of the others, and the same request always gets the same reply.
    (A harness that drops old assistant turns from the prompt will see earlier replies again.)
    Running past the end of the list raises PolicyError.
    `lock`: one request at a time is answered under it (scripts may keep state; a tokenizer is not
    shared between threads): policies that share a tokenizer share a lock.
    """

    def __init__(self, script: Script, tokenizer=None, name: str = "scripted", lock: threading.Lock | None = None):
        if tokenizer is None:
            from harnessrl.models.embedded import load_tokenizer

            tokenizer = load_tokenizer()
        if isinstance(script, str):
            raise TypeError("script must be a function or a list of strings, not one string")
        self.script = script if callable(script) else list(script)
        self.tokenizer = tokenizer
        self.name = name
        self._lock = lock or threading.Lock()  # shared by policies that share one tokenizer
        self.tool_role = chat.default_tool_role(tokenizer)
        self.end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if self.end_of_turn is None or self.end_of_turn == tokenizer.unk_token_id:
            self.end_of_turn = tokenizer.eos_token_id

    def describe(self) -> dict:
        return {"name": self.name, "backend": "scripted"}

    def reply(self, messages: list[Message]) -> str:
        if callable(self.script):
            text = self.script(list(messages))
            if not isinstance(text, str):
                raise PolicyError(f"{self.name}: the script returned {type(text).__name__}, not str")
            return text
        turn = sum(m.role == "assistant" for m in messages)
        if turn >= len(self.script):
            raise PolicyError(f"{self.name}: script exhausted ({len(self.script)} replies, asked for reply {turn + 1})")
        return self.script[turn]

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        with self._lock:
            return [self._complete_one(request) for request in requests]

    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None) -> Future[ModelCall]:
        """Answers at once, in the caller's thread, into a completed future. One request at a
        time (scripts may keep state; the tokenizer is not shared between threads)."""
        future: Future[ModelCall] = Future()
        got_at = time.perf_counter()
        try:
            with self._lock:
                call = self._complete_one(request)
            call.latency_s = time.perf_counter() - got_at  # (the wait for the lock included)
        except Exception as exc:  # noqa: BLE001 - the future carries it, as any backend's would
            future.set_exception(exc)
        else:
            future.set_result(call)
        return future

    def _complete_one(self, request: GenerationRequest) -> ModelCall:
        try:
            text = self.reply(request.messages)
        except PolicyError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise PolicyError(f"{self.name}: the script failed: {type(exc).__name__}: {exc}") from exc
        prompt = chat.render_prompt_ids(self.tokenizer, request.messages, self.tool_role, request.tools)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.end_of_turn is not None:
            ids.append(self.end_of_turn)
        finish = "stop"
        if len(ids) > request.max_new_tokens:
            ids, finish = ids[: request.max_new_tokens], "length"
        logprobs = [0.0] * len(ids)
        return chat.finish_call(self.tokenizer, request, prompt, ids, logprobs, finish)
