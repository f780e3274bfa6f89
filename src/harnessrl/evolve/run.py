"""Harness evolution as a library call: `run_evolve(enter("evolve", EvolveConfig(...), out,
models=evolve_models))` (harnessrl.kernel.enter: its context).

Every configuration error is raised (EvolveError) before anything slow happens; then the
models load and the loop (loop.py) runs, resuming whatever the folder already holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from harnessrl.evolve.config import EvolveConfig
from harnessrl.evolve.loop import RESUMABLE_CHANGES, Evolution, EvolveError
from harnessrl.results import EvolveResult
from harnessrl.rundir import CONFIG, RunFolder, holds_run

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext, ModelRequest

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


def run_evolve(ctx: JobContext, stop_when: Callable[[int], str | None] | None = None) -> EvolveResult:
    """Evolve the seed harness on the suite's dev tasks, confirm on its test tasks, over the job's
    context (harnessrl.kernel.enter with `evolve_models`: its models, seed harness and tasks);
    returns final.json's content. On `ctx.resume` the run in `ctx.out` continues (its
    configuration must be the config's; `stored_config(out)` reads it). `stop_when(iterations_done)`:
    asked after every finished iteration (and again on resume); a non-empty reason ends the search
    there, the held-out phase follows and final.json's `stopped_by` holds the reason."""
    from harnessrl.evolve.proposers import LLMProposer, Proposer, RulesProposer
    from harnessrl.models import load_policy
    from harnessrl.models.base import SamplingParams

    config, model, inputs = ctx.config, ctx.model(), ctx.inputs
    if model.local:  # auto resolved before it is recorded
        config = config.replace(dtype=model.dtype or config.dtype)
    # checks only; the loop opens it
    RunFolder.open(ctx.out, "evolution", config.to_json(), resume=ctx.resume, may_differ=RESUMABLE_CHANGES)
    seed_spec, dev, test = inputs.harness["seed_harness"], inputs.tasks["dev_tasks"], inputs.tasks["test_tasks"]
    sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p, seed=config.seed)
    ctx.executor.prepare(dev + test, [seed_spec])  # connect; every task and the seed harness can go there
    try:
        policy = load_policy(model, sampling)
        proposer: Proposer
        if config.proposer == "llm":
            proposer_sampling = SamplingParams(temperature=0.7, seed=config.seed)
            proposer = LLMProposer(load_policy(ctx.model("--proposer-model"), proposer_sampling))
        else:
            proposer = RulesProposer()
    except (ValueError, RuntimeError, OSError) as e:
        raise EvolveError(f"cannot load a model: {e}") from None
    # Solved train tasks (never decision or held-out ones) for the rules proposer's worked example.
    examples = inputs.suite.tasks("train", min(8, inputs.suite.split_sizes.get("train", 0)))
    evolution = Evolution(
        ctx.out,
        config,
        seed_spec,
        dev,
        test,
        policy,
        proposer,
        progress=ctx.progress,
        log=ctx.log,
        example_tasks=examples,
        executor=ctx.executor,
        stop_when=stop_when,
    )
    return evolution.run()
