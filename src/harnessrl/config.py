"""Configs of the jobs: every option declared once, as a pydantic field with its bounds and help.

The command line is generated from these models (`harnessrl.cli.common.config_command`), the
library takes them as they are (`jobs.entries.evaluate(EvalConfig(...), RunOptions(...))`), and the run folder
records them (`RunFolder`). A field's command-line names, where they are not just
`--field-name`, are given with `cli(...)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Optional, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from harnessrl.errors import JobError


def cli(*flags: str, bool_flag: bool = False, repeat: bool = False) -> dict[str, Any]:
    """Command-line details of a field (`Field(json_schema_extra=cli("--out", "-o"))`): its
    option names (default `--field-name`); for a bool, a lone flag (`--resume`) instead of the
    `--x/--no-x` pair; `repeat`: the option is given as repeatable text values (KEY=VALUE, ...)
    that the field's own validator turns into its type."""
    return {"cli": {"flags": list(flags), "bool_flag": bool_flag, "repeat": repeat}}


def option_name(field: str) -> str:
    """The command-line option of a config field: `eval_every` -> `--eval-every`."""
    return "--" + field.replace("_", "-")


@dataclass(frozen=True)
class Reads:
    """What the job kernel reads from an option's value before the job starts, once for every job
    (harnessrl.kernel.read_inputs), each refusal naming the option. Put on a field as
    `Annotated[int, Reads("tasks", "dev")]`:

    - `suite`: the suite it names (a built-in one or a task folder);
    - `harness`: the harness it names (a built-in name or a spec file; None stays None);
      `loop_for`: what the job does that needs harnessrl's own control loop (an agent program
      is refused there);
    - `harnesses`: the harnesses a list names (names, spec files, `all`);
    - `tasks`: the first N tasks of `split` (`split="@field"`: the split another option names;
      a None count: the whole split);
    - `count`: only that `split` holds N tasks (the job draws them later, step by step).

    `when` / `unless`: read only when that other option is set / is not set (truthy)."""

    kind: Literal["suite", "harness", "harnesses", "tasks", "count"]
    split: str = ""
    when: str | None = None
    unless: str | None = None
    loop_for: str | None = None


SuiteName = Annotated[str, Reads("suite")]
HarnessNames = Annotated[list[str], Reads("harnesses")]


def comma_list(values: Any) -> Any:
    """Repeated and comma-separated values as one list: ["a,b", "c"] -> ["a", "b", "c"]."""
    if isinstance(values, str):
        values = [values]
    if isinstance(values, (list, tuple)):
        return [v.strip() for item in values for v in str(item).split(",") if v.strip()]
    return values


# -- where a local model runs, and in what precision: one type each, shared by every job ----------
# (checked here for their form only, without importing torch; whether the device exists is
# checked by harnessrl.models.device.resolve_device when the job starts, before anything loads)

DEVICE_FORMS = "auto, cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def device_spec(value: str) -> str:
    """A --device value in its canonical form ("CUDA:0 " -> "cuda:0"); ValueError for any other."""
    spec = str(value).strip().lower()
    if not _DEVICE.fullmatch(spec):
        raise ValueError(f"must be {DEVICE_FORMS}, got {value!r}")
    return spec


DEVICE_HELP = (
    "where the local model runs: auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N "
    "(see docs/models.md, Devices and precision)"
)
Device = Annotated[str, AfterValidator(device_spec), Field(description=DEVICE_HELP)]

# The precisions of generation; training takes the float ones only (int8 layers have no gradient),
# and so do the jobs that train or compare many runs (study, evolve).
INFERENCE_DTYPES = ("auto", "float32", "bfloat16", "int8")
TRAINING_DTYPES = ("auto", "float32", "bfloat16")


def _dtype_spec(allowed: tuple[str, ...]):
    def check(value: str) -> str:
        spec = str(value).strip().lower()
        if spec not in allowed:
            fixed = [d for d in allowed if d != "auto"]
            listed = f"{', '.join(fixed[:-1])} or {fixed[-1]}"
            raise ValueError(f"must be {listed}, or auto (float32 on a CPU, bfloat16 on CUDA); got {value!r}")
        return spec

    return check


inference_dtype_spec = _dtype_spec(INFERENCE_DTYPES)
DTYPE_HELP = (
    "weights of a local model: auto (float32 on a CPU, bfloat16 on CUDA), float32 (exact, reproducible), "
    "bfloat16 (on a CPU: faster with bfloat16 instructions; episodes then depend on what else is in flight) or int8 "
    "(linear layers in int8, CPU only: faster still, less accurate, also concurrency-dependent; see docs/models.md)"
)
Dtype = Annotated[str, AfterValidator(inference_dtype_spec), Field(description=DTYPE_HELP)]
FloatDtype = Annotated[
    str,
    AfterValidator(_dtype_spec(TRAINING_DTYPES)),
    Field(description="weights of a local model: auto (float32 on a CPU, bfloat16 on CUDA), float32 or bfloat16"),
]
TrainDtype = Annotated[
    str,
    AfterValidator(_dtype_spec(TRAINING_DTYPES)),
    Field(
        description="weights of the base model: auto (float32 on a CPU, bfloat16 on CUDA), float32 or bfloat16; "
        "the LoRA weights and their optimizer state stay float32 (see docs/training.md)"
    ),
]


class Options(BaseModel):
    """Base of every job config: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def refusal(self) -> str | None:
        """What these options refuse together (an option that needs another, or two that exclude
        each other), naming them; None when they agree. Not a validator: the job kernel asks only
        once the resume rule has filled in the options a resumed command line left out."""
        return None

    def check(self, error: Callable[[str], Exception] = JobError) -> Self:
        """These options, or `error(refusal)` raised (a job passes its own JobError class)."""
        message = self.refusal()
        if message is not None:
            raise error(message)
        return self

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes`, validated again (every bound and cross-option check holds), where
        pydantic's `model_copy(update=...)` would take any value."""
        return self.model_validate({**self.model_dump(), **changes})


class RunOptions(Options):
    """Where a job writes and how it reports; not part of what the run computes (never compared
    on resume)."""

    out: Path = Field(Path("runs/run"), description="run folder", json_schema_extra=cli("--out", "-o"))
    resume: bool = Field(
        False, description="continue the run in --out, skipping finished work", json_schema_extra=cli(bool_flag=True)
    )
    progress: bool = Field(True, description="show a progress bar (plain lines when not a terminal)")
    isolation: Literal["auto", "required"] = Field(
        "auto",
        description="required: refuse to run unless bubblewrap isolates sandboxed commands (agents, the shell "
        "tool, graders) by file system and network; auto: run with resource limits only where it cannot, and say so",
    )
    allow_host_network: bool = Field(
        False,
        description="run agent programs whose spec asks for the host's network (network: host: every service on "
        "this machine's loopback, and the internet), with a warning naming each; refused under --isolation required",
        json_schema_extra=cli(bool_flag=True),
    )


EXECUTORS = ("local", "ray")  # see harnessrl.executors


class ExecutorOptions(RunOptions):
    """RunOptions of a job that runs episodes where it is told (`harnessrl.executors`). Where
    episodes run does not change what they compute: recorded, never compared on resume."""

    executor: str = Field(
        "local",
        description="where episodes run (environments, tools, graders): local (this process) or ray (actors on "
        "a Ray cluster's nodes; needs pip install 'harnessrl[ray]'); the model stays in this process",
    )
    ray_address: Optional[str] = Field(
        None,
        description="--executor ray: the cluster's address, as ray.init takes it (default: RAY_ADDRESS, else a "
        "cluster started on this machine, else a new local one)",
    )

    @field_validator("executor")
    @classmethod
    def _known_executor(cls, value: str) -> str:
        if value not in EXECUTORS:
            raise ValueError(f"must be {' or '.join(EXECUTORS)}")
        return value

    @model_validator(mode="after")
    def _address_needs_ray(self) -> ExecutorOptions:
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("--ray-address needs --executor ray")
        return self


# `--preflight/--no-preflight` of the jobs that run episodes through harnesses (eval, train grpo)
PREFLIGHT = (
    bool,
    Field(
        True,
        description="first measure each harness's first request against a local model's context "
        "(harnessrl preflight) and refuse to run a harness whose request cannot fit",
    ),
)


def run_options(
    default_out: str, resume_help: str | None = None, base: type[RunOptions] = RunOptions, **extra: Any
) -> type[RunOptions]:
    """RunOptions (or `base`, a subclass of it) with a job's own default folder, resume help, and
    `extra` fields as `create_model` takes them (name=(type, Field(...)))."""
    fields: dict[str, Any] = {
        "out": (Path, Field(Path(default_out), description="run folder", json_schema_extra=cli("--out", "-o"))),
        **extra,
    }
    if resume_help:
        fields["resume"] = (bool, Field(False, description=resume_help, json_schema_extra=cli(bool_flag=True)))
    return create_model(f"RunOptions_{Path(default_out).name}", __base__=base, **fields)


class EvalConfig(Options):
    """`harnessrl eval`: a model on a suite's split through one or more harnesses."""

    oracle_model: ClassVar[bool] = True  # `--model oracle` replays each task's known solution

    suite: SuiteName = Field("workspace", description="suite name (see `harnessrl tasks list`)")
    split: str = Field("dev", description="train, dev or test")
    harness: HarnessNames = Field(
        ["all"],
        description="built-in name, 'all', or a spec path; repeat or comma-separate",
        json_schema_extra=cli("--harness", "-H"),
    )
    model: str = Field("tiny-random", description="tiny-random, smollm2-135m, hf:PATH or openai:MODEL@BASE_URL")
    tasks: Annotated[Optional[int], Reads("tasks", "@split")] = Field(
        None, ge=1, description="first N tasks of the split (default: all)", json_schema_extra=cli("--tasks", "-n")
    )
    attempts: int = Field(
        1, ge=1, description="attempts per task and harness", json_schema_extra=cli("--attempts", "-k")
    )
    seed: int = Field(0, description="sampling seed")
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    top_k: int = Field(0, ge=-1, description="keep the k most probable tokens (0 or -1: off; vLLM's meaning)")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="drop tokens below min_p x the most probable's probability")
    repetition_penalty: float = Field(
        1.0, gt=0.0, description="on tokens of the prompt and the completion (> 1 discourages; vLLM's meaning)"
    )
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="x each completion token's count")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="once for each token in the completion")
    max_in_flight: int = Field(16, ge=1, description="episodes in flight (batch size of generation)")
    retries: int = Field(2, ge=0, description="re-runs of an episode after an infrastructure error")
    device: Device = "auto"
    dtype: Dtype = "auto"
    api_key_env: Optional[str] = Field(
        None, description="openai: read the API key from this environment variable (default OPENAI_API_KEY)"
    )
    judge_model: Optional[str] = Field(
        None, description="grade the LLM-judge parts of PinchBench tasks with this model (any --model form)"
    )
    judge_api_key_env: Optional[str] = Field(
        None, description="openai judge: read its API key from this environment variable (default OPENAI_API_KEY)"
    )

    _split_harness = field_validator("harness", mode="before")(comma_list)

    def refusal(self) -> str | None:
        if self.judge_api_key_env is not None and self.judge_model is None:
            return "--judge-api-key-env needs --judge-model"
        return None
