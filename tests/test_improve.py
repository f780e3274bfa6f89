"""`harnessrl improve` end to end on the tiny random model with small budgets: every phase's
decisions, the held-out cells and report, stop-and-resume writing the same decisions as an
uninterrupted run, the harness phase's ceiling, and bad input refused with nothing written.

The suite is the test-only `textscore` (any text is an answer, graded by its length's parity:
a random model passes about half and fails the rest on content), registered for these tests;
the harnesses are react shrunk to one plain-text step of 8 tokens, the evolved one with another
system prompt (a stand-in for an evolved harness)."""

from __future__ import annotations

import json

import pytest
import typer
import yaml
from helpers import shrunk
from test_trainer import TextScore
from typer.testing import CliRunner

from harnessrl.errors import JobError
from harnessrl.improve import ImproveConfig, TrainSubset, content_task_ids, process_rate, run_improve
from harnessrl.kernel import enter

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHORT = dict(max_steps=1, demonstrations=[], plain_text_answer=True)
# the evolved harness's answers are short, and the seed leaves room to replay one as a react submit call
MAX_NEW_TOKENS = {"seed": 32, "better": 8}


class NoTrain(TextScore):
    name = "notrain"
    split_sizes = {"dev": 4, "test": 4}


@pytest.fixture(scope="module")
def registered():
    """textscore and notrain as suites get_suite knows (evolve and the trainers look suites up by name)."""
    from harnessrl.tasks import registry

    builtin = registry._builtin
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_builtin", lambda: {**builtin(), "textscore": TextScore, "notrain": NoTrain})
        yield
        registry._instances.pop("textscore", None)
        registry._instances.pop("notrain", None)


@pytest.fixture(scope="module")
def specs(tmp_path_factory, registered):
    folder = tmp_path_factory.mktemp("specs")
    paths = {}
    for name, prompt in (
        ("seed", "Reply with any text."),
        ("better", "You are careful. Reply with one short sentence."),
    ):
        spec = shrunk("react", system_prompt=prompt, max_new_tokens=MAX_NEW_TOKENS[name], **SHORT)
        paths[name] = folder / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump({**spec.to_dict(), "name": name}))
    external = folder / "external.yaml"
    external.write_text(yaml.safe_dump({"name": "ext", "kind": "external", "command": ["true"]}))
    paths["external"] = external
    return {k: str(v) for k, v in paths.items()}


def config(specs, **changes) -> ImproveConfig:
    base = dict(
        suite="textscore",
        seed_harness=specs["seed"],
        evolved=specs["better"],
        model="tiny-random",
        device="cpu",
        dev_tasks=2,
        test_tasks=2,
        attempts=2,
        collect_tasks=6,
        collect_attempts=3,
        distill_steps=2,
        epochs=1,
        distill_tasks_per_step=2,
        content_tasks=4,
        grpo_steps=2,
        grpo_tasks_per_step=2,
        group_size=2,
        temperature=1.0,
        max_in_flight=8,
    )
    return ImproveConfig(**{**base, **changes})


def decisions(out) -> list[dict]:
    return [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def full(tmp_path_factory, specs):
    out = tmp_path_factory.mktemp("improve") / "full"
    return out, run_improve(enter("improve", config(specs), out, progress=False))


def test_every_phase_decides_with_its_evidence_and_the_held_out_cells_are_reported(full, specs):
    out, result = full
    lines = decisions(out)
    keys = [d["key"] for d in lines]
    assert keys[:3] == ["harness.evolve", "weights.imitation", "weights.choice"] and keys[3] == "content.tasks"
    by_key = {d["key"]: d for d in lines}
    assert by_key["harness.evolve"]["choice"] == "given"
    assert by_key["harness.evolve"]["evidence"]["seed_dev"]["n_episodes"] == 4
    assert by_key["weights.imitation"]["choice"] == "train"
    choice = by_key["weights.choice"]
    assert choice["choice"] in ("imitation", "on-policy")
    for variant in ("imitation", "on-policy", "placebo"):  # both variants (and the placebo) with their intervals
        ev = choice["evidence"][variant]
        assert "mean_score_ci95" in ev and "ci95" in ev["vs_base"] and ev["steps"] >= 1
    assert choice["evidence"]["imitation"]["steps"] == choice["evidence"]["on-policy"]["steps"]  # the same budget
    assert (out / "weights" / "distill" / "adapter" / "adapter_config.json").is_file()
    content = by_key["content.tasks"]
    if content["choice"] != "skip":
        assert content["choice"] == content["evidence"]["selected"] and (out / "content" / "grpo" / "adapter").is_dir()
    assert set(result.cells) == {"seed-base", "harness", "weights", "content"}
    assert json.loads((out / "improve.json").read_text()) == result.model_dump()  # improve.json holds the model's dump
    for cell in result.cells.values():
        for key in ("mean_score", "mean_score_ci95", "pass_at_k", "pass_hat_k", "triage"):
            assert key in cell
        assert cell["n_tasks"] == 2
    assert set(result.paired_differences) == {
        "harness_vs_seed_base",
        "weights_vs_seed_base",
        "content_vs_seed_base",
        "harness_vs_weights",
    }
    assert result.runtime_only["text"]
    assert json.loads((out / "improve.json").read_text())["decisions"] == lines
    report = (out / "report.md").read_text()
    assert "weights.choice" in report and "Held-out test tasks" in report
    assert (out / "LOCKED").is_file()
    with pytest.raises(JobError, match="locked"):
        run_improve(enter("improve", config(specs), out, resume=True, progress=False))


def test_a_run_stopped_after_each_phase_resumes_to_the_same_decisions(full, specs, tmp_path):
    reference, _ = full
    out = tmp_path / "stopped"
    first = run_improve(enter("improve", config(specs), out, progress=False), stop_after="harness")
    assert first.stopped_after == "harness" and [d["key"] for d in decisions(out)] == ["harness.evolve"]
    assert not (out / "weights").exists()
    run_improve(enter("improve", config(specs), out, resume=True, progress=False), stop_after="weights")
    assert [d["key"] for d in decisions(out)][-1] == "weights.choice" and not (out / "content").exists()
    run_improve(enter("improve", config(specs), out, resume=True, progress=False))
    assert (out / "decisions.jsonl").read_text() == (reference / "decisions.jsonl").read_text()

    def cells(folder):  # the models name adapters inside their own folder
        return {
            n: {k: v for k, v in c.items() if k != "model"}
            for n, c in json.loads((folder / "improve.json").read_text())["cells"].items()
        }

    assert cells(out) == cells(reference)


def test_the_harness_phase_evolves_and_records_which_ceiling_fired(specs, tmp_path):
    out = tmp_path / "evolve"
    # process floor 0: the seed's rate is never below it, so the evolution runs; patience 1
    cfg = config(specs, evolved=None, process_floor=0.0, patience=1, iterations=2, candidates=1, rollouts=1)
    result = run_improve(enter("improve", cfg, out, progress=False), stop_after="harness")
    by_key = {d.key: d.model_dump() for d in result.decisions}
    assert by_key["harness.evolve"]["choice"] == "evolve"
    ceiling = by_key["harness.ceiling"]
    assert ceiling["choice"] in ("patience", "no_process_gain", "budget", "proposer_exhausted")
    final = json.loads((out / "harness" / "evolve" / "final.json").read_text())
    assert ceiling["evidence"]["iteration"] == final["iterations_run"]
    trail = ceiling["evidence"]["iterations"]
    if ceiling["choice"] in ("patience", "no_process_gain"):
        assert trail[-1]["fired"] == ceiling["choice"] and len(trail) == final["iterations_run"]
        assert final["stopped_by"] == ceiling["choice"]  # the evolution itself was stopped there
    else:
        assert final["stopped_by"] is None
    if ceiling["choice"] == "patience":  # patience 1: the first iteration that accepts nothing stops it
        assert trail[-1]["accepted"] is None and final["iterations_run"] == 1
    assert (out / "harness" / "evolved.yaml").is_file()
    again = run_improve(enter("improve", cfg, out, resume=True, progress=False), stop_after="harness")
    assert again.decisions == result.decisions


def test_triage_helpers_count_process_failures_and_pick_the_content_tasks(full):
    from harnessrl.store import RunStore

    out, _ = full
    with RunStore(out / "content" / "select") as store:
        trajectories = list(store.trajectories(with_tokens=False))
    rate = process_rate(trajectories)
    assert rate is not None and 0 <= rate <= 1
    chosen = content_task_ids(trajectories)
    failed = {t.task_id for t in trajectories if t.grade is not None and not t.grade.passed}
    assert set(chosen) <= failed
    subset = TrainSubset(TextScore(), chosen)
    assert [t.id for t in subset.tasks("train")] == sorted(chosen, key=lambda i: int(i.rsplit("/", 1)[1]))
    assert subset.split_sizes["train"] == len(chosen) and len(subset.tasks("dev")) == 4


def _cli():
    from harnessrl.cli.improve import improve_cmd

    app = typer.Typer()
    app.command("improve")(improve_cmd)
    app.command("other")(lambda: None)
    return app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "notrain"], "split 'train' of suite 'notrain' does not exist"),
        (["--seed-harness", "EXTERNAL"], "external agent program"),
        (["--test-tasks", "0"], "test-tasks"),
        (["--dev-tasks", "100"], "has 4 tasks; asked for 100"),
        (
            ["--distill-tasks-per-step", "100"],
            "--distill-tasks-per-step: split 'train' of suite 'textscore' has",
        ),
        (["--evolved", "json-tools"], "must share their protocol"),
        (["--model", "openai:m@http://x/v1"], "training needs a local model"),
    ],
)
def test_bad_input_exits_2_with_one_clear_message_and_writes_nothing(args, message, specs, tmp_path):
    out = tmp_path / "out"
    args = [specs["external"] if a == "EXTERNAL" else a for a in args]
    base = ["improve", "--suite", "textscore", "--seed-harness", specs["seed"], "--model", "tiny-random"]
    base += ["--dev-tasks", "4", "--test-tasks", "4"]  # the suite's whole dev and test splits
    r = CliRunner().invoke(_cli(), [*base, "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert not out.exists()


def test_the_command_stops_after_the_harness_phase_and_says_how_to_continue(specs, tmp_path):
    out = tmp_path / "cli"
    args = ["improve", "--suite", "textscore", "--seed-harness", specs["seed"], "--model", "tiny-random"]
    args += ["--device", "cpu", "--dev-tasks", "2", "--test-tasks", "2", "--out", str(out), "--no-progress"]
    r = CliRunner().invoke(_cli(), [*args, "--stop-after", "harness"])
    assert r.exit_code == 0, r.output
    assert "harness: harness.evolve = skip" in r.output and "--resume" in r.output
    assert [d["key"] for d in decisions(out)] == ["harness.evolve"]
    bad = CliRunner().invoke(_cli(), [*args, "--resume", "--stop-after", "final"])
    assert bad.exit_code == 2 and "--stop-after must be one of" in bad.output


def test_an_evolved_harness_of_another_protocol_is_imitated_but_not_distilled_on_policy(specs, tmp_path):
    from harnessrl.improve import Improve
    from harnessrl.improve.harness import EvolvedHarness
    from harnessrl.improve.record import begin, cell, release
    from harnessrl.improve.weights import weights_phase

    state = Improve(enter("improve", config(specs, evolved=None), tmp_path / "protocol", progress=False)).state
    begin(state)
    xml = shrunk("xml-tags", system_prompt="Reply with any text.", max_new_tokens=8, **SHORT)
    base = cell(state, "harness/seed-dev", "dev", state.dev_tasks, state.seed_spec, "tiny-random")
    try:
        kept = weights_phase(state, base, EvolvedHarness(spec=xml, is_seed=False))
    finally:
        release(state)
    by_key = {d.key: d.model_dump() for d in state.decisions}
    assert by_key["weights.on_policy"]["choice"] == "skip"
    assert "must share their protocol" in by_key["weights.on_policy"]["evidence"]["reason"]
    assert not (state.out / "weights" / "distill").exists()
    assert (
        by_key["weights.choice"]["choice"] in ("imitation", "base")
        and kept["variant"] == by_key["weights.choice"]["choice"]
    )


def test_a_stage_that_refuses_to_go_on_is_one_clear_error_with_the_decisions_kept(specs, tmp_path):
    """A finished stage whose run database cannot be read any more (here: overwritten) stops a
    resume with ImproveError naming the stage, not a crash, and the decisions already written stay."""
    out = tmp_path / "changed"
    cfg = config(specs)
    run_improve(enter("improve", cfg, out, progress=False), stop_after="harness")
    before = (out / "decisions.jsonl").read_text()
    (out / "harness" / "seed-dev" / "run.db").write_bytes(b"not a database" * 100)
    with pytest.raises(JobError, match="harness/seed-dev: cannot read its run database"):
        run_improve(enter("improve", cfg, out, resume=True, progress=False))
    assert (out / "decisions.jsonl").read_text() == before
