"""Real agent programs, unmodified, as external harnesses (examples/agents/, docs/external-harness.md).

- the OpenAI Agents SDK (`openai-agents`) in its default mode, the Responses API, with tracing off;
- mini-swe-agent (`mini-swe-agent`), its own CLI and config file, litellm's chat completions offline.

Each solves two `workspace` tasks (a file read and answered, a file copied) with a scripted policy
that answers each program's conversation with the task's solution in the form that program's
tools take (the tiny random model would never write a valid call): every call the real program
makes goes through the recording endpoint and is recorded with its token ids, tools and results,
and the report shows the episodes. Then both run on the tiny random model through `harnessrl
eval` and `harnessrl report`: whatever the model writes, the episode is the program's, never an
infrastructure error. The tests skip, saying why, where an agent package is not installed
(`pip install -e '.[agents]'`).
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

import pytest
from helpers import dialects_used
from typer.testing import CliRunner

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.spec import ExternalHarnessSpec, load_spec
from harnessrl.models.base import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.report import build_report, read_data_file
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.types import Message, Termination, ToolCall

AGENTS = Path(__file__).resolve().parents[1] / "examples" / "agents"
SDK, MINI = AGENTS / "openai_agents_sdk.yaml", AGENTS / "mini_swe_agent.yaml"
PACKAGES = {SDK: "openai-agents", MINI: "mini-swe-agent"}
FAMILIES = ("answer_from_file", "copy_content")  # read and answer; read, write and submit


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    # the programs inherit nothing of our environment, but the test's own clients must not proxy
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def installed(spec_path: Path) -> ExternalHarnessSpec:
    """The example's spec; skips when its agent package is not installed in harnessrl's Python."""
    package = PACKAGES[spec_path]
    try:
        importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed (pip install -e '.[agents]'): {spec_path.name} cannot run")
    spec = load_spec(spec_path)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def workspace_tasks():
    tasks = [t for t in get_suite("workspace").tasks("dev", 12) if t.family in FAMILIES]
    assert sorted(t.family for t in tasks) == sorted(FAMILIES)
    return tasks


def hermes(name: str, arguments: dict) -> str:
    return get_protocol("hermes").render_call(ToolCall(name=name, arguments=arguments))


def as_sdk_call(call: dict) -> str:
    """The solution's call itself: the SDK example offers the workspace suite's tool names."""
    return hermes(call["name"], call["arguments"])


def as_bash_call(call: dict) -> str:
    """The solution's call as a command for mini-swe-agent's one tool, `bash`; submit is the line
    mini ends on, with the answer after it."""
    args = call["arguments"]
    if call["name"] == "read_file":
        command = f"cat {shlex.quote(args['path'])}"
    elif call["name"] == "write_file":
        path = shlex.quote(args["path"])
        command = f'mkdir -p "$(dirname {path})" && printf %s {shlex.quote(args["content"])} > {path}'
    elif call["name"] == "submit":
        command = f"printf 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n%s' {shlex.quote(args.get('answer', ''))}"
    else:
        raise AssertionError(f"no bash form for {call['name']}")
    return hermes("bash", {"command": command})


def solver(tasks, render) -> ScriptedPolicy:
    """Answers each conversation with the next call of its task's solution: the task is the one
    whose instruction the program put in a user message (each program words its prompt itself)."""

    def reply(messages: list[Message]) -> str:
        said = "\n".join(m.content or "" for m in messages if m.role == "user")
        [task] = [t for t in tasks if t.instruction in said]
        return render(task.solution[sum(m.role == "assistant" for m in messages)])

    return ScriptedPolicy(reply, name="solver")


def offered(traj) -> set[str]:
    """The tool names in the first prompt's system message, where the endpoint showed the
    program's tools to the model (hermes: one JSON schema per tool)."""
    system = traj.steps[0].model_call.messages[0]
    assert system.role == "system"
    return set(re.findall(r'"name": "([A-Za-z_]+)"', system.content or ""))


def report_rows(run: Path, out: Path) -> dict[str, dict]:
    """The report's episode rows of `run`, by (harness, task id), with each episode's detail file."""
    build_report([run], out)
    rows = {}
    for page in sorted((out / "episodes").glob("index-*.js")):
        for row in read_data_file(page)[1]["episodes"]:
            rows[(row["harness"], row["task"])] = {**row, "detail": read_data_file(out / row["file"])[1]}
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("spec_path, render", [(SDK, as_sdk_call), (MINI, as_bash_call)], ids=["openai-agents", "mini"])
def test_a_real_agent_solves_two_tasks_through_the_endpoint_and_the_report_shows_them(spec_path, render, tmp_path):
    spec = installed(spec_path)
    tasks = workspace_tasks()
    runner = Runner(solver(tasks, render), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        agent = traj.meta["agent"]
        assert traj.termination == Termination.submitted and traj.grade.passed, (traj.termination_detail, agent)
        assert not traj.is_infra_error and not traj.refused_requests and agent["exit_code"] == 0
        # one recorded step per call the program made, each with its token ids and logprobs
        assert len(traj.steps) == len(task.solution)
        for step, call in zip(traj.steps, task.solution):
            mc = step.model_call
            assert mc.prompt_ids and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
            [made] = step.tool_calls
            assert made.name == ("bash" if spec_path == MINI else call["name"])
        # the program ran its tools and sent their results back: all but the last call have one
        for step in traj.steps[:-1]:
            assert step.tool_results and step.tool_results[0].output
        if task.family == "answer_from_file":
            assert traj.answer == task.solution[-1]["arguments"]["answer"]
            assert task.solution[0]["arguments"]["path"] in traj.steps[0].tool_calls[0].raw
        if spec_path == SDK:
            # the default model is OpenAIResponsesModel: every reply has a Responses API id
            ids = agent["stdout"].split("responses:", 1)[1].split()
            assert len(ids) == len(traj.steps) and all(i.startswith("resp_") for i in ids)
            assert "trac" not in agent["stderr"].lower()  # tracing off: no exporter complaining
            assert offered(traj) >= {"list_dir", "read_file", "write_file", "submit"}
        else:
            assert "exit_status=Submitted" in agent["stdout"]
            # mini's own prompt (its config file) reached the model, with its one tool
            assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in traj.steps[0].model_call.messages[1].content
            assert "bash" in offered(traj) and "read_file" not in offered(traj)

    with RunStore(tmp_path / "run") as store:
        for traj in trajectories:
            store.add(traj)
    rows = report_rows(tmp_path / "run", tmp_path / "report")
    assert set(rows) == {(spec.name, t.id) for t in tasks}
    for traj in trajectories:
        row = rows[(spec.name, traj.task_id)]
        assert row["passed"] and row["n_steps"] == len(traj.steps)
        assert [s["tool_calls"][0]["name"] for s in row["detail"]["steps"]] == [
            c.name for s in traj.steps for c in s.tool_calls
        ]


@pytest.mark.slow
def test_both_agents_run_on_the_tiny_random_model_through_eval_and_report(tmp_path):
    from harnessrl.cli import app

    specs = [installed(SDK), installed(MINI)]
    out = tmp_path / "run"
    harnesses = f"{SDK},{MINI}"
    args = ["eval", "--harness", harnesses, "--suite", "workspace", "--model", "tiny-random", "--tasks", "2"]
    r = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    trajectories = list(RunStore(out).trajectories())
    assert sorted(t.harness for t in trajectories) == sorted([s.name for s in specs] * 2)
    for t in trajectories:
        # the random model writes no valid call: the SDK takes its text as the final output, mini
        # answers it with a format error until it gives up; the episode is theirs either way
        assert not t.is_infra_error and t.termination != Termination.error, (t.harness, t.termination_detail)
        assert t.steps, (t.harness, t.termination_detail, t.meta["agent"]["stderr"][-2000:])
        for step in t.steps:
            mc = step.model_call
            assert mc.prompt_ids and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
    r = CliRunner().invoke(app, ["report", str(out), "--out", str(tmp_path / "report")])
    assert r.exit_code == 0, r.output
    rows = report_rows(out, tmp_path / "report")
    assert set(rows) == {(t.harness, t.task_id) for t in trajectories}
    for t in trajectories:
        assert rows[(t.harness, t.task_id)]["n_steps"] == len(t.steps)
    index = (tmp_path / "report" / "index.html").read_text()
    for spec in specs:
        assert f'data-harness="{spec.name}"' in index


@pytest.mark.slow
def test_mini_swe_agent_on_the_responses_api_solves_two_tasks():
    """mini-swe-agent's Responses model class (`litellm_response`: litellm.responses, its `bash`
    tool in the Responses shape) with the same config file: its requests go to /v1/responses,
    the scripted solver's calls come back as function_call items that mini runs, and both tasks
    pass."""
    spec = installed(MINI)
    spec = spec.model_copy(update={"env": {**spec.env, "MINI_MODEL_CLASS": "litellm_response"}})
    tasks = workspace_tasks()
    runner = Runner(solver(tasks, as_bash_call), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    with dialects_used() as used:
        trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert used and set(used) == {"responses"}, used  # every model call took the Responses route
    assert len(trajectories) == 2
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        agent = traj.meta["agent"]
        assert traj.termination == Termination.submitted and traj.grade.passed, (traj.termination_detail, agent)
        assert not traj.is_infra_error and not traj.refused_requests
        assert "exit_status=Submitted" in agent["stdout"]
        assert len(traj.steps) == len(task.solution)
        for step in traj.steps[:-1]:
            [made] = step.tool_calls
            assert made.name == "bash" and step.tool_results and step.tool_results[0].output
        if task.family == "answer_from_file":
            assert traj.answer == task.solution[-1]["arguments"]["answer"]


OPENCLAW_LEAN = AGENTS / "openclaw_lean.yaml"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_openclaw_lean_on_the_responses_api_is_recorded(tokenizer, tmp_path):
    """OpenClaw's custom provider with `api: "openai-responses"` (openclaw.sh's OPENCLAW_API) in
    place of chat completions, the lean spec, on the embedded-size tiny random model: its
    requests go to /v1/responses and every call is recorded, none refused."""
    from helpers import check_recorded_and_triaged
    from helpers import workspace_tasks as family_tasks

    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    prefix = AGENTS.parents[1] / ".agents"  # where install_openclaw.sh puts Node and OpenClaw
    if not (prefix / "openclaw" / "node_modules" / "openclaw" / "openclaw.mjs").exists():
        pytest.skip(f"OpenClaw is not installed under {prefix} (sh examples/agents/install_openclaw.sh)")
    spec = load_spec(OPENCLAW_LEAN)
    assert isinstance(spec, ExternalHarnessSpec)
    limits = spec.limits.model_copy(update={"max_new_tokens": 16})
    spec = spec.model_copy(update={"env": {**spec.env, "OPENCLAW_API": "openai-responses"}, "limits": limits})
    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    runner = Runner(policy, SamplingParams(temperature=0.0), max_in_flight=1, progress=False)
    with dialects_used() as used:
        trajectories = runner.run(make_jobs(family_tasks(FAMILIES), [spec], 1))
    policy.close()
    assert used and set(used) == {"responses"}, used  # every model call took the Responses route
    assert len(trajectories) == 2
    for traj in check_recorded_and_triaged(trajectories, tmp_path / "run"):
        assert len(traj.steps[0].model_call.prompt_ids) < 8192
        assert {"read", "write", "exec"} <= offered(traj)
