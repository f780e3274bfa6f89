"""Test helpers: scripted policies of known behaviour."""

from __future__ import annotations

import math
from collections import defaultdict

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.tasks.base import Task
from harnessrl.types import Message, ToolCall


def oracle_policy(tasks: list[Task], spec: HarnessSpec, tokenizer) -> ScriptedPolicy:
    """Replays each task's known-good solution in the harness's own protocol.

    One episode per task instruction at a time (a counter per instruction tracks progress, so it
    works under any history window). Solutions longer than the step budget are sent a few calls
    per reply.
    """
    by_instruction = {t.instruction: t for t in tasks}
    progress: dict[str, int] = defaultdict(int)
    proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)

    def script(messages: list[Message]) -> str:
        if messages[-1].role == "user" and messages[-1].content == spec.loop.plan_prompt:
            return "1. Look at the task.\n2. Call the tools.\n3. Submit."
        task = next(by_instruction[m.content] for m in messages if m.role == "user" and m.content in by_instruction)
        sol = task.solution
        per_reply = max(1, math.ceil(len(sol) / spec.rules.max_steps))
        i = progress[task.instruction]
        chunk = sol[i : i + per_reply]
        progress[task.instruction] = i + len(chunk)
        return "\n".join(proto.render_call(ToolCall(name=c["name"], arguments=c["arguments"])) for c in chunk)

    return ScriptedPolicy(script, tokenizer=tokenizer, name=f"oracle-{spec.name}")


def replies_policy(replies: list[str], tokenizer) -> ScriptedPolicy:
    """Returns replies[k] on the k-th call of each conversation (by call count, not by history)."""
    count: dict[str, int] = defaultdict(int)

    def script(messages: list[Message]) -> str:
        key = next(m.content for m in messages if m.role == "user")
        k = count[key]
        count[key] += 1
        return replies[min(k, len(replies) - 1)]

    return ScriptedPolicy(script, tokenizer=tokenizer, name="replies")
