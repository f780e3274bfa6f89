"""The trajectory viewer's data: compact index pages and one detail file per episode.

Layout inside the report folder:

    episodes/index-000.js ...   PAGE_SIZE compact episode summaries per page (id, harness, task,
                                family, passed, score, triage class and step, n_steps, termination)
    episodes/<episode_id>.js    everything about one episode, for the detail view
    episodes/<run>/<id>.js      (comparison reports: episode ids repeat across runs)

Every data file is a tiny JavaScript file that hands its JSON to the viewer,

    window.__hr_data("episodes/index-000", {...});

and the viewer loads it with a <script src> tag. Unlike fetch(), which Chromium refuses for
file:// URLs, a script tag loads both from disk and over http, so ONE loader serves a report
opened as a file and a report served by `serve()`. Python reads one back with `read_data_file`.

Nothing is inlined into index.html: opening a 10,000-episode report loads the page, the small
summary inside it and the first index page; other pages and episode files load on demand.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from harnessrl.types import CALL_TIMINGS, Message, ModelCall, Trajectory

PAGE_SIZE = 500
MAX_FIELD_CHARS = 20_000
CALLBACK = "window.__hr_data"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


def truncate(text: str | None, limit: int = MAX_FIELD_CHARS) -> str | None:
    """Cut a displayed text at `limit` characters and say so (the run database keeps it whole)."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit] + f"\n[truncated, {len(text)} chars; full text in the run database]"


def _json_text(value: Any) -> str | None:
    if value is None or value == {} or value == []:
        return None
    text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > 80:  # pretty-print only what does not fit on a line (indent= is the slow encoder)
        text = json.dumps(value, indent=1, ensure_ascii=False, default=str)
    return truncate(text)


def file_stem(episode_id: str) -> str:
    """A file name for an episode id: the id itself when it is a safe name (it always is for
    ids made by the runner), else a hash of it."""
    if _SAFE_NAME.match(episode_id) and not episode_id.startswith("index-"):
        return episode_id
    import hashlib

    return "ep-x" + hashlib.sha256(episode_id.encode()).hexdigest()[:24]


def write_data_file(path: Path, key: str, data: Any) -> None:
    # ensure_ascii: the file is pure ASCII, so no encoding, line-separator or surrogate surprises.
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    path.write_text(f"{CALLBACK}({json.dumps(key)},{payload});\n", encoding="ascii")


def read_data_file(path: str | Path) -> tuple[str, Any]:
    """(key, data) of a file written by `write_data_file`."""
    text = Path(path).read_text(encoding="ascii")
    head = CALLBACK + "("
    if not text.startswith(head):
        raise ValueError(f"{path}: not a report data file")
    dec = json.JSONDecoder()
    key, i = dec.raw_decode(text, len(head))
    if text[i] != ",":
        raise ValueError(f"{path}: malformed report data file")
    data, _ = dec.raw_decode(text, i + 1)
    return key, data


def _common_prefix(a: list[Message], b: list[Message]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def call_timings(call: ModelCall) -> dict[str, float] | None:
    """The call's measured timings (latency, queue, prefill, decode, ttft: seconds), rounded;
    None when its backend measured none."""
    out = {k[:-2]: round(v, 4) for k in CALL_TIMINGS if (v := getattr(call, k)) is not None}
    return out or None


def time_breakdown(t: Trajectory) -> dict | None:
    """Where the episode's time went, as parts that add up to its wall clock (seconds):

        queue, prefill, decode   the model calls' own parts, summed over its calls
        model, other             latency - queue - prefill - decode: rendering the prompt, the
                                 engine's steps spent on other requests' prefills, the transport
        tools, setup, grading    own_s - latency: everything the episode did itself
        waiting                  duration_s - own_s: the wall clock it was not running (waiting
                                 for a worker or another episode's turn)

    A part its records cannot tell is left out (a backend that measures only latency has one
    "model" part). None when no call measured its latency (records written before timings)."""
    calls = [s.model_call for s in t.steps]
    latencies = [c.latency_s for c in calls if c.latency_s is not None]
    if not latencies:
        return None
    latency = sum(latencies)
    parts: list[dict] = []
    inside = 0.0
    for name in ("queue", "prefill", "decode"):
        values = [v for c in calls if (v := getattr(c, f"{name}_s")) is not None]
        if values:
            parts.append({"part": name, "s": sum(values)})
            inside += sum(values)
    # (the engine's parts of one call never exceed its latency; clamped for rounding)
    parts.append({"part": "model, other" if inside else "model", "s": max(0.0, latency - inside)})
    if t.own_s > 0:
        parts.append({"part": "tools, setup, grading", "s": max(0.0, t.own_s - latency)})
        if t.duration_s > t.own_s:
            parts.append({"part": "waiting", "s": t.duration_s - t.own_s})
    return {
        "parts": [{"part": p["part"], "s": round(p["s"], 4)} for p in parts],
        "latency_s": round(latency, 4),
        "n_calls_timed": len(latencies),
        "n_calls": len(calls),
    }


def episode_detail(
    t: Trajectory, verdict: dict | None, run: str, completion_tokens: dict[int, int] | None = None
) -> dict:
    """Everything the detail view shows about one episode (token ids left out).

    Each step's prompt is stored as `prompt_prefix` (how many messages it shares with the
    previous step's prompt) plus the new messages: a conversation re-sent whole at every step
    would make the file grow with the square of the episode length. `completion_tokens` maps a
    step index to its completion length (the trajectory is read without its token ids).
    """
    completion_tokens = completion_tokens or {}
    steps = []
    prev: list[Message] = []
    for s in t.steps:
        msgs = s.model_call.messages
        prefix = _common_prefix(prev, msgs)
        prev = msgs
        steps.append(
            {
                "index": s.index,
                "action": s.action.value,
                "finish_reason": s.model_call.finish_reason,
                "n_completion_tokens": s.model_call.n_completion_tokens
                or len(s.model_call.completion_ids)
                or completion_tokens.get(s.index),
                "n_prompt_tokens": s.model_call.n_prompt_tokens or len(s.model_call.prompt_ids) or None,
                "timings": call_timings(s.model_call),
                "prompt_prefix": prefix,
                "n_messages": len(msgs),
                "messages": [{"role": m.role, "name": m.name, "content": truncate(m.content)} for m in msgs[prefix:]],
                "completion": truncate(s.model_call.text),
                "tool_calls": [
                    {"name": c.name, "arguments": _json_text(c.arguments) or "{}", "raw": truncate(c.raw)}
                    for c in s.tool_calls
                ],
                "parse_error": truncate(s.parse_error),
                "tool_results": [
                    {
                        "name": r.name,
                        "ok": r.ok,
                        "blocked": None if r.blocked is None else r.blocked.value,
                        "output": truncate(r.output),
                        "full_output": truncate(r.full_output),
                    }
                    for r in s.tool_results
                ],
                "interventions": [{"kind": i.kind, "message": truncate(i.message)} for i in s.interventions],
            }
        )
    g = t.grade
    return {
        "id": t.episode_id,
        "run": run,
        "harness": t.harness,
        "task": t.task_id,
        "suite": t.suite,
        "family": t.family,
        "split": t.split,
        "attempt": t.attempt,
        "instruction": truncate(t.instruction),
        "termination": None if t.termination is None else t.termination.value,
        "termination_detail": truncate(t.termination_detail),
        "submitted": t.submitted,
        "answer": truncate(t.answer),
        "grade": None
        if g is None
        else {
            "score": g.score,
            "passed": g.passed,
            "threshold": g.threshold,
            "subscores": g.subscores,
            "details": _json_text(g.details),
        },
        "infra_error": truncate(t.infra_error),
        # an external agent's requests the recording endpoint refused (route, status, why)
        "refused_requests": [
            f"{r.method} {r.route} -> {r.status} after {r.after_calls} model calls: {truncate(r.message)}"
            for r in t.refused_requests
        ],
        "retries": t.retries,
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.completion_tokens,
        "duration_s": round(t.duration_s, 3),
        "own_s": round(t.own_s, 3),
        "time": time_breakdown(t),
        "meta": _json_text(t.meta),
        "verdict": verdict,
        "steps": steps,
    }


def episode_row(t: Trajectory, verdict: dict | None, run: str, file: str) -> dict:
    """The compact summary of one episode in an index page."""
    return {
        "id": t.episode_id,
        "file": file,
        "run": run,
        "harness": t.harness,
        "task": t.task_id,
        "family": t.family,
        "attempt": t.attempt,
        "passed": bool(t.grade is not None and t.grade.passed),
        "score": None if t.grade is None else round(t.grade.score, 4),
        "class": None if verdict is None else verdict["class"],
        "step": None if verdict is None else verdict["step"],
        "n_steps": len(t.steps),
        "termination": None if t.termination is None else t.termination.value,
    }


class EpisodeWriter:
    """Writes detail files as episodes come and index pages every PAGE_SIZE episodes, so memory
    stays flat however large the run is."""

    def __init__(self, out_dir: Path, page_size: int = PAGE_SIZE):
        self.out_dir = out_dir
        self.dir = out_dir / "episodes"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.page_size = page_size
        self.buffer: list[dict] = []
        self.pages: list[str] = []
        self.n = 0

    def add(
        self,
        t: Trajectory,
        verdict: dict | None,
        run: str,
        subdir: str = "",
        completion_tokens: dict[int, int] | None = None,
    ) -> None:
        folder = self.dir / subdir if subdir else self.dir
        if subdir:
            folder.mkdir(exist_ok=True)
        stem = file_stem(t.episode_id)
        rel = f"episodes/{subdir + '/' if subdir else ''}{stem}.js"
        write_data_file(folder / f"{stem}.js", rel[:-3], episode_detail(t, verdict, run, completion_tokens))
        self.buffer.append(episode_row(t, verdict, run, rel))
        self.n += 1
        if len(self.buffer) >= self.page_size:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        rel = f"episodes/index-{len(self.pages):03d}.js"
        write_data_file(self.out_dir / rel, rel[:-3], {"page": len(self.pages), "episodes": self.buffer})
        self.pages.append(rel)
        self.buffer = []
