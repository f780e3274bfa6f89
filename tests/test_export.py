"""`harnessrl export`: a real run exported as Inspect AI eval logs (read back by Inspect's own
`inspect log dump` and `inspect view`) and as Harbor ATIF trajectories (checked by Harbor's own
validator, and against a JSON schema of ATIF v1.4 and the rules the format states besides), a
crashed episode kept as an error, and bad input refused with a clear message."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from helpers import oracle_policy, replies_policy
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.export import ExportError, export_inspect
from harnessrl.harness.registry import load_harness
from harnessrl.metrics import harness_summary
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job, Runner
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.types import Trajectory

cli = CliRunner()
N_TASKS = 3
ATTEMPTS = 2
GOOD, BAD = "json-tools", "react"
# react replies: prose (malformed), a call with a missing argument (blocked), then a wrong submit
BAD_REPLIES = [
    "I think it is 4",
    'Action: add\nAction Input: {"a": 1}',
    'Action: submit\nAction Input: {"answer": "3"}',
]
INSPECT = Path(sys.executable).parent / "inspect"


def _needs_inspect() -> None:
    pytest.importorskip("inspect_ai", reason="inspect_ai is not installed (pip install 'harnessrl[export]')")
    if not INSPECT.is_file():
        pytest.skip(f"no `inspect` command beside {sys.executable}")


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer) -> Path:
    """A real run through the Runner: GOOD plays the oracle (passes), BAD fails in scripted ways,
    and BAD's first episode of the first task crashes its model backend (an infrastructure error)."""
    folder = tmp_path_factory.mktemp("export") / "run"
    tasks = get_suite("toolcalc").tasks("dev", N_TASKS)
    specs = {name: load_harness(name) for name in (GOOD, BAD)}
    crash = tasks[0].instruction
    failing = replies_policy(BAD_REPLIES, tokenizer)

    def bad(messages):
        if any(m.role == "user" and m.content == crash for m in messages) and not crashed:
            crashed.append(True)
            raise RuntimeError("model backend down")
        return failing.script(messages)

    crashed: list[bool] = []
    with RunStore(folder) as store:
        store.set_meta(
            "config",
            {
                "harnessrl_version": "0.1.0",
                "suite": "toolcalc",
                "split": "dev",
                "model": "scripted",
                "seed": 0,
                "task_ids": [t.id for t in tasks],
                "attempts": ATTEMPTS,
                "sampling": SamplingParams().model_dump(),
                "harnesses": {n: s.to_dict() for n, s in specs.items()},
            },
        )
        for a in range(ATTEMPTS):
            for name, spec in specs.items():
                policy = (
                    oracle_policy(tasks, spec, tokenizer)
                    if name == GOOD
                    else ScriptedPolicy(bad, tokenizer=tokenizer, name="bad")
                )
                Runner(policy, SamplingParams(), progress=False, on_episode=store.add, max_retries=0).run(
                    [Job(t, spec, a) for t in tasks]
                )
    return folder


def stored(run: Path) -> list[Trajectory]:
    with RunStore(run) as store:
        return list(store.trajectories())


def test_the_run_has_what_the_exports_must_show(run):
    trajs = stored(run)
    assert len(trajs) == 2 * N_TASKS * ATTEMPTS
    crashed = [t for t in trajs if t.is_infra_error]
    assert len(crashed) == 1 and crashed[0].harness == BAD and "model backend down" in crashed[0].infra_error
    assert all(t.grade is not None and t.grade.passed for t in trajs if t.harness == GOOD)


# -- Inspect AI --------------------------------------------------------------------------------------


def _dump(path: Path) -> dict:
    r = subprocess.run([str(INSPECT), "log", "dump", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_inspect_logs_read_back_by_inspect_log_dump(run, tmp_path):
    _needs_inspect()
    out = tmp_path / "logs"
    r = cli.invoke(app, ["export", str(run), "--format", "inspect", "--out", str(out)])
    assert r.exit_code == 0, r.output
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".eval", ".eval"]
    by_harness = {}
    for f in files:
        log = _dump(f)
        by_harness[log["eval"]["metadata"]["harness"]] = log
    assert set(by_harness) == {GOOD, BAD}
    trajs = stored(run)
    for harness, log in by_harness.items():
        mine = {(t.task_id, t.attempt + 1): t for t in trajs if t.harness == harness}
        assert log["status"] == "success" and log["eval"]["model"] == "scripted"
        assert log["eval"]["task"] == f"toolcalc/{harness}" and log["eval"]["config"]["epochs"] == ATTEMPTS
        samples = {(s["id"], s["epoch"]): s for s in log["samples"]}
        assert set(samples) == set(mine)
        for key, s in samples.items():
            t = mine[key]
            meta = s["metadata"]
            assert s["input"] == t.instruction
            assert (meta["harness"], meta["attempt"], meta["episode_id"]) == (harness, t.attempt, t.episode_id)
            assert (meta["prompt_tokens"], meta["completion_tokens"]) == (t.prompt_tokens, t.completion_tokens)
            assert s["model_usage"]["scripted"]["input_tokens"] == t.prompt_tokens
            if t.is_infra_error:  # kept, marked as an error, no score
                assert "model backend down" in s["error"]["message"] and not s.get("scores")
                continue
            assert s.get("error") is None
            assert s["scores"]["grade"]["value"] == pytest.approx(t.grade.score)
            assert s["scores"]["grade"]["metadata"]["passed"] == t.grade.passed
            assert (meta["triage"] is None) == t.grade.passed
            # the turns: one assistant message per model call, in order, each call answered by a tool message
            assistant = [m for m in s["messages"] if m["role"] == "assistant" and m.get("source") == "generate"]
            assert [m["content"] for m in assistant] == [st.model_call.text for st in t.steps]
            calls = [c for m in assistant for c in (m.get("tool_calls") or [])]
            assert [c["function"] for c in calls] == [c.name for st in t.steps for c in st.tool_calls]
            answered = {m["tool_call_id"] for m in s["messages"] if m["role"] == "tool" and m.get("tool_call_id")}
            n_results = sum(len(st.tool_results) for st in t.steps)
            assert len(answered) == n_results and answered <= {c["id"] for c in calls}
            assert s["messages"][0]["role"] == "system" and any(
                m["role"] == "user" and m["content"] == t.instruction for m in s["messages"]
            )
        expected = harness_summary([t for t in trajs if t.harness == harness], ATTEMPTS)
        (score,) = log["results"]["scores"]
        assert score["metrics"]["mean"]["value"] == pytest.approx(expected.mean_score)
        at_k = expected.pass_at_k[str(ATTEMPTS)]
        if at_k is None:  # refused (a task with fewer valid attempts: BAD's crash): not a metric of the log
            assert harness == BAD and f"pass@{ATTEMPTS}" not in score["metrics"]
            assert score["metadata"]["k_notes"] == expected.k_notes
        else:
            assert score["metrics"][f"pass@{ATTEMPTS}"]["value"] == pytest.approx(at_k)
    good, bad = by_harness[GOOD], by_harness[BAD]
    assert good["results"]["scores"][0]["metrics"]["mean"]["value"] == 1.0
    assert bad["results"]["completed_samples"] == N_TASKS * ATTEMPTS - 1
    labels = {s["metadata"]["triage"]["label"] for s in bad["samples"] if s["metadata"]["triage"]}
    assert "infra" in labels and labels - {"infra"}  # the crash, and the scripted failures' own labels
    # the call with a missing argument: refused as invalid arguments, an Inspect "parsing" tool error
    refused = [m for s in bad["samples"] for m in s["messages"] if m["role"] == "tool" and m.get("error")]
    assert refused and all(m["error"]["type"] == "parsing" and m["metadata"]["ok"] is False for m in refused)


def test_inspect_json_log_format_and_read_eval_log(run, tmp_path):
    _needs_inspect()
    from inspect_ai.log import read_eval_log

    files = export_inspect(run, tmp_path / "logs", log_format="json")
    assert sorted(f.suffix for f in files) == [".json", ".json"]
    for f in files:
        log = read_eval_log(str(f))
        assert log.samples is not None and len(log.samples) == N_TASKS * ATTEMPTS
        assert {s.epoch for s in log.samples} == set(range(1, ATTEMPTS + 1))
    with pytest.raises(ExportError, match="unknown Inspect log format 'yaml'"):
        export_inspect(run, tmp_path / "other", log_format="yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.loads(reply.read())


def test_inspect_view_lists_and_opens_the_logs(run, tmp_path):
    _needs_inspect()
    out = tmp_path / "logs"
    files = export_inspect(run, out)
    port = _free_port()
    base = f"http://127.0.0.1:{port}/api"
    server = subprocess.Popen(
        [str(INSPECT), "view", "--log-dir", str(out), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        listing = None
        deadline = time.monotonic() + 60
        while listing is None:
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            try:
                listing = _get(f"{base}/logs")
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert isinstance(listing, dict)
        names = {Path(urllib.parse.urlparse(f["name"]).path).name: f for f in listing["files"]}
        assert set(names) == {f.name for f in files}
        assert {f["task"] for f in names.values()} == {f"toolcalc/{GOOD}", f"toolcalc/{BAD}"}
        for entry in names.values():
            quoted = urllib.parse.quote(entry["name"], safe="")
            log = _get(f"{base}/logs/{quoted}")
            assert isinstance(log, dict) and len(log["samples"]) == N_TASKS * ATTEMPTS
            (header,) = _get(f"{base}/log-headers?file={quoted}")  # type: ignore[misc]
            assert header["eval"]["task"] == entry["task"] and header["results"]["scores"][0]["name"] == "grade"
    finally:
        server.terminate()
        server.wait(timeout=30)


CHROMIUM = "/usr/bin/chromium"


def test_inspect_view_shows_the_logs_in_a_browser(run, tmp_path):
    """Inspect's own web viewer (headless Chromium) opens each log: its task, the metrics, the
    samples, and the crashed episode among the errors."""
    _needs_inspect()
    if not Path(CHROMIUM).is_file():
        pytest.skip("chromium not installed: apt-get install chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install playwright")
    out = tmp_path / "logs"
    files = {f.name: f for f in export_inspect(run, out)}
    port = _free_port()
    server = subprocess.Popen(
        [str(INSPECT), "view", "--log-dir", str(out), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tasks = get_suite("toolcalc").tasks("dev", N_TASKS)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/api/logs")
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.5)
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1200})
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                for name in files:
                    harness = GOOD if name.endswith(f"_{GOOD}.eval") else BAD
                    page.goto(f"http://127.0.0.1:{port}/#/tasks/{name}")
                    # this log's own task name and its last sample: the previous log (the same
                    # tasks) may still be on the page while this one loads
                    # (and no longer loading: the viewer may show the log's name and samples from
                    # its listing before it opens the log itself, "Loading log...")
                    page.wait_for_function(
                        "([a, b]) => {const t = document.body.innerText;"
                        " return t.includes(a) && t.includes(b) && t.includes('grade') && !t.includes('Loading log');}",
                        arg=[f"toolcalc/{harness}", tasks[-1].instruction],
                        timeout=30_000,
                    )
                    text = page.inner_text("body")
                    assert f"toolcalc/{harness}" in text and "grade" in text and "scripted" in text
                    assert all(t.instruction in text for t in tasks)
                    assert ("model backend down" in text) == (harness == BAD)
                assert errors == []
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_inspect_without_the_package_names_the_extra(run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "inspect_ai", None)  # `import inspect_ai` now raises ImportError
    with pytest.raises(ExportError, match=r"pip install 'harnessrl\[export\]'"):
        export_inspect(run, tmp_path / "logs")
    r = cli.invoke(app, ["export", str(run), "--format", "inspect", "--out", str(tmp_path / "logs")])
    assert r.exit_code == 2 and "harnessrl[export]" in r.output
    assert not (tmp_path / "logs").exists()


# -- ATIF ---------------------------------------------------------------------------------------------

_OBJ = {"type": "object"}
_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}
_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
# ATIF v1.4 as its specification lays it out: required and optional fields of each object, their
# types, the step sources, and the fields that only an agent step may carry.
ATIF_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema_version", "session_id", "agent", "steps"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"type": "string", "pattern": r"^ATIF-v1\.[0-9]+$"},
        "session_id": _STR,
        "agent": {
            "type": "object",
            "required": ["name", "version"],
            "additionalProperties": False,
            "properties": {"name": _STR, "version": _STR, "model_name": _STR, "extra": _OBJ},
        },
        "steps": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/step"}},
        "notes": _STR,
        "final_metrics": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "total_prompt_tokens": _INT,
                "total_completion_tokens": _INT,
                "total_cached_tokens": _INT,
                "total_cost_usd": {"type": "number"},
                "total_steps": _INT,
                "extra": _OBJ,
            },
        },
        "extra": _OBJ,
    },
    "$defs": {
        "step": {
            "type": "object",
            "required": ["step_id", "source", "message"],
            "additionalProperties": False,
            "properties": {
                "step_id": {"type": "integer", "minimum": 1},
                "timestamp": {"type": "string", "format": "date-time"},
                "source": {"enum": ["system", "user", "agent"]},
                "model_name": _STR,
                "reasoning_effort": {"type": ["string", "number"]},
                "message": _STR,
                "reasoning_content": _STR,
                "tool_calls": {"type": "array", "items": {"$ref": "#/$defs/tool_call"}},
                "observation": {"$ref": "#/$defs/observation"},
                "metrics": {"$ref": "#/$defs/metrics"},
                "extra": _OBJ,
            },
            "if": {"properties": {"source": {"enum": ["system", "user"]}}},
            "then": {"not": {"anyOf": [{"required": [f]} for f in _AGENT_ONLY]}},
        },
        "tool_call": {
            "type": "object",
            "required": ["tool_call_id", "function_name", "arguments"],
            "additionalProperties": False,
            "properties": {"tool_call_id": _STR, "function_name": _STR, "arguments": _OBJ},
        },
        "observation": {
            "type": "object",
            "required": ["results"],
            "additionalProperties": False,
            "properties": {
                "results": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "source_call_id": {"type": ["string", "null"]},
                            "content": {"type": ["string", "null"]},
                            "subagent_trajectory_ref": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["session_id"],
                                    "additionalProperties": False,
                                    "properties": {"session_id": _STR, "trajectory_path": _STR, "extra": _OBJ},
                                },
                            },
                        },
                    },
                }
            },
        },
        "metrics": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "prompt_tokens": _INT,
                "completion_tokens": _INT,
                "cached_tokens": _INT,
                "cost_usd": {"type": "number"},
                "prompt_token_ids": {"type": "array", "items": {"type": "integer"}},
                "completion_token_ids": {"type": "array", "items": {"type": "integer"}},
                "logprobs": {"type": "array", "items": {"type": "number"}},
                "extra": _OBJ,
            },
        },
    },
}


def atif_errors(doc: dict) -> list[str]:
    """Every way `doc` breaks ATIF: the schema, then the rules it states in words (step ids count
    from 1 in order; an observation answers a tool call of its own step; token ids and logprobs
    of a step align; the totals are the sums of the steps)."""
    import jsonschema

    errors = [e.message for e in jsonschema.Draft202012Validator(ATIF_SCHEMA).iter_errors(doc)]
    if errors:
        return errors
    steps = doc["steps"]
    if [s["step_id"] for s in steps] != list(range(1, len(steps) + 1)):
        errors.append("step ids are not 1, 2, 3, ...")
    for s in steps:
        ids = {c["tool_call_id"] for c in s.get("tool_calls", [])}
        for r in s.get("observation", {}).get("results", []):
            if r.get("source_call_id") is not None and r["source_call_id"] not in ids:
                errors.append(f"step {s['step_id']}: result for unknown call {r['source_call_id']}")
        m = s.get("metrics", {})
        if "completion_token_ids" in m and "logprobs" in m and len(m["completion_token_ids"]) != len(m["logprobs"]):
            errors.append(f"step {s['step_id']}: completion token ids and logprobs differ in length")
        if "completion_token_ids" in m and len(m["completion_token_ids"]) != m.get("completion_tokens"):
            errors.append(f"step {s['step_id']}: completion_tokens is not the number of completion token ids")
    totals = doc.get("final_metrics", {})
    for total, field in (("total_prompt_tokens", "prompt_tokens"), ("total_completion_tokens", "completion_tokens")):
        summed = sum(s.get("metrics", {}).get(field, 0) for s in steps)
        if total in totals and totals[total] != summed:
            errors.append(f"{total} {totals[total]} is not the sum of the steps' {field} ({summed})")
    return errors


def test_atif_one_valid_file_per_episode(run, tmp_path):
    out = tmp_path / "atif"
    r = cli.invoke(app, ["export", str(run), "--format", "atif", "--out", str(out)])
    assert r.exit_code == 0, r.output
    trajs = {t.episode_id: t for t in stored(run)}
    files = sorted(out.rglob("*.json"))
    assert len(files) == len(trajs)
    seen = set()
    for f in files:
        doc = json.loads(f.read_text())
        assert atif_errors(doc) == [], f
        t = trajs[doc["session_id"]]
        seen.add(t.episode_id)
        assert f.parent.name == t.harness and doc["agent"]["name"] == t.harness
        assert doc["agent"]["model_name"] == "scripted"
        extra = doc["extra"]
        assert (extra["harness"], extra["attempt"], extra["task_id"]) == (t.harness, t.attempt, t.task_id)
        agent = [s for s in doc["steps"] if s["source"] == "agent"]
        assert [s["message"] for s in agent] == [st.model_call.text for st in t.steps]
        assert [s["metrics"]["completion_token_ids"] for s in agent] == [st.model_call.completion_ids for st in t.steps]
        user = [s["message"] for s in doc["steps"] if s["source"] == "user"]
        assert t.instruction in user
        if t.is_infra_error:
            assert "model backend down" in extra["infra_error"] and "infrastructure error" in doc["notes"]
            assert extra["reward"] is None and agent == []
        else:
            assert extra["reward"] == pytest.approx(t.grade.score if t.grade else 0.0)
    assert seen == set(trajs)


def _acting(doc: dict) -> dict:
    """The first agent step with a tool result."""
    return next(s for s in doc["steps"] if s["source"] == "agent" and s.get("observation"))


def test_atif_check_rejects_what_breaks_the_format(run, tmp_path):
    from harnessrl.export import atif_trajectory

    t = next(t for t in stored(run) if t.harness == GOOD)
    good = atif_trajectory(t, {"model": "scripted"}, "run")
    assert atif_errors(good) == []
    broken = []
    for edit in (
        lambda d: d["steps"].pop(0),  # ids no longer start at 1
        lambda d: d["steps"][0].update(source="assistant"),
        lambda d: d["steps"][0].update(tool_calls=[]),  # an agent-only field on a system step
        lambda d: d.pop("agent"),
        lambda d: _acting(d)["observation"]["results"][0].update(source_call_id="nope"),
        lambda d: _acting(d)["metrics"]["logprobs"].append(-1.0),
        lambda d: d["final_metrics"].update(total_completion_tokens=-1),
    ):
        doc = copy.deepcopy(good)
        edit(doc)
        broken.append(bool(atif_errors(doc)))
    assert all(broken)
    no_tokens = atif_trajectory(t, {"model": "scripted"}, "run", tokens=False)
    assert atif_errors(no_tokens) == [] and "completion_token_ids" not in json.dumps(no_tokens)


HARBOR_FOLDER = Path(__file__).resolve().parents[1] / ".venv" / "harbor-validator"  # make install puts it there


def _harbor_validator():
    """Harbor's own ATIF validator (harbor.utils.trajectory_validator, from the `harbor` package that
    `make install` puts in .venv/harbor-validator without its dependencies: the validator needs
    only pydantic), or a skip."""
    if HARBOR_FOLDER.is_dir() and str(HARBOR_FOLDER) not in sys.path:
        sys.path.append(str(HARBOR_FOLDER))
    try:
        from harbor.utils.trajectory_validator import TrajectoryValidator
    except ImportError as e:  # pragma: no cover - depends on the machine
        pytest.skip(
            f"Harbor's validator is not installed ({e}); make install puts it in {HARBOR_FOLDER} "
            "(pip install --no-deps --ignore-requires-python --target FOLDER harbor==0.26.0)"
        )
    return TrajectoryValidator


def test_atif_passes_harbors_own_validator(run, tmp_path):
    validator = _harbor_validator()
    out = tmp_path / "atif"
    r = cli.invoke(app, ["export", str(run), "--format", "atif", "--out", str(out)])
    assert r.exit_code == 0, r.output
    files = sorted(out.rglob("*.json"))
    assert len(files) == len(stored(run))
    for f in files:  # the crashed episode's file too
        check = validator()
        assert check.validate(f), (f, check.get_errors())
    # and the validator does refuse what breaks the format: step ids that do not count from 1
    doc = json.loads(files[0].read_text())
    doc["steps"][0]["step_id"] = 7
    check = validator()
    assert not check.validate(doc) and check.get_errors()


# -- jsonl and bad input -------------------------------------------------------------------------------


def test_jsonl_to_stdout_and_to_a_file(run, tmp_path):
    r = cli.invoke(app, ["export", str(run)])
    assert r.exit_code == 0, r.output
    lines = [Trajectory.model_validate_json(x) for x in r.output.splitlines() if x.strip()]
    assert lines == stored(run)
    path = tmp_path / "episodes.jsonl"
    r = cli.invoke(app, ["export", str(run), "--format", "jsonl", "--out", str(path), "--no-tokens"])
    assert r.exit_code == 0, r.output
    back = [Trajectory.model_validate_json(x) for x in path.read_text().splitlines()]
    assert [t.episode_id for t in back] == [t.episode_id for t in lines]
    assert all(not s.model_call.completion_ids for t in back for s in t.steps)


def test_bad_input_is_refused_with_a_clear_message(run, tmp_path):
    def refused(args: list[str], words: str) -> None:
        r = cli.invoke(app, ["export", *args])
        assert r.exit_code == 2 and words in " ".join(r.output.split()), r.output

    refused(
        [str(run), "--format", "parquet"], "unknown export format 'parquet' (available: jsonl, inspect, atif, openenv)"
    )
    refused([str(tmp_path / "nowhere"), "--format", "atif", "--out", str(tmp_path / "a")], "does not exist")
    (tmp_path / "empty").mkdir()
    refused([str(tmp_path / "empty"), "--format", "atif", "--out", str(tmp_path / "a")], "is not a run folder")
    refused([str(tmp_path / "empty"), "--out", str(tmp_path / "x.jsonl")], "is not a run folder")
    assert not (tmp_path / "x.jsonl").exists()
    refused([str(run), "--format", "atif"], "give a folder with --out")
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.json").write_text("{}")
    refused([str(run), "--format", "atif", "--out", str(full)], "is not empty")
    refused([str(run), "--format", "atif", "--out", str(full / "old.json")], "is a file")
