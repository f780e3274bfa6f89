"""What every phase of the job shares: the decisions (decisions.jsonl, checked again on resume),
the evaluation stages (`harnessrl.jobs.stages`, which `harnessrl study` runs too) and the attributes the job sets up."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from harnessrl.improve.config import DECISIONS, ImproveConfig, ImproveError
from harnessrl.results import Decision
from harnessrl.rundir import RunFolder, append_jsonl, as_json


class JobBase:
    """The state of one `harnessrl improve` job (set by Improve.__init__ and Improve.run) and the
    methods every phase uses: decisions, evaluation stages and their analysis."""

    config: ImproveConfig
    out: Path
    resume: bool
    progress: bool
    log: Callable[[str], None]
    console: Any
    device: Any
    dtype: str
    seed_spec: Any
    given: Any
    suite: Any
    dev_tasks: list
    test_tasks: list
    content_pool: list
    folder: RunFolder
    runner: Any
    recorded: dict[str, dict[str, Any]]
    decisions: list[Decision]
    evolved_is_seed: bool

    # -- the folder: stages and decisions --------------------------------------------------------------
    def decide(self, key: str, phase: str, choice: Any, evidence: dict[str, Any]) -> Decision:
        """Record a decision (one line of decisions.jsonl); on resume, the recorded one, which the
        recomputed choice must equal."""
        line = as_json({"key": key, "phase": phase, "choice": choice, "evidence": evidence})
        old = self.recorded.get(key)
        if old is not None:
            if old["choice"] != line["choice"]:
                raise ImproveError(
                    f"--resume reached another decision for {key} than the run in {self.out} "
                    f"({old['choice']!r} then, {line['choice']!r} now): a stage folder changed; start a new --out"
                )
            line = old
        else:
            append_jsonl(self.out / DECISIONS, line)
            self.recorded[key] = line
        decision = Decision.model_validate(line)
        self.decisions.append(decision)
        self.log(f"{phase}: {key} = {decision.choice}")
        return decision

    # -- evaluation stages ----------------------------------------------------------------------------
    def _stages(self, root: Path, evolved: str | None = None):
        """The stage runner rooted at `root`, `evolved` the evolved harness's spec file."""
        from harnessrl.jobs.study import StudyConfig

        c = self.config
        study = StudyConfig(
            suite=c.suite,
            seed_harness=c.seed_harness,
            evolved=evolved,
            model=c.model,
            device=c.device,
            dtype=self.dtype,
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
            self.seed_spec,
            self.device,
            self.dtype,
            progress=self.progress,
            log=self.log,
            console=self.console,
        )

    def _release(self) -> None:
        if self.runner is not None:
            self.runner.release()

    def _cell(self, stage: str, split: str, tasks: list, spec, model: str) -> dict[str, Any]:
        """An evaluation stage and its analysis (study_analysis.cell_analysis)."""
        from harnessrl.jobs.study_analysis import cell_analysis

        trajectories = self.runner.measured(stage, split, tasks, spec, model, self.config.attempts)
        analysis = cell_analysis(trajectories, self.config.attempts)
        return {**analysis, "folder": stage, "harness_name": spec.name, "model": model}

    def _adapter_model(self, adapter: str) -> str:
        return "hf:" + str((self.out / adapter).resolve())  # absolute: a resume from elsewhere names the same model
