"""Streaming a completion as the engine samples it: token ids in, text deltas out.

`TextDeltas` turns tokens into text pieces incrementally, the way the final ModelCall's text is
made (chat.decode, cut before the first stop string), so the pieces a client joins are that text:
- a token that ends inside a multi-byte character shows nothing until the character is whole;
- text that might be the start of a stop string is held back until it cannot be;
- from the token that completes a stop string on, nothing more is shown (the ModelCall keeps
  that token and drops the rest, chat.cut_at_stop_strings).
Decoding re-reads a short window of tokens only (the previous piece and the new tokens), not the
whole completion, so a long reply costs linear time.

`stream_call` runs one request and yields its pieces as they come: live from the engine's
per-token callback for a policy whose `submit` takes `on_token` (HFPolicy, `streams_tokens`), at
the end for any other policy (an HTTP backend, a scripted one), then a `Done` with the ModelCall.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from harnessrl.types import ModelCall

if TYPE_CHECKING:
    from harnessrl.models.base import GenerationRequest, SamplingParams

INCOMPLETE = "\ufffd"  # what decoding shows for the bytes of a character not yet whole

OnToken = Callable[[int, float], None]  # (token id, its logprob), called as the engine samples it


class TokenStreaming(Protocol):
    """A policy whose `submit` takes `on_token` (one with `streams_tokens` true: HFPolicy)."""

    def submit(
        self, request: GenerationRequest, sampling: SamplingParams | None = None, *, on_token: OnToken | None = None
    ) -> Future[ModelCall]: ...


def token_streaming(policy: object) -> TokenStreaming | None:
    """`policy` when its `submit` takes `on_token` (it says so with `streams_tokens`), else None."""
    return cast(TokenStreaming, policy) if getattr(policy, "streams_tokens", False) else None


@dataclass
class Piece:
    """Text to show now and the tokens that arrived with it (their ids and logprobs)."""

    text: str
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class Done:
    call: ModelCall


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


class TextDeltas:
    """Incremental detokenizer of one completion (see the module docstring)."""

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # everything decoded so far (before any stop cut)
        self.shown = 0  # characters of `text` handed out
        self.sent_tokens = 0  # tokens handed out
        self.stopped = False
        self._logprobs_pending: list[float] = []  # of the tokens not handed out yet
        self._prefix = 0  # decoding window: ids[_prefix:_read] were decoded into the previous piece
        self._read = 0

    def push(self, token: int, logprob: float) -> Piece | None:
        """One more sampled token; the piece to show now (its text may be empty), None once a
        stop string was found (later tokens are not part of the reply)."""
        if self.stopped:
            return None
        self.ids.append(token)
        self._logprobs_pending.append(logprob)
        before = _decode(self.tokenizer, self.ids[self._prefix : self._read])
        window = _decode(self.tokenizer, self.ids[self._prefix :])
        if not window.endswith(INCOMPLETE) and window.startswith(before):
            self.text += window[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
        visible = len(self.text)
        for s in self.stop:
            at = self.text.find(s, max(0, self.shown - len(s)))
            if at >= 0:
                self.stopped = True
                visible = min(visible, at)
        if not self.stopped:
            visible = self._hold_back(visible)
        return self._piece(max(visible, self.shown))

    def _hold_back(self, visible: int) -> int:
        """The end of the text that cannot turn out to be the start of a stop string."""
        for s in self.stop:
            for k in range(min(len(s) - 1, visible - self.shown), 0, -1):
                if self.text.endswith(s[:k]):
                    visible = min(visible, len(self.text) - k)
                    break
        return visible

    def _piece(self, end: int) -> Piece:
        text = self.text[self.shown : end]
        self.shown = end
        ids = self.ids[self.sent_tokens :]
        logprobs = self._logprobs_pending
        self._logprobs_pending = []
        self.sent_tokens = len(self.ids)
        return Piece(text, ids, logprobs)

    def finish(self, call: ModelCall) -> Piece:
        """The rest of the reply once its ModelCall is known (the truth: its text and tokens)."""
        shown = self.text[: self.shown]
        text = call.text[len(shown) :] if call.text.startswith(shown) else ""
        start = min(self.sent_tokens, len(call.completion_ids))
        return Piece(text, list(call.completion_ids[start:]), list(call.logprobs[start:]))


def replay(call: ModelCall, tokenizer) -> list[Piece]:
    """The pieces of a finished call, one per token where there is a tokenizer (what a stream of
    a policy without per-token output, or of a buffered reply, carries)."""
    if tokenizer is None or not call.completion_ids:
        return [Piece(call.text, list(call.completion_ids), list(call.logprobs))]
    deltas = TextDeltas(tokenizer)
    pieces = [p for t, lp in zip(call.completion_ids, call.logprobs) if (p := deltas.push(t, lp)) is not None]
    pieces.append(deltas.finish(call))
    return [p for p in pieces if p.text or p.ids]


Submit = Callable[[OnToken | None], Future]


async def stream_call(submit: Submit, tokenizer, stop: Sequence[str], live: bool) -> AsyncIterator[Piece | Done]:
    """Run one request (`submit(on_token)` starts it and returns its Future[ModelCall]) and yield
    its pieces, then Done. `live`: the policy takes on_token (else everything comes at the end).
    The policy's failure is raised from the iteration; closing the iteration early (the client
    went away) cancels the request."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def on_token(token: int, logprob: float) -> None:  # the engine's thread: hand over, never block
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (token, logprob))
        except RuntimeError:  # the loop is closed: nobody listens any more
            pass

    future = await asyncio.to_thread(submit, on_token if live else None)
    done = asyncio.wrap_future(future)
    deltas = TextDeltas(tokenizer, stop) if live else None
    try:
        while deltas is not None:
            getter = asyncio.ensure_future(queue.get())
            finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in finished:
                getter.cancel()
                break
            piece = deltas.push(*getter.result())
            if piece is not None and (piece.text or piece.ids):
                yield piece
        call = await done
        if deltas is None:
            for piece in replay(call, tokenizer):
                yield piece
        else:
            while not queue.empty():  # tokens sampled just before the future resolved
                piece = deltas.push(*queue.get_nowait())
                if piece is not None and (piece.text or piece.ids):
                    yield piece
            rest = deltas.finish(call)
            if rest.text or rest.ids:
                yield rest
        yield Done(call)
    finally:
        if not future.done():
            future.cancel()
