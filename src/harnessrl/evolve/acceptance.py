"""Noise-aware acceptance: a candidate is kept only if it beats the incumbent by more than noise,
twice.

Noise. Before searching, the seed harness runs twice on the same dev tasks (R rollouts per task
each time, two independent sampling streams). With per-task mean scores a_t and b_t over T tasks
and d_t = a_t - b_t:

    between runs      sd(d) / sqrt(T)                  SD of the paired difference of two dev means
                                                       of equally good harnesses, seen between runs
    within tasks      sqrt(sum_t s_t^2 (1/n_a + 1/n_b)) / T
                                                       the same SD from the spread of each task's
                                                       2R episode scores (s_t^2, n_a + n_b episodes)
    sd_paired_diff    max(between runs, within tasks)
    sd_dev_mean       sd_paired_diff / sqrt(2)         SD of one dev mean under rollout noise
    threshold         max(THRESHOLD_MULTIPLE * sd_paired_diff, floor)

Both estimates measure the same quantity; the within-task one uses T(2R - 1) degrees of freedom
instead of T - 1, so it is far steadier, and the larger of the two is kept so that run-level
effects the between-run estimate sees are not lost. A threshold set from an estimate that came out
low by chance is what let most false acceptances through (simulate.py). The loop's floor is at
least one episode's worth of score, 1/(T R): a degenerate estimate (every episode of every task
scored the same twice) never means a threshold of 0. When the seed scored 0 in every episode (or 1
in every one) the floor is higher (`unseen_rate_floor`): a rate too small to show in 2TR episodes
can still be up to about 3/(2TR), and the threshold is the noise such a rate would make.

THRESHOLD_MULTIPLE = 2: a harness no better than the incumbent clears it by chance about 2-3 %
of the time per comparison (one-sided normal tail beyond 2 SD).

Acceptance, in two stages. Screening: a candidate is compared with the incumbent RE-MEASURED in
the same iteration, on the same dev tasks and attempt indices with the same sampling seed, task
by task: delta = mean_t (cand_t - inc_t), CI by bootstrap over tasks. Confirmation: every
candidate whose delta beats the threshold is measured again on fresh samples (a new sampling
stream) against a fresh re-measure of the incumbent, and only one that beats the threshold again
can become the incumbent (the best confirmation delta wins). Over 20 iterations x 2 candidates a
single stage accepts a useless edit in most runs; two stages multiply the per-candidate chances
(about 0.02^2); with the steadier noise estimate this keeps the family-wise rate of a whole search
under 2 % in simulation (simulate.py; the figures are in docs/evolve.md). Re-measuring matters:
the incumbent was itself chosen because it scored high once, and that score regresses towards its
true mean; the confirmation delta is also free of the selection that picked the screening winner.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from math import fsum

from pydantic import BaseModel, ConfigDict

from harnessrl.metrics import paired_difference

THRESHOLD_MULTIPLE = 2.0


@dataclass
class NoiseEstimate:
    n_tasks: int
    mean_a: float
    mean_b: float
    sd_task_difference: float  # sample SD of d_t over tasks
    sd_paired_difference_between_runs: float  # sd_task_difference / sqrt(T)
    sd_paired_difference_within_tasks: float | None  # from the episode scores; None without them
    sd_paired_difference: float  # the larger of the two: what the threshold uses
    sd_dev_mean: float

    @property
    def degenerate(self) -> bool:
        """No spread seen at all (greedy decoding, or tasks that fail the same way every time)."""
        return self.sd_paired_difference == 0

    def to_json(self) -> dict:
        return asdict(self) | {"degenerate": self.degenerate}


def estimate_noise(
    scores_a: dict[str, float],
    scores_b: dict[str, float],
    episodes_a: dict[str, list[float]] | None = None,
    episodes_b: dict[str, list[float]] | None = None,
) -> NoiseEstimate:
    """Noise of the dev mean from two runs of the same harness: per-task mean scores, and when
    given, every episode's score per task (for the within-task estimate)."""
    shared = sorted(set(scores_a) & set(scores_b))
    if len(shared) < 2:
        raise ValueError(f"the noise estimate needs at least 2 tasks scored in both runs, got {len(shared)}")
    diffs = [scores_a[t] - scores_b[t] for t in shared]
    mean_d = fsum(diffs) / len(diffs)
    sd_d = math.sqrt(fsum((d - mean_d) ** 2 for d in diffs) / (len(diffs) - 1))
    n = len(shared)
    between = sd_d / math.sqrt(n)
    within = None
    if episodes_a is not None and episodes_b is not None:
        within = _within_tasks(shared, episodes_a, episodes_b)
    sd_paired = max(between, within or 0.0)
    return NoiseEstimate(
        n_tasks=n,
        mean_a=fsum(scores_a[t] for t in shared) / n,
        mean_b=fsum(scores_b[t] for t in shared) / n,
        sd_task_difference=sd_d,
        sd_paired_difference_between_runs=between,
        sd_paired_difference_within_tasks=within,
        sd_paired_difference=sd_paired,
        sd_dev_mean=sd_paired / math.sqrt(2),
    )


def _within_tasks(tasks: list[str], episodes_a: dict[str, list[float]], episodes_b: dict[str, list[float]]) -> float:
    """sqrt(sum_t s_t^2 (1/n_a + 1/n_b)) / T, s_t^2 the sample variance of task t's episode scores
    of both runs together (a shift between the runs counts as spread: the cautious side)."""
    total = 0.0
    for t in tasks:
        a, b = episodes_a.get(t) or [], episodes_b.get(t) or []
        if not a or not b:
            raise ValueError(f"task {t} has a mean score but no episode scores in one of the runs")
        both = a + b
        mean = fsum(both) / len(both)
        var = fsum((x - mean) ** 2 for x in both) / (len(both) - 1)
        total += var * (1 / len(a) + 1 / len(b))
    return math.sqrt(total) / len(tasks)


def score_resolution(n_tasks: int, rollouts: int) -> float:
    """One episode's worth of score in a dev mean: 1/(T R). The smallest threshold the loop uses."""
    if n_tasks < 1 or rollouts < 1:
        raise ValueError("the score resolution needs at least one task and one rollout")
    return 1.0 / (n_tasks * rollouts)


def unseen_rate_floor(noise: NoiseEstimate, n_episodes: int, multiple: float = THRESHOLD_MULTIPLE) -> float:
    """A floor for a seed that scored 0 (or 1) in every one of the noise runs' `n_episodes`
    episodes, 0 otherwise.

    Spread that was not seen is not spread that is absent: a harness that passes 1 % of the time
    most likely passes none of 192 episodes. With 0 successes in N episodes the rate may still
    be up to about 3/N (the "rule of three", a one-sided 95 % bound), and at that rate the paired
    difference of two dev means of N/2 episodes each has SD sqrt(2 p (1 - p) / (N / 2)). The floor
    is `multiple` times that SD (all 1s: the same with 1 - p). Greedy decoding with mixed scores
    is degenerate too but not at an extreme: its spread really is 0, and this floor stays 0.
    """
    if n_episodes < 2:
        raise ValueError("the floor needs the episode count of both noise runs (at least 2)")
    if not noise.degenerate or 0.0 < noise.mean_a < 1.0 or noise.mean_a != noise.mean_b:
        return 0.0
    p = min(0.5, 3.0 / n_episodes)
    return multiple * math.sqrt(2.0 * p * (1.0 - p) / (n_episodes / 2.0))


def acceptance_threshold(noise: NoiseEstimate, multiple: float = THRESHOLD_MULTIPLE, floor: float = 0.0) -> float:
    """The improvement a candidate must exceed: `multiple` SDs of a paired difference, at least `floor`."""
    if multiple < 0 or floor < 0:
        raise ValueError("the threshold multiple and floor must be >= 0")
    return max(multiple * noise.sd_paired_difference, floor)


def paired_delta(incumbent: dict[str, float], candidate: dict[str, float]) -> float | None:
    """Mean over the shared tasks of candidate minus incumbent; None with no shared task."""
    shared = sorted(set(incumbent) & set(candidate))
    if not shared:
        return None
    return fsum(candidate[t] - incumbent[t] for t in shared) / len(shared)


def beats(delta: float | None, threshold: float) -> bool:
    return delta is not None and delta > threshold


class Comparison(BaseModel):
    """A candidate against the incumbent over their shared tasks (`compare`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    delta: float | None  # mean score difference, candidate - incumbent; None without a shared task
    delta_ci95: list[float] | None  # its 95% bootstrap interval
    n_tasks: int  # the shared tasks
    threshold: float
    accepted: bool  # the delta beats the threshold


def compare(incumbent: dict[str, float], candidate: dict[str, float], threshold: float, seed: int = 0) -> Comparison:
    """Paired comparison over the shared tasks; `accepted` iff the mean improvement > threshold."""
    diff = paired_difference(incumbent, candidate, seed=seed)
    delta = diff.mean_difference
    return Comparison(
        delta=delta,
        delta_ci95=diff.ci95,
        n_tasks=diff.n_tasks,
        threshold=threshold,
        accepted=beats(delta, threshold),
    )


def screening_winners(deltas: dict[str, float | None], threshold: float) -> list[str]:
    """Candidates whose screening delta beats the threshold, largest delta first (ties: label order):
    the ones to confirm."""
    winners = {k: d for k, d in deltas.items() if d is not None and beats(d, threshold)}
    return sorted(winners, key=lambda k: (-winners[k], k))


def confirmed_choice(deltas: dict[str, float | None], threshold: float) -> str | None:
    """Of the confirmation deltas, the candidate to accept: the largest that beats the threshold
    again, or None."""
    winners = screening_winners(deltas, threshold)
    return winners[0] if winners else None
