"""OpenEnv capture traces both ways (harnessrl.integrations.openenv, docs/openenv.md).

openenv -> harnessrl: OpenEnv's own capture proxy (its `create_app`, in front of a fake engine
that answers like vLLM with token ids and log-probs) records two agent sessions, one over the
OpenAI chat dialect and one over Anthropic Messages; every shape OpenEnv hands out (the rollout
document, the trace entries, a TrainingTrace, a Harbor rollout result with a reward) is read into
a run folder, and `harnessrl triage`, `report`, `export` and `compare` work on it.

harnessrl -> openenv: a harnessrl run exported with `--format openenv` is read back by OpenEnv's
own `TrainingTrace.from_entries` and by the functions TRL's HarnessRolloutWorker reads a loop-
owning session's trace with (`_turns_from_training_trace`, `_messages_from_trace`,
`_tool_call_counts_by_name`, and `_chain_to_sequences`, which builds its training rows).

openenv 0.10.0 cannot live in the test environment: through fastmcp it needs mcp<2, and the test
extra pins mcp==2.3.0. So its side runs in its own interpreter (OPENENV_PYTHON), and those tests
skip, saying how to make it, where it is missing. Hostile-trace tests need no openenv.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

import pytest
from helpers import oracle_policy, replies_policy
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.harness.registry import load_harness
from harnessrl.integrations.openenv import TraceError, TraceLimits, read_traces
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Job, Runner
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.types import Trajectory

cli = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
OPENENV_PYTHON = Path(os.environ.get("HARNESSRL_OPENENV_PYTHON") or ROOT / ".cache" / "venv-openenv" / "bin" / "python")
INSTALL = (
    "python3.11 -m venv .cache/venv-openenv && .cache/venv-openenv/bin/pip install openenv==0.10.0 "
    "(and, for the TRL checks, a .pth file in its site-packages naming .venv's site-packages, so trl==1.16.0 "
    "imports there after openenv's own dependencies)"
)
SHAPES = ("rollout", "entries", "training", "harbor")

# -- the openenv side (runs in OPENENV_PYTHON) -------------------------------------------------------

CAPTURE = r"""
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fastapi.testclient import TestClient
from openenv.core.harness.capture import to_training_trace
from openenv.core.harness.capture.server import create_app
from openenv.harbor.models import HarborRolloutResult, turns_from_document

ROLE = {"system": 10, "user": 11, "assistant": 12, "tool": 13}
END = 2

def text_of(content):
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""

def body_ids(m):
    ids = [20 + b % 200 for b in text_of(m.get("content")).encode()]
    for c in m.get("tool_calls") or []:
        args = c["function"]["arguments"]
        args = args if isinstance(args, str) else json.dumps(args)
        ids += [20 + b % 200 for b in (c["function"]["name"] + args).encode()]
    return ids

def render(messages):  # the fake engine's chat template: prompt k+1 extends prompt k + completion k
    ids = []
    for m in messages:
        ids += [ROLE[m["role"]], *body_ids(m), END]
    return ids + [ROLE["assistant"]]

class Engine(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = req["messages"]
        if msgs[-1]["role"] == "user" and req.get("tools"):
            call = {"id": "call_1", "type": "function",
                    "function": {"name": req["tools"][0]["function"]["name"], "arguments": '{"a": 2, "b": 3}'}}
            reply, finish = {"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls"
        else:
            reply, finish = {"role": "assistant", "content": "The answer is 5."}, "stop"
        prompt, completion = render(msgs), body_ids(reply) + [END]
        lps = [-0.25 - 0.01 * i for i in range(len(completion))]
        content = [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                   for t, lp in zip(completion, lps)]
        out = {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": req["model"],
               "prompt_token_ids": prompt,
               "choices": [{"index": 0, "message": reply, "finish_reason": finish, "token_ids": completion,
                            "logprobs": {"content": content}}],
               "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)}}
        if not req.get("return_token_ids"):  # a hosted model: text only, unless the proxy asks for tokens
            del out["prompt_token_ids"], out["choices"][0]["token_ids"], out["choices"][0]["logprobs"]
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
TOOL = {"type": "function", "function": {"name": "add", "description": "add two numbers", "parameters": SCHEMA}}

def openai_agent(client, sid):
    h = {"Authorization": f"Bearer {sid}"}
    msgs = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2 + 3?"}]
    r = client.post("/v1/chat/completions", headers=h, json={"model": "agent-model", "messages": msgs, "tools": [TOOL]})
    r.raise_for_status()
    reply = r.json()["choices"][0]["message"]
    msgs += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "5"}]
    body = {"model": "agent-model", "messages": msgs, "tools": [TOOL]}
    client.post("/v1/chat/completions", headers=h, json=body).raise_for_status()

def anthropic_agent(client, sid):
    h = {"x-api-key": sid, "anthropic-version": "2023-06-01"}
    tools = [{"name": "add", "description": "add two numbers", "input_schema": SCHEMA}]
    body = {"model": "agent-model", "max_tokens": 64, "system": "You add numbers.", "tools": tools,
            "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    r = client.post("/v1/messages", headers=h, json=body)
    r.raise_for_status()
    blocks = r.json()["content"]
    use = next(b for b in blocks if b["type"] == "tool_use")
    body["messages"] += [{"role": "assistant", "content": blocks},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                       "content": "5"}]}]
    client.post("/v1/messages", headers=h, json=body).raise_for_status()

def responses_agent(client, sid):
    h = {"Authorization": f"Bearer {sid}"}
    tools = [{"type": "function", "name": "add", "description": "add two numbers", "parameters": SCHEMA}]
    items = [{"role": "user", "content": "What is 2 + 3?"}]
    body = {"model": "agent-model", "instructions": "You add numbers.", "input": items, "tools": tools}
    r = client.post("/v1/responses", headers=h, json=body)
    r.raise_for_status()
    call = next(o for o in r.json()["output"] if o["type"] == "function_call")
    body["input"] = items + [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "5"}]
    client.post("/v1/responses", headers=h, json=body).raise_for_status()

def gemini_agent(client, sid):
    h, route = {"x-goog-api-key": sid}, "/v1beta/models/agent-model:generateContent"
    decl = {"name": "add", "description": "add two numbers", "parameters": SCHEMA}
    contents = [{"role": "user", "parts": [{"text": "What is 2 + 3?"}]}]
    body = {"contents": contents, "systemInstruction": {"parts": [{"text": "You add numbers."}]},
            "tools": [{"functionDeclarations": [decl]}]}
    r = client.post(route, headers=h, json=body)
    r.raise_for_status()
    parts = r.json()["candidates"][0]["content"]["parts"]
    answer = {"functionResponse": {"name": "add", "response": {"result": 5}}}
    body["contents"] = contents + [{"role": "model", "parts": parts}, {"role": "user", "parts": [answer]}]
    client.post(route, headers=h, json=body).raise_for_status()

AGENTS = (  # name, agent, harness, the environment's reward, the tool result as the model is shown it
    ("chat", openai_agent, "oe-chat", 1.0, "5"),
    ("anthropic", anthropic_agent, "oe-anthropic", 0.0, "5"),
    ("responses", responses_agent, "oe-responses", 1.0, "5"),
    ("gemini", gemini_agent, "oe-gemini", 0.5, '{"result": 5}'),
)
engine = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
threading.Thread(target=engine.serve_forever, daemon=True).start()
app = create_app(llm_url=f"http://127.0.0.1:{engine.server_port}/v1", model="fake/model", capture_level="tokens")
summary = {}
with TestClient(app) as client:
    for name, agent, harness, reward, tool_output in AGENTS:
        meta = {"metadata": {"task_id": "add-2-3", "harness": harness}}
        sid = client.post("/sessions", json=meta).json()["session_id"]
        agent(client, sid)
        doc = client.get(f"/sessions/{sid}/rollout", params={"include_messages": "true"}).json()
        entries = client.get(f"/sessions/{sid}/trace_entries").json()
        training = to_training_trace(app.state.registry.get(sid).graph, doc)
        # the reward is the environment's (a Harbor verifier's); the capture proxy has none
        harbor = HarborRolloutResult(task_id="add-2-3", harness=harness, dataset="arith", session_id=sid,
                                     reward=reward, turns=turns_from_document(doc))
        for shape, text in (("rollout", json.dumps(doc)), ("entries", json.dumps(entries)),
                            ("training", training.model_dump_json()), ("harbor", harbor.model_dump_json())):
            folder = Path(sys.argv[1]) / shape
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{name}.json").write_text(text)
        summary[name] = {"session_id": sid, "harness": harness, "reward": reward, "tool_output": tool_output,
                         "turns": [{"prompt": t.prompt_token_ids, "completion": t.completion_token_ids,
                                    "logprobs": t.per_token_logps} for t in training.turns]}
# an engine that returns no token ids (capture_level "text"): an eval rollout, the text alone
text_app = create_app(llm_url=f"http://127.0.0.1:{engine.server_port}/v1", model="fake/model", capture_level="text")
with TestClient(text_app) as client:
    sid = client.post("/sessions", json={"metadata": {"task_id": "add-2-3"}}).json()["session_id"]
    openai_agent(client, sid)
    doc = client.get(f"/sessions/{sid}/rollout", params={"include_messages": "true"}).json()
    (Path(sys.argv[1]) / "eval").mkdir()
    (Path(sys.argv[1]) / "eval" / "chat.json").write_text(json.dumps(doc))
engine.shutdown()
print(json.dumps(summary))
"""

READ = r"""
import json, sys, threading, types, warnings
from pathlib import Path
from openenv.core.harness import TrainingTrace, VerifyResult

warnings.simplefilter("ignore")
try:
    from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
    from trl.experimental.async_grpo.openenv_harness import (
        _HarnessRolloutLoop, _messages_from_trace, _tool_call_counts_by_name, _turns_from_training_trace)
    trl_error = None
except Exception as e:
    trl_error = f"{type(e).__name__}: {e}"

class ReplaySession:  # docs/openenv.md: a loop-owning session that hands TRL an exported episode
    def __init__(self, doc):
        self.doc = doc
    def wait_for_completion(self, timeout_s=None):
        return 0
    def fetch_training_trace(self):
        return TrainingTrace.from_entries(self.doc["entries"])
    def verify(self, transcript, final_state=None):
        return VerifyResult(env_reward=self.doc["reward"], done=True)
    def close(self):
        pass

class ReplayFactory:
    def __init__(self, doc):
        self.doc = doc
    def create(self, task, seed=None, episode_id=None):
        return ReplaySession(self.doc)

def worker_rollout(doc):
    # TRL's HarnessRolloutWorker's own per-rollout code (loop-owning mode) on one exported episode;
    # the namespace holds only the worker state that code reads (no vLLM, no CUDA)
    loop = types.SimpleNamespace(
        _factory=ReplayFactory(doc), _live_sessions=set(), _stop_event=threading.Event(), _adapter=None,
        _rollout_reward_fn=None, _fork_threshold_tokens=0, _EMPTY_ROLLOUT=_HarnessRolloutLoop._EMPTY_ROLLOUT)
    result, metrics = _HarnessRolloutLoop._run_session(loop, prompt=[], group_id=0)
    completion, completion_ids, sequences, n_calls, n_failed, reward = result
    return {"completion_ids": completion_ids, "reward": reward, "n_tool_calls": n_calls,
            "sequences": [[len(s.input_ids), sum(s.completion_mask)] for s in sequences],
            "turns": None if metrics is None else metrics["turns"]}
root, files = Path(sys.argv[1]), {}
for path in sorted(root.rglob("*.json")):
    doc = json.loads(path.read_text())
    rec = files[str(path.relative_to(root))] = {"reward": [e.get("reward") for e in doc["entries"]]}
    try:
        trace = TrainingTrace.from_entries(doc["entries"])
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        continue
    trace = TrainingTrace.model_validate_json(trace.model_dump_json())
    rec["turns"] = [{"node_id": t.node_id, "prompt": t.prompt_token_ids, "completion": t.completion_token_ids,
                     "logprobs": t.per_token_logps, "mask": t.loss_mask} for t in trace.turns]
    if trl_error is None:
        turns = _turns_from_training_trace(trace)
        entries = trace.to_trace_entries()
        sequences, tally = _chain_to_sequences(turns, "rollout", 0)
        rec["trl"] = {
            "turns": [[t.prompt_ids, t.output_ids, t.output_log_probs, t.output_mask] for t in turns],
            "messages": _messages_from_trace(entries),
            "tool_calls": _tool_call_counts_by_name(entries),
            "sequences": [[len(s.input_ids), sum(s.completion_mask), len(s.old_log_probs)] for s in sequences],
            "worker": worker_rollout(doc),
        }
print(json.dumps({"trl_error": trl_error, "files": files}))
"""


@cache
def _openenv_problem() -> str | None:
    if not OPENENV_PYTHON.is_file():
        return f"no OpenEnv interpreter at {OPENENV_PYTHON}"
    r = subprocess.run(
        [
            str(OPENENV_PYTHON),
            "-c",
            "import importlib.metadata as m, openenv.core.harness.capture; print(m.version('openenv'))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode != 0:
        return f"{OPENENV_PYTHON} cannot import openenv.core.harness.capture: {r.stderr.strip()[-300:]}"
    if r.stdout.strip() != "0.10.0":
        return f"{OPENENV_PYTHON} has openenv {r.stdout.strip()}, the tests are written against 0.10.0"
    return None


def openenv(script: str, *args: str) -> dict:
    """Run `script` in the OpenEnv interpreter (outside this repository's tree), return its JSON."""
    problem = _openenv_problem()
    if problem:
        pytest.skip(
            f"{problem}. openenv==0.10.0 needs mcp<2 (through fastmcp) and the test environment pins "
            f"mcp==2.3.0, so it lives in its own venv: {INSTALL}; or set HARNESSRL_OPENENV_PYTHON"
        )
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": ""}
    r = subprocess.run(
        [str(OPENENV_PYTHON), "-c", script, *args], capture_output=True, text=True, timeout=240, env=env, cwd="/"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- openenv -> harnessrl ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("captured")
    return out, openenv(CAPTURE, str(out))


def stored(run: Path) -> list[Trajectory]:
    with RunStore(run) as store:
        return list(store.trajectories())


@pytest.mark.parametrize("shape", SHAPES)
def test_openenv_capture_read_into_a_run(captured, shape, tmp_path):
    traces, summary = captured
    run = tmp_path / "run"
    r = cli.invoke(app, ["import-traces", str(traces / shape), "--out", str(run)])
    assert r.exit_code == 0, r.output
    assert f"read {len(summary)} traces" in r.output
    episodes = stored(run)
    by_session = {want["session_id"]: name for name, want in summary.items()}
    # one trace per dialect: OpenAI chat, Anthropic Messages, OpenAI Responses, Gemini
    assert len(episodes) == len(summary) == 4
    for t in episodes:
        meta = t.meta["openenv"]
        # a TrainingTrace names no session: the episode is named by its file
        name = t.task_id if shape == "training" else by_session[meta["session_id"]]
        want = summary[name]
        assert meta["kind"] == {"entries": "trace_entries", "training": "training_trace"}.get(shape, shape)
        # the engine's own token ids and log-probs, call by call, exactly as OpenEnv holds them
        assert [s.model_call.prompt_ids for s in t.steps] == [w["prompt"] for w in want["turns"]]
        assert [s.model_call.completion_ids for s in t.steps] == [w["completion"] for w in want["turns"]]
        assert [s.model_call.logprobs for s in t.steps] == [pytest.approx(w["logprobs"]) for w in want["turns"]]
        first, last = t.steps
        # the request messages and the reply, every dialect's as the proxy recorded it (chat form)
        assert t.instruction == "What is 2 + 3?"
        assert [m.role for m in first.model_call.messages] == ["system", "user"]
        assert first.action.value == "tool_calls" and [c.name for c in first.tool_calls] == ["add"]
        assert first.tool_calls[0].arguments == {"a": 2, "b": 3}
        # the tool result, read from the next call's request
        assert [r.output for r in first.tool_results] == [want["tool_output"]]
        assert last.action.value == "text" and last.model_call.text == "The answer is 5."
        assert last.model_call.messages[-1].role == "tool"
        assert last.model_call.messages[-1].content == want["tool_output"]
        if shape == "harbor":
            assert t.harness == want["harness"] and t.task_id == "add-2-3" and t.suite == "arith"
            assert t.grade is not None and t.grade.score == want["reward"] and t.grade.passed == (want["reward"] == 1.0)
            assert "missing" not in meta
        else:  # the capture proxy sees model calls, not outcomes: no reward, so no grade, and it says so
            assert t.grade is None and meta["missing"] == {"reward": 1}
        if shape == "rollout":  # the session's metadata names the task and the harness
            assert t.harness == want["harness"] and t.task_id == "add-2-3"
            assert meta["capture_level"] == "tokens" and meta["rollout_type"] == "train"


def test_an_eval_rollout_without_token_ids(captured, tmp_path):
    traces, _ = captured
    r = cli.invoke(app, ["import-traces", str(traces / "eval"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "0 with token ids and log-probs on every call" in r.output
    (t,) = stored(tmp_path / "run")
    meta = t.meta["openenv"]
    assert meta["capture_level"] == "text" and meta["rollout_type"] == "eval"
    assert meta["missing"] == {"token ids": 2, "reward": 1}  # what the engine never returned, nothing made up
    assert all(
        (s.model_call.prompt_ids, s.model_call.completion_ids, s.model_call.logprobs) == ([], [], []) for s in t.steps
    )
    assert [s.action.value for s in t.steps] == ["tool_calls", "text"] and t.steps[
        1
    ].model_call.text == "The answer is 5."
    assert [r.output for r in t.steps[0].tool_results] == ["5"]


def test_triage_report_export_compare_on_an_imported_run(captured, tmp_path):
    traces, summary = captured
    run, again = tmp_path / "run", tmp_path / "again"
    for folder in (run, again):
        r = cli.invoke(app, ["import-traces", str(traces / "harbor"), "--out", str(folder)])
        assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["triage", str(run)])
    assert r.exit_code == 0, r.output
    triage = json.loads((run / "triage.json").read_text())
    failed = {h: triage[h]["n_failed"] for h in ("oe-chat", "oe-anthropic", "oe-responses", "oe-gemini")}
    assert failed == {"oe-chat": 0, "oe-anthropic": 1, "oe-responses": 0, "oe-gemini": 1}
    r = cli.invoke(app, ["report", str(run), "--out", str(tmp_path / "report")])
    assert r.exit_code == 0, r.output
    index = (tmp_path / "report" / "index.html").read_text()
    assert all(h in index for h in ("oe-chat", "oe-anthropic", "oe-responses", "oe-gemini"))
    r = cli.invoke(app, ["export", str(run), "--format", "jsonl", "--out", str(tmp_path / "run.jsonl")])
    assert r.exit_code == 0, r.output
    by_harness = {want["harness"]: want for want in summary.values()}
    exported = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert sorted(e["harness"] for e in exported) == sorted(by_harness)
    for e in exported:
        want = by_harness[e["harness"]]
        assert [s["model_call"]["completion_ids"] for s in e["steps"]] == [w["completion"] for w in want["turns"]]
        assert e["grade"]["score"] == want["reward"]
    r = cli.invoke(app, ["compare", str(run), str(again), "--harness", "oe-gemini"])
    assert r.exit_code == 0, r.output
    assert "oe-gemini" in r.output


# -- harnessrl -> openenv ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer) -> Path:
    """A harnessrl run: json-tools solves each task (graded 1.0), react fails in scripted ways,
    its first episode crashes its model backend (an infrastructure error: no reward); the
    log-probs are made distinct so that a misplaced one shows, one call keeps `sampled_logprobs`,
    and one episode is copied under a harness whose calls recorded no token ids."""
    scratch = tmp_path_factory.mktemp("scratch") / "run"
    folder = tmp_path_factory.mktemp("harnessrl") / "run"
    tasks = get_suite("toolcalc").tasks("dev", 2)
    specs = {name: load_harness(name) for name in ("json-tools", "react")}
    failing = replies_policy(
        ['Action: add\nAction Input: {"a": 1}', 'Action: submit\nAction Input: {"answer": "3"}'], tokenizer
    )
    crashed: list[bool] = []

    def bad(messages):
        if not crashed:
            crashed.append(True)
            raise RuntimeError("model backend down")
        return failing.script(messages)

    from harnessrl.models.scripted import ScriptedPolicy

    config = {"suite": "toolcalc", "model": "scripted", "attempts": 1, "sampling": SamplingParams().model_dump()}
    with RunStore(scratch) as store:
        for name, spec in specs.items():
            policy = (
                oracle_policy(tasks, spec, tokenizer)
                if name == "json-tools"
                else ScriptedPolicy(bad, tokenizer=tokenizer, name="bad")
            )
            Runner(policy, SamplingParams(), progress=False, on_episode=store.add, max_retries=0).run(
                [Job(t, spec, 0) for t in tasks]
            )
        episodes = list(store.trajectories())
    n = 0
    with RunStore(folder) as store:
        store.set_meta("config", config)
        for t in episodes:
            for s in t.steps:
                s.model_call.logprobs = [-(n := n + 1) / 1000 for _ in s.model_call.completion_ids]
            store.add(t)
        shaped = episodes[0].model_copy(deep=True)
        shaped.harness, shaped.episode_id = "shaped", "shaped-0"
        shaped.steps[0].model_call.sampled_logprobs = [-5.0] * len(shaped.steps[0].model_call.completion_ids)
        store.add(shaped)
        no_ids = episodes[0].model_copy(deep=True)
        no_ids.harness, no_ids.episode_id = "no-ids", "no-ids-0"
        for s in no_ids.steps:
            s.model_call.n_prompt_tokens, s.model_call.n_completion_tokens = (
                len(s.model_call.prompt_ids),
                len(s.model_call.completion_ids),
            )
            s.model_call.prompt_ids, s.model_call.completion_ids, s.model_call.logprobs = [], [], []
        store.add(no_ids)
    return folder


def test_harnessrl_run_exported_as_traces_is_read_by_openenv_and_trl(run, tmp_path):
    out = tmp_path / "traces"
    r = cli.invoke(app, ["export", str(run), "--format", "openenv", "--out", str(out)])
    assert r.exit_code == 0, r.output
    episodes = {(t.harness, t.task_id): t for t in stored(run)}
    assert (
        f"wrote {len(episodes)} OpenEnv traces" in r.output
        and "1 of them have a model call without token ids" in r.output
    )
    read = openenv(READ, str(out))
    assert len(read["files"]) == len(episodes)
    checked_trl = 0
    for rel, rec in read["files"].items():
        harness, name = rel.split("/")
        t = next(
            t
            for (h, _), t in episodes.items()
            if h == harness and name == f"{t.task_id.replace('/', '_')}.{t.attempt}.json"
        )
        want_reward = None if t.is_infra_error else (t.grade.score if t.grade else 0.0)
        assert rec["reward"] == [want_reward] * len(t.steps)
        if harness == "no-ids":  # written without token fields: OpenEnv refuses it, as it must
            assert "error" in rec and "prompt_token_ids" in rec["error"]
            continue
        assert "error" not in rec, rec.get("error")
        turns = rec["turns"]
        assert len({x["node_id"] for x in turns}) == len(t.steps)
        for s, x in zip(t.steps, turns):
            mc = s.model_call
            assert x["prompt"] == mc.prompt_ids and x["completion"] == mc.completion_ids
            assert x["logprobs"] == (mc.sampled_logprobs if mc.sampled_logprobs is not None else mc.logprobs)
            assert x["mask"] == [0] * len(mc.prompt_ids) + [1] * len(mc.completion_ids)
        if read["trl_error"] is None:
            trl = rec["trl"]
            assert [tr[1] for tr in trl["turns"]] == [s.model_call.completion_ids for s in t.steps]
            assert all(tr[3] == [1] * len(tr[1]) for tr in trl["turns"])
            if t.steps:
                assert trl["messages"][-1] == {"role": "assistant", "content": t.steps[-1].model_call.text}
            else:  # the crashed episode: no call, nothing to train on
                assert trl["messages"] == [] and trl["sequences"] == []
            calls: dict[str, int] = {}
            for s in t.steps:
                for c in s.tool_calls:
                    calls[c.name] = calls.get(c.name, 0) + 1
            assert trl["tool_calls"] == calls
            trained = sum(n for _, n, _ in trl["sequences"])
            assert trained == sum(len(s.model_call.completion_ids) for s in t.steps)
            assert all(length == n_lp for length, _, n_lp in trl["sequences"])
            # the worker's whole rollout: the tokens it trains on and the reward it credits them with
            worker = trl["worker"]
            assert worker["turns"] == len(t.steps) and worker["reward"] == want_reward
            assert worker["completion_ids"] == [i for s in t.steps for i in s.model_call.completion_ids]
            assert worker["n_tool_calls"] == sum(calls.values())
            assert sum(n for _, n in worker["sequences"]) == trained
            checked_trl += 1
    if read["trl_error"] is not None:
        pytest.skip(f"OpenEnv read every trace; TRL's worker functions did not import there: {read['trl_error']}")
    assert checked_trl == len(episodes) - 1


def test_export_then_import_round_trip(run, tmp_path):
    out, back = tmp_path / "traces", tmp_path / "back"
    assert cli.invoke(app, ["export", str(run), "--format", "openenv", "--out", str(out)]).exit_code == 0
    r = cli.invoke(app, ["import-traces", str(out), "--out", str(back)])
    assert r.exit_code == 0, r.output
    before = {t.episode_id: t for t in stored(run)}
    after = stored(back)
    assert len(after) == len(before)
    for t in after:
        orig = before[t.meta["openenv"]["session_id"]]
        assert (t.harness, t.task_id, t.suite) == (orig.harness, orig.task_id, orig.suite)
        for s, o in zip(t.steps, orig.steps, strict=True):
            assert s.model_call.prompt_ids == o.model_call.prompt_ids
            assert s.model_call.completion_ids == o.model_call.completion_ids
            assert s.model_call.text == o.model_call.text
            assert [c.name for c in s.tool_calls] == [c.name for c in o.tool_calls]
        if orig.is_infra_error:  # exported unscored (reward None) with its error: read back as one
            assert t.grade is None and t.is_infra_error and t.infra_error == orig.infra_error
        else:
            assert t.grade is not None and t.grade.score == (orig.grade.score if orig.grade else 0.0)


def test_export_refuses_no_tokens(run, tmp_path):
    r = cli.invoke(app, ["export", str(run), "--format", "openenv", "--no-tokens", "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and "always writes the token ids" in r.output


# -- hostile and malformed traces (no openenv needed) ------------------------------------------------

ENTRY = {
    "request": {"messages": [{"role": "user", "content": "hi"}], "tools": None},
    "response": {"choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]},
    "prompt_token_ids": [1, 2, 3],
    "completion_token_ids": [4, 5],
    "per_token_logps": [-0.5, -0.25],
    "loss_mask": [0, 0, 0, 1, 1],
    "metadata": {"node_id": "n1"},
}


def _write(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _refused(src: Path, tmp_path: Path, match: str, **kw) -> None:
    run = tmp_path / "refused"
    with pytest.raises(TraceError, match=match):
        read_traces(src, run, **kw)
    assert not (run / "run.db").exists()  # nothing written for a refused import


def test_a_hand_written_trace_entry_and_its_reward(tmp_path):
    src = _write(
        tmp_path / "t" / "a.json",
        {"session_id": "s1", "entries": [{**ENTRY, "reward": 0.5}], "metadata": {"task_id": "x"}},
    )
    result = read_traces(src, tmp_path / "run", pass_threshold=0.5)
    assert (result.n_episodes, result.graded, result.with_tokens) == (1, 1, 1)
    (t,) = stored(tmp_path / "run")
    assert t.task_id == "x" and t.grade is not None and t.grade.passed and t.grade.score == 0.5
    assert t.steps[0].model_call.completion_ids == [4, 5] and t.steps[0].model_call.logprobs == [-0.5, -0.25]


def test_missing_fields_stay_missing(tmp_path):
    bare = {
        k: v
        for k, v in ENTRY.items()
        if k not in ("prompt_token_ids", "completion_token_ids", "per_token_logps", "loss_mask")
    }
    src = _write(tmp_path / "t" / "a.json", [bare])  # a bare list of entries, no tokens (a hosted model)
    result = read_traces(src, tmp_path / "run")
    (t,) = stored(tmp_path / "run")
    assert result.with_tokens == 0 and t.grade is None and t.termination is None
    mc = t.steps[0].model_call
    assert (mc.prompt_ids, mc.completion_ids, mc.logprobs) == ([], [], [])
    assert t.meta["openenv"]["missing"] == {"token ids": 1, "reward": 1}


def test_a_reward_outside_0_1_is_kept_not_graded(tmp_path):
    src = _write(tmp_path / "t" / "a.json", {"session_id": "s", "entries": [{**ENTRY, "reward": 3.0}]})
    result = read_traces(src, tmp_path / "run")
    (t,) = stored(tmp_path / "run")
    assert t.grade is None and t.meta["openenv"]["reward"] == 3.0 and "outside [0, 1]" in t.termination_detail
    assert result.notes and "outside [0, 1]" in result.notes[0]


def test_a_harbor_result_not_ok_is_an_infrastructure_error(tmp_path):
    turn = {"turn": 0, "prompt_token_ids": [1, 2], "completion_token_ids": [3], "per_token_logps": [-0.1]}
    doc = {"task_id": "t", "harness": "h", "reward": None, "ok": False, "error": "sandbox died", "turns": [turn]}
    read_traces(_write(tmp_path / "t" / "a.json", doc), tmp_path / "run")
    (t,) = stored(tmp_path / "run")
    assert t.is_infra_error and t.infra_error == "sandbox died" and t.grade is None
    assert t.steps[0].model_call.completion_ids == [3] and t.meta["openenv"]["missing"]["reply"] == 1


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ("{not json", "not valid JSON"),
        ('{"session_id": "s", "entries": [], "reward": NaN}', "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply|not valid JSON"),
        ({"hello": 1}, "not an OpenEnv trace"),
        ({"entries": [{**ENTRY, "per_token_logps": [0.5, -1.0]}]}, "positive log-probability"),
        ({"entries": [{**ENTRY, "prompt_token_ids": [1, -2, 3]}]}, "non-negative integer token ids"),
        ({"entries": [{**ENTRY, "loss_mask": [0, 1]}]}, "loss_mask covers 2 positions"),
        ({"entries": [{**ENTRY, "reward": 1.0}, {**ENTRY, "reward": 0.0}]}, "disagree on the reward"),
        ({"entries": [{**ENTRY, "request": {"messages": [{"role": "wizard", "content": "x"}]}}]}, "role 'wizard'"),
        ({"entries": [ENTRY], "session_id": "a\nb"}, "control character"),
        (
            {"turns": [], "sequences": [{"role": "agent", "node_ids": ["ghost"], "input_ids": [], "loss_mask": []}]},
            "not in turns",
        ),
        ({"schema_version": 1, "turns": [{k: v for k, v in ENTRY.items() if k != "metadata"}]}, "node_id is missing"),
        ({"schema_version": 2, "turns": []}, "schema_version 2"),
    ],
)
def test_malformed_traces_are_refused_clearly(tmp_path, doc, match):
    _refused(_write(tmp_path / "t" / "bad.json", doc), tmp_path, match)


def test_limits(tmp_path):
    src = _write(tmp_path / "t" / "a.json", {"entries": [ENTRY, {**ENTRY, "metadata": {"node_id": "n2"}}]})
    _refused(src, tmp_path, "over the limit of 100", limits=TraceLimits(max_file_bytes=100))
    _refused(src, tmp_path, "over the limit of 1", limits=TraceLimits(max_calls=1))
    _refused(src, tmp_path, "over the limit of 2", limits=TraceLimits(max_tokens=2))


def test_jsonl_lines_and_folder_depth(tmp_path):
    line = json.dumps({"session_id": "s1", "entries": [{**ENTRY, "metadata": {"node_id": "n", "task_id": "a\u2028b"}}]})
    src = _write(tmp_path / "t" / "a.jsonl", "\n" + line.replace("\\u2028", "\u2028") + "\n\n")
    assert read_traces(src, tmp_path / "run").n_episodes == 1  # a U+2028 inside a string is not a line break
    assert stored(tmp_path / "run")[0].task_id == "a\u2028b"
    _write(tmp_path / "deep" / "1" / "2" / "3" / "a.json", {"entries": [ENTRY]})
    _refused(tmp_path / "deep", tmp_path, "more than 2 folders deep", limits=TraceLimits(max_depth=2))


def test_links_are_never_followed(tmp_path):
    real = _write(tmp_path / "elsewhere" / "a.json", {"entries": [ENTRY]})
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "link.json").symlink_to(real)
    (tmp_path / "t" / "dir").symlink_to(real.parent, target_is_directory=True)
    _refused(tmp_path / "t", tmp_path, "no .json or .jsonl trace file")  # both links skipped
    _refused(tmp_path / "t" / "link.json", tmp_path, "symbolic link")


def test_a_bad_trace_among_good_ones_writes_nothing(tmp_path):
    _write(tmp_path / "t" / "a.json", {"session_id": "s1", "entries": [ENTRY]})
    _write(tmp_path / "t" / "b.jsonl", json.dumps({"session_id": "s2", "entries": [ENTRY]}) + "\n{oops\n")
    _refused(tmp_path / "t", tmp_path, r"b\.jsonl:2: not valid JSON")
    _write(tmp_path / "u" / "a.json", {"session_id": "s1", "entries": [ENTRY]})
    _write(tmp_path / "u" / "b.json", {"session_id": "s1", "entries": [ENTRY]})
    _refused(tmp_path / "u", tmp_path, "session s1 was already read")


def test_cli_refuses_a_used_run_folder_and_unknown_format(tmp_path):
    src = _write(tmp_path / "t" / "a.json", {"entries": [ENTRY]})
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    r = cli.invoke(app, ["import-traces", str(src), "--out", str(tmp_path / "used")])
    assert r.exit_code != 0 and "not a new or empty folder" in r.output
    r = cli.invoke(app, ["import-traces", str(src), "--format", "atif", "--out", str(tmp_path / "new")])
    assert r.exit_code != 0 and "unknown trace format" in r.output
