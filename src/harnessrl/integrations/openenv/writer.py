"""A harnessrl run's episodes -> OpenEnv trace files (`harnessrl export --format openenv`).

One file per episode, `OUT/<harness>/<task>.<attempt>.json`, in the shape of the capture proxy's
`GET /sessions/{id}/trace_entries` answer: `{"session_id", "entries": [TraceEntry, ...]}`, one
entry per model call (step), plus the episode's `reward` and `metadata` beside them. That is what
OpenEnv's `TrainingTrace.from_entries(doc["entries"])` builds a training trace from, and what TRL's
HarnessRolloutWorker consumes from a loop-owning session (its `fetch_training_trace()`): the
engine's prompt ids, the sampled ids, their log-probs and a loss mask per call.

A call whose token ids or log-probs were not recorded (an `openai:` backend without token ids)
is written without the token fields, never with made-up ones, and its episode is counted as not
trainable; OpenEnv refuses to build a TrainingTrace from such a file, as it should.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.types import Message, ModelCall, Step, ToolCall, Trajectory


@dataclass
class ExportSummary:
    files: list[Path] = field(default_factory=list)
    not_trainable: int = 0  # episodes with a call that lacks token ids or valid log-probs


def _chat_call(call: ToolCall, step: int, i: int) -> dict[str, Any]:
    return {
        "id": call.id or f"call-{step}-{i}",
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def _chat_message(m: Message) -> dict[str, Any]:
    """A harnessrl prompt message as a chat-completions message (the shape the capture records
    every dialect in)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [_chat_call(c, 0, i) for i, c in enumerate(m.tool_calls)]
    if m.role == "tool":
        if m.tool_call_id:
            out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    return out


def _token_fields(mc: ModelCall) -> tuple[dict[str, Any], str | None]:
    """prompt_token_ids, completion_token_ids, per_token_logps and loss_mask of a call, or why
    the call cannot have them. The log-probs are those of the distribution each token was drawn
    from (`sampled_logprobs` where the sampler shaped it, else `logprobs`): the behaviour policy
    an importance ratio needs."""
    logprobs = mc.sampled_logprobs if mc.sampled_logprobs is not None else mc.logprobs
    if not mc.prompt_ids:
        return {}, "no prompt token ids"
    if not mc.completion_ids and mc.completion_tokens:
        return {}, "no completion token ids"
    if len(logprobs) != len(mc.completion_ids):
        return {}, f"{len(logprobs)} log-probs for {len(mc.completion_ids)} completion tokens"
    if any(not math.isfinite(lp) or lp > 0 for lp in logprobs):
        return {}, "a log-probability that is positive or not finite"
    return {
        "prompt_token_ids": list(mc.prompt_ids),
        "completion_token_ids": list(mc.completion_ids),
        "per_token_logps": list(logprobs),
        "loss_mask": [0] * len(mc.prompt_ids) + [1] * len(mc.completion_ids),
    }, None


def _finish_reason(step: Step) -> str:
    if step.model_call.finish_reason == "length":
        return "length"
    return "tool_calls" if step.tool_calls else "stop"


def trace_entry(
    t: Trajectory, step: Step, reward: float | None, model: str | None, sampling: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """One step as a TraceEntry, and why it has no token fields (None when it has them)."""
    mc = step.model_call
    reply: dict[str, Any] = {"role": "assistant", "content": mc.text}
    if step.tool_calls:  # what the harness ran: native calls, or the calls its protocol parsed from the text
        reply["tool_calls"] = [_chat_call(c, step.index, i) for i, c in enumerate(step.tool_calls)]
    entry: dict[str, Any] = {
        "request": {"messages": [_chat_message(m) for m in mc.messages], "tools": None},
        "response": {"choices": [{"message": reply, "finish_reason": _finish_reason(step)}]},
    }
    tokens, why_not = _token_fields(mc)
    entry.update(tokens)
    entry["reward"] = reward
    metadata: dict[str, Any] = {
        "node_id": f"{t.episode_id}-{step.index}",
        "index": step.index,
        "model": model,
        "harness_session_id": t.episode_id,
        "sampling_params": sampling,
        "task_id": t.task_id,
        "harness": t.harness,
        "harnessrl": {"step": step.index, "action": step.action.value},
    }
    if mc.policy_version is not None:
        metadata["harnessrl"]["policy_version"] = mc.policy_version
    if mc.sampled_logprobs is not None:
        metadata["harnessrl"]["logprobs"] = "sampled_logprobs (the shaped distribution each token was drawn from)"
    if step.parse_error:
        metadata["harnessrl"]["parse_error"] = step.parse_error
    if step.tool_results:
        metadata["harnessrl"]["tool_results"] = [
            {"name": r.name, "ok": r.ok, "blocked": None if r.blocked is None else r.blocked.value}
            for r in step.tool_results
        ]
    if why_not:
        metadata["harnessrl"]["not_trainable"] = why_not
    entry["metadata"] = metadata
    return entry, why_not


def episode_reward(t: Trajectory) -> float | None:
    """The episode's reward as OpenEnv reads one: the grade's score; 0.0 for a valid episode that
    was never graded (as the run's metrics count it); None (unscored) for an infrastructure error."""
    if t.is_infra_error:
        return None
    return t.grade.score if t.grade is not None else 0.0


def trace_document(t: Trajectory, config: dict[str, Any], run_name: str) -> tuple[dict[str, Any], bool]:
    """One episode as a trace-entries document, and whether every call has its token fields
    (an episode without calls has nothing to train on, but nothing missing either)."""
    from harnessrl.export import episode_metadata

    model = config.get("model")
    sampling = config.get("sampling") if isinstance(config.get("sampling"), dict) else {}
    reward = episode_reward(t)
    entries, trainable = [], True
    for step in t.steps:
        entry, why_not = trace_entry(t, step, reward, None if model is None else str(model), dict(sampling or {}))
        entries.append(entry)
        trainable = trainable and why_not is None
    document = {
        "session_id": t.episode_id,
        "entries": entries,
        "reward": reward,
        # the capture proxy's words for what the document holds: token-level data, or text only
        "capture_level": "tokens" if trainable else "text",
        "rollout_type": "train" if trainable else "eval",
        "metadata": {**episode_metadata(t, run_name), "format": "harnessrl"},
    }
    return document, trainable


def export_openenv(run: str | Path, out: str | Path) -> ExportSummary:
    """Write one trace-entries file per episode of the run into `out/<harness>/<task>.<attempt>.json`."""
    from harnessrl.export import ExportError, file_name, new_out_dir, open_run, unused_path

    run = Path(run)
    with open_run(run) as store:
        config = store.config or {}
        trajectories = list(store.trajectories(with_tokens=True))
    if not trajectories:
        raise ExportError(f"{run} holds no episode to export")
    folder = new_out_dir(Path(out))
    run_name = run.resolve().name
    summary = ExportSummary()
    for t in trajectories:
        document, trainable = trace_document(t, config, run_name)
        sub = folder / file_name(t.harness)
        sub.mkdir(exist_ok=True)
        path = unused_path(sub / f"{file_name(t.task_id)}.{t.attempt}.json", t.episode_id)
        path.write_text(json.dumps(document) + "\n", encoding="utf-8")
        summary.files.append(path)
        summary.not_trainable += not trainable
    return summary
