"""Training across harnesses (HarnessBandit multi-harness GRPO).

One idea per file:

  grpo.py        group advantages, training units (one per model call), padding,
                 teacher-forced token log-probs and the clipped GRPO/DAPO loss
  sketch.py      GradientSketch: a seeded linear projection of gradients to a few hundred numbers
  schedulers.py  which harness collects the next batch: mixed, uniform, round-robin, single:NAME,
                 harness-bandit (and its learnability-only / transfer-only ablations)

  trainer.py     the loop: scheduler -> runner -> GRPO loss -> backward -> sketch -> optimizer ->
                 scheduler.observe, with LoRA, checkpoints and resume
  config.py      TrainConfig: every option, declared once (the CLI, harnessrl.cli.train, is built from it)
  distributed.py several training processes (torchrun / accelerate launch): the process group and
                 the collectives the trainer uses; one process without a launcher

See docs/training.md.
"""
