"""Evaluation over its job context: `run_eval(enter("eval", EvalConfig(...), out))` (harnessrl.kernel).

Every configuration error is raised (EvalError) before anything slow happens (loading the model,
running episodes); then the run folder is opened (see rundir.py: resume, config diff), the
unfinished episodes run, and summary.json is written from the run database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnessrl.errors import JobError
from harnessrl.eval_folder import EvaluationFolder
from harnessrl.eval_folder import write_summary as write_summary  # cli/eval.py's `summary` reads it here
from harnessrl.results import EvalSummary

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext


class EvalError(JobError):
    """A configuration or run-folder problem, reported before any episode runs."""


def run_eval(ctx: JobContext) -> EvalSummary:
    """Evaluate the model on the suite through every harness, over the job's context
    (harnessrl.kernel.enter: its model and judge, suite, tasks and harnesses, and the preflight
    when asked); returns the summary. Its episodes run on `ctx.executor` (the caller closes it)."""
    from harnessrl.models import load_policy
    from harnessrl.models.base import SamplingParams

    # -- every config error before any work -----------------------------------------------------------
    config, executor, judge = ctx.config, ctx.executor, ctx.inputs.judge
    specs, task_list = ctx.inputs.harnesses["harness"], ctx.inputs.tasks["tasks"]
    if judge is not None and executor.kind != "local":
        # the judge grades where the episodes are graded, and models stay in this process
        raise EvalError(f"--judge-model runs with --executor local only, not {executor.kind}")
    if not task_list:
        raise EvalError("no tasks selected")
    if judge is not None:
        from harnessrl.tasks.importers import has_judged_part

        if not any(has_judged_part(t) for t in task_list):
            raise EvalError(
                f"--judge-model: no selected task of suite '{config.suite}' has a part graded by an LLM judge "
                "(only PinchBench llm_judge and hybrid tasks and Claw-Eval tasks whose grader uses the judge do)"
            )

    sampling = SamplingParams(
        temperature=config.temperature,
        top_p=config.top_p,
        seed=config.seed,
        top_k=config.top_k,
        min_p=config.min_p,
        repetition_penalty=config.repetition_penalty,
        frequency_penalty=config.frequency_penalty,
        presence_penalty=config.presence_penalty,
    )
    evaluation = EvaluationFolder(
        ctx.out,
        config.suite,
        config.split,
        config.model,
        task_list,
        specs,
        config.attempts,
        sampling,
        config.retries,
        api_key_env=config.api_key_env,
        judge_model=config.judge_model,
        judge_api_key_env=config.judge_api_key_env,
    )
    model = ctx.model()
    record = evaluation.record
    record.update(model.recorded())  # a local model's device (may differ on resume) and non-float32 dtype
    record["executor"] = executor.describe()  # never compared on resume: a run may continue elsewhere
    evaluation.open(resume=ctx.resume, may_differ=("device",))  # a refusal is a RunFolderError
    executor.prepare(task_list, specs)  # connect; every task and harness can go there (ExecutorError)
    with evaluation:
        evaluation.start()
        todo = evaluation.todo()
        if ctx.resume:
            jobs = len(evaluation.jobs)
            ctx.log(f"resuming: {jobs - len(todo)} of {jobs} episodes already finished")

        # -- the models (slow) ----------------------------------------------------------------------
        policy = None  # the oracle
        if not model.oracle:
            try:
                policy = load_policy(model, sampling)
            except (ValueError, RuntimeError, OSError) as e:
                raise EvalError(f"cannot load model '{config.model}': {e}") from None
        if judge is not None:  # (the oracle's episodes are graded by the judge too)
            try:
                judge.load()
            except (ValueError, RuntimeError, OSError) as e:
                raise EvalError(f"cannot load judge model '{config.judge_model}': {e}") from None
        try:
            evaluation.run(todo, policy, config.max_in_flight, ctx.progress, executor)
        finally:  # a local model's engine thread ends here, a step in progress cut short
            close = getattr(policy, "close", None)
            if close is not None:
                close()
        return evaluation.summary()
