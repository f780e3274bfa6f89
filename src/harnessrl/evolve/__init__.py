"""Harness evolution: propose harness edits, keep those that beat measured noise on dev tasks,
confirm once on held-out tasks. See docs/evolve.md.

- `edits`: the edit space (spec diffs, validation)
- `acceptance`: noise estimate, threshold rule, paired comparison
- `proposers`: `rules` (triage -> catalogue edits) and `llm` (a model writes the new spec)
- `loop`: the loop, its run folder, resume and lock
"""

from harnessrl.evolve.loop import EvolveConfig, EvolveError, Evolution

__all__ = ["EvolveConfig", "EvolveError", "Evolution"]
