"""The benchmarks' record: one JSON line per run in `bench/results/<benchmark>.jsonl`.

A bench script given `--record` appends its run here (`record_run`), and `bench/write_doc.py`
turns the records into docs/BENCHMARKS.md: one table per benchmark table, each row the latest
run of its configuration, with the commands and dates that produced them.

A record:

    {"benchmark": "rollout_mismatch",          # the file's stem
     "table": "main",                          # which of the benchmark's tables (default "main")
     "date": "2026-12-02",                     # UTC date of the run
     "command": "HARNESSRL_THREADS=1 .venv/bin/python bench/rollout_mismatch.py",
     "machine": "2 cores, ...",                # where it ran (optional)
     "rows": [{"sampler": "float32", "tokens": 318, ...}, ...],   # column header -> value
     "replace_table": false,                   # true: this run's rows replace every older row
     "entered": false,                         # true: entered from a run's printed table, not by --record
     "results": {...}}                         # the script's whole JSON output (optional)

A row's first column is its label: a newer record's row with the same label replaces the older
one. Values are numbers or strings; `write_doc.py` prints numbers as they were recorded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--record",
        action="store_true",
        help="append this run to bench/results/<benchmark>.jsonl (`make benchmarks-doc` then rewrites the page)",
    )


def this_command() -> str:
    """The command line that started this process, as a user would type it."""
    script = Path(sys.argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    env = [f"{k}={os.environ[k]}" for k in ("HARNESSRL_THREADS",) if k in os.environ]
    args = [a for a in sys.argv[1:] if a != "--record"]
    return " ".join([*env, ".venv/bin/python", shlex.quote(str(script)), *map(shlex.quote, args)])


def this_machine() -> str:
    threads = os.environ.get("HARNESSRL_THREADS", "default")
    return f"{os.cpu_count()} cores ({platform.machine()}), torch threads {threads}"


def record_run(
    benchmark: str,
    rows: list[dict[str, Any]],
    *,
    table: str = "main",
    results: Any = None,
    replace_table: bool = False,
    results_dir: Path | None = None,
    command: str | None = None,
    machine: str | None = None,
) -> Path:
    """Append one run of `benchmark` to its results file; returns the file. `command` and
    `machine` default to this process's (a script recording another command's run names it)."""
    if not rows:
        raise ValueError("a record needs at least one row")
    record: dict[str, Any] = {
        "benchmark": benchmark,
        "table": table,
        "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "command": command or this_command(),
        "machine": machine or this_machine(),
        "rows": rows,
    }
    if replace_table:
        record["replace_table"] = True
    if results is not None:
        record["results"] = results
    folder = results_dir or RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{benchmark}.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, ensure_ascii=False, default=float) + "\n")
    print(f"recorded in {path}", file=sys.stderr)
    return path


def read_records(results_dir: Path | None = None) -> list[dict[str, Any]]:
    """Every record of every results file, in file order; a malformed line is an error naming it."""
    folder = results_dir or RESULTS_DIR
    out: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            missing = [k for k in ("date", "command", "rows") if k not in rec]
            if missing or not isinstance(rec.get("rows"), list) or not rec["rows"]:
                raise ValueError(f"{path}:{n}: a record needs date, command and a non-empty rows list")
            rec.setdefault("benchmark", path.stem)
            rec.setdefault("table", "main")
            out.append(rec)
    return out


# ------------------------------------------------------------------------------------------------
# Per-task records: the episodes behind an experiment's intervals, one small file per evaluation
# and per training run under bench/results/records/EXPERIMENT/RUN/ (records/README.md describes
# them). bench/write_doc.py recomputes every interval it prints from these files.

RECORDS_DIR = RESULTS_DIR / "records"


def write_lines(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as JSON lines (keys in the order given), replacing the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def eval_rows(run: Path) -> list[dict[str, Any]]:
    """One row per (harness, task) of an evaluation folder, sorted: each attempt's score and
    pass in attempt order, None for an infrastructure error (left out of every estimate, as
    harnessrl.metrics does; a valid episode never graded scores 0)."""
    from harnessrl.store import RunStore

    with RunStore(run) as store:
        episodes = list(store.trajectories(with_tokens=False))
    by_task: dict[tuple[str, str], list] = {}
    for t in episodes:
        by_task.setdefault((t.harness, t.task_id), []).append(t)
    rows = []
    for (harness, task), ts in sorted(by_task.items()):
        ts.sort(key=lambda t: t.attempt)
        rows.append(
            {
                "harness": harness,
                "task": task,
                "scores": [None if t.is_infra_error else (t.grade.score if t.grade else 0.0) for t in ts],
                "passed": [None if t.is_infra_error else bool(t.grade and t.grade.passed) for t in ts],
            }
        )
    return rows


def train_rows(run: Path, scheduler_states: dict[int, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per step of a `harnessrl train grpo` folder: what metrics.jsonl says of the step
    (the chosen harness or "mixed", shares, the scheduler's probabilities at selection, reward,
    groups, the update) and, per harness, the step's groups from rollouts/run.db: groups, groups
    with signal (attempts that disagree), mean reward, and learnability (mean |advantage| over the
    harness's episodes, as HarnessBandit measures it); the chosen harness's `transfer` is the mean
    cosine of the step's gradient sketch with the other harnesses' average sketches (HarnessBandit's
    transferability; the row's `cosines` holds each one), absent where undefined (a mixed step, no
    update, no other harness seen yet). `scheduler_states`: step -> the scheduler's state after
    that step (checkpoint/state.json); its per-harness `score` and `count` are added."""
    import torch

    from harnessrl.store import RunStore
    from harnessrl.train.grpo import group_advantages

    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    rounds = config["max_sampling_rounds"] if config.get("dynamic_sampling") else 1
    per_step = config["group_size"] * rounds  # attempt numbers of a step (harnessrl.train.step.attempt_base)
    groups: dict[tuple[int, str, str], list] = {}
    if (run / "rollouts" / "run.db").is_file():
        with RunStore(run / "rollouts") as store:
            for t in store.trajectories(with_tokens=False):
                groups.setdefault((t.attempt // per_step + 1, t.harness, t.task_id), []).append(t)
    stats: dict[tuple[int, str], dict[str, Any]] = {}
    for (step, harness, _), episodes in sorted(groups.items()):
        s = stats.setdefault((step, harness), {"groups": 0, "signal_groups": 0, "rewards": [], "advantages": []})
        valid = [t for t in sorted(episodes, key=lambda t: t.attempt) if not t.is_infra_error and t.grade is not None]
        scores = [t.grade.score for t in valid]
        s["rewards"] += scores
        if len(valid) >= 2:
            a = group_advantages(torch.tensor([scores], dtype=torch.float64), scale=config["scale_advantages"])[0]
            s["groups"] += 1
            s["signal_groups"] += int(bool((a != 0).any()))
            s["advantages"] += a.abs().tolist()
    states = scheduler_states or {}
    rows = []
    for m in read_lines(run / "metrics.jsonl"):
        if "stopped" in m:
            continue
        step = m["step"]
        state = states.get(step, {})
        harnesses: dict[str, dict[str, Any]] = {}
        for h in config["harnesses"]:
            s = stats.get((step, h))
            cell: dict[str, Any] = {"p": m["probabilities"].get(h), "share": m["shares"].get(h, 0.0)}
            if s is not None:
                cell |= {
                    "groups": s["groups"],
                    "signal_groups": s["signal_groups"],
                    "reward": _mean(s["rewards"]),
                    "learnability": _mean(s["advantages"]),
                }
            for key in ("score", "count"):
                if h in state.get(key, {}):
                    cell[key] = state[key][h]
            harnesses[h] = cell
        if m["transfer"]:
            harnesses[m["harness"]]["transfer"] = _mean(list(m["transfer"].values()))
        row = {
            "step": step,
            "harness": m["harness"],
            "reward": m["reward_mean"],
            "groups": m["groups"],
            "signal_groups": sum(stats.get((step, h), {}).get("signal_groups", 0) for h in config["harnesses"]),
            "optimizer_step": m["optimizer_step"],
            "loss": m["loss"],
        }
        if m["transfer"]:
            row["cosines"] = m["transfer"]
        rows.append(row | {"harnesses": harnesses})
    return rows


def _mean(values: list[float]) -> float | None:
    from math import fsum

    return fsum(values) / len(values) if values else None


def metric_k(metric: str) -> int | None:
    """The k of "pass@K" / "pass^K"; None for "mean"; a ValueError for anything else."""
    if metric == "mean":
        return None
    if metric[:5] in ("pass@", "pass^") and metric[5:].isdigit() and int(metric[5:]) >= 1:
        return int(metric[5:])
    raise ValueError(f"unknown metric {metric!r}: mean, pass@K or pass^K (K an integer)")


def task_values(rows: list[dict[str, Any]], harnesses: list[str], metric: str = "mean") -> dict[str, float]:
    """Task -> the metric of its attempts, averaged over `harnesses` (those the task has).

    mean: the mean score of the valid attempts (harnessrl.metrics.task_scores); pass@K / pass^K:
    harnessrl.metrics' unbiased estimators over the valid attempts (a task with fewer than K
    valid attempts under a harness is left out there)."""
    from harnessrl.metrics import pass_at_k, pass_hat_k

    k = metric_k(metric)
    per_task: dict[str, list[float]] = {}
    for row in rows:
        if row["harness"] not in harnesses:
            continue
        scores = [s for s in row["scores"] if s is not None]
        if k is None:
            if scores:
                per_task.setdefault(row["task"], []).append(sum(scores) / len(scores))
            continue
        passed = [p for p in row["passed"] if p is not None]
        if len(passed) >= k:
            estimate = pass_at_k if metric.startswith("pass@") else pass_hat_k
            per_task.setdefault(row["task"], []).append(estimate(len(passed), sum(passed), k))
    return {task: sum(v) / len(v) for task, v in sorted(per_task.items())}


def records_run(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise ValueError(f"no per-task records in {run_dir} (run.json is missing)")
    return json.loads(path.read_text(encoding="utf-8"))


def pool_harnesses(run: dict[str, Any], harness: str) -> list[str]:
    """A harness name, or run.json's pool: "trained" (every trained harness), "held-out", or a
    name in run.json's "pools" (NAME -> harnesses)."""
    if harness in run.get("pools", {}):
        return list(run["pools"][harness])
    pools = run["harnesses"]
    if harness == "trained":
        return list(pools["trained"])
    if harness == "held-out":
        return [pools["held_out"]] if pools.get("held_out") else []
    return [harness]


def side_values(run_dir: Path, side: str, harnesses: list[str], metric: str) -> dict[str, float]:
    """Task -> metric of one side of a comparison: an evaluation's name, or several joined by
    "+" (seeds pooled: the task's mean over the evaluations, tasks all of them have)."""
    values = []
    for name in side.split("+"):
        path = run_dir / f"eval-{name}.jsonl"
        if not path.is_file():
            raise ValueError(f"no per-task records of evaluation {name!r} in {run_dir}")
        values.append(task_values(read_lines(path), harnesses, metric))
    shared = sorted(set.intersection(*(set(v) for v in values)))
    return {t: sum(v[t] for v in values) / len(values) for t in shared}


def records_difference(run_dir: Path, a: str, b: str, harness: str, metric: str = "mean", seed: int = 0) -> Any:
    """B - A paired by task (harnessrl.metrics.paired_difference: mean and 95 % bootstrap
    interval over the per-task differences) from the per-task records in `run_dir`."""
    from harnessrl.metrics import paired_difference

    harnesses = pool_harnesses(records_run(run_dir), harness)
    return paired_difference(
        side_values(run_dir, a, harnesses, metric), side_values(run_dir, b, harnesses, metric), seed=seed
    )


def interval_text(diff: Any) -> str:
    """ "+0.285 [+0.201, +0.375]" of a PairedDifference (or its dict); "-" without a shared task."""
    d = diff if isinstance(diff, dict) else diff.model_dump()
    if d["ci95"] is None:
        return "-"
    return f"{d['mean_difference']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"


def records_level(run_dir: Path, name: str, harness: str, metric: str = "mean", seed: int = 0) -> str:
    """ "0.174 [0.104, 0.257]": one evaluation's mean over tasks of `metric` with its 95 % bootstrap
    interval over tasks (harnessrl.metrics.bootstrap_ci), from the per-task records."""
    from harnessrl.metrics import bootstrap_ci

    values = list(side_values(run_dir, name, pool_harnesses(records_run(run_dir), harness), metric).values())
    if not values:
        return "-"
    lo, hi = bootstrap_ci(values, seed=seed)
    return f"{sum(values) / len(values):.3f} [{lo:.3f}, {hi:.3f}]"
