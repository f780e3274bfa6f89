"""The state of one `harnessrl improve` job (ImproveState: set up once by Improve.__init__, its run
fields by `begin`) and the functions every phase uses over it: the decisions (decisions.jsonl,
checked again on resume), the evaluation stages (`harnessrl.jobs.stages`, which `harnessrl study`
runs too), an evaluated cell and the adapters' model names."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from harnessrl.improve.config import DECISIONS, ImproveConfig, ImproveError
from harnessrl.results import Decision
from harnessrl.rundir import RunFolder, append_jsonl, as_json

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.jobs.stages import Stages
    from harnessrl.tasks.base import Suite, Task


@dataclass
class ImproveState:
    """Everything the phases of one job read. The fields up to `folder` are set by Improve.__init__
    (its checks resolved them: the device, the specs, the suite and its tasks, the opened run folder)
    and never change; `runner`, `recorded` and `decisions` belong to one run and are set by `begin`
    (`decide` appends to the last two). What a phase produces it returns: nothing else is stored here."""

    config: ImproveConfig
    out: Path
    progress: bool
    log: Callable[[str], None]
    console: Console | None
    device: torch.device
    dtype: str
    seed_spec: HarnessSpec
    given: HarnessSpec | None  # --evolved, loaded; None: the harness phase evolves (or keeps) the seed
    suite: Suite
    dev_tasks: list[Task]
    test_tasks: list[Task]
    content_pool: list[Task]  # the --content-tasks train tasks the content phase triages
    folder: RunFolder
    runner: Stages | None = None  # the stages rooted at OUT (None until `begin`)
    # decisions.jsonl's lines by key, as read back: JSON whose evidence is free-form per decision
    recorded: dict[str, dict[str, Any]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)  # taken in this run, in order


@dataclass(frozen=True)
class Cell:
    """One evaluated cell: the stage folder it was measured in, its harness and model, and
    `study_analysis.cell_analysis` of its episodes (`record`: the JSON summary; `scores`: per task)."""

    folder: str
    harness_name: str
    model: str
    record: dict[str, Any]  # cell_analysis's JSON record, written into decisions.jsonl and improve.json as it is
    scores: dict[str, float]


def begin(state: ImproveState) -> None:
    """Start a run of the job: the run folder started, the stage runner made and the decisions
    already recorded in decisions.jsonl read back (a resume checks each against its recomputation)."""
    try:
        state.folder.start()
    except OSError as e:
        raise ImproveError(f"cannot write {state.out}: {e}") from None
    state.runner = stage_runner(state, state.out)
    state.recorded = {}
    path = state.out / DECISIONS
    if path.is_file():
        for text in path.read_text(encoding="utf-8").splitlines():
            if text.strip():
                line = json.loads(text)
                state.recorded[line["key"]] = line
    state.decisions = []


def decide(state: ImproveState, key: str, phase: str, choice: Any, evidence: dict[str, Any]) -> Decision:
    """Record a decision (one line of decisions.jsonl); on resume, the recorded one, which the
    recomputed choice must equal. `choice` is free-form JSON (a word, or a list of task ids)."""
    line = as_json({"key": key, "phase": phase, "choice": choice, "evidence": evidence})
    old = state.recorded.get(key)
    if old is not None:
        if old["choice"] != line["choice"]:
            raise ImproveError(
                f"--resume reached another decision for {key} than the run in {state.out} "
                f"({old['choice']!r} then, {line['choice']!r} now): a stage folder changed; start a new --out"
            )
        line = old
    else:
        append_jsonl(state.out / DECISIONS, line)
        state.recorded[key] = line
    decision = Decision.model_validate(line)
    state.decisions.append(decision)
    state.log(f"{phase}: {key} = {decision.choice}")
    return decision


def stage_runner(state: ImproveState, root: Path, evolved: str | None = None) -> Stages:
    """The stage runner rooted at `root`, `evolved` the evolved harness's spec file."""
    from harnessrl.jobs.study import StudyConfig

    c = state.config
    study = StudyConfig(
        suite=c.suite,
        seed_harness=c.seed_harness,
        evolved=evolved,
        model=c.model,
        device=c.device,
        dtype=state.dtype,
        dev_tasks=c.dev_tasks,
        collect_model=c.collect_model,
        collect_tasks=c.collect_tasks,
        collect_attempts=c.collect_attempts,
        epochs=c.epochs,
        lr=c.lr,
        test_tasks=c.test_tasks,
        attempts=c.attempts,
        temperature=c.temperature,
        seed=c.seed,
        max_in_flight=c.max_in_flight,
        retries=c.retries,
    )
    from harnessrl.jobs.stages import Stages

    return Stages(
        study,
        root,
        state.seed_spec,
        state.device,
        state.dtype,
        progress=state.progress,
        log=state.log,
        console=state.console,
    )


def running(state: ImproveState) -> Stages:
    """The run's stage runner (made by `begin`)."""
    if state.runner is None:
        raise RuntimeError("the improve job's stages are used before begin(state) made them")
    return state.runner


def release(state: ImproveState) -> None:
    """Free the model the stage runner holds (before a stage that loads its own, and at the end)."""
    if state.runner is not None:
        state.runner.release()


def cell(state: ImproveState, stage: str, split: str, tasks: list[Task], spec: HarnessSpec, model: str) -> Cell:
    """An evaluation stage and its analysis (study_analysis.cell_analysis)."""
    from harnessrl.jobs.study_analysis import cell_analysis

    trajectories = running(state).measured(stage, split, tasks, spec, model, state.config.attempts)
    analysis = cell_analysis(trajectories, state.config.attempts)
    return Cell(folder=stage, harness_name=spec.name, model=model, record=analysis["record"], scores=analysis["scores"])


def adapter_model(state: ImproveState, adapter: str) -> str:
    """The model name of the adapter in OUT/`adapter`: absolute, so a resume from elsewhere names the same model."""
    return "hf:" + str((state.out / adapter).resolve())
