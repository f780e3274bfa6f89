"""Built-in task suites, one module or package per suite; their word pools are package data
(`data/<suite>.json`, read by `pools.py`) and they read answers through `harnessrl.tasks.grading`.

- `workspace`: file-system tasks graded on the final state of a sandboxed workspace.
- `toolcalc`: one- or two-call micro tasks (arithmetic, table lookup, unit conversion) small
  enough for a 135M model to solve sometimes.
- `planning`: travel planning in a generated world behind search tools; an itinerary graded
  DeepPlanning-style (commonsense score, personalised all-or-nothing score, their mean).
- `browse`: a generated shop-and-forum site served as text pages; answers need facts from two or
  more pages, so how much page history a harness keeps (`observation_window`) matters.

Task folders of other benchmarks load as suites through `harnessrl.tasks.importers`
(`clawgym:PATH`, `pinchbench:PATH`, `harbor:PATH`).

Suites are found by name through `harnessrl.tasks.registry.get_suite`.
"""
