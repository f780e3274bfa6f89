"""Session rules: the guards and notices a harness applies between model calls.

Pure functions over the steps of an episode, so each rule is testable on hand-written data.
"""

from __future__ import annotations

import json
from typing import Any

from harnessrl.harness.spec import CapabilitiesSpec, HelperToolSpec, RulesSpec
from harnessrl.types import ActionKind, Message, Step, ToolCall, ToolResult


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


# -- capabilities ------------------------------------------------------------------------------------
LEDGER_OUTPUT_CHARS = 80  # what a ledger line keeps of a tool's output


def ledger_entry(step_number: int, call: ToolCall, result: ToolResult) -> str:
    """One ledger line: step, call, outcome and the start of the output."""
    args = ", ".join(f"{k}={json.dumps(v, default=str)[:40]}" for k, v in call.arguments.items())
    if result.blocked is not None:
        outcome = "refused"
    elif not result.ok:
        outcome = "failed"
    else:
        outcome = "ok"
    text = " ".join(result.output.split())
    if len(text) > LEDGER_OUTPUT_CHARS:
        text = text[: LEDGER_OUTPUT_CHARS - 3] + "..."
    return f"step {step_number}: {call.name}({args}) -> {outcome}: {text}"


def capability_sections(caps: CapabilitiesSpec, ledger: list[str]) -> str:
    """The system prompt sections of the capabilities: lessons, then the ledger."""
    parts = []
    if caps.experiences:
        parts.append("## Lessons from earlier attempts\n" + "\n".join(f"- {e.strip()}" for e in caps.experiences))
    if caps.ledger.enabled:
        shown = ledger[-caps.ledger.max_entries :]
        body = "\n".join(f"- {e}" for e in shown) if shown else "(nothing done yet)"
        skipped = len(ledger) - len(shown)
        if skipped:
            body = f"({skipped} earlier entries not shown)\n" + body
        parts.append("## Ledger: what you have done so far\n" + body)
    return "\n\n".join(parts)


def helper_parameters(helper: HelperToolSpec) -> dict[str, Any]:
    """The JSON schema of a helper tool: every parameter a required string."""
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": desc} for name, desc in helper.parameters.items()},
        "required": list(helper.parameters),
    }


def fill_helper_arguments(template: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """The arguments of one helper call: "{param}" placeholders replaced by the helper's arguments."""
    filled: dict[str, Any] = {}
    for key, value in template.items():
        if isinstance(value, str):
            whole = value[1:-1] if value.startswith("{") and value.endswith("}") else None
            if whole in args:
                filled[key] = args[whole]
            else:
                filled[key] = value.format_map({k: str(v) for k, v in args.items()})
        else:
            filled[key] = value
    return filled
