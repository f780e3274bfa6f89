"""The Ray executor on one local Ray cluster (2 CPUs, started once for the module): episodes in
actors, the model in this process. Ray episodes are the local ones token for token; a killed
actor loses and duplicates nothing; a training step runs; built-in tasks survive the trip;
`--executor ray` without Ray is a clear error naming the extra.

The exact comparisons run one episode at a time (--max-in-flight 1): with several in flight the
tiny random model's near-tied logits can flip with the rounding of a different batch, whatever
the executor."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections import Counter

import pytest

ray = pytest.importorskip("ray", reason="the Ray executor needs Ray: pip install 'harnessrl[ray]'")

from helpers import grpo_trainer, oracle_policy, shrunk  # noqa: E402
from test_trainer import TextScore  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from harnessrl.cli import app  # noqa: E402
from harnessrl.executors import ExecutorError, make_executor  # noqa: E402
from harnessrl.models.base import SamplingParams  # noqa: E402
from harnessrl.rollout import Runner, make_jobs  # noqa: E402
from harnessrl.store import RunStore  # noqa: E402
from harnessrl.tasks import get_suite, list_suites  # noqa: E402
from harnessrl.tasks.base import Tool  # noqa: E402
from harnessrl.train.config import TrainConfig  # noqa: E402
from harnessrl.types import Termination  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def cluster():
    # "local": a new cluster of its own, never one that happens to run on this machine
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def executor(cluster):
    """One pool of actors for the module (the CLI tests make their own, on the same cluster)."""
    with make_executor("ray") as ex:
        yield ex


def tokens(trajectory) -> list[tuple[list[int], list[int]]]:
    return [(s.model_call.prompt_ids, s.model_call.completion_ids) for s in trajectory.steps]


# ------------------------------------------------------------------------------------------ eval


def test_ray_eval_matches_the_local_one_and_resumes_with_another_executor(cluster, tmp_path):
    paths = []
    for name in ("json-tools", "react"):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(shrunk(name, max_steps=2, max_new_tokens=12).to_yaml())
    common = ["eval", "--model", "tiny-random", "--suite", "toolcalc", "--tasks", "2", "--attempts", "2"]
    common += ["--harness", ",".join(map(str, paths)), "--max-in-flight", "1", "--no-progress"]
    outs = {kind: tmp_path / kind for kind in ("local", "ray")}
    for kind, out in outs.items():
        r = CliRunner().invoke(app, [*common, "--executor", kind, "--out", str(out)])
        assert r.exit_code == 0, r.output
    with RunStore(outs["local"]) as a, RunStore(outs["ray"]) as b:
        local = {t.episode_id: t for t in a.trajectories()}
        remote = {t.episode_id: t for t in b.trajectories()}
    assert len(local) == 8 and local.keys() == remote.keys()
    for key, t in local.items():
        assert tokens(remote[key]) == tokens(t) and len(t.steps) > 0, (t.task_id, t.harness, t.attempt)
        assert remote[key].grade == t.grade and remote[key].termination == t.termination
    config = json.loads((outs["ray"] / "config.json").read_text())
    assert config["executor"] == {"kind": "ray", "address": None}

    # where episodes run changes nothing they compute: a run may continue with another executor
    r = CliRunner().invoke(app, [*common, "--executor", "local", "--resume", "--out", str(outs["ray"])])
    assert r.exit_code == 0, r.output
    assert "8 of 8 episodes already finished" in r.output
    assert json.loads((outs["ray"] / "config.json").read_text())["executor"] == {"kind": "local"}


# ------------------------------------------------------------------------------ a worker lost


def test_a_killed_actor_loses_and_duplicates_nothing(executor, tokenizer, tmp_path, monkeypatch):
    """SIGKILL the actor that holds one episode while that episode waits for its model reply:
    the episode is re-run on another actor, and every job is stored exactly once."""
    tasks = get_suite("toolcalc").tasks("dev", 4)  # one attempt each: the oracle follows an episode by its task
    spec = shrunk("json-tools", max_new_tokens=1024, max_total_tokens=None)
    target = tasks[1]
    handles = {}
    opened = executor.open

    def open_and_remember(task, harness, attempt, retries, seed):
        handle = opened(task, harness, attempt, retries, seed)
        handles[(task.id, retries)] = handle
        return handle

    monkeypatch.setattr(executor, "open", open_and_remember)
    policy = oracle_policy(tasks, spec, tokenizer)
    play = policy.script
    killed = []

    def script(messages):
        if target.instruction in (m.content for m in messages) and not killed:
            pid = handles[(target.id, 0)].worker.pid
            os.kill(pid, signal.SIGKILL)  # the episode waits for this very reply
            killed.append(pid)
        return play(messages)

    policy.script = script
    with RunStore(tmp_path / "run") as store:
        runner = Runner(
            policy, SamplingParams(temperature=0.0), max_in_flight=2, on_episode=store.add, progress=False,
            executor=executor,
        )  # fmt: skip
        returned = runner.run(make_jobs(tasks, [spec], 1))
        stored = list(store.trajectories())
    assert killed
    keys = Counter((t.task_id, t.harness, t.attempt) for t in stored)
    assert len(keys) == 4 and set(keys.values()) == {1}
    assert len(returned) == 4 and runner.stats.infra_errors == 0
    for t in stored:
        assert t.termination == Termination.submitted and t.grade.passed, (t.task_id, t.infra_error)
        assert t.retries == (1 if t.task_id == target.id else 0)
    assert (target.id, 1) in handles and handles[(target.id, 1)].worker.pid != killed[0]
    assert all(w.pid != killed[0] for w in executor._workers)  # the dead actor left the pool

    # an idle actor that died between episodes costs the next episode no retry
    idle = executor._idle[-1]  # the next one handed out
    os.kill(idle.pid, signal.SIGKILL)
    policy.script = play
    (again,) = Runner(policy, SamplingParams(temperature=0.0), progress=False, executor=executor).run(
        make_jobs([target], [spec], 1)
    )
    assert again.grade.passed and again.retries == 0 and idle not in executor._workers


# ------------------------------------------------------------------------------------- training


def test_a_training_step_with_the_ray_executor_is_the_local_one(executor, tmp_path):
    specs = [
        shrunk(n, max_steps=1, max_new_tokens=8, demonstrations=[], plain_text_answer=True)
        for n in ("json-tools", "react")
    ]
    config = TrainConfig(
        model="tiny-random",
        steps=1,
        tasks_per_step=2,
        group_size=2,
        lora_r=4,
        lora_alpha=8,
        temperature=1.0,
        eval_every=0,
        max_in_flight=1,
    )
    records = {}
    for kind, ex in (("local", None), ("ray", executor)):
        out = tmp_path / kind
        grpo_trainer(config, out, suite=TextScore(), specs=specs, progress=False, executor=ex).run()
        (records[kind],) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        with RunStore(out / "rollouts") as store:
            assert len(list(store.trajectories(with_tokens=False))) == 4
    assert records["ray"]["completion_tokens"] > 0 and records["ray"]["episodes"] == 4
    assert {k: v for k, v in records["ray"].items() if k != "time"} == {
        k: v for k, v in records["local"].items() if k != "time"
    }
    assert json.loads((tmp_path / "ray" / "config.json").read_text())["executor"]["kind"] == "ray"


# ------------------------------------------------------------------------ tasks on the workers


def test_every_builtin_suite_survives_the_trip_and_unpicklable_tasks_are_named(executor, tokenizer):
    """One task of every family of every built-in suite, played by the oracle in the actors."""
    tasks = []
    for name in list_suites():
        suite = get_suite(name)
        tasks += suite.tasks("dev", len(suite.family_names()))
    spec = shrunk("json-tools", max_new_tokens=1024, max_total_tokens=None)
    runner = Runner(
        oracle_policy(tasks, spec, tokenizer), SamplingParams(temperature=0.0), max_in_flight=2, progress=False,
        executor=executor, max_retries=0,
    )  # fmt: skip
    for t in runner.run(make_jobs(tasks, [spec], 1)):
        assert t.termination == Termination.submitted and t.grade.score == 1.0, (t.task_id, t.infra_error)

    lock = threading.Lock()
    bad = dataclasses.replace(
        tasks[0], id="toolcalc/dev/locked", tools=[Tool("peek", "", {}, lambda env: str(lock.locked()))]
    )
    with pytest.raises(ExecutorError, match="task 'toolcalc/dev/locked' cannot be sent to the Ray workers"):
        Runner(oracle_policy([bad], spec, tokenizer), progress=False, executor=executor).run(
            make_jobs([bad], [spec], 1)
        )


# ---------------------------------------------------------------------------------- no Ray here


@pytest.mark.parametrize(
    "args, message",
    [
        (["--executor", "ray"], "pip install 'harnessrl[ray]'"),
        (["--ray-address", "auto"], "--ray-address needs --executor ray"),
        (["--executor", "dask"], "--executor must be local or ray"),
    ],
)
def test_executor_options_errors_are_clear(args, message, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed: `import ray` fails
    r = CliRunner().invoke(app, ["eval", "--model", "tiny-random", "--tasks", "1", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()
