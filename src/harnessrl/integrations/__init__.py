"""harnessrl inside other trainers: one subpackage per trainer, named after it.

    harnessrl.integrations.trl    TRL's GRPOTrainer (`pip install 'harnessrl[trl]'`, docs/trl.md)

What each brings is ours: harnesses and suites as episodes that yield token-exact completions with
a mask of the tokens the model did not generate (`harnessrl.train.episode_sequence`), and the
harness schedulers (`harnessrl.train.schedulers`) with the gradient sketch they observe.
"""
