"""The `harnessrl` command line: one sub-command per job."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from harnessrl import __version__

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Evaluate, diagnose, improve and train one LLM agent across many harnesses.")
harness_app = typer.Typer(no_args_is_help=True, help="List, show, validate harness specs.")
tasks_app = typer.Typer(no_args_is_help=True, help="List suites and show tasks.")
models_app = typer.Typer(no_args_is_help=True, help="The models harnessrl can run.")
app.add_typer(harness_app, name="harness")
app.add_typer(tasks_app, name="tasks")
app.add_typer(models_app, name="models")

from harnessrl.train.command import train_app  # noqa: E402  (a sub-app: GRPO across harnesses)

app.add_typer(train_app, name="train")

from harnessrl.evolve.command import evolve_cmd  # noqa: E402  (harness evolution)

app.command("evolve")(evolve_cmd)

# When piped, rich would squeeze tables into 80 columns; give them room instead.
out = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)


def fail(message: str, code: int = 2) -> None:
    """One clear line on stderr and a non-zero exit: for user errors, never a traceback."""
    err.print("[bold red]error:[/] ", end="")
    err.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


# ------------------------------------------------------------------------------------------------
# harness


@harness_app.command("list")
def harness_list() -> None:
    """The built-in harnesses and how they differ."""
    from harnessrl.harness.registry import builtin_names, load_harness

    table = Table("name", "protocol", "loop", "steps", "history", "demos", "guards", "description")
    for name in builtin_names():
        s = load_harness(name)
        r = s.rules
        c = s.capabilities
        guards = [
            g
            for g, on in (
                ("loop", r.loop_guard.enabled), ("budget", r.budget_notice.enabled), ("memory", s.bootstrap.memory_tool),
                ("verify", r.submit_checkpoint.enabled), ("shell", r.shell.enabled), ("ledger", c.ledger.enabled),
                ("lessons", bool(c.experiences)), ("helpers", bool(c.helper_tools)),
            )
            if on
        ]
        history = "all" if r.history_window is None else f"last {r.history_window}"
        if r.observation_window is not None:
            history += f", {r.observation_window} obs."
        table.add_row(
            s.name,
            s.protocol.format + ("" if s.protocol.lenient else " (strict)"),
            s.loop.kind,
            str(r.max_steps),
            history,
            str(len(r.demonstrations)),
            ",".join(guards) or "-",
            " ".join(s.description.split()),  # the table wraps it; a cut mid-word reads badly
        )
    out.print(table)


@harness_app.command("show")
def harness_show(name: Annotated[str, typer.Argument(help="built-in name or spec path")]) -> None:
    """Print a harness spec as YAML."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import SpecError

    try:
        spec = load_harness(name)
    except SpecError as e:
        fail(str(e))
    sys.stdout.write(spec.to_yaml())


@harness_app.command("validate")
def harness_validate(paths: Annotated[list[Path], typer.Argument(help="spec files")]) -> None:
    """Validate spec files; exits 1 if any is invalid."""
    from harnessrl.harness.spec import SpecError, load_spec

    bad = 0
    for p in paths:
        try:
            spec = load_spec(p)
            out.print(f"[green]ok[/] {p} ({spec.name})", highlight=False)
        except SpecError as e:
            err.print("[bold red]invalid:[/] ", end="")
            err.print(str(e), markup=False, highlight=False, soft_wrap=True)
            bad += 1
    if bad:
        raise typer.Exit(1)


@harness_app.command("schema")
def harness_schema() -> None:
    """Print the JSON schema of harness specs."""
    from harnessrl.harness.spec import spec_json_schema

    sys.stdout.write(json.dumps(spec_json_schema(), indent=2) + "\n")


# ------------------------------------------------------------------------------------------------
# tasks


@tasks_app.command("list")
def tasks_list(suite: Annotated[Optional[str], typer.Option(help="only this suite")] = None) -> None:
    """Suites, their split sizes and task families."""
    from harnessrl.tasks import get_suite, list_suites

    names = list_suites() if suite is None else [suite]
    table = Table("suite", "train", "dev", "test", "families", "description")
    for n in names:
        try:
            s = get_suite(n)
        except ValueError as e:
            fail(str(e))
        table.add_row(
            n,
            str(s.split_sizes.get("train", 0)),
            str(s.split_sizes.get("dev", 0)),
            str(s.split_sizes.get("test", 0)),
            ", ".join(s.family_names()),
            s.description,
        )
    out.print(table)


@tasks_app.command("show")
def tasks_show(task_id: Annotated[str, typer.Argument(help="suite/split/index, e.g. workspace/dev/00003")]) -> None:
    """Show one task: instruction, tools and the known-good solution."""
    from harnessrl.tasks import get_suite

    try:
        task = get_suite(task_id.split("/")[0]).task(task_id)
    except ValueError as e:
        fail(str(e))
    out.print(f"{task.id} family={task.family} pass_threshold={task.pass_threshold}", markup=False, highlight=False)
    out.print(task.instruction, markup=False, highlight=False)
    out.print("tools: " + ", ".join(t.name for t in task.tools), markup=False, highlight=False)
    out.print("solution: " + json.dumps(task.solution), markup=False, highlight=False, soft_wrap=True)


# ------------------------------------------------------------------------------------------------
# models


def _size(n: int | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@models_app.command("list")
def models_list() -> None:
    """Named models: what they are, where they are cached, their size on disk."""
    from harnessrl.models import SPEC_FORMS, describe_models

    table = Table("name", "available", "cached", "size", "cache folder", "source")
    for m in describe_models():
        table.add_row(m["name"], "yes" if m["available"] else "no", "yes" if m["cached"] else "no", _size(m["size_bytes"]), m["cache"], m["source"])
    out.print(table)
    out.print(f"model forms: {SPEC_FORMS}", markup=False, highlight=False)


# ------------------------------------------------------------------------------------------------
# eval


def _summaries(store: Any, attempts: int) -> dict[str, Any]:
    from harnessrl.metrics import summarize_harness

    result = {}
    for h in store.harnesses():
        trajs = list(store.trajectories(harness=h, with_tokens=False))
        result[h] = summarize_harness(trajs, attempts)
    return result


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_summary_table(summary: dict[str, Any]) -> None:
    table = Table(title=f"{summary['suite']} / {summary['split']} / {summary['model']}")
    for col in ("harness", "tasks", "episodes", "mean score", "95% CI", "pass@1", "pass@k", "pass^k", "delivery", "infra"):
        table.add_column(col, justify="left" if col == "harness" else "right", no_wrap=col == "harness")
    for name, m in summary["harnesses"].items():
        k = str(m["attempts"])
        ci = m.get("mean_score_ci95")
        table.add_row(
            name,
            str(m["n_tasks"]),
            str(m["n_episodes"]),
            _fmt(m["mean_score"]),
            "-" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]",
            _fmt((m.get("pass_at_k") or {}).get("1")),
            _fmt((m.get("pass_at_k") or {}).get(k)) + f" (k={k})",
            _fmt((m.get("pass_hat_k") or {}).get(k)),
            _fmt(m["delivery_rate"]),
            str(m["n_infra_errors"]),
        )
    out.print(table)


def write_summary(store: Any, config: dict[str, Any], folder: Path) -> dict[str, Any]:
    summary = {
        "suite": config["suite"],
        "split": config["split"],
        "model": config["model"],
        "seed": config["seed"],
        "harnesses": _summaries(store, config["attempts"]),
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def check_model_spec(spec: str, api_key_env: str | None, option: str, key_option: str) -> None:
    """Fail (exit 2) on a model spec that cannot name a model, before anything slow is loaded.
    `option` prefixes the messages ("" for --model); `key_option` names the API-key option."""
    from harnessrl.models import MODEL_NAMES, SPEC_FORMS

    prefix = f"{option}: " if option else ""
    spec = spec.strip()
    if spec.startswith("hf:"):
        if not Path(spec[3:]).exists():
            fail(f"{prefix}model path '{spec[3:]}' does not exist")
    elif spec.startswith("openai:"):
        from harnessrl.models.openai_compat import parse_spec as parse_openai_spec

        try:
            parse_openai_spec(spec)
        except ValueError as e:
            fail(f"{prefix}{e}")
        if api_key_env and not os.environ.get(api_key_env):
            fail(f"{key_option} {api_key_env}: that environment variable is not set")
    elif spec not in MODEL_NAMES:
        fail(f"{prefix}unknown model '{spec}' (known forms: {SPEC_FORMS})")


@app.command("eval")
def eval_cmd(
    suite: Annotated[str, typer.Option(help="suite name (see `harnessrl tasks list`)")] = "workspace",
    split: Annotated[str, typer.Option(help="train, dev or test")] = "dev",
    harness: Annotated[list[str], typer.Option("--harness", "-H", help="built-in name, 'all', or a spec path; repeat or comma-separate")] = ["all"],
    model: Annotated[str, typer.Option(help="tiny-random, smollm2-135m, hf:PATH or openai:MODEL@BASE_URL")] = "tiny-random",
    tasks: Annotated[Optional[int], typer.Option("--tasks", "-n", help="first N tasks of the split (default: all)")] = None,
    attempts: Annotated[int, typer.Option("--attempts", "-k", help="attempts per task and harness")] = 1,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="run folder")] = Path("runs/eval"),
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    temperature: Annotated[float, typer.Option(help="sampling temperature (0 = greedy)")] = 0.7,
    top_p: Annotated[float, typer.Option(help="nucleus sampling")] = 1.0,
    max_in_flight: Annotated[int, typer.Option(help="episodes in flight (batch size of generation)")] = 16,
    retries: Annotated[int, typer.Option(help="re-runs of an episode after an infrastructure error")] = 2,
    resume: Annotated[bool, typer.Option("--resume", help="continue a run folder, skipping finished episodes")] = False,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
    api_key_env: Annotated[Optional[str], typer.Option(help="openai: read the API key from this environment variable (default OPENAI_API_KEY)")] = None,
    judge_model: Annotated[Optional[str], typer.Option(help="grade the LLM-judge parts of PinchBench tasks with this model (any --model form)")] = None,
    judge_api_key_env: Annotated[Optional[str], typer.Option(help="openai judge: read its API key from this environment variable (default OPENAI_API_KEY)")] = None,
) -> None:
    """Evaluate a model on a suite through one or more harnesses."""
    from harnessrl.harness.registry import resolve_harnesses
    from harnessrl.harness.spec import SpecError
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.store import RunStore, StoreError
    from harnessrl.tasks import get_suite

    # -- every config error before any work ---------------------------------------------------------
    if attempts < 1:
        fail("--attempts must be >= 1")
    if max_in_flight < 1:
        fail("--max-in-flight must be >= 1")
    if retries < 0:
        fail("--retries must be >= 0")
    try:
        sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
    except Exception as e:
        fail(f"invalid sampling parameters: {str(e).splitlines()[-1] if str(e) else e}")
    try:
        specs = resolve_harnesses(harness)
    except SpecError as e:
        fail(str(e))
    judge = None
    if judge_model is not None:
        from harnessrl.tasks.importers.pinchbench import ModelJudge

        check_model_spec(judge_model, judge_api_key_env, "--judge-model", "--judge-api-key-env")
        judge = ModelJudge(judge_model.strip(), api_key_env=judge_api_key_env)
    elif judge_api_key_env is not None:
        fail("--judge-api-key-env needs --judge-model")
    try:
        the_suite = get_suite(suite) if judge is None else get_suite(suite, judge=judge)
        task_list = the_suite.tasks(split, tasks)
    except ValueError as e:
        fail(str(e))
    if not task_list:
        fail("no tasks selected (--tasks 0?)")
    if judge is not None:
        from harnessrl.tasks.importers.pinchbench import is_judged

        if not any(is_judged(t) for t in task_list):
            fail(f"--judge-model: no selected task of suite '{suite}' has a part graded by an LLM judge (only PinchBench llm_judge and hybrid tasks do)")
    check_model_spec(model, api_key_env, "", "--api-key-env")

    config = {
        "harnessrl_version": __version__,
        "suite": suite,
        "split": split,
        "model": model,
        "seed": seed,
        "tasks": len(task_list),
        "task_ids": [t.id for t in task_list],
        "attempts": attempts,
        "sampling": sampling.model_dump(),
        "harnesses": {s.name: s.to_dict() for s in specs},
        "max_retries": retries,
        "api_key_env": api_key_env,  # the variable's name only, never the key
        "judge_model": judge_model,
        "judge_api_key_env": judge_api_key_env,
    }
    if any(s.rules.shell.enabled for s in specs) and any(t.offers_shell for t in task_list):
        from harnessrl.tasks.sandbox_exec import isolation_available, isolation_description

        config["shell_isolation"] = isolation_description(isolation_available())
    exists = RunStore.exists(out_dir)
    if exists and not resume:
        fail(f"{out_dir} already holds a run; use --resume to continue it or choose another --out")
    if resume and not exists:
        fail(f"{out_dir} holds no run to resume")
    try:
        store = RunStore(out_dir)
    except (StoreError, OSError) as e:
        fail(str(e))
    if resume:
        old = store.config or {}
        diff = sorted(k for k in set(old) | set(config) if k != "harnessrl_version" and old.get(k) != config.get(k))
        if diff:
            fail(f"--resume with a different configuration ({', '.join(diff)} differ from the stored run)")
    else:
        store.set_meta("config", config)

    jobs = make_jobs(task_list, specs, attempts)
    done = store.finished_keys()
    todo = [j for j in jobs if j.key not in done]
    if resume:
        err.print(f"resuming: {len(jobs) - len(todo)} of {len(jobs)} episodes already finished", highlight=False)

    # -- the model (slow) ------------------------------------------------------------------------------
    from harnessrl.models import load_policy

    try:
        policy = load_policy(model, sampling, api_key_env=api_key_env)
    except (ValueError, RuntimeError, OSError) as e:
        fail(f"cannot load model '{model}': {e}")
    store.set_meta("model", policy.describe())
    if judge is not None:
        try:
            judge.load()
        except (ValueError, RuntimeError, OSError) as e:
            fail(f"cannot load judge model '{judge_model}': {e}")

    runner = Runner(policy, sampling, max_in_flight=max_in_flight, max_retries=retries, on_episode=store.add, progress=progress)
    try:
        runner.run(todo)
    except KeyboardInterrupt:
        err.print(f"interrupted: finished episodes are saved; continue with --resume --out {out_dir}", highlight=False)
        raise typer.Exit(130)
    summary = write_summary(store, config, out_dir)
    print_summary_table(summary)
    out.print(f"run folder: {out_dir}  (summary.json, run.db)", highlight=False)
    store.close()


@app.command("summary")
def summary_cmd(run: Annotated[Path, typer.Argument(help="run folder")]) -> None:
    """Recompute and print the per-harness table of a run folder."""
    from harnessrl.store import RunStore

    if not RunStore.exists(run):
        fail(f"{run} holds no run (no run.db)")
    with RunStore(run) as store:
        config = store.config
        if not config:
            fail(f"{run}: run database has no config")
        print_summary_table(write_summary(store, config, run))


@app.command("export")
def export_cmd(
    run: Annotated[Path, typer.Argument(help="run folder")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="jsonl")] = "jsonl",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file (default: stdout)")] = None,
    tokens: Annotated[bool, typer.Option(help="include prompt/completion token ids and logprobs")] = True,
) -> None:
    """Export every episode of a run as one JSON trajectory per line."""
    from harnessrl.store import RunStore

    if fmt != "jsonl":
        fail(f"unknown export format '{fmt}' (available: jsonl)")
    if not RunStore.exists(run):
        fail(f"{run} holds no run (no run.db)")
    with RunStore(run) as store:
        fh = open(output, "w", encoding="utf-8") if output else sys.stdout
        try:
            for traj in store.trajectories(with_tokens=tokens):
                fh.write(traj.model_dump_json() + "\n")
        finally:
            if output:
                fh.close()


@app.command("triage")
def triage_cmd(run: Annotated[Path, typer.Argument(help="run folder")]) -> None:
    """Classify every failed episode by its first failure signal; writes RUN/triage.json."""
    from harnessrl.store import RunStore
    from harnessrl.triage import CONTENT, PROCESS, triage, write_triage

    if not RunStore.exists(run):
        fail(f"{run} is not a run folder (no run.db)")
    with RunStore(run) as store:
        result = triage(store.trajectories(with_tokens=False))
    path = write_triage(result, run)
    table = Table(title=f"first failure signal per harness ({run})")
    table.add_column("harness", no_wrap=True)
    for col in ("failed", *PROCESS, *CONTENT, "infra", "process share"):
        table.add_column(col.replace("_", " "), justify="right")
    for name, h in result.items():
        share = h["process_share"]
        table.add_row(
            name,
            f"{h['n_failed']}/{h['n_valid']}",
            *[str(h["counts"][c]) for c in (*PROCESS, *CONTENT, "infra")],
            "-" if share is None else f"{share:.0%}",
        )
    out.print(table)
    out.print(f"wrote {path}", highlight=False)


@app.command("report")
def report_cmd(
    runs: Annotated[list[Path], typer.Argument(help="one run folder, or two to compare (B - A)")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="report folder (default: FIRST_RUN/report)")] = None,
) -> None:
    """Build the static HTML report (metrics, plots, triage, trajectory viewer)."""
    from harnessrl.report import ReportError, build_report

    try:
        index = build_report(list(runs), out_dir)
    except ReportError as e:
        fail(str(e))
    out.print(f"wrote {index}", highlight=False)
    out.print(f"view it with: harnessrl view {runs[0]}  (or open the file in a browser)", highlight=False)


@app.command("view")
def view_cmd(
    run: Annotated[Path, typer.Argument(help="run folder (its report is built if missing) or report folder")],
    port: Annotated[int, typer.Option(help="port on 127.0.0.1 (0 = any free port)")] = 0,
) -> None:
    """Serve a run's report on 127.0.0.1 and print the URL; Ctrl-C stops."""
    import time

    from harnessrl.report import ReportError, build_report, serve

    try:
        if (run / "run.db").is_file() and not (run / "report" / "index.html").is_file():
            build_report([run])
        server, url = serve(run, port=port)
    except (ReportError, OSError) as e:
        fail(str(e))
    out.print(f"serving {run} at {url}  (Ctrl-C to stop)", highlight=False)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


@app.command("version")
def version_cmd() -> None:
    """Print the version."""
    out.print(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
