"""Training across harnesses (HarnessBandit multi-harness GRPO).

One idea per file:

  grpo.py        group advantages, training units (one per model call), padding,
                 teacher-forced token log-probs and the clipped GRPO/DAPO loss
  sketch.py      GradientSketch: a seeded linear projection of gradients to a few hundred numbers
  schedulers.py  which harness collects the next batch: HarnessBandit, its ablations and the
                 baselines (`KNOWN_SCHEDULERS` names them all, the module docstring describes each)

  step.py        one step's pieces: the plan (harness, tasks), group advantages and units, the
                 step's statistics, the scheduler's observation (typed records)
  pipeline.py    the rollouts of the steps: plans made ahead and collected while a step trains
                 (--max-off-policy-steps), dynamic sampling's refill rounds, the policy versions
                 on the rollout servers (RolloutPipeline)
  update.py      the optimizer steps of one batch: old log-probs recomputed, gradient accumulation,
                 sketch, clip, AdamW
  checkpoint.py  the GRPO checkpoint (adapter, optimizer, generators, state)
  progress.py    the progress bar of training runs
  trainer.py     the run: plan -> rollouts -> advantages -> update -> observe, with LoRA,
                 evaluation, checkpoints, resume and the step's record
  config.py      TrainConfig: every option, declared once (the CLI, harnessrl.cli.train, is built from it)
  distributed.py several training processes (torchrun / accelerate launch): the process group and
                 the collectives the trainer uses; one process without a launcher

See docs/training.md.
"""
