"""`harnessrl study`: the whole protocol end to end on the tiny random model (the collection on
the train tasks by the oracle, which knows every task's solution: the tiny model never passes),
resume after a kill and after the end, refused resumes, nothing to distil, a real 1-iteration
evolution, and the recommendation computed from constructed numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import oracle_policy, shrunk_file
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.errors import JobError
from harnessrl.harness.registry import load_harness
from harnessrl.jobs.study import CELLS, COMPARISONS, Study, StudyConfig, recommend, run_study, verdict
from harnessrl.kernel import enter
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite

N_COLLECT = 3


def small_spec(folder: Path, base: str, name: str) -> Path:
    """A built-in harness with budgets small enough for the tiny random model to finish fast (it
    writes random tokens up to max_new_tokens every step), and large enough for the oracle's and
    the replay's replies (toolcalc: at most two calls and the submit, three steps; the longest
    reply of the oracle on toolcalc's tasks is 35 tokens in json-tools, 32 in react)."""
    return shrunk_file(folder, base, name=name, max_steps=3, max_new_tokens=40, max_total_tokens=4096)


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("specs")
    return small_spec(folder, "react", "react-small"), small_spec(folder, "json-tools", "json-small")


def study_config(specs, **kw) -> StudyConfig:
    seed, evolved = specs
    base = dict(
        suite="toolcalc",
        seed_harness=str(seed),
        evolved=str(evolved),
        model="tiny-random",
        seed_eval_tasks=1,
        collect_tasks=N_COLLECT,
        collect_attempts=1,
        epochs=1,
        lr=1e-3,
        test_tasks=2,
        attempts=2,
        max_in_flight=8,
        retries=0,
    )
    return StudyConfig(**{**base, **kw})


class OracleCollector:
    """Hands the collection stage the oracle (its episodes pass), every other stage the tiny
    model; counts the stages it was asked for; `interrupt_at`: a stage that is killed (Ctrl-C)."""

    def __init__(self, evolved_spec: Path, tokenizer, interrupt_at: str | None = None):
        self.spec = load_harness(str(evolved_spec))
        self.tokenizer = tokenizer
        self.interrupt_at = interrupt_at
        self.asked: list[str] = []

    def __call__(self, stage: str, model: str):
        self.asked.append(stage)
        if stage == self.interrupt_at:
            raise KeyboardInterrupt
        if stage == "collect":
            tasks = get_suite("toolcalc").tasks("train", N_COLLECT)
            return oracle_policy(tasks, self.spec, self.tokenizer)
        return None


def episodes(folder: Path) -> int:
    with RunStore(folder) as store:
        return store.count()


def stage_counts(out: Path) -> dict[str, int]:
    stages = ["seed-eval", "collect", *(f"cells/{c}" for c in CELLS)]
    return {s: episodes(out / s) for s in stages if (out / s / "run.db").is_file()}


def sft_steps(out: Path) -> dict[str, list[str]]:
    return {s: (out / s / "metrics.jsonl").read_text().splitlines() for s in ("sft", "placebo")}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, specs, tokenizer) -> dict:
    """A study killed in its second cell, then resumed to the end; what each step left."""
    out = tmp_path_factory.mktemp("study") / "s"
    config = study_config(specs)
    killed = OracleCollector(specs[1], tokenizer, interrupt_at="cells/evolved-base")
    with pytest.raises(KeyboardInterrupt):
        run_study(enter("study", config, out, progress=False), killed)
    after_kill = {
        "counts": stage_counts(out),
        "sft": sft_steps(out),
        "stages": json.loads((out / "stages.json").read_text()),
    }
    resumed = OracleCollector(specs[1], tokenizer)
    result = run_study(enter("study", config, out, resume=True, progress=False), resumed)
    return {"out": out, "config": config, "result": result, "after_kill": after_kill, "resumed": resumed}


def test_the_study_writes_five_cells_with_every_field(finished):
    result = finished["result"]
    on_disk = json.loads((finished["out"] / "study.json").read_text())
    assert on_disk == json.loads(json.dumps(result.model_dump()))  # study.json holds the model's dump
    assert set(result.cells) == set(CELLS) and len(CELLS) == 5
    assert "pack" not in json.loads((finished["out"] / "config.json").read_text())  # off: as studies were recorded
    for name, cell in result.cells.items():
        side, weights = CELLS[name]
        assert cell["harness"] == side and cell["weights"] == weights
        assert cell["harness_name"] == ("react-small" if side == "seed" else "json-small")
        assert cell["n_tasks"] == 2 and cell["n_episodes"] + cell["n_infra_errors"] == 4
        for key in ("mean_score", "mean_score_ci95", "pass_at_k", "pass_hat_k", "delivery_rate"):
            assert key in cell
        assert set(cell["pass_at_k"]) == set(cell["pass_hat_k"]) == {"1", "2"}
        tri = cell["triage"]
        assert {"process_share", "content_share", "process_rate", "content_rate", "counts"} <= set(tri)
        if tri["n_failed"]:
            assert tri["process_share"] + tri["content_share"] == pytest.approx(1.0)
    assert result.cells["seed-distilled"]["model"].endswith("sft/adapter")
    assert result.cells["seed-placebo"]["model"].endswith("placebo/adapter")
    assert result.cells["evolved-base"]["model"] == "tiny-random"
    assert result.evolution == {"given": finished["config"].evolved} and result.evolved_is_seed is False
    assert result.collect.passed == N_COLLECT and result.collect.passed_tasks == N_COLLECT
    assert result.training["sft"].examples > 0 and result.training["placebo"].steps >= 1
    assert result.seed_eval["n_episodes"] == 2


def test_paired_differences_content_shares_and_recommendation(finished):
    result = finished["result"]
    diffs = result.paired_differences
    assert set(diffs) == set(COMPARISONS)
    for name, (a, b) in COMPARISONS.items():
        d = diffs[name]
        assert (d["a"], d["b"]) == (a, b) and d["n_tasks"] == 2
        assert d["verdict"] == verdict(d)
        expected = result.cells[b]["mean_score"] - result.cells[a]["mean_score"]
        assert d["mean_difference"] == pytest.approx(expected)  # same tasks on both sides
    content = result.content_failures
    assert content["before"]["cell"] == "seed-base" and content["after"]["cell"] == "seed-distilled"
    assert content["before"]["content_rate"] == result.cells["seed-base"]["triage"]["content_rate"]
    assert "ci95" in content["rate_difference"] and "verdict" in content["rate_difference"]
    rec = result.recommendation
    assert {"fix_in_harness", "train_into_weights", "distils", "runtime_only", "score", "no_claim", "text"} <= set(
        rec.model_dump()
    )
    assert rec.text and all(isinstance(line, str) for line in rec.text)
    assert any(line.startswith("Content failures, as a share of episodes") for line in rec.text)
    # the tiny model passes nothing on test tasks: every score difference is 0 [0, 0], so no claim is made
    assert all(d["verdict"] == "no claim" for d in diffs.values())
    assert sum("no claim" in line for line in rec.text) >= len(COMPARISONS)


def test_the_killed_stage_resumes_and_finished_stages_are_not_run_again(finished):
    out, kill = finished["out"], finished["after_kill"]
    # the kill came in the second cell: every earlier stage had finished
    assert set(kill["stages"]) == {"seed-eval", "collect", "sft", "placebo", "cells/seed-base"}
    assert kill["counts"]["collect"] == N_COLLECT and kill["counts"]["cells/seed-base"] == 4
    assert kill["counts"]["cells/evolved-base"] == 0  # the folder was opened, nothing ran
    # the resumed run asked only for the cells still to run, and retrained nothing
    assert finished["resumed"].asked == [f"cells/{c}" for c in CELLS if c != "seed-base"]
    assert sft_steps(out) == kill["sft"]
    counts = stage_counts(out)
    assert {k: v for k, v in counts.items() if k in kill["counts"] and k != "cells/evolved-base"} == {
        k: v for k, v in kill["counts"].items() if k != "cells/evolved-base"
    }
    assert all(counts[f"cells/{c}"] == 4 for c in CELLS)


def test_a_resume_after_the_end_runs_nothing(finished, specs, tokenizer, monkeypatch):
    import harnessrl.models

    out = finished["out"]
    before = (stage_counts(out), sft_steps(out), (out / "stages.json").read_text())

    def no_model(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(harnessrl.models, "load_policy", no_model)
    again = OracleCollector(specs[1], tokenizer)
    result = run_study(enter("study", finished["config"], out, resume=True, progress=False), again)
    assert again.asked == []
    assert (stage_counts(out), sft_steps(out), (out / "stages.json").read_text()) == before
    assert result.cells == finished["result"].cells


def test_the_report_of_a_study_folder_shows_its_cells_differences_and_recommendation(finished, tmp_path):
    from html.parser import HTMLParser

    out, result = finished["out"], finished["result"]
    r = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "study-report")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "study-report" / "index.html").read_text(encoding="utf-8")

    class Links(HTMLParser):
        hrefs: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag == "a":
                self.hrefs.append(dict(attrs)["href"])

    parser = Links()
    parser.feed(page)
    # every cell links to its own report, which exists
    for cell in CELLS:
        href = next(h for h in parser.hrefs if f"cells/{cell}/report" in h)
        assert (tmp_path / "study-report" / href).resolve().is_file(), href
    for line in result.recommendation.text:
        assert line.replace("'", "&#x27;") in page, line
    for name, diff in result.paired_differences.items():
        assert f"{diff['mean_difference']:+.3f}" in page, name
    assert f"{result.cells['seed-placebo']['mean_score']:.3f}" in page
    # a study folder cannot be one side of a comparison, and says what to do instead
    r = CliRunner().invoke(app, ["report", str(out), str(out / "cells" / "seed-base")])
    assert r.exit_code == 2 and "is a study folder" in r.output and "cells/seed-base" in r.output, r.output
    a, b = out / "cells" / "seed-base", out / "cells" / "seed-distilled"
    r = CliRunner().invoke(app, ["report", str(a), str(b), "--out", str(tmp_path / "report")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "report" / "index.html").is_file()


def test_the_report_of_an_unfinished_study_says_how_to_finish_it(tmp_path):
    (tmp_path / "stages.json").write_text(json.dumps({"seed-eval": {}}), encoding="utf-8")
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "without study.json" in r.output and "--resume" in r.output, r.output
    assert not (tmp_path / "report").exists()


def test_a_changed_configuration_is_refused_on_resume(finished, specs):
    with pytest.raises(JobError, match=r"different configuration.*attempts \(2 -> 3\)"):
        run_study(enter("study", study_config(specs, attempts=3), finished["out"], resume=True, progress=False))
    # with --evolved given, the evolution's options play no part and may change
    Study(enter("study", study_config(specs, iterations=7, dev_tasks=9), finished["out"], resume=True, progress=False))
    # the collection may not grow once an adapter was trained on it
    with pytest.raises(JobError, match="collect_attempts"):
        run_study(enter("study", study_config(specs, collect_attempts=2), finished["out"], resume=True, progress=False))
    r = CliRunner().invoke(
        app, ["study", *cli_args(specs), "--test-tasks", "3", "--out", str(finished["out"]), "--resume"]
    )
    assert r.exit_code == 2 and "--resume with a different configuration" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["study", *cli_args(specs), "--out", str(finished["out"])])
    assert r.exit_code == 2 and "already holds a run" in r.output


def cli_args(specs, **kw) -> list[str]:
    seed, evolved = specs
    values = {
        "--suite": "toolcalc",
        "--seed-harness": str(seed),
        "--evolved": str(evolved),
        "--model": "tiny-random",
        "--seed-eval-tasks": "1",
        "--collect-tasks": str(N_COLLECT),
        "--collect-attempts": "1",
        "--epochs": "1",
        "--lr": "0.001",
        "--test-tasks": "2",
        "--attempts": "2",
        "--max-in-flight": "8",
        "--retries": "0",
        "--no-progress": None,
        **kw,
    }
    return [x for k, v in values.items() for x in ((k,) if v is None else (k, v))]


def test_nothing_passing_on_the_train_tasks_is_one_clear_error_and_more_attempts_resume(tmp_path, specs):
    out = tmp_path / "s"
    args = cli_args(specs, **{"--seed-eval-tasks": "0", "--collect-tasks": "2"})
    r = CliRunner().invoke(app, ["study", *args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "nothing to distil: none of the 2 episodes of json-small" in r.output and "Traceback" not in r.output
    assert "--collect-attempts 2" in r.output
    assert "collect" not in json.loads((out / "stages.json").read_text()) if (out / "stages.json").exists() else True
    assert not (out / "sft").exists()
    # the way out it names: resume with more attempts; the finished episodes are kept, the new ones run
    r = CliRunner().invoke(app, ["study", *args, "--collect-attempts", "2", "--out", str(out), "--resume"])
    assert r.exit_code == 2 and "none of the 4 episodes" in r.output, r.output
    assert episodes(out / "collect") == 4
    r = CliRunner().invoke(app, ["study", *args, "--collect-attempts", "1", "--out", str(out), "--resume"])
    assert r.exit_code == 2 and "--collect-attempts may only grow" in r.output


def test_collect_model_oracle_collects_passing_episodes_while_the_base_model_runs_the_cells(tmp_path, specs):
    class StopAtTheCells:
        asked: list[str] = []

        def __call__(self, stage: str, model: str):
            self.asked.append(f"{stage}:{model}")
            if stage.startswith("cells/"):
                raise KeyboardInterrupt
            return None

    out = tmp_path / "s"
    factory = StopAtTheCells()
    with pytest.raises(KeyboardInterrupt):
        config = study_config(specs, seed_eval_tasks=0, collect_model="oracle", pack=True)
        run_study(enter("study", config, out, progress=False), factory)
    # the collection was the oracle's own (every episode passes), and the first cell asked for the base model
    assert factory.asked == ["collect:oracle", "cells/seed-base:tiny-random"]
    with RunStore(out / "collect") as store:
        trajs = list(store.trajectories(with_tokens=False))
    assert len(trajs) == N_COLLECT and all(t.grade.passed for t in trajs)
    assert json.loads((out / "collect" / "config.json").read_text())["model"] == "oracle"
    assert (out / "sft" / "adapter").is_dir() and (out / "placebo" / "adapter").is_dir()
    # --pack reaches both adapters' fine-tuning, and is recorded (only) when on
    assert json.loads((out / "config.json").read_text())["pack"] is True
    assert all(json.loads((out / s / "config.json").read_text())["pack"] is True for s in ("sft", "placebo"))
    r = CliRunner().invoke(app, ["study", *cli_args(specs), "--collect-model", "nope", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--collect-model: unknown model 'nope'" in r.output, r.output


def test_bad_options_exit_2_before_anything_is_written(tmp_path, specs):
    for extra, message in (
        (["--model", "openai:x@http://127.0.0.1:9/v1"], "cannot be fine-tuned"),
        (["--seed-harness", "nope"], "unknown harness 'nope'"),
        (["--test-tasks", "100000"], "split 'test' of suite 'toolcalc' has 72 tasks; asked for 100000"),
        (["--model", "hf:/nonexistent/model"], "--model: model path '/nonexistent/model' does not exist"),
        (["--dev-tasks", "1"], "--dev-tasks must be >= 2"),
    ):
        out = tmp_path / "o"
        r = CliRunner().invoke(app, ["study", *cli_args(specs), *extra, "--out", str(out)])
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, (extra, r.output)
        assert not out.exists()


def test_a_one_iteration_evolution_feeds_the_study(tmp_path, specs, tokenizer):
    out = tmp_path / "s"
    config = study_config(
        specs, evolved=None, seed_eval_tasks=0, dev_tasks=2, rollouts=1, iterations=1, candidates=1, test_tasks=2
    )
    collector = OracleCollector(specs[0], tokenizer)  # the evolved harness is react-based: its oracle

    def factory(stage, model):
        if stage == "collect":  # the evolved spec is known only now: the oracle renders in its protocol
            collector.spec = load_harness(str(out / "evolve" / "best_harness.yaml"))
        return collector(stage, model)

    result = run_study(enter("study", config, out, progress=False), factory)
    final = json.loads((out / "evolve" / "final.json").read_text())
    assert result.evolution["best"] == final["best"] and result.evolution["iterations_run"] == 1
    assert result.evolved_harness == load_harness(str(out / "evolve" / "best_harness.yaml")).name
    assert (out / "evolve" / "LOCKED").is_file() and set(result.cells) == set(CELLS)
    assert json.loads((out / "stages.json").read_text())["evolve"]["best"] == final["best"]


# ------------------------------------------------------------------------------ the recommendation


def _analyses(scores: dict[str, list[float]], rates: dict[str, dict[str, list[float]]]) -> dict:
    """Cells from per-task numbers: scores[cell] and rates[cell][class] over the same tasks."""
    from harnessrl.triage import CONTENT, PROCESS

    out = {}
    for cell in CELLS:
        s = scores[cell]
        tasks = [f"t{i}" for i in range(len(s))]
        r = {c: dict(zip(tasks, rates.get(cell, {}).get(c, [0.0] * len(s)))) for c in (*PROCESS, *CONTENT)}
        out[cell] = {"scores": dict(zip(tasks, s)), "rates": r}
    return out


def test_the_recommendation_follows_the_intervals():
    from harnessrl.jobs.study import class_effects
    from harnessrl.metrics import paired_difference

    n = 12
    ones, zeros = [1.0] * n, [0.0] * n
    half = [1.0, 0.0] * (n // 2)
    scores = {
        "seed-base": zeros,
        "evolved-base": ones,  # the harness gains everywhere
        "seed-distilled": half,  # the weights gain on half the tasks
        "evolved-distilled": ones,
        "seed-placebo": zeros,
    }
    rates = {
        # seed-base: malformed calls and loops on every task, content failures too
        "seed-base": {"malformed_call": ones, "loop": ones, "blocked_call": ones, "content": ones},
        # the evolved harness removes malformed calls and loops
        "evolved-base": {"blocked_call": ones, "content": ones},
        # the distilled weights remove loops (distils) but not malformed calls (runtime-only); fewer content failures
        "seed-distilled": {"malformed_call": ones, "content": [0.0, 1.0] * (n // 2)},
        "evolved-distilled": {},
        # the placebo changes nothing
        "seed-placebo": {"malformed_call": ones, "loop": ones, "blocked_call": ones, "content": ones},
    }
    analyses = _analyses(scores, rates)
    diffs = {}
    for name, (a, b) in COMPARISONS.items():
        d = paired_difference(analyses[a]["scores"], analyses[b]["scores"])
        diffs[name] = {"a": a, "b": b, **d.model_dump(), "verdict": verdict(d)}
    effects = class_effects(analyses)
    assert set(effects) == {"malformed_call", "loop", "blocked_call", "content"}
    content = {
        "before": {"content_rate": 1.0},
        "after": {"content_rate": 0.5},
        "rate_difference": {"mean_difference": -0.5, "ci95": [-0.8, -0.2], "verdict": "lower"},
    }
    rec = recommend(diffs, effects, content=content)
    assert [x["class"] for x in rec.fix_in_harness] == ["malformed_call", "loop"]
    assert [x["class"] for x in rec.runtime_only] == ["malformed_call"]
    assert [x["class"] for x in rec.distils] == ["loop"]
    assert [x["class"] for x in rec.train_into_weights] == ["content"]
    assert rec.score["harness"] == "higher" and rec.score["weights"] == "higher"
    assert rec.score["runtime_only"] is False  # the weights carry part of the gain
    # the harness leaves content failures as they are: [0, 0] includes 0, no claim
    assert any(x["what"] == "content rate, evolved vs seed under base" for x in rec.no_claim)
    assert any("Runtime-only" in line and "malformed_call" in line for line in rec.text)
    # blocked calls: only the weights remove them (not a harness fix, said in the text)
    assert "blocked_call" not in [x["class"] for x in rec.fix_in_harness + rec.distils]
    assert any("also make these process failures rarer" in line and "blocked_call" in line for line in rec.text)
    assert any(line.startswith("Content failures") and "100% with the base" in line for line in rec.text)

    # a placebo that helps as much: the content gain is not claimed for the weights
    rates["seed-placebo"] = {"malformed_call": ones, "loop": ones, "content": [0.0, 1.0] * (n // 2)}
    rec = recommend(diffs, class_effects(_analyses(scores, rates)))
    assert rec.train_into_weights == []
    assert any("placebo adapter reduces it too" in x["why"] for x in rec.no_claim)

    # weights that gain nothing: the harness's score gain is runtime-only
    scores["seed-distilled"] = zeros
    d = paired_difference(
        _analyses(scores, rates)["seed-base"]["scores"], _analyses(scores, rates)["seed-distilled"]["scores"]
    )
    diffs["distilled_vs_base_under_seed"] = {
        **diffs["distilled_vs_base_under_seed"],
        **d.model_dump(),
        "verdict": verdict(d),
    }
    rec = recommend(diffs, class_effects(_analyses(scores, rates)))
    assert rec.score["runtime_only"] is True
    assert any("score gain" in line and "runtime-only" in line for line in rec.text)


def test_verdict_names_an_interval_that_includes_zero():
    assert verdict({"ci95": [-0.2, 0.1]}) == "no claim"
    assert verdict({"ci95": [0.0, 0.0]}) == "no claim"
    assert verdict({"ci95": [0.05, 0.3]}) == "higher"
    assert verdict({"ci95": [-0.3, -0.01]}) == "lower"
    assert verdict({"ci95": None}) == "no data" and verdict(None) == "no data"


def test_a_content_failure_counts_once_in_the_per_task_rates(tokenizer):
    """The content class has the same name as its kind: each failed episode counts once, so the
    per-task rates agree with the cell's content rate (the paired content difference used them)."""
    from helpers import replies_policy

    from harnessrl.harness.protocols import get_protocol
    from harnessrl.jobs.study import cell_analysis
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.types import ToolCall

    spec = load_harness("json-tools")
    tasks = get_suite("toolcalc").tasks("dev", 3)
    wrong = get_protocol(spec.protocol.format).render_call(ToolCall(name="submit", arguments={"answer": "-1"}))
    runner = Runner(replies_policy([wrong], tokenizer), SamplingParams(temperature=0.0), progress=False)
    analysis = cell_analysis(runner.run(make_jobs(tasks, [spec], 1)), attempts=1)
    assert analysis["record"]["triage"]["content_rate"] == 1.0
    assert analysis["rates"]["content"] == {t.id: 1.0 for t in tasks}


def test_the_study_records_recompute_its_paired_differences(finished, tmp_path):
    """bench/study_records.py: each cell's per-task records and run.json, from which bench/write_doc.py
    recomputes the study's own paired differences (the same tasks, means and intervals)."""
    import sys

    bench = Path(__file__).resolve().parent.parent / "bench"
    sys.path.insert(0, str(bench))
    import results
    import study_records
    import write_doc

    records = tmp_path / "records" / "study" / "s"
    run = study_records.study_records(finished["out"], records)
    result = finished["result"]
    assert sorted(run["evaluations"]) == sorted(result.cells) and run["pools"]["cells"] == ["json-small", "react-small"]
    for name, cell in result.cells.items():
        rows = results.read_lines(records / f"eval-{name}.jsonl")
        assert {r["harness"] for r in rows} == {cell["harness_name"]}
        assert len(rows) == cell["n_tasks"]
        assert sum(len(r["scores"]) for r in rows) == cell["n_episodes"] + cell["n_infra_errors"]
    assert [c[0] for c in run["comparisons"]] == [
        f"{d['b']} - {d['a']}" for d in map(result.paired_differences.get, COMPARISONS)
    ]
    for name, d in result.paired_differences.items():
        mine = results.records_difference(records, d["a"], d["b"], "cells")
        assert mine.n_tasks == d["n_tasks"] == 2
        assert mine.mean_difference == pytest.approx(d["mean_difference"])
        assert mine.ci95 == pytest.approx(d["ci95"])
    table = write_doc.render_records_table("differences", "study/s", tmp_path)
    assert all(f"| {d['b']} - {d['a']} |" in table for d in result.paired_differences.values())
    assert "the cell's harness" in table.splitlines()[0]
    # --record: the cells' table of the page (bench/results/study.jsonl), from study.json
    path = study_records.record_study(finished["out"], "s", "harnessrl study ...", "quiet", tmp_path / "results")
    (record,) = results.read_records(path.parent)
    assert (record["benchmark"], record["table"], record["command"]) == ("study", "s", "harnessrl study ...")
    assert record["machine"].endswith("; quiet")
    assert [row["cell"] for row in record["rows"]] == list(result.cells)
    for row in record["rows"]:
        cell = result.cells[row["cell"]]
        assert row["harness"] == cell["harness_name"] and row["weights"] == cell["weights"]
        mean = next(v for k, v in row.items() if k.startswith("mean [95% CI]"))
        assert mean.startswith(f"{cell['mean_score']:.3f} [")
        assert row["malformed calls"] == cell["triage"]["counts"]["malformed_call"]
    assert record["results"]["paired_differences"] == result.paired_differences
    # a study that has not finished: a clear error, nothing written
    with pytest.raises(SystemExit, match="study.json is missing"):
        study_records.study_records(tmp_path / "nowhere", tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_the_committed_records_give_the_pages_self_distillation_interval():
    """The harness-to-weights result in docs/BENCHMARKS.md (seed+distilled - seed+base), recomputed
    here from the committed per-attempt records of the two cells alone, paired by task."""
    from harnessrl.metrics import paired_difference

    root = Path(__file__).resolve().parent.parent
    records = root / "bench" / "results" / "records" / "study" / "self-distill"
    if not (records / "eval-seed-distilled.jsonl").is_file():
        pytest.skip("the study's records are not in this checkout")

    def per_task(cell: str) -> dict[str, float]:
        out = {}
        for line in (records / f"eval-{cell}.jsonl").read_text().splitlines():
            row = json.loads(line)
            scores = [s for s in row["scores"] if s is not None]
            out[row["task"]] = sum(scores) / len(scores)
        return out

    base, distilled = per_task("seed-base"), per_task("seed-distilled")
    assert len(base) == len(distilled) == 72
    d = paired_difference(base, distilled)
    text = f"{d.mean_difference:+.3f} [{d.ci95[0]:+.3f}, {d.ci95[1]:+.3f}]"
    assert text == "+0.847 [+0.771, +0.924]"
    page = (root / "docs" / "BENCHMARKS.md").read_text()
    assert f"| seed-distilled - seed-base | {text} |" in page
