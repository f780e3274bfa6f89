"""External harnesses: an agent program of its own, run in the sandbox against the recording
endpoint. Specs validate and round-trip; the endpoint records every call as a step with its
token ids; a tool call round-trips through the minimal example; misbehaving programs (crash,
hang, lie, escape, flood, greedy) are contained and recorded while the other episodes finish;
another episode's address is a 404; GRPO takes a step through an external harness.

The test programs are tests/fixtures/agents/behave.py (standard library only) and
examples/agents/minimal.py (the openai client); they run under `{python}`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from helpers import grpo_trainer
from typer.testing import CliRunner

from harnessrl.errors import JobError
from harnessrl.harness.external import ExternalEpisodes
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import ExternalHarnessSpec, SpecError, load_spec, parse_spec, spec_json_schema
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job, Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.tasks.sandbox_exec import isolation_available
from harnessrl.types import ActionKind, BlockReason, Termination, ToolCall

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = ROOT / "examples" / "agents" / "minimal.yaml"
BEHAVE = ROOT / "tests" / "fixtures" / "agents" / "behave.py"


def agent(mode: str, name: str | None = None, env: dict | None = None, **limits) -> ExternalHarnessSpec:
    """A spec running behave.py MODE, with small limits."""
    data = {
        "name": name or mode,
        "kind": "external",
        "command": ["{python}", str(BEHAVE), mode],
        "env": env or {},
        "limits": {"wall_s": 20, "max_model_calls": 4, "output_bytes": 10_000, **limits},
    }
    spec = parse_spec(data)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def create_file_task():
    """A workspace task whose solution is one write_file call and a submit."""
    task = next(t for t in get_suite("workspace").tasks("dev", 12) if t.family == "create_file")
    assert [c["name"] for c in task.solution] == ["write_file", "submit"]
    return task


def replies_policy(replies: list[str], tokenizer) -> ScriptedPolicy:
    """replies[k] for a conversation holding k assistant messages: each program's conversation
    goes through the list on its own, whatever runs beside it."""
    return ScriptedPolicy(replies, tokenizer=tokenizer, name="replies")


def hermes(call: dict) -> str:
    return get_protocol("hermes").render_call(ToolCall(name=call["name"], arguments=call["arguments"]))


def run(policy, specs, tasks, **kw):
    runner = Runner(
        policy, SamplingParams(temperature=0.0), max_in_flight=kw.pop("max_in_flight", 4), progress=False, **kw
    )
    return runner.run(make_jobs(tasks, specs, 1))


# ------------------------------------------------------------------------------------------- spec


def test_minimal_example_loads_resolves_and_round_trips(tmp_path):
    spec = load_spec(MINIMAL)
    assert isinstance(spec, ExternalHarnessSpec) and spec.kind == "external"
    assert spec.command == ["{python}", str(MINIMAL.parent / "minimal.py")]  # made absolute, next to the spec
    assert spec.tool_protocol == "hermes" and spec.limits.max_model_calls == 12
    again = tmp_path / "again.yaml"
    again.write_text(load_harness(str(MINIMAL)).to_yaml())
    assert load_spec(again) == spec


def test_string_commands_resolve_plain_words_only(tmp_path):
    (tmp_path / "agent.sh").write_text("exit 0\n")
    p = tmp_path / "a.yaml"
    p.write_text(yaml.safe_dump({"name": "a", "kind": "external", "command": 'sh agent.sh "agent.sh" | cat x'}))
    assert load_spec(p).command == f'sh {tmp_path / "agent.sh"} "agent.sh" | cat x'


@pytest.mark.parametrize(
    "change, message",
    [
        ({"command": []}, "command: the command must be a non-empty list"),
        ({"command": "  "}, "command: the command must not be empty"),
        ({"env": {"OPENAI_BASE_URL": "x"}}, "env: OPENAI_BASE_URL is set by harnessrl"),
        ({"env": {"1BAD": "x"}}, "not a valid environment variable name"),
        ({"tool_protocol": "telepathy"}, "tool_protocol: unknown format 'telepathy'"),
        ({"limits": {"max_model_calls": 0}}, "limits.max_model_calls"),
        ({"system_prompt": "hi"}, "system_prompt: Extra inputs"),
        ({"kind": "plugin"}, "kind: 'plugin' is not a harness kind"),
    ],
)
def test_invalid_external_specs_say_which_field_and_why(change, message):
    data = {"name": "x", "kind": "external", "command": ["true"], **change}
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        parse_spec(data, "x.yaml")


def test_schema_and_cli_cover_both_kinds(tmp_path):
    from harnessrl.cli import app

    schema = spec_json_schema()
    assert {"HarnessSpec", "ExternalHarnessSpec"} <= set(schema["$defs"]) and len(schema["anyOf"]) == 2
    cli = CliRunner()
    shown = cli.invoke(app, ["harness", "show", str(MINIMAL)])
    assert shown.exit_code == 0 and "kind: external" in shown.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.read_text().replace("tool_protocol: hermes", "tool_protocol: nope"))
    r = cli.invoke(app, ["harness", "validate", str(MINIMAL), str(bad)])
    assert r.exit_code == 1 and "ok" in r.output and "tool_protocol" in r.output and "Traceback" not in r.output


def test_loop_harness_only_features_refuse_external_harnesses():
    from harnessrl.evolve.config import EvolveConfig
    from harnessrl.kernel import enter

    with pytest.raises(JobError, match="external agent program"):  # the kernel reads the seed harness
        enter("evolve", EvolveConfig(seed_harness=str(MINIMAL), model="tiny-random"), "/nonexistent/out-never-made")


# ------------------------------------------------------------------------------ the round trip


def test_a_scripted_tool_call_makes_the_minimal_agent_pass(tokenizer):
    """The model's hermes call comes back to the openai client as a native tool call, the agent
    runs it on its workspace, sends the result back, and the grader passes the workspace."""
    task = create_file_task()
    policy = replies_policy([hermes(c) for c in task.solution], tokenizer)
    [traj] = run(policy, [load_spec(MINIMAL)], [task])
    assert traj.termination == Termination.submitted and traj.grade.passed, traj
    write, submit = traj.steps
    assert write.action == ActionKind.tool_calls and [c.name for c in write.tool_calls] == ["write_file"]
    assert write.tool_results[0].output.startswith("Wrote ")  # the agent's own result, sent back
    assert submit.tool_calls[0].name == "submit" and traj.answer == ""
    # the tools were shown in the prompt through hermes; the history holds the call and its result
    first = write.model_call.messages
    assert first[0].role == "system" and "<tools>" in first[0].content and '"name": "read_file"' in first[0].content
    assert first[1].content == task.instruction
    assert [m.role for m in submit.model_call.messages[-2:]] == ["assistant", "tool"]
    assert "<tool_call>" in submit.model_call.messages[-2].content
    assert submit.model_call.messages[-1].content.startswith("<tool_response>")
    for step in traj.steps:  # token in, token out
        call = step.model_call
        assert call.prompt_ids and call.completion_ids and len(call.logprobs) == len(call.completion_ids)
    assert traj.completion_tokens == sum(len(s.model_call.completion_ids) for s in traj.steps)
    assert traj.meta["agent"]["exit_code"] == 0 and traj.meta["required_observations"] == []


def test_the_oracle_plays_its_task_through_an_agent_program(tokenizer):
    """`--model oracle` with an external harness: each episode's policy is handed its task, and the
    solution reaches the agent as tool calls in its tool_protocol (two attempts side by side)."""
    from harnessrl.harness.oracle import Oracle

    task = create_file_task()
    runner = Runner(Oracle(tokenizer), SamplingParams(), max_in_flight=2, progress=False)
    trajs = runner.run(make_jobs([task], [load_spec(MINIMAL)], 2))
    assert [t.attempt for t in trajs] == [0, 1]
    for traj in trajs:
        assert traj.termination == Termination.submitted and traj.grade.passed, traj.termination_detail
        assert [c.name for s in traj.steps for c in s.tool_calls] == ["write_file", "submit"]


def test_unknown_tools_and_bad_arguments_are_recorded_as_blocked_calls(tokenizer):
    from harnessrl.triage import first_failure_signal

    task = create_file_task()
    replies = [
        hermes({"name": "append_file", "arguments": {"path": "a", "content": "b"}}),
        hermes({"name": "write_file", "arguments": {"path": "a"}}),
        "I give up.",
    ]
    [traj] = run(replies_policy(replies, tokenizer), [load_spec(MINIMAL)], [task])
    unknown, invalid, prose = traj.steps
    assert unknown.tool_results[0].blocked == BlockReason.unknown_tool
    assert invalid.tool_results[0].blocked == BlockReason.invalid_arguments
    assert prose.action == ActionKind.text and traj.answer == "I give up."  # the minimal agent's answer
    verdict = first_failure_signal(traj)
    assert verdict.cls == "blocked_call" and verdict.step == 0


def test_eval_cli_with_tiny_random_stores_model_calls_and_the_report_builds(tmp_path):
    from harnessrl.cli import app
    from harnessrl.report import build_report
    from harnessrl.store import RunStore

    out = tmp_path / "run"
    args = ["eval", "--harness", str(MINIMAL), "--suite", "workspace", "--model", "tiny-random", "--tasks", "2"]
    r = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    store = RunStore(out)
    trajectories = list(store.trajectories())
    assert len(trajectories) == 2
    for t in trajectories:
        assert t.harness == "minimal-agent" and not t.is_infra_error and t.steps
        call = t.steps[0].model_call
        assert call.prompt_ids and call.completion_ids and len(call.logprobs) == len(call.completion_ids)
    assert store.config["shell_isolation"]  # the agent ran sandboxed; the run says how
    assert store.config["harnesses"]["minimal-agent"]["kind"] == "external"
    index = build_report([out], tmp_path / "report")
    assert index.is_file()


# ----------------------------------------------------------------------------- containment


@pytest.fixture(params=["bwrap", "rlimits-only"])
def isolation(request, monkeypatch):
    """Runs a test under bubblewrap (where it works here) and under the rlimits-only fallback."""
    from harnessrl.tasks import sandbox_exec

    if request.param == "bwrap" and isolation_available() != "bwrap":
        pytest.skip("bubblewrap is missing or does not work here")
    if request.param == "rlimits-only":
        monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    return request.param


def test_misbehaving_programs_are_contained_and_recorded_while_the_others_finish(tokenizer, isolation):
    task = create_file_task()
    path, content = task.solution[0]["arguments"]["path"], task.solution[0]["arguments"]["content"]
    escape_in_repo = BEHAVE.parent / f"escape-{uuid.uuid4().hex[:8]}"
    escape_etc = Path("/etc") / f"harnessrl-escape-{uuid.uuid4().hex[:8]}"
    # without bubblewrap only file permissions stand between the program and the repository:
    # it is refused there when we are root (the program runs as a uid of its own)
    repo_refused = isolation == "bwrap" or os.geteuid() == 0
    specs = [
        load_spec(MINIMAL),
        agent("crash"),
        agent("hang", wall_s=2),
        agent("lie", env={"LIE_PATH": path, "LIE_CONTENT": content}),
        agent("escape", env={"ESCAPE_TARGETS": f"{escape_in_repo}:{escape_etc}"}),
        agent("flood"),
        agent("probe"),
    ]
    policy = replies_policy([hermes(c) for c in task.solution], tokenizer)
    try:
        by = {t.harness: t for t in run(policy, specs, [task], max_in_flight=7)}
    finally:
        escaped = [p for p in (escape_in_repo, escape_etc) if p.exists()]
        for p in escaped:
            p.unlink()
    assert set(by) == {s.name for s in specs}
    assert [name for name, t in by.items() if t.is_infra_error] == ["lie"]

    good = by["minimal-agent"]
    assert good.termination == Termination.submitted and good.grade.passed

    crash = by["crash"]
    assert crash.termination == Termination.exited and not crash.submitted and len(crash.steps) == 1
    assert "exit code 1" in crash.termination_detail and "crashed on purpose" in crash.termination_detail
    assert crash.meta["agent"]["exit_code"] == 1 and "crashed on purpose" in crash.meta["agent"]["stderr"]

    hang = by["hang"]
    assert hang.termination == Termination.timeout and hang.meta["agent"]["timed_out"]
    assert hang.duration_s < 15 and len(hang.steps) == 1

    lie = by["lie"]  # its workspace is right, but no model ever spoke: nothing of the model's to score
    assert lie.termination == Termination.error and not lie.steps and not lie.submitted and lie.answer is None
    assert lie.grade is None and "the agent made no model call (exit code 0)" in lie.infra_error

    escape = by["escape"]
    assert escape.termination == Termination.submitted and escape.answer == "tried"
    assert escape.meta["agent"]["isolation"] == isolation
    stderr = escape.meta["agent"]["stderr"]
    assert escape_etc not in escaped and f"refused {escape_etc}" in stderr
    if repo_refused:
        assert not escaped, f"a write outside the workspace reached the host: {escaped}"
        # under bubblewrap a checkout under /tmp lies in the sandbox's own /tmp: the write may land
        # there (and vanish with it); anywhere else the folder does not exist in the sandbox
        if not (isolation == "bwrap" and escape_in_repo.is_relative_to("/tmp")):
            assert f"refused {escape_in_repo}" in stderr

    flood = by["flood"]
    agent_meta = flood.meta["agent"]
    assert flood.termination == Termination.exited and agent_meta["output_truncated"]
    assert len(agent_meta["stdout"]) == 10_000 and "stdout cut at 10000 bytes of 104857600" in agent_meta["reason"]

    probe = by["probe"]
    assert probe.termination == Termination.submitted and len(probe.steps) == 1
    assert "other episode: 404 no running episode has this address" in probe.meta["agent"]["stdout"]


def test_faults_are_stopped_by_the_spec_limits_and_recorded_while_the_others_finish(tokenizer, isolation):
    """A program that forks without end, fills the disk, holds the endpoint open or never exits
    is stopped by its spec's limits and recorded as its episode's outcome; the good episode beside
    them is graded and nothing is lost."""
    task = create_file_task()
    specs = [
        load_spec(MINIMAL),
        agent("forkbomb", wall_s=4, processes=16),
        agent("filldisk", env={"FILL_MB": "16"}, wall_s=60, disk_mb=16),
        agent("holdopen", wall_s=4),
        agent("hang", wall_s=4),
    ]
    policy = replies_policy([hermes(c) for c in task.solution], tokenizer)
    t0 = time.monotonic()
    by = {t.harness: t for t in run(policy, specs, [task], max_in_flight=len(specs))}
    took = time.monotonic() - t0
    assert set(by) == {s.name for s in specs} and not any(t.is_infra_error for t in by.values())
    assert took < 45, f"the faulty programs held the run up: {took:.1f} s"

    good = by["minimal-agent"]
    assert good.termination == Termination.submitted and good.grade.passed

    for name in ("forkbomb", "holdopen", "hang"):  # each stopped at its wall clock, tree and all
        traj = by[name]
        assert traj.termination == Termination.timeout and traj.meta["agent"]["timed_out"], traj.termination_detail
        assert len(traj.steps) == 1 and traj.duration_s < 20 and traj.grade is not None
    assert "holding 20 requests" in by["holdopen"].meta["agent"]["stdout"]

    fill = by["filldisk"]
    detail = fill.termination_detail
    assert fill.termination == Termination.exited and "disk limit of 16 MB exceeded" in detail, detail
    assert "SIGKILL" not in detail and fill.meta["agent"]["duration_s"] < 30
    if isolation == "bwrap":  # its /tmp is a tmpfs of the same size
        assert "tmp full after" in fill.meta["agent"]["stdout"], fill.meta["agent"]["stdout"]


@pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is missing or does not work here")
def test_under_bubblewrap_the_program_sees_tmp_as_its_own(tokenizer):
    """With bubblewrap /tmp is a fresh tmpfs: a write there never reaches the host's /tmp."""
    target = Path("/tmp") / f"harnessrl-escape-{uuid.uuid4().hex[:8]}"
    spec = agent("escape", env={"ESCAPE_TARGETS": str(target)})
    [traj] = run(replies_policy(["ok"], tokenizer), [spec], [create_file_task()])
    assert f"wrote {target}" in traj.meta["agent"]["stdout"] and not target.exists()


@pytest.mark.parametrize(
    "limits, status, termination",
    [
        ({"max_model_calls": 2}, 429, Termination.max_steps),
        ({"max_total_tokens": 5}, 400, Termination.max_tokens),
    ],
)
def test_requests_past_a_limit_are_refused_and_end_the_episode(limits, status, termination, tokenizer):
    spec = agent("greedy", env={"AGENT_MAX_TOKENS": "3"}, **limits)
    policy = replies_policy(["one two three four five six"] * 10, tokenizer)
    [traj] = run(policy, [spec], [create_file_task()])
    assert traj.termination == termination and not traj.submitted
    assert len(traj.steps) == 2  # 2 calls, or 3 + 3 tokens >= 5
    assert all(len(s.model_call.completion_ids) <= 3 for s in traj.steps)
    # the program was told, and then stopped (or it ended on the refusal itself)
    stdout = traj.meta["agent"]["stdout"]
    assert stdout.startswith(f"refused: {status} ") or traj.meta["agent"]["stopped"]
    limit = next(iter(limits))
    assert f"limits.{limit}" in traj.termination_detail  # named even where the program was stopped before it printed


def test_a_failed_model_backend_is_an_infrastructure_error(tokenizer):
    policy = replies_policy([], tokenizer)  # the script is exhausted at once: PolicyError
    [traj] = run(policy, [agent("ask")], [create_file_task()], max_retries=1)
    assert traj.is_infra_error and traj.retries == 1 and "model backend failed" in traj.infra_error


def test_no_python_for_the_agent_is_an_infrastructure_error_not_a_crash(tokenizer, monkeypatch):
    from harnessrl.harness import external

    def missing():
        raise external.NoAgentPython("no Python here")

    monkeypatch.setattr(external, "agent_python", missing)
    [traj] = run(replies_policy(["x"], tokenizer), [agent("ask")], [create_file_task()], max_retries=0)
    assert traj.is_infra_error and traj.infra_error == "no Python here"


def test_an_interrupted_run_stops_the_program_and_records_nothing(tokenizer):
    policy = replies_policy(["x"], tokenizer)
    runner = Runner(policy, SamplingParams(), progress=False)
    stop = threading.Event()
    external = ExternalEpisodes(runner._count)
    threading.Timer(1.0, stop.set).start()
    try:
        job = Job(create_file_task(), agent("hang", wall_s=30), 0)
        assert external.play(job, policy, SamplingParams(), stop) is None
    finally:
        external.close()


# ------------------------------------------------------------------------------- the endpoint


def test_another_episodes_address_is_a_404_and_its_own_answers(tokenizer):
    from harnessrl.harness.external import ExternalEpisode
    from harnessrl.harness.recording import RecordingEndpoint

    policy = replies_policy(["hello"], tokenizer)
    job = Job(create_file_task(), agent("ask"), 0)
    endpoint = RecordingEndpoint()
    endpoint.start()
    try:
        mine = ExternalEpisode(job, policy, SamplingParams(), lambda latency, call: None)
        ended = ExternalEpisode(job, policy, SamplingParams(), lambda latency, call: None)
        endpoint.register(mine)
        endpoint.register(ended)
        endpoint.unregister(ended)

        def post(url: str) -> tuple[int, dict]:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
            req = urllib.request.Request(
                url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, body = post(endpoint.url(ended))
        assert status == 404 and body["error"]["type"] == "not_found_error"
        forged = ("y" if mine.token[0] == "x" else "x") + mine.token[1:]  # one character off, never the same
        status, body = post(endpoint.url(mine).replace(mine.token, forged))
        assert status == 404
        status, body = post(endpoint.url(mine))
        assert status == 200 and body["choices"][0]["message"]["content"] == "hello"
        assert [s.model_call.text for s in mine.steps()] == ["hello"] and not ended.steps()
    finally:
        endpoint.stop()


def test_the_openai_client_reads_tool_calls_streamed_and_not(tokenizer):
    """The official client parses the endpoint's answers: content, tool_calls, logprobs, streams."""
    import openai

    from harnessrl.harness.external import ExternalEpisode
    from harnessrl.harness.recording import RecordingEndpoint

    call = {"name": "read_file", "arguments": {"path": "a.txt"}}
    policy = replies_policy(["Let me look.\n" + hermes(call), "plain"], tokenizer)
    episode = ExternalEpisode(Job(create_file_task(), agent("ask"), 0), policy, SamplingParams(), lambda *a: None)
    endpoint = RecordingEndpoint()
    endpoint.start()
    endpoint.register(episode)
    try:
        client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
        tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
        messages = [{"role": "user", "content": "go"}]
        reply = client.chat.completions.create(model="m", messages=messages, tools=tools, logprobs=True)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
        [tc] = choice.message.tool_calls
        assert (
            tc.id == "call_0_0"
            and tc.function.name == "read_file"
            and json.loads(tc.function.arguments) == {"path": "a.txt"}
        )
        assert len(choice.logprobs.content) == reply.usage.completion_tokens
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tc.id, "content": "A"},
        ]
        stream = client.chat.completions.create(model="m", messages=messages, tools=tools, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        assert text == "plain"
        first, second = episode.steps()
        assert first.tool_results[0].output == "A" and second.action == ActionKind.text
        assert [m.model_dump(exclude_none=True)["id"] for m in client.models.list().data] == [policy.name]
    finally:
        endpoint.stop()


def test_an_openai_model_gets_the_agents_tools_natively(tiny_policy):
    """With an openai: model the tools and the history's tool turns go to that server natively, and
    its tool_calls come back to the agent as they were."""
    import openai
    from openai_server import OpenAITestServer, ServerOptions

    from harnessrl.harness.external import ExternalEpisode
    from harnessrl.harness.recording import RecordingEndpoint
    from harnessrl.models.openai_compat import OpenAIPolicy

    options = ServerOptions(tool_call=("read_file", {"path": "a.txt"}), tool_call_content="Looking.")
    with OpenAITestServer(tiny_policy, options=options) as upstream:
        policy = OpenAIPolicy.from_spec(upstream.spec(), SamplingParams(temperature=0.0), max_retries=0)
        episode = ExternalEpisode(Job(create_file_task(), agent("ask"), 0), policy, SamplingParams(), lambda *a: None)
        endpoint = RecordingEndpoint()
        endpoint.start()
        endpoint.register(episode)
        try:
            client = openai.OpenAI(base_url=endpoint.url(episode), api_key="EMPTY", max_retries=0)
            tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
            reply = client.chat.completions.create(model="m", messages=messages, tools=tools)
            [tc] = reply.choices[0].message.tool_calls
            assert tc.function.name == "read_file" and json.loads(tc.function.arguments) == {"path": "a.txt"}
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": tc.id, "content": "A"},
            ]
            client.chat.completions.create(model="m", messages=messages, tools=tools)
        finally:
            endpoint.stop()
    first, second = (r.body for r in upstream.requests)
    assert first["tools"][0]["function"]["name"] == "read_file"
    assert first["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"}]
    assistant, result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "read_file"
    assert result == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "A"}
    step = episode.steps()[0]
    assert step.tool_calls[0].name == "read_file" and step.tool_results[0].output == "A"
    # recorded as the server sent them: the prose as the text, the call as data
    assert step.model_call.text == "Looking." and step.model_call.tool_calls[0].arguments == {"path": "a.txt"}


# ------------------------------------------------------------------------------------ training


def test_grpo_takes_a_step_through_an_external_harness(tmp_path):
    from test_trainer import BASE, TextScore, lines

    spec = agent("ask", name="say", env={"AGENT_MAX_TOKENS": "8"})
    config = BASE.replace(steps=1, eval_every=0, scheduler="single:say")
    trainer = grpo_trainer(config, tmp_path / "train", suite=TextScore(), specs=[spec], progress=False)
    trainer.run()
    [record] = lines(tmp_path / "train" / "metrics.jsonl")
    assert record["harness"] == "say" and record["episodes"] == 4 and record["infra_errors"] == 0
    assert record["units"] == 4 and record["optimizer_step"] and record["units_trained"] > 0
    assert 0 <= record["rollout_logprob_diff_max"] < 1e-4  # the recorded logprobs are the policy's


@pytest.fixture(autouse=True)
def _no_stray_folders(monkeypatch):
    """Every temporary folder an episode makes (its workspace; its control folder with the task
    file, the answer file and HOME) is removed when the episode ends. (The process's one folder
    of the network relay and the endpoint's socket is made once and removed at exit.)"""
    import tempfile

    from harnessrl.tasks.sandbox_net import net_folder

    net_folder()

    made: list[str] = []
    original = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    yield
    assert not [m for m in made if os.path.exists(m)]


def test_behave_fixture_is_readable_by_the_sandbox_user():
    """The sandbox runs programs as an unprivileged user when we are root: the files must be readable."""
    for path in (BEHAVE, MINIMAL.parent / "minimal.py"):
        assert os.stat(path).st_mode & 0o004
    assert shutil.which("sh")


def test_the_shell_agent_runs_the_models_command_and_passes(tokenizer):
    task = create_file_task()
    path, content = task.solution[0]["arguments"]["path"], task.solution[0]["arguments"]["content"]
    command = f"mkdir -p $(dirname {path}) && printf '%s' '{content}' > {path} && wc -l < {path}"
    replies = [hermes({"name": "run", "arguments": {"command": command}}), hermes(task.solution[1])]
    spec = load_spec(ROOT / "examples" / "agents" / "shell_agent.yaml")
    [traj] = run(replies_policy(replies, tokenizer), [spec], [task])
    assert traj.termination == Termination.submitted and traj.grade.passed, traj.meta["agent"]
    ran, submitted = traj.steps
    assert ran.tool_calls[0].name == "run" and ran.tool_results[0].output == "1\n\n[exit status 0]"
    assert submitted.tool_calls[0].name == "submit"
