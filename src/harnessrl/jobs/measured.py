"""Did a job measure anything? Every job that runs episodes (eval, evolve, study, improve, train
grpo / sft --sample / distill) keeps them in run databases under its run folder (`run.db` of an
evaluation, `rollouts/run.db` of a trainer, one per stage or cell); a run all of whose episodes
were infrastructure errors (a dead model server, an agent program that never made a model call,
a grader that crashed) ran, but measured nothing of the model: the command line then exits
NOTHING_MEASURED with the first error instead of reporting its zeros (docs/jobs.md, "One error").

`tally(out)` counts the episodes and infrastructure errors under a run folder and keeps the
first error; `nothing_measured(out)` is the message when every episode was one, else None.
`measuring(out)` wraps a job: a job that fails (evolve's noise estimate with no scored task, a
stage that finds nothing to learn from) after every episode it ran was an infrastructure error
raises NothingMeasured instead, the job's own error chained and named.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import JobError

# The exit status of a job whose every episode was an infrastructure error.
NOTHING_MEASURED = 3
_DB = "run.db"
_METRICS = "metrics.jsonl"  # a trainer's steps: episodes and infra_errors per step (rollouts not kept)


class NothingMeasured(JobError):
    """Every episode of the run was an infrastructure error: nothing was measured."""

    exit_code = NOTHING_MEASURED


@dataclass
class Tally:
    """The episodes under a run folder: how many, how many were infrastructure errors, the first."""

    episodes: int = 0
    infra: int = 0
    first: str = ""  # the first infrastructure error, by the time it was recorded ("" unknown)

    @property
    def nothing_measured(self) -> bool:
        return self.episodes > 0 and self.infra == self.episodes


def tally(out: str | Path, since: float | None = None) -> Tally:
    """Every run database under `out` (the folder itself included), read without changing it;
    a trainer that kept no rollouts: its metrics.jsonl steps. `since` (a time.time()): only the
    episodes recorded from then on (run databases alone)."""
    out = Path(out)
    found = Tally()
    if not out.is_dir():
        return found
    databases = sorted(out.rglob(_DB))
    first_at: float | None = None
    for db in databases:
        try:
            connection = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        except sqlite3.Error:
            continue
        try:
            after = -1.0 if since is None else since
            episodes, infra = connection.execute(
                "SELECT count(*), coalesce(sum(infra), 0) FROM episodes WHERE created_at >= ?", (after,)
            ).fetchone()
            row = connection.execute(
                "SELECT created_at, trajectory FROM episodes WHERE infra = 1 AND created_at >= ? "
                "ORDER BY created_at LIMIT 1",
                (after,),
            ).fetchone()
        except sqlite3.Error:  # not a run database (or not one yet): nothing recorded there
            continue
        finally:
            connection.close()
        found.episodes += int(episodes)
        found.infra += int(infra)
        if row is not None and (first_at is None or row[0] < first_at):
            first_at, found.first = row[0], _infra_error(row[1])
    if not databases and since is None:
        for metrics in sorted(out.rglob(_METRICS)):
            for line in metrics.read_text(encoding="utf-8").splitlines():
                record = json.loads(line) if line.strip() else {}
                if isinstance(record.get("episodes"), int) and isinstance(record.get("infra_errors"), int):
                    found.episodes += record["episodes"]
                    found.infra += record["infra_errors"]
    return found


def _infra_error(trajectory: str) -> str:
    try:
        data = json.loads(trajectory)
    except ValueError:
        return ""
    return str(data.get("infra_error") or data.get("termination_detail") or "")


def message(episodes: int, first: str) -> str:
    """The one line every job says when it measured nothing (eval's words)."""
    return (
        f"every episode of the run ({episodes}) was an infrastructure error, so nothing was measured; "
        f"the first: {first or 'not kept (the run kept no episodes: see its metrics.jsonl)'}"
    )


def nothing_measured(out: str | Path) -> str | None:
    """The message for a run folder all of whose episodes were infrastructure errors, else None
    (some episode was measured, or none ran)."""
    counted = tally(out)
    return message(counted.episodes, counted.first) if counted.nothing_measured else None


@contextmanager
def measuring(out: str | Path, job: str) -> Iterator[None]:
    """Around a job's run (`job`: its command): an error it ends with, once every episode it
    recorded meanwhile was an infrastructure error, becomes NothingMeasured (exit 3) with the
    first of them; an error before any episode, and Ctrl-C, pass as they are."""
    started = time.time()
    try:
        yield
    except NothingMeasured:
        raise
    except Exception as e:
        counted = tally(out, since=started)
        if not counted.nothing_measured:
            raise
        raise NothingMeasured(f"{message(counted.episodes, counted.first)} ({job} stopped: {e})") from e
