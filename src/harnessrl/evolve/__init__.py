"""Harness evolution: propose harness edits, keep those that beat measured noise on dev tasks,
confirm once on held-out tasks. See docs/evolve.md.

- `edits`: the edit space (spec diffs, validation)
- `acceptance`: noise estimate, threshold rule, paired comparison
- `proposers`: `rules` (triage -> catalogue edits) and `llm` (a model writes the new spec)
- `config`: EvolveConfig, every option declared once (the CLI is generated from it)
- `loop`: the loop, its run folder, resume and lock
- `run`: `run_evolve(config, out)`, the whole job as a library call
"""

from harnessrl.evolve.config import EvolveConfig
from harnessrl.evolve.loop import Evolution, EvolveError
from harnessrl.evolve.run import run_evolve

__all__ = ["EvolveConfig", "EvolveError", "Evolution", "run_evolve"]
