"""How often the evolve loop's acceptance rule keeps an edit that does nothing, by simulation.

    python -m harnessrl.evolve.simulate --dev-tasks 48 --rollouts 4 --iterations 20 --candidates 2

The simulated agent: each dev task t has a success probability p_t ~ Beta(0.5, 0.5) (most tasks
nearly always or nearly never solved, as in agent benchmarks), drawn once per simulated search;
an episode scores 1 with probability p_t, else 0. Every candidate is exactly as good as the seed
(no edit has any effect), and every measurement samples afresh (no common random numbers between
the arms of an iteration; in the loop that pairing only lowers the spread of a delta, so the
simulation is on the cautious side). A search makes the loop's measurements in the loop's order
(noise.a, noise.b, then per iteration the incumbent, the candidates and, for screening winners,
the confirmation runs) and decides with the functions of acceptance.py. The family-wise false
acceptance rate is the share of searches that accept at least one edit.

`--effect D` adds, in iteration 1, a candidate that is truly better (p_t + D, capped at 1) and
reports how often it is accepted there: the price of a rule in power.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from harnessrl.evolve.acceptance import (
    THRESHOLD_MULTIPLE,
    acceptance_threshold,
    confirmed_choice,
    estimate_noise,
    paired_delta,
    score_resolution,
    screening_winners,
)


@dataclass(frozen=True)
class Rule:
    """An acceptance rule. `loop` is the one harnessrl evolve uses."""

    name: str
    confirm: bool  # screening winners are re-measured and must beat the threshold again
    within_tasks: bool  # the noise SD is max(between runs, within tasks), not between runs only
    resolution_floor: bool  # the threshold is at least 1/(T R)
    sidak_alpha: float | None = None  # the multiple is the one-sided normal quantile of Sidak(alpha, N K)

    def multiple(self, iterations: int, candidates: int) -> float:
        if self.sidak_alpha is None:
            return THRESHOLD_MULTIPLE
        per_comparison = 1 - (1 - self.sidak_alpha) ** (1 / (iterations * candidates))
        return NormalDist().inv_cdf(1 - per_comparison)


RULES = {
    "single": Rule("single", confirm=False, within_tasks=False, resolution_floor=False),
    "sidak": Rule("sidak", confirm=False, within_tasks=False, resolution_floor=False, sidak_alpha=0.05),
    "confirm-between": Rule("confirm-between", confirm=True, within_tasks=False, resolution_floor=True),
    "loop": Rule("loop", confirm=True, within_tasks=True, resolution_floor=True),
}


def _label(i: int) -> str:
    """Task and candidate labels, as the loop's: strings (zero-padded, so they sort as the numbers do)."""
    return f"{i:06d}"


def _measure(rng: np.random.Generator, p: np.ndarray, rollouts: int) -> tuple[dict[str, float], np.ndarray]:
    """Per-task mean scores (as the loop's Measurement.scores) and the episode scores (tasks x rollouts)."""
    episodes = (rng.random((p.size, rollouts)) < p[:, None]).astype(float)
    return {_label(i): m for i, m in enumerate(episodes.mean(axis=1).tolist())}, episodes


def _per_task(episodes: np.ndarray) -> dict[str, list[float]]:
    return {_label(i): row for i, row in enumerate(episodes.tolist())}


def simulate_search(
    rule: Rule, dev_tasks: int, rollouts: int, iterations: int, candidates: int, seed: int, effect: float = 0.0
) -> bool:
    """One simulated search; True when it accepted an edit (with effect 0: a false acceptance;
    with effect > 0: only iteration 1 runs, and True means the better candidate was accepted)."""
    rng = np.random.default_rng(seed)
    p = rng.beta(0.5, 0.5, dev_tasks)
    (a, ea), (b, eb) = _measure(rng, p, rollouts), _measure(rng, p, rollouts)
    noise = estimate_noise(a, b, _per_task(ea), _per_task(eb)) if rule.within_tasks else estimate_noise(a, b)
    floor = score_resolution(dev_tasks, rollouts) if rule.resolution_floor else 0.0
    threshold = acceptance_threshold(noise, rule.multiple(iterations, candidates), floor)
    arms = [np.minimum(1.0, p + effect) if (effect and k == 0) else p for k in range(candidates)]
    for _ in range(1 if effect else iterations):
        incumbent, _ = _measure(rng, p, rollouts)
        deltas = {_label(k): paired_delta(incumbent, _measure(rng, arm, rollouts)[0]) for k, arm in enumerate(arms)}
        winners = screening_winners(deltas, threshold)
        if not winners:
            continue
        if not rule.confirm:
            return not effect or winners[0] == _label(0)
        fresh, _ = _measure(rng, p, rollouts)
        again = {k: paired_delta(fresh, _measure(rng, arms[int(k)], rollouts)[0]) for k in winners}
        choice = confirmed_choice(again, threshold)
        if choice is not None:
            return not effect or choice == _label(0)
    return False


def acceptance_rate(
    rule: Rule | str,
    dev_tasks: int,
    rollouts: int,
    iterations: int,
    candidates: int,
    runs: int,
    seed: int = 0,
    effect: float = 0.0,
) -> float:
    """Share of `runs` simulated searches (seeds seed..seed+runs-1) that accepted an edit."""
    rule = RULES[rule] if isinstance(rule, str) else rule
    if runs < 1:
        raise ValueError("runs must be >= 1")
    shape = (dev_tasks, rollouts, iterations, candidates)
    hits = sum(simulate_search(rule, *shape, seed + i, effect) for i in range(runs))
    return hits / runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dev-tasks", type=int, default=48)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2000, help="simulated searches per rule")
    parser.add_argument("--effect", type=float, default=0.1, help="true gain of the better candidate (power)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shape = (args.dev_tasks, args.rollouts, args.iterations, args.candidates)
    print(
        f"{args.dev_tasks} dev tasks x {args.rollouts} rollouts, {args.iterations} iterations x "
        f"{args.candidates} candidates, {args.runs} searches per rule"
    )
    p = np.random.default_rng(args.seed).beta(0.5, 0.5, 100_000)
    gain = float(np.mean(np.minimum(1.0, p + args.effect) - p))
    print(f"better candidate: p_t + {args.effect:.2f} capped at 1, a true dev-mean gain of {gain:.3f}")
    print("| rule | searches accepting a useless edit | better candidate accepted in its iteration |")
    print("| --- | ---: | ---: |")
    for rule in RULES.values():
        null = acceptance_rate(rule, *shape, args.runs, args.seed)
        power = acceptance_rate(rule, *shape, args.runs, args.seed, effect=args.effect)
        print(f"| {rule.name} | {null:.1%} | {power:.1%} |")


if __name__ == "__main__":
    main()
