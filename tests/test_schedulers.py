"""Schedulers on synthetic signals: flat harnesses fall to the floor, opposing gradients are avoided,
choices are reproducible and resumable, and make_scheduler refuses bad input."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from harnessrl.train.schedulers import HarnessBanditScheduler, Selection, make_scheduler

DIM = 64


def simulate(scheduler, kinds: dict[str, str], steps: int, seed: int = 0, start: int = 0) -> list[str]:
    """Runs select/observe for `steps` steps with synthetic batches; returns the picked harnesses.

    kinds: "aligned"  advantages ~ N(0, 1), sketch = common direction + noise
           "opposed"  advantages ~ N(0, 1), sketch = -common direction + noise
           "flat"     advantages all 0 (every group flat), sketch = pure noise
    """
    gen = torch.Generator().manual_seed(1000 + seed)
    common = torch.randn(DIM, generator=torch.Generator().manual_seed(seed))
    picks = []
    for step in range(start, start + steps):
        harness = scheduler.select(step).harness
        noise, adv = torch.randn(DIM, generator=gen), torch.randn(16, generator=gen)
        kind = kinds[harness]
        if kind == "flat":
            scheduler.observe(harness, torch.zeros(16), noise)
        else:
            sign = 1.0 if kind == "aligned" else -1.0
            scheduler.observe(harness, adv, sign * common + 0.5 * noise)
        picks.append(harness)
    return picks


def test_flat_harness_is_sampled_near_the_floor():
    kinds = {"a": "aligned", "b": "aligned", "flat": "flat"}
    for seed in range(3):
        sched = make_scheduler("harness-bandit", list(kinds), seed=seed)
        picks = simulate(sched, kinds, steps=400, seed=seed)
        after_warmup = Counter(picks[50:])
        assert after_warmup["flat"] / 350 <= sched.floor + 0.04
        assert sched.probabilities()["flat"] <= sched.floor + 0.03


@pytest.mark.parametrize("name", ["harness-bandit", "transfer-only"])
def test_opposing_gradient_is_picked_less_than_aligned_ones(name):
    kinds = {"a": "aligned", "b": "aligned", "c": "aligned", "opp": "opposed"}
    for seed in range(2):
        picks = Counter(simulate(make_scheduler(name, list(kinds), seed=seed), kinds, steps=300, seed=seed)[30:])
        assert picks["opp"] < 0.5 * min(picks["a"], picks["b"], picks["c"])


def test_probabilities_sum_to_one_and_respect_the_floor():
    kinds = {"a": "aligned", "b": "opposed", "c": "flat"}
    sched = make_scheduler("harness-bandit", list(kinds), seed=0, floor=0.1)
    assert sched.probabilities() == pytest.approx({h: 1 / 3 for h in kinds})  # nothing observed: uniform
    for step in range(60):
        simulate(sched, kinds, steps=1, seed=0, start=step)
        probs = sched.probabilities()
        assert math.fsum(probs.values()) == pytest.approx(1.0)
        assert min(probs.values()) >= 0.1 - 1e-12


def test_unobserved_harness_gets_explored():
    # "late" is never observed while the others are: equal scores, but its bonus grows with N
    sched = HarnessBanditScheduler(["a", "b", "late"], seed=0)
    for _ in range(20):
        for h in ("a", "b"):
            sched.observe(h, [0.0, 0.0], None)  # no spread in L, no sketch: score 0.5, like "late"
    probs = sched.probabilities()
    assert probs["late"] > probs["a"] and probs["late"] > probs["b"]


@pytest.mark.parametrize("name", ["harness-bandit", "uniform", "learnability-only"])
def test_same_seed_same_choices_and_resume(name):
    kinds = {"a": "aligned", "b": "opposed", "c": "flat"}
    first = simulate(make_scheduler(name, list(kinds), seed=3), kinds, steps=80, seed=1)
    second = simulate(make_scheduler(name, list(kinds), seed=3), kinds, steps=80, seed=1)
    assert first == second
    other_seed = simulate(make_scheduler(name, list(kinds), seed=4), kinds, steps=80, seed=1)
    assert other_seed != first

    # Checkpoint mid-run through JSON, resume in a fresh scheduler: the same picks follow.
    sched = make_scheduler(name, list(kinds), seed=3)
    straight = simulate(sched, kinds, steps=40, seed=1)
    state = json.loads(json.dumps(sched.state_dict()))
    tail = simulate(sched, kinds, steps=40, seed=7, start=40)
    resumed = make_scheduler(name, list(kinds), seed=99)  # the seed is overwritten by the state
    resumed.load_state_dict(state)
    assert simulate(resumed, kinds, steps=40, seed=7, start=40) == tail
    assert resumed.probabilities() == pytest.approx(sched.probabilities())
    assert straight == first[:40]


def test_mixed_round_robin_single():
    hs = ["x", "y", "z", "w"]
    mixed = make_scheduler("mixed", hs)
    sel = mixed.select(0)
    assert sel.harness is None and sel.shares == {h: 0.25 for h in hs}
    rr = make_scheduler("round-robin", hs)
    assert [rr.select(s).harness for s in range(9)] == ["x", "y", "z", "w", "x", "y", "z", "w", "x"]
    single = make_scheduler("single:y", hs)
    assert {single.select(s).harness for s in range(20)} == {"y"}
    assert single.probabilities() == {"x": 0.0, "y": 1.0, "z": 0.0, "w": 0.0}
    assert make_scheduler("single:only", ["only"]).select(0) == Selection.one("only")
    uniform = make_scheduler("uniform", hs, seed=0)
    assert set(Counter(uniform.select(s).harness for s in range(200))) == set(hs)


def test_ablations_fix_the_weight():
    assert make_scheduler("learnability-only", ["a", "b"]).learnability_weight == 1.0
    assert make_scheduler("transfer-only", ["a", "b"]).learnability_weight == 0.0
    sched = make_scheduler("harness-bandit", ["a", "b"], learnability_weight=0.3, window=8, temperature="0.5")
    assert (sched.learnability_weight, sched.window, sched.temperature) == (0.3, 8, 0.5)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: make_scheduler("thompson", ["a", "b"]), "known: mixed"),
        (lambda: make_scheduler("harness-bandit", ["a"]), "at least 2"),
        (lambda: make_scheduler("mixed", []), "at least 2"),
        (lambda: make_scheduler("single:c", ["a", "b"]), "not one of"),
        (lambda: make_scheduler("uniform", ["a", "a"]), "duplicates"),
        (lambda: make_scheduler("harness-bandit", ["a", "b"], floor=0.5), "floor"),
        (lambda: make_scheduler("harness-bandit", ["a", "b"], temperature=0), "temperature"),
        (lambda: make_scheduler("harness-bandit", ["a", "b"], sketch_ema=1.0), "sketch_ema"),
        (lambda: make_scheduler("harness-bandit", ["a", "b"], window=1), "window"),
        (lambda: make_scheduler("harness-bandit", ["a", "b"], learnability_weight="high"), "number"),
        (lambda: make_scheduler("harness-bandit", ["a", "b"], tau=0.1), "accepted: learnability_weight"),
        (lambda: make_scheduler("transfer-only", ["a", "b"], learnability_weight=0.2), "fixes"),
        (lambda: make_scheduler("mixed", ["a", "b"], floor=0.1), "accepted: none"),
    ],
)
def test_make_scheduler_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_observe_checks_its_input():
    sched = make_scheduler("harness-bandit", ["a", "b"])
    with pytest.raises(ValueError, match="unknown harness"):
        sched.observe("c", [1.0], None)
    with pytest.raises(ValueError, match="no advantages"):
        sched.observe("a", [], None)
    with pytest.raises(ValueError, match="checkpoint"):
        make_scheduler("harness-bandit", ["a", "c"]).load_state_dict(sched.state_dict())
