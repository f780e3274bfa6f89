"""How many of a run's episodes are one token sequence (docs/trl.md, "When an episode is not one
sequence"): per harness, the episodes whose model calls form a prefix chain, and the share of the
model's completion tokens a one-completion trainer (TRL's rollout_func through
harnessrl.integrations.trl) keeps when it cuts each episode at its first prefix break.

    .venv/bin/python bench/episode_sequences.py RUN_FOLDER [--record]

RUN_FOLDER is any run with a run database (harnessrl eval --out RUN_FOLDER). Where a break is, the
first differing token of the two calls is decoded to show what the harness re-rendered.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

from harnessrl.store import RunStore
from harnessrl.train.episode_sequence import episode_sequence, first_difference, sampled_calls


def analyse(folder: Path, tokenizer=None, examples: int = 3) -> dict:
    store = RunStore(folder)
    by_harness: dict[str, Counter] = defaultdict(Counter)
    shown: dict[str, list[str]] = defaultdict(list)
    for traj in store.trajectories():
        if traj.is_infra_error:
            continue
        seq = episode_sequence(traj)
        c = by_harness[traj.harness]
        c["episodes"] += 1
        if seq is None:
            continue
        c["multi_turn"] += seq.turns > 1
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
            sampled = tokenizer.decode(tokens[max(0, at - 3) : at + 5])
            rendered = tokenizer.decode(list(after.prompt_ids)[max(0, at - 3) : at + 5])
            shown[traj.harness].append(f"sampled {sampled!r} / re-rendered {rendered!r}")
    rows = []
    for h, c in sorted(by_harness.items()):
        rows.append(
            {
                "harness": h,
                "episodes": c["episodes"],
                "multi-turn": c["multi_turn"],
                "with a prefix break": c["broken"],
                "turns kept": f"{c['turns_kept']}/{c['turns']}",
                "model tokens kept": round(c["model_tokens_kept"] / c["model_tokens"], 3)
                if c["model_tokens"]
                else None,
            }
        )
    return {"rows": rows, "examples": dict(shown)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--record", action="store_true", help="append the table to bench/results/episode_sequences.jsonl")
    args = p.parse_args(argv)
    from harnessrl.models.embedded import load_tokenizer

    result = analyse(args.run, load_tokenizer())
    for row in result["rows"]:
        print(json.dumps(row))
    for h, lines in result["examples"].items():
        for line in lines:
            print(f"{h}: {line}")
    if args.record:
        from results import record_run

        record_run("episode_sequences", result["rows"], results=result)
    return result


if __name__ == "__main__":
    main()
