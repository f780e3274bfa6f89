"""Write the improved harness of the self-distillation study: the seed spec plus the rules
proposer's `format-demonstration` edit, built exactly as `harnessrl evolve --proposer rules`
builds it (a worked example replayed for real from the first 8 train tasks of the suite).

This is the edit the evolution accepted on toolcalc from xml-tags after the warm start
(docs/BENCHMARKS.md, "Toolcalc from xml-tags after the warm start"); writing it directly skips
the 77-minute search so that the study's time goes to collection and held-out cells.

    .venv/bin/python bench/improved_spec.py --seed-harness xml-tags --out bench/specs/xml-tags-demo.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harnessrl.evolve.edits import apply_changes
from harnessrl.evolve.proposers import worked_example
from harnessrl.harness.registry import load_harness
from harnessrl.tasks.registry import get_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="toolcalc")
    ap.add_argument("--seed-harness", default="xml-tags")
    ap.add_argument("--name", default=None, help="name of the improved spec (default: SEED-demo)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    suite = get_suite(args.suite)
    example = worked_example(suite.tasks("train", min(8, suite.split_sizes.get("train", 0))))
    if example is None:
        raise SystemExit(f"no train task of {args.suite} has a replayable solution")
    seed = load_harness(args.seed_harness)
    demos = [d.model_dump(mode="json") for d in seed.rules.demonstrations]
    improved = apply_changes(seed, {"rules.demonstrations": demos + [example]})
    improved = improved.model_copy(update={"name": args.name or f"{seed.name}-demo"})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(improved.to_yaml())
    print(f"wrote {args.out}: {seed.name} + one worked example ({len(example['calls'])} calls)")


if __name__ == "__main__":
    main()
