"""What HarnessRollout reads of a TRL trainer, in one place (TRL 1.16: the version tested).

Every attribute of the trainer the integration depends on is read here, so a TRL release that
moves one breaks one file. `check()` refuses, in words, what the integration does not serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harnessrl.train.harness_schedule import Scale


class HarnessRolloutError(ValueError):
    """A TRL set-up, a prompt, a harness or a checkpoint that HarnessRollout cannot serve, said in words."""


class TRLSetupError(HarnessRolloutError):
    """A TRL configuration the harnessrl integration does not serve."""


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
        """TRL's top_k, min_p and repetition_penalty as harnessrl's SamplingParams fields (None,
        TRL's "unset", is the neutral value): the engine applies them as vLLM does."""
        args = self.args
        return {
            "top_k": int(args.top_k) if args.top_k not in (None, -1) else 0,
            "min_p": float(args.min_p) if args.min_p is not None else 0.0,
            "repetition_penalty": float(args.repetition_penalty) if args.repetition_penalty is not None else 1.0,
        }

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

    def check(self) -> None:
        """Refuse what the integration does not serve, each with what to do instead."""
        args, trainer = self.args, self.trainer
        if getattr(trainer, "use_vllm", False):
            raise TRLSetupError(
                "use_vllm=True is not served by harnessrl's TRL integration yet: episodes are generated by "
                "harnessrl's engine on the model TRL trains (use_vllm=False). For vLLM rollouts use "
                "`harnessrl train grpo --rollout-server` (docs/trl.md, 'What is not served')"
            )
        if getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False):
            raise TRLSetupError(
                "DeepSpeed and FSDP are not served: the scheduler's gradient sketch reads every trainable "
                "parameter's whole gradient on every process (DDP, or one process)"
            )
        from harnessrl.models.base import SamplingParams

        try:
            SamplingParams(temperature=self.temperature, top_p=self.top_p, **self.shaping)
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
