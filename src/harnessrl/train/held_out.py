"""Periodic evaluation of a training run under its harnesses and the ones it never trains on.

HarnessBandit's published claim is about transfer to a NEW harness. So every trainer of ours
(`harnessrl train grpo --eval-harnesses`, and TRL through `HarnessRollout(eval_harnesses=...)`)
evaluates, every few steps, the same dev tasks under the trained harnesses and the held-out ones,
with `attempts` attempts per task, and reports:

    per harness       mean score, pass@k and pass^k for k = 1 .. attempts (harness_summary)
    vs_base           the paired difference, task by task, against the run's first evaluation
                      (step 0: the base weights, LoRA being the identity when it starts), with
                      its bootstrap interval (metrics.paired_difference)
    average           over the trained harnesses; held_out_average over the held-out ones

For the pairing to compare weights and not luck, every evaluation of a run must sample with the
same seed (`evaluation_seed(seed)`) and the request seeds of the runner (a function of that seed,
the task, the attempt and the turn): the base and a later evaluation then play the same tasks,
attempts and turns with the same random numbers. `harnessrl train grpo` (harnessrl.train.trainer)
and HarnessRollout (harnessrl.integrations.trl) both do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from harnessrl.harness.spec import AnyHarnessSpec
from harnessrl.metrics import harness_summary, paired_difference, task_scores
from harnessrl.results import HarnessEvalScores, TrainEval
from harnessrl.rollout import Job, make_jobs
from harnessrl.tasks.base import Task
from harnessrl.types import Trajectory


def evaluation_seed(seed: int) -> int:
    """The sampling seed of every evaluation of a run of seed `seed` (the base's, step 0's)."""
    from harnessrl.train.step import sampling_seed

    return sampling_seed(seed, 0, "eval")


def evaluation_jobs(tasks: list[Task], specs: Sequence[AnyHarnessSpec], attempts: int) -> list[Job]:
    """tasks x harnesses x attempts (attempts 0 .. attempts-1: the same in every evaluation)."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    return make_jobs(tasks, list(specs), attempts)


def summarize_evaluation(
    trajectories: list[Trajectory],
    trained: Sequence[str],
    held_out: Sequence[str],
    *,
    step: int,
    tasks: int,
    attempts: int,
    temperature: float,
    sampling_seed: int | None,
    base: TrainEval | None,
    seconds: float,
) -> TrainEval:
    """One evaluation's record from its episodes; `base` is the run's first evaluation (None: this is it)."""
    names = [*trained, *held_out]
    harnesses: dict[str, HarnessEvalScores] = {}
    scores_by_harness: dict[str, dict[str, float]] = {}
    delivery: dict[str, float | None] = {}
    for h in names:
        mine = [t for t in trajectories if t.harness == h]
        summary = harness_summary(mine, attempts)
        scores = task_scores(mine)
        scores_by_harness[h] = scores
        delivery[h] = summary.delivery_rate
        before = None if base is None else base.task_scores.get(h)
        harnesses[h] = HarnessEvalScores(
            held_out=h in held_out,
            tasks=summary.n_tasks,
            mean_score=summary.mean_score,
            pass_at_k=dict(summary.pass_at_k),
            pass_hat_k=dict(summary.pass_hat_k),
            vs_base=None if before is None else paired_difference(before, scores),
        )
    return TrainEval(
        step=step,
        temperature=temperature,
        sampling_seed=sampling_seed,
        tasks=tasks,
        mean_score={h: v.mean_score for h, v in harnesses.items()},
        pass_at_1={h: v.pass_at_k.get("1") for h, v in harnesses.items()},
        delivery_rate=delivery,
        average=_mean([harnesses[h].mean_score for h in trained]),
        seconds=seconds,
        attempts=attempts,
        held_out=list(held_out),
        held_out_average=_mean([harnesses[h].mean_score for h in held_out]),
        harnesses=harnesses,
        task_scores=scores_by_harness,
    )


def run_evaluation(
    runner,
    tasks: list[Task],
    trained: Sequence[AnyHarnessSpec],
    held_out: Sequence[AnyHarnessSpec],
    *,
    step: int,
    attempts: int,
    base: TrainEval | None,
) -> TrainEval:
    """Play the evaluation with `runner` (its sampling as set by the caller) in this process."""
    started = time.perf_counter()
    trajectories = runner.run(evaluation_jobs(tasks, [*trained, *held_out], attempts))
    return summarize_evaluation(
        trajectories,
        [s.name for s in trained],
        [s.name for s in held_out],
        step=step,
        tasks=len(tasks),
        attempts=attempts,
        temperature=runner.sampling.temperature,
        sampling_seed=runner.sampling.seed,
        base=base,
        seconds=time.perf_counter() - started,
    )


def check_held_out(trained: Sequence[str], held_out: Sequence[str]) -> None:
    """Harness names are unique among the trained and among the held-out ones, and a held-out
    harness is never trained on."""
    if len(set(trained)) != len(trained):
        raise ValueError(f"harness names must be unique, got {list(trained)}")
    both = sorted(set(trained) & set(held_out))
    if both:
        raise ValueError(f"held-out harness(es) {', '.join(both)} are also trained on: a held-out harness is never")
    if len(set(held_out)) != len(held_out):
        raise ValueError(f"held-out harness names must be unique, got {list(held_out)}")


def first_evaluation(path: Path) -> TrainEval | None:
    """The step-0 line of an eval.jsonl (the base every later evaluation pairs with), if it is there."""
    if not path.is_file():
        return None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("step") == 0:
            return TrainEval.model_validate(data)
    return None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
