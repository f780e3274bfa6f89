"""Test helpers: scripted policies of known behaviour; a rollout server locked by a known key; the
Claw-Eval fixture's notes task solved through the task tools an episode serves over MCP."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harnessrl.harness.oracle import oracle_script
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.tasks import get_suite
from harnessrl.types import Message, Termination


def oracle_policy(tasks, spec, tokenizer) -> ScriptedPolicy:
    """One policy playing the oracle (harness/oracle.py) of several tasks through `spec`: it finds
    a conversation's task by its instruction, so tasks worded alike must not run side by side.
    An episode's first request (no reply after the instruction yet) starts its task's solution
    over, so the attempts of a task each replay all of it."""
    by_instruction = {t.instruction: t for t in tasks}
    scripts: dict[str, Callable[[list[Message]], str]] = {}

    def script(messages: list[Message]) -> str:
        at = next((i for i, m in enumerate(messages) if m.role == "user" and m.content in by_instruction), None)
        if at is None:
            raise ValueError("oracle: the conversation names none of the oracle's tasks")
        task = by_instruction[messages[at].content]
        if task.instruction not in scripts or not any(m.role == "assistant" for m in messages[at + 1 :]):
            scripts[task.instruction] = oracle_script(task, spec)  # a new episode
        return scripts[task.instruction](messages)

    return ScriptedPolicy(script, tokenizer=tokenizer, name=f"oracle-{spec.name}")


def replies_policy(replies: list[str], tokenizer) -> ScriptedPolicy:
    """Returns replies[k] on the k-th call of each conversation (by call count, not by history)."""
    count: dict[str, int] = defaultdict(int)

    def script(messages: list[Message]) -> str:
        key = next(m.content for m in messages if m.role == "user")
        k = count[key]
        count[key] += 1
        return replies[min(k, len(replies) - 1)]

    return ScriptedPolicy(script, tokenizer=tokenizer, name="replies")


def workspace_tasks(families: tuple[str, ...]) -> list:
    """The `workspace` dev tasks of `families`, one each, among its first twelve."""
    tasks = [t for t in get_suite("workspace").tasks("dev", 12) if t.family in families]
    assert sorted(t.family for t in tasks) == sorted(families)
    return tasks


def solution_policy(tasks, as_call: Callable[[dict], str]) -> ScriptedPolicy:
    """Plays each task's `solution` in an external agent's own tools, one call a turn: the task is
    the one whose instruction a user message holds, the turn the count of assistant messages, and
    `as_call` writes a solution call as the agent's reply."""

    def reply(messages: list[Message]) -> str:
        said = "\n".join(m.content or "" for m in messages if m.role == "user")
        [task] = [t for t in tasks if t.instruction in said]
        return as_call(task.solution[sum(m.role == "assistant" for m in messages)])

    return ScriptedPolicy(reply, name="solver")


def check_solved_step_by_step(traj, task) -> None:
    """An external agent's episode played by `solution_policy`: it ran and passed, one recorded
    call (token ids and logprobs) per solution call, the last one a final reply."""
    agent = traj.meta["agent"]
    assert not traj.is_infra_error and not traj.refused_requests, (traj.termination_detail, agent["stderr"][-3000:])
    assert agent["exit_code"] == 0 and traj.termination == Termination.submitted, traj.termination_detail
    assert traj.grade.passed, (traj.grade, agent["stdout"][-2000:])
    assert len(traj.steps) == len(task.solution)
    for step in traj.steps:
        mc = step.model_call
        assert mc.prompt_ids and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
    assert not traj.steps[-1].tool_calls


def bash_step(call: dict) -> str:
    """One solution call in an agent's own `bash` tool, written in hermes tags (the tool_protocol
    of the specs that use it): a read is `cat`, a write `mkdir -p ... && printf ... >`, submit the
    plain final reply that ends the agent's run (its answer)."""
    import shlex

    from harnessrl.harness.protocols import get_protocol
    from harnessrl.types import ToolCall

    args = call["arguments"]
    if call["name"] == "submit":
        return args.get("answer") or "Done."
    if call["name"] == "read_file":
        command = f"cat {shlex.quote(args['path'])}"
    else:
        path = shlex.quote(args["path"])
        command = f'mkdir -p "$(dirname {path})" && printf %s {shlex.quote(args["content"])} > {path}'
    return get_protocol("hermes").render_call(
        ToolCall(name="bash", arguments={"command": command, "description": "Run the step"})
    )


def check_solved_through_bash(spec, families: tuple[str, ...]) -> None:
    """A scripted policy answers the agent with each task's solution in its own `bash` tool
    (`bash_step`): the agent runs the commands and sends their output back, every task passes, one
    recorded call per solution call, and an answer read from a file came back as the shell's output."""
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs

    tasks = workspace_tasks(families)
    runner = Runner(solution_policy(tasks, bash_step), SamplingParams(temperature=0.0), max_in_flight=2, progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    assert len(trajectories) == len(tasks)
    for traj in trajectories:
        task = next(t for t in tasks if t.id == traj.task_id)
        check_solved_step_by_step(traj, task)
        for step in traj.steps[:-1]:
            [made] = step.tool_calls
            assert made.name == "bash" and step.tool_results
        if task.family == "answer_from_file":
            assert traj.answer.strip() == task.solution[-1]["arguments"]["answer"]
            assert traj.answer.strip() in traj.steps[0].tool_results[0].output


# A ChatML template with a tool role that wraps every tool message in <tool_response> tags itself,
# consecutive tool messages in one user turn (the way the Qwen2.5 / Qwen3 templates render them).
TOOL_RESPONSE_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def with_template(tokenizer, template: str):
    """A shallow copy of `tokenizer` with another chat template (the shared one stays as it is)."""
    import copy

    copied = copy.copy(tokenizer)
    copied.chat_template = template
    return copied


def check_recorded_and_triaged(trajectories, run_dir) -> list:
    """An external agent's episodes on a random model, stored in `run_dir` and read back: each
    is the agent's own (no infrastructure error, no refused request), made at least one recorded
    call with token ids and logprobs, failed its grade, and has a first failure signal. Returns
    the stored trajectories."""
    from harnessrl.store import RunStore
    from harnessrl.triage import first_failure_signal

    with RunStore(run_dir) as store:
        for traj in trajectories:
            store.add(traj)
    stored = list(RunStore(run_dir).trajectories())
    assert len(stored) == len(trajectories)
    for traj in stored:
        agent = traj.meta["agent"]
        assert not traj.is_infra_error and traj.termination != Termination.error, traj.termination_detail
        assert not traj.refused_requests, traj.refused_requests  # no 400: the prompt fits, the dialect is served
        assert traj.steps, (traj.termination_detail, agent["stderr"][-3000:])
        for step in traj.steps:
            mc = step.model_call
            assert mc.prompt_ids and mc.completion_ids and len(mc.logprobs) == len(mc.completion_ids)
        assert traj.grade is not None and not traj.grade.passed  # random text solves nothing
        assert first_failure_signal(traj) is not None, traj.termination_detail
    return stored


# The admin key of the servers the tests start as rollout servers (wire/auth.py).
ADMIN_KEY = "test-admin-key"


@contextlib.contextmanager
def keyed_server(model, **kwargs) -> Iterator[str]:
    """`serving(model, **kwargs)` locked by ADMIN_KEY, with $HARNESSRL_ADMIN_KEY set to it for the
    block, as a trainer pointed at a running server is given it; yields the base URL."""
    from harnessrl.serve import serving
    from harnessrl.wire.auth import ADMIN_KEY_ENV

    with pytest.MonkeyPatch.context() as env, serving(model, admin_key=ADMIN_KEY, **kwargs) as url:
        env.setenv(ADMIN_KEY_ENV, ADMIN_KEY)
        yield url


# The Claw-Eval fixture's notes task (S01: a notes service; its grader reads the service's audit
# and the dispatches), solved by an agent program through the task's tools served over MCP.
CLAWEVAL_FIXTURE = Path(__file__).parent / "fixtures" / "claweval"
NOTES_CALLS = [("notes_list", {}), ("notes_add", {"title": "Follow up: Renew the parking permit"})]
NOTES_ANSWER = "Added the follow-up note."


def claweval_notes_task():
    """S01_notes_followup of the Claw-Eval fixture; skipped without bubblewrap (its service and
    grader need it)."""
    from harnessrl.tasks.importers import ClawEvalSuite
    from harnessrl.tasks.sandbox_exec import isolation_available

    if isolation_available() != "bwrap":
        pytest.skip("the Claw-Eval fixture's grader and service need bubblewrap")
    [task] = [t for t in ClawEvalSuite(CLAWEVAL_FIXTURE).tasks("dev") if t.data["native_id"] == "S01_notes_followup"]
    return task


def notes_solver(prefix: str) -> ScriptedPolicy:
    """The notes task's solution as an agent's model makes it: each served tool called under the
    agent's name for it (`prefix` + the tool's), one a turn (hermes), then the final reply."""
    from harnessrl.harness.protocols import get_protocol
    from harnessrl.types import ToolCall

    def reply(messages: list[Message]) -> str:
        turn = sum(m.role == "assistant" for m in messages)
        if turn < len(NOTES_CALLS):
            name, arguments = NOTES_CALLS[turn]
            return get_protocol("hermes").render_call(ToolCall(name=prefix + name, arguments=arguments))
        return NOTES_ANSWER

    return ScriptedPolicy(reply, name="solver")


def solve_notes_through(spec, prefix: str):
    """The Claw-Eval notes task played once through `spec` with notes_solver(prefix) as its model,
    checked by check_notes_solved; the trajectory, for what a test checks beside."""
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import Runner, make_jobs

    task = claweval_notes_task()
    runner = Runner(notes_solver(prefix), SamplingParams(temperature=0.0), progress=False)
    [traj] = runner.run(make_jobs([task], [spec], 1))
    check_notes_solved(traj, prefix)
    return traj


# The route of each API a model call of an agent program takes, and its dialect (the routes
# harnessrl.preflight reads a first request's dialect from; "": a route that is not a model call).
DIALECT_ROUTES = (
    ("/chat/completions", "chat"),
    ("/responses", "responses"),
    ("/messages/count_tokens", ""),
    ("/messages", "messages"),
    (":generateContent", "gemini"),
    (":streamGenerateContent", "gemini"),
)


@contextlib.contextmanager
def dialects_used() -> Iterator[list[str]]:
    """The dialect of every model call that the agent programs of the episodes run in the block
    make, in the order their recording endpoint got them, read from the route each one took (the
    episodes' own calls: no extra run of the program to ask its first request)."""
    from starlette.requests import Request

    from harnessrl.harness.external import ExternalEpisodes
    from harnessrl.harness.recording import RecordingEndpoint

    used: list[str] = []

    class RoutesNoted(RecordingEndpoint):
        def _app(self):
            app = super()._app()

            @app.middleware("http")
            async def note(request: Request, call_next):
                path = request.url.path
                name = next((name for suffix, name in DIALECT_ROUTES if path.endswith(suffix)), "")
                if name:
                    used.append(name)
                return await call_next(request)

            return app

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExternalEpisodes, "endpoint_class", RoutesNoted)
        yield used


def check_notes_solved(traj, prefix: str) -> None:
    """The notes task passed through the served tools: graded 1.0 by its own grader, the three
    tools offered under the agent's names, both calls run over MCP and matched to the steps that
    made them, each step holding the service's own answer."""
    agent = traj.meta["agent"]
    assert not traj.is_infra_error and not traj.refused_requests, (traj.infra_error, agent["stderr"][-3000:])
    assert traj.termination == Termination.submitted, (traj.termination_detail, agent["stderr"][-3000:])
    assert traj.grade.score == 1.0 and traj.grade.passed, traj.grade
    assert traj.answer.strip() == NOTES_ANSWER
    system = "\n".join(m.content or "" for m in traj.steps[0].model_call.messages if m.role == "system")
    for name in ("notes_list", "notes_add", "notes_delete"):
        assert f'"name": "{prefix}{name}"' in system, name
    assert traj.meta["mcp"]["tools"] == ["notes_list", "notes_add", "notes_delete"]
    assert [(c["call"]["name"], c["step"]) for c in traj.meta["mcp"]["calls"]] == [("notes_list", 0), ("notes_add", 1)]
    listing, adding = traj.steps[0].tool_results[0], traj.steps[1].tool_results[0]
    assert listing.name == "notes_list" and "Renew the parking permit" in listing.output
    assert adding.name == "notes_add" and adding.ok and '"status": "added"' in adding.output


def shrunk(
    base: str | HarnessSpec, *, name: str | None = None, system_prompt: str | None = None, **rules
) -> HarnessSpec:
    """A harness (a built-in name, or a spec) with some rules cut (max_steps=2, max_new_tokens=16,
    ...): a tiny random model's episodes end fast, through the same harness code. `name`,
    `system_prompt`: given, they replace the harness's own."""
    data = (load_harness(base) if isinstance(base, str) else base).to_dict()
    data["rules"].update(rules)
    data.update({k: v for k, v in (("name", name), ("system_prompt", system_prompt)) if v is not None})
    return HarnessSpec.model_validate(data)


def shrunk_file(folder: Path, base: str, *, name: str | None = None, **rules) -> Path:
    """`shrunk` written as a spec file in `folder` (for the command line's --harness): NAME.yaml
    under the given `name`, else BASE-shrunk.yaml keeping the harness's own name."""
    import yaml

    path = folder / f"{name or base + '-shrunk'}.yaml"
    path.write_text(yaml.safe_dump(shrunk(base, name=name, **rules).to_dict()))
    return path


def grpo_trainer(config, out, *, resume=False, suite=None, specs=None, eval_specs=None, progress=False, **run):
    """A GRPO Trainer over its job context (harnessrl.kernel.enter) with objects in place of the
    names its config gives: the `suite`, the trained harness `specs` and the held-out `eval_specs`;
    `model`: a ModelChoice in place of the kernel's."""
    import dataclasses

    from harnessrl.kernel import enter
    from harnessrl.train.trainer import Trainer, TrainError

    given = {"suite": suite, "harnesses": specs, "eval_harnesses": eval_specs}
    objects = {field: value for field, value in given.items() if value is not None}
    model = run.pop("model", None)
    ctx = enter("train grpo", config, out, resume=resume, error=TrainError, objects=objects, progress=progress, **run)
    return Trainer(ctx if model is None else dataclasses.replace(ctx, models={"--model": model}))
