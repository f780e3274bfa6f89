"""PinchBench task files (`--suite pinchbench:PATH`).

Layout: PATH is a skill folder holding `tasks/task_*.md` (and `assets/` for workspace files), or
PATH is the tasks folder itself (assets are then looked for in `PATH/../assets`). Each file has
YAML front matter (`id`, `category`, `grading_type` automated | llm_judge | hybrid,
`timeout_seconds`, `grading_weights`, `workspace_files`) and `## ` sections: `Prompt` (the
instruction), `Expected Behavior`, `Grading Criteria`, `Automated Checks` (a fenced Python block
defining `grade(transcript, workspace_path) -> dict`) and `LLM Judge Rubric`.

Grading as PinchBench does: the automated score is the mean of the numeric values `grade`
returns (other values are ignored); a hybrid score is `(auto * w_auto + judge * w_judge) /
(w_auto + w_judge)` with `grading_weights` (default 0.5 / 0.5). `grade` runs in a separate Python
process in the sandbox, with the workspace at `/tmp/pinchbench/harnessrl/agent_workspace` (the
path is passed to it, as PinchBench does) and the transcript in OpenClaw's session format. The
sandboxed shell sees the live workspace at that path too and starts there.

LLM-judge parts are graded only when the suite has a judge (`PinchBenchSuite(path, judge=fn)`,
`fn(prompt) -> reply text`; `policy_judge(policy)` makes one from any harnessrl model; from the
command line, `harnessrl eval --judge-model SPEC`). Without one, a hybrid task is scored on its automated part alone and
its Grade says so (`details.partially_graded`, `details.ungraded_weight`); a task that is judged
only cannot be scored at all and is left out of the suite (listed in `suite.skipped`), never
counted as a zero.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import yaml

from harnessrl.tasks.base import Environment, Task
from harnessrl.tasks.importers.common import (
    PYTHON,
    GraderError,
    GraderUnavailable,
    ImportedSuite,
    TaskEntry,
    TaskLoadError,
    broken,
    copy_file_into,
    grader_failed,
    openclaw_transcript,
    read_grader_output,
    read_text,
    relative_inside,
    run_grader,
    scratch_folder,
    working_directory_note,
)
from harnessrl.types import Grade

WORKSPACE = "/tmp/pinchbench/harnessrl/agent_workspace"
GRADER_DIR = "/tmp/pinchbench/harnessrl/grader"
GRADING_TYPES = ("automated", "llm_judge", "hybrid")
DEFAULT_WEIGHTS = {"automated": 0.5, "llm_judge": 0.5}

if TYPE_CHECKING:
    from harnessrl.models.base import Policy

Judge = Callable[[str], str]

# Runs inside the sandbox: executes the task's checks and writes what `grade` returned.
_DRIVER = """\
import json, sys
grader_dir, workspace = sys.argv[1], sys.argv[2]
with open(grader_dir + "/transcript.json", encoding="utf-8") as fh:
    transcript = json.load(fh)
namespace = {"__name__": "pinchbench_grade"}
with open(grader_dir + "/checks.py", encoding="utf-8") as fh:
    exec(compile(fh.read(), "checks.py", "exec"), namespace)
grade = namespace.get("grade")
if not callable(grade):
    sys.exit("the Automated Checks block defines no grade() function")
scores = grade(transcript, workspace)
with open(grader_dir + "/scores.json", "w", encoding="utf-8") as fh:
    json.dump(scores, fh, default=repr)
"""


def parse_task_file(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """(front matter, sections by `## ` header), or TaskLoadError."""
    text = read_text(path, "task file")
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n(.*)$", text, re.DOTALL)
    if not match:
        raise TaskLoadError(f"{path.name}: no YAML front matter (a '---' block at the top)")
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as e:
        raise TaskLoadError(f"{path.name}: malformed YAML front matter: {' '.join(str(e).split())}") from None
    if not isinstance(meta, dict):
        raise TaskLoadError(f"{path.name}: the front matter must be a mapping")
    sections: dict[str, str] = {}
    current = None
    for line in match.group(2).split("\n"):
        header = re.match(r"^##\s+(.+)$", line)
        if header:
            current = header.group(1).strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return meta, {k: v.strip() for k, v in sections.items()}


def _grading_code(sections: dict[str, str]) -> str | None:
    match = re.search(r"```python\s*(.*?)\s*```", sections.get("Automated Checks", ""), re.DOTALL)
    return match.group(1) if match else None


def _weights(meta: dict[str, Any], name: str) -> dict[str, float]:
    raw = meta.get("grading_weights") or DEFAULT_WEIGHTS
    if not isinstance(raw, dict):
        raise TaskLoadError(f"{name}: grading_weights must be a mapping")
    out = {}
    for key in DEFAULT_WEIGHTS:
        value = raw.get(key, DEFAULT_WEIGHTS[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise TaskLoadError(f"{name}: grading_weights.{key} must be a non-negative number")
        out[key] = float(value)
    if sum(out.values()) <= 0:  # PinchBench falls back to equal weights
        out = dict(DEFAULT_WEIGHTS)
    return out


def _workspace_files(meta: dict[str, Any], assets: Path, name: str) -> list[tuple[str, Path | str]]:
    """[(destination, source path or literal content)], checked at load time."""
    specs = meta.get("workspace_files") or []
    if not isinstance(specs, list):
        raise TaskLoadError(f"{name}: workspace_files must be a list")
    out: list[tuple[str, Path | str]] = []
    for spec in specs:
        if isinstance(spec, dict) and "content" in spec:
            dest = spec.get("path")
            if not isinstance(dest, str) or not isinstance(spec["content"], str):
                raise TaskLoadError(f"{name}: a workspace_files entry with content needs a string 'path'")
            out.append((str(relative_inside(dest, "workspace file")), spec["content"]))
            continue
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("source"), str)
            or not isinstance(spec.get("dest"), str)
        ):
            raise TaskLoadError(f"{name}: each workspace_files entry needs 'source' and 'dest' strings")
        source = assets / relative_inside(spec["source"], "asset")
        if not source.is_file():
            raise TaskLoadError(f"{name}: workspace file source not found: {source}")
        out.append((str(relative_inside(spec["dest"], "workspace file")), source))
    return out


class PinchBenchSuite(ImportedSuite):
    kind = "pinchbench"
    layout = "PATH/tasks/task_*.md (YAML front matter + '## Prompt' + '## Automated Checks'), PATH/assets/"

    def __init__(self, path: str | Path, grader_limits=None, judge: Judge | None = None):
        self.judge = judge
        super().__init__(path, grader_limits)

    def load_entries(self) -> list[TaskEntry]:
        tasks_dir = self.path / "tasks" if (self.path / "tasks").is_dir() else self.path
        assets = tasks_dir.parent / "assets"
        entries = []
        for file in sorted(tasks_dir.glob("task_*.md")):
            try:
                entry = self._entry(file, assets)
            except TaskLoadError as e:
                entries.append(broken(file.stem, "pinchbench", str(e)))
                continue
            if entry is not None:
                entries.append(entry)
        return entries

    def _entry(self, file: Path, assets: Path) -> TaskEntry | None:
        meta, sections = parse_task_file(file)
        name = file.name
        task_id = meta.get("id")
        if not isinstance(task_id, str) or not re.fullmatch(r"[\w.\-]+", task_id):
            raise TaskLoadError(f"{name}: 'id' must be a name of letters, digits, '_', '-' or '.'")
        grading_type = meta.get("grading_type", "automated")
        if grading_type not in GRADING_TYPES:
            raise TaskLoadError(f"{name}: grading_type must be one of {', '.join(GRADING_TYPES)}, not {grading_type!r}")
        prompt = sections.get("Prompt", "")
        if not prompt:
            raise TaskLoadError(f"{name}: no '## Prompt' section")
        code = _grading_code(sections)
        if grading_type != "llm_judge" and code is None:
            raise TaskLoadError(f"{name}: grading_type {grading_type} needs a ```python block in '## Automated Checks'")
        weights = _weights(meta, name)
        files = _workspace_files(meta, assets, name)
        if self.judge is None and (
            grading_type == "llm_judge" or grading_type == "hybrid" and weights["automated"] == 0
        ):
            self.skipped[task_id] = f"{task_id}: graded by an LLM judge only, and no judge is configured"
            return None
        family = str(meta.get("category") or "pinchbench")
        timeout = meta.get("timeout_seconds", 120)

        def setup(env: Environment) -> None:
            for dest, source in files:
                copy_file_into(source, env.require_workspace().root, dest)

        def grader(env: Environment) -> Grade:
            return self._grade(task_id, grading_type, code, weights, prompt, sections, env)

        return TaskEntry(
            native_id=task_id,
            family=family,
            instruction=prompt + working_directory_note(WORKSPACE),
            setup=setup,
            grader=grader,
            data={"grading_type": grading_type, "timeout_seconds": timeout, "grading_weights": weights},
            workspace_mount=WORKSPACE,
        )

    # -- grading --------------------------------------------------------------------------------
    def _grade(self, task_id, grading_type, code, weights, prompt, sections, env: Environment) -> Grade:
        transcript = openclaw_transcript(env, prompt, WORKSPACE)
        parts: dict[str, float] = {}  # part -> score, for the parts that were graded
        subscores: dict[str, float] = {}
        details: dict[str, Any] = {"grading_type": grading_type}
        if grading_type in ("automated", "hybrid"):
            scores, ignored = self._automated(code, transcript, env)
            parts["automated"] = sum(scores.values()) / len(scores)
            prefix = "automated." if grading_type == "hybrid" else ""
            subscores.update({prefix + k: v for k, v in scores.items()})
            if ignored:
                details["ignored_non_numeric"] = ignored
        if grading_type in ("llm_judge", "hybrid"):
            if self.judge is None:
                details["ungraded"] = ["llm_judge"]
            else:
                total, scores, notes = self._judged(prompt, sections, transcript)
                parts["llm_judge"] = total
                prefix = "llm_judge." if grading_type == "hybrid" else ""
                subscores.update({prefix + k: v for k, v in scores.items()} or {prefix + "total": total})
                details["judge_notes"] = notes
        if grading_type == "hybrid":
            graded_weight = sum(weights[p] for p in parts)
            score = sum(parts[p] * weights[p] for p in parts) / graded_weight
            details["weights"] = weights
            details["partially_graded"] = "llm_judge" not in parts
            details["ungraded_weight"] = 1.0 - graded_weight / sum(weights.values())
        else:
            (score,) = parts.values()
        return Grade(score=score, subscores=subscores, passed=score >= 1.0 - 1e-9, threshold=1.0, details=details)

    def _automated(self, code: str, transcript: list, env: Environment) -> tuple[dict[str, float], list[str]]:
        with scratch_folder("harnessrl-pinchbench-") as scratch:
            grader_dir = scratch
            (grader_dir / "checks.py").write_text(code, encoding="utf-8")
            (grader_dir / "driver.py").write_text(_DRIVER, encoding="utf-8")
            (grader_dir / "transcript.json").write_text(json.dumps(transcript), encoding="utf-8")
            result = run_grader(
                # -I: the grader's Python imports nothing from the workspace (its working folder)
                [PYTHON, "-I", f"{GRADER_DIR}/driver.py", GRADER_DIR, WORKSPACE],
                workdir=grader_dir,
                mounts={WORKSPACE: env.require_workspace().root, GRADER_DIR: grader_dir},
                cwd=WORKSPACE,
                env={"HOME": "/tmp", "LC_ALL": "C.UTF-8"},
                limits=self.limits_for(None),
            )
            if result.returncode != 0:
                raise grader_failed("the Automated Checks grade() failed", result)
            try:
                raw = json.loads(read_grader_output(grader_dir, "scores.json", "grade()'s result") or "")
            except json.JSONDecodeError as e:
                raise GraderError(f"grade() left no readable result: {e}") from None
        return _numeric_scores(raw)

    def _judged(self, prompt: str, sections: dict[str, str], transcript: list) -> tuple[float, dict[str, float], str]:
        rubric = sections.get("LLM Judge Rubric") or sections.get("Grading Criteria", "")
        if self.judge is None:
            raise GraderUnavailable("the task has an LLM-judge part, and no judge is configured")
        try:
            reply = self.judge(judge_prompt(prompt, sections.get("Expected Behavior", ""), transcript, rubric))
        except Exception as e:
            raise GraderUnavailable(f"the judge failed: {type(e).__name__}: {e}") from None
        return parse_judge_reply(reply)


def _numeric_scores(raw: Any) -> tuple[dict[str, float], list[str]]:
    """PinchBench keeps the numeric values of grade()'s dict; nothing numeric is not a score."""
    if not isinstance(raw, dict):
        raise GraderError(f"grade() returned {type(raw).__name__}, not a dict of scores: {str(raw)[:200]}")
    scores = {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))}
    ignored = [str(k) for k, v in raw.items() if not isinstance(v, (int, float))]
    if not scores:
        raise GraderError(f"grade() returned no numeric scores: {json.dumps(raw)[:200]}")
    bad = {k: v for k, v in scores.items() if not 0.0 <= v <= 1.0}
    if bad:
        raise GraderError(f"grade() returned scores outside [0, 1]: {bad}")
    return scores, ignored


# ----------------------------------------------------------------------------------------------
# The judge


def summarize_transcript(transcript: list[dict[str, Any]]) -> str:
    """Tool calls, result previews and user messages, one line each (what the judge reads)."""
    lines = []
    for event in transcript:
        msg = event.get("message", {}) if event.get("type") == "message" else {}
        role, content = msg.get("role"), msg.get("content", [])
        if role == "assistant":
            for item in content:
                if item.get("type") == "toolCall":
                    lines.append(f"Tool: {item.get('name')}({json.dumps(item.get('arguments', {}))})")
                elif item.get("type") == "text":
                    lines.append(f"Assistant: {item.get('text', '')}")
        elif role == "toolResult" and content:
            lines.append(f"Result: {str(content[0])[:200]}")
        elif role == "user" and content:
            lines.append(f"User: {content[0]}")
    return "\n".join(lines)


def judge_prompt(task_prompt: str, expected: str, transcript: list, rubric: str) -> str:
    return (
        "You are a grading function. Reply with one JSON object and nothing else.\n\n"
        f"## Task\n{task_prompt}\n\n## Expected Behavior\n{expected}\n\n"
        f"## Agent Transcript (summarized)\n{summarize_transcript(transcript)}\n\n"
        f"## Grading Rubric\n{rubric}\n\n"
        "Score each criterion from 0.0 to 1.0. Reply exactly in this form:\n"
        '{"scores": {"criterion_name": 0.0}, "total": 0.0, "notes": "brief justification"}'
    )


def policy_judge(policy: "Policy", max_new_tokens: int = 1024) -> Judge:
    """A judge from any harnessrl model (`OpenAIPolicy`, a local HF model, ...), greedy. Episodes
    are graded in their own threads, so the judge asks through `submit`, which any backend serves
    from many threads at once."""
    from harnessrl.models.base import GenerationRequest, SamplingParams
    from harnessrl.types import Message

    def judge(prompt: str) -> str:
        request = GenerationRequest(messages=[Message(role="user", content=prompt)], max_new_tokens=max_new_tokens)
        call = policy.submit(request, SamplingParams(temperature=0.0)).result()
        return call.text

    return judge


class ModelJudge:
    """The judge `policy_judge(load_policy(spec))`, its model loaded by `load()` rather than when
    made: the suite needs the judge when it is built, and a run checks its whole configuration
    before any slow model loading."""

    def __init__(self, spec: str, api_key_env: str | None = None):
        self.spec = spec
        self.api_key_env = api_key_env
        self._judge: Judge | None = None

    def load(self) -> None:
        from harnessrl.models import load_policy

        self._judge = policy_judge(load_policy(self.spec, api_key_env=self.api_key_env))

    def __call__(self, prompt: str) -> str:
        if self._judge is None:
            raise RuntimeError(f"the judge model '{self.spec}' was never loaded (call load() first)")
        return self._judge(prompt)


def is_judged(task: Task) -> bool:
    """Whether a task has a part graded by an LLM judge (a PinchBench llm_judge or hybrid task)."""
    return task.suite == PinchBenchSuite.kind and task.data.get("grading_type") in ("llm_judge", "hybrid")


def parse_judge_reply(reply: str) -> tuple[float, dict[str, float], str]:
    """(total, per-criterion scores, notes) from the judge's JSON; GraderError when there is none.

    The last JSON object in the reply counts; `total` defaults to the mean of `scores`.
    """
    for candidate in reversed(re.findall(r"\{(?:[^{}]|\{[^{}]*\})*\}", reply or "")):
        try:
            parsed = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if not isinstance(parsed, dict):
            continue
        listed = parsed.get("scores")
        raw: dict[str, Any] = listed if isinstance(listed, dict) else {}
        scores = {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        total = parsed.get("total")
        if not isinstance(total, (int, float)) or isinstance(total, bool):
            total = sum(scores.values()) / len(scores) if scores else None
        if total is None:
            continue
        if not 0.0 <= total <= 1.0 or any(not 0.0 <= v <= 1.0 for v in scores.values()):
            raise GraderUnavailable(f"the judge gave a score outside [0, 1]: {candidate[:200]}")
        return float(total), scores, str(parsed.get("notes", ""))
    raise GraderUnavailable(f"the judge's reply holds no JSON score: {(reply or '')[:200]!r}")
