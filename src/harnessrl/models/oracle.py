"""The `oracle` model: replays each task's known-good solution through a harness's own protocol.

No weights: a ScriptedPolicy whose reply to a request is the next part of the task's stored
solution (`Task.solution`), rendered with the harness's protocol. Its episodes go through the real
chat template, tools and grader, so they are what a perfect agent would leave in the run store:
supervised training data (`harnessrl train sft --from` an oracle run) and a check that every
task's grader gives full credit to its solution.

One oracle serves one harness (the protocol renders the calls; for an external harness, its
`tool_protocol`, so an agent program whose own tools are named and shaped like the task's tools
gets the solution as its tool calls). It tracks each episode's progress
by task instruction, so episodes run one at a time (`max_in_flight` 1): it is fast anyway, there
is no model to wait for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

from harnessrl.harness.protocols import get_protocol
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.types import Message, ToolCall

if TYPE_CHECKING:
    from harnessrl.harness.spec import AnyHarnessSpec
    from harnessrl.tasks.base import Task

PLAN_REPLY = "1. Look at the task.\n2. Call the tools.\n3. Submit."


def oracle_policy(tasks: list[Task], spec: AnyHarnessSpec, tokenizer=None) -> ScriptedPolicy:
    """A policy that solves `tasks` through `spec`. A solution longer than the harness's step
    budget is sent a few calls per reply. A plan-first harness gets a short generic plan.
    An episode's first request (no reply after the task's instruction yet) starts its solution over, so
    several attempts of one task each replay the whole solution."""
    by_instruction = {t.instruction: t for t in tasks}
    progress: dict[str, int] = defaultdict(int)
    if spec.kind == "external":  # an agent program: its tools are shown to the model in tool_protocol
        proto = get_protocol(spec.tool_protocol)
        plan_prompt, max_steps = None, spec.limits.max_model_calls
    else:
        proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)
        plan_prompt, max_steps = spec.loop.plan_prompt, spec.rules.max_steps

    def script(messages: list[Message]) -> str:
        at = next((i for i, m in enumerate(messages) if m.role == "user" and m.content in by_instruction), None)
        if at is None:
            raise ValueError("oracle: the conversation names none of the oracle's tasks")
        task = by_instruction[messages[at].content]
        if not any(m.role == "assistant" for m in messages[at + 1 :]):
            progress[task.instruction] = 0  # a new episode (its plan request, or its first action)
        if plan_prompt is not None and messages[-1].role == "user" and messages[-1].content == plan_prompt:
            return PLAN_REPLY
        sol = task.solution
        per_reply = max(1, math.ceil(len(sol) / max_steps))
        i = progress[task.instruction]
        chunk = sol[i : i + per_reply]
        progress[task.instruction] = i + len(chunk)
        return "\n".join(proto.render_call(ToolCall(name=c["name"], arguments=c["arguments"])) for c in chunk)

    return ScriptedPolicy(script, tokenizer=tokenizer, name=f"oracle-{spec.name}")
