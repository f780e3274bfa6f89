"""HTML report: metrics, plots, triage, paged episode files, comparison, bad input. No browser."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import oracle_policy, replies_policy

from harnessrl.harness.registry import load_harness
from harnessrl.models.base import SamplingParams
from harnessrl.report import PAGE_SIZE, ReportError, build_report, read_data_file, report_json, serve
from harnessrl.rollout import Job, Runner
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.triage import CLASSES
from harnessrl.types import (
    ActionKind,
    BlockReason,
    Grade,
    Intervention,
    Message,
    ModelCall,
    Step,
    Termination,
    ToolCall,
    ToolResult,
    Trajectory,
)

N_TASKS = 4
ATTEMPTS = 2
# react replies: prose (malformed), a call with a missing argument (blocked), then a wrong submit
BAD_REPLIES = [
    "I think it is 4",
    'Action: add\nAction Input: {"a": 1}',
    'Action: submit\nAction Input: {"answer": "3"}',
]


def run_config(task_ids: list[str], harnesses: dict, attempts: int, suite: str = "toolcalc") -> dict:
    """The config `harnessrl eval` stores, same keys."""
    return {
        "harnessrl_version": "0.1.0",
        "suite": suite,
        "split": "dev",
        "model": "scripted",
        "seed": 0,
        "tasks": len(task_ids),
        "task_ids": task_ids,
        "attempts": attempts,
        "sampling": SamplingParams().model_dump(),
        "harnesses": harnesses,
        "max_retries": 0,
    }


def make_run(
    folder: Path, tokenizer, good: list[str], bad: list[str], n_tasks: int = N_TASKS, attempts: int = ATTEMPTS
) -> Path:
    """A real run through the Runner: harnesses in `good` get the oracle (pass), those in `bad`
    scripted failures. One fresh oracle per attempt (it tracks progress per instruction)."""
    tasks = get_suite("toolcalc").tasks("dev", n_tasks)
    specs = {name: load_harness(name) for name in good + bad}
    with RunStore(folder) as store:
        store.set_meta(
            "config", run_config([t.id for t in tasks], {n: s.to_dict() for n, s in specs.items()}, attempts)
        )
        for a in range(attempts):
            for name, spec in specs.items():
                policy = (
                    oracle_policy(tasks, spec, tokenizer) if name in good else replies_policy(BAD_REPLIES, tokenizer)
                )
                Runner(policy, SamplingParams(), progress=False, on_episode=store.add, max_in_flight=1).run(
                    [Job(t, spec, a) for t in tasks]
                )
    return folder


# -- synthetic runs: tiny trajectories written straight into the store (fast, any size) ------------


def _call(text: str, messages: list[Message]) -> ModelCall:
    return ModelCall(prompt_ids=[], completion_ids=[], logprobs=[], text=text, messages=messages)


def synthetic_trajectory(task: int, harness: str, attempt: int, kind: str, huge: int = 0) -> Trajectory:
    """One small episode of a given outcome: pass, malformed, blocked or content."""
    instruction = f"Compute task {task}."
    msgs = [Message(role="system", content="Call tools."), Message(role="user", content=instruction)]
    big = "x" * huge
    if kind == "pass":
        steps = [
            Step(
                index=0,
                model_call=_call('{"tool": "submit"}', msgs),
                action=ActionKind.tool_calls,
                tool_calls=[ToolCall(name="submit", arguments={"answer": "42"})],
                tool_results=[ToolResult(name="submit", output="submitted")],
            )
        ]
        grade, term, submitted = Grade(score=1.0, passed=True, subscores={"answer": 1.0}), Termination.submitted, True
    elif kind == "malformed":
        steps = [
            Step(
                index=0,
                model_call=_call("I think 42" + big, msgs),
                action=ActionKind.malformed,
                parse_error="no tool call found in the reply",
                interventions=[Intervention(kind="malformed_feedback", message="Use the format.")],
            )
        ]
        grade, term, submitted = None, Termination.max_steps, False
    elif kind == "blocked":
        steps = [
            Step(
                index=0,
                model_call=_call('{"tool": "read"}', msgs),
                action=ActionKind.tool_calls,
                tool_calls=[ToolCall(name="read", arguments={"path": "../etc"})],
                tool_results=[
                    ToolResult(
                        name="read", output="path leaves the workspace" + big, ok=False, blocked=BlockReason.sandbox
                    )
                ],
            ),
            Step(
                index=1,
                model_call=_call('{"tool": "submit"}', msgs + [Message(role="assistant", content="...")]),
                action=ActionKind.tool_calls,
                tool_calls=[ToolCall(name="submit")],
                tool_results=[ToolResult(name="submit", output="ok")],
            ),
        ]
        grade, term, submitted = Grade(score=0.0, passed=False, subscores={"answer": 0.0}), Termination.submitted, True
    else:  # content
        steps = [
            Step(
                index=0,
                model_call=_call('{"tool": "submit"}', msgs),
                action=ActionKind.tool_calls,
                tool_calls=[ToolCall(name="submit", arguments={"answer": "41"})],
                tool_results=[ToolResult(name="submit", output="ok")],
            )
        ]
        grade, term, submitted = (
            Grade(score=0.5, passed=False, subscores={"answer": 0.0, "format": 1.0}),
            Termination.submitted,
            True,
        )
    return Trajectory(
        episode_id=f"ep-{harness}-{task:05d}-{attempt}",
        task_id=f"synth/dev/{task:05d}",
        suite="synth",
        family=f"fam{task % 5}",
        split="dev",
        harness=harness,
        attempt=attempt,
        instruction=instruction,
        steps=steps,
        termination=term,
        submitted=submitted,
        answer="42" if submitted else None,
        grade=grade,
    )


KINDS = ("pass", "malformed", "blocked", "content")


def make_synthetic_run(
    folder: Path, n_tasks: int, harnesses=("alpha", "beta"), attempts: int = 1, limit: int | None = None
) -> Path:
    """n_tasks x harnesses x attempts tiny episodes (the first `limit` of them when given)."""
    with RunStore(folder) as store:
        store.db.execute("PRAGMA synchronous=OFF")  # test data: no fsync per episode
        store.set_meta(
            "config",
            run_config(
                [f"synth/dev/{i:05d}" for i in range(n_tasks)], {h: {} for h in harnesses}, attempts, suite="synth"
            ),
        )
        n = 0
        for a in range(attempts):
            for task in range(n_tasks):
                for j, h in enumerate(harnesses):
                    if limit is not None and n >= limit:
                        return folder
                    store.add(synthetic_trajectory(task, h, a, KINDS[(task + j + a) % len(KINDS)]))
                    n += 1
    return folder


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, tokenizer) -> Path:
    return make_run(tmp_path_factory.mktemp("runs") / "a", tokenizer, good=["json-tools"], bad=["react"])


@pytest.fixture(scope="module")
def run_b(tmp_path_factory, tokenizer) -> Path:
    return make_run(tmp_path_factory.mktemp("runs") / "b", tokenizer, good=["react"], bad=["json-tools"])


@pytest.fixture(scope="module")
def report_a(run_a, tmp_path_factory) -> Path:
    return build_report([run_a], tmp_path_factory.mktemp("reports") / "a")


def _episodes(report_dir: Path) -> list[dict]:
    rows = []
    for page in sorted((report_dir / "episodes").glob("index-*.js")):
        key, data = read_data_file(page)
        assert key == f"episodes/{page.stem}"
        rows += data["episodes"]
    return rows


# -- single run ---------------------------------------------------------------------------------------


def test_report_of_a_run_has_table_plots_and_episode_files(run_a, report_a):
    out = report_a.parent
    assert report_a.name == "index.html" and report_a.is_file()
    html = report_a.read_text()
    table = html[html.index('<table class="metrics">') : html.index("</table>", html.index('<table class="metrics">'))]
    for h in ("json-tools", "react"):
        assert f'data-harness="{h}"' in table
    assert "pass@2" in table and "pass^2" in table and "95% CI" in table
    # figures: real SVG files, valid XML, referenced from the page
    svgs = sorted(p.name for p in (out / "plots").glob("*.svg"))
    assert svgs == ["mean_score.svg", "pass_k.svg", "triage.svg"]
    for name in svgs:
        root = ET.parse(out / "plots" / name).getroot()
        assert root.tag.endswith("svg")
        assert f'src="plots/{name}"' in html
    # triage classes of the failed harness appear in the triage plot's legend
    triage_svg = (out / "plots" / "triage.svg").read_text()
    assert "process: malformed_call" in triage_svg and "content: content" in triage_svg

    rows = _episodes(out)
    assert len(rows) == N_TASKS * ATTEMPTS * 2
    assert {r["harness"] for r in rows} == {"json-tools", "react"}
    assert all(r["passed"] and r["class"] is None for r in rows if r["harness"] == "json-tools")
    failed = [r for r in rows if not r["passed"]]
    assert failed and all(r["class"] in CLASSES for r in failed)
    assert set(rows[0]) >= {
        "id",
        "harness",
        "task",
        "family",
        "passed",
        "score",
        "class",
        "step",
        "n_steps",
        "termination",
    }
    # one detail file per episode, with every step and the triage verdict
    for r in rows:
        key, ep = read_data_file(out / r["file"])
        assert key == r["file"][:-3] and ep["id"] == r["id"] and len(ep["steps"]) == r["n_steps"]
        assert all(s["n_completion_tokens"] > 0 for s in ep["steps"])  # counted in SQLite, no token ids read
        if r["class"]:
            assert ep["verdict"]["class"] == r["class"] and ep["verdict"]["step"] == r["step"]
            assert r["class"] in (out / r["file"]).read_text()
        else:
            assert ep["verdict"] is None
    # prompts are stored as deltas: a later step only carries its new messages
    two = next(r for r in rows if r["n_steps"] >= 2)
    _, ep = read_data_file(out / two["file"])
    assert ep["steps"][1]["prompt_prefix"] > 0 and ep["steps"][1]["n_messages"] == ep["steps"][1][
        "prompt_prefix"
    ] + len(ep["steps"][1]["messages"])

    # the viewer summary embedded in the page, and triage.json next to the run
    summary = report_json(report_a)
    assert summary["n_episodes"] == len(rows) and summary["pages"] == ["episodes/index-000" + ".js"]
    assert [c["name"] for c in summary["classes"]] == list(CLASSES)
    triage = json.loads((run_a / "triage.json").read_text())
    assert triage["react"]["n_failed"] == len([r for r in rows if r["harness"] == "react" and not r["passed"]])
    assert "Partial run" not in html


def test_report_is_self_contained(report_a):
    out = report_a.parent
    url = re.compile(r"(https?:)?//[A-Za-z0-9.-]+\.[a-z]{2,}")
    for path in [report_a, out / "viewer.js", out / "report.css", *(out / "episodes").glob("*.js")]:
        text = path.read_text()
        assert not re.search(r"https?://", text), path
        assert not re.search(r'(src|href)="//', text), path
        assert "@import" not in text and "url(" not in text.replace('url("data:', ""), path
    for svg in (out / "plots").glob("*.svg"):
        text = re.sub(r'xmlns(:\w+)?="[^"]*"', "", svg.read_text())
        assert not url.search(text), svg
    # the page only references files inside the report folder
    for ref in re.findall(r'(?:src|href)="([^"#][^"]*)"', report_a.read_text()):
        assert ref.startswith("data:") or (out / ref).is_file(), ref


def test_rebuild_replaces_the_report_and_refuses_foreign_folders(run_a, tmp_path):
    out = tmp_path / "rep"
    build_report([run_a], out)
    stale = out / "episodes" / "ep-stale.js"
    stale.write_text("x")
    build_report([run_a], out)
    assert not stale.exists() and (out / "index.html").is_file()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ReportError, match="refusing to overwrite"):
        build_report([run_a], foreign)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_default_out_dir_is_inside_the_first_run(tmp_path):
    run = make_synthetic_run(tmp_path / "run", 3)
    index = build_report([run])
    assert index == run / "report" / "index.html" and index.is_file()


def test_serve_serves_the_report_over_http(report_a):
    server, url = serve(report_a.parent)
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/index.html")
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200 and b"episode-list" in r.read()
        base = url.rsplit("/", 1)[0]
        with urllib.request.urlopen(base + "/episodes/index-000.js", timeout=5) as r:
            assert r.read().startswith(b"window.__hr_data(")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ReportError, match="no index.html"):
        serve(report_a.parent / "plots")


# -- comparison ---------------------------------------------------------------------------------------


def test_comparison_report_has_paired_differences_and_a_sentence(run_a, run_b, tmp_path):
    index = build_report([run_a, run_b], tmp_path / "cmp")
    html = index.read_text()
    # json-tools passed everything in A and nothing in B; react the other way round
    assert (
        f"On {N_TASKS} shared tasks, json-tools got worse by -1.00 (95% CI -1.00 to -1.00); "
        "react improved by +1.00 (95% CI +1.00 to +1.00)." in html
    )
    assert ET.parse(tmp_path / "cmp" / "plots" / "paired.svg").getroot().tag.endswith("svg")
    assert {p.name for p in (tmp_path / "cmp" / "plots").glob("*.svg")} >= {
        "paired.svg",
        "mean_score-A.svg",
        "mean_score-B.svg",
    }
    rows = _episodes(tmp_path / "cmp")
    assert {r["run"] for r in rows} == {"A", "B"} and len(rows) == 2 * N_TASKS * ATTEMPTS * 2
    assert len({r["file"] for r in rows}) == len(rows)  # same episode ids in both runs, separate files
    assert all((tmp_path / "cmp" / r["file"]).is_file() for r in rows)
    assert (run_b / "triage.json").is_file()


def test_change_sentence_wording():
    from harnessrl.report import change_sentence

    rows = [
        {"label": "json-tools", "n_tasks": 48, "mean_difference": 0.12, "ci95": [0.05, 0.19]},
        {"label": "react", "n_tasks": 48, "mean_difference": 0.01, "ci95": [-0.03, 0.05]},
    ]
    assert change_sentence(rows) == (
        "On 48 shared tasks, json-tools improved by +0.12 (95% CI +0.05 to +0.19); "
        "react changed by +0.01 (95% CI -0.03 to +0.05; within noise)."
    )
    rows[1]["n_tasks"] = 40
    assert change_sentence(rows).startswith("Json-tools improved by +0.12 on 48 shared tasks")


def test_comparison_needs_shared_tasks(run_a, tmp_path):
    other = make_synthetic_run(tmp_path / "other", 3, harnesses=("json-tools",))
    with pytest.raises(ReportError, match="share no task"):
        build_report([run_a, other], tmp_path / "cmp")


# -- bad input -------------------------------------------------------------------------------------------


def test_not_a_run_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match=r"is not a run folder \(no run.db\)"):
        build_report([tmp_path])
    assert not (tmp_path / "run.db").exists()  # looking must not create a database
    with pytest.raises(ReportError, match="is not a run folder"):
        build_report([tmp_path / "missing"])
    with pytest.raises(ReportError, match="one run folder, or two"):
        build_report([])
    with pytest.raises(ReportError, match="one run folder, or two"):
        build_report([tmp_path] * 3)


def test_partial_run_gives_a_partial_report(tmp_path):
    run = make_synthetic_run(
        tmp_path / "run", 10, harnesses=("alpha", "beta"), attempts=2, limit=13
    )  # killed after 13 of 40
    index = build_report([run])
    html = index.read_text()
    assert "Partial run: 13 of 40 planned episodes found" in html
    assert "no summary.json" in html
    assert len(_episodes(index.parent)) == 13
    # a task with one attempt of two cannot give pass@2: the table says why instead of guessing
    assert "fewer than 2 valid attempts" in html


def test_run_without_episodes_yet(tmp_path):
    run = make_synthetic_run(tmp_path / "run", 4, limit=0)
    html = build_report([run]).read_text()
    assert "Partial run: 0 of 8 planned episodes found" in html
    assert report_json(run / "report" / "index.html")["pages"] == []


def test_huge_outputs_are_truncated_for_display(tmp_path):
    run = tmp_path / "run"
    with RunStore(run) as store:
        store.set_meta("config", run_config(["synth/dev/00000", "synth/dev/00001"], {"alpha": {}}, 1, suite="synth"))
        store.add(synthetic_trajectory(0, "alpha", 0, "malformed", huge=200_000))
        store.add(synthetic_trajectory(1, "alpha", 0, "blocked", huge=50_000))
    index = build_report([run])
    for name in ("ep-alpha-00000-0.js", "ep-alpha-00001-0.js"):
        path = index.parent / "episodes" / name
        assert path.stat().st_size < 40_000
        _, ep = read_data_file(path)
        text = ep["steps"][0]["completion"] + (ep["steps"][0]["tool_results"] or [{"output": ""}])[0]["output"]
        assert re.search(r"\[truncated, (200010|50025) chars; full text in the run database\]", text)
    assert "x" * 200_000 in next(RunStore(run).trajectories()).steps[0].model_call.text  # the database keeps it whole


# -- large runs -------------------------------------------------------------------------------------------


def test_episode_index_is_paged(tmp_path):
    n_tasks = 700  # 1,400 episodes: 3 pages of 500
    index = build_report([make_synthetic_run(tmp_path / "run", n_tasks)])
    pages = sorted((index.parent / "episodes").glob("index-*.js"))
    assert len(pages) == math.ceil(2 * n_tasks / PAGE_SIZE) == 3
    sizes = [len(read_data_file(p)[1]["episodes"]) for p in pages]
    assert sizes == [500, 500, 400]
    assert len(list((index.parent / "episodes").glob("ep-*.js"))) == 2 * n_tasks
    # nothing about episodes is inlined into the page: it stays small however large the run
    assert index.stat().st_size < 40_000


@pytest.mark.slow
def test_ten_thousand_episode_report(tmp_path):
    t0 = time.monotonic()
    run = make_synthetic_run(tmp_path / "run", 5000)
    t1 = time.monotonic()
    index = build_report([run])
    t2 = time.monotonic()
    pages = list((index.parent / "episodes").glob("index-*.js"))
    assert len(pages) == math.ceil(10_000 / PAGE_SIZE) == 20
    assert report_json(index)["n_episodes"] == 10_000
    assert index.stat().st_size < 40_000
    print(f"10k episodes: run written in {t1 - t0:.1f} s, report built in {t2 - t1:.1f} s")
