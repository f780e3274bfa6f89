"""The run database: one SQLite file (WAL) per run folder.

Tables:
- `meta(key, value)`: the run config (JSON) and bookkeeping;
- `episodes`: one row per (task_id, harness, attempt) key with the trajectory JSON (token arrays
  stripped) and the columns metrics and triage filter on;
- `model_calls`: one row per model call with prompt ids, completion ids and logprobs (JSON).

An episode and its model calls are written in ONE transaction as soon as the episode ends, so a
killed run loses at most the episodes in flight. Resume skips keys whose stored episode is not
an infrastructure error; infrastructure errors are re-run and their row replaced.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

from harnessrl.types import Trajectory

DB_NAME = "run.db"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    task_id TEXT NOT NULL,
    harness TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    episode_id TEXT NOT NULL UNIQUE,
    family TEXT NOT NULL,
    infra INTEGER NOT NULL,
    score REAL,
    passed INTEGER,
    submitted INTEGER NOT NULL,
    termination TEXT,
    n_steps INTEGER NOT NULL,
    created_at REAL NOT NULL,
    trajectory TEXT NOT NULL,
    PRIMARY KEY (task_id, harness, attempt)
);
CREATE TABLE IF NOT EXISTS model_calls (
    episode_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    prompt_ids TEXT NOT NULL,
    completion_ids TEXT NOT NULL,
    logprobs TEXT NOT NULL,
    PRIMARY KEY (episode_id, step)
);
CREATE INDEX IF NOT EXISTS episodes_by_harness ON episodes (harness);
"""


class StoreError(RuntimeError):
    pass


class RunStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / DB_NAME
        try:
            self.db = sqlite3.connect(self.path, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a usable run database ({e})") from None
        self.db.commit()

    @staticmethod
    def exists(folder: str | Path) -> bool:
        return (Path(folder) / DB_NAME).is_file()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- config -------------------------------------------------------------------------------------
    def get_meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value, sort_keys=True)))

    @property
    def config(self) -> dict[str, Any] | None:
        return self.get_meta("config")

    # -- episodes -------------------------------------------------------------------------------------
    def add(self, traj: Trajectory) -> None:
        """Commit one finished episode with its model calls (replacing an earlier infra-error row)."""
        body = traj.model_dump(mode="json")
        calls = []
        for step in body["steps"]:
            mc = step["model_call"]
            calls.append(
                (
                    traj.episode_id,
                    step["index"],
                    json.dumps(mc.pop("prompt_ids")),
                    json.dumps(mc.pop("completion_ids")),
                    json.dumps(mc.pop("logprobs")),
                )
            )
        g = traj.grade
        with self.db:
            old = self.db.execute(
                "SELECT episode_id FROM episodes WHERE task_id=? AND harness=? AND attempt=?",
                (traj.task_id, traj.harness, traj.attempt),
            ).fetchone()
            if old is not None:
                self.db.execute("DELETE FROM model_calls WHERE episode_id = ?", (old[0],))
                self.db.execute(
                    "DELETE FROM episodes WHERE task_id=? AND harness=? AND attempt=?",
                    (traj.task_id, traj.harness, traj.attempt),
                )
            self.db.execute(
                "INSERT INTO episodes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    traj.task_id,
                    traj.harness,
                    traj.attempt,
                    traj.episode_id,
                    traj.family,
                    int(traj.is_infra_error),
                    None if g is None else g.score,
                    None if g is None else int(g.passed),
                    int(traj.submitted),
                    None if traj.termination is None else traj.termination.value,
                    len(traj.steps),
                    time.time(),
                    json.dumps(body),
                ),
            )
            self.db.executemany("INSERT INTO model_calls VALUES (?,?,?,?,?)", calls)

    def finished_keys(self) -> set[tuple[str, str, int]]:
        rows = self.db.execute("SELECT task_id, harness, attempt FROM episodes WHERE infra = 0")
        return {(t, h, int(a)) for t, h, a in rows}

    def delete_attempts_from(self, first_attempt: int) -> int:
        """Delete every episode (and its model calls) whose attempt index is >= first_attempt;
        returns how many episodes went. (A resumed training run re-runs the steps after its
        checkpoint: episodes a killed run stored for them must not stay beside the re-run's.)"""
        with self.db:
            ids = [
                r[0] for r in self.db.execute("SELECT episode_id FROM episodes WHERE attempt >= ?", (first_attempt,))
            ]
            self.db.executemany("DELETE FROM model_calls WHERE episode_id = ?", [(i,) for i in ids])
            self.db.execute("DELETE FROM episodes WHERE attempt >= ?", (first_attempt,))
        return len(ids)

    def count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]

    def harnesses(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT DISTINCT harness FROM episodes ORDER BY harness")]

    def max_attempt(self) -> int | None:
        """The highest attempt index stored (attempts count from 0); None when there is no episode."""
        return self.db.execute("SELECT MAX(attempt) FROM episodes").fetchone()[0]

    def completion_lengths(self, harness: str) -> dict[str, dict[int, int]]:
        """{episode_id: {step: completion tokens}} for every model call of a harness.

        Counted inside SQLite (JSON1's json_array_length), so the token arrays never come into
        Python. Empty when this SQLite has no json_array_length.
        """
        out: dict[str, dict[int, int]] = {}
        try:
            rows = self.db.execute(
                "SELECT m.episode_id, m.step, json_array_length(m.completion_ids) FROM model_calls m "
                "JOIN episodes e ON e.episode_id = m.episode_id WHERE e.harness = ?",
                (harness,),
            )
            for eid, step, n in rows:
                out.setdefault(eid, {})[step] = n
        except sqlite3.OperationalError:
            pass
        return out

    def trajectories(self, harness: str | None = None, with_tokens: bool = True) -> Iterator[Trajectory]:
        """Every stored episode, in (harness, task, attempt) order, rebuilt losslessly."""
        q = "SELECT episode_id, trajectory FROM episodes"
        args: tuple[Any, ...] = ()
        if harness is not None:
            q += " WHERE harness = ?"
            args = (harness,)
        q += " ORDER BY harness, task_id, attempt"
        for eid, blob in self.db.execute(q, args).fetchall():
            body = json.loads(blob)
            if with_tokens:
                calls = {
                    step: (json.loads(p), json.loads(c), json.loads(lp))
                    for step, p, c, lp in self.db.execute(
                        "SELECT step, prompt_ids, completion_ids, logprobs FROM model_calls WHERE episode_id = ?",
                        (eid,),
                    )
                }
            for step in body["steps"]:
                p, c, lp = calls.get(step["index"], ([], [], [])) if with_tokens else ([], [], [])
                step["model_call"].update(prompt_ids=p, completion_ids=c, logprobs=lp)
            yield Trajectory.model_validate(body)
