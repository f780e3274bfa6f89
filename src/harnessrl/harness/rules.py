"""Session rules: the guards and notices a harness applies between model calls.

Pure functions over the steps of an episode, so each rule is testable on hand-written data.
"""

from __future__ import annotations

import json

from harnessrl.harness.spec import RulesSpec
from harnessrl.types import ActionKind, Message, Step


def action_signature(step: Step) -> str:
    """What the model did in a step, as a comparable string."""
    if step.action == ActionKind.tool_calls:
        return json.dumps([[c.name, c.arguments] for c in step.tool_calls], sort_keys=True, default=str)
    if step.action == ActionKind.malformed:
        return "malformed:" + step.model_call.text.strip()
    return step.action.value + ":" + step.model_call.text.strip()


def observation_signature(step: Step) -> str:
    return json.dumps([[r.name, r.output, r.ok] for r in step.tool_results])


def repeated_tail(steps: list[Step], repeats: int) -> bool:
    """True when the last `repeats` acting steps have the same action AND the same observation."""
    acting = [s for s in steps if s.action != ActionKind.plan]
    if len(acting) < repeats:
        return False
    tail = acting[-repeats:]
    first = (action_signature(tail[0]), observation_signature(tail[0]))
    return all((action_signature(s), observation_signature(s)) == first for s in tail[1:])


def budget_notice(rules: RulesSpec, remaining_steps: int) -> str | None:
    """The notice to append to the observation when the step budget is nearly spent."""
    bn = rules.budget_notice
    if not bn.enabled or remaining_steps <= 0 or remaining_steps > bn.remaining_steps:
        return None
    return bn.message.replace("{remaining}", str(remaining_steps))


def windowed(exchanges: list[list[Message]], window: int | None) -> list[Message]:
    """Flatten the exchanges (assistant reply + observation) keeping only the last `window`."""
    kept = exchanges if window is None else exchanges[-window:]
    return [m for ex in kept for m in ex]


def observation_placeholder(step: Step) -> str:
    """What stands in for an elided tool observation: the calls that produced it, in short.

    The model's own reply stays in the history too; this line only says that a result was here
    and which call it answered (e.g. `[observation elided: open url="/products?category=garden"]`).
    """
    shown = []
    for call in step.tool_calls:
        args = " ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)[:60]}" for k, v in call.arguments.items())
        shown.append(f"{call.name} {args}".strip())
    return "[observation elided: " + ("; ".join(shown) or "no tool call") + "]"


def elide_observations(
    exchanges: list[list[Message]], placeholders: list[str], window: int | None
) -> list[list[Message]]:
    """Keep the last `window` tool observations verbatim; older ones become their placeholder.

    Only tool results are elided (an exchange ending in a `tool` message): the model's replies
    and feedback messages stay. `placeholders[i]` stands in for exchange i. Composes with
    `windowed` (which drops whole exchanges): the most recent observations are the same either way.
    """
    if window is None:
        return exchanges
    observed = [i for i, ex in enumerate(exchanges) if ex and ex[-1].role == "tool"]
    old = set(observed[:-window])
    out = []
    for i, ex in enumerate(exchanges):
        if i in old:
            label = placeholders[i] if i < len(placeholders) else "[observation elided]"
            ex = [*ex[:-1], Message(role="tool", content=label, name=ex[-1].name)]
        out.append(ex)
    return out


def malformed_feedback(rules: RulesSpec, reason: str, format_reminder: str) -> str:
    if not rules.feedback.malformed:
        return "No valid tool call was found in your reply."
    text = f"Your reply could not be used: {reason}"
    if rules.feedback.show_format:
        text += "\n" + format_reminder
    return text


def blocked_feedback(rules: RulesSpec, message: str, format_reminder: str, invalid_arguments: bool) -> str:
    if not rules.feedback.blocked:
        return "The call was refused."
    text = f"The call was refused: {message}"
    if invalid_arguments and rules.feedback.show_format:
        text += "\n" + format_reminder
    return text
