"""`harnessrl evolve`: its options are EvolveConfig's fields (plus the run folder's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field

from harnessrl.cli.common import check_measured, config_command, err, executor_for, given_options, job_errors, out
from harnessrl.config import ExecutorOptions, run_options
from harnessrl.evolve.config import EvolveConfig

if TYPE_CHECKING:
    from harnessrl.results import EvolveResult

EvolveRun = run_options(
    "runs/evo",
    "continue the run in --out: options left out take its recorded values; --iterations lengthens or shortens "
    "the search, --device may change, another difference is refused",
    base=ExecutorOptions,
    api_key_env=(Optional[str], Field(None, description="openai: the environment variable with the API key")),
)


@config_command(EvolveConfig, EvolveRun)
def evolve_cmd(config: EvolveConfig, run: Any) -> None:
    """Evolve a harness: propose edits, keep those that beat measured noise on dev tasks, confirm once on test tasks.

    Exit status 3: every episode was an infrastructure error (nothing was measured)."""
    from harnessrl.jobs import entries

    saved = "the incumbent, the log and finished episodes are saved"
    with job_errors(run.out, saved):
        with executor_for(run) as executor:
            done = entries.evolve(
                config,
                run,
                given=given_options(),
                log=lambda m: err.print(m, highlight=False, markup=False),
                executor=executor,
            )
    print_final(done.result, done.config)
    out.print(f"run folder: {run.out} (evolution.jsonl, best_harness.yaml, final.json)", highlight=False)
    check_measured(run.out)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_final(final: EvolveResult, config: EvolveConfig) -> None:
    s, b, d = final.seed, final.best_harness, final.paired_difference
    out.print(f"held-out ({config.suite}/test, {s.n_tasks} tasks x {config.rollouts}):", highlight=False)
    for name, r in (("seed", s), ("best", b)):
        lo, hi = r.mean_score_ci95 or (None, None)
        out.print(
            f"  {name:5s} mean {_fmt(r.mean_score)} [{_fmt(lo)}, {_fmt(hi)}]  "
            f"pass@1 {_fmt(r.pass_at_k.get('1'))}  delivery {_fmt(r.delivery_rate)}  "
            f"process share {_fmt(r.triage['process_share'])}",
            highlight=False,
        )
    lo, hi = d.ci95 or (None, None)
    out.print(
        f"  best - seed {_fmt(d.mean_difference)} [{_fmt(lo)}, {_fmt(hi)}]; accepted edits: "
        f"{len(final.accepted_edits)} ({final.unconfirmed_candidates} more beat the threshold once, "
        "not on confirmation)",
        highlight=False,
    )
