"""OpenEnv capture traces -> a harnessrl run folder (`harnessrl import-traces --format openenv`).

Each trace (one rollout, one agent program's run) becomes one episode; each of its agent model
calls one step with the engine's prompt ids, completion ids and log-probs, the request's messages,
and the reply's text and tool calls. A reward the trace carries (a Harbor result's `reward`, a
TraceEntry's `reward`) becomes the episode's grade. What a trace does not carry is left missing
(empty token arrays, no grade, no termination) and named in the episode's `meta["openenv"]
["missing"]`, never filled in. docs/openenv.md lists every field.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl import __version__
from harnessrl.integrations.openenv.traces import Checked, TraceError, TraceLimits, documents, trace_files
from harnessrl.store import RunStore
from harnessrl.types import (
    ActionKind,
    Grade,
    Message,
    ModelCall,
    Step,
    Termination,
    ToolCall,
    ToolResult,
    Trajectory,
)

DEFAULT_HARNESS = "openenv"
DEFAULT_SUITE = "openenv"
SPLIT = "openenv"
KINDS = ("rollout", "trace_entries", "training_trace", "harbor")
MAX_NOTES = 50  # validation findings kept per trace
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass
class _Call:
    """One model call as a trace records it; None is "the trace does not say"."""

    node_id: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    completion_mask: list[int] | None = None
    messages: list[Any] | None = None  # the request's chat messages
    reply: dict[str, Any] | None = None  # the reply's chat message
    text: str | None = None  # a Harbor turn's reply text (it keeps no reply message)
    calls: list[Any] | None = None  # a Harbor turn's tool calls, {name, arguments}
    finish_reason: str | None = None
    model: str | None = None
    sampling: Any = None


@dataclass
class _Trace:
    kind: str
    where: str
    session_id: str | None = None
    task_id: str | None = None
    harness: str | None = None
    suite: str | None = None
    family: str | None = None
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    duration_s: float = 0.0
    calls: list[_Call] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ImportResult:
    """What an import wrote: the run folder, its episodes, and per trace kind how many."""

    run: Path
    n_episodes: int
    kinds: dict[str, int]
    graded: int
    with_tokens: int  # episodes whose every step has prompt ids, completion ids and log-probs
    notes: list[str] = field(default_factory=list)


# -- documents -> traces ----------------------------------------------------------------------------


def _kind(doc: Any, where: str) -> str:
    if isinstance(doc, list):
        return "trace_entries"
    if not isinstance(doc, dict):
        raise TraceError(f"{where}: an OpenEnv trace is a JSON object or a list of trace entries")
    if "entries" in doc:
        return "trace_entries"
    if "sequences" in doc and "turns" in doc:
        return "rollout"
    if "turns" in doc and "schema_version" in doc:
        return "training_trace"
    if "turns" in doc and any(k in doc for k in ("reward", "task_id", "rollout_type", "trial_name")):
        return "harbor"
    keys = ", ".join(sorted(map(str, doc))[:8])
    raise TraceError(
        f"{where}: not an OpenEnv trace (a rollout document has 'turns' and 'sequences', trace entries "
        f"'entries', a TrainingTrace 'schema_version' and 'turns', a Harbor result 'turns' and 'reward'; "
        f"this object has: {keys or 'no keys'})"
    )


def _notes(ck: Checked, value: Any, what: str) -> list[str]:
    if value is None:
        return []
    items = ck.arr(value, what, 1 << 20)
    return [str(v)[:500] for v in items[:MAX_NOTES]]


def _meta_names(ck: Checked, t: _Trace, meta: dict[str, Any], what: str) -> None:
    """Task, harness and suite from a trace's free-form metadata, where it names them."""
    t.task_id = t.task_id or ck.name(meta.get("task_id") or meta.get("task"), f"{what}.task_id")
    t.harness = t.harness or ck.name(meta.get("harness"), f"{what}.harness")
    t.suite = t.suite or ck.name(meta.get("suite") or meta.get("dataset"), f"{what}.suite")
    t.family = t.family or ck.name(meta.get("family"), f"{what}.family")


def _reply_of(ck: Checked, response: dict[str, Any], what: str) -> tuple[dict[str, Any] | None, str | None]:
    """The chat message and finish reason of an upstream reply ({"choices": [{...}]})."""
    choices = response.get("choices")
    if choices is None or choices == []:
        return None, None
    first = ck.obj(ck.arr(choices, f"{what}.choices", 1 << 10)[0], f"{what}.choices[0]")
    message = first.get("message")
    reply = None if message is None else ck.obj(message, f"{what}.choices[0].message")
    return reply, ck.name(first.get("finish_reason"), f"{what}.choices[0].finish_reason")


def _entry_call(ck: Checked, entry: Any, what: str, node_id: Any = None) -> tuple[_Call, float | None, dict[str, Any]]:
    """A TraceEntry (or a TrainingTrace turn): the call, its reward and its metadata."""
    e = ck.obj(entry, what)
    meta = ck.opt_obj(e.get("metadata"), f"{what}.metadata")
    request = ck.opt_obj(e.get("request"), f"{what}.request")
    response = ck.opt_obj(e.get("response"), f"{what}.response")
    c = _Call(node_id=ck.name(node_id if node_id is not None else meta.get("node_id"), f"{what}.node_id"))
    if request.get("messages") is not None:
        c.messages = ck.arr(request["messages"], f"{what}.request.messages", ck.limits.max_messages)
    c.reply, c.finish_reason = _reply_of(ck, response, f"{what}.response")
    if e.get("prompt_token_ids") is not None:
        c.prompt_ids = ck.ids(e["prompt_token_ids"], f"{what}.prompt_token_ids")
    if e.get("completion_token_ids") is not None:
        c.completion_ids = ck.ids(e["completion_token_ids"], f"{what}.completion_token_ids")
    elif e.get("completion_tokens") is not None:  # token strings "token_id:N", where ids are absent
        strings = ck.arr(e["completion_tokens"], f"{what}.completion_tokens", ck.limits.max_tokens)
        parsed = [s[len("token_id:") :] for s in strings if isinstance(s, str) and s.startswith("token_id:")]
        if len(parsed) == len(strings) and all(p.isdigit() and len(p) <= 12 for p in parsed):
            c.completion_ids = [int(p) for p in parsed]
    if e.get("per_token_logps") is not None:
        c.logprobs = ck.logprobs(e["per_token_logps"], f"{what}.per_token_logps")
    if e.get("loss_mask") is not None:
        mask = ck.mask(e["loss_mask"], f"{what}.loss_mask")
        n_prompt, n_completion = len(c.prompt_ids or []), len(c.completion_ids or [])
        if len(mask) != n_prompt + n_completion:
            raise ck.fail(
                f"{what}.loss_mask covers {len(mask)} positions, not prompt + completion ({n_prompt + n_completion})"
            )
        c.completion_mask = mask[n_prompt:]
    c.model = ck.name(meta.get("model"), f"{what}.metadata.model")
    if meta.get("sampling_params") is not None:
        c.sampling = ck.json_size(ck.obj(meta["sampling_params"], f"{what}.metadata.sampling_params"), "sampling")
    return c, ck.number(e.get("reward"), f"{what}.reward"), meta


def _parse_entries(ck: Checked, doc: Any, kind: str) -> _Trace:
    t = _Trace(kind=kind, where=ck.where)
    if isinstance(doc, list):
        items, top = doc, {}
    else:
        top = doc
        if kind == "training_trace" and top.get("schema_version") != 1:
            raise ck.fail(f"TrainingTrace schema_version {str(top.get('schema_version'))[:20]} (this reader knows 1)")
        key = "entries" if kind == "trace_entries" else "turns"
        items = top.get(key)
        if items is None:
            raise ck.fail(f"'{key}' is missing")
        t.session_id = ck.name(top.get("session_id"), "session_id")
        meta = ck.opt_obj(top.get("metadata"), "metadata")
        _meta_names(ck, t, meta, "metadata")
        t.reward = ck.number(top.get("reward"), "reward")
        # an episode harnessrl exported after an infrastructure error says so (unscored, not failed)
        t.error = ck.opt_text(meta.get("infra_error"), "metadata.infra_error") if t.reward is None else None
    items = ck.arr(items, "the entries" if kind == "trace_entries" else "turns", ck.limits.max_calls)
    rewards = []
    for i, item in enumerate(items):
        what = f"entries[{i}]" if kind == "trace_entries" else f"turns[{i}]"
        node_id = ck.obj(item, what).get("node_id") if kind == "training_trace" else None
        if kind == "training_trace" and node_id is None:
            raise ck.fail(f"{what}.node_id is missing (a TrainingTrace turn always has one)")
        call, reward, meta = _entry_call(ck, item, what, node_id)
        _meta_names(ck, t, meta, f"{what}.metadata")
        t.calls.append(call)
        if reward is not None:
            rewards.append(reward)
    if rewards:
        if any(not math.isclose(r, rewards[0], rel_tol=1e-9, abs_tol=1e-12) for r in rewards):
            raise ck.fail(
                f"the entries disagree on the reward ({sorted(set(rewards))[:4]}): one rollout has one reward"
            )
        if t.reward is not None and not math.isclose(t.reward, rewards[0], rel_tol=1e-9, abs_tol=1e-12):
            raise ck.fail(f"the document's reward {t.reward} differs from its entries' {rewards[0]}")
        t.reward = rewards[0]
    if t.reward is not None:
        t.meta["reward_source"] = "TraceEntry.reward"
    return t


def _parse_rollout(ck: Checked, doc: dict[str, Any]) -> _Trace:
    """The capture proxy's rollout document: per-call records in `turns`, token arrays in the
    `sequences` that pass through them (each call sliced out of its sequence by its prompt and
    sample lengths, as OpenEnv's own `turns_from_document` does)."""
    t = _Trace(kind="rollout", where=ck.where, session_id=ck.name(doc.get("session_id"), "session_id"))
    _meta_names(ck, t, ck.opt_obj(doc.get("metadata"), "metadata"), "metadata")
    turns = ck.arr(doc["turns"], "turns", ck.limits.max_calls)
    sequences = ck.arr(doc["sequences"], "sequences", ck.limits.max_calls)
    by_node: dict[str, dict[str, Any]] = {}
    for i, turn in enumerate(turns):
        node = ck.name(ck.obj(turn, f"turns[{i}]").get("node_id"), f"turns[{i}].node_id")
        if node is None:
            raise ck.fail(f"turns[{i}].node_id is missing")
        by_node[node] = turn
    eval_rollout = doc.get("rollout_type") == "eval"
    spans: dict[str, tuple[list[int], list[int], list[int]]] = {}  # node -> prompt, sample, sample's mask
    roles: Counter[str] = Counter()
    agent: set[str] = set()
    for s, seq_value in enumerate(sequences):
        seq = ck.obj(seq_value, f"sequences[{s}]")
        role = ck.name(seq.get("role"), f"sequences[{s}].role") or "agent"
        node_ids = [
            ck.name(n, f"sequences[{s}].node_ids")
            for n in ck.arr(seq.get("node_ids"), f"sequences[{s}].node_ids", ck.limits.max_calls)
        ]
        roles[role] += 1
        if role != "agent":
            continue
        input_ids = ck.ids(seq.get("input_ids") or [], f"sequences[{s}].input_ids")
        mask = ck.mask(seq.get("loss_mask") or [], f"sequences[{s}].loss_mask")
        for node in node_ids:
            if node is None or node not in by_node:
                raise ck.fail(f"sequences[{s}] names a node that is not in turns: {node!r}")
            agent.add(node)
            turn = by_node[node]
            n_prompt = ck.count(turn.get("n_prompt"), f"turn {node}.n_prompt") or 0
            n_sampled = ck.count(turn.get("n_sampled"), f"turn {node}.n_sampled") or 0
            if eval_rollout or not input_ids:
                continue
            end = n_prompt + n_sampled
            if end > len(input_ids) or len(mask) != len(input_ids):
                raise ck.fail(f"sequences[{s}] is shorter than turn {node}'s prompt and sample ({end} tokens)")
            span = (input_ids[:n_prompt], input_ids[n_prompt:end], mask[n_prompt:end])
            if node in spans and spans[node][1] != span[1]:
                raise ck.fail(f"two sequences disagree on turn {node}'s sampled tokens")
            spans[node] = span
    for i, turn in enumerate(turns):
        node = turn["node_id"]
        if node not in agent:
            continue
        what = f"turns[{i}]"
        c = _Call(node_id=node, finish_reason=ck.name(turn.get("finish_reason"), f"{what}.finish_reason"))
        if node in spans:
            c.prompt_ids, c.completion_ids, c.completion_mask = spans[node]
            if turn.get("sampled_logprobs") is not None:
                c.logprobs = ck.logprobs(turn["sampled_logprobs"], f"{what}.sampled_logprobs")
                if len(c.logprobs) != len(c.completion_ids):
                    raise ck.fail(f"{what}: {len(c.logprobs)} log-probs for {len(c.completion_ids)} sampled tokens")
        if turn.get("request_messages") is not None:
            c.messages = ck.arr(turn["request_messages"], f"{what}.request_messages", ck.limits.max_messages)
        if turn.get("response_message") is not None:
            c.reply = ck.obj(turn["response_message"], f"{what}.response_message")
        if turn.get("sampling_params") is not None:
            c.sampling = ck.json_size(ck.obj(turn["sampling_params"], f"{what}.sampling_params"), "sampling")
        t.calls.append(c)
    t.meta.update(
        capture_level=ck.name(doc.get("capture_level"), "capture_level"),
        rollout_type=ck.name(doc.get("rollout_type"), "rollout_type"),
        trainable=doc.get("trainable") if isinstance(doc.get("trainable"), bool) else None,
        sequences_by_role=dict(roles),
        calls_left_out=len(turns) - len(t.calls),
        validation=_notes(ck, doc.get("validation"), "validation"),
    )
    return t


def _parse_harbor(ck: Checked, doc: dict[str, Any]) -> _Trace:
    """A Harbor rollout result: the verifier's reward beside the captured agent turns."""
    t = _Trace(kind="harbor", where=ck.where, session_id=ck.name(doc.get("session_id"), "session_id"))
    t.task_id = ck.name(doc.get("task_id"), "task_id") or ck.name(doc.get("task_name"), "task_name")
    t.harness = ck.name(doc.get("harness"), "harness")
    t.suite = ck.name(doc.get("dataset"), "dataset")
    t.reward = ck.number(doc.get("reward"), "reward")
    if t.reward is not None:
        t.meta["reward_source"] = "HarborRolloutResult.reward"
    for k, v in ck.opt_obj(doc.get("rewards"), "rewards").items():
        value = ck.number(v, f"rewards.{k}")
        if value is not None:
            t.rewards[str(k)[: ck.limits.max_name_chars]] = value
    if doc.get("ok") is False:
        t.error = ck.opt_text(doc.get("error"), "error") or "the Harbor rollout is marked not ok"
    t.duration_s = ck.number(doc.get("wall_s"), "wall_s") or 0.0
    discarded = 0
    for i, turn_value in enumerate(ck.arr(doc["turns"], "turns", ck.limits.max_calls)):
        what = f"turns[{i}]"
        turn = ck.obj(turn_value, what)
        if turn.get("discarded") is True:
            discarded += 1
            continue
        c = _Call(node_id=ck.name(turn.get("node_id"), f"{what}.node_id"))
        c.finish_reason = ck.name(turn.get("finish_reason"), f"{what}.finish_reason")
        c.prompt_ids = ck.ids(turn.get("prompt_token_ids") or [], f"{what}.prompt_token_ids") or None
        c.completion_ids = ck.ids(turn.get("completion_token_ids") or [], f"{what}.completion_token_ids") or None
        c.logprobs = ck.logprobs(turn.get("per_token_logps") or [], f"{what}.per_token_logps") or None
        if turn.get("loss_mask") is not None:
            mask = ck.mask(turn["loss_mask"], f"{what}.loss_mask")
            n_prompt, n_completion = len(c.prompt_ids or []), len(c.completion_ids or [])
            if len(mask) != n_prompt + n_completion:
                raise ck.fail(f"{what}.loss_mask covers {len(mask)} positions, not prompt + completion")
            c.completion_mask = mask[n_prompt:]
        if turn.get("request_messages"):
            c.messages = ck.arr(turn["request_messages"], f"{what}.request_messages", ck.limits.max_messages)
        c.text = ck.opt_text(turn.get("text"), f"{what}.text")
        c.calls = ck.arr(turn.get("tool_calls") or [], f"{what}.tool_calls", ck.limits.max_calls)
        if turn.get("sampling_params") is not None:
            c.sampling = ck.json_size(ck.obj(turn["sampling_params"], f"{what}.sampling_params"), "sampling")
        t.calls.append(c)
    t.meta.update(
        capture_level=ck.name(doc.get("capture_level"), "capture_level"),
        rollout_type=ck.name(doc.get("rollout_type"), "rollout_type"),
        calls_left_out=discarded,
        validation=_notes(ck, doc.get("findings"), "findings"),
        trial_name=ck.name(doc.get("trial_name"), "trial_name"),
    )
    return t


def parse_document(doc: Any, where: str, limits: TraceLimits) -> _Trace:
    """One parsed JSON document as a trace (TraceError when it is not one or is malformed)."""
    ck = Checked(where, limits)
    kind = _kind(doc, where)
    if kind == "rollout":
        return _parse_rollout(ck, doc)
    if kind == "harbor":
        return _parse_harbor(ck, doc)
    return _parse_entries(ck, doc, kind)


# -- traces -> episodes -----------------------------------------------------------------------------


def _content(ck: Checked, value: Any, what: str, counts: Counter[str]) -> tuple[str, list[dict[str, Any]]]:
    """A message content as text, and the tool-use blocks of a block list (Anthropic's shape)."""
    if value is None:
        return "", []
    if isinstance(value, str):
        return ck.text(value, what), []
    parts, uses = [], []
    for i, part in enumerate(ck.arr(value, what, ck.limits.max_messages)):
        if isinstance(part, str):
            parts.append(ck.text(part, f"{what}[{i}]"))
            continue
        p = ck.obj(part, f"{what}[{i}]")
        if isinstance(p.get("text"), str):
            parts.append(ck.text(p["text"], f"{what}[{i}].text"))
        elif p.get("type") == "tool_use":
            uses.append({"id": p.get("id"), "name": p.get("name"), "arguments": p.get("input")})
        else:
            counts["non-text content parts"] += 1
    text = "".join(parts)
    if len(text) > ck.limits.max_text_chars:
        raise ck.fail(f"{what} is over the limit of {ck.limits.max_text_chars} characters")
    return text, uses


def _tool_call(ck: Checked, value: Any, what: str) -> tuple[ToolCall, str | None]:
    """A chat tool call ({id, function: {name, arguments}}) or a flat {name, arguments}; its
    arguments parsed from their JSON text. Arguments that are not a JSON object: the call with no
    arguments, its text in `raw`, and what was wrong."""
    v = ck.obj(value, what)
    fn = ck.opt_obj(v.get("function"), f"{what}.function") or v
    name = ck.name(fn.get("name"), f"{what}.name")
    if name is None:
        raise ck.fail(f"{what} has no name")
    args = fn.get("arguments", fn.get("input"))
    call_id = ck.name(v.get("id"), f"{what}.id")
    if args is None or args == "":
        return ToolCall(name=name, id=call_id), None
    if isinstance(args, str):
        ck.text(args, f"{what}.arguments")
        try:
            parsed = json.loads(args, parse_constant=lambda c: None)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            return ToolCall(name=name, arguments=parsed, id=call_id), None
        return ToolCall(name=name, raw=args, id=call_id), f"{name}: arguments are not a JSON object"
    if isinstance(args, dict):
        return ToolCall(name=name, arguments=ck.json_size(args, f"{what}.arguments"), id=call_id), None
    return ToolCall(name=name, raw=json.dumps(args)[:1000], id=call_id), f"{name}: arguments are not a JSON object"


def _messages(ck: Checked, raw: list[Any], what: str, counts: Counter[str]) -> list[Message]:
    out: list[Message] = []
    names: dict[str, str] = {}  # tool call id -> tool name, for tool results that do not name it
    for i, value in enumerate(raw):
        m = ck.obj(value, f"{what}[{i}]")
        role = ROLES.get(str(m.get("role")))
        if role is None:
            raise ck.fail(
                f"{what}[{i}] has role {str(m.get('role'))[:40]!r} (system, developer, user, assistant or tool)"
            )
        text, uses = _content(ck, m.get("content"), f"{what}[{i}].content", counts)
        calls = None
        if role == "assistant" and (m.get("tool_calls") or uses):
            items = ck.arr(m.get("tool_calls") or [], f"{what}[{i}].tool_calls", ck.limits.max_calls) + uses
            calls = [_tool_call(ck, c, f"{what}[{i}].tool_calls[{j}]")[0] for j, c in enumerate(items)]
            names.update({c.id: c.name for c in calls if c.id})
        call_id = ck.name(m.get("tool_call_id"), f"{what}[{i}].tool_call_id") if role == "tool" else None
        name = ck.name(m.get("name"), f"{what}[{i}].name") if role == "tool" else None
        out.append(
            Message(
                role=role, content=text, name=name or names.get(call_id or ""), tool_calls=calls, tool_call_id=call_id
            )
        )
    return out


def _step(ck: Checked, index: int, c: _Call, counts: Counter[str], missing: Counter[str]) -> Step:
    what = f"call {index}"
    messages = _messages(ck, c.messages, f"{what} request messages", counts) if c.messages is not None else []
    if c.messages is None:
        missing["request messages"] += 1
    calls: list[ToolCall] = []
    errors: list[str] = []
    if c.reply is not None:
        text, uses = _content(ck, c.reply.get("content"), f"{what} reply content", counts)
        raw_calls = ck.arr(c.reply.get("tool_calls") or [], f"{what} reply tool_calls", ck.limits.max_calls) + uses
    elif c.text is not None or c.calls:
        text, raw_calls = c.text or "", list(c.calls or [])
    else:
        text, raw_calls = "", []
        missing["reply"] += 1
    for j, raw in enumerate(raw_calls):
        call, error = _tool_call(ck, raw, f"{what} tool_calls[{j}]")
        calls.append(call)
        if error:
            errors.append(error)
    prompt, completion, logprobs = c.prompt_ids or [], c.completion_ids or [], c.logprobs or []
    if not prompt or c.completion_ids is None:
        missing["token ids"] += 1
    if c.completion_ids and len(logprobs) != len(completion):
        missing["log-probs"] += 1
        logprobs = []
    mc = ModelCall(
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=logprobs,
        text=text,
        tool_calls=calls or None,
        tool_call_error="; ".join(errors) or None,
        finish_reason="length" if c.finish_reason == "length" else "stop",
        messages=messages,
    )
    if errors:
        action = ActionKind.malformed
    elif calls:
        action = ActionKind.tool_calls
    else:
        action = ActionKind.text if text.strip() else ActionKind.empty
    return Step(index=index, model_call=mc, action=action, tool_calls=calls, parse_error="; ".join(errors) or None)


def _attach_results(steps: list[Step]) -> None:
    """A step's tool results: the tool messages of the next call's request that answer its calls,
    in the calls' order, up to the first call with no answer. Matched by call id, else by place
    among the tool messages after the request's last assistant message (a Harbor turn keeps no
    call ids; a Gemini function response names the function, not the call). The capture records
    what the model was shown, not what ran: the last call's results were never shown to it, so
    they are not in the trace."""
    for step, nxt in zip(steps, steps[1:]):
        messages = nxt.model_call.messages
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        trailing = [m for m in messages[last + 1 :] if m.role == "tool"]
        by_id = {m.tool_call_id: m for m in messages if m.role == "tool" and m.tool_call_id}
        for i, call in enumerate(step.tool_calls):
            m = by_id.get(call.id) if call.id else None
            if m is None and i < len(trailing):
                m = trailing[i]
            if m is None:
                break
            step.tool_results.append(ToolResult(name=m.name or call.name, output=m.content))


def to_trajectory(
    t: _Trace, episode_id: str, attempt: int, harness: str, threshold: float, limits: TraceLimits
) -> Trajectory:
    """A parsed trace as a harnessrl episode."""
    ck = Checked(t.where, limits)
    counts: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    steps = [_step(ck, i, c, counts, missing) for i, c in enumerate(t.calls)]
    _attach_results(steps)
    instruction = next((m.content for s in steps[:1] for m in s.model_call.messages if m.role == "user"), "")
    grade = None
    if t.reward is not None and 0.0 <= t.reward <= 1.0:
        subscores = {k: v for k, v in t.rewards.items() if 0.0 <= v <= 1.0}
        grade = Grade(
            score=t.reward,
            passed=t.reward >= threshold,
            threshold=threshold,
            subscores=subscores,
            details={"source": t.meta.get("reward_source", "openenv"), "reward": t.reward},
        )
    elif t.reward is not None:
        t.meta["reward_out_of_range"] = True
    if t.reward is None:
        missing["reward"] += 1
    masks = {
        str(i): c.completion_mask for i, c in enumerate(t.calls) if c.completion_mask and not all(c.completion_mask)
    }
    sampling = [c.sampling for c in t.calls if c.sampling is not None]
    models = sorted({c.model for c in t.calls if c.model})
    meta = {
        "kind": t.kind,
        "source": t.where,
        "session_id": t.session_id,
        "node_ids": [c.node_id for c in t.calls],
        "reward": t.reward,
        "rewards": t.rewards or None,
        **t.meta,
        "models": models or None,
        "sampling_params": sampling[0] if sampling and all(s == sampling[0] for s in sampling) else sampling or None,
        "completion_masks": masks or None,  # calls whose sampled tokens are not all trained on
        "missing": dict(missing) or None,
        "dropped": dict(counts) or None,
    }
    trajectory = Trajectory(
        episode_id=episode_id,
        task_id=t.task_id or t.session_id or episode_id,
        suite=t.suite or DEFAULT_SUITE,
        family=t.family or t.suite or DEFAULT_SUITE,
        split=SPLIT,
        harness=harness,
        attempt=attempt,
        instruction=instruction,
        steps=steps,
        grade=None if t.error else grade,
        termination=Termination.error if t.error else None,
        termination_detail=""
        if t.error or t.reward is None or grade
        else f"reward {t.reward} is outside [0, 1]: no grade",
        infra_error=t.error,
        prompt_tokens=sum(s.model_call.prompt_tokens for s in steps),
        completion_tokens=sum(s.model_call.completion_tokens for s in steps),
        duration_s=t.duration_s,
        meta={"openenv": {k: v for k, v in meta.items() if v is not None}},
    )
    return trajectory


def _has_tokens(t: Trajectory) -> bool:
    return bool(t.steps) and all(
        s.model_call.prompt_ids and len(s.model_call.logprobs) == len(s.model_call.completion_ids) for s in t.steps
    )


def read_traces(
    src: str | Path,
    run: str | Path,
    harness: str | None = None,
    pass_threshold: float = 1.0,
    limits: TraceLimits = TraceLimits(),
) -> ImportResult:
    """Read every OpenEnv trace under `src` (a file or a folder) into the new run folder `run`.

    Every trace is parsed and checked before the run folder is created, so a malformed trace
    leaves nothing behind. `harness` names the episodes' harness where a trace does not (default
    "openenv"); a reward at or above `pass_threshold` passes.
    """
    src, run = Path(src), Path(run)
    if not 0.0 <= pass_threshold <= 1.0:
        raise TraceError(f"the pass threshold {pass_threshold} is outside [0, 1]")
    if run.exists() and (not run.is_dir() or any(run.iterdir())):
        raise TraceError(f"--out {run} is not a new or empty folder; an import writes a new run folder")
    traces: list[tuple[str, _Trace]] = []  # (a name from the file, the trace)
    for path in trace_files(src, limits):
        for k, (where, doc) in enumerate(documents(path, limits)):
            traces.append(
                (path.stem if path.suffix == ".json" else f"{path.stem}-{k + 1}", parse_document(doc, where, limits))
            )
            if len(traces) > limits.max_traces:
                raise TraceError(f"{src}: more than {limits.max_traces} traces")
    if not traces:
        raise TraceError(f"{src}: no trace in it")
    seen: dict[str, str] = {}
    ids: set[str] = set()
    attempts: Counter[tuple[str, str]] = Counter()
    episodes = []
    for label, t in traces:
        if t.session_id is not None:
            if t.session_id in seen:
                raise TraceError(f"{t.where}: session {t.session_id} was already read from {seen[t.session_id]}")
            seen[t.session_id] = t.where
        name = t.harness or harness or DEFAULT_HARNESS
        # a trace without a session id (a TrainingTrace, a bare list of entries) is named by its file
        t.task_id = task = t.task_id or t.session_id or label
        key = (task, name)
        episode_id = f"openenv-{t.session_id or label}"
        while episode_id in ids:  # two files of the same name in different folders
            episode_id += "+"
        ids.add(episode_id)
        episodes.append(to_trajectory(t, episode_id, attempts[key], name, pass_threshold, limits))
        attempts[key] += 1
    result = ImportResult(
        run=run,
        n_episodes=len(episodes),
        kinds=dict(Counter(t.kind for _, t in traces)),
        graded=sum(1 for e in episodes if e.grade is not None),
        with_tokens=sum(1 for e in episodes if _has_tokens(e)),
    )
    out_of_range = sum(1 for e in episodes if e.meta["openenv"].get("reward_out_of_range"))
    if out_of_range:
        result.notes.append(f"{out_of_range} trace(s) carry a reward outside [0, 1]: kept in meta, not graded")
    models = Counter(m for e in episodes for m in e.meta["openenv"].get("models", []))
    with RunStore(run) as store:
        store.set_meta(
            "config",
            {
                "job": "import-traces",
                "source_format": "openenv",
                "source": str(src),
                "suite": DEFAULT_SUITE if len({e.suite for e in episodes}) != 1 else episodes[0].suite,
                "model": models.most_common(1)[0][0] if models else None,
                "attempts": max(attempts.values()),
                "pass_threshold": pass_threshold,
                "harnessrl_version": __version__,
            },
        )
        for e in episodes:
            store.add(e)
    return result
