"""The evaluation folder (eval_folder.py): a small evaluation through it with the oracle and a
scripted policy writes the folder every evaluation job writes (config.json with the evaluation
record, run.db, summary.json), a resume runs only the episodes that did not finish, and a run
folder of another record is refused."""

from __future__ import annotations

import json

import pytest
from helpers import replies_policy

from harnessrl.eval_folder import SUMMARY, EvaluationFolder
from harnessrl.harness.registry import load_harness
from harnessrl.models.base import SamplingParams
from harnessrl.rundir import CONFIG, DB, RunFolderError
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite

RECORD_KEYS = {
    "suite",
    "split",
    "model",
    "seed",
    "tasks",
    "task_ids",
    "attempts",
    "sampling",
    "harnesses",
    "max_retries",
    "api_key_env",
    "judge_model",
    "judge_api_key_env",
}


def evaluation(path, model="oracle", split="dev", attempts=2) -> EvaluationFolder:
    """Two toolcalc tasks through json-tools, `attempts` each."""
    tasks = get_suite("toolcalc").tasks(split, 2)
    sampling = SamplingParams(temperature=0.5, seed=7)
    return EvaluationFolder(path, "toolcalc", split, model, tasks, [load_harness("json-tools")], attempts, sampling, 1)


def test_an_oracle_evaluation_writes_config_run_db_and_summary(tmp_path):
    out = tmp_path / "run"
    with evaluation(out).open(resume=False) as folder:
        assert not out.exists()  # opening writes nothing
        folder.start()
        todo = folder.todo()
        assert len(todo) == len(folder.jobs) == 4
        folder.run(todo, None, max_in_flight=4, progress=False)
        summary = folder.summary()
    config = json.loads((out / CONFIG).read_text())
    assert RECORD_KEYS <= set(config) and set(config) - RECORD_KEYS <= {"harnessrl_version", "shell_isolation"}
    assert config["task_ids"] == ["toolcalc/dev/00000", "toolcalc/dev/00001"] and config["attempts"] == 2
    assert (
        config["seed"] == 7 and config["sampling"]["temperature"] == 0.5 and list(config["harnesses"]) == ["json-tools"]
    )
    assert (out / DB).is_file()
    assert json.loads((out / SUMMARY).read_text()) == summary.model_dump()
    assert summary.model == "oracle" and summary.split == "dev" and summary.seed == 7
    numbers = summary.harnesses["json-tools"]
    assert numbers.n_episodes == 4 and numbers.n_tasks == 2 and numbers.mean_score == 1.0
    with RunStore(out) as store:  # what `harnessrl summary` and `report` read
        assert store.config["task_ids"] == config["task_ids"]
        assert store.get_meta("model")["name"] == "oracle"


def test_a_resume_runs_only_the_episodes_that_did_not_finish(tmp_path, tokenizer):
    out = tmp_path / "run"
    with evaluation(out, model="scripted").open(resume=False) as folder:
        folder.start()
        first = folder.todo()[:3]
        folder.run(first, replies_policy(["no tool call here"], tokenizer), max_in_flight=2, progress=False)
    with pytest.raises(RunFolderError, match="already holds a run"):
        evaluation(out, model="scripted").open(resume=False)
    with evaluation(out, model="scripted").open(resume=True) as folder:
        folder.start()
        rest = folder.todo()
        assert [j.key for j in rest] == [j.key for j in folder.jobs[3:]]
        folder.run(rest, None, max_in_flight=2, progress=False)
        folder.summary()
        episodes = folder.trajectories()
    finished = {t.key: t.grade.passed for t in episodes}
    assert len(finished) == 4
    assert sorted(finished.values()) == [False, False, False, True]  # the first three were not run again


def test_a_folder_of_another_record_is_refused_unless_the_key_may_differ(tmp_path):
    out = tmp_path / "run"
    with evaluation(out, attempts=1).open(resume=False) as folder:
        folder.start()
    with pytest.raises(RunFolderError, match=r"different configuration.*attempts \(1 -> 2\)"):
        evaluation(out, attempts=2).open(resume=True)
    with pytest.raises(RunFolderError, match="holds no evaluation run to resume"):
        evaluation(tmp_path / "none").open(resume=True)
    with evaluation(out, attempts=2).open(resume=True, may_differ=("attempts",)) as folder:
        folder.start()
        assert len(folder.todo()) == 4
    assert json.loads((out / CONFIG).read_text())["attempts"] == 2
