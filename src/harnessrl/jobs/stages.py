"""The stages of a multi-stage job in one folder: `harnessrl study`'s, which `harnessrl improve`
runs too.

Each stage is a run folder of its own under the job's folder (OUT/<stage>): evaluation stages are
ordinary evaluation run folders (`harnessrl summary`, `report`, `triage` read them), `collect` the
evolved harness's episodes on train tasks, `sft` and `placebo` the imitation adapters trained on
them (`train sft` into the seed harness). OUT/stages.json holds the stages that finished, with
their facts; a finished stage is read, not run again, and an interrupted one resumes with its own
resume. One model is kept loaded between stages that use it (`load`, `release`).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from pydantic import BaseModel

from harnessrl.errors import JobError
from harnessrl.rundir import STAGES_JSON, RunFolderError, as_json, holds_run, write_json

# A factory for tests and embedding: (stage, model spec) -> the policy to run that evaluation
# stage with, or None to load the model spec as usual. Stages: seed-eval, collect, cells/<cell>.
PolicyFactory = Callable[[str, str], Optional[Any]]


R = TypeVar("R")
F = TypeVar("F", bound=BaseModel)

if TYPE_CHECKING:
    from harnessrl.results import AdapterFacts, CollectFacts


class StageError(JobError):
    """A stage cannot go on: its run folder refuses the run, its model does not load, its stored
    episodes cannot be read, or its training fails; the message names the stage."""


class NothingToDistil(StageError):
    """The collection holds too few passing episodes for the imitation and placebo adapters (none,
    or all on one task); the message says how to collect more."""


class Stages:
    """The stages of the job in `out`. `config` carries the options the stages read (a
    `StudyConfig`: suite, model, device, temperature, seed, retries, max_in_flight, the collection's
    and SFT's options); `seed_spec` is the harness the adapters are trained into; `device` and
    `dtype` are resolved. `policy_factory(stage, model)` may hand a policy to an evaluation stage
    (tests use scripted policies); None loads `model` as usual."""

    def __init__(
        self,
        config: Any,
        out: str | Path,
        seed_spec: Any,
        device: Any,
        dtype: str,
        *,
        policy_factory: PolicyFactory | None = None,
        progress: bool = True,
        log: Callable[[str], None] = lambda message: None,
        console: Any = None,
    ):
        self.config = config
        self.out = Path(out)
        self.seed_spec = seed_spec
        self.device, self.dtype = device, dtype
        self.policy_factory = policy_factory
        self.progress, self.log, self.console = progress, log, console
        self._policy: tuple[str, Any] | None = None
        self.stages: dict[str, Any] = self.read()

    # -- the folder ------------------------------------------------------------------------------
    def training_started(self) -> bool:
        """Whether an adapter stage (sft, placebo) has finished or begun."""
        stages = self.read()
        return any(s in stages or holds_run(self.out / s) for s in ("sft", "placebo"))

    def read(self) -> dict[str, Any]:
        """stages.json as stored: the finished stages and their facts ({} before the first)."""
        import json

        path = self.out / STAGES_JSON
        if not path.is_file():
            return {}
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise StageError(f"{path} is not valid JSON ({e}); remove it to re-check every stage") from None
        return value if isinstance(value, dict) else {}

    def done(self, stage: str, **facts: Any) -> None:
        """`stage` finished, with its facts: recorded in stages.json at once (kept as JSON gives
        them back, so a resumed job reads what this one holds)."""
        self.stages[stage] = as_json(facts)
        write_json(self.out / STAGES_JSON, self.stages)

    def trained(
        self,
        stage: str,
        what: str,
        train: Callable[[Path, bool], R],
        errors: type[Exception] | tuple[type[Exception], ...],
        facts: Callable[[R], F],
        kind: type[F],
    ) -> F:
        """A training stage (its adapter in OUT/<stage>): its recorded facts (a `kind`) once it
        finished; otherwise the kept model is released (training loads its own), `train(path,
        resume)` runs (resumed when the folder holds a run), its `errors` become a StageError
        naming the stage, and `facts(result)` is recorded in stages.json."""
        if stage in self.stages:
            return kind.model_validate(self.stages[stage])
        self.release()
        self.log(f"{stage}: {what}")
        path = self.out / stage
        try:
            result = train(path, holds_run(path))
        except errors as e:
            raise StageError(f"{stage}: {e}") from None
        finally:
            gc.collect()
        self.done(stage, **facts(result).model_dump())
        return kind.model_validate(self.stages[stage])

    def evolved(
        self,
        stage: str,
        config: Any,
        *,
        run: bool = True,
        log: Callable[[str], None] | None = None,
        stop_when: Callable[[int], str | None] | None = None,
    ) -> tuple[dict[str, Any], Any]:
        """An evolution stage (OUT/<stage>, `run_evolve` with `config`): run, or resumed, unless it
        finished (or `run` is False), then read: its final.json and its best spec. `log` and
        `stop_when` go to run_evolve."""
        import json

        from harnessrl.evolve.loop import BEST, FINAL, EvolveError
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError
        from harnessrl.rundir import LOCK

        path = self.out / stage
        finished = (path / FINAL).is_file() and (path / LOCK).is_file()
        if run and not finished:
            from harnessrl.evolve.run import evolve_models, run_evolve
            from harnessrl.kernel import enter

            self.release()  # evolution loads its own copy of the model
            try:
                ctx = enter(
                    "evolve", config, path, resume=holds_run(path), models=evolve_models, error=EvolveError,
                    progress=self.progress, log=log or self.log,
                )  # fmt: skip
                run_evolve(ctx, stop_when)
            except EvolveError as e:
                raise StageError(f"{stage}: {e}") from None
        try:
            final = json.loads((path / FINAL).read_text(encoding="utf-8"))
            spec = load_harness(str(path / BEST))
        except (OSError, ValueError, SpecError) as e:
            raise StageError(f"{stage}: {path} holds no finished evolution ({e})") from None
        return final, spec

    # -- policies ----------------------------------------------------------------------------------
    def load(self, stage: str, model: str):
        """`model` loaded once (the last one loaded is kept for the next stage that needs it); the
        policy factory, when there is one, is asked first by `measure`."""
        if self._policy is not None and self._policy[0] == model:
            return self._policy[1]
        self.release()
        from harnessrl.models import load_policy
        from harnessrl.models.choice import is_local_spec

        local = is_local_spec(model)  # (a --collect-model may be a server)
        try:
            policy = load_policy(model, dtype=self.dtype, device=str(self.device)) if local else load_policy(model)
        except (ValueError, RuntimeError, OSError) as e:
            raise StageError(f"{stage}: cannot load model '{model}': {e}") from None
        self._policy = (model, policy)
        return policy

    def release(self) -> None:
        """Close the kept model (the next stage that needs one loads it again)."""
        if self._policy is not None:
            close = getattr(self._policy[1], "close", None)
            if close is not None:
                close()
            self._policy = None
            gc.collect()

    # -- evaluation stages ---------------------------------------------------------------------------
    def measure(self, stage: str, split: str, tasks: list, spec, model: str, attempts: int, may_differ=()) -> list:
        """Evaluate `spec` with `model` on `tasks` x `attempts` in the run folder OUT/<stage> (an
        ordinary evaluation run folder, resumed when it holds one); returns its trajectories."""
        from harnessrl.eval_folder import EvaluationFolder
        from harnessrl.models import ORACLE
        from harnessrl.models.base import SamplingParams

        c = self.config
        sampling = SamplingParams(temperature=c.temperature, seed=c.seed)
        path = self.out / stage
        evaluation = EvaluationFolder(path, c.suite, split, model, tasks, [spec], attempts, sampling, c.retries)
        with evaluation:
            try:
                evaluation.open(resume=holds_run(path), may_differ=may_differ).start()
            except RunFolderError as e:
                raise StageError(f"{stage}: {e}") from None
            todo, jobs = evaluation.todo(), evaluation.jobs
            if todo:
                self.log(
                    f"{stage}: {spec.name} x {model}, {len(todo)} episodes"
                    + (f" ({len(jobs) - len(todo)} already done)" if len(todo) < len(jobs) else "")
                )
                policy = self.policy_factory(stage, model) if self.policy_factory is not None else None
                if policy is None and model.strip() != ORACLE:
                    policy = self.load(stage, model)
                evaluation.run(todo, policy, c.max_in_flight, self.progress)  # policy None: the oracle
            evaluation.summary()
            return evaluation.trajectories()

    def stored(self, stage: str) -> list:
        """The trajectories of a finished evaluation stage, read without opening it as a run."""
        from harnessrl.store import RunStore, StoreError

        try:
            with RunStore(self.out / stage) as store:
                return list(store.trajectories(with_tokens=False))
        except (StoreError, OSError) as e:
            raise StageError(f"{stage}: cannot read its run database ({e})") from None

    def measured(self, stage: str, split: str, tasks: list, spec, model: str, attempts: int) -> list:
        """An evaluation stage's trajectories: measured (or resumed) once, then read."""
        if stage in self.stages and holds_run(self.out / stage):
            return self.stored(stage)
        trajectories = self.measure(stage, split, tasks, spec, model, attempts)
        self.done(stage, episodes=len(trajectories))
        return trajectories

    def collect(self, evolved) -> CollectFacts:
        """The evolved harness's episodes on the train tasks; refuses to go on when fewer than two
        tasks have a passing one (nothing to distil, or no placebo: it swaps answers across tasks)."""
        from harnessrl.results import CollectFacts

        c = self.config
        grown = self.stages.get("collect", {})
        if grown.get("tasks") == c.collect_tasks and grown.get("attempts") == c.collect_attempts:
            return CollectFacts.model_validate(grown)
        collector = c.collect_model or c.model
        from harnessrl.tasks import get_suite

        try:
            train_tasks = get_suite(c.suite).tasks("train", c.collect_tasks)
        except ValueError as e:
            raise StageError(f"collect: {e}") from None
        trajs = self.measure(
            "collect",
            "train",
            train_tasks,
            evolved,
            collector,
            c.collect_attempts,
            may_differ=("tasks", "task_ids", "attempts"),
        )
        passed = [t for t in trajs if not t.is_infra_error and t.grade is not None and t.grade.passed]
        tasks = sorted({t.task_id for t in passed})
        facts = CollectFacts(
            tasks=c.collect_tasks,
            attempts=c.collect_attempts,
            episodes=len(trajs),
            passed=len(passed),
            passed_tasks=len(tasks),
        )
        more = (
            f"resume with more attempts or tasks to collect more (the finished episodes are kept): --resume "
            f"--collect-attempts {c.collect_attempts * 2} or --collect-tasks {c.collect_tasks * 2}; or use a model "
            "that solves some train tasks (a new --out)"
        )
        where = (
            f"{len(trajs)} episodes of {evolved.name} with {collector} on {c.collect_tasks} {c.suite} train tasks "
            f"({c.collect_attempts} attempts each)"
        )
        if not passed:
            raise NothingToDistil(f"nothing to distil: none of the {where} passed; {more}")
        if len(tasks) < 2:
            raise NothingToDistil(
                f"only one task ({tasks[0]}) has a passing episode among the {where}; the placebo adapter swaps "
                f"answers across tasks and needs two; {more}"
            )
        self.done("collect", **facts.model_dump())
        return facts

    def sft(self, stage: str) -> AdapterFacts:
        """The distilled (stage sft) or placebo adapter: SFT on the collected episodes, re-rendered
        into the seed harness."""
        from harnessrl.kernel import enter
        from harnessrl.results import AdapterFacts, SFTResult
        from harnessrl.train.config import SFTConfig
        from harnessrl.train.sft import SFTError, run_sft

        if stage in self.stages:
            return AdapterFacts.model_validate(self.stages[stage])
        c = self.config
        sft_config = SFTConfig(
            from_runs=[str(self.out / "collect")],
            as_harness=c.seed_harness,
            model=c.model,
            device=c.device,
            dtype=self.dtype,
            placebo="shuffle-answers" if stage == "placebo" else "none",
            epochs=c.epochs,
            lr=c.lr,
            pack=c.pack,
            seed=c.seed,
        )

        def train(path: Path, resume: bool) -> SFTResult:
            ctx = enter(
                "train sft", sft_config, path, resume=resume, error=SFTError, progress=self.progress,
                console=self.console,
            )  # fmt: skip
            return run_sft(ctx, spec=self.seed_spec)

        def facts(summary: SFTResult) -> AdapterFacts:
            data = summary.data
            return AdapterFacts(
                folder=stage,
                adapter=f"{stage}/adapter",
                steps=summary.steps,
                examples=data.examples,
                episodes_replayed=data.replayed,
                episodes_dropped=sum(data.dropped.values()),
                final_loss=(summary.last or {}).get("loss"),
            )

        what = f"training the {'placebo' if stage == 'placebo' else 'distilled'} adapter"
        return self.trained(stage, what, train, SFTError, facts, AdapterFacts)

    def adapter_model(self, weights: str) -> str:
        """The model spec of `weights`: base (the configured model), distilled (the sft stage's
        adapter) or placebo."""
        if weights == "base":
            return self.config.model
        from harnessrl.models.spec import HF_PREFIX

        return HF_PREFIX + str(self.out / ("sft" if weights == "distilled" else "placebo") / "adapter")
