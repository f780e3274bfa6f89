"""The harness phase: the seed harness on dev tasks, then `harnessrl evolve` from it while its
accepted edits keep lowering the process-failure rate, stopped at the first ceiling that fires."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.improve.config import ImproveError
from harnessrl.improve.record import Cell, ImproveState, decide, release, running

if TYPE_CHECKING:
    from harnessrl.harness.spec import HarnessSpec


def process_rate(trajectories: list) -> float | None:
    """The share of valid episodes (no infrastructure error) whose first failure signal is a
    process class; None without a valid episode."""
    from harnessrl.triage import PROCESS, first_failure_signal

    valid = [t for t in trajectories if not t.is_infra_error]
    if not valid:
        return None
    hits = 0
    for t in valid:
        v = first_failure_signal(t)
        hits += v is not None and v.cls in PROCESS
    return hits / len(valid)


@dataclass(frozen=True)
class EvolvedHarness:
    """What the harness phase produced: the evolved harness (given, the seed, or the evolution's
    result) and whether it does exactly what the seed does (then it is the seed spec itself)."""

    spec: HarnessSpec
    is_seed: bool


def harness_phase(state: ImproveState, base: Cell) -> EvolvedHarness:
    """The evolved harness: given, the seed (no evolution needed), or the evolution's result where
    its first ceiling fired; `base` is the seed harness on the dev tasks (harness/seed-dev).
    Writes OUT/harness/evolved.yaml (once)."""
    from harnessrl.evolve.edits import spec_fingerprint

    c = state.config
    rate = base.record["triage"]["process_rate"]  # = process_rate of its episodes
    if rate is None:
        raise ImproveError(
            "harness/seed-dev: every episode of the seed harness is an infrastructure error, so nothing can be "
            f"triaged; see {state.out / 'harness' / 'seed-dev'} (harnessrl summary / view), fix the set-up and "
            "start a new --out"
        )
    evidence = {
        "seed_dev": base.record,
        "process_rate": rate,
        "process_floor": c.process_floor,
        "folder": "harness/seed-dev",
    }
    if state.given is not None:
        decide(state, "harness.evolve", "harness", "given", {**evidence, "evolved": c.evolved})
        evolved = state.given
    elif rate < c.process_floor:
        decide(state, "harness.evolve", "harness", "skip", evidence)
        evolved = state.seed_spec
    else:
        decide(state, "harness.evolve", "harness", "evolve", evidence)
        evolved = _evolve(state, rate)
    path = state.out / "harness" / "evolved.yaml"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(evolved.to_yaml(), encoding="utf-8")
    if spec_fingerprint(evolved) == spec_fingerprint(state.seed_spec):
        return EvolvedHarness(spec=state.seed_spec, is_seed=True)
    return EvolvedHarness(spec=evolved, is_seed=False)


def _evolve(state: ImproveState, seed_rate: float) -> HarnessSpec:
    """`run_evolve` from the seed, its `stop_when` asking after every iteration which ceiling
    fires (`_ceiling`); the search ends at the first, its held-out phase runs at that iteration."""
    from harnessrl.evolve.config import evolution_of

    path = state.out / "harness" / "evolve"
    release(state)  # evolution loads its own copy of the model
    final, spec = running(state).evolved(
        "harness/evolve",
        evolution_of(state.config, state.dtype),
        log=lambda message: state.log(f"evolve: {message}"),
        stop_when=lambda done: _ceiling(state, path, done, seed_rate)[0],
    )
    done = int(final["iterations_run"])
    which, trail = _ceiling(state, path, done, seed_rate)
    if which is None:
        which = "proposer_exhausted" if final.get("proposer_exhausted") else "budget"
    decide(
        state,
        "harness.ceiling",
        "harness",
        which,
        {
            "iteration": done,
            "iterations_budget": state.config.iterations,
            "patience": state.config.patience,
            "process_floor": state.config.process_floor,
            "iterations": trail,
            "accepted_edits": final["accepted_edits"],
            "best": final["best"],
            "best_diff_vs_seed": final["best_diff_vs_seed"],
            "threshold": final["threshold"],
            "held_out_not_used": final["paired_difference"],
            "folder": "harness/evolve",
        },
    )
    return spec


def _ceiling(state: ImproveState, path: Path, upto: int, seed_rate: float) -> tuple[str | None, list[dict[str, Any]]]:
    """Which ceiling fires after iteration `upto` of the evolution in `path` (None: go on), and
    every iteration's evidence: accepted or not, the process-failure rate of the incumbent's
    dev episodes before and of the new incumbent's after (its screening and confirmation runs).
    Fires: no_process_gain (an accepted edit did not lower the rate), process_floor (the rate
    is below --process-floor), patience (--patience iterations in a row accepted nothing)."""
    from harnessrl.evolve.loop import LOG
    from harnessrl.store import RunStore

    c = state.config
    lines = [json.loads(x) for x in (path / LOG).read_text(encoding="utf-8").splitlines() if x.strip()]
    trail: list[dict[str, Any]] = []
    rate: float | None = seed_rate
    streak = 0
    with RunStore(path) as store:

        def rate_of(*labels: str) -> float | None:
            return process_rate([t for label in labels for t in store.trajectories(harness=label, with_tokens=False)])

        for it in range(1, upto + 1):
            accepted = [x["candidate"] for x in lines if x["iteration"] == it and x.get("accepted")]
            before = rate_of(f"i{it:02d}.incumbent", f"i{it:02d}.incumbent.confirm")
            entry: dict[str, Any] = {"iteration": it, "accepted": accepted[0] if accepted else None}
            entry["process_rate_before"] = before
            fired = None
            if accepted:
                streak = 0
                after = rate_of(accepted[0], f"{accepted[0]}.confirm")
                entry["process_rate_after"] = after
                reference = before if before is not None else rate
                if after is None or (reference is not None and after >= reference):
                    fired = "no_process_gain"
                elif after < c.process_floor:
                    fired = "process_floor"
                rate = after
            else:
                streak += 1
                if streak >= c.patience:
                    fired = "patience"
            entry["fired"] = fired
            trail.append(entry)
            if fired is not None:
                return fired, trail
    return None, trail
