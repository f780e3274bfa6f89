"""mini-swe-agent (pip `mini-swe-agent`, unmodified) and a built-in harness trained through TRL's GRPOTrainer.

On this machine (the embedded SmolLM2-135M on the CPU, one step, two tasks in groups of two: one
group through mini-swe-agent, one through json-tools):

    HARNESSRL_THREADS=1 .venv/bin/python examples/trl/mini_swe_agent_trl.py --out runs/trl-mini

(about 5 minutes for the step on a 2-core CPU. SmolLM2-135M wrote no bash call mini-swe-agent could
parse there: each of its mini episodes made 3 calls, mini exited after its format errors, and the
trained row held the first call; json-tools' rows held all 4 of their calls.)

It is examples/trl/train_toolcalc.py (the same options, passed on) with
examples/agents/mini_swe_agent.yaml among the harnesses, the agent's model calls capped at
--max-calls, and a ratio scheduler that gives each harness one group of every batch. After the
step it prints each episode of the batch: its harness, its model calls, the calls the row TRL
trained on holds (the runs of the model's own tokens under env_mask 1), what harnessrl's
recording endpoint counted of the calls (meta "sampled_turns": calls continued from the tokens
the model sampled, replies the agent sent back altered or not at all, prefix breaks), and the wall
time. mini-swe-agent sends a reply it cannot parse back not at all (its format error instead), so
a call after such a reply starts a new sequence: the row keeps the calls before it, and the count
says so.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MINI = HERE.parent / "agents" / "mini_swe_agent.yaml"
sys.path.insert(0, str(HERE))

from train_toolcalc import build_trainer, parse_args  # noqa: E402  (the example beside this one)


def capped(spec, calls: int):
    """An agent program's spec with at most `calls` model calls per episode (a built-in harness as it is)."""
    from harnessrl.harness.spec import ExternalHarnessSpec

    if not isinstance(spec, ExternalHarnessSpec):
        return spec
    return spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_model_calls": calls})})


def model_runs(mask: list[int]) -> int:
    """The runs of the model's own tokens (env_mask 1) in a row: the model calls it trains on."""
    return sum(1 for k, m in enumerate(mask) if m == 1 and (k == 0 or mask[k - 1] == 0))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    calls = 4
    if "--max-calls" in argv:
        at = argv.index("--max-calls")
        calls = int(argv[at + 1])
        del argv[at : at + 2]
    defaults = {
        "--harnesses": f"{MINI},json-tools",
        "--scheduler": "ratio:mini-swe-agent=1,json-tools=1",
        "--train-tasks": "2",
        "--per-device-batch": "4",
        "--num-generations": "2",
        "--steps": "1",
        "--max-steps-per-episode": str(calls),
        "--max-in-flight": "4",
        "--out": "runs/trl-mini",
    }
    for option, value in defaults.items():
        if option not in argv:
            argv += [option, value]
    args = parse_args(argv)
    started = time.perf_counter()
    trainer, rollout = build_trainer(args)
    rollout.specs = [capped(s, calls) for s in rollout.specs]
    rollout.spec_by_name = {s.name: s for s in rollout.specs}
    rows: list[dict] = []
    play = trainer.rollout_func

    def recorded(prompts, trainer):
        out = play(prompts, trainer)
        rows.append(out)
        return out

    trainer.rollout_func = recorded
    trainer.train()
    seconds = time.perf_counter() - started

    from harnessrl.store import RunStore
    from harnessrl.train.episode_sequence import episode_sequence

    episodes = {t.episode_id: t for t in RunStore(Path(args.out) / "harnessrl" / "rollouts").trajectories()}
    print(f"{len(rows)} step(s), {sum(len(r['harnessrl_episode']) for r in rows)} episodes in {seconds:.0f} s")
    for out in rows:
        for episode_id, mask in zip(out["harnessrl_episode"], out["env_mask"]):
            t = episodes[episode_id]
            made = sum(1 for s in t.steps if s.model_call is not None and s.model_call.completion_ids)
            seq = episode_sequence(t) if not t.is_infra_error else None
            counts = t.meta.get("sampled_turns")
            print(
                f"{t.harness:>14} {t.task_id}: {made} model calls, {model_runs(mask)} in the trained row"
                f" (turns kept {seq.turns_kept if seq else 0}/{seq.turns if seq else 0}), {t.termination.value},"
                f" score {t.grade.score if t.grade else None}" + (f", sampled_turns {counts}" if counts else "")
            )


if __name__ == "__main__":
    main()
