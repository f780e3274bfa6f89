"""Built-in task suites, one file per suite.

- `workspace`: file-system tasks graded on the final state of a sandboxed workspace.
- `toolcalc`: one- or two-call micro tasks (arithmetic, table lookup, unit conversion) small
  enough for a 135M model to solve sometimes.

Suites are found by name through `harnessrl.tasks.registry.get_suite`.
"""
