"""JobError: the one error a job (eval, evolve, study, improve, train grpo / sft / distill)
raises to say it cannot run as asked, and the one the command line turns into a clear line.

Each job keeps a subclass with its name (EvalError, TrainError, ...) so that a library caller
can tell them apart, but the command line catches JobError alone: its message is printed in one
line, never a traceback, and the process exits with the error's `exit_code` (2: the run cannot
start or go on as asked, a user error; 1: the run itself failed, e.g. training diverged).

This module imports nothing, so every layer (the run folder, the executors, the trainers, the
evolution, the jobs) can raise it without importing upward.
"""

from __future__ import annotations

USER_ERROR = 2
RUN_FAILED = 1


class JobError(ValueError):
    """A job cannot run as asked: a bad option, a model or device this machine lacks, a refused
    run folder or resume, a task or harness that cannot go where the episodes run. Reported
    before any work where it can be; the command line exits `exit_code` with the message."""

    exit_code: int = USER_ERROR


class JobFailed(JobError, RuntimeError):
    """The run itself failed after it started (training diverged): what finished is kept; the
    command line exits 1."""

    exit_code = RUN_FAILED
