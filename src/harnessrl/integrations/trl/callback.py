"""HarnessSchedulerCallback: the scheduler's side of a TRL run (a transformers TrainerCallback).

    on_train_begin          TRL's arguments checked (setup.check_args: every refusal they decide,
                            before the step-0 evaluation and the first batch) and served
                            (max_completion_length); a resumed run (global_step > 0) loads the
                            schedule's state and the evaluations' base from the TrainerState that
                            transformers read from the checkpoint it resumes, wherever that folder is
                            (its trainer_state.json, `stateful_callbacks["HarnessRollout"]`)
    on_pre_optimizer_step   the GradientSketch of the trainable parameters' gradient (accumulated
                            over the micro-batches, clipped: a uniform scale, which no cosine sees)
                            is added to the batch's observation; at the batch's last optimizer step
                            the scheduler observes the batch (HarnessSchedule.observe)
    on_step_end             the schedule's state into the TrainerState (which TRL saves into each
                            checkpoint's trainer_state.json); with eval_every: the trained and held-out
                            harnesses evaluated every N steps, rank 0 only, their figures on TRL's log
                            line of the step (the step-0 evaluation, of the base weights, runs at the
                            first batch, once the trainer is checked: HarnessRollout.__call__)

The callback holds no state of its own: it is HarnessRollout's (`rollout.callback`).
"""

from __future__ import annotations

from typing import Any, Protocol

from transformers import TrainerCallback

from harnessrl.integrations.trl.setup import (
    HarnessRolloutError,
    check_args,
    check_weights,
    optimizer_steps_per_batch,
)
from harnessrl.results import TrainEval
from harnessrl.train.harness_schedule import HarnessSchedule


class ScheduleOwner(Protocol):
    """What the callback needs of HarnessRollout: its schedule and how it saves, loads and observes."""

    schedule: HarnessSchedule

    def observe_batch(self, output_dir: str, is_main: bool, global_step: int) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any] | None, where: str) -> None: ...

    def configure(self, args) -> None: ...

    eval_every: int

    def evaluate(self, model, tokenizer, step: int, output_dir: str, temperature: float) -> TrainEval: ...

    def log_evaluation(self, record: TrainEval) -> None: ...

    def resume_evaluations(self, output_dir: str, global_step: int) -> None: ...


STATE_KEY = "HarnessRollout"  # in TrainerState.stateful_callbacks (no callback class bears the name)


class HarnessSchedulerCallback(TrainerCallback):
    """See the module docstring. Pass `rollout.callback` in GRPOTrainer's `callbacks`."""

    def __init__(self, rollout: ScheduleOwner):
        self.rollout = rollout

    def on_train_begin(self, args, state, control, **kwargs):
        check_args(args)  # every refusal TRL's arguments decide, before any evaluation or episode
        check_weights(kwargs.get("model"))
        self.rollout.configure(args)
        steps = optimizer_steps_per_batch(args)
        if state.global_step > 0 and self.rollout.schedule.batches_observed == 0:
            if state.global_step % steps:
                raise HarnessRolloutError(
                    f"checkpoint-{state.global_step} lies inside a generation batch ({steps} optimizer steps each): "
                    f"save at multiples of {steps} steps to resume"
                )
            # transformers read this TrainerState from the folder it resumes (resume_from_checkpoint as
            # given, or the last checkpoint of output_dir for True): the schedule comes from there
            saved = (state.stateful_callbacks or {}).get(STATE_KEY)
            self.rollout.load_state(saved, f"the resumed checkpoint's trainer_state.json (step {state.global_step})")
        if self.rollout.eval_every and state.is_world_process_zero and state.global_step > 0:
            self.rollout.resume_evaluations(args.output_dir, state.global_step)

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
        if state.stateful_callbacks is None:
            state.stateful_callbacks = {}
        if self.rollout.schedule.pending is None:  # at a batch boundary (a resume can only start there)
            state.stateful_callbacks[STATE_KEY] = self.rollout.state()  # saved with trainer_state.json
        every = self.rollout.eval_every
        due = every and (state.global_step % every == 0 or state.global_step == state.max_steps)
        if due and state.is_world_process_zero:
            model, tokenizer = kwargs.get("model"), kwargs.get("processing_class")
            if model is None or tokenizer is None:
                raise RuntimeError("transformers did not pass the model and processing_class to the callback")
            was_training = model.training
            record = self.rollout.evaluate(
                model, tokenizer, state.global_step, args.output_dir, float(args.temperature)
            )
            model.train(was_training)
            self.rollout.log_evaluation(record)
            control.should_log = True  # the evaluation's figures on this step's log line
