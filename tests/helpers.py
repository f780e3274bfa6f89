"""Test helpers: scripted policies of known behaviour."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from harnessrl.harness.oracle import oracle_script
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.types import Message


def oracle_policy(tasks, spec, tokenizer) -> ScriptedPolicy:
    """One policy playing the oracle (harness/oracle.py) of several tasks through `spec`: it finds
    a conversation's task by its instruction, so tasks worded alike must not run side by side.
    An episode's first request (no reply after the instruction yet) starts its task's solution
    over, so the attempts of a task each replay all of it."""
    by_instruction = {t.instruction: t for t in tasks}
    scripts: dict[str, Callable[[list[Message]], str]] = {}

    def script(messages: list[Message]) -> str:
        at = next((i for i, m in enumerate(messages) if m.role == "user" and m.content in by_instruction), None)
        if at is None:
            raise ValueError("oracle: the conversation names none of the oracle's tasks")
        task = by_instruction[messages[at].content]
        if task.instruction not in scripts or not any(m.role == "assistant" for m in messages[at + 1 :]):
            scripts[task.instruction] = oracle_script(task, spec)  # a new episode
        return scripts[task.instruction](messages)

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


# A ChatML template with a tool role that wraps every tool message in <tool_response> tags itself,
# consecutive tool messages in one user turn (the way the Qwen2.5 / Qwen3 templates render them).
TOOL_RESPONSE_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def with_template(tokenizer, template: str):
    """A shallow copy of `tokenizer` with another chat template (the shared one stays as it is)."""
    import copy

    copied = copy.copy(tokenizer)
    copied.chat_template = template
    return copied
