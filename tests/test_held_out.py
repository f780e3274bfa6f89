"""`harnessrl train grpo --eval-harnesses`: a harness evaluated with the trained ones and never
trained on, reported apart (mean, pass@k, pass^k) and paired task by task against the base
weights (the evaluation at step 0). The tiny model and the `textscore` suite of test_trainer."""

from __future__ import annotations

import pytest
from helpers import grpo_trainer, shrunk
from test_trainer import BASE, SPECS, TextScore, lines

from harnessrl.train.trainer import TrainError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HELD_OUT = shrunk(
    "xml-tags",
    system_prompt="Reply with any text.",
    max_steps=1,
    max_new_tokens=8,
    demonstrations=[],
    plain_text_answer=True,
)


def test_a_held_out_harness_is_evaluated_never_trained_and_paired_with_the_base(tmp_path):
    config = BASE.replace(steps=2, eval_every=2, eval_tasks=2, eval_attempts=2, eval_harnesses=["xml-tags"])
    trainer = grpo_trainer(
        config, tmp_path / "run", suite=TextScore(), specs=SPECS, eval_specs=[HELD_OUT], progress=False
    )
    trainer.run()
    steps = lines(tmp_path / "run" / "metrics.jsonl")
    assert all(s["harness"] != "xml-tags" and "xml-tags" not in s["shares"] for s in steps)
    evals = lines(tmp_path / "run" / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2]
    for e in evals:
        assert e["held_out"] == ["xml-tags"] and e["attempts"] == 2
        held = e["harnesses"]["xml-tags"]
        assert held["held_out"] and not e["harnesses"]["json-tools"]["held_out"]
        assert set(held["pass_at_k"]) == {"1", "2"} and set(held["pass_hat_k"]) == {"1", "2"}
        assert e["held_out_average"] == held["mean_score"]
        assert set(e["task_scores"]["xml-tags"]) == {"textscore/dev/00000", "textscore/dev/00001"}
    vs = evals[1]["harnesses"]["xml-tags"]["vs_base"]
    base, now = evals[0]["task_scores"]["xml-tags"], evals[1]["task_scores"]["xml-tags"]
    assert vs["n_tasks"] == 2
    assert vs["mean_difference"] == pytest.approx(sum(now[t] - base[t] for t in base) / 2)
    assert evals[0]["harnesses"]["xml-tags"]["vs_base"] is None
    assert "xml-tags" in trainer.record["harness_specs"]


def test_a_held_out_harness_must_not_be_trained_and_needs_evaluations(tmp_path):
    with pytest.raises(TrainError, match="also trained on"):
        grpo_trainer(
            BASE.replace(eval_harnesses=["json-tools"]),
            tmp_path / "a",
            suite=TextScore(),
            specs=SPECS,
            eval_specs=[SPECS[0]],
            progress=False,
        )
    with pytest.raises(TrainError, match="needs --eval-every"):
        grpo_trainer(
            BASE.replace(eval_every=0, eval_harnesses=["xml-tags"]),
            tmp_path / "b",
            suite=TextScore(),
            specs=SPECS,
            eval_specs=[HELD_OUT],
            progress=False,
        )
