"""HarnessSchedulerCallback: the scheduler's side of a TRL run (a transformers TrainerCallback).

    on_train_begin          a resumed run (global_step > 0) loads the schedule's state from the
                            checkpoint it resumes (OUTPUT_DIR/checkpoint-STEP/harnessrl_schedule.json)
    on_pre_optimizer_step   the GradientSketch of the trainable parameters' gradient (accumulated
                            over the micro-batches, clipped: a uniform scale, which no cosine sees)
                            is added to the batch's observation; at the batch's last optimizer step
                            the scheduler observes the batch (HarnessSchedule.observe)
    on_step_end             with eval_every: the trained and held-out harnesses evaluated every N steps
                            (and at step 0, the base weights, from on_train_begin), rank 0 only
    on_save                 the schedule's state into the checkpoint folder TRL just wrote

The callback holds no state of its own: it is HarnessRollout's (`rollout.callback`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from transformers import TrainerCallback

from harnessrl.integrations.trl.setup import HarnessRolloutError, optimizer_steps_per_batch
from harnessrl.results import TrainEval
from harnessrl.train.harness_schedule import HarnessSchedule


class ScheduleOwner(Protocol):
    """What the callback needs of HarnessRollout: its schedule and how it saves, loads and observes."""

    schedule: HarnessSchedule

    def observe_batch(self, output_dir: str, is_main: bool, global_step: int) -> None: ...

    def save_state(self, checkpoint: Path) -> None: ...

    def load_state(self, checkpoint: str | Path) -> None: ...

    eval_every: int

    def evaluate(self, model, tokenizer, step: int, output_dir: str, temperature: float) -> TrainEval: ...

    def resume_evaluations(self, output_dir: str, global_step: int) -> None: ...


def checkpoint_folder(output_dir: str, global_step: int) -> Path:
    """Where transformers' Trainer writes the checkpoint of `global_step`."""
    return Path(output_dir) / f"checkpoint-{global_step}"


class HarnessSchedulerCallback(TrainerCallback):
    """See the module docstring. Pass `rollout.callback` in GRPOTrainer's `callbacks`."""

    def __init__(self, rollout: ScheduleOwner):
        self.rollout = rollout

    def on_train_begin(self, args, state, control, **kwargs):
        steps = optimizer_steps_per_batch(args)  # refuse a mixing set-up before the first step
        if state.global_step > 0 and self.rollout.schedule.batches_observed == 0:
            if state.global_step % steps:
                raise HarnessRolloutError(
                    f"checkpoint-{state.global_step} lies inside a generation batch ({steps} optimizer steps each): "
                    f"save at multiples of {steps} steps to resume"
                )
            self.rollout.load_state(checkpoint_folder(args.output_dir, state.global_step))
        if self.rollout.eval_every and state.is_world_process_zero:
            if state.global_step > 0:
                self.rollout.resume_evaluations(args.output_dir, state.global_step)
            else:  # the base weights (LoRA starts as the identity): what later evaluations pair with
                self._evaluate(args, state, kwargs)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        schedule = self.rollout.schedule
        if schedule.pending is None:
            return  # no batch of ours (a trainer that does not use the HarnessRollout as rollout_func)
        if model is None:
            raise RuntimeError("transformers did not pass the model to on_pre_optimizer_step")
        schedule.add_sketch(schedule.sketcher.sketch_model(model))
        if (state.global_step + 1) % optimizer_steps_per_batch(args) == 0:
            self.rollout.observe_batch(args.output_dir, state.is_world_process_zero, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        every = self.rollout.eval_every
        due = every and (state.global_step % every == 0 or state.global_step == state.max_steps)
        if due and state.is_world_process_zero:
            self._evaluate(args, state, kwargs)

    def _evaluate(self, args, state, kwargs) -> None:
        model, tokenizer = kwargs.get("model"), kwargs.get("processing_class")
        if model is None or tokenizer is None:
            raise RuntimeError("transformers did not pass the model and processing_class to the callback")
        was_training = model.training
        self.rollout.evaluate(model, tokenizer, state.global_step, args.output_dir, float(args.temperature))
        model.train(was_training)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.rollout.save_state(checkpoint_folder(args.output_dir, state.global_step))
