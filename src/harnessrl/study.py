"""The harness x weights study as one resumable job: `Study(StudyConfig(...), out).run()`.

The question it answers: of what an evolved harness gains, what belongs in the harness (it fixes
process failures at run time), what can be trained into the weights (content the model learns
from the evolved harness's passing episodes), and what does not distil (gains that vanish when
the weights trained on them run under the seed harness again).

    seed-eval   the seed harness on dev tasks (context for the reader; --seed-eval-tasks 0 skips it)
    evolve      `run_evolve` from the seed harness (skipped with --evolved SPEC): its best spec
                is the evolved harness
    collect     the evolved harness on TRAIN tasks with the base model, --collect-attempts per
                task (rejection sampling: SFT keeps the passing episodes)
    sft         `run_sft` on those episodes re-rendered into the SEED harness: the distilled adapter
    placebo     the same with the final answers shuffled across tasks: the placebo adapter
    cells       TEST tasks x --attempts in 5 cells: {seed, evolved} x {base, distilled} and
                seed x placebo
    study.json  the cells, paired differences by task, failure-class effects, the recommendation
                (computed in harnessrl.study_analysis, which this module re-exports)

Every stage is a run folder of its own under OUT (OUT/seed-eval, OUT/evolve, OUT/collect, OUT/sft,
OUT/placebo, OUT/cells/<cell>); the evaluation stages are ordinary evaluation run folders
(`harnessrl summary`, `report`, `triage` read them). OUT/config.json holds the study's
configuration (and the harness specs it resolved), OUT/stages.json the stages that finished.
`--resume` skips finished stages and resumes the interrupted one with its own resume; a changed
configuration is refused, except that --collect-tasks and --collect-attempts may grow while no
adapter has been trained (the way out when nothing passed on the train tasks), and that with
--evolved the evolution's options are not recorded (they play no part).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import Field, model_validator

from harnessrl.config import Device, FloatDtype, Options, cli
from harnessrl.rundir import RunFolder, RunFolderError, holds_run, write_json
from harnessrl.study_analysis import CELLS, COMPARISONS, cell_analysis, class_effects, compare_cells, recommend, verdict

STUDY_JSON = "study.json"
STAGES_JSON = "stages.json"

# The options only the evolution stage uses.
EVOLVE_OPTIONS = ("dev_tasks", "rollouts", "iterations", "candidates")
# Keys of the study's configuration that may grow on --resume while no adapter has been trained.
GROWABLE = ("collect_tasks", "collect_attempts")

# A factory for tests and embedding: (stage, model spec) -> the policy to run that evaluation
# stage with, or None to load the model spec as usual. Stages: seed-eval, collect, cells/<cell>.
PolicyFactory = Callable[[str, str], Optional[Any]]


class StudyError(ValueError):
    """A study cannot go on as asked (bad options, a refused resume, nothing to distil); the CLI
    exits 2 with the message."""


class StudyConfig(Options):
    """`harnessrl study`: every option, declared once (OUT/config.json records them)."""

    suite: str = Field("toolcalc", description="suite: dev tasks evolve, train tasks are distilled, test tasks judge")
    seed_harness: str = Field("react", description="built-in harness name or spec path to start from")
    evolved: Optional[str] = Field(
        None,
        description="the evolved harness (name or spec path): skips the evolution (default: evolve the seed)",
    )
    model: str = Field(
        "smollm2-135m", description="the base model (a local one, it is fine-tuned): tiny-random, smollm2-135m, hf:PATH"
    )
    device: Device = "auto"
    dtype: FloatDtype = "auto"
    seed_eval_tasks: int = Field(4, ge=0, description="first N dev tasks the seed harness is evaluated on (0 = skip)")
    dev_tasks: int = Field(4, ge=2, description="evolve: first N dev tasks (decision tasks)")
    rollouts: int = Field(2, ge=1, description="evolve: attempts per task in every measurement")
    iterations: int = Field(2, ge=1, description="evolve: search iterations")
    candidates: int = Field(2, ge=1, description="evolve: candidates proposed and measured per iteration")
    collect_model: Optional[str] = Field(
        None,
        description="the model that collects the train episodes (default: --model; `oracle` replays each task's "
        "known solution; any spec `harnessrl eval` takes, e.g. a stronger openai:MODEL@URL)",
    )
    collect_tasks: int = Field(8, ge=1, description="first N train tasks the evolved harness collects episodes on")
    collect_attempts: int = Field(
        4, ge=1, description="attempts per train task (rejection sampling: the passing ones are distilled)"
    )
    epochs: int = Field(3, ge=1, description="SFT: passes over the examples (distilled and placebo adapters)")
    lr: float = Field(2e-4, gt=0, allow_inf_nan=False, description="SFT: AdamW learning rate of the LoRA weights")
    test_tasks: int = Field(
        8, ge=1, description="first N test tasks (held out): the cells, and evolve's confirmation run"
    )
    attempts: int = Field(
        2,
        ge=1,
        description="attempts per task in the cells and the seed evaluation",
        json_schema_extra=cli("--attempts", "-k"),
    )
    temperature: float = Field(0.7, ge=0.0, le=5.0, description="the agent's sampling temperature (0 = greedy)")
    seed: int = Field(0, description="seed of sampling, evolution, LoRA init and example order")
    max_in_flight: int = Field(16, ge=1, description="episodes in flight (generation batch size)")
    retries: int = Field(2, ge=0, description="re-runs of an episode after an infrastructure error")

    @model_validator(mode="after")
    def _local_model(self) -> StudyConfig:
        from harnessrl.models import MODEL_NAMES, ModelSpec

        if ModelSpec.parse_local(self.model) is None:
            raise ValueError(
                f"'{self.model}' cannot be fine-tuned: the study needs a local model "
                f"({', '.join(MODEL_NAMES)} or hf:PATH)"
            )
        return self


def study_result(
    config: StudyConfig,
    analyses: dict[str, dict[str, Any]],
    cells_meta: dict[str, dict[str, Any]],
    context: dict[str, Any],
) -> dict[str, Any]:
    """study.json: the study's configuration and context, the cells, and their analysis
    (`compare_cells`: the paired differences, the content-failure share before and after, the
    failure-class effects and the recommendation)."""
    return {
        "suite": config.suite,
        "model": config.model,
        "config": config.model_dump(),
        **context,
        "cells": {name: {**cells_meta[name], **analyses[name]["record"]} for name in CELLS},
        **compare_cells(analyses, seed=config.seed, evolved_is_seed=context.get("evolved_is_seed", False)),
    }


# ------------------------------------------------------------------------------------ the job


class Study:
    """`Study(config, out, resume=...)` checks everything cheap and raises StudyError (nothing is
    written); `run()` runs the stages that have not finished and returns study.json's content.

    `policy_factory(stage, model)` may hand a policy to an evaluation stage (tests use scripted
    policies); None loads `model` as usual."""

    def __init__(
        self,
        config: StudyConfig,
        out: str | Path,
        *,
        resume: bool = False,
        policy_factory: PolicyFactory | None = None,
        progress: bool = True,
        log: Callable[[str], None] = lambda message: None,
        console=None,
    ):
        from harnessrl.evolve.config import evolution_of
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError, require_loop_harness
        from harnessrl.models import check_spec
        from harnessrl.tasks import get_suite

        self.config = config
        self.out = Path(out)
        self.resume = resume
        self.policy_factory = policy_factory
        self.progress = progress
        self.log = log
        self.console = console
        c = config
        try:
            from harnessrl.models.device import resolve_device, resolve_dtype

            # a device this machine lacks: refused before any work; auto resolved once, for every stage
            self.device = resolve_device(c.device)
            self.dtype = resolve_dtype(c.dtype, self.device)
            check_spec(c.model, option="--model")
            if c.collect_model is not None:
                check_spec(c.collect_model, option="--collect-model", oracle=True)
            purpose = "the study (evolve, then re-render conversations)"
            self.seed_spec = require_loop_harness(load_harness(c.seed_harness), purpose)
            self.given_evolved = (
                require_loop_harness(load_harness(c.evolved), purpose) if c.evolved is not None else None
            )
            suite = get_suite(c.suite)
            self.seed_eval_tasks = suite.tasks("dev", c.seed_eval_tasks) if c.seed_eval_tasks else []
            self.train_tasks = suite.tasks("train", c.collect_tasks)
            self.test_tasks = suite.tasks("test", c.test_tasks)
            if c.evolved is None:
                suite.tasks("dev", c.dev_tasks)
                self.evolve_config = evolution_of(c, self.dtype)
        except (SpecError, ValueError) as e:
            raise StudyError(str(e)) from None
        # with --evolved the evolution's options play no part: left out, so they may change on --resume
        unused = EVOLVE_OPTIONS if c.evolved is not None else ()
        # the device is recorded as it resolved and may differ on resume (float rounding only);
        # the dtype as it resolved, only when it is not float32 (studies from before the option
        # resume as they were, and a float32 study is not continued in bfloat16 unnoticed)
        unused = (*unused, "device", "dtype")
        self.record = {
            **{k: v for k, v in config.model_dump().items() if k not in unused},
            "device": str(self.device),
            **({"dtype": self.dtype} if self.dtype != "float32" else {}),
            "seed_spec": self.seed_spec.to_dict(),
            "evolved_spec": None if self.given_evolved is None else self.given_evolved.to_dict(),
        }
        growable = resume and not self._training_started()
        try:
            self.folder = RunFolder.open(
                self.out,
                "study",
                self.record,
                resume=resume,
                may_differ=(*GROWABLE, "device") if growable else ("device",),
            )
            if growable:
                old = self.folder.stored_config()
                for key in GROWABLE:
                    if old.get(key) is not None and self.record[key] < old[key]:
                        raise StudyError(
                            f"--{key.replace('_', '-')} may only grow on --resume ({old[key]} -> {self.record[key]}): "
                            "the episodes already collected stay in the collection; start a new --out to use fewer"
                        )
        except RunFolderError as e:
            raise StudyError(str(e)) from None
        self._policy: tuple[str, Any] | None = None
        self.stages: dict[str, Any] = {}

    # -- the folder ------------------------------------------------------------------------------
    def _training_started(self) -> bool:
        stages = self._read_stages()
        return any(s in stages or holds_run(self.out / s) for s in ("sft", "placebo"))

    def _read_stages(self) -> dict[str, Any]:
        import json

        path = self.out / STAGES_JSON
        if not path.is_file():
            return {}
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise StudyError(f"{path} is not valid JSON ({e}); remove it to re-check every stage") from None
        return value if isinstance(value, dict) else {}

    def _done(self, stage: str, **facts: Any) -> None:
        self.stages[stage] = facts
        write_json(self.out / STAGES_JSON, self.stages)

    # -- policies ----------------------------------------------------------------------------------
    def _load(self, stage: str, model: str):
        """`model` loaded once (the last one loaded is kept for the next stage that needs it); the
        policy factory, when there is one, is asked first by `_measure`."""
        if self._policy is not None and self._policy[0] == model:
            return self._policy[1]
        self._release()
        from harnessrl.models import ModelSpec, load_policy

        local = ModelSpec.parse_local(model) is not None  # (a --collect-model may be a server)
        try:
            policy = load_policy(model, dtype=self.dtype, device=str(self.device)) if local else load_policy(model)
        except (ValueError, RuntimeError, OSError) as e:
            raise StudyError(f"{stage}: cannot load model '{model}': {e}") from None
        self._policy = (model, policy)
        return policy

    def _release(self) -> None:
        if self._policy is not None:
            close = getattr(self._policy[1], "close", None)
            if close is not None:
                close()
            self._policy = None
            gc.collect()

    # -- evaluation stages ---------------------------------------------------------------------------
    def _measure(self, stage: str, split: str, tasks: list, spec, model: str, attempts: int, may_differ=()) -> list:
        """Evaluate `spec` with `model` on `tasks` x `attempts` in the run folder OUT/<stage> (an
        ordinary evaluation run folder, resumed when it holds one); returns its trajectories."""
        from harnessrl.evaluate import evaluation_record, run_into_store, run_oracle, write_summary
        from harnessrl.models import ORACLE
        from harnessrl.models.base import SamplingParams
        from harnessrl.rollout import make_jobs

        c = self.config
        sampling = SamplingParams(temperature=c.temperature, seed=c.seed)
        record = evaluation_record(c.suite, split, model, tasks, [spec], attempts, sampling, c.retries)
        path = self.out / stage
        try:
            folder = RunFolder.open(path, "evaluation", record, resume=holds_run(path), may_differ=may_differ).start()
            store = folder.store(meta_config=folder.config)
            folder.record_shell_isolation([spec], any(t.offers_shell for t in tasks))
        except RunFolderError as e:
            raise StudyError(f"{stage}: {e}") from None
        with folder:
            jobs = make_jobs(tasks, [spec], attempts)
            todo = folder.todo(jobs)
            if todo:
                self.log(
                    f"{stage}: {spec.name} x {model}, {len(todo)} episodes"
                    + (f" ({len(jobs) - len(todo)} already done)" if len(todo) < len(jobs) else "")
                )
                policy = self.policy_factory(stage, model) if self.policy_factory is not None else None
                if policy is None and model.strip() == ORACLE:
                    run_oracle(todo, store, c.retries, self.progress)
                else:
                    policy = policy if policy is not None else self._load(stage, model)
                    run_into_store(store, todo, policy, sampling, c.max_in_flight, c.retries, self.progress)
            write_summary(store, folder.config, path)
            wanted = {j.key for j in jobs}
            return [t for t in store.trajectories(with_tokens=False) if t.key in wanted]

    def _stored(self, stage: str) -> list:
        """The trajectories of a finished evaluation stage, read without opening it as a run."""
        from harnessrl.store import RunStore, StoreError

        try:
            with RunStore(self.out / stage) as store:
                return list(store.trajectories(with_tokens=False))
        except (StoreError, OSError) as e:
            raise StudyError(f"{stage}: cannot read its run database ({e})") from None

    # -- the stages ----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        c = self.config
        try:
            self.folder.start()
        except OSError as e:
            raise StudyError(f"cannot write {self.out}: {e}") from None
        self.stages = self._read_stages()
        try:
            context: dict[str, Any] = {"seed_harness": self.seed_spec.name}
            if c.seed_eval_tasks and "seed-eval" not in self.stages:
                trajs = self._measure("seed-eval", "dev", self.seed_eval_tasks, self.seed_spec, c.model, c.attempts)
                self._done("seed-eval", episodes=len(trajs))
            evolved, evolution = self._evolve()
            context.update(evolved_harness=evolved.name, evolution=evolution)
            context["evolved_is_seed"] = _same_harness(evolved, self.seed_spec)
            context["collect"] = self._collect(evolved)
            context["training"] = {stage: self._sft(stage) for stage in ("sft", "placebo")}
            analyses, meta = {}, {}
            for cell, (side, weights) in CELLS.items():
                spec = self.seed_spec if side == "seed" else evolved
                model = self._cell_model(weights)
                stage = f"cells/{cell}"
                if stage in self.stages and holds_run(self.out / stage):  # finished: only read
                    trajs = self._stored(stage)
                else:
                    trajs = self._measure(stage, "test", self.test_tasks, spec, model, c.attempts)
                    self._done(stage, episodes=len(trajs))
                analyses[cell] = cell_analysis(trajs, c.attempts)
                meta[cell] = {
                    "harness": side,
                    "harness_name": spec.name,
                    "weights": weights,
                    "model": model,
                    "folder": f"cells/{cell}",
                }
        finally:
            self._release()
        context["seed_eval"] = (
            {"split": "dev", "folder": "seed-eval", **cell_analysis(self._stored("seed-eval"), c.attempts)["record"]}
            if "seed-eval" in self.stages and holds_run(self.out / "seed-eval")
            else None
        )
        result = study_result(c, analyses, meta, context)
        write_json(self.out / STUDY_JSON, result)
        return result

    def _evolve(self):
        """The evolved harness (the given one, or evolution's best) and evolution's summary."""
        import json

        from harnessrl.evolve.loop import BEST, FINAL, EvolveError
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError
        from harnessrl.rundir import LOCK

        if self.given_evolved is not None:
            return self.given_evolved, {"given": self.config.evolved}
        path = self.out / "evolve"
        finished = (path / FINAL).is_file() and (path / LOCK).is_file()
        if "evolve" not in self.stages and not finished:
            from harnessrl.evolve.run import run_evolve

            self._release()  # evolution loads its own copy of the model
            try:
                run_evolve(self.evolve_config, path, resume=holds_run(path), progress=self.progress, log=self.log)
            except EvolveError as e:
                raise StudyError(f"evolve: {e}") from None
        try:
            final = json.loads((path / FINAL).read_text(encoding="utf-8"))
            spec = load_harness(str(path / BEST))
        except (OSError, ValueError, SpecError) as e:
            raise StudyError(f"evolve: {path} holds no finished evolution ({e})") from None
        evolution = {
            "folder": "evolve",
            "best": final["best"],
            "accepted_edits": final["accepted_edits"],
            "best_diff_vs_seed": final["best_diff_vs_seed"],
            "iterations_run": final["iterations_run"],
            "threshold": final["threshold"],
            "held_out_difference": final["paired_difference"],
        }
        if "evolve" not in self.stages:
            self._done("evolve", best=final["best"], accepted_edits=final["accepted_edits"])
        return spec, evolution

    def _collect(self, evolved) -> dict[str, Any]:
        """The evolved harness's episodes on the train tasks; refuses to go on when fewer than two
        tasks have a passing one (nothing to distil, or no placebo: it swaps answers across tasks)."""
        c = self.config
        grown = self.stages.get("collect", {})
        if grown.get("tasks") == c.collect_tasks and grown.get("attempts") == c.collect_attempts:
            return grown
        collector = c.collect_model or c.model
        trajs = self._measure(
            "collect",
            "train",
            self.train_tasks,
            evolved,
            collector,
            c.collect_attempts,
            may_differ=("tasks", "task_ids", "attempts"),
        )
        passed = [t for t in trajs if not t.is_infra_error and t.grade is not None and t.grade.passed]
        tasks = sorted({t.task_id for t in passed})
        facts = {
            "tasks": c.collect_tasks,
            "attempts": c.collect_attempts,
            "episodes": len(trajs),
            "passed": len(passed),
            "passed_tasks": len(tasks),
        }
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
            raise StudyError(f"nothing to distil: none of the {where} passed; {more}")
        if len(tasks) < 2:
            raise StudyError(
                f"only one task ({tasks[0]}) has a passing episode among the {where}; the placebo adapter swaps "
                f"answers across tasks and needs two; {more}"
            )
        self._done("collect", **facts)
        return facts

    def _sft(self, stage: str) -> dict[str, Any]:
        """The distilled (stage sft) or placebo adapter: SFT on the collected episodes, re-rendered
        into the seed harness."""
        from harnessrl.train.config import SFTConfig
        from harnessrl.train.sft import SFTError, run_sft

        if stage in self.stages:
            return self.stages[stage]
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
            seed=c.seed,
        )
        self._release()
        self.log(f"{stage}: training the {'placebo' if stage == 'placebo' else 'distilled'} adapter")
        path = self.out / stage
        try:
            summary = run_sft(
                sft_config,
                path,
                resume=holds_run(path),
                spec=self.seed_spec,
                progress=self.progress,
                console=self.console,
            )
        except SFTError as e:
            raise StudyError(f"{stage}: {e}") from None
        finally:
            gc.collect()
        data = summary["data"]
        facts = {
            "folder": stage,
            "adapter": f"{stage}/adapter",
            "steps": summary["steps"],
            "examples": data["examples"],
            "episodes_replayed": data["replayed"],
            "episodes_dropped": sum(data["dropped"].values()),
            "final_loss": (summary.get("last") or {}).get("loss"),
        }
        self._done(stage, **facts)
        return facts

    def _cell_model(self, weights: str) -> str:
        if weights == "base":
            return self.config.model
        from harnessrl.models.spec import HF_PREFIX

        return HF_PREFIX + str(self.out / ("sft" if weights == "distilled" else "placebo") / "adapter")


def _same_harness(a, b) -> bool:
    from harnessrl.evolve.edits import spec_fingerprint

    return spec_fingerprint(a) == spec_fingerprint(b)


def run_study(
    config: StudyConfig,
    out: str | Path,
    *,
    resume: bool = False,
    policy_factory: PolicyFactory | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
    console=None,
) -> dict[str, Any]:
    """`harnessrl study` as a library call; returns study.json's content."""
    study = Study(
        config, out, resume=resume, policy_factory=policy_factory, progress=progress, log=log, console=console
    )
    return study.run()


__all__ = [
    "CELLS",
    "COMPARISONS",
    "Study",
    "StudyConfig",
    "StudyError",
    "cell_analysis",
    "class_effects",
    "recommend",
    "run_study",
    "verdict",
]
