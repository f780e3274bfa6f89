"""The jobs as library calls, each behind one `harnessrl` command: `evaluate` (run_eval,
`harnessrl eval`), `study` (the harness x weights study; its numbers in `study_analysis`) and
`stages`, the stage runner that `study` and `harnessrl improve` share. Training and evolution
have packages of their own (train/, evolve/, improve/).

Nothing is imported here: `import harnessrl.jobs.evaluate` loads only what an evaluation needs."""
