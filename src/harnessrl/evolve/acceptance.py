"""Noise-aware acceptance: a candidate is kept only if it beats the incumbent by more than noise.

Noise. Before searching, the seed harness runs twice on the same dev tasks (R rollouts per task
each time). With per-task mean scores a_t and b_t over T tasks and d_t = a_t - b_t:

    sd_dev_mean       = sd(d) / sqrt(2 T)     SD of one dev mean under rollout noise
                                             (Var(mean a - mean b) = Var(d) / T = 2 sd_dev_mean^2)
    sd_paired_diff    = sqrt(2) sd_dev_mean   SD of the difference of two dev means of two
                      = sd(d) / sqrt(T)       harnesses that are in truth equally good
    threshold         = max(THRESHOLD_MULTIPLE * sd_paired_diff, floor)

THRESHOLD_MULTIPLE = 2: a harness no better than the incumbent clears it by chance about 2-3 %
of the time per candidate (one-sided normal tail beyond 2 SD). The published rule of thumb (with
4 rollouts a difference of about 0.035 was real) is what this gives for sd_paired_diff ~ 0.018.

Acceptance. A candidate is compared with the incumbent RE-MEASURED in the same iteration, on the
same dev tasks and attempt indices with the same sampling seed, task by task:
delta = mean_t (cand_t - inc_t), CI by bootstrap over tasks; accepted iff delta > threshold.
Re-measuring matters: the incumbent was itself chosen because it scored high once, and that
score regresses towards its true mean.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from math import fsum

from harnessrl.metrics import paired_difference

THRESHOLD_MULTIPLE = 2.0


@dataclass
class NoiseEstimate:
    n_tasks: int
    mean_a: float
    mean_b: float
    sd_task_difference: float  # sample SD of d_t over tasks
    sd_dev_mean: float
    sd_paired_difference: float

    def to_json(self) -> dict:
        return asdict(self)


def estimate_noise(scores_a: dict[str, float], scores_b: dict[str, float]) -> NoiseEstimate:
    """Noise of the dev mean from two runs of the same harness (per-task mean scores)."""
    shared = sorted(set(scores_a) & set(scores_b))
    if len(shared) < 2:
        raise ValueError(f"the noise estimate needs at least 2 tasks scored in both runs, got {len(shared)}")
    diffs = [scores_a[t] - scores_b[t] for t in shared]
    mean_d = fsum(diffs) / len(diffs)
    sd_d = math.sqrt(fsum((d - mean_d) ** 2 for d in diffs) / (len(diffs) - 1))
    n = len(shared)
    return NoiseEstimate(
        n_tasks=n,
        mean_a=fsum(scores_a[t] for t in shared) / n,
        mean_b=fsum(scores_b[t] for t in shared) / n,
        sd_task_difference=sd_d,
        sd_dev_mean=sd_d / math.sqrt(2 * n),
        sd_paired_difference=sd_d / math.sqrt(n),
    )


def acceptance_threshold(noise: NoiseEstimate, multiple: float = THRESHOLD_MULTIPLE, floor: float = 0.0) -> float:
    """The improvement a candidate must exceed: `multiple` SDs of a paired difference, at least `floor`."""
    if multiple < 0 or floor < 0:
        raise ValueError("the threshold multiple and floor must be >= 0")
    return max(multiple * noise.sd_paired_difference, floor)


def compare(incumbent: dict[str, float], candidate: dict[str, float], threshold: float, seed: int = 0) -> dict:
    """Paired comparison over the shared tasks; `accepted` iff the mean improvement > threshold."""
    diff = paired_difference(incumbent, candidate, seed=seed)
    delta = diff["mean_difference"]
    return {
        "delta": delta,
        "delta_ci95": diff["ci95"],
        "n_tasks": diff["n_tasks"],
        "threshold": threshold,
        "accepted": delta is not None and delta > threshold,
    }
