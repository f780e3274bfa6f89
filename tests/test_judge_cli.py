"""`harnessrl eval --judge-model`: the LLM-judge parts of a PinchBench task folder graded from the
command line by a judge model (here an OpenAI-compatible server on 127.0.0.1 whose scripted model
always gives the same verdict), left ungraded without one, the judge kept in the run's
configuration, and bad judge options refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import shrunk_file
from openai_server import OpenAITestServer
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.store import RunStore
from harnessrl.tasks.sandbox_exec import isolation_available

PINCHBENCH = Path(__file__).parent / "fixtures" / "importers" / "pinchbench"
VERDICT = 'Verdict: {"scores": {"faithful": 0.5}, "total": 0.5, "notes": "one fact lost"}'
# PinchBench graders see the workspace at the path they were written for: that needs bubblewrap.
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap does not work here")

cli = CliRunner()


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def judge_server(tokenizer):
    with OpenAITestServer(ScriptedPolicy(lambda messages: VERDICT, tokenizer=tokenizer), model_name="judge") as server:
        yield server


def one_step_harness(tmp_path: Path) -> Path:
    """json-tools cut to one short step: the tiny random agent ends fast, and grading still runs."""
    return shrunk_file(tmp_path, "json-tools", name="one-step", max_steps=1, max_new_tokens=8)


def eval_pinchbench(tmp_path: Path, out: Path, *extra: str):
    return cli.invoke(
        app,
        [
            "eval",
            "--suite",
            f"pinchbench:{PINCHBENCH}",
            "--harness",
            str(one_step_harness(tmp_path)),
            "--model",
            "tiny-random",
            "--out",
            str(out),
            "--no-progress",
            "--retries",
            "0",
            *extra,
        ],
    )


def grades(out: Path) -> dict:
    with RunStore(out) as store:
        return {t.task_id.rsplit("/", 1)[-1]: t for t in store.trajectories(with_tokens=False)}


@needs_bwrap
def test_judge_model_grades_the_judged_parts_and_is_part_of_the_run_config(tmp_path, judge_server):
    out = tmp_path / "judged"
    r = eval_pinchbench(tmp_path, out, "--judge-model", judge_server.spec())
    assert r.exit_code == 0, r.output
    by_task = grades(out)
    # with a judge, the judge-only task is part of the suite too
    assert set(by_task) == {"task_01_shout", "task_02_summary", "task_03_poem"}
    hybrid = by_task["task_02_summary"].grade
    assert hybrid.subscores["llm_judge.faithful"] == 0.5
    assert hybrid.details["partially_graded"] is False and hybrid.details["ungraded_weight"] == 0.0
    # the agent wrote no summary: automated 0 (weight 0.4), judge 0.5 (weight 0.6)
    assert hybrid.score == pytest.approx(0.3)
    assert by_task["task_03_poem"].grade.score == 0.5
    judge_prompts = [rec.body["messages"][-1]["content"] for rec in judge_server.requests]
    assert len(judge_prompts) == 2 and all("## Grading Rubric" in p for p in judge_prompts)
    with RunStore(out) as store:
        assert store.config["judge_model"] == judge_server.spec()

    # resuming with another judge is a configuration change and is refused; left out, the
    # recorded judge is the one (the resume rule)
    r = eval_pinchbench(tmp_path, out, "--resume", "--judge-model", "tiny-random")
    assert r.exit_code == 2, r.output
    assert "different configuration" in r.output and "judge_model" in r.output
    for same in (["--judge-model", judge_server.spec()], []):
        r = eval_pinchbench(tmp_path, out, "--resume", *same)
        assert r.exit_code == 0 and "3 of 3 episodes already finished" in r.output, r.output


def test_the_judge_grades_the_oracles_episodes_too(tmp_path, judge_server):
    """`--model oracle --judge-model M`: the judge is loaded for the oracle's run as for a model's
    (the judge-only task needs no sandboxed grader, so this runs without bubblewrap too)."""
    out = tmp_path / "oracle"
    args = ["eval", "--suite", f"pinchbench:{PINCHBENCH}", "--harness", str(one_step_harness(tmp_path))]
    r = cli.invoke(
        app, [*args, "--model", "oracle", "--judge-model", judge_server.spec(), "--out", str(out), "--retries", "0"]
    )
    assert r.exit_code == 0, r.output
    poem = grades(out)["task_03_poem"]
    assert poem.infra_error is None and poem.grade.subscores == {"faithful": 0.5}
    assert judge_server.requests


@needs_bwrap
def test_without_judge_model_the_judged_part_is_ungraded(tmp_path):
    out = tmp_path / "unjudged"
    r = eval_pinchbench(tmp_path, out)
    assert r.exit_code == 0, r.output
    by_task = grades(out)
    assert set(by_task) == {"task_01_shout", "task_02_summary"}  # the judge-only task is left out
    hybrid = by_task["task_02_summary"].grade
    assert not any(k.startswith("llm_judge") for k in hybrid.subscores)
    assert hybrid.details["partially_graded"] is True and hybrid.details["ungraded"] == ["llm_judge"]
    with RunStore(out) as store:
        assert store.config["judge_model"] is None


@needs_bwrap
def test_a_judge_reply_without_a_score_is_an_infra_error_of_that_episode(tmp_path, tokenizer):
    out = tmp_path / "bad-judge"
    with OpenAITestServer(
        ScriptedPolicy(lambda messages: "looks fine to me", tokenizer=tokenizer), model_name="judge"
    ) as server:
        r = eval_pinchbench(tmp_path, out, "--tasks", "2", "--judge-model", server.spec())
    assert r.exit_code == 0, r.output
    by_task = grades(out)
    assert by_task["task_01_shout"].infra_error is None  # the automated task is graded as usual
    assert "the judge's reply holds no JSON score" in by_task["task_02_summary"].infra_error


@pytest.mark.parametrize(
    "args, message",
    [
        (["--judge-model", "gpt-17"], "--judge-model: unknown model 'gpt-17'"),
        (["--judge-model", "hf:/no/such/dir"], "--judge-model: model path '/no/such/dir' does not exist"),
        (["--judge-model", "openai:gpt-4o"], "openai:MODEL@BASE_URL"),
        (
            ["--judge-model", "openai:m@http://127.0.0.1:9/v1", "--judge-api-key-env", "HARNESSRL_NO_SUCH_VAR"],
            "--judge-api-key-env HARNESSRL_NO_SUCH_VAR: that environment variable is not set",
        ),
        (["--judge-api-key-env", "OPENAI_API_KEY"], "--judge-api-key-env needs --judge-model"),
    ],
)
def test_bad_judge_options_exit_2_before_any_work(tmp_path, args, message):
    out = tmp_path / "run"
    r = eval_pinchbench(tmp_path, out, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (out / "run.db").exists()


def test_judge_model_on_a_suite_without_judged_parts_is_refused(tmp_path):
    out = tmp_path / "run"
    r = cli.invoke(
        app,
        [
            "eval",
            "--suite",
            "toolcalc",
            "--tasks",
            "1",
            "--judge-model",
            "tiny-random",
            "--out",
            str(out),
            "--no-progress",
        ],
    )
    assert r.exit_code == 2, r.output
    assert "no selected task of suite 'toolcalc' has a part graded by an LLM judge" in r.output
    assert not (out / "run.db").exists()


CLAWEVAL = Path(__file__).parent / "fixtures" / "claweval"


@needs_bwrap
def test_judge_model_is_taken_by_a_claweval_suite_whose_grader_uses_the_judge(tmp_path, judge_server):
    """--judge-model is not refused for Claw-Eval: its judged task joins the suite and its grader
    asks the judge model (the scripted verdict is no number the grader reads: recorded, not a zero)."""
    out = tmp_path / "claweval"
    # J01_sea_poem, the judged task, is the suite's first
    args = ["eval", "--suite", f"claweval:{CLAWEVAL}", "--tasks", "1", "--harness", "json-tools"]
    args += ["--model", "tiny-random"]
    r = cli.invoke(app, [*args, "--judge-model", judge_server.spec(), "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "J01_sea_poem" in {t.rsplit("/", 1)[-1] for t in grades(out)}
    assert judge_server.requests  # the judged task's grader reached the judge model


def test_make_judge_loads_its_model_only_when_asked_and_then_answers_with_it(judge_server):
    from harnessrl.tasks.importers import make_judge

    judge = make_judge(f"  {judge_server.spec()} ")
    assert judge.spec == judge_server.spec()  # the spec as `--judge-model` would record it
    with pytest.raises(RuntimeError, match="never loaded"):
        judge("grade this")
    judge.load()
    assert judge("grade this") == VERDICT
