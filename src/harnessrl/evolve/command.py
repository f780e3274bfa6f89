"""`harnessrl evolve`: the command (cli.py registers `evolve_cmd`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from harnessrl.evolve.acceptance import THRESHOLD_MULTIPLE


def evolve_cmd(
    suite: Annotated[str, typer.Option(help="suite whose dev split drives the search and whose test split confirms")] = "workspace",
    seed_harness: Annotated[str, typer.Option(help="built-in harness name or spec path to start from")] = "react",
    model: Annotated[str, typer.Option(help="the agent's model: tiny-random, smollm2-135m, hf:PATH or openai:MODEL@URL")] = "smollm2-135m",
    dev_tasks: Annotated[int, typer.Option(help="first N dev tasks (decision tasks)")] = 48,
    test_tasks: Annotated[int, typer.Option(help="first N test tasks (held out; run once at the end)")] = 72,
    rollouts: Annotated[int, typer.Option(help="attempts per task in every measurement")] = 4,
    iterations: Annotated[int, typer.Option(help="search iterations")] = 20,
    candidates: Annotated[int, typer.Option(help="candidates proposed and measured per iteration")] = 2,
    proposer: Annotated[str, typer.Option(help="rules (offline, triage-driven) or llm")] = "rules",
    proposer_model: Annotated[Optional[str], typer.Option(help="llm proposer's model: openai:NAME@URL")] = None,
    threshold_multiple: Annotated[float, typer.Option(help=(
        "threshold = this x SD of a paired difference of dev means; a candidate must beat it twice: "
        "on its dev run and on a confirmation run with fresh samples"))] = THRESHOLD_MULTIPLE,
    min_threshold: Annotated[float, typer.Option(help=(
        "the threshold is never below this, nor below one episode's worth of score, 1/(dev tasks x rollouts)"))] = 0.0,
    seed: Annotated[int, typer.Option(help=(
        "run seed: each measurement samples with a seed derived from it and the measurement's stream "
        "(noise.a, noise.b, iNN, iNN.confirm, test)"))] = 0,
    temperature: Annotated[float, typer.Option(help="the agent's sampling temperature")] = 0.7,
    top_p: Annotated[float, typer.Option(help="nucleus sampling")] = 1.0,
    max_in_flight: Annotated[int, typer.Option(help="episodes in flight (generation batch size)")] = 16,
    retries: Annotated[int, typer.Option(help="re-runs of an episode after an infrastructure error")] = 2,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="run folder")] = Path("runs/evo"),
    resume: Annotated[bool, typer.Option("--resume", help="continue a killed run with its stored configuration")] = False,
    progress: Annotated[bool, typer.Option(help="show progress bars")] = True,
    api_key_env: Annotated[Optional[str], typer.Option(help="openai: the environment variable with the API key")] = None,
) -> None:
    """Evolve a harness: propose edits, keep those that beat measured noise on dev tasks, confirm once on test tasks."""
    from harnessrl.cli.common import err as _err
    from harnessrl.cli.common import fail as _fail
    from harnessrl.cli.common import out as _out
    from harnessrl.evolve.loop import STATE, EvolveConfig, EvolveError, Evolution
    from harnessrl.harness.spec import SpecError
    from harnessrl.tasks import get_suite

    if resume:
        stored = out_dir / "config.json"
        if not stored.is_file():
            _fail(f"{out_dir} holds no evolution run to resume")
        state = out_dir / STATE
        if state.is_file() and json.loads(state.read_text(encoding="utf-8")).get("phase") == "finished":
            _fail(f"{out_dir}: this evolution run is finished and locked (final.json); start a new --out")
        config = EvolveConfig(**json.loads(stored.read_text(encoding="utf-8")))
        _err.print(f"resuming {out_dir} with its stored configuration", highlight=False)
    else:
        config = EvolveConfig(
            suite=suite, seed_harness=seed_harness, model=model, dev_tasks=dev_tasks, test_tasks=test_tasks,
            rollouts=rollouts, iterations=iterations, candidates=candidates, proposer=proposer,
            proposer_model=proposer_model, threshold_multiple=threshold_multiple, min_threshold=min_threshold,
            seed=seed, temperature=temperature, top_p=top_p, max_in_flight=max_in_flight, retries=retries,
        )
        if (out_dir / "config.json").is_file():
            _fail(f"{out_dir} already holds a run; use --resume to continue it or choose another --out")
    try:
        config.validate()
    except ValueError as e:
        _fail(str(e))
    from harnessrl.harness.registry import load_harness
    from harnessrl.models.base import SamplingParams

    try:
        seed_spec = load_harness(config.seed_harness)
        sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p, seed=config.seed)
    except SpecError as e:
        _fail(str(e))
    except ValueError as e:
        _fail(f"invalid sampling parameters: {e}")
    try:
        the_suite = get_suite(config.suite)
        dev = the_suite.tasks("dev", config.dev_tasks)
        test = the_suite.tasks("test", config.test_tasks)
    except ValueError as e:
        _fail(str(e))
    from harnessrl.cli.common import check_model_spec

    check_model_spec(config.model, api_key_env, "--model", "--api-key-env")
    if config.proposer_model:
        if not config.proposer_model.startswith("openai:"):
            _fail("--proposer-model must be openai:NAME@URL (an OpenAI-compatible server)")
        check_model_spec(config.proposer_model, api_key_env, "--proposer-model", "--api-key-env")

    from harnessrl.evolve.proposers import LLMProposer, RulesProposer
    from harnessrl.models import load_policy

    try:
        policy = load_policy(config.model, sampling, api_key_env=api_key_env)
        if config.proposer == "llm":
            the_proposer = LLMProposer(load_policy(config.proposer_model, SamplingParams(temperature=0.7, seed=config.seed), api_key_env=api_key_env))
        else:
            the_proposer = RulesProposer()
    except (ValueError, RuntimeError, OSError) as e:
        _fail(f"cannot load a model: {e}")

    # Solved train tasks (never decision or held-out ones) for the rules proposer's worked example.
    examples = the_suite.tasks("train", min(8, the_suite.split_sizes.get("train", 0)))
    evo = Evolution(
        out_dir, config, seed_spec, dev, test, policy, the_proposer, progress=progress,
        log=lambda m: _err.print(m, highlight=False, markup=False), example_tasks=examples,
    )
    try:
        final = evo.run()
    except EvolveError as e:
        _fail(str(e))
    except KeyboardInterrupt:
        _err.print(f"interrupted: the incumbent, the log and finished episodes are saved; continue with --resume --out {out_dir}", highlight=False)
        raise typer.Exit(130)
    s, b, d = final["seed"], final["best_harness"], final["paired_difference"]

    def fmt(x):
        return "-" if x is None else f"{x:.3f}"

    _out.print(f"held-out ({config.suite}/test, {s['n_tasks']} tasks x {config.rollouts}):", highlight=False)
    for name, r in (("seed", s), ("best", b)):
        ci = r["mean_score_ci95"] or [None, None]
        _out.print(
            f"  {name:5s} mean {fmt(r['mean_score'])} [{fmt(ci[0])}, {fmt(ci[1])}]  pass@1 {fmt(r['pass_at_k'].get('1'))}  "
            f"delivery {fmt(r['delivery_rate'])}  process share {fmt(r['triage']['process_share'])}",
            highlight=False,
        )
    ci = d["ci95"] or [None, None]
    _out.print(
        f"  best - seed {fmt(d['mean_difference'])} [{fmt(ci[0])}, {fmt(ci[1])}]; accepted edits: "
        f"{len(final['accepted_edits'])} ({final['unconfirmed_candidates']} more beat the threshold once, "
        "not on confirmation)",
        highlight=False,
    )
    _out.print(f"run folder: {out_dir} (evolution.jsonl, best_harness.yaml, final.json)", highlight=False)
