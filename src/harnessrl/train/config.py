"""TrainConfig (`harnessrl train grpo`), SFTConfig (`harnessrl train sft`) and DistillConfig
(`harnessrl train distill`): every option, declared once (the command line is generated from
these fields). Light to import: no torch."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import Field, field_validator

from harnessrl.config import Device, HarnessNames, Options, Reads, SuiteName, TrainDtype, cli, comma_list, option_name

DEFAULT_HARNESSES = ("json-tools", "xml-tags", "react", "code-act", "plan-execute", "workspace-agent")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")

# The options both trainers share (their LoRA and AdamW), each declared once here with its bounds
# and help text; each config gives its own default (GRPO and SFT differ in --lr).
TrainModel = Annotated[str, Field(description="model to train: tiny-random, smollm2-135m or hf:PATH")]
LearningRate = Annotated[float, Field(gt=0, allow_inf_nan=False, description="AdamW learning rate of the LoRA weights")]
WeightDecay = Annotated[float, Field(ge=0, description="AdamW weight decay")]
MaxGradNorm = Annotated[float, Field(ge=0, description="gradient clipping norm (0 = off)")]
LoraRank = Annotated[int, Field(ge=1, description="LoRA rank")]
LoraAlpha = Annotated[float, Field(gt=0, description="LoRA alpha (scale = alpha / r)")]
LoraTargets = Annotated[
    list[str], Field(min_length=1, description="module names that get LoRA; comma-separate or repeat")
]
MicroBatch = Annotated[int, Field(ge=1, description="tokens (rows x padded length) per forward/backward")]
GradientCheckpointing = Annotated[
    bool,
    Field(
        description="recompute each layer's activations in the backward instead of keeping them: less memory "
        "for long micro-batches, ~30% more compute, the same gradients"
    ),
]


# the options of `train sft --sample` (they mean nothing without it)
SAMPLING_OPTIONS = ("sample_harness", "sample_suite", "sample_split", "sample_tasks", "sample_temperature")
SAMPLE_SPLIT = "train"  # --sample-split left out


def _default_lora_targets() -> list[str]:
    return list(DEFAULT_LORA_TARGETS)


def _scheduler_options(values: Any) -> Any:
    """--scheduler-option KEY=VALUE (repeated) as a dict; a dict passes through."""
    if values is None or isinstance(values, dict):
        return values or {}
    options = {}
    for item in [values] if isinstance(values, str) else values:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"wants KEY=VALUE (e.g. floor=0.02), got {item!r}")
        options[key.strip().replace("-", "_")] = value.strip()
    return options


def _one_of(*allowed: str):
    def check(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"must be {' or '.join(allowed)}")
        return value

    return check


class TrainConfig(Options):
    """Every option of a training run (recorded in OUT/config.json), declared once: the command
    line is generated from these fields. See docs/training.md."""

    model: TrainModel = "smollm2-135m"
    device: Device = "auto"
    dtype: TrainDtype = "auto"
    suite: SuiteName = Field(default="toolcalc", description="suite whose train split gives the tasks")
    harnesses: HarnessNames = Field(
        default_factory=lambda: list(DEFAULT_HARNESSES),
        description="harness names, 'all' or spec paths; comma-separate or repeat",
        json_schema_extra=cli("--harnesses", "-H"),
    )
    scheduler: str = Field(
        default="harness-bandit",
        description="harness-bandit, mixed, uniform, round-robin, single:NAME, learnability-only, transfer-only, "
        "ratio:H1=W1,H2=W2,..., dump-ucb, sec, lilo",
    )
    scheduler_options: dict[str, Any] = Field(
        default_factory=dict,
        description="KEY=VALUE passed to the scheduler (e.g. floor=0.02); repeat",
        json_schema_extra=cli("--scheduler-option", repeat=True),
    )
    steps: int = Field(default=150, ge=1, description="training steps (one rollout batch each)")
    tasks_per_step: Annotated[int, Reads("count", "train")] = Field(
        default=8, ge=1, description="train tasks sampled per step"
    )
    group_size: int = Field(
        default=8, ge=2, description="attempts per task (one GRPO group, compared with each other), >= 2"
    )
    # LoRA learns well at ~10x the full fine-tuning rate; 1e-4 is the usual LoRA RL choice.
    lr: LearningRate = 1e-4
    weight_decay: WeightDecay = 0.0
    max_grad_norm: MaxGradNorm = 1.0
    lora_r: LoraRank = 16
    lora_alpha: LoraAlpha = 32.0
    lora_targets: LoraTargets = Field(default_factory=_default_lora_targets)
    # Rollout sampling temperature (also used for the training log-probs). GRPO learns only from
    # groups whose attempts score differently; at 1.0 every toolcalc episode of the embedded model
    # in a measured step scored 0 (docs/BENCHMARKS.md): flat groups, no update.
    temperature: float = Field(
        default=0.7,
        gt=0,
        description="temperature of rollouts and of training log-probs (> 0: GRPO needs different attempts)",
    )
    ppo_epochs: int = Field(default=1, ge=1, description="passes over each rollout batch (> 1: the ratio clip acts)")
    mini_batches: int = Field(default=1, ge=1, description="optimizer steps per pass (the batch split in N parts)")
    micro_batch: MicroBatch = Field(
        default=2048,
        description="tokens per forward/backward: rows x padded length, or with --share-prefixes the tokens the "
        "forwards run (padding included, a shared token once)",
    )
    gradient_checkpointing: GradientCheckpointing = False
    share_prefixes: bool = Field(
        default=True,
        description="forward the tokens a micro-batch's rows share (the harness's prompt, a group's task prompt) "
        "once in the update: the same log-probs and gradients, less compute (off: every row whole)",
    )
    aggregation: str = Field(default="token-mean", description="token-mean (DAPO) or seq-mean (GRPO)")
    clip_low: float = Field(default=0.2, ge=0, lt=1, description="lower ratio clip")
    clip_high: float = Field(default=0.28, ge=0, description="upper ratio clip")
    kl_coef: float = Field(
        default=0.0, ge=0, description="KL penalty to the base model (0 = off; > 0: k3 KL, adapter disabled)"
    )
    scale_advantages: bool = Field(default=True, description="divide advantages by the group std (off: Dr. GRPO)")
    # A control run for a measured gain (docs/training.md, "A control run"): the same steps, the
    # same rewards and update sizes, with no link between an episode and its reward.
    advantage_control: str = Field(
        default="none",
        description="none, or shuffled-rewards: a control run; each group's rewards are shuffled among its "
        "episodes before the advantages (the rewards recorded stay the true ones)",
    )
    # The sampler (bf16 vLLM, int8, 4-bit llama.cpp) is never exactly the float32 trainer
    # (docs/training.md, "Rollout-trainer mismatch and truncated importance sampling").
    rollout_correction: str = Field(
        default="none",
        description="none, or tis: weight each policy-gradient term by the truncated ratio trainer / sampler",
    )
    tis_cap: float = Field(default=2.0, ge=1, allow_inf_nan=False, description="upper cap of the TIS weight (>= 1)")
    tis_level: str = Field(
        default="token", description="token (one TIS weight per token) or sequence (one per model call)"
    )
    mismatch_ratio: float = Field(
        default=2.0,
        gt=1,
        allow_inf_nan=False,
        description="a token counts as mismatched (rollout_mismatch_frac) when trainer / sampler probability is "
        "above this or below its inverse",
    )
    sketch_dim: int = Field(default=512, ge=1, description="dimension of the gradient sketch")
    sketch_kind: str = Field(default="countsketch", description="countsketch or gaussian")
    checkpoint_every: int = Field(default=10, ge=1, description="write OUT/checkpoint every N steps (and at the end)")
    eval_every: int = Field(default=0, ge=0, description="evaluate on dev tasks every N steps (0 = off)")
    eval_tasks: Annotated[int, Reads("count", "dev", when="eval_every")] = Field(
        default=8, ge=1, description="first N dev tasks, every harness"
    )
    eval_temperature: float = Field(default=0.7, ge=0, description="sampling temperature of evaluations")
    eval_harnesses: Annotated[list[str], Reads("harnesses", when="eval_harnesses")] = Field(
        default_factory=list,
        description="held-out harnesses: evaluated with the trained ones, never trained on, reported apart "
        "(names or spec paths; comma-separate or repeat)",
        json_schema_extra=cli("--eval-harnesses"),
    )
    eval_attempts: int = Field(
        default=1, ge=1, description="attempts per dev task in each evaluation (pass@k and pass^k up to this k)"
    )
    max_in_flight: int = Field(default=64, ge=1, description="episodes in flight (generation batch)")
    rollout_servers: list[str] = Field(
        default_factory=list,
        description="sample the rollouts on this OpenAI-compatible server (base URL ending in /v1; harnessrl serve "
        "or vLLM with runtime LoRA) that reloads the adapter after every update; repeat to spread over several",
        json_schema_extra=cli("--rollout-server", repeat=True),
    )
    max_off_policy_steps: int = Field(
        default=0,
        ge=0,
        description="collect the rollouts of the next N steps while the trainer updates (needs --rollout-server); "
        "a unit is trained at most N policy versions after the one that sampled it (0 = synchronous)",
    )
    dynamic_sampling: bool = Field(
        default=False,
        description="refill each step with fresh groups until --tasks-per-step groups have non-zero advantages "
        "(DAPO's dynamic sampling), within --max-sampling-rounds; train on those groups only",
    )
    max_sampling_rounds: int = Field(
        default=3,
        ge=1,
        description="with --dynamic-sampling: rounds of rollouts per step, the first included (verl's "
        "filter_groups.max_num_gen_batches)",
    )
    retries: int = Field(default=2, ge=0, description="re-runs of an episode after an infrastructure error")
    seed: int = Field(default=0, description="seed of tasks, scheduler, LoRA init and sampling")
    save_rollouts: bool = Field(default=True, description="keep every training episode in OUT/rollouts/run.db")

    _lists = field_validator("harnesses", "eval_harnesses", "lora_targets", "rollout_servers", mode="before")(
        comma_list
    )
    _scheduler = field_validator("scheduler_options", mode="before")(_scheduler_options)
    _aggregation = field_validator("aggregation")(_one_of("token-mean", "seq-mean"))
    _rollout_correction = field_validator("rollout_correction")(_one_of("none", "tis"))
    _tis_level = field_validator("tis_level")(_one_of("token", "sequence"))
    _advantage_control = field_validator("advantage_control")(_one_of("none", "shuffled-rewards"))
    _sketch = field_validator("sketch_kind")(_one_of("countsketch", "gaussian"))

    def refusal(self) -> str | None:
        if self.eval_harnesses and not self.eval_every:
            return "--eval-harnesses needs --eval-every N (the held-out harnesses are only evaluated)"
        if self.max_off_policy_steps > 0 and not self.rollout_servers:
            return (
                f"--max-off-policy-steps {self.max_off_policy_steps} needs --rollout-server: the in-process engine "
                "samples with the very weights the trainer updates, so its rollouts cannot overlap an update "
                "(asynchronous collection with the in-process engine is not implemented; docs/training.md)"
            )
        return None


class SFTConfig(Options):
    """Every option of a supervised fine-tuning run on stored episodes (recorded in
    OUT/config.json), declared once: the command line is generated from these fields. See
    docs/training.md, "Supervised fine-tuning on trajectories"."""

    from_runs: list[str] = Field(
        default_factory=list,
        description="run folder whose episodes to learn from (its run.db, or a training run's rollouts/); repeat",
        json_schema_extra=cli("--from"),
    )
    as_harness: Optional[str] = Field(
        default=None,
        description="re-render every episode into this harness (name or spec path), or 'own': each episode in the "
        "harness it ran in; default: the episodes' harness, when they all have one",
        json_schema_extra=cli("--as-harness"),
    )
    model: TrainModel = "smollm2-135m"
    device: Device = "auto"
    dtype: TrainDtype = "auto"
    min_score: Optional[float] = Field(
        default=None, ge=0, le=1, description="keep episodes scoring >= this (default: the passing ones)"
    )
    placebo: str = Field(
        default="none",
        description="none, or shuffle-answers: the final submit's arguments swapped across tasks (seeded)",
    )
    epochs: int = Field(default=3, ge=1, description="passes over the examples")
    batch_size: int = Field(default=8, ge=1, description="examples (model calls) per optimizer step")
    micro_batch: MicroBatch = 4096
    pack: bool = Field(
        default=False,
        description="the model calls of one episode share rows where each extends the last (each epoch then "
        "shuffles whole episodes, their calls kept together): fewer tokens forwarded, the same loss per batch",
    )
    gradient_checkpointing: GradientCheckpointing = False
    lr: LearningRate = 2e-4
    warmup_steps: int = Field(default=0, ge=0, description="optimizer steps of linear warm-up from 0 to --lr")
    weight_decay: WeightDecay = 0.0
    max_grad_norm: MaxGradNorm = 1.0
    lora_r: LoraRank = 16
    lora_alpha: LoraAlpha = 32.0
    lora_targets: LoraTargets = Field(default_factory=_default_lora_targets)
    checkpoint_every: int = Field(
        default=20, ge=1, description="write OUT/checkpoint every N optimizer steps (and at the end)"
    )
    seed: int = Field(
        default=0, description="seed of the LoRA init, the example order, the placebo's shuffle and --sample"
    )
    # Rejection sampling (docs/training.md, "Sampling new episodes"): all None = off.
    sample: Optional[int] = Field(
        default=None,
        ge=1,
        description="first run N attempts per task with --model and keep each task's best one if it passes the "
        "selection (tasks: those of the --from runs, else --sample-tasks of --sample-split)",
    )
    sample_harness: Optional[str] = Field(
        default=None, description="harness (name or spec path) the --sample attempts run in (default: --as-harness)"
    )
    sample_suite: Optional[str] = Field(default=None, description="suite to sample tasks of when there is no --from")
    sample_split: Optional[str] = Field(
        default=None, description="split to sample tasks of when there is no --from (train)"
    )
    sample_tasks: Optional[int] = Field(
        default=None, ge=1, description="first M tasks of --sample-split to sample (needed when there is no --from)"
    )
    sample_temperature: Optional[float] = Field(
        default=None, ge=0.0, le=5.0, description="sampling temperature of the --sample attempts (default 0.7)"
    )

    _lists = field_validator("lora_targets", mode="before")(comma_list)
    _placebo = field_validator("placebo")(_one_of("none", "shuffle-answers"))

    def refusal(self) -> str | None:
        if self.sample is None:
            alone = [option_name(f) for f in SAMPLING_OPTIONS if getattr(self, f) is not None]
            if alone:
                return f"{alone[0]} needs --sample N"
            if not self.from_runs:
                return (
                    "no --from run folder given: name the run folders whose episodes to learn from "
                    "(or sample new ones with --sample N)"
                )
            return None
        if self.as_harness == "own":
            return "--as-harness own cannot be sampled into: name one harness with --as-harness"
        if self.from_runs:  # the tasks sampled are those the --from runs hold episodes of
            for option in ("sample_split", "sample_tasks"):
                if getattr(self, option) is not None:
                    return (
                        f"{option_name(option)} chooses the tasks to sample when there is no --from; with --from the "
                        "tasks are the ones its runs hold episodes of"
                    )
            return None
        if self.sample_suite is None:
            return "--sample without --from needs --sample-suite NAME and --sample-tasks M (tasks of the split)"
        if self.sample_tasks is None:
            return (
                f"--sample without --from needs --sample-tasks M: how many tasks of --sample-split "
                f"{self.sample_split or SAMPLE_SPLIT} to sample"
            )
        return None


class DistillConfig(Options):
    """Every option of an on-policy distillation run (recorded in OUT/config.json), declared once:
    the command line is generated from these fields. See docs/training.md, "On-policy distillation"."""

    # both required (None: the run refuses to start, naming the option)
    teacher_harness: Annotated[
        Optional[str], Reads("harness", loop_for="distillation (the teacher harness's prompts)")
    ] = Field(
        default=None,
        description="the harness whose behaviour is distilled (name or spec path; e.g. an evolved spec); required",
    )
    student_harness: Annotated[
        Optional[str], Reads("harness", loop_for="distillation (the student harness's prompts)")
    ] = Field(default=None, description="the harness the student samples its episodes in (name or spec path); required")
    model: TrainModel = "smollm2-135m"
    device: Device = "auto"
    dtype: TrainDtype = "auto"
    suite: SuiteName = Field(default="toolcalc", description="suite whose train split gives the tasks")
    steps: int = Field(
        default=20, ge=1, description="training steps (one batch of student episodes and one optimizer step each)"
    )
    tasks_per_step: Annotated[int, Reads("count", "train")] = Field(
        default=4, ge=1, description="train tasks sampled per step"
    )
    attempts: int = Field(default=2, ge=1, description="student episodes per task and step")
    temperature: float = Field(
        default=0.7, gt=0, description="temperature of the student's sampling and of both distributions the KL compares"
    )
    lr: LearningRate = 1e-4
    weight_decay: WeightDecay = 0.0
    max_grad_norm: MaxGradNorm = 1.0
    lora_r: LoraRank = 16
    lora_alpha: LoraAlpha = 32.0
    lora_targets: LoraTargets = Field(default_factory=_default_lora_targets)
    micro_batch: MicroBatch = 2048
    gradient_checkpointing: GradientCheckpointing = False
    checkpoint_every: int = Field(default=10, ge=1, description="write OUT/checkpoint every N steps (and at the end)")
    max_in_flight: int = Field(default=64, ge=1, description="episodes in flight (generation batch)")
    rollout_servers: list[str] = Field(
        default_factory=list,
        description="not supported by distillation (refused): the student samples with the in-process engine",
        json_schema_extra=cli("--rollout-server", repeat=True),
    )
    retries: int = Field(default=2, ge=0, description="re-runs of an episode after an infrastructure error")
    seed: int = Field(default=0, description="seed of tasks, LoRA init and sampling")
    save_rollouts: bool = Field(default=True, description="keep every student episode in OUT/rollouts/run.db")

    _lists = field_validator("lora_targets", "rollout_servers", mode="before")(comma_list)

    def refusal(self) -> str | None:
        for which in ("teacher", "student"):
            if getattr(self, f"{which}_harness") is None:
                return f"--{which}-harness is required: name the {which} harness (name or spec path)"
        if self.rollout_servers:
            return (
                "--rollout-server is not supported by on-policy distillation: the student samples with the "
                'in-process engine on the weights it trains (docs/training.md, "On-policy distillation")'
            )
        return None
