"""What HarnessRollout reads of a TRL trainer, in one place (TRL 1.16: the version tested).

Every attribute of the trainer the integration depends on is read here, so a TRL release that
moves one breaks one file. `check()` refuses, in words, what the integration does not serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harnessrl.errors import JobError
from harnessrl.train.harness_schedule import Scale


class HarnessRolloutError(ValueError):
    """A TRL set-up, a prompt, a harness or a checkpoint that HarnessRollout cannot serve, said in words."""


class TRLSetupError(HarnessRolloutError):
    """A TRL configuration the harnessrl integration does not serve."""


class RolloutInputError(HarnessRolloutError, JobError):
    """A suite, harness or evaluation argument of HarnessRollout that the job kernel's reading
    refused (harnessrl.kernel.read_inputs, as for `harnessrl train grpo`), naming the argument."""


def optimizer_steps_per_batch(args) -> int:
    """Optimizer steps TRL takes on one generation batch: steps_per_generation * num_iterations
    micro-batches, gradient_accumulation_steps of them per optimizer step. It must divide evenly,
    or one optimizer step would mix two batches (two harnesses) and one observation would not be
    one harness's batch."""
    micro = int(args.steps_per_generation) * int(args.num_iterations)
    accumulation = int(args.gradient_accumulation_steps)
    if micro % accumulation:
        raise TRLSetupError(
            f"steps_per_generation ({args.steps_per_generation}) x num_iterations ({args.num_iterations}) must be a "
            f"multiple of gradient_accumulation_steps ({accumulation}): otherwise an optimizer step mixes two "
            "generation batches, and with them two harnesses"
        )
    return micro // accumulation


def scale_of(args) -> Scale:
    """TRL's scale_rewards as harnessrl's advantage scaling."""
    value = {True: "group", False: "none"}.get(args.scale_rewards, args.scale_rewards)
    if value not in ("group", "batch", "none"):
        raise TRLSetupError(f"scale_rewards {args.scale_rewards!r} is not one of 'group', 'batch', 'none'")
    return value


def generating_module(model):
    """For a peft model its base model, into which peft injected the LoRA layers (so it samples
    with the adapter); any other model as it is."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def text_tokenizer(processing_class):
    """The tokenizer of a processing class (a processor holds one), or the tokenizer itself."""
    return getattr(processing_class, "tokenizer", processing_class)


@dataclass(frozen=True)
class TrainerFacts:
    """A TRL GRPOTrainer as HarnessRollout sees it."""

    trainer: Any

    @classmethod
    def of(cls, trainer) -> TrainerFacts:
        return cls(trainer)

    @property
    def args(self):
        return self.trainer.args

    @property
    def training(self) -> bool:
        return bool(self.trainer.model.training)

    @property
    def num_generations(self) -> int:
        return int(self.trainer.num_generations)

    @property
    def process_index(self) -> int:
        return int(self.trainer.accelerator.process_index)

    @property
    def is_main(self) -> bool:
        return bool(self.trainer.accelerator.is_main_process)

    @property
    def temperature(self) -> float:
        return float(self.args.temperature)

    @property
    def top_p(self) -> float:
        return float(self.args.top_p)

    @property
    def shaping(self) -> dict[str, float]:
        return shaping_of(self.args)

    @property
    def scale(self) -> Scale:
        return scale_of(self.args)

    @property
    def output_dir(self) -> str:
        return str(self.args.output_dir)

    @property
    def global_step(self) -> int:
        return int(self.trainer.state.global_step)

    def reward_funcs(self) -> list:
        return list(self.trainer.reward_funcs)

    def batch_index(self) -> int:
        """The generation batch about to be played: optimizer steps so far / steps per batch."""
        return int(self.trainer.state.global_step) // optimizer_steps_per_batch(self.args)

    def groups_per_batch(self) -> int:
        return int(self.args.generation_batch_size) // self.num_generations

    def gather(self, values: list) -> list:
        """Every process's list, concatenated in process order (the order of TRL's gathered batch)."""
        if self.trainer.accelerator.num_processes == 1:
            return list(values)
        from accelerate.utils import gather_object

        return list(gather_object(values))

    def generation_model(self):
        """The module that generates: TRL's model unwrapped (DDP), and for a peft model its base
        model, into which peft injected the LoRA layers (so it samples with the adapter)."""
        return generating_module(self.trainer.accelerator.unwrap_model(self.trainer.model))

    def tokenizer(self):
        return text_tokenizer(self.trainer.processing_class)

    @property
    def max_completion_length(self) -> int | None:
        return max_completion_length(self.args)

    def add_metrics(self, metrics: dict[str, float]) -> None:
        """Values for TRL's next log line (GRPOTrainer averages its `_metrics` at each log)."""
        for name, value in metrics.items():
            self.trainer._metrics["train"][name].append(float(value))

    def log(self, metrics: dict[str, float]) -> None:
        """A log line of TRL's now (Trainer.log: log_history and every reporting integration)."""
        self.trainer.log(dict(metrics))

    def take_truncation_masking(self) -> bool:
        """TRL's mask_truncated_completions, served by HarnessRollout (its env_mask) in TRL's stead:
        TRL's own test (the completion's last token is not EOS or pad) is switched off on the
        trainer, since an episode's completion ends where the harness stopped its last call (a stop
        string, a tool call), not at EOS (docs/trl.md, "Completion length and truncation")."""
        asked = bool(getattr(self.trainer, "mask_truncated_completions", False))
        self.trainer.mask_truncated_completions = False
        return asked

    def check(self, reward: Any) -> None:
        """Refuse what the integration does not serve, each with what to do instead: the
        arguments' refusals (`check_args`), then what only the trainer knows (`reward`: the
        HarnessRollout's reward function, which must be the only one)."""
        check_args(self.args)
        trainer = self.trainer
        check_weights(getattr(trainer, "model", None))
        if getattr(trainer, "use_vllm", False):
            raise TRLSetupError(USE_VLLM)
        if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False):
            raise TRLSetupError(SHARDED)
        if getattr(trainer, "tools", None):
            raise TRLSetupError(
                "GRPOTrainer(tools=...) is not served: TRL would parse tool calls out of each episode's completion "
                "and run them after the episode ended. A harness calls its own tools during the episode: give "
                "them to the harness (its spec's tools) or to the suite's tasks"
            )
        funcs = self.reward_funcs()
        if not any(f is reward for f in funcs):
            raise TRLSetupError("pass reward_funcs=rollout.reward to GRPOTrainer (the episodes' scores are the reward)")
        if len(funcs) > 1:
            raise TRLSetupError(
                f"{len(funcs) - 1} reward function(s) beside rollout.reward are not served: TRL would add their "
                "rewards to the episode's score for its advantages while the harness scheduler observes the score "
                "alone (two different training signals), and TRL sums an infrastructure error's None with the "
                "other functions' numbers, which puts that row back into its group's mean and std. Grade the "
                "episode in the suite's grader (its score is the reward), and pass reward_funcs=rollout.reward only"
            )


USE_VLLM = (
    "use_vllm=True is not served by harnessrl's TRL integration: HarnessRollout samples every episode with "
    "harnessrl's engine on the model TRL trains, so TRL would start its vLLM engine and push the weights into it "
    "before every batch for nothing (sampling the episodes through TRL's vLLM engine is not built). Set "
    "use_vllm=False; for episodes sampled by vLLM use `harnessrl train grpo --rollout-server` against `vllm serve` "
    "(docs/scale.md). On vLLM's CPU build TRL 1.16 trains in neither vLLM mode (docs/trl.md, 'vLLM generation')"
)
SHARDED = (
    "DeepSpeed and FSDP are not served: the scheduler's gradient sketch reads every trainable parameter's whole "
    "gradient on every process (DDP, or one process)"
)


def max_completion_length(args) -> int | None:
    """TRL's max_completion_length, as the token cap of each model call of an episode (None: TRL's
    config has none; the harness's own max_new_tokens then)."""
    value = getattr(args, "max_completion_length", None)
    if value is None:
        return None
    if int(value) < 1:
        raise TRLSetupError(f"max_completion_length must be at least 1, got {value}")
    return int(value)


PRECISION = (
    "TRL's log-probs of the sampled tokens then differ from the sampler's (measured on the embedded model: up to "
    "0.19 nats under bf16 autocast, 0.25 with bfloat16 weights, 4e-5 in float32; docs/trl.md, 'Precision') and TRL "
    "1.16 applies its importance-sampling correction (vllm_importance_sampling_correction) to its vLLM generation "
    "only, never to a rollout_func's log-probs"
)


def check_precision(args) -> None:
    """Refuse TRL's mixed precision (bf16 or fp16 autocast, `bf16=True` being TRL's default): TRL
    computes the loss's log-probs under autocast, harnessrl's engine samples without it."""
    for flag in ("bf16", "fp16"):
        if getattr(args, flag, False):
            raise TRLSetupError(
                f"{flag}=True (TRL's mixed precision: its forward under {flag} autocast, harnessrl's engine sampling "
                f"without) is not served: {PRECISION}. Set {flag}=False and keep the model's weights in float32"
            )


def check_weights(model) -> None:
    """Refuse a model whose weights are not all float32: the engine and TRL's forward compute in
    bfloat16 (or float16) by different kernels, and their log-probs part as under autocast."""
    if model is None:
        return
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    others = sorted(str(d).removeprefix("torch.") for d in dtypes if str(d) != "torch.float32")
    if others:
        raise TRLSetupError(
            f"the model's weights are in {', '.join(others)}: not served, since {PRECISION}. Load the model in "
            "float32 (torch_dtype=torch.float32) and keep bf16=False"
        )


def check_args(args) -> None:
    """The refusals that TRL's arguments decide, each with what to do instead: called at the
    callback's on_train_begin (before the step-0 evaluation and the first batch) and again at the
    first batch (a trainer without the callback)."""
    if getattr(args, "use_vllm", False):
        raise TRLSetupError(USE_VLLM)
    if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
        raise TRLSetupError(SHARDED)
    from harnessrl.models.base import SamplingParams

    shaping = shaping_of(args)
    try:
        SamplingParams(temperature=float(args.temperature), top_p=float(args.top_p), **shaping)
    except ValueError as e:
        raise TRLSetupError(f"TRL's sampling settings cannot be applied: {e}") from None
    if getattr(args, "generation_kwargs", None):
        raise TRLSetupError(
            "generation_kwargs cannot be applied by harnessrl's engine: it applies TRL's temperature, top_p, "
            "top_k, min_p and repetition_penalty only"
        )
    optimizer_steps_per_batch(args)
    scale_of(args)
    if getattr(args, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        raise TRLSetupError("multi_objective_aggregation must be 'sum_then_normalize' (the episode's score alone)")
    weights = getattr(args, "reward_weights", None)
    if weights is not None and list(weights) != [1.0]:
        raise TRLSetupError(
            f"reward_weights {list(weights)} are not served: the episode's score is the only reward (weight 1)"
        )
    max_completion_length(args)
    check_precision(args)


def shaping_of(args) -> dict[str, float]:
    """TRL's top_k, min_p and repetition_penalty as harnessrl's SamplingParams fields (None,
    TRL's "unset", is the neutral value): the engine applies them as vLLM does."""
    return {
        "top_k": int(args.top_k) if args.top_k not in (None, -1) else 0,
        "min_p": float(args.min_p) if args.min_p is not None else 0.0,
        "repetition_penalty": float(args.repetition_penalty) if args.repetition_penalty is not None else 1.0,
    }
