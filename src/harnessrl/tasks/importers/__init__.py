"""Suites loaded from task folders in other benchmarks' formats: `clawgym:PATH`,
`pinchbench:PATH`, `harbor:PATH`, `claweval:PATH`. See docs/importers.md for the layouts and how each is graded."""

from __future__ import annotations

from harnessrl.tasks.importers.claweval import ClawEvalSuite
from harnessrl.tasks.importers.clawgym import ClawGymSuite
from harnessrl.tasks.importers.common import GraderError, GraderUnavailable, ImportedSuite, TaskLoadError
from harnessrl.tasks.importers.harbor import HarborSuite
from harnessrl.tasks.importers.pinchbench import Judge, ModelJudge, PinchBenchSuite

IMPORTERS: dict[str, type[ImportedSuite]] = {
    "clawgym": ClawGymSuite,
    "pinchbench": PinchBenchSuite,
    "harbor": HarborSuite,
    "claweval": ClawEvalSuite,
}
JUDGED_FORMATS = (PinchBenchSuite, ClawEvalSuite)  # the formats with LLM-judge parts


def has_judged_part(task) -> bool:
    """Whether a task has a part graded by an LLM judge: a PinchBench llm_judge or hybrid task, or
    a Claw-Eval task whose grader uses the judge."""
    from harnessrl.tasks.importers.pinchbench import is_judged

    return is_judged(task) or (task.suite == ClawEvalSuite.kind and bool(task.data.get("judged")))


def make_judge(model_spec: str, api_key_env: str | None = None) -> ModelJudge:
    """The LLM judge of the judged formats (PinchBench, Claw-Eval) for a model spec (any form
    `load_policy` takes) and, for openai: servers, the environment variable holding the API key.
    The model is not loaded yet: call the judge's `load()` once the rest of the run's configuration
    is checked; it grades greedily, from as many threads as episodes are graded in."""
    return ModelJudge(model_spec.strip(), api_key_env=api_key_env)


def load_imported_suite(name: str, judge: Judge | None = None) -> ImportedSuite:
    """The suite for `KIND:PATH`; ValueError for an unknown kind, a missing folder or no tasks.
    `judge` goes to the formats with LLM-judge parts (PinchBench, Claw-Eval); the others ignore it."""
    kind, _, path = name.partition(":")
    if kind not in IMPORTERS:
        raise ValueError(f"unknown task folder format '{kind}' (known: {', '.join(f'{k}:PATH' for k in IMPORTERS)})")
    if not path:
        raise ValueError(f"'{name}': give the folder after the colon, e.g. {kind}:path/to/tasks")
    suite_class = IMPORTERS[kind]
    if judge is not None and issubclass(suite_class, JUDGED_FORMATS):
        return suite_class(path, judge=judge)
    return suite_class(path)


__all__ = [
    "IMPORTERS",
    "ClawEvalSuite",
    "ClawGymSuite",
    "GraderError",
    "GraderUnavailable",
    "HarborSuite",
    "ImportedSuite",
    "Judge",
    "ModelJudge",
    "PinchBenchSuite",
    "TaskLoadError",
    "has_judged_part",
    "load_imported_suite",
    "make_judge",
]
