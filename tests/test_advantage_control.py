"""The shuffled-rewards control of `harnessrl train grpo` (--advantage-control shuffled-rewards):
the same steps with each group's rewards shuffled among its episodes before the advantages, so
that a gain measured against it is not an artefact of the updates themselves.

The draw is a uniform permutation fixed by (seed, step, group): a resumed control run draws the
same; over many groups each episode gets the passing reward as often as any other; the recorded
rewards and the step's reward curve stay the true ones; the option is recorded only when on."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from helpers import grpo_trainer
from test_async_grpo import Spy
from test_trainer import BASE, SPECS, TextScore, lines

from harnessrl.store import RunStore
from harnessrl.train.config import TrainConfig
from harnessrl.train.grpo import group_advantages
from harnessrl.train.step import shuffled_rewards

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONTROL = BASE.replace(steps=2, eval_every=0, group_size=4, advantage_control="shuffled-rewards")


def test_the_shuffle_is_a_permutation_drawn_from_seed_step_and_group():
    scores = [1.0, 0.0, 0.0, 0.5]
    draws = {
        (seed, step, g): shuffled_rewards(scores, seed, step, g)
        for seed in (0, 1)
        for step in range(5)
        for g in range(5)
    }
    for shuffled in draws.values():
        assert sorted(shuffled) == sorted(scores)
    assert shuffled_rewards(scores, 0, 3, 2) == draws[(0, 3, 2)]  # a resume draws the same
    assert len({tuple(v) for v in draws.values()}) > 5  # not one fixed order
    assert scores == [1.0, 0.0, 0.0, 0.5]  # the caller's list is left as it was


def test_each_episode_gets_the_passing_reward_equally_often():
    """No link between an episode and its reward: over 4,000 groups of 4 with one pass, the pass
    lands on each position a quarter of the time (3 sd of a binomial: +-0.021)."""
    n = 4000
    where = Counter(shuffled_rewards([1.0, 0.0, 0.0, 0.0], 0, step, 0).index(1.0) for step in range(n))
    assert set(where) == {0, 1, 2, 3}
    for count in where.values():
        assert abs(count / n - 0.25) < 0.021


def test_the_control_is_a_choice_of_two():
    assert (
        TrainConfig(model="tiny-random", advantage_control="shuffled-rewards").advantage_control == "shuffled-rewards"
    )
    with pytest.raises(ValueError, match="advantage_control"):
        TrainConfig(model="tiny-random", advantage_control="random")


def test_a_control_run_trains_on_shuffled_rewards_and_records_the_true_ones(tmp_path, monkeypatch):
    from harnessrl.train import step as step_module

    drawn = []  # (scores, step, group, shuffled), in the order the groups are taken

    def spy(scores, seed, step, group):
        shuffled = shuffled_rewards(scores, seed, step, group)
        drawn.append((list(scores), step, group, shuffled))
        return shuffled

    monkeypatch.setattr(step_module, "shuffled_rewards", spy)
    out = tmp_path / "control"
    t = grpo_trainer(CONTROL, out, suite=TextScore(), specs=SPECS, progress=False)
    seen = Spy(t.scheduler)
    t.run()
    records = lines(out / "metrics.jsonl")
    with RunStore(out / "rollouts") as store:
        episodes = list(store.trajectories(with_tokens=False))
    G = CONTROL.group_size
    assert len(seen.seen) == len(records) == CONTROL.steps
    for step, ((harness, advantages), r) in enumerate(zip(seen.seen, records)):
        groups = [d for d in drawn if d[1] == step]
        assert [d[2] for d in groups] == list(range(CONTROL.tasks_per_step))
        # the shuffle was handed the true scores of the step's episodes
        true = sorted(e.grade.score for e in episodes if e.attempt // G == step)
        assert sorted(x for d in groups for x in d[0]) == true
        # the reward curve is the true one
        assert r["reward_mean"] == pytest.approx(sum(true) / len(true))
        # the advantages the step trained on are those of the shuffled rewards
        expected = [
            a
            for d in groups
            for a in group_advantages(torch.tensor([d[3]], dtype=torch.float64), scale=CONTROL.scale_advantages)[
                0
            ].tolist()
        ]
        assert advantages == pytest.approx(expected)
    assert any(d[0] != d[3] for d in drawn), "pick a seed where some group's shuffle moved a reward"
    assert json.loads((out / "config.json").read_text())["advantage_control"] == "shuffled-rewards"


def test_the_option_is_recorded_only_when_on(tmp_path):
    """A run from before the option (no key in its config.json) resumes as it was."""
    out = tmp_path / "plain"
    grpo_trainer(
        CONTROL.replace(steps=1, advantage_control="none"),
        out,
        suite=TextScore(),
        specs=SPECS,
        progress=False,
    ).run()
    assert "advantage_control" not in json.loads((out / "config.json").read_text())
    grpo_trainer(
        CONTROL.replace(advantage_control="none"),
        out,
        resume=True,
        suite=TextScore(),
        specs=SPECS,
        progress=False,
    ).run()
    assert len(lines(out / "metrics.jsonl")) == 2
