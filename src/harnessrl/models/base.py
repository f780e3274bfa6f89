"""The Policy interface: a model behind one door.

The runner hands a policy a batch of GenerationRequests (one per episode in flight) and gets
one ModelCall back per request, in order: prompt token ids, completion token ids and the
log-probability of every sampled token. Token in, token out: nothing downstream re-tokenizes
text the model produced.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.types import Message, ModelCall, ToolSchema


class SamplingParams(BaseModel):
    """Sampling settings of a run; recorded in the run config."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.7, ge=0.0, le=5.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int = 0


class GenerationRequest(BaseModel):
    """One pending model call of one episode."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message]
    max_new_tokens: int = Field(256, ge=1)
    stop: list[str] = Field(default_factory=list)  # cut the completion after the first of these
    tools: list[ToolSchema] | None = None  # for backends with native function calling
    # send `tools` as the server's native function calling (openai backend; json protocol only)
    native_tools: bool = False


class PolicyError(RuntimeError):
    """The backend failed to produce a completion (infrastructure, not a model failure)."""


class Policy(ABC):
    """A model that completes chat prompts, batched."""

    name: str = "policy"

    @abstractmethod
    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[ModelCall]:
        """One ModelCall per request, same order. Raises PolicyError on backend failure."""

    def describe(self) -> dict:
        """What to record about this model in the run config."""
        return {"name": self.name}


class ModelUnavailable(RuntimeError):
    """A model cannot be loaded at all (missing package, not a model folder, unreadable weights).

    A configuration problem, not a transient backend failure: retrying will not help.
    """
