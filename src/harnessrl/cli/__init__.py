"""The `harnessrl` command line: one module per command group, assembled here.

harness.py   harness list / show / validate / schema
tasks.py     tasks list / show, models list
eval.py      eval, summary
preflight.py preflight (each harness's first request against the model's context)
export.py    export (JSONL, Inspect AI logs, Harbor ATIF)
report.py    triage, report, view
evolve.py    evolve
train.py     train grpo, train sft, train distill
study.py     study
improve.py   improve
serve.py     serve
audit.py     audit (reward-hacking probes against a suite's graders)
common.py    consoles, `fail`, model-spec checks, options generated from the job configs
"""

from __future__ import annotations

import os

# OpenMP's threads sleep while they wait, unless the user chose otherwise: read once, when torch
# loads (the commands below import it), and inherited by every process a command starts. On a
# 2-core machine that other jobs kept busy, two torch threads spinning (the default) made decode
# 3-4x and a LoRA update 3.5x slower than one thread; sleeping, they were within 0.87-1.07x of it,
# and as fast as spinning on an idle machine (docs/BENCHMARKS.md, "Threads and the OpenMP wait
# policy").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer

from harnessrl import __version__
from harnessrl.cli.audit import audit_cmd
from harnessrl.cli.common import out
from harnessrl.cli.compare import compare_cmd
from harnessrl.cli.eval import eval_cmd, summary_cmd
from harnessrl.cli.evolve import evolve_cmd
from harnessrl.cli.export import export_cmd
from harnessrl.cli.harness import harness_app
from harnessrl.cli.import_traces import import_traces_cmd
from harnessrl.cli.improve import improve_cmd
from harnessrl.cli.preflight import preflight_cmd
from harnessrl.cli.report import report_cmd, triage_cmd, view_cmd
from harnessrl.cli.serve import serve_cmd
from harnessrl.cli.study import study_cmd
from harnessrl.cli.tasks import models_app, tasks_app
from harnessrl.cli.train import train_app

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Evaluate, diagnose, improve and train one LLM agent across many harnesses.",
)
app.add_typer(harness_app, name="harness")
app.add_typer(tasks_app, name="tasks")
app.add_typer(models_app, name="models")
app.add_typer(train_app, name="train")
app.command("eval")(eval_cmd)
app.command("summary")(summary_cmd)
app.command("compare")(compare_cmd)
app.command("preflight")(preflight_cmd)
app.command("export")(export_cmd)
app.command("import-traces")(import_traces_cmd)
app.command("triage")(triage_cmd)
app.command("report")(report_cmd)
app.command("view")(view_cmd)
app.command("evolve")(evolve_cmd)
app.command("study")(study_cmd)
app.command("improve")(improve_cmd)
app.command("serve")(serve_cmd)
app.command("audit")(audit_cmd)


@app.command("version")
def version_cmd() -> None:
    """Print the version."""
    out.print(__version__)


def main() -> None:
    app()


__all__ = ["app", "main"]
