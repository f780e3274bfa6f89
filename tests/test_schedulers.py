"""Schedulers on synthetic signals: flat harnesses fall to the floor, opposing gradients are avoided,
the baselines (ratio, dump-ucb, sec, lilo) follow their rules, choices are reproducible and
resumable, make_scheduler refuses bad input, and every baseline runs inside the trainer."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from helpers import grpo_trainer
from test_trainer import BASE, SPECS, TextScore, lines

from harnessrl.train.schedulers import HarnessBanditScheduler, Selection, make_scheduler
from harnessrl.train.trainer import allocate_tasks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DIM = 64


def simulate(scheduler, kinds: dict[str, str], steps: int, seed: int = 0, start: int = 0) -> list[str]:
    """Runs select/observe for `steps` steps with synthetic batches; returns the picked harnesses.

    kinds: "aligned"  advantages ~ N(0, 1), sketch = common direction + noise
           "opposed"  advantages ~ N(0, 1), sketch = -common direction + noise
           "flat"     advantages all 0 (every group flat), sketch = pure noise
    Rewards: 1 where the advantage is > 0, else 0 (all 0 for "flat").
    """
    gen = torch.Generator().manual_seed(1000 + seed)
    common = torch.randn(DIM, generator=torch.Generator().manual_seed(seed))
    picks = []
    for step in range(start, start + steps):
        harness = scheduler.select(step).harness
        noise, adv = torch.randn(DIM, generator=gen), torch.randn(16, generator=gen)
        kind = kinds[harness]
        if kind == "flat":
            scheduler.observe(harness, torch.zeros(16), noise, rewards=torch.zeros(16))
        else:
            sign = 1.0 if kind == "aligned" else -1.0
            scheduler.observe(harness, adv, sign * common + 0.5 * noise, rewards=(adv > 0).double())
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


@pytest.mark.parametrize(
    "name, options",
    [
        ("harness-bandit", {}),
        ("uniform", {}),
        ("learnability-only", {}),
        ("dump-ucb", {"window": 20}),  # full windows at the checkpoint: their length must survive
        ("dump-ucb", {"temperature": 0}),
        ("sec", {}),
        ("lilo", {"window": 20}),
    ],
)
def test_same_seed_same_choices_and_resume(name, options):
    kinds = {"a": "aligned", "b": "opposed", "c": "flat"}
    first = simulate(make_scheduler(name, list(kinds), seed=3, **options), kinds, steps=80, seed=1)
    second = simulate(make_scheduler(name, list(kinds), seed=3, **options), kinds, steps=80, seed=1)
    assert first == second
    other_seed = simulate(make_scheduler(name, list(kinds), seed=4, **options), kinds, steps=80, seed=1)
    assert other_seed != first

    # Checkpoint mid-run through JSON, resume in a fresh scheduler: the same picks follow.
    sched = make_scheduler(name, list(kinds), seed=3, **options)
    straight = simulate(sched, kinds, steps=40, seed=1)
    state = json.loads(json.dumps(sched.state_dict()))
    tail = simulate(sched, kinds, steps=40, seed=7, start=40)
    resumed = make_scheduler(name, list(kinds), seed=99, **options)  # the seed is overwritten by the state
    resumed.load_state_dict(state)
    assert simulate(resumed, kinds, steps=40, seed=7, start=40) == tail
    assert resumed.probabilities() == pytest.approx(sched.probabilities())
    assert resumed.state_dict() == sched.state_dict()
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


# ------------------------------------------------------------------------------------ the baselines


def test_ratio_gives_the_exact_shares_every_step():
    sched = make_scheduler("ratio:a=2,b=1,c=1", ["a", "b", "c"], seed=0)
    kinds = {"a": "aligned", "b": "opposed", "c": "flat"}
    for step in range(5):
        assert sched.select(step).shares == {"a": 0.5, "b": 0.25, "c": 0.25}
        assert allocate_tasks(sched.select(step).shares, 8, step) == {"a": 4, "b": 2, "c": 2}
        for h in kinds:  # observations change nothing
            sched.observe(h, [1.0, -1.0], None, rewards=[1.0, 0.0])
    assert sched.probabilities() == {"a": 0.5, "b": 0.25, "c": 0.25}
    assert sched.name == "ratio:a=2,b=1,c=1" and sched.state_dict()["name"] == "ratio:a=2,b=1,c=1"

    # a weight of 0 leaves a harness out of the batch; weights may be fractions, or strings
    zero = make_scheduler("ratio: a = 0.5 ,b=0,c=1.5", ["a", "b", "c"])
    assert zero.select(0).shares == {"a": 0.25, "c": 0.75} and zero.probabilities()["b"] == 0.0
    assert make_scheduler("ratio:a=0,b=1", ["a", "b"]).select(3) == Selection.one("b")
    assert make_scheduler("ratio:x=1", ["x"]).select(0) == Selection.one("x")  # one harness is allowed, like single:


def test_dump_ucb_tries_every_harness_then_follows_the_ucb_of_mean_abs_advantage():
    hs = ["a", "b", "c"]
    sched = make_scheduler("dump-ucb", hs, seed=0, temperature=0, window=100)
    assert sched.probabilities() == pytest.approx({h: 1 / 3 for h in hs})
    seen = []
    for step in range(3):  # untried harnesses first, each exactly once
        h = sched.select(step).harness
        assert h not in seen and sched.probabilities()[h] == pytest.approx(1 / (3 - step))
        seen.append(h)
        sched.observe(h, {"a": [1.0, -1.0] * 4, "b": [0.1, -0.1] * 4, "c": [0.0] * 8}[h], None)
    assert sorted(seen) == hs

    # every harness tried: score = windowed mean |A| + c * sqrt(2 ln N / n), N and n in episodes
    bonus = math.sqrt(2 * math.log(24) / 8)
    assert sched.scores() == pytest.approx({"a": 1.0 + bonus, "b": 0.1 + bonus, "c": bonus})
    assert sched.probabilities() == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert {sched.select(s).harness for s in range(20)} == {"a"}
    soft = make_scheduler("dump-ucb", hs, window=100)  # the default temperature 0.1: softmax(score / 0.1)
    soft.load_state_dict(sched.state_dict())
    weights = {h: math.exp(v / 0.1) for h, v in sched.scores().items()}
    assert soft.probabilities() == pytest.approx({h: w / sum(weights.values()) for h, w in weights.items()})

    # a exhausted (flat from now on): its window (100) forgets the old |A|; the bonus brings the others back
    for _ in range(12):
        sched.observe("a", [0.0] * 8, None)
    assert sched.scores()["a"] == pytest.approx(4 / 100 + math.sqrt(2 * math.log(120) / 104))
    assert sched.probabilities()["b"] == 1.0
    small = make_scheduler("dump-ucb", hs, window=4, c=0, temperature=0)
    small.observe("a", [5.0] * 4, None)
    small.observe("a", [0.0] * 4, None)
    small.observe("b", [0.5], None)
    small.observe("c", [0.2], None)
    assert small.scores() == {"a": 0.0, "b": 0.5, "c": 0.2}


def test_sec_q_is_the_td0_update_and_sampling_is_boltzmann():
    sched = make_scheduler("sec", ["a", "b"], seed=0, alpha=0.3, tau=0.5)
    assert sched.q == {"a": 0.0, "b": 0.0} and sched.probabilities() == {"a": 0.5, "b": 0.5}
    q = 0.0
    for adv in ([1.0, -1.0, 0.5, -0.5], [0.0, 0.0], [2.0, -2.0]):
        sched.observe("a", adv, None)
        q = q + 0.3 * (sum(abs(x) for x in adv) / len(adv) - q)
        assert sched.q["a"] == pytest.approx(q) and sched.q["b"] == 0.0
    p_a = math.exp(q / 0.5) / (math.exp(q / 0.5) + 1.0)
    assert sched.probabilities() == pytest.approx({"a": p_a, "b": 1 - p_a})

    # on synthetic signals, the harness with larger |A| is picked far more often than a flat one
    kinds = {"a": "aligned", "flat": "flat"}
    picks = Counter(simulate(make_scheduler("sec", list(kinds), seed=1), kinds, steps=200, seed=1)[20:])
    assert picks["a"] > 4 * picks["flat"]


def test_lilo_prefers_the_harness_whose_success_rate_is_near_one_half():
    sched = make_scheduler("lilo", ["half", "never", "always", "new"], seed=0, floor=0.05)
    sched.observe("half", [1.0, -1.0], None, rewards=[1.0, 0.0] * 8)
    sched.observe("never", [0.0], None, rewards=[0.0] * 16)
    sched.observe("always", [0.0], None, rewards=torch.ones(16))
    assert sched.success_rate() == {"half": 0.5, "never": 0.0, "always": 1.0, "new": None}
    assert sched.learnability() == {"half": 0.25, "never": 0.0, "always": 0.0, "new": 0.25}  # new: optimistic
    probs = sched.probabilities()
    assert probs == pytest.approx({"half": 0.45, "never": 0.05, "always": 0.05, "new": 0.45})
    assert math.fsum(probs.values()) == pytest.approx(1.0)

    # nearer 1/2 is preferred on either side; the window forgets old episodes
    two = make_scheduler("lilo", ["near", "far"], window=10, floor=0.0)
    two.observe("near", [0.0], None, rewards=[1.0] * 10)  # p = 1 ...
    two.observe("near", [0.0], None, rewards=[1.0] * 6 + [0.0] * 4)  # ... replaced: p = 0.6
    two.observe("far", [0.0], None, rewards=[1.0] * 9 + [0.0])  # p = 0.9
    assert two.learnability() == pytest.approx({"near": 0.24, "far": 0.09})
    assert two.probabilities() == pytest.approx({"near": 0.24 / 0.33, "far": 0.09 / 0.33})
    flat = make_scheduler("lilo", ["x", "y"])
    flat.observe("x", [0.0], None, rewards=[1.0])
    flat.observe("y", [0.0], None, rewards=[0.0])
    assert flat.probabilities() == pytest.approx({"x": 0.5, "y": 0.5})  # nothing learnable anywhere: uniform


@pytest.mark.parametrize("name", ["dump-ucb", "sec", "lilo"])
def test_select_draws_from_probabilities(name):
    kinds = {"a": "aligned", "b": "opposed", "c": "flat"}
    sched = make_scheduler(name, list(kinds), seed=5)
    simulate(sched, kinds, steps=12, seed=2)
    probs = sched.probabilities()
    draws = Counter(sched.select(12).harness for _ in range(4000))  # select alone changes nothing but the RNG
    assert sched.probabilities() == probs
    for h in kinds:
        assert draws[h] / 4000 == pytest.approx(probs[h], abs=0.03)


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
        (lambda: make_scheduler("ratio", ["a", "b"]), "needs its weights"),
        (lambda: make_scheduler("ratio:a=1", ["a", "b"]), "no weight for 'b'"),
        (lambda: make_scheduler("ratio:a=1,b=1,c=1", ["a", "b"]), "unknown harness"),
        (lambda: make_scheduler("ratio:a=1,a=2,b=1", ["a", "b"]), "given twice"),
        (lambda: make_scheduler("ratio:a,b=1", ["a", "b"]), "HARNESS=WEIGHT"),
        (lambda: make_scheduler("ratio:a=1,b=", ["a", "b"]), "HARNESS=WEIGHT"),
        (lambda: make_scheduler("ratio:a=-1,b=1", ["a", "b"]), "weight of a"),
        (lambda: make_scheduler("ratio:a=inf,b=1", ["a", "b"]), "weight of a"),
        (lambda: make_scheduler("ratio:a=x,b=1", ["a", "b"]), "must be a number"),
        (lambda: make_scheduler("ratio:a=0,b=0", ["a", "b"]), "at least one weight"),
        (lambda: make_scheduler("ratio:a=1,b=1", ["a", "b"], floor=0.1), "accepted: none"),
        (lambda: make_scheduler("dump-ucb", ["a"]), "at least 2"),
        (lambda: make_scheduler("dump-ucb", ["a", "b"], window=0), "window"),
        (lambda: make_scheduler("dump-ucb", ["a", "b"], window="2.5"), "integer"),
        (lambda: make_scheduler("dump-ucb", ["a", "b"], c=-1), "c must be"),
        (lambda: make_scheduler("dump-ucb", ["a", "b"], temperature=-0.1), "temperature"),
        (lambda: make_scheduler("dump-ucb", ["a", "b"], tau=0.1), "accepted: window, c, temperature"),
        (lambda: make_scheduler("sec", ["a", "b"], alpha=0), "alpha"),
        (lambda: make_scheduler("sec", ["a", "b"], alpha=1.5), "alpha"),
        (lambda: make_scheduler("sec", ["a", "b"], tau=0), "tau"),
        (lambda: make_scheduler("sec", ["a", "b"], tau="cold"), "number"),
        (lambda: make_scheduler("lilo", ["a", "b"], floor=0.5), "floor"),
        (lambda: make_scheduler("lilo", ["a", "b"], window=True), "number"),
        (lambda: make_scheduler("lilo", ["a", "b"], temperature=1), "accepted: window, floor"),
    ],
)
def test_make_scheduler_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_every_known_scheduler_is_described_and_built():
    """The names `--scheduler` takes: each is described in the module docstring and the docs table
    of docs/training.md, and builds (NAME and the ratio's weights filled in)."""
    import re
    from pathlib import Path

    from harnessrl.train import schedulers

    table = (Path(__file__).parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    for name in schedulers.KNOWN_SCHEDULERS:
        assert re.search(rf"\n  {re.escape(name)}\s", schedulers.__doc__ or ""), name
        assert f"| `{name}` |" in table, name
        built = name.replace("NAME", "a").replace("H1=W1,H2=W2,...", "a=1,b=1")
        assert make_scheduler(built, ["a", "b"]).name == built


def test_observe_checks_its_input():
    sched = make_scheduler("harness-bandit", ["a", "b"])
    with pytest.raises(ValueError, match="unknown harness"):
        sched.observe("c", [1.0], None)
    with pytest.raises(ValueError, match="no advantages"):
        sched.observe("a", [], None)
    with pytest.raises(ValueError, match="checkpoint"):
        make_scheduler("harness-bandit", ["a", "c"]).load_state_dict(sched.state_dict())
    for name in ("harness-bandit", "dump-ucb", "sec"):
        with pytest.raises(ValueError, match="no advantages"):
            make_scheduler(name, ["a", "b"]).observe("a", [], None)
        with pytest.raises(ValueError, match="non-finite"):
            make_scheduler(name, ["a", "b"]).observe("a", [1.0, math.nan], None)
        with pytest.raises(ValueError, match="non-finite"):
            make_scheduler(name, ["a", "b"]).observe("a", [math.inf, 0.0], None)
    lilo = make_scheduler("lilo", ["a", "b"])
    with pytest.raises(ValueError, match="needs the episodes' scores"):
        lilo.observe("a", [1.0, -1.0], None)
    with pytest.raises(ValueError, match="no rewards"):
        lilo.observe("a", [1.0, -1.0], None, rewards=[])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        lilo.observe("a", [1.0, -1.0], None, rewards=[0.5, 1.5])
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        lilo.observe("a", [1.0, -1.0], None, rewards=[math.nan])
    with pytest.raises(ValueError, match="unknown harness"):
        lilo.observe("c", [1.0], None, rewards=[1.0])
    assert lilo.success_rate() == {"a": None, "b": None}  # nothing of a refused batch was kept


# ---------------------------------------------------------------------------------- in the trainer


@pytest.mark.parametrize("name", ["ratio:json-tools=3,react=1", "dump-ucb", "sec", "lilo"])
def test_each_baseline_runs_in_the_trainer(name, tmp_path):
    """Two steps of the tiny model: the scheduler selects, gets every observed harness's advantages
    and rewards, logs its probabilities and is checkpointed."""
    config = BASE.replace(
        scheduler=name, steps=2, tasks_per_step=4, eval_every=0, save_rollouts=False, checkpoint_every=2
    )
    t = grpo_trainer(config, tmp_path / "run", suite=TextScore(), specs=SPECS, progress=False)
    t.run()
    records = lines(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert set(r["probabilities"]) == {"json-tools", "react"}
        assert math.fsum(r["probabilities"].values()) == pytest.approx(1.0)
        assert r["infra_errors"] == 0 and r["groups_too_small"] == 0
    state = json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())
    assert state["scheduler"] == json.loads(json.dumps(t.scheduler.state_dict()))
    sched = t.scheduler
    if name.startswith("ratio:"):
        assert all(r["harness"] == "mixed" and r["shares"] == {"json-tools": 0.75, "react": 0.25} for r in records)
        assert records[0]["probabilities"] == {"json-tools": 0.75, "react": 0.25}
        return
    assert all(r["harness"] in ("json-tools", "react") and r["episodes"] == 8 for r in records)
    assert records[0]["probabilities"] == pytest.approx({"json-tools": 0.5, "react": 0.5})  # nothing seen yet
    picked = Counter(r["harness"] for r in records)
    if name == "dump-ucb":
        assert set(picked) == {"json-tools", "react"}  # both tried first
        assert sched.count == {h: 8 * n for h, n in picked.items()} and sched.total == 16
    elif name == "sec":
        # one observation per step, of the picked harness's mean |A|: Q follows the TD(0) rule
        expected = {h: 0.0 for h in sched.harnesses}
        for r in records:
            expected[r["harness"]] += sched.alpha * (r["adv_abs_mean"] - expected[r["harness"]])
        assert sched.q == pytest.approx(expected)
        assert any(q != 0 for q in sched.q.values()) == any(r["adv_abs_mean"] for r in records)
    else:  # lilo: the trainer passed each step's scores
        for h in sched.harnesses:
            steps = [r for r in records if r["harness"] == h]
            assert len(sched.recent[h]) == 8 * len(steps)
            assert math.fsum(sched.recent[h]) == pytest.approx(sum(8 * r["reward_mean"] for r in steps))
