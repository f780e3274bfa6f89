"""Triage: the FIRST failure signal of every episode that did not pass.

Harness work pays off on *process* failures, weight training on *content* failures, so each
failed episode gets exactly one class: the first signal found walking its steps in order.

Process classes (fix them in the harness):
- `malformed_call`: the protocol could not parse an action out of the reply (including a lone
  empty reply, or prose without a call when prose is not an answer).
- `blocked_call`: a call was refused: unknown tool, invalid arguments, sandbox or guard refusal.
- `loop`: the agent is stuck (in the spirit of OpenHands' stuck detector): the same action with
  the same observation 3 times in a row; the same failing action 3 times in a row; an A-B-A-B
  alternation over 6 steps; 2+ empty replies in a row; or the harness's loop guard fired.
- `budget_exhausted`: the step, token or time budget ran out before submission.
- `no_delivery`: the episode ended without a submission for any other reason.
- `insufficient_evidence`: the agent submitted without ever successfully calling the tools whose
  output the task declares necessary (`required_observations`). The submission is the submit that
  ended the episode: one held back by the harness's submit checkpoint is not. The calls a helper
  tool made inside a successful call count as observations of their own tools.
Content class (fix it in the weights):
- `content`: delivered, no process signal, but the score is below the pass threshold.
And `infra`: an infrastructure error (excluded from every rate).

The step of a loop is the step at which the pattern completes (when it became detectable).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Iterable

from harnessrl.harness.rules import action_signature, observation_signature
from harnessrl.metrics import episode_delivered
from harnessrl.types import (
    ActionKind,
    Step,
    Termination,
    ToolCall,
    ToolResult,
    Trajectory,
)

PROCESS = ("malformed_call", "blocked_call", "loop", "budget_exhausted", "no_delivery", "insufficient_evidence")
CONTENT = ("content",)
CLASSES = PROCESS + CONTENT + ("infra",)
LOOP_REPEATS = 3
ALTERNATION_STEPS = 6


@dataclass
class Verdict:
    episode_id: str
    harness: str
    task_id: str
    family: str
    cls: str  # one of CLASSES
    step: int | None  # index of the step with the signal; None when it is not tied to a step
    evidence: str

    @property
    def kind(self) -> str:
        return "process" if self.cls in PROCESS else "content" if self.cls in CONTENT else "infra"

    def to_json(self) -> dict:
        d = asdict(self)
        d["class"] = d.pop("cls")
        return d


def _acting(steps: list[Step]) -> list[Step]:
    return [s for s in steps if s.action != ActionKind.plan]


def _loop_at(acting: list[Step], i: int) -> str | None:
    """Evidence if a loop pattern completes at acting step i."""
    s = acting[i]
    if s.action == ActionKind.empty and i >= 1 and acting[i - 1].action == ActionKind.empty:
        return "two empty replies in a row"
    if i + 1 >= LOOP_REPEATS:
        tail = acting[i + 1 - LOOP_REPEATS : i + 1]
        acts = {action_signature(t) for t in tail}
        if len(acts) == 1 and tail[0].action == ActionKind.tool_calls:
            if len({observation_signature(t) for t in tail}) == 1:
                return f"same action and observation {LOOP_REPEATS} times: {_short(action_signature(s))}"
            if all(t.tool_results and not all(r.ok for r in t.tool_results) for t in tail):
                return f"same failing action {LOOP_REPEATS} times: {_short(action_signature(s))}"
    if i + 1 >= ALTERNATION_STEPS:
        actions = [action_signature(t) for t in acting[i + 1 - ALTERNATION_STEPS : i + 1]]
        a, b = actions[0], actions[1]
        half = ALTERNATION_STEPS // 2
        if a != b and actions[0::2] == [a] * half and actions[1::2] == [b] * half:
            return f"A-B-A-B alternation over {ALTERNATION_STEPS} steps: {_short(a)} / {_short(b)}"
    if any(iv.kind == "loop_guard" for iv in s.interventions):
        return "the harness's loop guard fired"
    return None


def _observed_tools(call: ToolCall, result: ToolResult) -> list[str]:
    """The tools whose output the model saw in one result: the call's own and, for a helper tool,
    each call made inside it (the model sees those outputs only when the helper succeeded). A
    task tool an agent program called over MCP ran under its own name (`result.name`), which its
    model knows by another (`mcp__harnessrl__<tool>`): both count."""
    if not result.ok:
        return []
    names = list(dict.fromkeys([call.name, result.name]))
    return names + [inner.call.name for inner in result.inner_calls if inner.result.ok]


def _is_submission(step: Step, last: bool) -> bool:
    """Whether the step delivered the episode's answer: a prose answer or a submit that ended it.

    A submit the harness held back (rules.submit_checkpoint, recorded as the intervention
    `submit_checkpoint`) is not the submission; the later one is. Nor is any other submit the
    episode went on after, which also covers records written before held-back submits were marked.
    """
    if not last or any(iv.kind == "submit_checkpoint" for iv in step.interventions):
        return False
    return step.action == ActionKind.text or any(c.name == "submit" for c in step.tool_calls)


def _short(text: str, n: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def first_failure_signal(traj: Trajectory) -> Verdict | None:
    """The triage verdict of one episode, or None when it passed."""

    def verdict(cls: str, step: int | None, evidence: str) -> Verdict:
        return Verdict(traj.episode_id, traj.harness, traj.task_id, traj.family, cls, step, evidence)

    if traj.is_infra_error:
        return verdict("infra", None, _short(traj.infra_error or "infrastructure error"))
    if traj.grade is not None and traj.grade.passed:
        return None

    acting = _acting(traj.steps)
    observed: set[str] = set()
    for i, s in enumerate(acting):
        loop = _loop_at(acting, i)
        if loop:
            return verdict("loop", s.index, loop)
        if s.action == ActionKind.empty:
            nxt = acting[i + 1] if i + 1 < len(acting) else None
            if nxt is None or nxt.action != ActionKind.empty:
                return verdict("malformed_call", s.index, "empty reply")
            continue  # the next step completes an empty-reply loop
        if s.action == ActionKind.malformed:
            return verdict("malformed_call", s.index, _short(s.parse_error or "unparseable reply"))
        for call, res in zip(s.tool_calls, s.tool_results):
            if res.blocked is not None:
                return verdict(
                    "blocked_call", s.index, _short(f"{call.name} refused ({res.blocked.value}): {res.output}")
                )
            observed.update(_observed_tools(call, res))
        if traj.submitted and _is_submission(s, last=i == len(acting) - 1):
            missing = [r for r in traj.meta.get("required_observations", []) if r not in observed]
            if missing:
                return verdict("insufficient_evidence", s.index, f"submitted without a successful {', '.join(missing)}")
            break

    last = traj.steps[-1].index if traj.steps else None
    if not traj.submitted:
        if traj.termination in (Termination.max_steps, Termination.max_tokens, Termination.timeout):
            return verdict("budget_exhausted", last, f"{traj.termination.value}: {traj.termination_detail}")
        if traj.termination == Termination.loop_guard:
            return verdict("loop", last, "the harness's loop guard stopped the episode")
        term = traj.termination.value if traj.termination else "unknown"
        return verdict("no_delivery", last, f"ended ({term}) without a submission")
    if not episode_delivered(traj):  # the same definition as the delivery rate
        return verdict("no_delivery", last, "submitted, but the grader found no answer in it (delivered = 0)")
    score = traj.grade.score if traj.grade else 0.0
    threshold = traj.grade.threshold if traj.grade else 1.0
    subs = ", ".join(f"{k}={v:.2f}" for k, v in (traj.grade.subscores.items() if traj.grade else []))
    return verdict("content", last, f"delivered; score {score:.2f} < {threshold:.2f}" + (f" ({subs})" if subs else ""))


@dataclass
class HarnessTriage:
    """One harness's triage: one entry of triage.json (`to_json`), and what the report and the
    evolution's proposers read. Rates are over the failed episodes that are not infrastructure
    errors; `n_valid` also counts passed episodes, so `counts[c] / n_valid` is the class's share
    of all valid episodes."""

    n_episodes: int  # every episode, infrastructure errors included
    n_valid: int  # episodes that are not infrastructure errors
    n_passed: int
    n_failed: int  # valid episodes that did not pass (each has one process or content class)
    counts: dict[str, int]  # class -> episodes, for every class of CLASSES (infra included)
    rates: dict[str, float | None]  # process and content class -> share of n_failed; None without failures
    process_share: float | None  # share of n_failed with a process class; None without failures
    content_share: float | None
    episodes: list[Verdict]  # the verdict of every episode that did not pass, infrastructure errors included

    @classmethod
    def of(cls, n_episodes: int, n_valid: int, verdicts: list[Verdict]) -> HarnessTriage:
        """The triage of `n_episodes` episodes (`n_valid` of them valid) whose failures are `verdicts`."""
        found = Counter(v.cls for v in verdicts)
        counts = {c: found.get(c, 0) for c in CLASSES}
        n_failed = sum(counts[c] for c in PROCESS + CONTENT)
        process = sum(counts[c] for c in PROCESS)
        return cls(
            n_episodes=n_episodes,
            n_valid=n_valid,
            n_passed=n_episodes - len(verdicts),
            n_failed=n_failed,
            counts=counts,
            rates={c: (counts[c] / n_failed if n_failed else None) for c in PROCESS + CONTENT},
            process_share=process / n_failed if n_failed else None,
            content_share=counts["content"] / n_failed if n_failed else None,
            episodes=verdicts,
        )

    @classmethod
    def empty(cls) -> HarnessTriage:
        """The triage of a harness without episodes."""
        return cls.of(0, 0, [])

    def to_json(self) -> dict:
        return {
            **{f.name: getattr(self, f.name) for f in fields(self)},
            "episodes": [v.to_json() for v in self.episodes],
        }


def triage_by_harness(trajectories: Iterable[Trajectory]) -> dict[str, HarnessTriage]:
    """Per harness (sorted by name): its `HarnessTriage`."""
    episodes: Counter[str] = Counter()
    valid: Counter[str] = Counter()
    verdicts: dict[str, list[Verdict]] = {}
    for t in trajectories:
        episodes[t.harness] += 1
        valid[t.harness] += not t.is_infra_error
        v = first_failure_signal(t)
        failed = verdicts.setdefault(t.harness, [])
        if v is not None:
            failed.append(v)
    return {h: HarnessTriage.of(episodes[h], valid[h], verdicts[h]) for h in sorted(verdicts)}


def triage(trajectories: Iterable[Trajectory]) -> dict[str, dict]:
    """Per harness: counts and rates of each class, process vs content share, and the verdicts,
    as triage.json holds them (`HarnessTriage.to_json`)."""
    return {h: tri.to_json() for h, tri in triage_by_harness(trajectories).items()}


def write_triage(result: dict, folder: str | Path) -> Path:
    path = Path(folder) / "triage.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return path
