"""Export a run's episodes in the formats other tools read (docs/export.md).

- `jsonl`: one harnessrl trajectory per line, exactly as the run database holds it.
- `inspect`: Inspect AI eval logs (`.eval`, or `.json`), one per harness of the run, built from
  inspect_ai's own pydantic models, so `inspect log dump` and `inspect view` read them. In a log:
  one sample per episode (sample id = task id, epoch = attempt + 1), its messages the turns of
  the episode, its score the grade, and the harness's summary numbers as the log's metrics.
- `atif`: Harbor's Agent Trajectory Interchange Format (ATIF v1.4), one JSON file per episode.
- `openenv`: OpenEnv capture traces (`{"session_id", "entries": [TraceEntry, ...]}`), one JSON file
  per episode, which OpenEnv's `TrainingTrace.from_entries` and TRL's HarnessRolloutWorker read
  (harnessrl.integrations.openenv, docs/openenv.md; `harnessrl import-traces` reads them back).

Why one Inspect log per harness, not one per run: Inspect's log list shows one row per log with
its task, model and headline score, so a row per harness is the comparison a run is made for;
and Inspect keys a sample by (id, epoch), which one harness's (task, attempt) pairs fill
exactly, where several harnesses in one log would give several samples the same key.

An episode that ended in an infrastructure error is exported too, marked as an error (Inspect:
the sample's `error`, no score; ATIF: `extra.infra_error` and the notes), never dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, TextIO

from harnessrl import __version__
from harnessrl.metrics import HarnessSummary, harness_summary
from harnessrl.store import DB_NAME, RunStore, StoreError
from harnessrl.triage import first_failure_signal
from harnessrl.types import BlockReason, Message, Step, ToolCall, ToolResult, Trajectory

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog, EvalSample
    from inspect_ai.model import ChatMessage, ChatMessageAssistant

FORMATS = ("jsonl", "inspect", "atif", "openenv")
INSPECT_LOG_FORMATS = ("eval", "json")
ATIF_VERSION = "ATIF-v1.4"
INSTALL_HINT = "pip install 'harnessrl[export]'"
SCORER = "grade"  # the name of the one score of an Inspect sample: the task grader's score


class ExportError(ValueError):
    """A run cannot be exported as asked (no run folder, unknown format, missing package, ...)."""


# -- the run folder ---------------------------------------------------------------------------------


def open_run(run: str | Path) -> RunStore:
    """The run database of a run folder; a clear error for a missing folder or one without a run."""
    run = Path(run)
    if not run.exists():
        raise ExportError(f"{run} does not exist")
    if not run.is_dir():
        raise ExportError(f"{run} is a file, not a run folder")
    if not RunStore.exists(run):
        raise ExportError(f"{run} is not a run folder (no {DB_NAME})")
    try:
        return RunStore(run)
    except StoreError as e:
        raise ExportError(str(e)) from None


def new_out_dir(out: Path) -> Path:
    """The folder exports go into: created when missing; an existing one must be empty, so that
    no file of an earlier export is mistaken for one of this run."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; exports in this format go into a folder")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"--out {out} is not empty; choose a new folder or empty it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def file_name(text: str) -> str:
    """`text` as a portable file name part (harness names and task ids may hold '/' or ':')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "_"


def unused_path(path: Path, key: str) -> Path:
    """`path`, or, when an earlier file of this export took it (two names that differ only in
    characters a file name cannot hold), the same name with a digest of `key` added."""
    if not path.exists():
        return path
    return path.with_name(f"{path.stem}.{hashlib.sha256(key.encode()).hexdigest()[:8]}{path.suffix}")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat()


def _attempts(config: dict[str, Any], trajectories: list[Trajectory]) -> int:
    """The run's attempts per task: its config's, else the most any task has stored."""
    recorded = config.get("attempts")
    if isinstance(recorded, int) and recorded >= 1:
        return recorded
    return max((t.attempt for t in trajectories), default=0) + 1


def _by_harness(store: RunStore, with_tokens: bool) -> dict[str, list[Trajectory]]:
    out: dict[str, list[Trajectory]] = {}
    for t in store.trajectories(with_tokens=with_tokens):
        out.setdefault(t.harness, []).append(t)
    return out


def _triage_label(t: Trajectory) -> dict[str, Any] | None:
    """The episode's first failure signal (triage.py): None when it passed."""
    v = first_failure_signal(t)
    return None if v is None else {"label": v.cls, "step": v.step, "evidence": v.evidence}


def _grade_json(t: Trajectory) -> dict[str, Any] | None:
    g = t.grade
    if g is None:
        return None
    return {"score": g.score, "passed": g.passed, "threshold": g.threshold, "subscores": g.subscores}


def _call_id(call: ToolCall, step: int, i: int) -> str:
    """A native call's own id, else one made from its place in the episode (unique within it)."""
    return call.id or f"call-{step}-{i}"


def _intro(t: Trajectory) -> list[Message]:
    """What the model was shown before its first reply: the first call's prompt (system prompt,
    demonstrations, the instruction), or the instruction alone when no call was made."""
    if t.steps and t.steps[0].model_call.messages:
        return list(t.steps[0].model_call.messages)
    return [Message(role="user", content=t.instruction)]


def _shown_interventions(step: Step) -> list[tuple[str, str]]:
    """(kind, message) of what the harness told the model after this step (its guards' notes);
    a plan step's intervention only repeats the model's own plan and is not a note."""
    return [(iv.kind, iv.message) for iv in step.interventions if iv.message and iv.kind != "plan"]


def episode_metadata(t: Trajectory, run_name: str) -> dict[str, Any]:
    """What every exported episode says about itself besides its turns."""
    return {
        "run": run_name,
        "harness": t.harness,
        "attempt": t.attempt,
        "task_id": t.task_id,
        "suite": t.suite,
        "split": t.split,
        "family": t.family,
        "episode_id": t.episode_id,
        "termination": None if t.termination is None else t.termination.value,
        "termination_detail": t.termination_detail,
        "submitted": t.submitted,
        "answer": t.answer,
        "grade": _grade_json(t),
        "triage": _triage_label(t),
        "infra_error": t.infra_error,
        "retries": t.retries,
        "n_steps": len(t.steps),
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "duration_s": t.duration_s,
        "own_s": t.own_s,
    }


# -- jsonl ------------------------------------------------------------------------------------------


def export_jsonl(run: str | Path, out: TextIO, tokens: bool = True) -> int:
    """Write every episode of the run as one JSON trajectory per line; returns how many."""
    n = 0
    with open_run(run) as store:
        for t in store.trajectories(with_tokens=tokens):
            out.write(t.model_dump_json() + "\n")
            n += 1
    return n


# -- Inspect AI -------------------------------------------------------------------------------------


def _require_inspect() -> None:
    try:
        import inspect_ai  # noqa: F401
    except ImportError:
        raise ExportError(f"--format inspect needs the inspect_ai package: {INSTALL_HINT}") from None


_TOOL_ERROR_TYPES: dict[BlockReason, Literal["parsing", "permission", "approval"]] = {
    BlockReason.unknown_tool: "parsing",
    BlockReason.invalid_arguments: "parsing",
    BlockReason.sandbox: "permission",
    BlockReason.guard: "approval",
}


def _inspect_tool_calls(calls: Iterable[ToolCall], step: int) -> list[Any]:
    from inspect_ai.tool import ToolCall as InspectToolCall

    return [
        InspectToolCall(id=_call_id(c, step, i), function=c.name, arguments=c.arguments) for i, c in enumerate(calls)
    ]


def _inspect_tool_message(result: ToolResult, call_id: str | None) -> ChatMessage:
    from inspect_ai.model import ChatMessageTool
    from inspect_ai.tool import ToolCallError

    error = None
    if result.blocked is not None:
        error = ToolCallError(_TOOL_ERROR_TYPES[result.blocked], result.output)
    elif not result.ok:
        error = ToolCallError("unknown", result.output)
    meta: dict[str, Any] = {"ok": result.ok}
    if result.blocked is not None:
        meta["blocked"] = result.blocked.value
    if result.inner_calls:
        meta["inner_calls"] = [
            {"tool": ic.call.name, "arguments": ic.call.arguments, "ok": ic.result.ok} for ic in result.inner_calls
        ]
    return ChatMessageTool(
        content=result.output, tool_call_id=call_id, function=result.name, error=error, metadata=meta
    )


def _inspect_prompt_message(m: Message) -> ChatMessage:
    """One message of the first prompt, as Inspect writes a message the model was given."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser

    if m.role == "system":
        return ChatMessageSystem(content=m.content, source="input")
    if m.role == "user":
        return ChatMessageUser(content=m.content, source="input")
    if m.role == "assistant":
        calls = _inspect_tool_calls(m.tool_calls, 0) if m.tool_calls else None
        return ChatMessageAssistant(content=m.content, tool_calls=calls, source="input")
    return _inspect_tool_message(ToolResult(name=m.name or "", output=m.content), m.tool_call_id)


def _inspect_messages(t: Trajectory, model: str) -> tuple[list[ChatMessage], ChatMessageAssistant | None]:
    """The episode's turns: the first prompt, then per step the model's reply (with its tool
    calls), the tool results, and the notes the harness gave the model. Also the last reply."""
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser

    messages: list[ChatMessage] = [_inspect_prompt_message(m) for m in _intro(t)]
    last: ChatMessageAssistant | None = None
    for step in t.steps:
        mc = step.model_call
        meta: dict[str, Any] = {
            "step": step.index,
            "action": step.action.value,
            "finish_reason": mc.finish_reason,
            "prompt_tokens": mc.prompt_tokens,
            "completion_tokens": mc.completion_tokens,
        }
        if step.parse_error:
            meta["parse_error"] = step.parse_error
        if mc.latency_s is not None:
            meta["latency_s"] = mc.latency_s
        last = ChatMessageAssistant(
            content=mc.text,
            tool_calls=_inspect_tool_calls(step.tool_calls, step.index) or None,
            model=model,
            source="generate",
            metadata=meta,
        )
        messages.append(last)
        for i, (call, result) in enumerate(zip(step.tool_calls, step.tool_results)):
            messages.append(_inspect_tool_message(result, _call_id(call, step.index, i)))
        for kind, note in _shown_interventions(step):
            messages.append(ChatMessageUser(content=note, source="input", metadata={"harness_intervention": kind}))
    return messages, last


def inspect_sample(t: Trajectory, model: str, run_name: str) -> EvalSample:
    """One episode as an Inspect `EvalSample`."""
    from inspect_ai.log import EvalError, EvalSample
    from inspect_ai.model import ChatCompletionChoice, ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    messages, last = _inspect_messages(t, model)
    usage = ModelUsage(
        input_tokens=t.prompt_tokens,
        output_tokens=t.completion_tokens,
        total_tokens=t.prompt_tokens + t.completion_tokens,
    )
    choices = []
    if last is not None:
        finish = t.steps[-1].model_call.finish_reason
        stop: Literal["max_tokens", "tool_calls", "stop"] = (
            "max_tokens" if finish == "length" else ("tool_calls" if last.tool_calls else "stop")
        )
        choices = [ChatCompletionChoice(message=last, stop_reason=stop)]
    output = ModelOutput(
        model=model,
        choices=choices,
        completion=t.answer if t.answer is not None else (last.text if last is not None else ""),
        usage=usage,
        error=t.infra_error if t.is_infra_error else None,
    )
    scores = None
    error = None
    if t.is_infra_error:
        text = t.infra_error or "infrastructure error"
        error = EvalError(message=text, traceback=text, traceback_ansi=text)
    else:
        # a valid episode that was never graded (it ran out of steps, say) earned nothing, as in
        # the run's metrics
        g = t.grade
        verdict = "not graded" if g is None else f"{'passed' if g.passed else 'failed'} (threshold {g.threshold:g})"
        subs = "" if g is None or not g.subscores else "; " + ", ".join(f"{k}={v:.2f}" for k, v in g.subscores.items())
        scores = {
            SCORER: Score(
                value=0.0 if g is None else g.score,
                answer=t.answer,
                explanation=verdict + subs,
                metadata={"passed": bool(g and g.passed), "subscores": {} if g is None else g.subscores},
            )
        }
    return EvalSample(
        id=t.task_id,
        epoch=t.attempt + 1,
        input=t.instruction,
        target="",
        messages=messages,
        output=output,
        scores=scores,
        metadata=episode_metadata(t, run_name),
        model_usage={model: usage},
        started_at=_iso(t.started_at) if t.started_at else None,
        completed_at=_iso(t.started_at + t.duration_s) if t.started_at else None,
        total_time=t.duration_s,
        working_time=t.own_s,
        uuid=t.episode_id,
        error=error,
    )


def _inspect_metrics(s: HarnessSummary, attempts: int) -> dict[str, Any]:
    """The harness's summary numbers (metrics.py, the same as `harnessrl summary`) as Inspect
    metrics; a rate the summary refuses (None: see its k_notes) is left out."""
    from inspect_ai.log import EvalMetric

    values: dict[str, float | None] = {"mean": s.mean_score}
    if s.mean_score_ci95:
        values["ci95_low"], values["ci95_high"] = s.mean_score_ci95
    for k in (1, attempts):
        values[f"pass@{k}"] = s.pass_at_k.get(str(k))
        values[f"pass^{k}"] = s.pass_hat_k.get(str(k))
    values["delivery"] = s.delivery_rate
    return {name: EvalMetric(name=name, value=v) for name, v in values.items() if v is not None}


def inspect_log(trajectories: list[Trajectory], config: dict[str, Any], run: Path) -> EvalLog:
    """One harness's episodes of a run as an Inspect `EvalLog`."""
    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalLog,
        EvalPlan,
        EvalPlanStep,
        EvalResults,
        EvalScore,
        EvalSpec,
        EvalStats,
    )
    from inspect_ai.model import GenerateConfig, ModelUsage

    harness = trajectories[0].harness
    suite = str(config.get("suite") or trajectories[0].suite)
    model = str(config.get("model") or "unknown")
    attempts = _attempts(config, trajectories)
    run_name = run.resolve().name
    samples = [inspect_sample(t, model, run_name) for t in trajectories]
    summary = harness_summary(trajectories, attempts)

    task_ids = sorted({t.task_id for t in trajectories})
    expected = config.get("task_ids")
    n_expected = len(expected) * attempts if isinstance(expected, list) else len(samples)
    valid = sum(1 for t in trajectories if not t.is_infra_error)
    started = min((t.started_at for t in trajectories if t.started_at), default=0.0)
    ended = max((t.started_at + t.duration_s for t in trajectories if t.started_at), default=0.0)
    created = _iso(started) if started else datetime.now(timezone.utc).isoformat()
    usage = ModelUsage(
        input_tokens=sum(t.prompt_tokens for t in trajectories),
        output_tokens=sum(t.completion_tokens for t in trajectories),
    )
    usage.total_tokens = usage.input_tokens + usage.output_tokens
    sampling = config.get("sampling")
    if not isinstance(sampling, dict):
        sampling = {}
    spec_dict = (config.get("harnesses") or {}).get(harness) if isinstance(config.get("harnesses"), dict) else None
    ident = hashlib.sha256(f"{run.resolve()}\0{harness}".encode()).hexdigest()[:22]

    return EvalLog(
        # every stored episode is in the log; a run stopped before all its episodes ran is "cancelled"
        status="success" if len(samples) >= n_expected else "cancelled",
        eval=EvalSpec(
            eval_id=ident,
            run_id=ident,
            created=created,
            task=f"{suite}/{harness}",
            task_id=ident,
            task_display_name=f"{suite} ({harness})",
            task_args={"harness": harness},
            dataset=EvalDataset(name=suite, samples=len(task_ids), sample_ids=list(task_ids)),
            model=model,
            model_generate_config=GenerateConfig(
                temperature=sampling.get("temperature"), top_p=sampling.get("top_p"), seed=sampling.get("seed")
            ),
            config=EvalConfig(epochs=attempts),
            packages={"harnessrl": __version__},
            metadata={
                "harness": harness,
                "run": run_name,
                "suite": suite,
                "split": config.get("split"),
                "seed": config.get("seed"),
                "harnessrl_version": config.get("harnessrl_version", __version__),
            },
        ),
        plan=EvalPlan(
            name=harness,
            steps=[EvalPlanStep(solver=f"harnessrl/{harness}", params=spec_dict or {})],
        ),
        results=EvalResults(
            total_samples=n_expected,
            completed_samples=valid,
            scores=[
                EvalScore(
                    name=SCORER,
                    scorer=SCORER,
                    scored_samples=valid,
                    unscored_samples=len(samples) - valid,
                    metrics=_inspect_metrics(summary, attempts),
                    metadata={"k_notes": summary.k_notes} if summary.k_notes else None,
                )
            ],
        ),
        stats=EvalStats(
            started_at=created,
            completed_at=_iso(ended) if ended else created,
            model_usage={model: usage},
        ),
        samples=samples,
    )


def export_inspect(run: str | Path, out: str | Path, log_format: str = "eval") -> list[Path]:
    """Write one Inspect eval log per harness of the run into the folder `out`; returns the files."""
    if log_format not in INSPECT_LOG_FORMATS:
        raise ExportError(f"unknown Inspect log format '{log_format}' (available: {', '.join(INSPECT_LOG_FORMATS)})")
    _require_inspect()
    from inspect_ai.log import write_eval_log

    run = Path(run)
    with open_run(run) as store:
        config = store.config or {}
        groups = _by_harness(store, with_tokens=False)
    if not groups:
        raise ExportError(f"{run} holds no episode to export")
    folder = new_out_dir(Path(out))
    written = []
    for harness, trajectories in groups.items():
        path = unused_path(folder / f"{file_name(run.resolve().name)}_{file_name(harness)}.{log_format}", harness)
        write_eval_log(inspect_log(trajectories, config, run), str(path))  # the format from the extension
        written.append(path)
    return written


# -- ATIF (Harbor) ----------------------------------------------------------------------------------


def _atif_observation(step: Step) -> dict[str, Any] | None:
    results = [
        {"source_call_id": _call_id(call, step.index, i), "content": result.output}
        for i, (call, result) in enumerate(zip(step.tool_calls, step.tool_results))
    ]
    return {"results": results} if results else None


def _atif_agent_step(step: Step, step_id: int, model: str, tokens: bool) -> dict[str, Any]:
    mc = step.model_call
    metrics: dict[str, Any] = {"prompt_tokens": mc.prompt_tokens, "completion_tokens": mc.completion_tokens}
    if tokens and mc.completion_ids:
        metrics.update(prompt_token_ids=mc.prompt_ids, completion_token_ids=mc.completion_ids, logprobs=mc.logprobs)
    extra: dict[str, Any] = {"step": step.index, "action": step.action.value, "finish_reason": mc.finish_reason}
    if step.parse_error:
        extra["parse_error"] = step.parse_error
    if step.tool_results:
        extra["tool_results"] = [
            {"name": r.name, "ok": r.ok, "blocked": None if r.blocked is None else r.blocked.value}
            for r in step.tool_results
        ]
    if mc.latency_s is not None:
        extra["latency_s"] = mc.latency_s
    if mc.policy_version is not None:
        extra["policy_version"] = mc.policy_version
    out: dict[str, Any] = {"step_id": step_id, "source": "agent", "model_name": model, "message": mc.text}
    if step.tool_calls:
        out["tool_calls"] = [
            {"tool_call_id": _call_id(c, step.index, i), "function_name": c.name, "arguments": c.arguments}
            for i, c in enumerate(step.tool_calls)
        ]
    observation = _atif_observation(step)
    if observation is not None:
        out["observation"] = observation
    out["metrics"] = metrics
    out["extra"] = extra
    return out


def atif_trajectory(t: Trajectory, config: dict[str, Any], run_name: str, tokens: bool = True) -> dict[str, Any]:
    """One episode as an ATIF trajectory (a JSON object).

    Steps: the system prompt (source "system"; demonstrations the harness put in the prompt go in
    its `extra`), the instruction (source "user"), then one "agent" step per model call with its
    tool calls, their results as the observation and its token counts (and, with `tokens`, the
    token ids and logprobs) as metrics; a note the harness gave the model after a step (a guard's
    feedback) follows it as a "system" step.
    """
    model = str(config.get("model") or "unknown")
    intro = _intro(t)
    steps: list[dict[str, Any]] = []
    system = "\n\n".join(m.content for m in intro if m.role == "system")
    shown = [m for m in intro if m.role != "system"]
    # the instruction is the last user message of the first prompt (after any demonstrations)
    at = max((i for i, m in enumerate(shown) if m.role == "user"), default=None)
    instruction = shown[at].content if at is not None else t.instruction
    before = shown[:at] if at is not None else shown
    after = shown[at + 1 :] if at is not None else []
    if system or before:
        step: dict[str, Any] = {"step_id": 1, "source": "system", "message": system}
        if before:
            step["extra"] = {"demonstrations": [m.model_dump(mode="json") for m in before]}
        steps.append(step)
    steps.append({"step_id": len(steps) + 1, "source": "user", "message": instruction})
    for m in after:  # a prompt that goes on after the instruction (a plan-execute loop's plan request)
        steps.append({"step_id": len(steps) + 1, "source": "user", "message": m.content})
    for s in t.steps:
        steps.append(_atif_agent_step(s, len(steps) + 1, model, tokens))
        for kind, note in _shown_interventions(s):
            steps.append(
                {
                    "step_id": len(steps) + 1,
                    "source": "system",
                    "message": note,
                    "extra": {"harness_intervention": kind},
                }
            )
    trajectory: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": t.episode_id,
        "agent": {
            "name": t.harness,
            "version": str(config.get("harnessrl_version") or __version__),
            "model_name": model,
            "extra": {"framework": "harnessrl"},
        },
        "steps": steps,
        "final_metrics": {  # ATIF's totals are the sums over its steps
            "total_prompt_tokens": sum(s.model_call.prompt_tokens for s in t.steps),
            "total_completion_tokens": sum(s.model_call.completion_tokens for s in t.steps),
            "total_steps": len(steps),
        },
        "extra": {
            **episode_metadata(t, run_name),
            "reward": None if t.is_infra_error else (t.grade.score if t.grade is not None else 0.0),
            "started_at": _iso(t.started_at) if t.started_at else None,
        },
    }
    if t.is_infra_error:
        trajectory["notes"] = f"infrastructure error (not the agent's fault; no reward): {t.infra_error}"
    return trajectory


def export_atif(run: str | Path, out: str | Path, tokens: bool = True) -> list[Path]:
    """Write one ATIF trajectory per episode into `out/<harness>/<task>.<attempt>.json`."""
    run = Path(run)
    with open_run(run) as store:
        config = store.config or {}
        trajectories = list(store.trajectories(with_tokens=tokens))
    if not trajectories:
        raise ExportError(f"{run} holds no episode to export")
    folder = new_out_dir(Path(out))
    run_name = run.resolve().name
    written = []
    for t in trajectories:
        sub = folder / file_name(t.harness)
        sub.mkdir(exist_ok=True)
        path = unused_path(sub / f"{file_name(t.task_id)}.{t.attempt}.json", t.episode_id)
        path.write_text(json.dumps(atif_trajectory(t, config, run_name, tokens), indent=1) + "\n", encoding="utf-8")
        written.append(path)
    return written
