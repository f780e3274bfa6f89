"""`harnessrl improve`'s options (ImproveConfig), its error and the names of its files and phases."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import Field

from harnessrl.config import Device, FloatDtype, Options, Reads, SuiteName, cli
from harnessrl.errors import JobError

DECISIONS = "decisions.jsonl"
RESULT = "improve.json"
REPORT = "report.md"
PHASES = ("harness", "weights", "content", "final")
# the harness phase's ceilings, in the order they are checked after each evolution iteration
CEILINGS = ("no_process_gain", "process_floor", "patience", "budget", "proposer_exhausted")
LOOP = "improve (evolve, then distil into the seed harness)"  # what needs harnessrl's own control loop


class ImproveError(JobError):
    """The job cannot go on as asked (bad options or input, a refused resume, a stage that
    failed); the CLI exits 2 with the message."""


class ImproveConfig(Options):
    """`harnessrl improve`: every option, declared once (OUT/config.json records them)."""

    suite: SuiteName = Field(
        "toolcalc", description="suite: dev tasks decide, train tasks train, test tasks judge once"
    )
    seed_harness: Annotated[str, Reads("harness", loop_for=LOOP)] = Field(
        "react", description="built-in harness name or spec path to start from"
    )
    evolved: Annotated[Optional[str], Reads("harness", loop_for=LOOP)] = Field(
        None, description="the evolved harness (name or spec path): skips the evolution (default: evolve the seed)"
    )
    model: str = Field(
        "smollm2-135m", description="the base model (local, it is fine-tuned): tiny-random, smollm2-135m, hf:PATH"
    )
    device: Device = "auto"
    dtype: FloatDtype = "auto"
    dev_tasks: Annotated[int, Reads("tasks", "dev")] = Field(
        8, ge=2, description="first N dev tasks: every decision of the harness and weights phases"
    )
    test_tasks: Annotated[int, Reads("tasks", "test")] = Field(
        8, ge=1, description="first N test tasks (held out): the final comparison, once"
    )
    attempts: int = Field(
        2, ge=1, description="attempts per task in every evaluation stage", json_schema_extra=cli("--attempts", "-k")
    )
    # the harness phase
    iterations: int = Field(4, ge=1, description="harness phase: the evolution's budget of iterations")
    candidates: int = Field(2, ge=1, description="harness phase: candidates proposed and measured per iteration")
    rollouts: int = Field(2, ge=1, description="harness phase: attempts per dev task in every evolution measurement")
    patience: int = Field(2, ge=1, description="harness phase: stop after N iterations in a row accept no edit")
    process_floor: float = Field(
        0.05,
        ge=0,
        le=1,
        description="harness phase: stop (or do not start) once the share of dev episodes failing with a process "
        "class is below this",
    )
    # the weights phase
    collect_model: Optional[str] = Field(
        None,
        description="weights phase: the model that collects the evolved harness's train episodes for imitation "
        "(default: --model; `oracle` replays each task's known solution)",
    )
    collect_tasks: Annotated[int, Reads("count", "train")] = Field(
        8, ge=1, description="weights phase: first N train tasks collected for imitation"
    )
    collect_attempts: int = Field(4, ge=1, description="weights phase: attempts per collected train task")
    epochs: int = Field(3, ge=1, description="weights phase: imitation's passes over its examples")
    lr: float = Field(
        1e-4, gt=0, allow_inf_nan=False, description="weights phase: AdamW learning rate of both adapters"
    )
    distill_steps: int = Field(
        6,
        ge=1,
        description="weights phase: on-policy distillation steps when imitation has nothing to train on (otherwise "
        "as many as imitation's optimizer steps)",
    )
    distill_tasks_per_step: Annotated[int, Reads("count", "train")] = Field(
        4, ge=1, description="weights phase: train tasks per distillation step"
    )
    # the content phase
    content_tasks: Annotated[int, Reads("tasks", "train")] = Field(
        8, ge=1, description="content phase: first N train tasks triaged for content failures"
    )
    grpo_steps: int = Field(10, ge=1, description="content phase: GRPO steps")
    grpo_tasks_per_step: int = Field(4, ge=1, description="content phase: tasks per GRPO step (at most the selected)")
    group_size: int = Field(4, ge=2, description="content phase: attempts per task in a GRPO group")
    scheduler: str = Field("harness-bandit", description="content phase: the GRPO scheduler over the harnesses")
    temperature: float = Field(0.7, gt=0, le=5.0, description="sampling temperature of every stage")
    seed: int = Field(0, description="seed of sampling, evolution, LoRA init and example order")
    max_in_flight: int = Field(16, ge=1, description="episodes in flight (generation batch size)")
    retries: int = Field(2, ge=0, description="re-runs of an episode after an infrastructure error")
