"""Proposers: given the incumbent and how it failed, propose candidate harnesses.

- `RulesProposer` (offline): reads the incumbent's triage and applies the edits known to fix
  the dominant failure class (RULE_EDITS), one hypothesis per candidate, skipping candidates
  already tried.
- `LLMProposer`: a model (any Policy; in practice an OpenAI-compatible server) reads the
  incumbent spec, earlier candidates with their scores and FULL failing trajectories, and
  writes a new spec with a hypothesis. A reply that is not a valid spec becomes an invalid
  proposal (recorded and counted by the loop), never an exception.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from harnessrl.evolve.edits import apply_changes, spec_fingerprint, spec_from_text
from harnessrl.harness.spec import HarnessSpec, SpecError
from harnessrl.models.base import GenerationRequest, Policy, PolicyError, SamplingParams
from harnessrl.triage import CLASSES, CONTENT, PROCESS
from harnessrl.types import Message, ToolSchema, Trajectory


@dataclass
class Proposal:
    hypothesis: str
    target: str  # the failure class the edit is meant to fix
    edit: str  # catalogue name (rules) or "llm"
    spec: HarnessSpec | None  # None: invalid, see `error`
    error: str | None = None
    raw: str = ""  # the model's reply (llm), kept for the record

    def to_json(self) -> dict[str, Any]:
        return {
            "hypothesis": self.hypothesis,
            "target": self.target,
            "edit": self.edit,
            "spec": None if self.spec is None else self.spec.to_dict(),
            "error": self.error,
            "raw": self.raw,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Proposal":
        from harnessrl.harness.spec import parse_spec, require_loop_harness

        spec = (
            None if d["spec"] is None else require_loop_harness(parse_spec(d["spec"], "stored proposal"), "a proposal")
        )
        return cls(d["hypothesis"], d["target"], d["edit"], spec, d.get("error"), d.get("raw", ""))


@dataclass
class ProposalContext:
    iteration: int
    incumbent: HarnessSpec
    triage: dict[str, Any]  # `harnessrl.triage.triage(...)` entry of the re-measured incumbent
    failures: list[Trajectory]  # the incumbent's failed dev episodes of this iteration
    history: list[dict[str, Any]]  # earlier evolution.jsonl records
    tools: list[ToolSchema]  # the tools of the dev tasks (demonstrations and helpers must fit them)
    n: int  # how many candidates to propose
    tried: set[str] = field(default_factory=set)  # fingerprints of specs already evaluated
    # A solved train task replayed for real (see `worked_example`): a demonstration of the whole
    # path of a task, with the tools' actual results, rather than a generic call-then-submit.
    worked_example: dict[str, Any] | None = None


class Proposer(Protocol):
    name: str

    def propose(self, ctx: ProposalContext) -> list[Proposal]: ...


# ------------------------------------------------------------------------------------------------
# rules


@dataclass
class RuleEdit:
    name: str
    hypothesis: str
    # incumbent, context -> {dotted path: new value}; {} when the edit does not apply
    changes: Callable[[HarnessSpec, ProposalContext], dict[str, Any]]


def _example_value(name: str, schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "integer":
        return 3
    if kind == "number":
        return 2.5
    if kind == "boolean":
        return True
    if "path" in name or name in ("source", "destination"):
        return "notes.txt"
    return "example"


def worked_example(tasks: list, max_calls: int = 4, max_result_chars: int = 300) -> dict[str, Any] | None:
    """A demonstration built by replaying the known solution of the first suitable task (train
    split: never a decision or held-out task) in a fresh environment: its instruction, every call
    with the result the tool really gave, and the final submit. None when no task fits."""
    from harnessrl.tasks.base import ToolBlocked, ToolFailed

    for task in tasks:
        sol = list(getattr(task, "solution", None) or [])
        if not sol or len(sol) > max_calls or sol[-1].get("name") != "submit":
            continue
        env = task.make_env()
        try:
            calls = []
            for call in sol:
                result = ""
                if call["name"] != "submit":
                    tool = task.tool(call["name"])
                    if tool is None:
                        break
                    try:
                        result = str(tool.fn(env, **call.get("arguments", {})))
                    except (ToolBlocked, ToolFailed) as e:
                        result = f"error: {e}"
                calls.append(
                    {
                        "thought": "",
                        "name": call["name"],
                        "arguments": dict(call.get("arguments", {})),
                        "result": result[:max_result_chars],
                    }
                )
            else:
                return {"instruction": task.instruction, "calls": calls}
        finally:
            env.close()
    return None


def _format_demonstration(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    """A worked example in the exact call format: a solved task replayed for real when the loop
    has one (it shows looking before submitting), else one tool call the tasks have, then submit."""
    current = [d.model_dump(mode="json") for d in spec.rules.demonstrations]
    example = ctx.worked_example
    if example and example["instruction"] not in {d.instruction for d in spec.rules.demonstrations}:
        return {"rules.demonstrations": current + [example]}
    shown = {c.name for d in spec.rules.demonstrations for c in d.calls}
    for tool in ctx.tools:
        if tool.name == "submit" or tool.name in shown:
            continue
        props = tool.parameters.get("properties", {})
        required = tool.parameters.get("required", [])
        args = {k: _example_value(k, props.get(k, {})) for k in required}
        demo = {
            "instruction": f"Example: call {tool.name} once, then submit what it returned.",
            "calls": [
                {"thought": f"I call {tool.name}.", "name": tool.name, "arguments": args, "result": "done"},
                {"thought": "I have the result.", "name": "submit", "arguments": {"answer": "done"}},
            ],
        }
        return {"rules.demonstrations": [d.model_dump(mode="json") for d in spec.rules.demonstrations] + [demo]}
    return {}


def _full_feedback(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    return {"rules.feedback": {"malformed": True, "blocked": True, "show_format": True}, "protocol.lenient": True}


def _with_lessons(spec: HarnessSpec, lessons: list[str]) -> dict[str, Any]:
    current = list(spec.capabilities.experiences)
    new = [le for le in lessons if le not in current]
    if not new:
        return {}
    return {"capabilities.experiences": (current + new)[-20:]}


def _evidence(ctx: ProposalContext, cls: str) -> list[str]:
    return [e["evidence"] for e in ctx.triage.get("episodes", []) if e["class"] == cls]


def _blocked_lesson(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    common = Counter(re.sub(r"\s+", " ", ev)[:160] for ev in _evidence(ctx, "blocked_call")).most_common(1)
    seen = f" Earlier a call was refused: {common[0][0]}" if common else ""
    return _with_lessons(
        spec,
        [f"Call only the listed tools, with every required argument, and paths relative to the workspace.{seen}"[:400]],
    )


def _loop_guard(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    guard = spec.rules.loop_guard
    if not guard.enabled:
        return {"rules.loop_guard.enabled": True, "rules.loop_guard.repeats": 3, "rules.loop_guard.action": "warn"}
    if guard.repeats > 2:
        return {"rules.loop_guard.repeats": 2}
    return {}


def _ledger(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    return {} if spec.capabilities.ledger.enabled else {"capabilities.ledger.enabled": True}


def _budget_notice(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    notice = spec.rules.budget_notice
    if not notice.enabled:
        return {"rules.budget_notice.enabled": True, "rules.budget_notice.remaining_steps": 3}
    if notice.remaining_steps < 4:
        return {"rules.budget_notice.remaining_steps": notice.remaining_steps + 2}
    return {}


def _plan_checkpoint(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    return {} if spec.loop.kind == "plan-execute" else {"loop.kind": "plan-execute"}


def _more_steps(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    r = spec.rules
    if r.max_steps >= 40:
        return {}
    changes: dict[str, Any] = {"rules.max_steps": min(40, r.max_steps + max(2, r.max_steps // 2))}
    if r.max_total_tokens is not None:
        changes["rules.max_total_tokens"] = r.max_total_tokens + r.max_total_tokens // 2
    return changes


def _submit_lesson(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    return _with_lessons(spec, ["Every task ends with a call to the submit tool; never stop without submitting."])


def _verify_checkpoint(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    return {} if spec.rules.submit_checkpoint.enabled else {"rules.submit_checkpoint.enabled": True}


def _evidence_lesson(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    missing: Counter[str] = Counter()
    for ev in _evidence(ctx, "insufficient_evidence"):
        for name in ev.removeprefix("submitted without a successful ").split(","):
            missing[name.strip()] += 1
    tools = ", ".join(n for n, _ in missing.most_common(3)) or "the tools that read the inputs"
    return _with_lessons(spec, [f"Before answering, call {tools} and base the answer on what it returns."])


def _experience_library(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    """One short lesson per failing task family: which sub-scores fell short."""
    lessons = []
    by_family: dict[str, str] = {}
    for e in ctx.triage.get("episodes", []):
        if e["class"] == "content" and e["family"] not in by_family:
            by_family[e["family"]] = e["evidence"]
    instructions = {t.family: t.instruction for t in ctx.failures}
    for family, evidence in sorted(by_family.items())[:5]:
        short = [name for name, value in re.findall(r"(\w+)=([0-9.]+)", evidence) if float(value) < 1.0]
        what = ", ".join(short) or "the final result"
        task = " ".join(instructions.get(family, family).split())[:90]
        lessons.append(
            f'In a task like "{task}", submitted work fell short on: {what}. Check exactly that before submitting.'
        )
    return _with_lessons(spec, lessons)


# helpers built from tools the suites commonly have: (needed tools, helper spec)
HELPER_CATALOGUE: list[tuple[set[str], dict[str, Any]]] = [
    (
        {"list_dir", "read_file"},
        {
            "name": "look_and_read",
            "description": "List the workspace, then read one file: both outputs in one step.",
            "parameters": {"path": "the file to read, relative to the workspace"},
            "calls": [
                {"tool": "list_dir", "arguments": {"path": "."}},
                {"tool": "read_file", "arguments": {"path": "{path}"}},
            ],
        },
    ),
    (
        {"write_file", "read_file"},
        {
            "name": "write_and_check",
            "description": "Write a file, then read it back so you can verify its exact content.",
            "parameters": {"path": "the file to write, relative to the workspace", "content": "the full new content"},
            "calls": [
                {"tool": "write_file", "arguments": {"path": "{path}", "content": "{content}"}},
                {"tool": "read_file", "arguments": {"path": "{path}"}},
            ],
        },
    ),
]


def _helper_tools(spec: HarnessSpec, ctx: ProposalContext) -> dict[str, Any]:
    available = {t.name for t in ctx.tools}
    have = {h.name for h in spec.capabilities.helper_tools}
    new = [h for needs, h in HELPER_CATALOGUE if needs <= available and h["name"] not in have]
    if not new:
        return {}
    current = [h.model_dump(mode="json") for h in spec.capabilities.helper_tools]
    return {"capabilities.helper_tools": current + new}


RULE_EDITS: dict[str, list[RuleEdit]] = {
    "malformed_call": [
        RuleEdit(
            "format-demonstration",
            "Malformed replies: a worked example in the exact call format, with a tool the tasks have, "
            "shows the model what to write.",
            _format_demonstration,
        ),
        RuleEdit(
            "format-feedback",
            "Malformed replies: feedback that says why the reply failed and shows the format, and a lenient parser, "
            "turn near-misses into calls.",
            _full_feedback,
        ),
    ],
    "blocked_call": [
        RuleEdit(
            "blocked-feedback",
            "Refused calls: telling the model why a call was refused, with the format, lets it correct the call.",
            _full_feedback,
        ),
        RuleEdit(
            "tool-usage-lesson",
            "Refused calls: a lesson naming the refusal seen before steers the model to valid tools and arguments.",
            _blocked_lesson,
        ),
    ],
    "loop": [
        RuleEdit(
            "loop-guard",
            "Loops: a guard that notices repeated action/result pairs and tells the model to change course "
            "breaks them.",
            _loop_guard,
        ),
        RuleEdit(
            "state-ledger", "Loops: a ledger of what was already done shows the model it is repeating itself.", _ledger
        ),
    ],
    "budget_exhausted": [
        RuleEdit(
            "budget-notice",
            "Budget runs out: an earlier notice of the remaining steps makes the model submit in time.",
            _budget_notice,
        ),
        RuleEdit(
            "plan-checkpoint",
            "Budget runs out: a plan written before acting keeps the episode on a short path.",
            _plan_checkpoint,
        ),
        RuleEdit("more-steps", "Budget runs out: the tasks need more steps than the harness allows.", _more_steps),
    ],
    "no_delivery": [
        RuleEdit(
            "submit-lesson",
            "No delivery: the model stops without submitting; a standing lesson to always submit fixes it.",
            _submit_lesson,
        ),
        RuleEdit("budget-notice", "No delivery: a notice of the remaining steps prompts a submission.", _budget_notice),
    ],
    "insufficient_evidence": [
        RuleEdit(
            "verify-before-submit",
            "Submits without evidence: holding back the first submit with a reminder to verify "
            "makes the model read first.",
            _verify_checkpoint,
        ),
        RuleEdit(
            "evidence-lesson",
            "Submits without evidence: a lesson naming the tools to call before answering.",
            _evidence_lesson,
        ),
    ],
    "content": [
        RuleEdit(
            "experience-library",
            "Poor delivered work: short lessons from the earlier failures of each task family "
            "point at what fell short.",
            _experience_library,
        ),
        RuleEdit(
            "state-ledger",
            "Poor delivered work: a ledger of every call and result keeps the facts the answer needs in view.",
            _ledger,
        ),
        RuleEdit(
            "helper-tools",
            "Poor delivered work: helper tools that read back what was written make verification one step.",
            _helper_tools,
        ),
    ],
}

assert set(RULE_EDITS) == set(PROCESS + CONTENT)


class RulesProposer:
    """The catalogue edits of the dominant failure classes, in order of dominance."""

    name = "rules"

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        counts = ctx.triage.get("counts", {})
        classes = sorted(
            (c for c in PROCESS + CONTENT if counts.get(c, 0) > 0), key=lambda c: (-counts[c], CLASSES.index(c))
        )
        out: list[Proposal] = []
        seen = set(ctx.tried) | {spec_fingerprint(ctx.incumbent)}
        for cls in classes:
            for edit in RULE_EDITS[cls]:
                if len(out) >= ctx.n:
                    return out
                changes = edit.changes(ctx.incumbent, ctx)
                if not changes:
                    continue
                try:
                    spec = apply_changes(ctx.incumbent, changes)
                except SpecError as e:
                    out.append(Proposal(edit.hypothesis, cls, edit.name, None, error=str(e)))
                    continue
                fp = spec_fingerprint(spec)
                if fp in seen:
                    continue
                seen.add(fp)
                out.append(Proposal(edit.hypothesis, cls, edit.name, spec))
        return out


# ------------------------------------------------------------------------------------------------
# llm

LLM_SYSTEM = """You improve the harness of an AI agent: the system prompt, tool-call protocol, control loop,
session rules and capabilities around a fixed model. The harness is a YAML spec. You get the
current spec, earlier candidate edits with their measured effect, and full trajectories of
episodes that failed, each with the first failure signal found by triage.

Reply with exactly this format:
HYPOTHESIS: <one sentence: what you change and why it should fix the failures>
TARGET: <one of: {classes}>
```yaml
<the complete new harness spec>
```
Change one idea at a time. Keep every field valid; the spec schema:
{schema}"""

SCHEMA_SUMMARY = """name, description, system_prompt (placeholders {tools} {max_steps} {bootstrap} {memory} only;
literal braces doubled), protocol {format: json|xml|react|code|hermes, lenient, native_tools},
loop {kind: react|plan-execute, plan_prompt, execute_prompt},
rules {max_steps, max_new_tokens, max_total_tokens, timeout_s, history_window, plain_text_answer,
demonstrations [{instruction, calls [{thought, name, arguments, result}]}],
feedback {malformed, blocked, show_format}, loop_guard {enabled, repeats, action: warn|stop, message},
budget_notice {enabled, remaining_steps, message}, submit_checkpoint {enabled, message}},
bootstrap {files {NAME: text}, memory_tool},
capabilities {ledger {enabled, max_entries}, experiences [short lessons],
helper_tools [{name, description, parameters {NAME: description}, calls [{tool, arguments}]}]}"""


def render_trajectory(traj: Trajectory, verdict: dict[str, Any] | None) -> str:
    """A whole episode as text: every reply, every observation, the end and the grade."""
    lines = [f"### Episode {traj.episode_id} (task family {traj.family})", f"TASK: {traj.instruction}"]
    if verdict is not None:
        lines.append(f"TRIAGE: {verdict['class']} at step {verdict['step']}: {verdict['evidence']}")
    for step in traj.steps:
        lines.append(f"--- step {step.index} ({step.action.value})")
        lines.append(f"MODEL: {step.model_call.text}")
        if step.parse_error:
            lines.append(f"PARSE ERROR: {step.parse_error}")
        for call, res in zip(step.tool_calls, step.tool_results):
            tag = "REFUSED" if res.blocked is not None else ("OK" if res.ok else "FAILED")
            lines.append(f"CALL {call.name} {json.dumps(call.arguments, default=str)} -> {tag}: {res.output}")
        for iv in step.interventions:
            lines.append(f"HARNESS ({iv.kind}): {iv.message}")
    grade = "not graded" if traj.grade is None else f"score {traj.grade.score:.2f} {traj.grade.subscores}"
    lines.append(
        f"END: {traj.termination.value if traj.termination else '?'} ({traj.termination_detail}); "
        f"submitted={traj.submitted}; {grade}"
    )
    return "\n".join(lines)


def render_history(history: list[dict[str, Any]], limit: int = 12) -> str:
    rows = []
    for h in history[-limit:]:
        delta = "-" if h.get("delta") is None else f"{h['delta']:+.3f}"
        verdict = "accepted" if h.get("accepted") else h.get("status", "rejected")
        if not h.get("accepted") and (h.get("confirmation") or {}).get("delta") is not None:
            verdict += f", beat the threshold once, confirmation delta {h['confirmation']['delta']:+.3f}"
        changed = ", ".join(c["path"] for c in h.get("diff", [])) or "-"
        rows.append(
            f"- iteration {h['iteration']} [{verdict}, delta {delta}, threshold {h.get('threshold')}]: "
            f"{h['hypothesis']} (changed: {changed})"
        )
    return "\n".join(rows) or "(none yet)"


_FIELD = re.compile(r"^\s*(HYPOTHESIS|TARGET)\s*:\s*(.+)$", re.MULTILINE | re.IGNORECASE)


class LLMProposer:
    """Asks a model for `n` new specs in one batch; invalid replies become invalid proposals."""

    name = "llm"

    def __init__(
        self,
        policy: Policy,
        sampling: SamplingParams | None = None,
        max_trajectories: int = 4,
        max_new_tokens: int = 3000,
    ):
        self.policy = policy
        self.sampling = sampling or SamplingParams(temperature=0.7)
        self.max_trajectories = max_trajectories
        self.max_new_tokens = max_new_tokens

    def messages(self, ctx: ProposalContext) -> list[Message]:
        verdicts = {e["episode_id"]: e for e in ctx.triage.get("episodes", [])}
        # one failing episode per class first, so every failure mode is seen in full
        chosen, classes = [], set()
        for t in ctx.failures:
            cls = verdicts.get(t.episode_id, {}).get("class")
            if cls not in classes:
                classes.add(cls)
                chosen.append(t)
        chosen += [t for t in ctx.failures if t not in chosen]
        traces = "\n\n".join(render_trajectory(t, verdicts.get(t.episode_id)) for t in chosen[: self.max_trajectories])
        counts = {c: n for c, n in ctx.triage.get("counts", {}).items() if n}
        tools = ", ".join(t.name for t in ctx.tools)
        user = (
            f"## Current harness spec\n```yaml\n{ctx.incumbent.to_yaml()}```\n\n"
            f"## Triage of its dev episodes\n{json.dumps(counts)} "
            f"(passed {ctx.triage.get('n_passed', 0)} of {ctx.triage.get('n_valid', 0)})\n\n"
            f"## Tools the tasks offer\n{tools}\n\n"
            f"## Earlier candidates\n{render_history(ctx.history)}\n\n"
            f"## Failing trajectories (full)\n{traces or '(none)'}\n\n"
            "Write the improved spec."
        )
        system = LLM_SYSTEM.replace("{classes}", ", ".join(PROCESS + CONTENT)).replace("{schema}", SCHEMA_SUMMARY)
        return [Message(role="system", content=system), Message(role="user", content=user)]

    def propose(self, ctx: ProposalContext) -> list[Proposal]:
        request = GenerationRequest(messages=self.messages(ctx), max_new_tokens=self.max_new_tokens)
        try:
            calls = self.policy.complete([request] * ctx.n, self.sampling)
        except PolicyError as e:
            return [Proposal("", "", "llm", None, error=f"proposer model failed: {e}")]
        return [self.parse(call.text, ctx) for call in calls]

    @staticmethod
    def parse(text: str, ctx: ProposalContext) -> Proposal:
        fields = {k.upper(): v.strip() for k, v in _FIELD.findall(text)}
        hypothesis = fields.get("HYPOTHESIS", "")[:500]
        target = fields.get("TARGET", "").strip("`* ").lower()
        if target not in PROCESS + CONTENT:
            target = "unspecified"
        try:
            spec = spec_from_text(text, "llm proposal")
        except SpecError as e:
            return Proposal(hypothesis, target, "llm", None, error=str(e), raw=text)
        # the run labels its harnesses itself; keep the incumbent's name so diffs stay clean
        spec = spec.model_copy(update={"name": ctx.incumbent.name})
        if not hypothesis:
            return Proposal(hypothesis, target, "llm", None, error="the reply has no HYPOTHESIS line", raw=text)
        return Proposal(hypothesis, target, "llm", spec, raw=text)
