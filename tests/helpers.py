"""Test helpers: scripted policies of known behaviour."""

from __future__ import annotations

from collections import defaultdict

from harnessrl.models.oracle import oracle_policy  # noqa: F401 - the tests' import path
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.types import Message


def replies_policy(replies: list[str], tokenizer) -> ScriptedPolicy:
    """Returns replies[k] on the k-th call of each conversation (by call count, not by history)."""
    count: dict[str, int] = defaultdict(int)

    def script(messages: list[Message]) -> str:
        key = next(m.content for m in messages if m.role == "user")
        k = count[key]
        count[key] += 1
        return replies[min(k, len(replies) - 1)]

    return ScriptedPolicy(script, tokenizer=tokenizer, name="replies")
