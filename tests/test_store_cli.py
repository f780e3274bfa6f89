"""Run store, resume after SIGKILL, export, and the command line's handling of user errors."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import oracle_policy, shrunk_file
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.registry import load_harness
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.types import Trajectory

cli = CliRunner()


def small_spec(tmp_path: Path, name="small-json", base="json-tools", **rules) -> Path:
    return shrunk_file(tmp_path, base, name=name, **{"max_steps": 2, "max_new_tokens": 8, **rules})


def test_store_round_trips_trajectories_losslessly(tmp_path, tokenizer):
    spec = load_harness("react")
    tasks = get_suite("toolcalc").tasks("dev", 3)
    with RunStore(tmp_path / "run") as store:
        trajs = Runner(
            oracle_policy(tasks, spec, tokenizer), SamplingParams(), progress=False, on_episode=store.add
        ).run(make_jobs(tasks, [spec], 1))
        back = list(store.trajectories())
        assert sorted(back, key=lambda t: t.task_id) == sorted(trajs, key=lambda t: t.task_id)
        assert store.finished_keys() == {t.key for t in trajs}
        # JSON round trip of the record itself
        for t in trajs:
            assert Trajectory.model_validate_json(t.model_dump_json()) == t
        # token arrays live in model_calls, one row per call
        n_calls = store.db.execute("SELECT COUNT(*) FROM model_calls").fetchone()[0]
        assert n_calls == sum(len(t.steps) for t in trajs)


def test_infra_rows_are_replaced_on_rerun(tmp_path):
    from harnessrl.types import Termination

    base = dict(suite="s", family="f", split="dev", harness="h", attempt=0, instruction="x", task_id="s/dev/00000")
    with RunStore(tmp_path) as store:
        store.add(Trajectory(episode_id="e1", termination=Termination.error, infra_error="boom", **base))
        assert store.finished_keys() == set()
        store.add(Trajectory(episode_id="e1", termination=Termination.submitted, submitted=True, **base))
        assert store.finished_keys() == {("s/dev/00000", "h", 0)} and store.count() == 1


def test_store_max_attempt_and_completion_lengths(tmp_path):
    from harnessrl.types import ActionKind, ModelCall, Step

    def episode(eid: str, harness: str, attempt: int, completions: list[list[int]]) -> Trajectory:
        steps = [
            Step(
                index=i,
                action=ActionKind.text,
                model_call=ModelCall(prompt_ids=[1, 2], completion_ids=c, logprobs=[0.0] * len(c), text=""),
            )
            for i, c in enumerate(completions)
        ]
        return Trajectory(
            episode_id=eid,
            task_id="s/dev/00000",
            suite="s",
            family="f",
            split="dev",
            harness=harness,
            attempt=attempt,
            instruction="x",
            steps=steps,
        )

    with RunStore(tmp_path) as store:
        assert store.max_attempt() is None and store.completion_lengths("h") == {}
        store.add(episode("e0", "h", 0, [[5, 6, 7], []]))
        store.add(episode("e2", "h", 2, [[9]]))
        store.add(episode("g0", "g", 0, [[1, 2, 3, 4]]))
        assert store.max_attempt() == 2
        assert store.completion_lengths("h") == {"e0": {0: 3, 1: 0}, "e2": {0: 1}}
        assert store.completion_lengths("g") == {"g0": {0: 4}}
        assert store.completion_lengths("absent") == {}


def test_cli_eval_end_to_end_and_export(tmp_path):
    spec = small_spec(tmp_path)
    react = small_spec(tmp_path, name="react", base="react")
    out = tmp_path / "run"
    r = cli.invoke(
        app,
        [
            "eval",
            "--suite",
            "toolcalc",
            "--harness",
            f"{spec},{react}",
            "--model",
            "tiny-random",
            "--tasks",
            "2",
            "--attempts",
            "2",
            "--out",
            str(out),
            "--no-progress",
            "--seed",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["suite"] == "toolcalc" and summary["model"] == "tiny-random" and summary["seed"] == 1
    assert set(summary["harnesses"]) == {"small-json", "react"}
    for m in summary["harnesses"].values():
        assert {
            "n_tasks",
            "attempts",
            "mean_score",
            "mean_score_ci95",
            "pass_at_k",
            "pass_hat_k",
            "delivery_rate",
            "n_episodes",
            "n_infra_errors",
        } <= set(m)
        assert m["n_tasks"] == 2 and m["n_episodes"] == 4 and set(m["pass_at_k"]) == {"1", "2"}
    assert "small-json" in r.output and "mean" in r.output
    r = cli.invoke(app, ["export", str(out), "--format", "jsonl"])
    assert r.exit_code == 0
    lines = [json.loads(x) for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 8
    t = Trajectory.model_validate(lines[0])
    assert (
        t.steps
        and t.steps[0].model_call.completion_ids
        and len(t.steps[0].model_call.logprobs) == len(t.steps[0].model_call.completion_ids)
    )
    r = cli.invoke(app, ["triage", str(out)])
    assert r.exit_code == 0 and "small-json" in r.output
    tri = json.loads((out / "triage.json").read_text())
    assert set(tri) == {"small-json", "react"} and tri["react"]["n_episodes"] == 4
    r = cli.invoke(app, ["report", str(out)])
    assert r.exit_code == 0 and (out / "report" / "index.html").is_file()
    r = cli.invoke(app, ["report", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "not a run folder" in r.output
    # a second eval into the same folder without --resume is refused; with it, nothing is re-run
    r = cli.invoke(
        app,
        [
            "eval",
            "--suite",
            "toolcalc",
            "--harness",
            f"{spec},{react}",
            "--model",
            "tiny-random",
            "--tasks",
            "2",
            "--attempts",
            "2",
            "--out",
            str(out),
            "--no-progress",
            "--seed",
            "1",
        ],
    )
    assert r.exit_code == 2 and "--resume" in r.output
    r = cli.invoke(
        app,
        [
            "eval",
            "--suite",
            "toolcalc",
            "--harness",
            f"{spec},{react}",
            "--model",
            "tiny-random",
            "--tasks",
            "2",
            "--attempts",
            "2",
            "--out",
            str(out),
            "--no-progress",
            "--seed",
            "1",
            "--resume",
        ],
    )
    assert r.exit_code == 0 and "8 of 8 episodes already finished" in r.output
    r = cli.invoke(
        app,
        [
            "eval",
            "--suite",
            "toolcalc",
            "--harness",
            str(react),
            "--model",
            "tiny-random",
            "--tasks",
            "2",
            "--attempts",
            "2",
            "--out",
            str(out),
            "--no-progress",
            "--seed",
            "1",
            "--resume",
        ],
    )
    assert r.exit_code == 2 and "different configuration" in r.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--suite", "nope"], "unknown suite 'nope'"),
        (["--harness", "nope"], "unknown harness 'nope'"),
        (["--model", "gpt-17"], "unknown model 'gpt-17'"),
        (["--model", "hf:/no/such/dir"], "does not exist"),
        (["--model", "openai:gpt-4o"], "openai:MODEL@BASE_URL"),
        (["--model", "openai:m@http://127.0.0.1:9/v1", "--api-key-env", "HARNESSRL_NO_SUCH_VAR"], "is not set"),
        (["--split", "validation"], "unknown split 'validation'"),
        (["--tasks", "100000"], "has 48 tasks"),
        (["--attempts", "0"], "--attempts must be >= 1"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--top-k", "-2"], "--top-k must be >= -1"),
        (["--min-p", "1.5"], "--min-p must be <= 1"),
        (["--harness", "missing.yaml"], "no such harness spec file"),
        (["--dtype", "float16"], "--dtype must be float32, bfloat16 or int8"),
        (["--model", "openai:m@http://127.0.0.1:9/v1", "--dtype", "bfloat16"], "applies to local models"),
    ],
)
def test_cli_config_errors_are_one_line_and_before_any_work(tmp_path, args, message):
    out = tmp_path / "run"
    r = cli.invoke(app, ["eval", "--out", str(out), "--no-progress", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output
    assert not (out / "run.db").exists()


def test_cli_eval_samples_with_vllms_fields_and_records_the_distribution_drawn_from(tmp_path):
    """--top-k, --min-p and the penalties reach the sampler: top_k 1 draws the greedy tokens at
    any temperature, and every call records the log-probs of the distribution it was drawn from
    (one token kept: log-prob 0) beside the tempered ones."""
    from harnessrl.store import RunStore

    harness = shrunk_file(tmp_path, "json-tools", max_steps=2, max_new_tokens=32)  # a short episode

    def run(name: str, *extra: str):
        out = tmp_path / name
        args = ["eval", "--suite", "toolcalc", "--split", "dev", "--tasks", "1", "--harness", str(harness)]
        args += ["--model", "tiny-random", "--no-progress", "--no-preflight", "--out", str(out), *extra]
        r = cli.invoke(app, args)
        assert r.exit_code == 0, r.output
        with RunStore(out) as store:
            return [s.model_call for t in store.trajectories() for s in t.steps if s.model_call]

    greedy = run("greedy", "--temperature", "0")
    top1 = run("top1", "--temperature", "1.3", "--top-k", "1", "--repetition-penalty", "1.0", "--min-p", "0.1")
    assert [c.completion_ids for c in top1] == [c.completion_ids for c in greedy]
    assert all(c.sampled_logprobs == [0.0] * len(c.completion_ids) for c in top1)
    assert all(c.sampled_logprobs is None for c in greedy)
    assert any(lp < -1e-3 for c in top1 for lp in c.logprobs)  # the tempered distribution, unshaped


def test_cli_eval_oracle_passes_every_task_through_each_harness_on_every_attempt(tmp_path):
    """`--model oracle`: the tasks' solutions through each harness's protocol (plan-first included),
    every attempt a whole episode: supervised data a user can collect without a model."""
    out = tmp_path / "oracle"
    args = ["eval", "--suite", "toolcalc", "--split", "train", "--tasks", "3", "--attempts", "2", "--out", str(out)]
    r = cli.invoke(app, [*args, "--harness", "json-tools,plan-execute", "--model", "oracle", "--no-progress"])
    assert r.exit_code == 0, r.output
    with RunStore(out) as store:
        trajectories = list(store.trajectories())
        assert store.get_meta("model")["name"] == "oracle"
    assert len(trajectories) == 3 * 2 * 2
    assert all(t.submitted and t.grade.passed for t in trajectories), [
        (t.task_id, t.harness, t.attempt, t.termination) for t in trajectories if not (t.grade and t.grade.passed)
    ]


def test_cli_eval_in_bfloat16_runs_the_model_in_bfloat16_and_records_it(tmp_path):
    out = tmp_path / "bf16"
    harness = shrunk_file(tmp_path, "json-tools", max_steps=2, max_new_tokens=32)  # a short episode
    args = ["eval", "--suite", "toolcalc", "--tasks", "1", "--harness", str(harness), "--out", str(out)]
    r = cli.invoke(app, [*args, "--model", "tiny-random", "--dtype", "bfloat16", "--no-progress"])
    assert r.exit_code == 0, r.output
    with RunStore(out) as store:
        assert store.get_meta("model")["dtype"] == "torch.bfloat16"
        trajectories = list(store.trajectories())
    assert len(trajectories) == 1 and not any(t.is_infra_error for t in trajectories)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    # the resume rule: --dtype left out is the recorded bfloat16; another one given is refused
    r = cli.invoke(app, [*args, "--model", "tiny-random", "--no-progress", "--resume"])
    assert r.exit_code == 0 and "1 of 1 episodes already finished" in r.output, r.output
    r = cli.invoke(app, [*args, "--model", "tiny-random", "--dtype", "float32", "--no-progress", "--resume"])
    assert r.exit_code == 2 and "different configuration" in r.output and "dtype" in r.output


def test_cli_eval_in_int8_quantizes_the_linear_layers_and_records_it(tmp_path):
    out = tmp_path / "int8"
    harness = shrunk_file(tmp_path, "json-tools", max_steps=2, max_new_tokens=32)  # a short episode
    args = ["eval", "--suite", "toolcalc", "--tasks", "1", "--harness", str(harness), "--out", str(out)]
    r = cli.invoke(app, [*args, "--model", "tiny-random", "--dtype", "int8", "--no-progress"])
    assert r.exit_code == 0, r.output
    with RunStore(out) as store:
        meta = store.get_meta("model")
        trajectories = list(store.trajectories())
    assert meta["dtype"] == "torch.float32" and meta["quantization"]["kind"] == "int8"
    assert len(trajectories) == 1 and not any(t.is_infra_error for t in trajectories)
    assert json.loads((out / "config.json").read_text())["dtype"] == "int8"
    r = cli.invoke(app, [*args, "--model", "tiny-random", "--dtype", "bfloat16", "--no-progress", "--resume"])
    assert r.exit_code == 2 and "different configuration" in r.output


def test_cli_eval_oracle_tells_apart_tasks_worded_alike(tmp_path):
    """toolcalc/train/00014 and 00059 ask the same question of different price lists: each
    episode must replay its own task's solution."""
    tasks = get_suite("toolcalc").tasks("train", 60)
    assert tasks[14].instruction == tasks[59].instruction and tasks[14].solution != tasks[59].solution
    out = tmp_path / "alike"
    args = ["eval", "--suite", "toolcalc", "--split", "train", "--tasks", "60", "--attempts", "2", "--out", str(out)]
    r = cli.invoke(app, [*args, "--harness", "json-tools", "--model", "oracle", "--no-progress"])
    assert r.exit_code == 0, r.output
    with RunStore(out) as store:
        failed = [(t.task_id, t.attempt) for t in store.trajectories(with_tokens=False) if not t.grade.passed]
    assert failed == []


@pytest.mark.parametrize(
    "command, message",
    [(["train", "grpo"], "only `harnessrl eval` runs it"), (["evolve"], "only `harnessrl eval` runs it")],
)
def test_the_oracle_is_refused_where_a_model_is_trained_or_evolved(tmp_path, command, message):
    r = cli.invoke(app, [*command, "--model", "oracle", "--out", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


def test_cli_harness_commands(tmp_path):
    r = cli.invoke(app, ["harness", "list"])
    assert r.exit_code == 0 and "workspace-agent" in r.output and "plan-execute" in r.output
    r = cli.invoke(app, ["harness", "show", "react"])
    assert r.exit_code == 0
    p = tmp_path / "mine.yaml"
    p.write_text(r.output)
    r = cli.invoke(app, ["harness", "validate", str(p)])
    assert r.exit_code == 0 and "ok" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(p.read_text().replace("format: react", "format: telepathy"))
    r = cli.invoke(app, ["harness", "validate", str(bad)])
    assert r.exit_code == 1 and "bad.yaml" in r.output and "protocol.format" in r.output and "Traceback" not in r.output
    r = cli.invoke(app, ["harness", "schema"])
    assert r.exit_code == 0 and json.loads(r.output)["title"] == "HarnessSpec"
    r = cli.invoke(app, ["tasks", "list"])
    assert r.exit_code == 0 and "workspace" in r.output and "toolcalc" in r.output
    r = cli.invoke(app, ["tasks", "show", "workspace/dev/00003"])
    assert r.exit_code == 0 and "solution" in r.output
    r = cli.invoke(app, ["tasks", "show", "workspace/dev/x"])
    assert r.exit_code == 2 and "malformed task id" in r.output


def _count(db: Path) -> int:
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM episodes").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_sigkill_mid_run_then_resume_loses_and_duplicates_nothing(tmp_path):
    spec = small_spec(tmp_path, max_steps=3, max_new_tokens=6)
    out = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "harnessrl.cli",
        "eval",
        "--suite",
        "toolcalc",
        "--harness",
        str(spec),
        "--model",
        "tiny-random",
        "--tasks",
        "8",
        "--attempts",
        "2",
        "--out",
        str(out),
        "--no-progress",
        "--max-in-flight",
        "2",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db = out / "run.db"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _count(db) < 3 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    con = sqlite3.connect(db)
    before = dict(
        ((t, h, a), blob) for t, h, a, blob in con.execute("SELECT task_id, harness, attempt, trajectory FROM episodes")
    )
    con.close()
    assert 3 <= len(before) < 16
    done = subprocess.run(args + ["--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(before)} of 16 episodes already finished" in done.stderr
    with RunStore(out) as store:
        rows = store.db.execute("SELECT task_id, harness, attempt, trajectory FROM episodes").fetchall()
        assert len(rows) == 16 and len({(t, h, a) for t, h, a, _ in rows}) == 16
        after = {(t, h, a): blob for t, h, a, blob in rows}
        assert all(after[k] == v for k, v in before.items())  # finished episodes untouched
        calls = store.db.execute("SELECT COUNT(*), COUNT(DISTINCT episode_id) FROM model_calls").fetchone()
        assert calls[1] == 16
    assert json.loads((out / "summary.json").read_text())["harnesses"]["small-json"]["n_episodes"] == 16
