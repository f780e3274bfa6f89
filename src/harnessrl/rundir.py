"""RunFolder: the one way every job (eval, evolve, train, ...) opens its run folder.

A run folder holds one run: `config.json` (the job's full configuration, as recorded when it
started) and, for jobs that run episodes, a run database (`run.db`, see store.py). `open()`
checks a folder against a configuration without writing anything (so every configuration error
comes before any work), `start()` writes config.json. Opening answers the same questions for
every job, with the same words:

- a fresh start into a folder that already holds a run is refused (`--resume` continues it);
- `--resume` into a folder that holds no run is refused;
- `--resume` with a different configuration is refused, naming every key that differs, except
  the keys the job says may change (e.g. train's `steps`) and the facts of the machine
  (`MACHINE_KEYS`: the version that wrote the folder, how the shell tool was isolated, where
  the episodes ran: a run may continue with another executor, what rollout servers answered);
- a run that locked its folder when it finished (evolve: its held-out result must not be re-run
  or extended) refuses any further start.

It also hands out the episodes still to run (`todo`: jobs whose (task, harness, attempt) key
has no finished episode in the database) and records how shell commands were isolated.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from harnessrl import __version__
from harnessrl.errors import JobError

if TYPE_CHECKING:
    from harnessrl.harness.spec import AnyHarnessSpec
    from harnessrl.rollout import Job
    from harnessrl.store import RunStore

log = logging.getLogger(__name__)

CONFIG = "config.json"
LOCK = "LOCKED"
DB = "run.db"
# A multi-stage job's folder (`harnessrl study`, `harnessrl improve`): the stages that finished,
# with their facts (written by jobs/stages.py, read by the report).
STAGES_JSON = "stages.json"
# The study's result (written by jobs/study.py, read by the report).
STUDY_JSON = "study.json"
# Recorded in every config, never compared on resume: they describe the machine (and where the
# episodes ran: `executor`, see executors.py; what the rollout servers answered the trainer's
# start-up probe: `rollout_probe`, probed again by a resumed run), not what the run computes.
MACHINE_KEYS = ("harnessrl_version", "shell_isolation", "executor", "rollout_probe")


class RunFolderError(JobError):
    """A run folder cannot be used as asked (already holds a run, nothing to resume, locked, ...)."""


def holds_run(path: str | Path, store_dir: str = "") -> bool:
    """Whether `path` holds a run: a config.json, or a run database (folders written before
    config.json existed for every job keep their configuration in the database)."""
    path = Path(path)
    return (path / CONFIG).is_file() or (path / store_dir / DB).is_file()


def config_diff(old: dict[str, Any], new: dict[str, Any], may_differ: Iterable[str] = ()) -> list[str]:
    """Keys whose values differ between two recorded configurations, ignoring `may_differ` and
    the machine's keys."""
    ignore = {*MACHINE_KEYS, *may_differ}
    return sorted(k for k in set(old) | set(new) if k not in ignore and old.get(k) != new.get(k))


def _shown(key: str, value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else "..."


class RunFolder:
    """One job's run folder. `open()` it; then `store()`, `todo(jobs)`, `record(...)`, `lock()`.

    `kind` names the job in messages ("evaluation", "evolution", "training"); `store_dir` is
    where the run database lives inside the folder ("" = the folder itself).
    """

    def __init__(self, path: str | Path, kind: str, config: dict[str, Any], store_dir: str = ""):
        self.path = Path(path)
        self.kind = kind
        self.config = dict(config)
        self.store_dir = store_dir
        self._store: RunStore | None = None
        self._started = False

    # -- opening ------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | Path,
        kind: str,
        config: dict[str, Any],
        *,
        resume: bool,
        may_differ: Sequence[str] = (),
        store_dir: str = "",
    ) -> RunFolder:
        """Check the folder against `config` (see the module docstring); writes nothing.

        On resume the stored values of `may_differ` keys are replaced by the new ones (at
        `start()`) and the recorded machine facts are kept until the job records them again.
        """
        folder = cls(path, kind, {"harnessrl_version": __version__, **config}, store_dir)
        path = folder.path
        if folder.locked:
            raise RunFolderError(
                f"{path}: this {kind} run is finished and locked ({folder.lock_reason}); start a new --out"
            )
        exists = holds_run(path, store_dir)
        if not resume:
            if exists:
                raise RunFolderError(f"{path} already holds a run; use --resume to continue it or choose another --out")
            if path.exists() and not path.is_dir():
                raise RunFolderError(f"{path} is a file, not a run folder")
        else:
            if not exists:
                raise RunFolderError(f"{path} holds no {kind} run to resume")
            old = folder.stored_config()
            diff = config_diff(old, folder.config, may_differ)
            if diff:
                shown = ", ".join(f"{k} ({_shown(k, old.get(k))} -> {_shown(k, folder.config.get(k))})" for k in diff)
                allowed = ", ".join("--" + k.replace("_", "-") for k in may_differ)
                raise RunFolderError(
                    f"--resume with a different configuration than the run in {path}: {shown}. Leave those options "
                    f"out to continue with the recorded values{f' (only {allowed} may change)' if allowed else ''}, "
                    "or start a new --out"
                )
            folder.config = {**{k: old[k] for k in MACHINE_KEYS if k in old}, **folder.config}
        return folder

    def start(self) -> RunFolder:
        """Create the folder and write config.json (again, on resume: options that may change
        take their new values)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._started = True
        self._write_config()
        return self

    def stored_config(self) -> dict[str, Any]:
        """The configuration the run was started with (config.json, else the run database's)."""
        p = self.path / CONFIG
        if p.is_file():
            try:
                value = json.loads(p.read_text(encoding="utf-8"))
            except ValueError as e:
                raise RunFolderError(f"{p} is not valid JSON ({e})") from None
            if not isinstance(value, dict):
                raise RunFolderError(f"{p} does not hold a configuration object")
            return value
        from harnessrl.store import RunStore, StoreError

        try:
            with RunStore(self.path / self.store_dir) as store:
                return store.config or {}
        except (StoreError, OSError) as e:
            raise RunFolderError(str(e)) from None

    def _write_config(self) -> None:
        if not self._started:
            return
        p = self.path / CONFIG
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_text(json.dumps(self.config, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
        tmp.replace(p)

    # -- recording ----------------------------------------------------------------------------------
    def record(self, **values: Any) -> None:
        """Add facts to the recorded configuration (config.json, and the run database's copy)."""
        self.config.update(values)
        self._write_config()
        if self._store is not None:
            self._store.set_meta("config", {**(self._store.config or {}), **values})

    def record_shell_isolation(
        self, specs: Iterable[AnyHarnessSpec], offers_shell: bool, *, training: bool = False
    ) -> None:
        """A run whose harness turns the shell on for tasks that offer one (`offers_shell`), or
        that runs an external agent program (always sandboxed), records how those commands were
        isolated on this machine (bubblewrap, or rlimits only). Without bubblewrap it warns; a
        `training` run says so as an error (its rewards could be forged), and goes on."""
        from harnessrl.harness.spec import HarnessSpec

        specs = list(specs)
        external = any(s.kind == "external" for s in specs)
        if external or (offers_shell and any(isinstance(s, HarnessSpec) and s.rules.shell.enabled for s in specs)):
            from harnessrl.tasks.sandbox_exec import isolation_available, isolation_description

            isolation = isolation_available()
            self.record(shell_isolation=isolation_description(isolation))
            if isolation != "bwrap" and training:
                log.error(
                    "TRAINING WITHOUT ISOLATION: an agent or a shell command could read its grader or reach "
                    "the trainer and forge its reward. %s",
                    isolation_description(isolation),
                )
            elif isolation != "bwrap":
                log.warning("isolation of this run: %s", isolation_description(isolation))

    # -- the run database -----------------------------------------------------------------------------
    def store(self, meta_config: dict[str, Any] | None = None) -> RunStore:
        """The run database, opened once. `meta_config` is the configuration its readers (summary,
        report) find in it; the machine facts recorded there before are kept."""
        if self._store is None:
            from harnessrl.store import RunStore, StoreError

            self.start()
            try:
                self._store = RunStore(self.path / self.store_dir)
            except (StoreError, OSError) as e:
                raise RunFolderError(str(e)) from None
        if meta_config is not None:
            old = self._store.config or {}
            facts = {k: old[k] for k in MACHINE_KEYS if k in old and k != "harnessrl_version"}
            self._store.set_meta("config", {**facts, **meta_config})
        return self._store

    def todo(self, jobs: Iterable[Job]) -> list[Job]:
        """The jobs whose (task, harness, attempt) key has no finished episode yet."""
        done = self.store().finished_keys()
        return [j for j in jobs if j.key not in done]

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- locking ------------------------------------------------------------------------------------
    @property
    def locked(self) -> bool:
        return (self.path / LOCK).is_file()

    @property
    def lock_reason(self) -> str:
        try:
            return (self.path / LOCK).read_text(encoding="utf-8").strip() or "locked"
        except OSError:
            return "locked"

    def lock(self, reason: str) -> None:
        """Refuse every later start in this folder (the run's result is final)."""
        (self.path / LOCK).write_text(reason + "\n", encoding="utf-8")


# -- files of a run folder ---------------------------------------------------------------------------


def as_json(value: Any) -> Any:
    """The value as JSON gives it back (tuples as lists, keys as strings, others as str): what a
    resumed run reads from a file this one writes."""
    return json.loads(json.dumps(value, default=str))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temporary file + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """One JSON line per record (metrics.jsonl, eval.jsonl)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep the lines of steps <= last_step: a resumed run restarts from its checkpoint and writes
    the later steps again."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line cut by a crash
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
