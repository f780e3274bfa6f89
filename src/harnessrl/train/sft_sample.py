"""Rejection sampling for `harnessrl train sft --sample N`: new episodes to learn from.

    plan_sampling(config, selection, target)   the tasks (those the --from runs name, else the
                                               first --sample-tasks of --sample-split), the
                                               harness, checks, and the sampling run folder
                                               OUT/samples opened (nothing written yet)
    run_samples(plan, policy)                  N attempts per task through the runner into
                                               OUT/samples (only the attempts it lacks)
    best_attempts(trajectories, tasks, ...)    per task, the best-scoring attempt (the first of
                                               equal scores), kept when it passes the selection

OUT/samples is an evaluation run folder (config.json with the record `harnessrl eval` writes,
run.db, summary.json): `harnessrl report` reads it, `--from OUT/samples` selects from it, and a
fine-tuning run that stopped or was refused after sampling continues it on the next start, with
the same options; other options there are refused.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.eval_folder import EvaluationFolder
from harnessrl.harness.spec import HarnessSpec
from harnessrl.rundir import RunFolderError, holds_run
from harnessrl.train.config import SAMPLE_SPLIT, SFTConfig
from harnessrl.train.sft_data import EpisodeSelection, SFTError
from harnessrl.types import Trajectory

SAMPLES_DIR = "samples"
DEFAULT_TEMPERATURE = 0.7
MAX_IN_FLIGHT = 16  # episodes in flight, as `harnessrl eval`'s default
MAX_RETRIES = 2  # re-runs of an attempt after an infrastructure error, as `harnessrl eval`'s default


@dataclass
class SamplingPlan:
    tasks: list  # harnessrl.tasks.base.Task
    spec: HarnessSpec
    attempts: int
    folder: EvaluationFolder  # sampled with the plan's sampling parameters
    path: Path


def sampling_suite(config: SFTConfig, selection: EpisodeSelection | None) -> str:
    """The suite whose tasks are sampled: the --from runs', else --sample-suite (the options
    themselves were checked by SFTConfig.refusal)."""
    if selection is None:
        assert config.sample_suite is not None
        return config.sample_suite
    if config.sample_suite is not None and config.sample_suite != selection.suite:
        raise SFTError(
            f"--sample-suite {config.sample_suite}: the --from runs hold episodes of suite {selection.suite}"
        )
    return selection.suite


def check_sampling_harness(tasks: list, sampler: HarnessSpec, target: HarnessSpec) -> None:
    """Both harnesses can set every task up, and every tool an attempt in `sampler` can call
    is one the target offers for that task (helper tools and memory notes excepted: the replay
    expands or drops those), so a sampled episode can always be replayed in the target."""
    from harnessrl.harness.loops import Episode, InfraError

    helpers = {h.name for h in sampler.capabilities.helper_tools} | {"remember"}
    for task in tasks:
        offered: dict[str, set[str]] = {}
        for role, spec in (("--sample-harness", sampler), ("the target harness", target)):
            try:
                episode = Episode(task, spec, 0)
            except InfraError as e:
                raise SFTError(f"{role} {spec.name} cannot run task {task.id}: {e}") from None
            offered[role] = {t.name for t in episode.tools}
            episode.env.close()
        missing = sorted(offered["--sample-harness"] - offered["the target harness"] - helpers)
        if missing:
            raise SFTError(
                f"--sample-harness {sampler.name} offers {', '.join(missing)} for task {task.id}, which the target "
                f"harness {target.name} does not: its episodes could not be replayed there"
            )


def plan_sampling(
    config: SFTConfig, selection: EpisodeSelection | None, target: HarnessSpec, out: str | os.PathLike[str]
) -> SamplingPlan:
    """Everything --sample needs, checked; the sampling run folder opened (not written)."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import SpecError, require_loop_harness
    from harnessrl.models.base import SamplingParams
    from harnessrl.tasks import get_suite

    assert config.sample is not None
    suite_name = sampling_suite(config, selection)
    try:
        suite = get_suite(suite_name)
        if selection is not None:
            tasks = [suite.task(task_id) for task_id in selection.task_ids]
        else:
            tasks = suite.tasks(config.sample_split or SAMPLE_SPLIT, config.sample_tasks)
    except (ValueError, IndexError) as e:
        raise SFTError(f"--sample: the tasks cannot be built ({e})") from None
    if not tasks:
        raise SFTError("--sample: no task to sample")
    if config.sample_harness is None:
        spec = target
    else:
        try:
            purpose = "sampling for training (its tool calls are replayed in the target harness)"
            spec = require_loop_harness(load_harness(config.sample_harness), purpose)
        except SpecError as e:
            raise SFTError(f"--sample-harness: {e}") from None
    check_sampling_harness(tasks, spec, target)
    temperature = DEFAULT_TEMPERATURE if config.sample_temperature is None else config.sample_temperature
    sampling = SamplingParams(temperature=temperature, seed=config.seed)
    splits = sorted({t.split for t in tasks})
    # the record `harnessrl eval` writes, so that the folder is an evaluation run
    split = splits[0] if len(splits) == 1 else ",".join(splits)
    path = Path(out).expanduser() / SAMPLES_DIR
    folder = EvaluationFolder(
        path, suite_name, split, config.model, tasks, [spec], config.sample, sampling, MAX_RETRIES
    )
    try:
        folder.open(resume=holds_run(path))
    except RunFolderError as e:
        if holds_run(path):
            raise SFTError(
                f"--sample: {path} holds attempts sampled with other options: remove it to sample again, or give "
                f"the same options ({e})"
            ) from None
        raise SFTError(f"--sample: {e}") from None
    return SamplingPlan(tasks, spec, config.sample, folder, path)


def run_samples(plan: SamplingPlan, policy, progress: bool = True, say=lambda text: None) -> list[Trajectory]:
    """The attempts of the plan still missing from its folder, through the runner; returns
    every attempt in the folder. Writes summary.json as `harnessrl eval` does."""
    folder = plan.folder
    with folder:
        try:
            folder.start()
        except RunFolderError as e:
            raise SFTError(f"--sample: {e}") from None
        todo = folder.todo()
        say(
            f"sampling {len(todo)} of {len(folder.jobs)} attempts ({plan.attempts} per task, {len(plan.tasks)} "
            f"tasks, {plan.spec.name}) into {plan.path}"
        )
        if todo:
            folder.run(todo, policy, MAX_IN_FLIGHT, progress)
        folder.summary()
        return list(folder.store.trajectories(harness=plan.spec.name, with_tokens=False))


def best_attempts(
    trajectories: list[Trajectory], tasks: list, min_score: float | None
) -> tuple[list[Trajectory], dict[str, dict[str, Any]]]:
    """Per task (in the order of `tasks`), its best-scoring attempt (the lowest attempt of equal
    scores), kept when it passes (or scores >= min_score). Returns the kept episodes and, per
    task, what happened: the attempts, the best score, the episode kept or why none was."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)
    kept: list[Trajectory] = []
    report: dict[str, dict[str, Any]] = {}
    for task in tasks:
        tries = sorted(by_task.get(task.id, []), key=lambda t: t.attempt)
        graded = [(t, t.grade) for t in tries if not t.is_infra_error and t.grade is not None]
        entry: dict[str, Any] = {"attempts": len(tries), "infra_errors": len(tries) - len(graded)}
        report[task.id] = entry
        if not graded:
            entry.update(kept=None, why="every attempt ended in an infrastructure error")
            continue
        best, grade = max(graded, key=lambda pair: pair[1].score)  # max keeps the first of equal scores
        entry["best_score"] = grade.score
        meets = grade.passed if min_score is None else grade.score >= min_score - 1e-9
        if not meets:
            what = "passes" if min_score is None else f"scores >= {min_score:g}"
            entry.update(kept=None, why=f"no attempt {what} (best score {grade.score:.2f})")
            continue
        entry.update(kept=best.episode_id, attempt=best.attempt)
        kept.append(best)
    return kept, report
