"""Metric values checked against numbers computed by hand."""

from __future__ import annotations

import json
import math

import pydantic
import pytest

from harnessrl.metrics import (
    HarnessSummary,
    bootstrap_ci,
    harness_summary,
    paired_difference,
    pass_at_k,
    pass_hat_k,
    task_scores,
)
from harnessrl.types import Grade, Termination, Trajectory

# ---------------------------------------------------------------- pass@k / pass^k


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 4) == 1.0  # n - c = 3 < k = 4: every draw holds a pass


def test_pass_at_k_three_of_five():
    # n - c = 3 = k: exactly one draw of 3 (the three failures) has no pass.
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_pass_at_k_extremes(k):
    assert pass_at_k(5, 0, k) == 0.0
    assert pass_at_k(5, 5, k) == 1.0


def test_pass_hat_k_hand_values():
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)  # C(2,2)/C(5,2) = 1/10
    assert pass_hat_k(4, 3, 2) == pytest.approx(0.5)  # C(3,2)/C(4,2) = 3/6
    assert pass_hat_k(5, 2, 3) == 0.0  # fewer passes than draws


@pytest.mark.parametrize("n,c", [(1, 0), (1, 1), (5, 2), (7, 7), (10, 3)])
def test_k_equal_one_is_pass_rate(n, c):
    assert pass_hat_k(n, c, 1) == pytest.approx(c / n)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_monotone_in_k(n):
    for c in range(n + 1):
        at = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        hat = [pass_hat_k(n, c, k) for k in range(1, n + 1)]
        assert all(a <= b for a, b in zip(at, at[1:]))
        assert all(a >= b for a, b in zip(hat, hat[1:]))
        assert all(h <= a for h, a in zip(hat, at))


def test_exact_for_large_n():
    # Floats of huge binomials would overflow; exact integers do not.
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5)
    assert pass_hat_k(2000, 1999, 1000) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "n,c,k",
    [(5, 2, 0), (5, 2, 6), (5, 6, 1), (-1, 0, 1), (5, -1, 1), (0, 0, 1), (5, 2, -1)],
)
def test_invalid_arguments_raise(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        pass_hat_k(n, c, k)


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_contains_mean_and_is_deterministic():
    values = [0.03, 0.91, 0.47, 0.22, 0.88, 0.05, 0.71, 0.99, 0.14, 0.52]
    mean = sum(values) / len(values)
    lo, hi = bootstrap_ci(values, seed=3)
    assert lo <= mean <= hi
    assert lo < hi
    assert bootstrap_ci(values, seed=3) == (lo, hi)
    assert bootstrap_ci(values, seed=4) != (lo, hi)


def test_bootstrap_narrows_with_more_data():
    small = [0.0, 1.0] * 5
    large = [0.0, 1.0] * 500
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert hi_l - lo_l < (hi_s - lo_s) / 3  # width shrinks like 1/sqrt(n): 10x data, ~3.2x
    assert lo_l <= 0.5 <= hi_l


def test_bootstrap_edge_cases():
    assert bootstrap_ci([0.3]) == (0.3, 0.3)
    assert bootstrap_ci([0.7, 0.7, 0.7]) == pytest.approx((0.7, 0.7))
    with pytest.raises(ValueError):
        bootstrap_ci([])


# ---------------------------------------------------------------- harness_summary


def _traj(task, attempt, score=None, passed=None, *, termination=Termination.submitted, submitted=True, harness="h"):
    grade = None if score is None else Grade(score=score, passed=passed, threshold=1.0)
    return Trajectory(
        episode_id=f"{task}-{harness}-{attempt}",
        task_id=task,
        suite="s",
        family="f",
        split="dev",
        harness=harness,
        attempt=attempt,
        instruction="x",
        termination=termination,
        submitted=submitted,
        grade=grade,
    )


def _infra(task, attempt):
    return _traj(task, attempt, termination=Termination.error, submitted=False)


def _three_tasks():
    # task a: 3 attempts, 2 pass, scores 1, 1, 0.5     -> task mean 2.5/3
    # task b: 3 attempts, 0 pass, scores 0, 0.5, ungraded (step budget, not delivered) -> 0.5/3
    # task c: 3 attempts, 3 pass, scores 1, 1, 1       -> task mean 1
    return [
        _traj("a", 0, 1.0, True),
        _traj("a", 1, 1.0, True),
        _traj("a", 2, 0.5, False),
        _traj("b", 0, 0.0, False),
        _traj("b", 1, 0.5, False),
        _traj("b", 2, termination=Termination.max_steps, submitted=False),
        _traj("c", 0, 1.0, True),
        _traj("c", 1, 1.0, True),
        _traj("c", 2, 1.0, True),
    ]


def test_summarize_hand_values():
    s = harness_summary(_three_tasks(), attempts=3)
    assert set(s.model_dump()) == {
        "n_tasks",
        "attempts",
        "mean_score",
        "mean_score_ci95",
        "pass_at_k",
        "pass_hat_k",
        "delivery_rate",
        "mean_subscores",
        "n_episodes",
        "n_infra_errors",
        "k_notes",
        "model_time_s",
    }
    assert s.n_tasks == 3
    assert s.attempts == 3
    assert s.n_episodes == 9
    assert s.n_infra_errors == 0
    assert s.mean_score == pytest.approx((2.5 / 3 + 0.5 / 3 + 1.0) / 3)
    lo, hi = s.mean_score_ci95
    assert lo <= s.mean_score <= hi
    # (n, c) per task: a (3, 2), b (3, 0), c (3, 3)
    # pass@1 = (2/3 + 0 + 1) / 3; pass@2 = (1 + 0 + 1) / 3  (a: 1 - C(1,2)/C(3,2) = 1)
    assert s.pass_at_k["1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert s.pass_at_k["2"] == pytest.approx(2 / 3)
    assert s.pass_at_k["3"] == pytest.approx(2 / 3)
    # pass^2: a C(2,2)/C(3,2) = 1/3, b 0, c 1 -> 4/9; pass^3: a 0, b 0, c 1 -> 1/3
    assert s.pass_hat_k["1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    assert s.pass_hat_k["2"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert s.pass_hat_k["3"] == pytest.approx(1 / 3)
    assert s.delivery_rate == pytest.approx(8 / 9)
    assert s.k_notes == {}


def test_summarize_excludes_infra_errors():
    base = harness_summary(_three_tasks(), attempts=3)
    # One extra infra-error episode per task changes nothing but the counter.
    trajs = _three_tasks() + [_infra("a", 3), _infra("b", 3), _infra("c", 3)]
    s = harness_summary(trajs, attempts=3)
    assert s.n_infra_errors == 3
    assert s.n_episodes == 9
    for key in ("n_tasks", "mean_score", "mean_score_ci95", "pass_at_k", "pass_hat_k", "delivery_rate", "k_notes"):
        assert getattr(s, key) == getattr(base, key), key


def test_summarize_infra_error_replaces_an_attempt():
    # Task a's third attempt crashed: a has n=2, c=2 (its 0.5 episode is gone).
    trajs = [t for t in _three_tasks() if t.episode_id != "a-h-2"] + [_infra("a", 2)]
    s = harness_summary(trajs, attempts=3)
    assert s.n_episodes == 8
    assert s.n_infra_errors == 1
    assert s.mean_score == pytest.approx((1.0 + 0.5 / 3 + 1.0) / 3)
    assert s.pass_at_k["1"] == pytest.approx((1 + 0 + 1) / 3)
    assert s.pass_hat_k["2"] == pytest.approx((1 + 0 + 1) / 3)
    assert s.pass_at_k["3"] is None
    assert s.pass_hat_k["3"] is None
    assert s.k_notes == {"3": "1 of 3 tasks has fewer than 3 valid attempts"}
    assert s.delivery_rate == pytest.approx(7 / 8)


def test_summarize_refuses_k_beyond_attempts_run():
    trajs = [_traj(task, i, 1.0, True) for task in "abc" for i in range(2)]
    s = harness_summary(trajs, attempts=4)
    assert list(s.pass_at_k) == ["1", "2", "3", "4"]
    assert s.pass_at_k["2"] == 1.0
    assert s.pass_at_k["3"] is None and s.pass_at_k["4"] is None
    assert s.pass_hat_k["3"] is None and s.pass_hat_k["4"] is None
    assert s.k_notes == {
        "3": "3 of 3 tasks have fewer than 3 valid attempts",
        "4": "3 of 3 tasks have fewer than 4 valid attempts",
    }


def test_summarize_no_valid_episodes():
    s = harness_summary([_infra("a", 0), _infra("b", 0)], attempts=2)
    assert s.n_tasks == 0
    assert s.n_episodes == 0
    assert s.n_infra_errors == 2
    assert s.mean_score is None and s.mean_score_ci95 is None
    assert s.delivery_rate is None
    assert s.pass_at_k == {"1": None, "2": None}
    assert s.pass_hat_k == {"1": None, "2": None}
    assert set(s.k_notes) == {"1", "2"}
    assert harness_summary([], attempts=1).mean_score is None


def test_summarize_single_task_and_bad_input():
    s = harness_summary([_traj("a", 0, 0.25, False)], attempts=1)
    assert s.mean_score == 0.25
    assert s.mean_score_ci95 == [0.25, 0.25]
    assert s.pass_at_k == {"1": 0.0}
    with pytest.raises(ValueError):
        harness_summary([_traj("a", 0, 1.0, True)], attempts=0)
    with pytest.raises(ValueError):
        harness_summary([_traj("a", 0, 1.0, True), _traj("a", 1, 1.0, True, harness="g")], 1)


def test_summary_is_independent_of_trajectory_order():
    trajs = _three_tasks()
    assert harness_summary(trajs[::-1], 3) == harness_summary(trajs, 3)


# The keys of one harness in summary.json, in their order (README.md documents them).
SUMMARY_KEYS = [
    "n_tasks",
    "attempts",
    "mean_score",
    "mean_score_ci95",
    "pass_at_k",
    "pass_hat_k",
    "delivery_rate",
    "mean_subscores",
    "n_episodes",
    "n_infra_errors",
    "k_notes",
    "model_time_s",
]


def test_harness_summary_record_is_the_summary_json_entry():
    trajs = _three_tasks()
    record = harness_summary(trajs, 3)
    assert isinstance(record, HarnessSummary)
    assert list(HarnessSummary.model_fields) == SUMMARY_KEYS
    entry = record.model_dump()
    assert list(entry) == SUMMARY_KEYS
    assert json.loads(json.dumps(entry)) == entry  # plain JSON types only
    assert record.mean_score == entry["mean_score"] and record.pass_hat_k["2"] == pytest.approx(4 / 9)
    with pytest.raises(pydantic.ValidationError):
        record.n_tasks = 0  # type: ignore[misc]


def test_harness_summary_without_valid_episodes_has_the_same_keys():
    record = harness_summary([_infra("a", 0)], 2)
    assert list(record.model_dump()) == SUMMARY_KEYS
    assert record == HarnessSummary(
        n_tasks=0,
        attempts=2,
        mean_score=None,
        mean_score_ci95=None,
        pass_at_k={"1": None, "2": None},
        pass_hat_k={"1": None, "2": None},
        delivery_rate=None,
        mean_subscores={},
        n_episodes=0,
        n_infra_errors=1,
        k_notes=dict.fromkeys(["1", "2"], "no valid episodes (1 infrastructure errors)"),
        model_time_s=dict.fromkeys(
            ["queue", "prefill", "decode", "latency"], {"sum": None, "mean_per_episode": None, "n_episodes": 0}
        ),
    )


# ---------------------------------------------------------------- paired difference


def test_task_scores():
    scores = task_scores(_three_tasks() + [_infra("d", 0)])
    assert scores == pytest.approx({"a": 2.5 / 3, "b": 0.5 / 3, "c": 1.0})


def test_paired_difference_sign_and_value():
    a = {"t1": 0.0, "t2": 0.5, "t3": 1.0, "t4": 0.25, "only_a": 1.0}
    b = {"t1": 0.5, "t2": 0.5, "t3": 1.0, "t4": 0.75, "only_b": 0.0}
    d = paired_difference(a, b)
    assert d.n_tasks == 4
    assert d.n_only_a == 1 and d.n_only_b == 1
    assert d.mean_difference == pytest.approx((0.5 + 0 + 0 + 0.5) / 4)
    lo, hi = d.ci95
    assert lo <= d.mean_difference <= hi
    assert lo >= 0.0  # every difference is >= 0
    flipped = paired_difference(b, a)
    assert flipped.mean_difference == pytest.approx(-0.25)
    assert paired_difference(a, b, seed=0) == d


def test_paired_difference_no_shared_tasks():
    d = paired_difference({"x": 1.0}, {"y": 0.0})
    assert d.n_tasks == 0 and d.mean_difference is None and d.ci95 is None


def test_paired_difference_removes_task_difficulty():
    # Tasks differ wildly in difficulty but b is always exactly 0.1 better: the paired CI
    # is a point, far narrower than the CI of either harness's mean.
    a = {f"t{i}": i / 20 for i in range(10)}
    b = {t: s + 0.1 for t, s in a.items()}
    d = paired_difference(a, b)
    assert d.mean_difference == pytest.approx(0.1)
    assert d.ci95 == pytest.approx([0.1, 0.1])
    lo, hi = bootstrap_ci(list(a.values()))
    assert hi - lo > 0.1
    assert math.isfinite(d.ci95[0])


def test_grader_can_mark_a_submission_undelivered_and_shared_subscores_are_averaged():
    def graded(task, attempt, subscores, score):
        t = _traj(task, attempt, score, score == 1.0)
        t.grade.subscores.update(subscores)
        return t

    trajs = [
        graded("a", 0, {"commonsense": 1.0, "personalised": 1.0, "delivered": 1.0, "only_here": 1.0}, 1.0),
        graded("a", 1, {"commonsense": 0.5, "personalised": 0.0, "delivered": 1.0}, 0.25),
        # a prose answer with no plan in it: submitted, but the grader says nothing was delivered
        graded("b", 0, {"commonsense": 0.0, "personalised": 0.0, "delivered": 0.0}, 0.0),
        graded("b", 1, {"commonsense": 0.75, "personalised": 1.0, "delivered": 1.0}, 0.875),
    ]
    s = harness_summary(trajs, 2)
    assert s.delivery_rate == pytest.approx(3 / 4)
    assert s.mean_subscores == pytest.approx({"commonsense": 2.25 / 4, "personalised": 0.5, "delivered": 0.75})
    # no `delivered` sub-score: submitting is delivering
    assert harness_summary([_traj("a", 0, 0.0, False)], 1).delivery_rate == 1.0
