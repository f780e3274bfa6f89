"""Asynchronous collection (--max-off-policy-steps, rollouts on `harnessrl serve` in this process)
and dynamic sampling (--dynamic-sampling) in the GRPO trainer, with the tiny random model.

Asynchronous: the next step's rollouts overlap the update (the step record says so); no model
call is ever trained more policy versions after the one that sampled it than the bound (with an
artificially slow update, where a deeper pipeline does reach a lag of 2); a run killed in the
middle of its pipeline resumes to the decisions of the uninterrupted run. Dynamic sampling: the
batch is filled with groups that carry signal or the step says the budget ran out, the scheduler
sees every group (flat ones included), and two processes take the refill decisions of one.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from helpers import grpo_trainer, keyed_server, shrunk
from test_train_distributed import launch, needs_gloo
from test_trainer import BASE, SPECS, TextScore, adapter_weights, lines

from harnessrl.store import RunStore
from harnessrl.train import trainer as trainer_module
from harnessrl.train.schedulers import make_scheduler
from harnessrl.train.step import StepPlan, StepRecord, StepTimes, attempt_base, plan_step, refill_plan
from harnessrl.train.trainer import Trainer, TrainError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# 4 steps of seed 0 at T=1: every step's groups disagree somewhere, so every step updates and each
# update makes a new policy version (the lags below count them)
ASYNC = BASE.replace(steps=4, eval_every=0, checkpoint_every=1, max_off_policy_steps=1)
SLOW_UPDATE_S = 1.0
SLOW_ROLLOUTS_S = 0.4


def run(out, config, resume=False, suite=None, specs=SPECS) -> Trainer:
    t = grpo_trainer(config, out, resume=resume, suite=suite or TextScore(), specs=specs, progress=False)
    t.run()
    return t


def stored_calls(out) -> list[tuple[int, int]]:
    """(attempt, policy_version) of every stored model call."""
    with RunStore(out / "rollouts") as store:
        return [(t.attempt, s.model_call.policy_version) for t in store.trajectories() for s in t.steps]


def stored_episodes(out) -> list[tuple]:
    with RunStore(out / "rollouts") as store:
        return sorted((t.task_id, t.harness, t.attempt, t.grade and t.grade.score) for t in store.trajectories())


@pytest.fixture(scope="module")
def server():
    with keyed_server("tiny-random") as url:  # the trainer's processes inherit $HARNESSRL_ADMIN_KEY
        yield url


@pytest.fixture
def slow_update(monkeypatch):
    """update_policy, as the trainer calls it, takes SLOW_UPDATE_S longer: the collector, which
    runs ahead, would get further ahead than the bound allows if nothing stopped it."""
    real = trainer_module.update_policy

    def slow(*args, **kwargs):
        time.sleep(SLOW_UPDATE_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "update_policy", slow)


@pytest.fixture
def slow_rollouts(monkeypatch):
    """Every round of rollouts takes at least SLOW_ROLLOUTS_S, as real ones do: the tiny model's
    episodes can end faster than the trainer turns a finished batch into training units, and then
    the next step's rollouts are over before the update they are meant to overlap has begun."""
    from harnessrl.rollout import Runner

    real = Runner.run

    def slow(self, jobs):
        t0 = time.perf_counter()
        trajectories = real(self, jobs)
        time.sleep(max(0.0, SLOW_ROLLOUTS_S - (time.perf_counter() - t0)))
        return trajectories

    monkeypatch.setattr(Runner, "run", slow)


def check_lags(out, records, bound: int) -> list[int]:
    """Every stored model call of step k lags the weights step k trained from by at most `bound`
    versions, and was sampled by the version the step's plan was bound to; returns the lags."""
    G = BASE.group_size
    lags = []
    for attempt, version in stored_calls(out):
        r = records[attempt // G]
        assert version == r["sampling_version"]
        lag = r["policy_version"] - version
        assert 0 <= lag <= bound, (r["step"], lag)
        lags.append(lag)
    for r in records:
        assert r["policy_lag_max"] <= bound
        assert max(int(k) for k in r["policy_lag_hist"]) == r["policy_lag_max"]
    return lags


def test_the_next_steps_rollouts_overlap_the_update_within_the_bound(server, slow_update, slow_rollouts, tmp_path):
    out = tmp_path / "async"
    run(out, ASYNC.replace(rollout_servers=[server]))
    records = lines(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["optimizer_step"] for r in records), "pick a seed whose steps all update"
    # the policy versions: step k trains from the weights after k updates; its plan (made one
    # step ahead) is bound to the weights of one update fewer
    assert [r["policy_version"] for r in records] == [0, 1, 2, 3]
    assert [r["sampling_version"] for r in records] == [0, 0, 1, 2]
    lags = check_lags(out, records, bound=1)
    assert lags.count(1) > 0 and max(lags) == 1
    assert [r["policy_lag_max"] for r in records] == [0, 1, 1, 1]
    # each later step's rollouts ran during the previous (slow) update: the trainer hardly waits
    assert [r["rollouts_overlapped"] for r in records] == [False, True, True, True]
    for r in records[1:]:
        assert r["time"]["rollout_update_overlap"] > 0
        assert r["time"]["rollout_wait"] < r["time"]["rollout"] + 1e-6
    for r in records:
        assert list(r) == StepRecord.keys(rollout_servers=True)
        assert list(r["time"]) == StepTimes.keys(rollout_servers=True)
        assert len(r["servers_idle"]) == 1 and r["servers_idle"][0] >= 0
        assert r["policy_lag_mean"] is not None and 0 <= r["policy_lag_mean"] <= r["policy_lag_max"]
    # only the last version published (the last step's rollouts came from it) is left on disk:
    # every pinned one was released at the end
    folders = sorted(f.name.split("-")[0] for f in (out / "rollout-adapters").iterdir())
    assert folders == ["v3"]
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["policy_version"] == 4 and [p["plan"]["step"] for p in state["pipeline"]] == [4]
    assert [p["version"] for p in state["pipeline"]] == [3]  # a plan for a longer resumed run


def test_a_deeper_pipeline_reaches_the_lag_the_bound_of_1_forbids(server, slow_update, tmp_path):
    """The same slow update with a bound of 2: plans run two steps ahead and units are trained
    two versions late, which the bound of 1 above never allowed."""
    out = tmp_path / "deep"
    run(out, ASYNC.replace(steps=3, max_off_policy_steps=2, rollout_servers=[server]))
    records = lines(out / "metrics.jsonl")
    assert all(r["optimizer_step"] for r in records)
    assert [r["sampling_version"] for r in records] == [0, 0, 0]
    assert max(check_lags(out, records, bound=2)) == 2


def test_a_killed_asynchronous_run_resumes_to_the_same_decisions(server, tmp_path, monkeypatch):
    """Killed during step 3's update, while step 4's rollouts are collected ahead: the checkpoint
    of step 2 holds the plan of step 3 (made before step 2's update was observed) and the weights
    it is bound to; the resumed run takes every decision the uninterrupted one took."""
    config = ASYNC.replace(rollout_servers=[server])
    full, killed = tmp_path / "full", tmp_path / "killed"
    run(full, config)
    update = Trainer._update

    def killed_in_step_3(self, units, step):
        if step == 2:
            raise KeyboardInterrupt
        return update(self, units, step)

    monkeypatch.setattr(Trainer, "_update", killed_in_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(killed, config)
    monkeypatch.undo()
    state = json.loads((killed / "checkpoint" / "state.json").read_text())
    assert state["step"] == 2 and [p["plan"]["step"] for p in state["pipeline"]] == [2]
    assert (killed / "checkpoint" / "pinned_adapters.pt").is_file()  # step 3 is bound to version 1
    run(killed, config, resume=True)

    a, b = lines(full / "metrics.jsonl"), lines(killed / "metrics.jsonl")
    keys = (
        "step",
        "harness",
        "tasks",
        "sampling_seed",
        "probabilities",
        "sampling_version",
        "policy_version",
        "reward_mean",
        "policy_lag_hist",
    )
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert stored_episodes(full) == stored_episodes(killed)
    sa = json.loads((full / "checkpoint" / "state.json").read_text())
    sb = json.loads((killed / "checkpoint" / "state.json").read_text())
    assert sa == sb  # scheduler, task RNG, policy version and the plan made for step 5
    wa, wb = adapter_weights(full / "adapter"), adapter_weights(killed / "adapter")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


@needs_gloo
def test_two_processes_collect_ahead_as_one(server, tmp_path):
    """Each process runs its share of every plan ahead on the servers; rank 0 publishes; the
    versions stay pinned until both have gathered the step: the run of one process, step for step."""
    config = ASYNC.replace(steps=3, tasks_per_step=3, rollout_servers=[server])
    run(tmp_path / "one", config)
    results = launch(2, tmp_path / "two", config)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    keys = ("harness", "tasks", "reward_mean", "policy_lag_hist", "sampling_version", "policy_version")
    a, b = lines(tmp_path / "one" / "metrics.jsonl"), lines(tmp_path / "two" / "metrics.jsonl")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    for x, y in zip(a, b):  # the gradient summed over two processes: equal up to float rounding
        assert (x["loss"] is None) == (y["loss"] is None)
        assert x["loss"] is None or x["loss"] == pytest.approx(y["loss"], rel=1e-4, abs=1e-6)
    assert any(r["policy_lag_max"] == 1 for r in b)
    assert stored_episodes(tmp_path / "one") == stored_episodes(tmp_path / "two")


def test_asynchronous_collection_needs_a_rollout_server(tmp_path):
    with pytest.raises(TrainError, match="--max-off-policy-steps 1 needs --rollout-server"):
        grpo_trainer(ASYNC, tmp_path / "o", suite=TextScore(), specs=SPECS, progress=False)


# ------------------------------------------------------------------------------- dynamic sampling

DYNAMIC = BASE.replace(steps=4, tasks_per_step=3, eval_every=0, dynamic_sampling=True, max_sampling_rounds=3)


class Spy:
    """Records every scheduler.observe call: (harness, advantages)."""

    def __init__(self, scheduler):
        self.seen: list[tuple[str, list[float]]] = []
        real = scheduler.observe

        def observe(harness, advantages, sketch, **kwargs):
            self.seen.append((harness, list(advantages)))
            return real(harness, advantages, sketch, **kwargs)

        scheduler.observe = observe


def test_dynamic_sampling_fills_the_batch_with_groups_that_carry_signal(tmp_path):
    out = tmp_path / "dyn"
    t = grpo_trainer(DYNAMIC, out, suite=TextScore(), specs=SPECS, progress=False)
    spy = Spy(t.scheduler)
    t.run()
    records = lines(out / "metrics.jsonl")
    R, G, n = DYNAMIC.max_sampling_rounds, DYNAMIC.group_size, DYNAMIC.tasks_per_step
    assert any(r["groups_dropped_flat"] > 0 for r in records), "pick a seed with flat groups"
    assert any(r["sampling_rounds"] > 1 for r in records)
    for r in records:
        assert list(r) == StepRecord.keys(dynamic_sampling=True) and list(r["time"]) == StepTimes.keys()
        assert r["groups"] + r["groups_too_small"] == r["groups_sampled"] == len(r["tasks"])
        assert r["groups_trained"] + r["groups_dropped_flat"] == r["groups"]
        assert r["groups_trained"] <= n
        assert r["sampling_budget_exhausted"] == (r["groups_trained"] < n)
        assert r["groups_trained"] == n or r["sampling_rounds"] == R
        assert r["episodes"] == G * r["groups_sampled"]
    # every trained unit is from a group with signal: units are G calls per trained group (one step)
    assert all(r["units"] == G * r["groups_trained"] for r in records)
    # the scheduler saw every group's advantages, the flat groups' zeros included, once per step
    assert len(spy.seen) == len(records)
    for (harness, advantages), r in zip(spy.seen, records):
        assert harness == r["harness"] and len(advantages) == G * r["groups"]
        zeros = [advantages[i : i + G] for i in range(0, len(advantages), G)]
        assert sum(all(a == 0 for a in g) for g in zeros) == r["groups_dropped_flat"]
    # attempt numbers: R rounds of G per step, unique episode ids
    with RunStore(out / "rollouts") as store:
        episodes = list(store.trajectories(with_tokens=False))
    assert len({e.episode_id for e in episodes}) == len(episodes) == sum(r["episodes"] for r in records)
    for e in episodes:
        step = e.attempt // (R * G)
        assert records[step]["sampling_rounds"] > (e.attempt // G) % R


def test_dynamic_sampling_says_when_its_budget_ran_out(tmp_path):
    """toolcalc through strict one-step harnesses: the random model never scores, every group of
    every round is flat; the step trains nothing and says the budget ran out, and the scheduler
    still learns from every zero."""
    from harnessrl.tasks import get_suite

    specs = [shrunk(h, max_steps=1, max_new_tokens=8) for h in ("json-tools", "react")]
    config = DYNAMIC.replace(suite="toolcalc", steps=1, tasks_per_step=2, save_rollouts=False)
    t = grpo_trainer(config, tmp_path / "flat", suite=get_suite("toolcalc"), specs=specs, progress=False)
    spy = Spy(t.scheduler)
    t.run()
    (r,) = lines(tmp_path / "flat" / "metrics.jsonl")
    assert r["sampling_rounds"] == 3 and r["groups_sampled"] == 6 and r["groups_dropped_flat"] == 6
    assert r["groups_trained"] == 0 and r["sampling_budget_exhausted"] is True
    assert r["optimizer_step"] is False and r["units"] == 0
    assert spy.seen == [(r["harness"], [0.0] * 12)]
    assert list(t.scheduler.l_window) == [0.0]


def test_a_dynamic_sampling_run_resumes_exactly(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(full, DYNAMIC)
    run(resumed, DYNAMIC.replace(steps=2))
    run(resumed, DYNAMIC, resume=True)
    keys = ("harness", "tasks", "sampling_seed", "sampling_rounds", "groups_trained", "reward_mean", "loss")
    a, b = lines(full / "metrics.jsonl"), lines(resumed / "metrics.jsonl")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert stored_episodes(full) == stored_episodes(resumed)


@needs_gloo
def test_two_processes_take_the_refill_decisions_of_one(tmp_path):
    config = DYNAMIC.replace(steps=2)
    run(tmp_path / "one", config)
    results = launch(2, tmp_path / "two", config)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    keys = ("harness", "tasks", "sampling_rounds", "groups_trained", "groups_dropped_flat", "reward_mean")
    a, b = lines(tmp_path / "one" / "metrics.jsonl"), lines(tmp_path / "two" / "metrics.jsonl")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert any(r["sampling_rounds"] > 1 for r in a)
    assert stored_episodes(tmp_path / "one") == stored_episodes(tmp_path / "two")


# ------------------------------------------------------------------------------------ the pieces


def test_plans_round_trip_and_refills_keep_the_selection(tmp_path):
    import random

    suite = TextScore()
    tasks = suite.tasks("train")
    specs = {s.name: s for s in SPECS}
    scheduler = make_scheduler("mixed", list(specs), seed=0)
    rng = random.Random(0)
    plan = plan_step(scheduler, rng, tasks, specs, 4, step=3)
    again = StepPlan.from_dict(json.loads(json.dumps(plan.to_dict())), {t.id: t for t in tasks}, specs)
    assert again.fingerprint() == plan.fingerprint() and again.counts == plan.counts
    refill = refill_plan(plan, rng, tasks, specs, 3)
    assert refill.step == 3 and refill.selection == plan.selection and len(refill.assignment) == 3
    assert len({t.id for t, _ in refill.assignment}) == 3
    # attempt numbers: one step's rounds never meet another step's
    G, R = 2, 3
    used = {attempt_base(s, r, G, R) + i for s in range(4) for r in range(R) for i in range(G)}
    assert len(used) == 4 * R * G and attempt_base(1, 0, G, 1) == G
