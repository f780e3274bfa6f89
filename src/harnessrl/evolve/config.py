"""EvolveConfig: every option of `harnessrl evolve`, declared once (the command line is generated
from these fields; OUT/config.json records them). Light to import."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import Field, field_validator

from harnessrl.config import Device, FloatDtype, Options, Reads, SuiteName
from harnessrl.evolve.acceptance import THRESHOLD_MULTIPLE


class EvolveConfig(Options):
    """What an evolution run computes (see docs/evolve.md)."""

    suite: SuiteName = Field(
        default="workspace", description="suite whose dev split drives the search and whose test split confirms"
    )
    seed_harness: Annotated[str, Reads("harness", loop_for="evolve (edits of prompts and rules)")] = Field(
        default="react", description="built-in harness name or spec path to start from"
    )
    model: str = Field(
        default="smollm2-135m", description="the agent's model: tiny-random, smollm2-135m, hf:PATH or openai:MODEL@URL"
    )
    device: Device = "auto"
    dtype: FloatDtype = "auto"
    dev_tasks: Annotated[int, Reads("tasks", "dev")] = Field(
        default=48,
        ge=2,
        description="first N dev tasks (decision tasks; >= 2: the noise estimate needs a spread over tasks)",
    )
    test_tasks: Annotated[int, Reads("tasks", "test")] = Field(
        default=72, ge=1, description="first N test tasks (held out; run once at the end)"
    )
    rollouts: int = Field(default=4, ge=1, description="attempts per task in every measurement")
    iterations: int = Field(default=20, ge=1, description="search iterations")
    candidates: int = Field(default=2, ge=1, description="candidates proposed and measured per iteration")
    proposer: str = Field(default="rules", description="rules (offline, triage-driven) or llm")
    proposer_model: Optional[str] = Field(default=None, description="llm proposer's model: openai:NAME@URL")
    threshold_multiple: float = Field(
        default=THRESHOLD_MULTIPLE,
        ge=0,
        description=(
            "threshold = this x SD of a paired difference of dev means; a candidate must beat it twice: "
            "on its dev run and on a confirmation run with fresh samples"
        ),
    )
    min_threshold: float = Field(
        default=0.0,
        ge=0,
        description="the threshold is never below this, nor below one episode's worth of score, "
        "1/(dev tasks x rollouts)",
    )
    seed: int = Field(
        default=0,
        description=(
            "run seed: each measurement samples with a seed derived from it and the measurement's stream "
            "(noise.a, noise.b, iNN, iNN.confirm, test)"
        ),
    )
    temperature: float = Field(default=0.7, ge=0.0, le=5.0, description="the agent's sampling temperature")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling")
    max_in_flight: int = Field(default=16, ge=1, description="episodes in flight (generation batch size)")
    retries: int = Field(default=2, ge=0, description="re-runs of an episode after an infrastructure error")

    @field_validator("proposer")
    @classmethod
    def _known_proposer(cls, value: str) -> str:
        if value not in ("rules", "llm"):
            raise ValueError(f"unknown proposer '{value}' (rules or llm)")
        return value

    def refusal(self) -> str | None:
        if self.proposer == "llm" and not self.proposer_model:
            return "--proposer llm needs --proposer-model openai:NAME@URL"
        if self.proposer_model and not self.proposer_model.startswith("openai:"):
            return "--proposer-model must be openai:NAME@URL (an OpenAI-compatible server)"
        return None

    def to_json(self) -> dict[str, Any]:
        """The recorded configuration. `device` only when it is not auto, `dtype` only when it
        is not float32 (run_evolve resolves auto first): runs from before these options resume
        as they were, and a run computed in bfloat16 is never continued in float32 unnoticed."""
        out = self.model_dump()
        if out["device"] == "auto":
            del out["device"]
        if out["dtype"] in ("auto", "float32"):
            del out["dtype"]
        return out


EVOLUTION_FIELDS = (
    "suite", "seed_harness", "model", "device", "dev_tasks", "test_tasks", "rollouts",
    "iterations", "candidates", "seed", "temperature", "max_in_flight", "retries",
)  # fmt: skip


def evolution_of(job: Any, dtype: str) -> EvolveConfig:
    """The evolution a larger job (study, improve) runs: its fields of the same names, and `dtype`
    as the job resolved it."""
    return EvolveConfig(dtype=dtype, **{name: getattr(job, name) for name in EVOLUTION_FIELDS})
