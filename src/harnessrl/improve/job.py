"""The job: Improve checks its options, then runs the phases in order (harness, weights, content,
final), each a mixin of its own module; run_improve is the library call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from harnessrl.improve.config import DECISIONS, PHASES, ImproveConfig, ImproveError
from harnessrl.improve.content import ContentPhase
from harnessrl.improve.final import FinalPhase
from harnessrl.improve.harness import HarnessPhase
from harnessrl.improve.weights import WeightsPhase
from harnessrl.jobs.stages import StageError
from harnessrl.results import Decision, ImproveResult, ImproveStopped
from harnessrl.rundir import RunFolder, RunFolderError

if TYPE_CHECKING:
    from harnessrl.models.choice import ModelChoice


class Improve(HarnessPhase, WeightsPhase, ContentPhase, FinalPhase):
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
        models: Mapping[str, ModelChoice] | None = None,
    ):
        from harnessrl.harness.registry import load_harness
        from harnessrl.harness.spec import SpecError, require_loop_harness
        from harnessrl.kernel import choose_models, config_models
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
            chosen = choose_models(config_models(c)) if models is None else models
            model = lora.trained_model(c, ImproveError, chosen["--model"])  # it is fine-tuned
            assert model.device is not None and model.dtype is not None  # a local model's choice is resolved
            self.device, self.dtype = model.device, model.dtype
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
        self.runner = None  # the stages (`harnessrl.jobs.stages.Stages`), made by run()
        self.recorded: dict[str, dict[str, Any]] = {}
        self.decisions: list[Decision] = []

    # -- the phases -----------------------------------------------------------------------------------
    def run(self, stop_after: str | None = None) -> ImproveResult | ImproveStopped:
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
        except StageError as e:  # a stage's run folder, model or training refused to go on
            raise ImproveError(str(e)) from None
        finally:
            self._release()

    def _partial(self, phase: str) -> ImproveStopped:
        return ImproveStopped(stopped_after=phase, decisions=self.decisions, folder=str(self.out))


def run_improve(
    config: ImproveConfig,
    out: str | Path,
    *,
    resume: bool = False,
    stop_after: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
    console=None,
    models: Mapping[str, ModelChoice] | None = None,
) -> ImproveResult | ImproveStopped:
    """`harnessrl improve` as a library call; returns improve.json's content (or the decisions so
    far, with `stop_after`). `models`: the models the job kernel chose (chosen here when None)."""
    job = Improve(config, out, resume=resume, progress=progress, log=log, console=console, models=models)
    return job.run(stop_after=stop_after)
