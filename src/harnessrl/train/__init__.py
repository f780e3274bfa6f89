"""Training across harnesses (HarnessBandit multi-harness GRPO).

What exists so far, one idea per file:

  grpo.py        group advantages, training units (one per model call), padding,
                 teacher-forced token log-probs and the clipped GRPO/DAPO loss
  sketch.py      GradientSketch: a seeded linear projection of gradients to a few hundred numbers
  schedulers.py  which harness collects the next batch: mixed, uniform, round-robin, single:NAME,
                 harness-bandit (and its learnability-only / transfer-only ablations)

The trainer (the loop scheduler -> runner -> loss -> sketch -> scheduler) and `harnessrl train`
are not written yet. See docs/training.md.
"""
