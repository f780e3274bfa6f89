"""How many episodes are one token sequence (docs/trl.md, "When an episode is not one sequence"):
per harness, the episodes whose model calls form a prefix chain, and the share of the model's
completion tokens that a one-completion trainer (TRL's rollout_func through
harnessrl.integrations.trl) keeps when it cuts each episode at its first prefix break.

    .venv/bin/python bench/episode_sequences.py --play [--tasks 6] [--record]   # both ways, same seeds
    .venv/bin/python bench/episode_sequences.py --run RUN_FOLDER                  # any stored run

--play plays the first N toolcalc dev tasks (one attempt each, T=0.7, seed 0) through the built-in
harnesses without a history window (json-tools, react, plan-execute, hermes-tools) on the embedded
model twice, with the same jobs and seeds: the history rendered from the replies' text (as
`harnessrl eval` does) and continued from the tokens as sampled (HFPolicy.sampled_history, what
HarnessRollout uses). Where a break is, the first differing tokens are decoded to show what the
re-rendering changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harnessrl.train.episode_sequence import episode_sequence, first_difference, sampled_calls  # noqa: E402

HARNESSES = ("json-tools", "react", "plan-execute", "hermes-tools")


def analyse(trajectories, tokenizer=None, examples: int = 2) -> tuple[dict[str, Counter], dict[str, list[str]]]:
    by_harness: dict[str, Counter] = defaultdict(Counter)
    shown: dict[str, list[str]] = defaultdict(list)
    for traj in trajectories:
        if traj.is_infra_error:
            continue
        seq = episode_sequence(traj)
        c = by_harness[traj.harness]
        c["episodes"] += 1
        if seq is None:
            continue
        c["broken"] += seq.broken
        c["turns"] += seq.turns
        c["turns_kept"] += seq.turns_kept
        c["model_tokens"] += seq.model_tokens
        c["model_tokens_kept"] += seq.model_tokens_kept
        if seq.broken and tokenizer is not None and len(shown[traj.harness]) < examples:
            calls = sampled_calls(traj)
            before, after = calls[seq.turns_kept - 1], calls[seq.turns_kept]
            tokens = list(before.prompt_ids) + list(before.completion_ids)
            at = first_difference(list(after.prompt_ids), tokens)
            sampled = tokenizer.decode(tokens[max(0, at - 3) : at + 4])
            rendered = tokenizer.decode(list(after.prompt_ids)[max(0, at - 3) : at + 4])
            shown[traj.harness].append(f"sampled {sampled!r} / re-rendered {rendered!r}")
    return by_harness, shown


def kept(c: Counter) -> float | None:
    return round(c["model_tokens_kept"] / c["model_tokens"], 3) if c["model_tokens"] else None


def play(tasks: int, sampled_history: bool):
    from harnessrl.harness.registry import load_harness
    from harnessrl.models.base import SamplingParams
    from harnessrl.models.hf import load_local
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.tasks import get_suite

    policy = load_local("smollm2-135m")
    policy.sampled_history = sampled_history
    jobs = make_jobs(get_suite("toolcalc").tasks("dev", tasks), [load_harness(h) for h in HARNESSES], 1)
    trajectories = Runner(policy, SamplingParams(temperature=0.7, seed=0), max_in_flight=16, progress=False).run(jobs)
    policy.close()
    return trajectories, policy.tokenizer


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--play", action="store_true", help="play the episodes both ways (see the module docstring)")
    p.add_argument("--tasks", type=int, default=6, help="with --play: the first N toolcalc dev tasks")
    p.add_argument("--run", type=Path, help="analyse a stored run folder instead")
    p.add_argument("--record", action="store_true", help="append to bench/results/episode_sequences.jsonl")
    args = p.parse_args(argv)
    if args.run is None and not args.play:
        p.error("give --play or --run RUN_FOLDER")
    ways: dict[str, tuple[dict[str, Counter], dict[str, list[str]]]] = {}
    if args.run is not None:
        from harnessrl.models.embedded import load_tokenizer
        from harnessrl.store import RunStore

        ways["stored run"] = analyse(list(RunStore(args.run).trajectories()), load_tokenizer())
    else:
        for name, on in (("history rendered from text", False), ("history as sampled", True)):
            trajectories, tokenizer = play(args.tasks, on)
            ways[name] = analyse(trajectories, tokenizer)
    rows = []
    for harness in sorted({h for counts, _ in ways.values() for h in counts}):
        row: dict = {"harness": harness}
        for name, (counts, _) in ways.items():
            c = counts.get(harness, Counter())
            row[f"{name}: episodes broken"] = f"{c['broken']}/{c['episodes']}"
            row[f"{name}: turns kept"] = f"{c['turns_kept']}/{c['turns']}"
            row[f"{name}: model tokens kept"] = kept(c)
        rows.append(row)
    for row in rows:
        print(json.dumps(row))
    for name, (_, shown) in ways.items():
        for harness, lines in shown.items():
            for line in lines:
                print(f"{name}, {harness}: {line}")
    result = {"rows": rows, "examples": {name: shown for name, (_, shown) in ways.items()}, "tasks": args.tasks}
    if args.record:
        from results import record_run

        record_run("episode_sequences", rows, results=result)
    return result


if __name__ == "__main__":
    main()
