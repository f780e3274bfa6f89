"""The evaluation folder: the one way a job writes a run folder of evaluated episodes.

`harnessrl eval`, a study's or improve's evaluation stages (jobs/stages.py) and SFT's sampling
(train/sft_sample.py) all write the same kind of folder, so `harnessrl summary`, `report`,
`triage` and `--from` read them alike:

    config.json     the evaluation record (`EvaluationFolder.record`), compared on resume
    run.db          the run database: every finished episode, and the record as its config
    summary.json    the per-harness summary, recomputed from run.db (`write_summary`)

The order is the same for every job:

    folder = EvaluationFolder(path, suite, split, model, tasks, specs, attempts, sampling, retries)
    folder.open(resume=...)           checks the folder against the record; writes nothing
    with folder:                      closes the run database at the end
        folder.start()                config.json, run.db, how the shell tool is isolated
        todo = folder.todo()          the episodes without a finished one in run.db
        folder.run(todo, policy, ...) each finished episode stored as it ends (None: the oracle)
        folder.summary()              summary.json

The folder itself is a `harnessrl.rundir.RunFolder` of kind "evaluation"; its errors are
`RunFolderError`s, which each job words as its own.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from harnessrl.metrics import HarnessSummary, harness_summary
from harnessrl.results import EvalSummary
from harnessrl.rundir import RunFolder
from harnessrl.store import RunStore

if TYPE_CHECKING:
    from harnessrl.executors import Executor
    from harnessrl.harness.spec import AnyHarnessSpec
    from harnessrl.models.base import Policy, SamplingParams
    from harnessrl.rollout import EpisodePolicies, Job
    from harnessrl.tasks.base import Task
    from harnessrl.types import Trajectory

SUMMARY = "summary.json"
KIND = "evaluation"  # the RunFolder kind, as messages name the run


def summaries(store: RunStore, attempts: int) -> dict[str, HarnessSummary]:
    """The per-harness summary of every harness in a run database."""
    return {
        h: harness_summary(list(store.trajectories(harness=h, with_tokens=False)), attempts) for h in store.harnesses()
    }


def write_summary(store: RunStore, config: dict[str, Any], folder: str | Path) -> EvalSummary:
    """summary.json of an evaluation run (its recorded `config`), recomputed from the database."""
    summary = EvalSummary(
        suite=config["suite"],
        split=config["split"],
        model=config["model"],
        seed=config["seed"],
        harnesses=summaries(store, config["attempts"]),
    )
    (Path(folder) / SUMMARY).write_text(json.dumps(summary.model_dump(), indent=2) + "\n", encoding="utf-8")
    return summary


class EvaluationFolder:
    """An evaluation run folder at `path`: `tasks` through every harness of `specs`, `attempts`
    times each, sampled with `sampling`, each attempt re-run up to `retries` times after an
    infrastructure error (see the module docstring for the order of the calls).

    `record` is what config.json records and a resume compares: the suite, split, model spec (and
    the name of its API key's variable, never the key), seed, tasks, attempts, sampling, harnesses,
    retries and judge. A job may add its own keys to it before `open` (eval: dtype, device,
    executor)."""

    def __init__(
        self,
        path: str | Path,
        suite: str,
        split: str,
        model: str,
        tasks: list[Task],
        specs: Sequence[AnyHarnessSpec],
        attempts: int,
        sampling: SamplingParams,
        retries: int,
        *,
        api_key_env: str | None = None,
        judge_model: str | None = None,
        judge_api_key_env: str | None = None,
    ):
        self.path = Path(path)
        self.tasks = list(tasks)
        self.specs = list(specs)
        self.attempts = attempts
        self.sampling = sampling
        self.retries = retries
        self.record: dict[str, Any] = {
            "suite": suite,
            "split": split,
            "model": model,
            "seed": sampling.seed,
            "tasks": len(self.tasks),
            "task_ids": [t.id for t in self.tasks],
            "attempts": attempts,
            "sampling": sampling.model_dump(),
            "harnesses": {s.name: s.to_dict() for s in self.specs},
            "max_retries": retries,
            "api_key_env": api_key_env,  # the variable's name only, never the key
            "judge_model": judge_model,
            "judge_api_key_env": judge_api_key_env,
        }
        self._folder: RunFolder | None = None
        self._store: RunStore | None = None

    # -- the folder ---------------------------------------------------------------------------------
    def open(self, *, resume: bool, may_differ: Sequence[str] = ()) -> EvaluationFolder:
        """Check the folder against the record (RunFolder.open: a fresh start into a run, a resume
        of none or with another record is refused, except the `may_differ` keys); writes nothing."""
        self._folder = RunFolder.open(self.path, KIND, self.record, resume=resume, may_differ=may_differ)
        return self

    @property
    def folder(self) -> RunFolder:
        """The opened run folder (its `config` is the record as config.json holds it)."""
        if self._folder is None:
            raise RuntimeError(f"{self.path}: open() the evaluation folder first")
        return self._folder

    def start(self) -> EvaluationFolder:
        """Write config.json, open the run database (the record as its config) and record how the
        shell commands of the episodes are isolated on this machine."""
        folder = self.folder
        folder.start()
        self._store = folder.store(meta_config=folder.config)
        folder.record_shell_isolation(self.specs, any(t.offers_shell for t in self.tasks))
        return self

    @property
    def store(self) -> RunStore:
        """The run database (after `start`)."""
        if self._store is None:
            raise RuntimeError(f"{self.path}: start() the evaluation folder first")
        return self._store

    def close(self) -> None:
        """Close the run database."""
        if self._folder is not None:
            self._folder.close()
        self._store = None

    def __enter__(self) -> EvaluationFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the episodes -------------------------------------------------------------------------------
    @cached_property
    def jobs(self) -> list[Job]:
        """Every episode of the evaluation: each task through each harness, once per attempt."""
        from harnessrl.rollout import make_jobs

        return make_jobs(self.tasks, self.specs, self.attempts)

    def todo(self) -> list[Job]:
        """The jobs without a finished episode in the run database yet."""
        return self.folder.todo(self.jobs)

    def run(
        self,
        todo: list[Job],
        policy: Policy | EpisodePolicies | None,
        max_in_flight: int,
        progress: bool,
        executor: Executor | None = None,
    ) -> None:
        """Run the jobs `todo` with `policy` (episodes where `executor` puts them, default in this
        process), `max_in_flight` at once, each finished episode stored as it ends. `policy` None:
        the oracle (harness/oracle.py), each episode replaying its own task's solution through its
        harness."""
        from harnessrl.rollout import Runner

        sampling = self.sampling
        if policy is None:
            from harnessrl.harness.oracle import Oracle
            from harnessrl.models.base import SamplingParams

            policy, sampling = Oracle(), SamplingParams()
        store = self.store
        store.set_meta("model", policy.describe())
        runner = Runner(
            policy,
            sampling,
            max_in_flight=max_in_flight,
            max_retries=self.retries,
            on_episode=store.add,
            progress=progress,
            executor=executor,
        )
        runner.run(todo)

    def summary(self) -> EvalSummary:
        """Write summary.json from the run database; returns it."""
        return write_summary(self.store, self.folder.config, self.path)

    def trajectories(self) -> list[Trajectory]:
        """The finished episodes of this evaluation's jobs in the run database (without tokens)."""
        wanted = {j.key for j in self.jobs}
        return [t for t in self.store.trajectories(with_tokens=False) if t.key in wanted]
