"""Estimators and confidence intervals for harness evaluations.

Everything is computed per task first and then averaged over tasks, so a task run five times
weighs as much as a task run once. Infrastructure errors (`Termination.error`) are not the
agent's fault: they are left out of every denominator and only counted.

Formulas (n = valid attempts of a task, c = how many of them passed, k = attempts drawn):

    pass@k = 1 - C(n - c, k) / C(n, k)      at least one of k attempts passes
    pass^k = C(c, k) / C(n, k)              all k attempts pass (tau-bench)

Both are unbiased estimators of the probabilities for k attempts drawn without replacement
from the n that were run. See docs/metrics.md for a worked example.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb, fsum
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from harnessrl.types import Trajectory


def _check_counts(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0:
        raise ValueError(f"n and c must be non-negative, got n={n}, c={c}")
    if c > n:
        raise ValueError(f"c={c} passed attempts cannot exceed n={n} attempts")
    if k < 1:
        raise ValueError(f"k must be at least 1, got k={k}")
    if k > n:
        raise ValueError(f"k={k} exceeds the n={n} attempts available")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k attempts passes.

        pass@k = 1 - C(n - c, k) / C(n, k)

    (Chen et al. 2021, unbiased for k attempts drawn without replacement from n run, c passed.)
    When n - c < k every draw of k attempts contains a pass, so the value is exactly 1.0.
    """
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    total = comb(n, k)
    # Integer numerator and denominator: Python's int / int is correctly rounded.
    return (total - comb(n - c, k)) / total


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Chance that all of k attempts pass (tau-bench's pass^k).

        pass^k = C(c, k) / C(n, k)

    Unbiased for k attempts drawn without replacement from n run, c passed; 0.0 when c < k.
    """
    _check_counts(n, c, k)
    return comb(c, k) / comb(n, k)


def bootstrap_ci(
    values: list[float], n_resamples: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean.

        resample b = 1..B: mean_b = mean(values[i_1..i_m]),  i_j ~ Uniform{1..m} with replacement
        CI = (quantile(mean_*, alpha/2), quantile(mean_*, 1 - alpha/2))

    Deterministic for a given seed. One value gives (v, v); no values raise ValueError.
    """
    if len(values) == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be at least 1, got {n_resamples}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    data = np.asarray(values, dtype=np.float64)
    if data.size == 1:
        v = float(data[0])
        return (v, v)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(n_resamples, data.size))
    means = data[idx].mean(axis=1)
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return (float(lo), float(hi))


def _episode_score(t: Trajectory) -> float:
    # A valid episode that was never graded (e.g. it ran out of steps) earned nothing.
    return t.grade.score if t.grade is not None else 0.0


def _episode_passed(t: Trajectory) -> bool:
    return t.grade is not None and t.grade.passed


def _valid_by_task(trajectories: list[Trajectory]) -> dict[str, list[Trajectory]]:
    """Valid (non infra-error) episodes grouped by task id, task ids sorted."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if not t.is_infra_error:
            groups[t.task_id].append(t)
    return {task: groups[task] for task in sorted(groups)}


def task_scores(trajectories: list[Trajectory]) -> dict[str, float]:
    """Mean episode score of each task, infra errors left out.

        score(task) = (1/n) * sum_i score_i     over the task's n valid episodes

    Tasks whose every episode was an infra error have no score and are absent.
    This is the input `paired_difference` expects.
    """
    return {task: fsum(_episode_score(t) for t in eps) / len(eps) for task, eps in _valid_by_task(trajectories).items()}


def episode_delivered(t: Trajectory) -> bool:
    """Submitted an answer, and the grader did not mark it undelivered (`delivered` sub-score 0)."""
    return t.submitted and not (t.grade is not None and t.grade.subscores.get("delivered") == 0.0)


class HarnessSummary(BaseModel):
    """Headline numbers for one harness on one set of tasks (see `harness_summary` for the formulas).

    The fields, in this order, are the keys of one harness's entry in summary.json (`model_dump`).
    Rates are None when nothing could be measured; `pass_at_k`, `pass_hat_k` and `k_notes` are
    keyed by k as a string ("1", "2", ...), the way JSON keys are.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_tasks: int = 0
    attempts: int
    mean_score: float | None = None
    mean_score_ci95: list[float] | None = None  # [lo, hi]
    pass_at_k: dict[str, float | None]
    pass_hat_k: dict[str, float | None]
    delivery_rate: float | None = None
    mean_subscores: dict[str, float] = Field(default_factory=dict)
    n_episodes: int = 0
    n_infra_errors: int = 0
    k_notes: dict[str, str] = Field(default_factory=dict)  # why a k is refused (its rates are None)
    # where the model calls' time went (`model_time`): part -> {sum, mean_per_episode, n_episodes}
    model_time_s: dict[str, dict[str, Any]] = Field(default_factory=dict)


TIME_PARTS = ("queue", "prefill", "decode", "latency")


def episode_model_time(t: Trajectory) -> dict[str, float | None]:
    """Seconds one episode's model calls spent in each part (ModelCall.queue_s, prefill_s,
    decode_s, latency_s, summed over its calls); None for a part no call of it measured (the
    openai: backend measures latency only; records written before timings measure nothing)."""
    out: dict[str, float | None] = {}
    for part in TIME_PARTS:
        values = [v for s in t.steps if (v := getattr(s.model_call, f"{part}_s")) is not None]
        out[part] = fsum(values) if values else None
    return out


def model_time(trajectories: list[Trajectory]) -> dict[str, dict[str, Any]]:
    """Per part (queue, prefill, decode, latency), over the valid episodes that measured it:

        sum              = sum_episodes sum_calls <part>_s
        mean_per_episode = sum / n_episodes
        n_episodes       = episodes with at least one call that measured the part

    sum and mean_per_episode are None when no episode measured it. Infra errors are left out,
    as from every other number of the summary.
    """
    per_episode = [episode_model_time(t) for t in trajectories if not t.is_infra_error]
    out: dict[str, dict[str, Any]] = {}
    for part in TIME_PARTS:
        values = [v for e in per_episode if (v := e[part]) is not None]
        total = fsum(values) if values else None
        out[part] = {
            "sum": total,
            "mean_per_episode": None if total is None else total / len(values),
            "n_episodes": len(values),
        }
    return out


def harness_summary(trajectories: list[Trajectory], attempts: int) -> HarnessSummary:
    """Headline numbers for one harness on one set of tasks.

            mean_score     = (1/T) * sum_tasks score(task)          (see `task_scores`)
            mean_score_ci95 = bootstrap_ci over the T per-task scores
            pass_at_k[k]   = (1/T) * sum_tasks pass_at_k(n_t, c_t, k)
            pass_hat_k[k]  = (1/T) * sum_tasks pass_hat_k(n_t, c_t, k)
            delivery_rate  = (# valid episodes delivered) / (# valid episodes)
            model_time_s   = seconds of model calls per part, summed and per episode (`model_time`)
            mean_subscores[name] = mean of grade.subscores[name] over valid graded episodes, for the
                             sub-score names every such episode has (e.g. planning's commonsense
                             and personalised scores)

    An episode is *delivered* when it submitted an answer, unless its grader says otherwise with a
    `delivered` sub-score of 0 (a planning answer in prose with no itinerary in it, say).

        n_t is task t's number of valid attempts and c_t how many passed (grade.passed).
        Episodes with termination == error are excluded from every denominator and only counted
        in n_infra_errors; T (n_tasks) counts tasks with at least one valid episode.
        A k is refused (value None, reason in k_notes[k]) when any task has fewer than k valid
        attempts: averaging only the tasks that have enough would bias the estimate.
        With no valid episode at all, every rate is None.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    harnesses = {t.harness for t in trajectories}
    if len(harnesses) > 1:
        raise ValueError(f"a harness summary got several harnesses: {sorted(harnesses)}")

    ks = range(1, attempts + 1)
    n_infra = sum(1 for t in trajectories if t.is_infra_error)
    by_task = _valid_by_task(trajectories)
    n_episodes = sum(len(eps) for eps in by_task.values())

    if n_episodes == 0:
        reason = f"no valid episodes ({n_infra} infrastructure errors)"
        keys = [str(k) for k in ks]
        return HarnessSummary(
            attempts=attempts,
            pass_at_k=dict.fromkeys(keys),
            pass_hat_k=dict.fromkeys(keys),
            n_infra_errors=n_infra,
            k_notes=dict.fromkeys(keys, reason),
            model_time_s=model_time(trajectories),
        )

    scores = list(task_scores(trajectories).values())
    lo, hi = bootstrap_ci(scores)
    counts = [(len(eps), sum(_episode_passed(t) for t in eps)) for eps in by_task.values()]
    n_tasks = len(counts)

    at_k: dict[str, float | None] = {}
    hat_k: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for k in ks:
        short = sum(1 for n, _ in counts if n < k)
        if short:
            verb = "has" if short == 1 else "have"
            notes[str(k)] = f"{short} of {n_tasks} tasks {verb} fewer than {k} valid attempts"
            at_k[str(k)] = hat_k[str(k)] = None
            continue
        at_k[str(k)] = fsum(pass_at_k(n, c, k) for n, c in counts) / n_tasks
        hat_k[str(k)] = fsum(pass_hat_k(n, c, k) for n, c in counts) / n_tasks

    valid = [t for eps in by_task.values() for t in eps]
    delivered = sum(1 for t in valid if episode_delivered(t))
    graded = [t.grade.subscores for t in valid if t.grade is not None]
    shared = set.intersection(*(set(g) for g in graded)) if graded else set()
    return HarnessSummary(
        n_tasks=n_tasks,
        attempts=attempts,
        mean_score=fsum(scores) / n_tasks,
        mean_score_ci95=[lo, hi],
        pass_at_k=at_k,
        pass_hat_k=hat_k,
        delivery_rate=delivered / n_episodes,
        mean_subscores={name: fsum(g[name] for g in graded) / len(graded) for name in sorted(shared)},
        n_episodes=n_episodes,
        n_infra_errors=n_infra,
        k_notes=notes,
        model_time_s=model_time(trajectories),
    )


class PairedDifference(BaseModel):
    """A paired comparison of two sides (a, b) over the tasks both were scored on
    (`paired_difference`); its `model_dump` is what the JSON files hold."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mean_difference: float | None  # b - a, averaged over the shared tasks; None without one
    ci95: list[float] | None  # [lo, hi] of the bootstrap interval; None without a shared task
    n_tasks: int  # the shared tasks
    n_only_a: int  # tasks left out because only a has them
    n_only_b: int  # ... only b


def paired_difference(scores_a: dict[str, float], scores_b: dict[str, float], seed: int = 0) -> PairedDifference:
    """Paired comparison of two harnesses over the tasks both were scored on.

        d_t = score_b(t) - score_a(t)        for t in tasks(a) & tasks(b)
        mean_difference = (1/T) * sum_t d_t  (positive: b is better)
        ci95 = bootstrap_ci over the d_t     (pairing removes task difficulty from the noise)

    Returns mean_difference, ci95 ([lo, hi]), n_tasks, and n_only_a / n_only_b (tasks left out
    because only one side has them). With no shared task, mean_difference and ci95 are None.
    """
    shared = sorted(set(scores_a) & set(scores_b))
    mean, ci = None, None
    if shared:
        diffs = [scores_b[t] - scores_a[t] for t in shared]
        lo, hi = bootstrap_ci(diffs, seed=seed)
        mean, ci = fsum(diffs) / len(diffs), [lo, hi]
    return PairedDifference(
        mean_difference=mean,
        ci95=ci,
        n_tasks=len(shared),
        n_only_a=len(set(scores_a) - set(scores_b)),
        n_only_b=len(set(scores_b) - set(scores_a)),
    )
