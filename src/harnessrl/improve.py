"""`harnessrl improve`: harness first, then weights, then content, as one resumable job.

The rule it follows: process failures (malformed calls, refused calls, loops, budgets, no
delivery, missing evidence) are removed by editing the harness; the behaviour the edited harness
gets out of the model is then moved into the weights, so that the seed harness at inference needs
no further help; and what no harness edit fixes (content failures: delivered, wrong) is trained
with GRPO on the tasks that fail that way.

    harness   the seed harness on dev tasks, triaged (harness/seed-dev); `harnessrl evolve` from
              the seed while its accepted edits keep lowering the process-failure rate, stopped at
              the first ceiling that fires (the harness.ceiling decision: patience, process_floor,
              no_process_gain, budget, proposer_exhausted); or no evolution at all when the seed's
              process-failure rate is already below --process-floor, or --evolved names the harness
    weights   the evolved harness distilled into LoRA weights that run under the SEED harness, two
              ways at the same number of optimizer steps: imitation (`train sft` on the evolved
              harness's passing train episodes, weights/collect -> weights/sft, with its placebo
              weights/placebo: the study's stages) and on-policy distillation (`train distill`,
              weights/distill);
              each adapter evaluated under the seed harness on the dev tasks; the one with the
              higher dev mean is kept (weights.choice); skipped when the evolved harness is the seed
    content   the kept weights under the seed harness on --content-tasks train tasks, triaged
              (content/select); GRPO (`train grpo`, HarnessBandit by default, over the seed and the
              evolved harness) from those weights on the tasks with a content failure (content/grpo);
              skipped when there is none
    final     the held-out test tasks, once, in four cells: seed harness + base weights (the
              baseline) and each phase's result (harness: evolved + base; weights: seed + the kept
              adapter; content: seed + the GRPO adapter), with mean, 95% interval, pass@k, pass^k and
              triage shares, the paired difference of each against the baseline and which gains
              stayed runtime-only (improve.json, report.md); the folder is then locked

Every decision is one line of OUT/decisions.jsonl: {key, phase, choice, evidence}, in the order
taken. Every stage is a run folder of its own under OUT (an evaluation, an evolution, a training
run), resumed by its own resume; OUT/stages.json lists the stages that finished (and
OUT/weights/stages.json those of the collection and imitation, which are `harnessrl study`'s
stages, reused). `--resume` re-runs the pipeline: finished stages are read, not run again; the
stage that was interrupted resumes; every decision is computed again from the same files and must
equal the recorded one (a run reaching another decision is refused: something in a stage folder
changed). So a run stopped anywhere, and resumed, writes exactly the decisions of an uninterrupted run.

No decision reads a test task: the harness phase decides on dev tasks (the evolution's own
held-out phase runs once, as `harnessrl evolve` always does, and is reported, never used), the
weights phase on dev tasks, the content phase on train tasks.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import Field

from harnessrl.config import Device, FloatDtype, Options, cli
from harnessrl.rundir import LOCK, RunFolder, RunFolderError, append_jsonl, holds_run, write_json

DECISIONS = "decisions.jsonl"
RESULT = "improve.json"
REPORT = "report.md"
PHASES = ("harness", "weights", "content", "final")
# the harness phase's ceilings, in the order they are checked after each evolution iteration
CEILINGS = ("no_process_gain", "process_floor", "patience", "budget", "proposer_exhausted")


class ImproveError(ValueError):
    """The job cannot go on as asked (bad options or input, a refused resume, a stage that
    failed); the CLI exits 2 with the message."""


class ImproveConfig(Options):
    """`harnessrl improve`: every option, declared once (OUT/config.json records them)."""

    suite: str = Field("toolcalc", description="suite: dev tasks decide, train tasks train, test tasks judge once")
    seed_harness: str = Field("react", description="built-in harness name or spec path to start from")
    evolved: Optional[str] = Field(
        None, description="the evolved harness (name or spec path): skips the evolution (default: evolve the seed)"
    )
    model: str = Field(
        "smollm2-135m", description="the base model (local, it is fine-tuned): tiny-random, smollm2-135m, hf:PATH"
    )
    device: Device = "auto"
    dtype: FloatDtype = "auto"
    dev_tasks: int = Field(8, ge=2, description="first N dev tasks: every decision of the harness and weights phases")
    test_tasks: int = Field(8, ge=1, description="first N test tasks (held out): the final comparison, once")
    attempts: int = Field(
        2, ge=1, description="attempts per task in every evaluation stage", json_schema_extra=cli("--attempts", "-k")
    )
    # the harness phase
    iterations: int = Field(4, ge=1, description="harness phase: the evolution's budget of iterations")
    candidates: int = Field(2, ge=1, description="harness phase: candidates proposed and measured per iteration")
    rollouts: int = Field(2, ge=1, description="harness phase: attempts per dev task in every evolution measurement")
    patience: int = Field(2, ge=1, description="harness phase: stop after N iterations in a row accept no edit")
    process_floor: float = Field(
        0.05,
        ge=0,
        le=1,
        description="harness phase: stop (or do not start) once the share of dev episodes failing with a process "
        "class is below this",
    )
    # the weights phase
    collect_model: Optional[str] = Field(
        None,
        description="weights phase: the model that collects the evolved harness's train episodes for imitation "
        "(default: --model; `oracle` replays each task's known solution)",
    )
    collect_tasks: int = Field(8, ge=1, description="weights phase: first N train tasks collected for imitation")
    collect_attempts: int = Field(4, ge=1, description="weights phase: attempts per collected train task")
    epochs: int = Field(3, ge=1, description="weights phase: imitation's passes over its examples")
    lr: float = Field(
        1e-4, gt=0, allow_inf_nan=False, description="weights phase: AdamW learning rate of both adapters"
    )
    distill_steps: int = Field(
        6,
        ge=1,
        description="weights phase: on-policy distillation steps when imitation has nothing to train on (otherwise "
        "as many as imitation's optimizer steps)",
    )
    distill_tasks_per_step: int = Field(4, ge=1, description="weights phase: train tasks per distillation step")
    # the content phase
    content_tasks: int = Field(8, ge=1, description="content phase: first N train tasks triaged for content failures")
    grpo_steps: int = Field(10, ge=1, description="content phase: GRPO steps")
    grpo_tasks_per_step: int = Field(4, ge=1, description="content phase: tasks per GRPO step (at most the selected)")
    group_size: int = Field(4, ge=2, description="content phase: attempts per task in a GRPO group")
    scheduler: str = Field("harness-bandit", description="content phase: the GRPO scheduler over the harnesses")
    temperature: float = Field(0.7, gt=0, le=5.0, description="sampling temperature of every stage")
    seed: int = Field(0, description="seed of sampling, evolution, LoRA init and example order")
    max_in_flight: int = Field(16, ge=1, description="episodes in flight (generation batch size)")
    retries: int = Field(2, ge=0, description="re-runs of an episode after an infrastructure error")


class _EvolutionCeiling(Exception):
    """Raised from the evolution's log after the iteration at which a ceiling fired."""

    def __init__(self, iteration: int):
        super().__init__(f"ceiling at iteration {iteration}")
        self.iteration = iteration


class TrainSubset:
    """A suite whose train split is only the given tasks (GRPO on the content-failure tasks);
    every other split, and the tasks' ids, are the suite's own."""

    def __init__(self, suite, task_ids: list[str]):
        wanted = set(task_ids)
        self.suite = suite
        self.name = suite.name
        self.offers_shell = suite.offers_shell
        self.train = [t for t in suite.tasks("train") if t.id in wanted]
        self.split_sizes = {**suite.split_sizes, "train": len(self.train)}

    def tasks(self, split: str, n: int | None = None) -> list:
        if split != "train":
            return self.suite.tasks(split, n)
        return list(self.train if n is None else self.train[:n])

    def task(self, task_id: str):
        return self.suite.task(task_id)


def process_rate(trajectories: list) -> float | None:
    """The share of valid episodes (no infrastructure error) whose first failure signal is a
    process class; None without a valid episode."""
    from harnessrl.triage import PROCESS, first_failure_signal

    valid = [t for t in trajectories if not t.is_infra_error]
    if not valid:
        return None
    hits = 0
    for t in valid:
        v = first_failure_signal(t)
        hits += v is not None and v.cls in PROCESS
    return hits / len(valid)


def content_task_ids(trajectories: list) -> list[str]:
    """The tasks with at least one episode whose first failure signal is `content`, sorted."""
    from harnessrl.triage import first_failure_signal

    out = set()
    for t in trajectories:
        v = first_failure_signal(t)
        if v is not None and v.cls == "content":
            out.add(t.task_id)
    return sorted(out)


def _normal(value: Any) -> Any:
    """The value as JSON gives it back (tuples as lists, keys as strings)."""
    return json.loads(json.dumps(value, default=str))


# ------------------------------------------------------------------------------------------ the job


def _stages_class():
    """Study's stage machinery as a class of its own (imported late: the study module is heavy)."""
    from harnessrl.study import Study

    class Stages(Study):
        """`harnessrl study`'s stages, reused: evaluation stages into run folders of their own (the
        model loaded once and kept for the next stage), the evolved harness's collection on train
        tasks and the imitation and placebo adapters (`train sft` into the seed harness), with
        `stages.json` in `out`. Not a study folder: none of the study's own files are written."""

        def __init__(self, config, out: Path, seed_spec, device, dtype, *, progress: bool, log, console):
            from harnessrl.tasks import get_suite

            # only the attributes the stage methods read (Study.__init__ would open a study folder)
            self.config, self.out, self.seed_spec = config, out, seed_spec
            self.device, self.dtype = device, dtype
            self.policy_factory = None
            self.progress, self.log, self.console = progress, log, console
            self._policy = None
            self.train_tasks = get_suite(config.suite).tasks("train", config.collect_tasks)
            self.stages = self._read_stages()

        def measured(self, stage: str, split: str, tasks: list, spec, model: str, attempts: int) -> list:
            """An evaluation stage's trajectories: measured (or resumed) once, then read."""
            if stage in self.stages and holds_run(self.out / stage):
                return self._stored(stage)
            trajectories = self._measure(stage, split, tasks, spec, model, attempts)
            self._done(stage, episodes=len(trajectories))
            return trajectories

        def done(self, stage: str, **facts: Any) -> None:
            self._done(stage, **_normal(facts))

        def collect_and_imitate(self, evolved) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
            """The collection (needs passing episodes on two tasks), the imitation and the placebo
            adapters; StudyError says why there is nothing to imitate."""
            collect = self._collect(evolved)
            return collect, self._sft("sft"), self._sft("placebo")

        def release(self) -> None:
            self._release()

    return Stages


class Improve:
    """`Improve(config, out, resume=...)` checks everything cheap and raises ImproveError (nothing
    is written); `run(stop_after=PHASE)` runs the phases and returns improve.json's content (or,
    stopped after a phase, what is decided so far)."""

    def __init__(
        self,
        config: ImproveConfig,
        out: str | Path,
        *,
        resume: bool = False,
        progress: bool = True,
        log: Callable[[str], None] = lambda message: None,
        console=None,
    ):
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError, require_loop_harness
        from harnessrl.models import check_spec
        from harnessrl.models.device import resolve_device, resolve_dtype
        from harnessrl.tasks import get_suite
        from harnessrl.train import lora
        from harnessrl.train.distill import DistillError, check_protocols

        self.config = c = config
        self.out = Path(out)
        self.resume = resume
        self.progress = progress
        self.log = log
        self.console = console
        try:
            self.device = resolve_device(c.device)
            self.dtype = resolve_dtype(c.dtype, self.device)
            check_spec(c.model, option="--model")
            lora.check_local_model(c.model, ImproveError)  # it is fine-tuned
            if c.collect_model is not None:
                check_spec(c.collect_model, option="--collect-model", oracle=True)
            purpose = "improve (evolve, then distil into the seed harness)"
            self.seed_spec = require_loop_harness(load_harness(c.seed_harness), purpose)
            self.given = require_loop_harness(load_harness(c.evolved), purpose) if c.evolved is not None else None
            if self.given is not None:
                check_protocols(self.seed_spec, self.given)
            self.suite = suite = get_suite(c.suite)
            for split in ("train", "dev", "test"):
                if not suite.split_sizes.get(split):
                    raise ImproveError(
                        f"suite '{suite.name}' has no {split} split (improve needs train tasks to train on, dev tasks "
                        "to decide on and test tasks to judge)"
                    )
            self.dev_tasks = suite.tasks("dev", c.dev_tasks)
            self.test_tasks = suite.tasks("test", c.test_tasks)
            suite.tasks("train", c.collect_tasks)  # a count the split cannot give: refused now
            self.content_pool = suite.tasks("train", c.content_tasks)
            if c.distill_tasks_per_step > suite.split_sizes["train"]:
                raise ImproveError(
                    f"--distill-tasks-per-step {c.distill_tasks_per_step} is more than the "
                    f"{suite.split_sizes['train']} train tasks of suite '{suite.name}'"
                )
        except (SpecError, DistillError) as e:
            raise ImproveError(str(e)) from None
        except ValueError as e:
            raise ImproveError(str(e)) from None
        self.record = {
            **{k: v for k, v in c.model_dump().items() if k not in ("device", "dtype")},
            "device": str(self.device),
            **({"dtype": self.dtype} if self.dtype != "float32" else {}),
            "seed_spec": self.seed_spec.to_dict(),
            "evolved_spec": None if self.given is None else self.given.to_dict(),
        }
        try:
            self.folder = RunFolder.open(self.out, "improvement", self.record, resume=resume, may_differ=("device",))
        except RunFolderError as e:
            raise ImproveError(str(e)) from None
        self.runner = None  # the stages (`_stages_class`), made by run()
        self.recorded: dict[str, dict[str, Any]] = {}
        self.decisions: list[dict[str, Any]] = []

    # -- the folder: stages and decisions --------------------------------------------------------------
    def decide(self, key: str, phase: str, choice: Any, evidence: dict[str, Any]) -> dict[str, Any]:
        """Record a decision (one line of decisions.jsonl); on resume, the recorded one, which the
        recomputed choice must equal."""
        line = _normal({"key": key, "phase": phase, "choice": choice, "evidence": evidence})
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
        self.decisions.append(line)
        self.log(f"{phase}: {key} = {line['choice']}")
        return line

    # -- evaluation stages ----------------------------------------------------------------------------
    def _stages(self, root: Path, evolved: str | None = None):
        """The stage runner rooted at `root`, `evolved` the evolved harness's spec file."""
        from harnessrl.study import StudyConfig

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
        Stages = _stages_class()
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
        from harnessrl.study_analysis import cell_analysis

        trajectories = self.runner.measured(stage, split, tasks, spec, model, self.config.attempts)
        analysis = cell_analysis(trajectories, self.config.attempts)
        return {**analysis, "folder": stage, "harness_name": spec.name, "model": model}

    # -- the phases -----------------------------------------------------------------------------------
    def run(self, stop_after: str | None = None) -> dict[str, Any]:
        if stop_after is not None and stop_after not in PHASES[:-1]:
            raise ImproveError(f"--stop-after must be one of {', '.join(PHASES[:-1])}, got {stop_after!r}")
        try:
            self.folder.start()
        except OSError as e:
            raise ImproveError(f"cannot write {self.out}: {e}") from None
        self.runner = self._stages(self.out)
        self.recorded = {}
        path = self.out / DECISIONS
        if path.is_file():
            for text in path.read_text(encoding="utf-8").splitlines():
                if text.strip():
                    line = json.loads(text)
                    self.recorded[line["key"]] = line
        self.decisions = []
        try:
            base = self._cell("harness/seed-dev", "dev", self.dev_tasks, self.seed_spec, self.config.model)
            evolved = self._harness(base)
            if stop_after == "harness":
                return self._partial("harness")
            weights = self._weights(base, evolved)
            if stop_after == "weights":
                return self._partial("weights")
            content = self._content(evolved, weights)
            if stop_after == "content":
                return self._partial("content")
            return self._final(evolved, weights, content)
        finally:
            self._release()

    def _partial(self, phase: str) -> dict[str, Any]:
        return {"stopped_after": phase, "decisions": self.decisions, "folder": str(self.out)}

    # harness ----------------------------------------------------------------------------------------
    def _harness(self, base: dict[str, Any]):
        """The evolved harness: given, the seed (no evolution needed), or the evolution's result
        where its first ceiling fired."""
        from harnessrl.evolve.edits import spec_fingerprint

        c = self.config
        rate = base["record"]["triage"]["process_rate"]  # = process_rate of its episodes
        if rate is None:
            raise ImproveError(
                "harness/seed-dev: every episode of the seed harness is an infrastructure error, so nothing can be "
                f"triaged; see {self.out / 'harness' / 'seed-dev'} (harnessrl summary / view), fix the set-up and "
                "start a new --out"
            )
        evidence = {
            "seed_dev": base["record"],
            "process_rate": rate,
            "process_floor": c.process_floor,
            "folder": "harness/seed-dev",
        }
        if self.given is not None:
            self.decide("harness.evolve", "harness", "given", {**evidence, "evolved": c.evolved})
            evolved = self.given
        elif rate < c.process_floor:
            self.decide("harness.evolve", "harness", "skip", evidence)
            evolved = self.seed_spec
        else:
            self.decide("harness.evolve", "harness", "evolve", evidence)
            evolved = self._evolve(rate)
        path = self.out / "harness" / "evolved.yaml"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(evolved.to_yaml(), encoding="utf-8")
        self.evolved_is_seed = spec_fingerprint(evolved) == spec_fingerprint(self.seed_spec)
        if self.evolved_is_seed:
            evolved = self.seed_spec
        return evolved

    def _evolve_config(self):
        from harnessrl.evolve.config import EvolveConfig

        c = self.config
        return EvolveConfig(
            suite=c.suite,
            seed_harness=c.seed_harness,
            model=c.model,
            device=c.device,
            dtype=self.dtype,
            dev_tasks=c.dev_tasks,
            test_tasks=c.test_tasks,
            rollouts=c.rollouts,
            iterations=c.iterations,
            candidates=c.candidates,
            seed=c.seed,
            temperature=c.temperature,
            max_in_flight=c.max_in_flight,
            retries=c.retries,
        )

    def _evolve(self, seed_rate: float):
        """`run_evolve` from the seed, checked after every iteration (`ceiling`); stopped at the
        first that fires, then finished (its held-out phase) at that iteration."""
        import dataclasses

        from harnessrl.evolve.loop import BEST, FINAL, EvolveError
        from harnessrl.evolve.run import run_evolve
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError

        path = self.out / "harness" / "evolve"
        config = self._evolve_config()
        finished = (path / FINAL).is_file() and (path / LOCK).is_file()
        fired = None if finished else self._first_ceiling(path, seed_rate)

        def log(message: str) -> None:
            self.log(f"evolve: {message}")
            if message.startswith("iteration ") and self._ceiling(path, self._iterations_done(path), seed_rate)[0]:
                raise _EvolutionCeiling(self._iterations_done(path))

        self._release()  # evolution loads its own copy of the model
        try:
            if not finished and fired is None:
                try:
                    run_evolve(config, path, resume=holds_run(path), progress=self.progress, log=log)
                except _EvolutionCeiling as stop:
                    fired = stop.iteration
            if fired is not None and not finished:  # its held-out phase, at the iteration the ceiling fired
                run_evolve(dataclasses.replace(config, iterations=fired), path, resume=True, progress=self.progress)
        except EvolveError as e:
            raise ImproveError(f"harness/evolve: {e}") from None
        try:
            final = json.loads((path / FINAL).read_text(encoding="utf-8"))
            spec = load_harness(str(path / BEST))
        except (OSError, ValueError, SpecError) as e:
            raise ImproveError(f"harness/evolve: {path} holds no finished evolution ({e})") from None
        done = int(final["iterations_run"])
        which, trail = self._ceiling(path, done, seed_rate)
        if which is None:
            which = "proposer_exhausted" if final.get("proposer_exhausted") else "budget"
        self.decide(
            "harness.ceiling",
            "harness",
            which,
            {
                "iteration": done,
                "iterations_budget": self.config.iterations,
                "patience": self.config.patience,
                "process_floor": self.config.process_floor,
                "iterations": trail,
                "accepted_edits": final["accepted_edits"],
                "best": final["best"],
                "best_diff_vs_seed": final["best_diff_vs_seed"],
                "threshold": final["threshold"],
                "held_out_not_used": final["paired_difference"],
                "folder": "harness/evolve",
            },
        )
        return spec

    @staticmethod
    def _iterations_done(path: Path) -> int:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        return int(state["iterations_done"])

    def _first_ceiling(self, path: Path, seed_rate: float) -> int | None:
        """On resume: the first finished iteration at which a ceiling fires (the run was stopped
        between the stop and its held-out phase), or None."""
        if not (path / "state.json").is_file():
            return None
        done = self._iterations_done(path)
        for it in range(1, done + 1):
            if self._ceiling(path, it, seed_rate)[0] is not None:
                return it
        return None

    def _ceiling(self, path: Path, upto: int, seed_rate: float) -> tuple[str | None, list[dict[str, Any]]]:
        """Which ceiling fires after iteration `upto` of the evolution in `path` (None: go on), and
        every iteration's evidence: accepted or not, the process-failure rate of the incumbent's
        dev episodes before and of the new incumbent's after (its screening and confirmation runs).
        Fires: no_process_gain (an accepted edit did not lower the rate), process_floor (the rate
        is below --process-floor), patience (--patience iterations in a row accepted nothing)."""
        from harnessrl.evolve.loop import LOG
        from harnessrl.store import RunStore

        c = self.config
        lines = [json.loads(x) for x in (path / LOG).read_text(encoding="utf-8").splitlines() if x.strip()]
        trail: list[dict[str, Any]] = []
        rate = seed_rate
        streak = 0
        with RunStore(path) as store:

            def rate_of(*labels: str) -> float | None:
                return process_rate(
                    [t for label in labels for t in store.trajectories(harness=label, with_tokens=False)]
                )

            for it in range(1, upto + 1):
                accepted = [x["candidate"] for x in lines if x["iteration"] == it and x.get("accepted")]
                before = rate_of(f"i{it:02d}.incumbent", f"i{it:02d}.incumbent.confirm")
                entry: dict[str, Any] = {"iteration": it, "accepted": accepted[0] if accepted else None}
                entry["process_rate_before"] = before
                fired = None
                if accepted:
                    streak = 0
                    after = rate_of(accepted[0], f"{accepted[0]}.confirm")
                    entry["process_rate_after"] = after
                    reference = before if before is not None else rate
                    if after is None or (reference is not None and after >= reference):
                        fired = "no_process_gain"
                    elif after < c.process_floor:
                        fired = "process_floor"
                    rate = after
                else:
                    streak += 1
                    if streak >= c.patience:
                        fired = "patience"
                entry["fired"] = fired
                trail.append(entry)
                if fired is not None:
                    return fired, trail
        return None, trail

    # weights ----------------------------------------------------------------------------------------
    def _weights(self, base: dict[str, Any], evolved) -> dict[str, Any]:
        """The kept adapter ({'variant', 'adapter'}), or the base weights when there is nothing to distil."""
        if self.evolved_is_seed:
            self.decide(
                "weights.choice",
                "weights",
                "base",
                {"reason": "the evolved harness is the seed harness: there is no harness behaviour to distil"},
            )
            return {"variant": "base", "adapter": None, "model": self.config.model}
        from harnessrl.study import StudyError

        c = self.config
        # the study's collection and imitation stages, rooted at OUT/weights (its stages.json there)
        imitation = self._stages(self.out.resolve() / "weights", str(self.out.resolve() / "harness" / "evolved.yaml"))
        variants: dict[str, dict[str, Any]] = {}
        steps = c.distill_steps
        reason, collect = None, {}
        self._release()
        try:
            collect, sft, _ = imitation.collect_and_imitate(evolved)
        except StudyError as e:  # nothing to imitate: recorded, the on-policy variant goes on alone
            reason = str(e)
        else:
            steps = int(sft["steps"])
            variants["imitation"] = {"adapter": "weights/sft/adapter", "steps": steps}
            variants["placebo"] = {"adapter": "weights/placebo/adapter", "steps": steps}
        finally:
            imitation.release()
        self.decide(
            "weights.imitation",
            "weights",
            "skip" if reason else "train",
            {
                "collector": c.collect_model or c.model,
                **{k: collect.get(k) for k in ("episodes", "passed", "passed_tasks")},
                "reason": reason,
                "steps": steps,
                "folder": "weights/collect",
            },
        )
        from harnessrl.train.distill import DistillError, check_protocols

        try:
            check_protocols(self.seed_spec, evolved)
        except DistillError as e:  # an edit changed the protocol: the teacher cannot read the student's replies
            self.decide("weights.on_policy", "weights", "skip", {"reason": str(e)})
        else:
            self._distill("weights/distill", evolved, steps)
            variants["on-policy"] = {"adapter": "weights/distill/adapter", "steps": steps}
        from harnessrl.metrics import paired_difference
        from harnessrl.study_analysis import verdict

        evidence: dict[str, Any] = {"base": {"folder": "harness/seed-dev", **base["record"]}}
        for name, v in variants.items():
            cell = self._cell(
                f"weights/dev-{name}", "dev", self.dev_tasks, self.seed_spec, self._adapter_model(v["adapter"])
            )
            diff = paired_difference(base["scores"], cell["scores"], seed=c.seed)
            v.update(cell=cell)
            evidence[name] = {
                "folder": cell["folder"],
                "adapter": v["adapter"],
                "steps": v["steps"],
                **cell["record"],
                "vs_base": {**diff, "verdict": verdict(diff)},
            }
        candidates = [n for n in ("imitation", "on-policy") if n in variants]
        if not candidates:
            self.decide("weights.choice", "weights", "base", {**evidence, "reason": "neither variant could be trained"})
            return {"variant": "base", "adapter": None, "model": c.model}
        if len(candidates) == 2:
            diff = paired_difference(variants["imitation"]["cell"]["scores"], variants["on-policy"]["cell"]["scores"])
            evidence["on_policy_vs_imitation"] = {**diff, "verdict": verdict(diff)}
        means = {n: variants[n]["cell"]["record"]["mean_score"] or 0.0 for n in candidates}
        # the higher dev mean; a tie keeps on-policy distillation (trained on the student's own states)
        choice = max(candidates, key=lambda n: (means[n], n == "on-policy"))
        evidence["rule"] = "the higher dev mean score under the seed harness; a tie keeps on-policy"
        self.decide("weights.choice", "weights", choice, evidence)
        return {
            "variant": choice,
            "adapter": variants[choice]["adapter"],
            "model": self._adapter_model(variants[choice]["adapter"]),
        }

    def _adapter_model(self, adapter: str) -> str:
        return "hf:" + str((self.out / adapter).resolve())  # absolute: a resume from elsewhere names the same model

    def _distill(self, stage: str, evolved, steps: int) -> dict[str, Any]:
        from harnessrl.train.config import DistillConfig
        from harnessrl.train.distill import DistillError, run_distill

        if stage in self.runner.stages:
            return self.runner.stages[stage]
        c = self.config
        config = DistillConfig(
            teacher_harness=evolved.name,
            student_harness=self.seed_spec.name,
            model=c.model,
            device=c.device,
            dtype=self.dtype,
            suite=c.suite,
            steps=steps,
            tasks_per_step=c.distill_tasks_per_step,
            attempts=c.attempts,
            temperature=c.temperature,
            lr=c.lr,
            seed=c.seed,
            max_in_flight=c.max_in_flight,
            retries=c.retries,
        )
        self._release()
        self.log(f"{stage}: on-policy distillation, {steps} steps")
        path = self.out / stage
        try:
            summary = run_distill(
                config,
                path,
                resume=holds_run(path),
                progress=self.progress,
                console=self.console,
                suite=self.suite,
                teacher=evolved,
                student=self.seed_spec,
            )
        except DistillError as e:
            raise ImproveError(f"{stage}: {e}") from None
        finally:
            gc.collect()
        last = summary["last"] or {}
        self.runner.done(stage, steps=summary["steps"], final_kl=last.get("kl"))
        return self.runner.stages[stage]

    # content ----------------------------------------------------------------------------------------
    def _content(self, evolved, weights: dict[str, Any]) -> dict[str, Any]:
        """GRPO from the kept weights on the train tasks with a content failure, or the weights as
        they are when there is none."""
        c = self.config
        select = self.runner.measured(
            "content/select", "train", self.content_pool, self.seed_spec, weights["model"], c.attempts
        )
        tasks = content_task_ids(select)
        from harnessrl.triage import triage

        tri = next(iter(triage(select).values()), {})
        evidence = {
            "folder": "content/select",
            "tasks_triaged": len(self.content_pool),
            "counts": tri.get("counts"),
            "content_share": tri.get("content_share"),
            "process_share": tri.get("process_share"),
            "selected": tasks,
        }
        if not tasks:
            self.decide("content.tasks", "content", "skip", {**evidence, "reason": "no train task failed on content"})
            return {**weights, "grpo": None}
        self.decide("content.tasks", "content", tasks, evidence)
        summary = self._grpo("content/grpo", evolved, weights["model"], tasks)
        return {
            "variant": "grpo",
            "adapter": "content/grpo/adapter",
            "model": self._adapter_model("content/grpo/adapter"),
            "grpo": summary,
        }

    def _grpo(self, stage: str, evolved, model: str, tasks: list[str]) -> dict[str, Any]:
        from harnessrl.train.trainer import Trainer, TrainError

        if stage in self.runner.stages:
            return self.runner.stages[stage]
        c = self.config
        specs = [self.seed_spec] if self.evolved_is_seed else [self.seed_spec, evolved]
        if len({s.name for s in specs}) < len(specs):  # a given evolved spec may carry the seed's name
            from harnessrl.evolve.edits import renamed

            specs[1] = renamed(evolved, f"{evolved.name}-evolved"[:64])
        from harnessrl.train.config import TrainConfig

        config = TrainConfig(
            model=model,
            device=c.device,
            dtype=self.dtype,
            suite=c.suite,
            harnesses=[s.name for s in specs],
            scheduler=c.scheduler if len(specs) > 1 else f"single:{specs[0].name}",
            steps=c.grpo_steps,
            tasks_per_step=min(c.grpo_tasks_per_step, len(tasks)),
            group_size=c.group_size,
            temperature=c.temperature,
            checkpoint_every=max(1, c.grpo_steps),
            max_in_flight=c.max_in_flight,
            retries=c.retries,
            seed=c.seed,
        )
        self._release()
        self.log(f"{stage}: GRPO on {len(tasks)} content-failure tasks over {', '.join(s.name for s in specs)}")
        path = self.out / stage
        try:
            trainer = Trainer(
                config,
                path,
                resume=holds_run(path),
                suite=TrainSubset(self.suite, tasks),
                specs=specs,
                progress=self.progress,
                console=self.console,
            )
            summary = trainer.run()
        except TrainError as e:
            raise ImproveError(f"{stage}: {e}") from None
        finally:
            gc.collect()
        updates = sum(
            1 for line in (path / "metrics.jsonl").read_text().splitlines() if json.loads(line).get("optimizer_step")
        )
        self.runner.done(stage, steps=summary["steps"], optimizer_steps=updates, harnesses=[s.name for s in specs])
        return self.runner.stages[stage]

    # final ------------------------------------------------------------------------------------------
    def _final(self, evolved, weights: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
        from harnessrl.metrics import paired_difference
        from harnessrl.study_analysis import verdict

        c = self.config
        cells_spec = {
            "seed-base": (self.seed_spec, c.model, "seed harness + base weights"),
            "harness": (evolved, c.model, "evolved harness + base weights"),
            "weights": (self.seed_spec, weights["model"], f"seed harness + {weights['variant']} weights"),
            "content": (
                self.seed_spec,
                content["model"],
                "seed harness + GRPO weights" if content.get("grpo") else "seed harness + the weights phase's weights",
            ),
        }
        cells: dict[str, dict[str, Any]] = {}
        same_as: dict[str, str] = {}
        for name, (spec, model, what) in cells_spec.items():
            twin = next((n for n, (s, m, _) in cells_spec.items() if n in cells and s is spec and m == model), None)
            if twin is not None:  # the phase changed nothing: the same cell, measured once
                same_as[name] = twin
                cells[name] = {**cells[twin], "same_as": twin, "what": what}
                continue
            cells[name] = {**self._cell(f"final/{name}", "test", self.test_tasks, spec, model), "what": what}
        base = cells["seed-base"]["scores"]
        differences = {}
        for name in ("harness", "weights", "content"):
            diff = paired_difference(base, cells[name]["scores"], seed=c.seed)
            differences[f"{name}_vs_seed_base"] = {**diff, "verdict": verdict(diff)}
        runtime = paired_difference(cells["weights"]["scores"], cells["harness"]["scores"], seed=c.seed)
        differences["harness_vs_weights"] = {**runtime, "verdict": verdict(runtime)}
        result = {
            "suite": c.suite,
            "model": c.model,
            "seed_harness": self.seed_spec.name,
            "evolved_harness": evolved.name,
            "evolved_is_seed": self.evolved_is_seed,
            "weights": {k: v for k, v in weights.items()},
            "content": {k: v for k, v in content.items()},
            "cells": {
                n: {
                    "what": cell["what"],
                    "folder": cell["folder"],
                    "harness": cell["harness_name"],
                    "model": cell["model"],
                    **({"same_as": cell["same_as"]} if "same_as" in cell else {}),
                    **cell["record"],
                }
                for n, cell in cells.items()
            },
            "paired_differences": differences,
            "runtime_only": _runtime_only(differences),
            "decisions": self.decisions,
            "config": c.model_dump(),
        }
        result = _normal(result)
        write_json(self.out / RESULT, result)
        (self.out / REPORT).write_text(report_markdown(result), encoding="utf-8")
        self.folder.lock(f"{RESULT} is written: the held-out comparison is final")
        return result


def _runtime_only(differences: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Which of the harness's gains the weights did not take along: the paired difference of the
    evolved harness (base weights) minus the seed harness with the kept weights, read as a claim."""
    d = differences["harness_vs_weights"]
    harness = differences["harness_vs_seed_base"]["verdict"]
    if d["verdict"] == "higher":
        text = (
            "some of the evolved harness's gain stayed runtime-only: with the base weights it beats the seed "
            "harness with the distilled weights"
        )
    elif harness == "higher" and d["verdict"] == "no claim":
        text = (
            "the evolved harness's gain is not shown to exceed what the distilled weights carry under the seed harness"
        )
    elif d["verdict"] == "lower":
        text = (
            "the distilled weights under the seed harness beat the evolved harness with the base weights: "
            "nothing stayed runtime-only"
        )
    else:
        text = "no claim: the held-out intervals cannot tell the evolved harness from the distilled weights"
    return {"difference": d, "text": text}


def report_markdown(result: dict[str, Any]) -> str:
    """report.md: the held-out cells, the paired differences and every decision with its evidence."""

    def num(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    def pct(x: Any) -> str:
        return "-" if x is None else f"{x:.0%}"

    cells = result["cells"]
    k = str(next(iter(cells.values()))["attempts"])
    ks = ["pass@1", f"pass@{k}", f"pass^{k}"] if k != "1" else ["pass@1"]  # with 1 attempt they are one number
    out = [
        f"# harnessrl improve: {result['suite']}, {result['model']}",
        "",
        f"Seed harness `{result['seed_harness']}`, evolved harness `{result['evolved_harness']}`"
        + (" (the seed: no edit kept)" if result["evolved_is_seed"] else "")
        + f"; weights kept: {result['weights']['variant']}.",
        "",
        "## Held-out test tasks",
        "",
        f"| cell | what | mean | 95% CI | {' | '.join(ks)} | process fail | content fail |",
        "|---|---|---|---|" + "---|" * len(ks) + "---|---|",
    ]
    for name, c in cells.items():
        ci = c["mean_score_ci95"]
        out.append(
            f"| {name} | {c['what']}{' (= ' + c['same_as'] + ')' if 'same_as' in c else ''} | {num(c['mean_score'])} | "
            + ("-" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]")
            + f" | {num(c['pass_at_k'].get('1'))} | "
            + (f"{num(c['pass_at_k'].get(k))} | {num(c['pass_hat_k'].get(k))} | " if k != "1" else "")
            + f"{pct(c['triage']['process_rate'])} | {pct(c['triage']['content_rate'])} |"
        )
    out += [
        "",
        "## Paired differences by task (b - a)",
        "",
        "| comparison | difference | 95% CI | claim |",
        "|---|---|---|---|",
    ]
    for name, d in result["paired_differences"].items():
        ci = d["ci95"]
        diff = "-" if d["mean_difference"] is None else f"{d['mean_difference']:+.3f}"
        out.append(
            f"| {name} | {diff} | " + ("-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]") + f" | {d['verdict']} |"
        )
    out += ["", f"Runtime-only: {result['runtime_only']['text']}.", "", "## Decisions", ""]
    for d in result["decisions"]:
        out.append(f"- **{d['key']}** ({d['phase']}): `{json.dumps(d['choice'])}`")
        shown = {k: v for k, v in d["evidence"].items() if not isinstance(v, (dict, list))}
        if shown:
            out.append("  " + ", ".join(f"{k}: {v}" for k, v in shown.items()))
    out.append("")
    out.append("Every decision's full evidence is in decisions.jsonl; every stage is a run folder under this one.")
    return "\n".join(out) + "\n"


def run_improve(
    config: ImproveConfig,
    out: str | Path,
    *,
    resume: bool = False,
    stop_after: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
    console=None,
) -> dict[str, Any]:
    """`harnessrl improve` as a library call; returns improve.json's content (or the decisions so
    far, with `stop_after`)."""
    job = Improve(config, out, resume=resume, progress=progress, log=log, console=console)
    return job.run(stop_after=stop_after)


__all__ = [
    "CEILINGS",
    "Improve",
    "ImproveConfig",
    "ImproveError",
    "TrainSubset",
    "content_task_ids",
    "process_rate",
    "report_markdown",
    "run_improve",
]
