"""Harness evolution as a library call: `run_evolve(EvolveConfig(...), out)`.

Every configuration error is raised (EvolveError) before anything slow happens; then the
models load and the loop (loop.py) runs, resuming whatever the folder already holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from harnessrl.evolve.config import EvolveConfig
from harnessrl.evolve.loop import RESUMABLE_CHANGES, Evolution, EvolveError
from harnessrl.results import EvolveResult
from harnessrl.rundir import CONFIG, RunFolder, holds_run

if TYPE_CHECKING:
    from harnessrl.executors import Executor
    from harnessrl.kernel import ModelRequest
    from harnessrl.models.choice import ModelChoice

_FIELDS = frozenset(EvolveConfig.model_fields)


def stored_config(out: str | Path) -> EvolveConfig:
    """The configuration an evolution run folder was started with (`--resume`)."""
    path = Path(out) / CONFIG
    if not holds_run(out) or not path.is_file():
        raise EvolveError(f"{out} holds no evolution run to resume")
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        return EvolveConfig(**{k: v for k, v in stored.items() if k in _FIELDS})
    except (ValueError, TypeError) as e:
        raise EvolveError(f"{path}: not an evolution configuration ({e})") from None


def evolve_models(config: EvolveConfig, api_key_env: str | None = None) -> list[ModelRequest]:
    """The models an evolution uses (the job kernel chooses them): `--model` (device and dtype
    from the config) and the llm proposer's `--proposer-model` (on its server)."""
    from harnessrl.kernel import ModelRequest

    requests = [ModelRequest("--model", config.model, config.device, config.dtype, api_key_env)]
    if config.proposer_model:
        requests.append(ModelRequest("--proposer-model", config.proposer_model, api_key_env=api_key_env))
    return requests


def run_evolve(
    config: EvolveConfig,
    out: str | Path,
    *,
    resume: bool = False,
    api_key_env: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = lambda message: None,
    executor: Executor | None = None,
    stop_when: Callable[[int], str | None] | None = None,
    models: Mapping[str, ModelChoice] | None = None,
) -> EvolveResult:
    """Evolve `config.seed_harness` on the suite's dev tasks, confirm on its test tasks; returns
    final.json's content. `resume`: continue the run in `out` (its configuration must be
    `config`; `stored_config(out)` reads it). `executor`: where the episodes run (default: this
    process; the caller closes it). `stop_when(iterations_done)`: asked after every finished
    iteration (and again on resume); a non-empty reason ends the search there, the held-out phase
    follows and final.json's `stopped_by` holds the reason. `models`: the models the job kernel
    chose (`evolve_models`; chosen here when None)."""
    from harnessrl.evolve.proposers import LLMProposer, Proposer, RulesProposer
    from harnessrl.executors import LocalExecutor
    from harnessrl.kernel import choose_models, job_harness, job_suite, job_tasks
    from harnessrl.models import load_policy
    from harnessrl.models.base import SamplingParams

    config.check(EvolveError)
    # a device this machine lacks: refused before any work; auto resolved before it is recorded
    models = choose_models(evolve_models(config, api_key_env)) if models is None else models
    model = models["--model"]
    if model.local:
        config = config.replace(dtype=model.dtype or config.dtype)
    # checks only; the loop opens it
    RunFolder.open(out, "evolution", config.to_json(), resume=resume, may_differ=RESUMABLE_CHANGES)
    seed_spec = job_harness(
        config.seed_harness, "--seed-harness", EvolveError, loop_for="evolve (edits of prompts and rules)"
    )
    sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p, seed=config.seed)
    the_suite = job_suite(config.suite, EvolveError)
    dev = job_tasks(the_suite, "dev", config.dev_tasks, "--dev-tasks", EvolveError)
    test = job_tasks(the_suite, "test", config.test_tasks, "--test-tasks", EvolveError)
    executor = executor if executor is not None else LocalExecutor()
    executor.prepare(dev + test, [seed_spec])  # connect; every task and the seed harness can go there
    try:
        policy = load_policy(model, sampling)
        proposer: Proposer
        if config.proposer == "llm":
            proposer_sampling = SamplingParams(temperature=0.7, seed=config.seed)
            proposer = LLMProposer(load_policy(models["--proposer-model"], proposer_sampling))
        else:
            proposer = RulesProposer()
    except (ValueError, RuntimeError, OSError) as e:
        raise EvolveError(f"cannot load a model: {e}") from None
    # Solved train tasks (never decision or held-out ones) for the rules proposer's worked example.
    examples = the_suite.tasks("train", min(8, the_suite.split_sizes.get("train", 0)))
    evolution = Evolution(
        Path(out),
        config,
        seed_spec,
        dev,
        test,
        policy,
        proposer,
        progress=progress,
        log=log,
        example_tasks=examples,
        executor=executor,
        stop_when=stop_when,
    )
    return evolution.run()
