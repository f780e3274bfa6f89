"""Every turn of an external episode in one sequence: when an agent program sends back a reply
the recording endpoint handed out, the next prompt continues from the token ids the model
sampled for that reply instead of re-rendering its text.

An agent program keeps its conversation itself and sends it whole with every request, the
model's earlier replies as text (or as tool calls). Rendered from that text, a reply need not
come out as the tokens the model sampled (the template trims a newline, the tokenizer splits the
same text otherwise, a reply cut at a stop string loses its stop), so the episode's calls would
not form one prefix chain and a trainer that takes an episode as one sequence
(train/episode_sequence.py) would keep only the turns before the first such break.

So each request is matched against the calls the episode recorded (`SampledTurns.match`):

- a **context** is what the model was shown: the request's messages as they go to the policy
  (the tools rendered into them) and its native tools. A recorded call's context is its own
  request's; an earlier reply inside it counts as that reply (its content, not its text), so a
  history whose replies come back reformatted still matches.
- a message of the request is **the same reply** as a recorded call's when the messages before it
  are that call's context and it is an assistant message with the reply as the endpoint handed
  it out (`same_reply`): the same text once runs of whitespace are collapsed and the ends
  stripped (an absent content is empty text), and the same tool calls in the same order, each
  with the same name and the same arguments as JSON values (key order and spacing free; a
  Responses custom tool's raw `input` as handed out counts too). A call id the endpoint minted
  (`call_{turn}_{k}`, or with the underscores dropped) must name that reply's call at that
  position; any other id (a client that mints its own, a Gemini call without one) is not held
  against the reply. Other fields (names, reasoning, refusal) are not looked at.
- the request's last such reply that new messages follow gives `GenerationRequest.sampled_prefix`:
  that call's prompt ids and completion ids, standing for the request's messages up to the
  reply. A policy that continues from sampled tokens (`HFPolicy.sampled_history`) renders only
  what follows them.

Anything else is rendered from text as before: a reply whose context matches but which differs
from every reply given in it (an **altered reply**), history the agent rewrote or dropped, a new
conversation (a sub-agent), other tools. Nothing the agent sends is trusted: it can only choose
between continuing from ids the model sampled itself, under the context it was shown, and the
text rendering. `summary` counts what happened per episode (the trajectory's meta
"sampled_turns"): calls continued, replies altered, requests that went on from an earlier call's
messages without its reply (an agent that drops a reply it could not parse: no sequence can hold
both calls, the model never saw that reply again), and prefix breaks (calls whose prompt does not
begin with the previous call's prompt and completion, where episode_sequence cuts) with the first
one's reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from harnessrl.models.base import SampledPrefix
from harnessrl.types import Message, ModelCall, ToolSchema
from harnessrl.wire.responses import CUSTOM_INPUT, read_custom_input

# the ids of the tool calls the endpoint hands out, and the same with the underscores dropped
_MINTED = re.compile(r"^call_(\d+)_(\d+)$")
_STRIPPED = re.compile(r"^call(\d{2,})$")


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _squeezed(text: str | None) -> str:
    """Text with its whitespace runs collapsed to one space and its ends stripped."""
    return " ".join((text or "").split())


@dataclass(frozen=True)
class HandedOut:
    """A reply as the endpoint handed it out: its text and its tool calls (id, name, arguments)."""

    text: str
    calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments as canonical JSON)

    @classmethod
    def of(cls, message: dict) -> HandedOut:
        """From the response's assistant message (`ExternalEpisode.record`)."""
        calls = []
        for entry in message.get("tool_calls") or []:
            fn = entry["function"]
            calls.append((entry["id"], fn["name"], _canonical_json(json.loads(fn["arguments"] or "{}"))))
        return cls(text=_squeezed(message.get("content")), calls=tuple(calls))

    @property
    def item(self) -> list:
        """What stands for this reply in a context: its content, ids left out."""
        return ["reply", self.text, [[name, arguments] for _, name, arguments in self.calls]]


def _names_other(call_id: str | None, index: int, position: int) -> bool:
    """Whether `call_id` is one the endpoint minted for another call than `position` of `index`."""
    if call_id is None:
        return False
    minted = _MINTED.match(call_id)
    if minted is not None:
        return (int(minted.group(1)), int(minted.group(2))) != (index, position)
    stripped = _STRIPPED.match(call_id)
    if stripped is not None:
        return stripped.group(1) != f"{index}{position}"
    return False


def same_reply(reply: HandedOut, index: int, message: Message) -> bool:
    """Whether `message` (as the agent sent it, tool calls as data) is the reply of call `index`
    as the endpoint handed it out (the rules in the module docstring)."""
    if message.role != "assistant" or _squeezed(message.content) != reply.text:
        return False
    sent = message.tool_calls or []
    if len(sent) != len(reply.calls):
        return False
    for k, (call, (_, name, arguments)) in enumerate(zip(sent, reply.calls)):
        if call.name != name or _names_other(call.id, index, k):
            return False
        given = _canonical_json(call.arguments)
        custom = read_custom_input(arguments)  # a Responses custom tool's call comes back as its raw input
        if given != arguments and (custom is None or given != _canonical_json({CUSTOM_INPUT: custom})):
            return False
    return True


def _message_item(message: Message) -> list:
    """What stands for a message (as the policy gets it) in a context: all that is rendered of it."""
    calls = [[c.name, _canonical_json(c.arguments), c.id] for c in message.tool_calls or []]
    return ["message", message.role, message.content, message.name, calls, message.tool_call_id]


def _extend(digest: bytes, item: list) -> bytes:
    return hashlib.sha256(digest + _canonical_json(item).encode("utf-8", "surrogatepass")).digest()


@dataclass
class Match:
    """What matching one request found: the prefix to continue from (None: render from text), the
    request's context digest, and the replies it carried back altered."""

    prefix: SampledPrefix | None = None
    source: int | None = None  # the call whose tokens the prefix is
    context: bytes = b""
    altered: list[int] = field(default_factory=list)  # calls whose reply came back altered
    dropped: int | None = None  # the last call whose messages the request goes on from without its reply


@dataclass
class _Sampled:
    call: ModelCall
    reply: HandedOut
    match: Match


class SampledTurns:
    """The calls one episode recorded, to continue later requests from (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, _Sampled] = {}
        self._contexts: dict[bytes, list[int]] = {}  # context digest -> calls made in it, in order

    def match(self, sent: list[Message], shown: list[Message], tools: list[ToolSchema] | None) -> Match:
        """Match a request: `sent` its messages as the agent sent them (tool calls as data),
        `shown` as they go to the policy (the same messages, tool turns possibly written as text,
        and possibly a system message put first), `tools` the tools passed natively."""
        offset = len(shown) - len(sent)
        if offset not in (0, 1):  # not the same messages: nothing of `sent` is looked at
            sent, offset = shown, 0
        found = Match()
        digest = hashlib.sha256(_canonical_json([t.model_dump() for t in tools or []]).encode()).digest()
        with self._lock:
            for i, message in enumerate(shown):
                item = _message_item(message)
                if message.role != "assistant" and digest in self._contexts:
                    found.dropped = self._contexts[digest][-1]
                j = i - offset
                candidates = self._contexts.get(digest, []) if message.role == "assistant" and j >= 0 else []
                if candidates and sent[j].role == "assistant":
                    same = [c for c in reversed(candidates) if same_reply(self._calls[c].reply, c, sent[j])]
                    if same:
                        source = self._calls[same[0]]
                        item = source.reply.item
                        if i + 1 < len(shown) and source.call.prompt_ids and source.call.completion_ids:
                            ids = [*source.call.prompt_ids, *source.call.completion_ids]
                            found.prefix, found.source = SampledPrefix(ids=ids, messages=i + 1), same[0]
                    else:
                        found.altered.append(candidates[-1])
                digest = _extend(digest, item)
        found.context = digest
        return found

    def record(self, index: int, match: Match, call: ModelCall, message: dict) -> None:
        """Call `index` (admitted with `match`) was answered with `call`, handed out as `message`."""
        if not call.completion_ids:
            return
        with self._lock:
            self._calls[index] = _Sampled(call=call, reply=HandedOut.of(message), match=match)
            self._contexts.setdefault(match.context, []).append(index)
            self._contexts[match.context].sort()

    def summary(self, calls: list[tuple[int, ModelCall]]) -> dict:
        """The episode's counts, over its recorded calls (step index, call) in order: calls that
        continued an earlier reply's sampled tokens, requests that carried a reply back altered,
        and prefix breaks (a call whose prompt does not begin with the previous sampled call's
        prompt and completion) with the first one's reason."""
        with self._lock:
            recorded = dict(self._calls)
        sampled = [(index, call) for index, call in calls if call.completion_ids]
        out: dict[str, Any] = {
            "calls": len(sampled),
            "continued": 0,
            "altered_replies": sum(len(r.match.altered) for r in recorded.values()),
            "dropped_replies": sum(r.match.dropped is not None and r.match.prefix is None for r in recorded.values()),
            "prefix_breaks": 0,
        }
        previous: tuple[int, ModelCall] | None = None
        for index, call in sampled:
            rec = recorded.get(index)
            prefix = rec.match.prefix if rec is not None else None
            if prefix is not None and call.prompt_ids[: len(prefix.ids)] == prefix.ids:
                out["continued"] += 1
            if previous is not None:
                before = [*previous[1].prompt_ids, *previous[1].completion_ids]
                if call.prompt_ids[: len(before)] != before:
                    out["prefix_breaks"] += 1
                    out.setdefault("first_break", f"call {index}: {_why(index, previous[0], rec)}")
            previous = (index, call)
        return out


def _why(index: int, before: int, rec: _Sampled | None) -> str:
    """Why call `index`'s prompt does not continue call `before`'s tokens."""
    if rec is None:
        return "not recorded"
    match = rec.match
    if match.prefix is None:
        if match.altered:
            return f"the agent sent call {match.altered[-1]}'s reply back altered: the history was rendered from text"
        if match.dropped is not None:
            return f"the agent went on from call {match.dropped}'s messages without its reply"
        return "the request does not extend an earlier call's messages and reply: rendered from text"
    if rec.call.prompt_ids[: len(match.prefix.ids)] != match.prefix.ids:
        return (
            f"the policy rendered call {match.source}'s reply from text (it does not continue sampled tokens, "
            "or its chat template cannot be continued)"
        )
    return f"it continues call {match.source}, not call {before}"
