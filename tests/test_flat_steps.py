"""A GRPO run whose groups are all flat (every attempt at a task scores alike) updates nothing;
after three such steps in a row the trainer says so, and what would give its groups signal."""

from __future__ import annotations

import io

import pytest
from helpers import grpo_trainer
from rich.console import Console
from test_trainer import BASE, SPECS, TextScore

from harnessrl.train.step import FLAT, FlatSteps

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _step(n: int, skipped: str | None) -> dict:
    return {"step": n, "skipped": skipped}


def test_a_streak_of_flat_steps_warns_once_naming_the_steps_and_the_remedies():
    watch = FlatSteps(after=3)
    said = [watch.see(_step(n, FLAT), 0.7, 4, dynamic=False) for n in range(1, 7)]
    assert said[:2] == [None, None] and said[3:] == [None, None, None]  # once a streak
    assert said[2] is not None and said[2].startswith("warning: steps 1-3 updated nothing")
    for remedy in ("--temperature (now 0.7)", "--group-size (now 4)", "--dynamic-sampling"):
        assert remedy in said[2]


def test_a_step_that_updates_or_has_nothing_to_train_ends_the_streak():
    watch = FlatSteps(after=2)
    assert watch.see(_step(1, FLAT), 1.0, 2, dynamic=True) is None
    assert watch.see(_step(2, None), 1.0, 2, dynamic=True) is None  # it updated
    assert watch.see(_step(3, FLAT), 1.0, 2, dynamic=True) is None
    assert watch.see(_step(4, "no training units"), 1.0, 2, dynamic=True) is None  # not a flat step
    assert watch.see(_step(5, FLAT), 1.0, 2, dynamic=True) is None
    warning = watch.see(_step(6, FLAT), 1.0, 2, dynamic=True)
    assert warning is not None and "steps 5-6" in warning
    assert "--dynamic-sampling" not in warning  # already on


class Unpassable(TextScore):
    """Every answer scores 0: every group is flat."""

    def families(self):
        say = super().families()["say"]
        return {"say": lambda rng: {**say(rng), "check": lambda env: {"answer": 0.0}}}


def test_the_trainer_warns_after_three_steps_without_an_update(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=400)
    config = BASE.replace(steps=3, eval_every=0)
    trainer = grpo_trainer(config, tmp_path / "run", suite=Unpassable(), specs=SPECS, progress=False, console=console)
    trainer.run()
    text = out.getvalue()
    assert "warning: steps 1-3 updated nothing" in text and "--temperature (now 1)" in text
