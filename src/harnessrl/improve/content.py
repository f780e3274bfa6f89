"""The content phase: the kept weights triaged on train tasks, then GRPO on the tasks that fail on
content (delivered, wrong)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from harnessrl.improve.record import ImproveState, adapter_model, decide, running

if TYPE_CHECKING:
    from harnessrl.improve.harness import EvolvedHarness
    from harnessrl.improve.weights import KeptWeights
    from harnessrl.results import GRPOFacts
    from harnessrl.tasks.base import Suite, Task


class TrainSubset:
    """A suite whose train split is only the given tasks (GRPO on the content-failure tasks);
    every other split, and the tasks' ids, are the suite's own."""

    def __init__(self, suite: Suite, task_ids: list[str]):
        wanted = set(task_ids)
        self.suite = suite
        self.name = suite.name
        self.offers_shell = suite.offers_shell
        self.train = [t for t in suite.tasks("train") if t.id in wanted]
        self.split_sizes = {**suite.split_sizes, "train": len(self.train)}

    def tasks(self, split: str, n: int | None = None) -> list[Task]:
        if split != "train":
            return self.suite.tasks(split, n)
        return list(self.train if n is None else self.train[:n])

    def task(self, task_id: str):
        return self.suite.task(task_id)


def content_task_ids(trajectories: list) -> list[str]:
    """The tasks with at least one episode whose first failure signal is `content`, sorted."""
    from harnessrl.triage import first_failure_signal

    out = set()
    for t in trajectories:
        v = first_failure_signal(t)
        if v is not None and v.cls == "content":
            out.add(t.task_id)
    return sorted(out)


class ContentWeights(TypedDict):
    """The content phase's result, as improve.json's `content` holds it: the weights phase's
    (`grpo` None: no task failed on content) or the GRPO adapter's, with the GRPO stage's facts."""

    variant: str
    adapter: str | None
    model: str
    grpo: dict[str, Any] | None  # GRPOFacts as JSON


def content_phase(state: ImproveState, evolved: EvolvedHarness, weights: KeptWeights) -> ContentWeights:
    """GRPO from the kept weights on the train tasks with a content failure, or the weights as
    they are when there is none."""
    c = state.config
    select = running(state).measured(
        "content/select", "train", state.content_pool, state.seed_spec, weights["model"], c.attempts
    )
    tasks = content_task_ids(select)
    from harnessrl.triage import triage

    tri = next(iter(triage(select).values()), {})
    evidence = {
        "folder": "content/select",
        "tasks_triaged": len(state.content_pool),
        "counts": tri.get("counts"),
        "content_share": tri.get("content_share"),
        "process_share": tri.get("process_share"),
        "selected": tasks,
    }
    if not tasks:
        decide(state, "content.tasks", "content", "skip", {**evidence, "reason": "no train task failed on content"})
        return ContentWeights(variant=weights["variant"], adapter=weights["adapter"], model=weights["model"], grpo=None)
    decide(state, "content.tasks", "content", tasks, evidence)
    summary = _grpo(state, "content/grpo", evolved, weights["model"], tasks)
    return ContentWeights(
        variant="grpo",
        adapter="content/grpo/adapter",
        model=adapter_model(state, "content/grpo/adapter"),
        grpo=summary.model_dump(),
    )


def _grpo(state: ImproveState, stage: str, evolved: EvolvedHarness, model: str, tasks: list[str]) -> GRPOFacts:
    """GRPO (`train grpo`) from `model` on `tasks` over the seed and the evolved harness (the seed
    alone when they are one), as the stage OUT/`stage` (read when it finished)."""
    from harnessrl.kernel import enter
    from harnessrl.results import GRPOFacts, TrainResult
    from harnessrl.train.trainer import Trainer, TrainError

    runner = running(state)
    if stage in runner.stages:
        return GRPOFacts.model_validate(runner.stages[stage])
    c = state.config
    specs = [state.seed_spec] if evolved.is_seed else [state.seed_spec, evolved.spec]
    if len({s.name for s in specs}) < len(specs):  # a given evolved spec may carry the seed's name
        from harnessrl.evolve.edits import renamed

        specs[1] = renamed(evolved.spec, f"{evolved.spec.name}-evolved"[:64])
    from harnessrl.train.config import TrainConfig

    config = TrainConfig(
        model=model,
        device=c.device,
        dtype=state.dtype,
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
    path = state.out / stage

    def train(path: Path, resume: bool) -> TrainResult:
        objects = {"suite": TrainSubset(state.suite, tasks), "harnesses": specs}
        ctx = enter(
            "train grpo", config, path, resume=resume, error=TrainError, objects=objects,
            progress=state.progress, console=state.console,
        )  # fmt: skip
        return Trainer(ctx).run()

    def facts(summary: TrainResult) -> GRPOFacts:
        metrics = (path / "metrics.jsonl").read_text().splitlines()
        updates = sum(1 for line in metrics if json.loads(line).get("optimizer_step"))
        return GRPOFacts(steps=summary.steps, optimizer_steps=updates, harnesses=[s.name for s in specs])

    what = f"GRPO on {len(tasks)} content-failure tasks over {', '.join(s.name for s in specs)}"
    return runner.trained(stage, what, train, TrainError, facts, GRPOFacts)
