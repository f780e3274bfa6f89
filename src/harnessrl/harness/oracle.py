"""The `oracle` model: every episode replays its task's known-good solution through its harness's
own protocol.

No weights: the runner hands each episode its task (`Oracle.for_episode`), and the episode gets a
ScriptedPolicy of its own whose reply to a request is the next part of that task's stored
solution (`Task.solution`), rendered with the harness's protocol. Its episodes go through the real
chat template, tools and grader, so they are what a perfect agent would leave in the run store:
supervised training data (`harnessrl train sft --from` an oracle run) and a check that every
task's grader gives full credit to its solution.

For an external harness the calls are rendered in its `tool_protocol`, so an agent program whose
own tools are named and shaped like the task's tools gets the solution as its tool calls. A
solution longer than the harness's step budget is sent a few calls per reply; a plan-first
harness gets a short generic plan first. Episodes run side by side like any model's (each has
its own script); they share one tokenizer, which they use one at a time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec
from harnessrl.models import ORACLE
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.types import Message, ToolCall

if TYPE_CHECKING:
    from harnessrl.harness.spec import AnyHarnessSpec
    from harnessrl.tasks.base import Task

PLAN_REPLY = "1. Look at the task.\n2. Call the tools.\n3. Submit."


def oracle_script(task: Task, spec: AnyHarnessSpec) -> Callable[[list[Message]], str]:
    """The replies of one episode of `task` through `spec`: the plan request of a plan-first
    harness gets PLAN_REPLY, every other request the next ceil(len(solution) / step budget) calls
    of the solution (an empty reply once it is all sent)."""
    if isinstance(spec, ExternalHarnessSpec):  # an agent program: its tools are shown to the model in tool_protocol
        proto = get_protocol(spec.tool_protocol)
        plan_prompt, max_steps = None, spec.limits.max_model_calls
    else:
        proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)
        plan_prompt, max_steps = spec.loop.plan_prompt, spec.rules.max_steps
    solution = task.solution
    per_reply = max(1, math.ceil(len(solution) / max_steps))
    sent = 0

    def script(messages: list[Message]) -> str:
        nonlocal sent
        if plan_prompt is not None and messages[-1].role == "user" and messages[-1].content == plan_prompt:
            return PLAN_REPLY
        chunk = solution[sent : sent + per_reply]
        sent += len(chunk)
        return "\n".join(proto.render_call(ToolCall(name=c["name"], arguments=c["arguments"])) for c in chunk)

    return script


class Oracle:
    """`--model oracle`: the policies of a run's episodes, one per episode, each handed its task
    by the runner (rollout.EpisodePolicies). `tokenizer`: the chat template the replies go
    through (default: SmolLM2's, as every local model here)."""

    name = ORACLE

    def __init__(self, tokenizer=None):
        if tokenizer is None:
            from harnessrl.models.embedded import load_tokenizer

            tokenizer = load_tokenizer()
        self.tokenizer = tokenizer
        self._lock = threading.Lock()  # the tokenizer is used by one episode at a time

    def for_episode(self, task: Task, spec: AnyHarnessSpec) -> ScriptedPolicy:
        return ScriptedPolicy(
            oracle_script(task, spec), tokenizer=self.tokenizer, name=f"{ORACLE}-{spec.name}", lock=self._lock
        )

    def describe(self) -> dict:
        return {"name": ORACLE, "backend": "scripted"}
