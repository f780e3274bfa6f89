"""The runner and the control loops, end to end, with scripted policies of known behaviour
and the tiny random model."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter

import pytest
from helpers import oracle_policy, replies_policy, shrunk

from harnessrl.harness.oracle import Oracle
from harnessrl.harness.registry import builtin_names, load_harness
from harnessrl.metrics import harness_summary
from harnessrl.models.base import SamplingParams, request_seed
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.tasks.base import Suite, Tool
from harnessrl.types import ActionKind, BlockReason, Termination, Trajectory


def run(policy, specs, tasks, attempts=1, **kw):
    runner = Runner(policy, SamplingParams(temperature=0.0), progress=False, **kw)
    return runner.run(make_jobs(tasks, specs, attempts))


@pytest.mark.parametrize("harness", builtin_names())
@pytest.mark.parametrize("suite", ["workspace", "toolcalc", "browse"])
def test_oracle_passes_every_family_through_every_harness(harness, suite, tokenizer):
    """A policy that plays the known solution in the harness's own format gets full marks:
    protocol rendering and parsing, tool dispatch, the loop and the graders all agree."""
    s = get_suite(suite)
    tasks = s.tasks("dev", len(s.family_names()))
    assert {t.family for t in tasks} == set(s.family_names())
    # budgets wide enough for the longest solution: this test is about agreement, not limits
    spec = shrunk(load_harness(harness), max_new_tokens=1024, max_total_tokens=None)
    trajs = run(oracle_policy(tasks, spec, tokenizer), [spec], tasks)
    assert len(trajs) == len(tasks)
    for t in trajs:
        assert t.termination == Termination.submitted, (t.task_id, t.family, t.termination, t.steps[-1].parse_error)
        assert t.grade.score == 1.0 and t.grade.passed, (t.family, t.grade)
        assert t.submitted
        if spec.loop.kind == "plan-execute":
            assert t.steps[0].action == ActionKind.plan
        for step in t.steps:
            mc = step.model_call
            assert len(mc.completion_ids) == len(mc.logprobs) > 0
            assert mc.prompt_ids and mc.messages[0].role == "system"
    m = harness_summary(trajs, 1)
    assert m.mean_score == 1.0 and m.delivery_rate == 1.0


def test_the_oracle_plays_each_episode_from_the_task_it_is_handed(tokenizer):
    """`--model oracle` (harness/oracle.py): the runner hands every episode its task, so tasks
    worded alike, several attempts and a plan-first harness all run side by side and pass."""
    tasks = get_suite("toolcalc").tasks("dev", 3)
    # another task's solution and grader under the first task's very words
    twin = dataclasses.replace(tasks[1], id=tasks[1].id + "-twin", instruction=tasks[0].instruction)
    assert twin.solution != tasks[0].solution
    specs = [
        shrunk(load_harness(n), max_new_tokens=1024, max_total_tokens=None) for n in ("json-tools", "plan-execute")
    ]
    runner = Runner(Oracle(tokenizer), SamplingParams(), max_in_flight=8, progress=False)
    trajs = runner.run(make_jobs([*tasks, twin], specs, 2))
    assert len(trajs) == 16 and runner.stats.infra_errors == 0
    for t in trajs:
        assert t.termination == Termination.submitted and t.grade.passed, (t.task_id, t.harness, t.termination)
    assert Oracle(tokenizer).describe() == {"name": "oracle", "backend": "scripted"}


@pytest.mark.parametrize("suite", ["workspace", "toolcalc"])
def test_tiny_random_model_through_every_harness(suite, tiny_policy):
    """The real batched HF path with garbage output: every episode ends with a recorded reason,
    nothing crashes, every model call keeps its tokens and logprobs."""
    s = get_suite(suite)
    tasks = s.tasks("dev", 2)
    specs = [shrunk(load_harness(n), max_steps=2, max_new_tokens=12) for n in builtin_names()]
    trajs = run(tiny_policy, specs, tasks, attempts=2, max_in_flight=8)
    assert len(trajs) == len(tasks) * len(specs) * 2
    assert {t.harness for t in trajs} == set(builtin_names())
    for t in trajs:
        assert t.termination in {
            Termination.max_steps,
            Termination.submitted,
            Termination.max_tokens,
            Termination.loop_guard,
        }
        assert t.grade is not None and 0.0 <= t.grade.score <= 1.0
        for step in t.steps:
            mc = step.model_call
            assert 0 < len(mc.completion_ids) <= 12
            assert len(mc.logprobs) == len(mc.completion_ids)
            assert all(lp <= 0.0 for lp in mc.logprobs)


def _task(suite="workspace", family=None):
    s = get_suite(suite)
    tasks = s.tasks("dev", 16)
    return next(t for t in tasks if family is None or t.family == family)


def test_sandbox_escape_is_a_blocked_call_with_feedback(tokenizer):
    spec = load_harness("json-tools")
    task = _task()
    replies = [
        '{"tool": "read_file", "arguments": {"path": "../../etc/passwd"}}',
        '{"tool": "write_file", "arguments": {"path": "/tmp/evil.txt", "content": "x"}}',
        '{"tool": "no_such_tool", "arguments": {}}',
        '{"tool": "read_file", "arguments": {"path": 42}}',
        '{"tool": "submit", "arguments": {}}',
    ]
    (t,) = run(replies_policy(replies, tokenizer), [spec], [task])
    blocked = [s.tool_results[0].blocked for s in t.steps[:4]]
    assert blocked == [
        BlockReason.sandbox,
        BlockReason.sandbox,
        BlockReason.unknown_tool,
        BlockReason.invalid_arguments,
    ]
    assert all(s.interventions[0].kind == "blocked_feedback" for s in t.steps[:4])
    # the model is told why, in the next prompt
    assert "leaves the workspace" in t.steps[1].model_call.messages[-1].content
    assert t.termination == Termination.submitted


def test_malformed_and_empty_replies_get_feedback_with_the_format(tokenizer):
    spec = load_harness("react")
    task = _task("toolcalc")
    (t,) = run(
        replies_policy(
            ["I think the answer is 4", "   ", "Action: add\nAction Input: {oops", "Action: submit\nAction Input: {}"],
            tokenizer,
        ),
        [spec],
        [task],
    )
    assert [s.action for s in t.steps] == [
        ActionKind.malformed,
        ActionKind.empty,
        ActionKind.malformed,
        ActionKind.tool_calls,
    ]
    assert t.steps[0].parse_error == "no tool call found in the reply"
    assert "Action Input:" in t.steps[1].model_call.messages[-1].content  # format reminder shown
    assert t.termination == Termination.submitted


def test_plain_text_answer_rule_submits_prose(tokenizer):
    spec = shrunk(load_harness("json-tools"), plain_text_answer=True)
    task = _task("toolcalc")
    (t,) = run(replies_policy(["The answer is 5"], tokenizer), [spec], [task])
    assert t.steps[0].action == ActionKind.text and t.submitted and t.answer == "The answer is 5"


def test_loop_guard_warns_then_stops(tokenizer):
    task = _task()
    same = '```python\nlist_dir(path=".")\n```'
    warn = shrunk(load_harness("code-act"), loop_guard={"enabled": True, "repeats": 3, "action": "warn"}, max_steps=5)
    (t,) = run(replies_policy([same], tokenizer), [warn], [task])
    assert t.termination == Termination.max_steps
    kinds = [[i.kind for i in s.interventions] for s in t.steps]
    assert kinds[1] == [] and "loop_guard" in kinds[2]
    assert "repeating" in t.steps[3].model_call.messages[-1].content
    stop = shrunk(load_harness("code-act"), max_steps=10)  # built-in code-act stops
    (t,) = run(replies_policy([same], tokenizer), [stop], [task])
    assert t.termination == Termination.loop_guard and len(t.steps) == 3


def test_budget_notice_and_max_steps(tokenizer):
    spec = shrunk(load_harness("react"), max_steps=4, loop_guard={"enabled": False})
    task = _task()
    (t,) = run(replies_policy(['Action: list_dir\nAction Input: {"path": "."}'], tokenizer), [spec], [task])
    assert t.termination == Termination.max_steps and len(t.steps) == 4
    notices = [i for s in t.steps for i in s.interventions if i.kind == "budget_notice"]
    assert [n.message.split()[1] for n in notices] == ["2", "1"]


def test_history_window_keeps_last_exchanges(tokenizer):
    spec = shrunk(load_harness("json-tools"), history_window=2, demonstrations=[], max_steps=6)
    task = _task()
    (t,) = run(replies_policy(['{"tool": "list_dir", "arguments": {}}'], tokenizer), [spec], [task])
    n_msgs = [len(s.model_call.messages) for s in t.steps]
    assert n_msgs == [2, 4, 6, 6, 6, 6]  # system + task, then at most 2 exchanges


def test_observation_window_elides_old_tool_results_and_composes_with_history_window(tokenizer):
    task = _task()
    reply = '{"tool": "list_dir", "arguments": {"path": "."}}'
    spec = shrunk(load_harness("json-tools"), observation_window=2, demonstrations=[], max_steps=5)
    (t,) = run(replies_policy([reply], tokenizer), [spec], [task])
    last = t.steps[-1].model_call.messages
    assert [m.role for m in last[2:]] == ["assistant", "tool"] * 4  # every reply stays
    tools = [m.content for m in last if m.role == "tool"]
    assert tools[:2] == ['[observation elided: list_dir path="."]'] * 2
    assert all(m.startswith("Result of list_dir:") for m in tools[2:])
    # with a history window of 3 exchanges, the oldest kept one is elided, the last two are not
    both = shrunk(spec, history_window=3)
    (t,) = run(replies_policy([reply], tokenizer), [both], [task])
    tools = [m.content for m in t.steps[-1].model_call.messages if m.role == "tool"]
    assert len(tools) == 3 and tools[0].startswith("[observation elided") and "elided" not in tools[1] + tools[2]
    # feedback for a malformed reply is not a tool observation: it is neither counted nor elided
    mixed = shrunk(spec, observation_window=1)
    (t,) = run(replies_policy([reply, "no call here", reply, reply], tokenizer), [mixed], [task])
    kept = [(m.role, m.content[:24]) for m in t.steps[-1].model_call.messages[2:] if m.role != "assistant"]
    assert [r for r, _ in kept] == ["tool", "user", "tool", "tool"]
    assert kept[0][1].startswith("[observation elided") and kept[2][1].startswith("[observation elided")
    assert kept[1][1].startswith("Your reply could not") and kept[3][1].startswith("Result of list_dir")


def test_max_tokens_and_timeout(tokenizer):
    task = _task()
    spec = shrunk(load_harness("json-tools"), max_total_tokens=40, max_steps=50)
    (t,) = run(replies_policy(['{"tool": "list_dir", "arguments": {"path": "."}}'], tokenizer), [spec], [task])
    assert t.termination == Termination.max_tokens and t.completion_tokens >= 40
    spec = shrunk(load_harness("json-tools"), timeout_s=0.001, max_steps=50)
    import time

    def slow(messages):
        time.sleep(0.01)
        return '{"tool": "list_dir", "arguments": {}}'

    from harnessrl.models.scripted import ScriptedPolicy

    (t,) = run(ScriptedPolicy(slow, tokenizer=tokenizer), [spec], [task])
    assert t.termination == Termination.timeout


class _CrashSuite(Suite):
    """A suite whose tool or grader crashes: infrastructure errors, not model failures."""

    name = "crash"
    needs_workspace = False
    split_sizes = {"train": 1, "dev": 2, "test": 1}

    def __init__(self, crash_tool_times=99, crash_grader=False):
        super().__init__()
        self.calls = 0
        self.crash_tool_times = crash_tool_times
        self.crash_grader = crash_grader

    def families(self):
        def fam(rng):
            n = rng.randint(0, 10**9)

            def check(env):
                if self.crash_grader:
                    raise KeyError("grader bug")
                return {"done": float(env.submitted)}

            return {
                "instruction": f"call boom then submit ({n})",
                "setup": lambda env: None,
                "check": check,
                "solution": [],
            }

        return {"only": fam}

    def base_tools(self):
        def boom(env):
            self.calls += 1
            if self.calls <= self.crash_tool_times:
                raise ZeroDivisionError("tool bug")
            return "ok"

        return [Tool("boom", "crashes", {"type": "object", "properties": {}}, boom)]


def test_tool_crash_is_retried_then_recorded_as_infra(tokenizer):
    spec = load_harness("json-tools")
    from harnessrl.models.scripted import ScriptedPolicy

    # replies by turn within the conversation, so a retried episode starts the script again
    policy = ScriptedPolicy(
        ['{"tool": "boom", "arguments": {}}', '{"tool": "submit", "arguments": {}}'], tokenizer=tokenizer
    )
    suite = _CrashSuite(crash_tool_times=1)
    trajs = run(policy, [spec], suite.tasks("dev", 1), max_retries=2)
    (t,) = trajs  # first try crashed, the retry succeeded
    assert t.termination == Termination.submitted and t.retries == 1
    suite = _CrashSuite(crash_tool_times=99)
    (t,) = run(policy, [spec], suite.tasks("dev", 1), max_retries=2)
    assert t.termination == Termination.error and t.retries == 2 and "ZeroDivisionError" in t.infra_error
    assert suite.calls == 3
    m = harness_summary([t], 1)
    assert m.n_infra_errors == 1 and m.n_episodes == 0


def test_grader_crash_is_infra(tokenizer):
    spec = load_harness("json-tools")
    suite = _CrashSuite(crash_grader=True)
    (t,) = run(
        replies_policy(['{"tool": "submit", "arguments": {}}'], tokenizer), [spec], suite.tasks("dev", 1), max_retries=0
    )
    assert t.termination == Termination.error and "grader crashed" in t.infra_error and t.grade is None


def test_backend_failure_is_infra_and_the_run_goes_on(tokenizer):
    from harnessrl.models.base import PolicyError
    from harnessrl.models.scripted import ScriptedPolicy

    def flaky(messages):
        raise RuntimeError("server down")

    spec = load_harness("json-tools")
    tasks = get_suite("toolcalc").tasks("dev", 2)
    trajs = run(ScriptedPolicy(flaky, tokenizer=tokenizer), [spec], tasks, max_retries=1)
    assert len(trajs) == 2 and all(t.termination == Termination.error for t in trajs)
    assert all("server down" in t.infra_error for t in trajs)
    assert PolicyError


def test_workspace_deleted_after_grading(tokenizer, monkeypatch):
    from harnessrl.tasks import workspace as ws_mod

    roots = []
    orig = ws_mod.Workspace.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        roots.append(self.root)

    monkeypatch.setattr(ws_mod.Workspace, "__init__", spy)
    spec = load_harness("json-tools")
    tasks = get_suite("workspace").tasks("dev", 3)
    run(oracle_policy(tasks, spec, tokenizer), [spec], tasks)
    assert len(roots) == 3 and not any(r.exists() for r in roots)


def test_workspace_agent_memory_tool_and_bootstrap(tokenizer):
    spec = load_harness("workspace-agent")
    task = _task("toolcalc")
    replies = [
        '{"tool": "remember", "arguments": {"note": "try add"}}',
        '{"tool": "submit", "arguments": {"answer": "1"}}',
    ]
    (t,) = run(replies_policy(replies, tokenizer), [spec], [task])
    system = t.steps[1].model_call.messages[0].content
    assert "AGENTS.md" in system and "- try add" in system
    assert t.meta["memory"] == ["try add"]


# ---------------------------------------------------------------------- seeds, time, failures, stats


class _RecordingScript(ScriptedPolicy):
    """A scripted policy that keeps every request it was asked."""

    def __init__(self, script, tokenizer):
        super().__init__(script, tokenizer=tokenizer)
        self.requests = []

    def submit(self, request, sampling=None):
        self.requests.append(request)
        return super().submit(request, sampling)


def test_every_request_carries_its_seed_and_harnesses_share_them(tokenizer):
    json_a = shrunk(load_harness("json-tools"), max_steps=2, demonstrations=[], loop_guard={"enabled": False})
    json_b = json_a.model_copy(update={"name": "json-tools-b"})
    tasks = get_suite("toolcalc").tasks("dev", 2)
    policy = _RecordingScript(['{"tool": "add", "arguments": {"a": 1, "b": 2}}'] * 2, tokenizer)
    runner = Runner(policy, SamplingParams(temperature=1.0, seed=5), progress=False, max_in_flight=3)
    trajs = runner.run(make_jobs(tasks, [json_a, json_b], 2))
    assert all(len(t.steps) == 2 for t in trajs)
    seen = Counter(r.seed for r in policy.requests)
    # one seed per (task, attempt, turn), the same under both harnesses (common random numbers)
    assert seen == {request_seed(5, t.id, a, turn): 2 for t in tasks for a in range(2) for turn in range(2)}


def _sleep(env, seconds):
    time.sleep(seconds)
    return "worked"


def _slow_suite(work=_sleep, grade_s=0.0):
    class SlowSuite(Suite):
        """Tasks whose one tool, `work`, sleeps as long as it is asked to."""

        name = "slow"
        needs_workspace = False
        split_sizes = {"train": 1, "dev": 6, "test": 1}

        def families(self):
            def fam(rng):
                n = rng.randint(0, 10**9)
                return {
                    "instruction": f"work, then submit ({n})",
                    "setup": lambda env: None,
                    "check": check,
                    "solution": [],
                }

            def check(env):
                time.sleep(grade_s)
                return {"done": float(env.submitted)}

            return {"only": fam}

        def base_tools(self):
            params = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}
            return [Tool("work", "works for a while", params, work)]

    return SlowSuite()


def test_a_slow_tool_holds_up_its_own_episode_only(tokenizer, tmp_path):
    """One episode's tool sleeps 3 s: the others advance meanwhile and finish long before it,
    none of them times out, and only the slow one runs over its own-time limit."""
    tasks = _slow_suite().tasks("dev", 4)
    slow_instruction = tasks[0].instruction

    def script(messages):
        turn = sum(m.role == "assistant" for m in messages)
        if any(m.content == slow_instruction for m in messages):
            return '{"tool": "work", "arguments": {"seconds": 3.0}}'
        if turn < 4:
            return '{"tool": "work", "arguments": {"seconds": 0}}'
        return '{"tool": "submit", "arguments": {}}'

    spec = shrunk(
        load_harness("json-tools"), timeout_s=2.0, max_steps=8, demonstrations=[], loop_guard={"enabled": False}
    )
    recorded: dict[str, float] = {}
    threads: set[int] = set()
    with RunStore(tmp_path / "run") as store:

        def on_episode(t: Trajectory) -> None:
            recorded[t.task_id] = time.monotonic() - t0
            threads.add(threading.get_ident())
            store.add(t)  # sqlite: this connection may only be used by the thread that made it

        runner = Runner(
            ScriptedPolicy(script, tokenizer=tokenizer),
            SamplingParams(temperature=0.0),
            progress=False,
            max_in_flight=4,
            on_episode=on_episode,
        )
        t0 = time.monotonic()
        result = runner.run(make_jobs(tasks, [spec], 1))
        assert [t.task_id for t in result] == [t.id for t in tasks]  # job order: the slow one finished last
        trajs = {t.task_id: t for t in result}
        slow = trajs[tasks[0].id]
        assert slow.termination == Termination.timeout and "own time" in slow.termination_detail
        assert slow.own_s > 3.0 and len(slow.steps) == 1
        assert recorded[tasks[0].id] >= 3.0
        for task in tasks[1:]:
            t = trajs[task.id]
            assert t.termination == Termination.submitted and len(t.steps) == 5
            assert t.duration_s < 1.5 and t.own_s <= t.duration_s  # it never waited for the slow tool
            assert recorded[task.id] < 1.5
        assert threads == {threading.get_ident()}  # on_episode ran in the thread that called run()
        # both clocks are kept by the store
        back = {t.task_id: t for t in store.trajectories(with_tokens=False)}
        clocks = {k: (t.own_s, t.duration_s) for k, t in trajs.items()}
        assert {k: (t.own_s, t.duration_s) for k, t in back.items()} == clocks
    # a record written before own time was kept still loads
    old = slow.model_dump(mode="json")
    del old["own_s"]
    assert Trajectory.model_validate(old).own_s == 0.0


def test_own_time_counts_the_episodes_requests_tools_and_grading(tokenizer):
    """With one episode at a time, a queued episode's clocks start when it starts: own time and
    wall time agree; request latency, tools and grading are own time."""
    tasks = _slow_suite(grade_s=0.1).tasks("dev", 2)

    class SlowReplies(ScriptedPolicy):
        def submit(self, request, sampling=None):
            time.sleep(0.2)  # a slow backend: this latency is the episode's own time
            return super().submit(request, sampling)

    def script(messages):
        if sum(m.role == "assistant" for m in messages) == 0:
            return '{"tool": "work", "arguments": {"seconds": 0.3}}'
        return '{"tool": "submit", "arguments": {}}'

    spec = shrunk(load_harness("json-tools"), demonstrations=[], loop_guard={"enabled": False})
    runner = Runner(SlowReplies(script, tokenizer=tokenizer), progress=False, max_in_flight=1)
    trajs = runner.run(make_jobs(tasks, [spec], 1))
    for t in trajs:
        assert t.termination == Termination.submitted
        assert 0.2 * 2 + 0.3 + 0.1 <= t.own_s <= t.duration_s < t.own_s + 0.3  # requests, tool, grading
    assert runner.stats.requests == 4 and runner.stats.model_s >= 0.2 * 4


def test_a_failing_request_fails_only_its_episode(tokenizer):
    tasks = get_suite("toolcalc").tasks("dev", 3)
    asked = Counter()

    def script(messages):
        instruction = next(t.instruction for t in tasks if any(m.content == t.instruction for m in messages))
        asked[instruction] += 1
        if instruction == tasks[0].instruction:
            raise RuntimeError("server cannot serve this one")
        return '{"tool": "submit", "arguments": {"answer": "1"}}'

    spec = shrunk(load_harness("json-tools"), demonstrations=[])
    trajs = {t.task_id: t for t in run(ScriptedPolicy(script, tokenizer=tokenizer), [spec], tasks, max_retries=1)}
    bad = trajs[tasks[0].id]
    assert bad.termination == Termination.error and bad.retries == 1 and "server cannot serve" in bad.infra_error
    assert asked[tasks[0].instruction] == 2
    for task in tasks[1:]:
        t = trajs[task.id]
        assert t.termination == Termination.submitted and t.retries == 0 and asked[task.instruction] == 1


def test_stats_count_one_run_call(tokenizer):
    tasks = get_suite("toolcalc").tasks("dev", 2)
    spec = load_harness("json-tools")
    runner = Runner(replies_policy(['{"tool": "submit", "arguments": {"answer": "1"}}'], tokenizer), progress=False)
    for _ in range(2):
        trajs = runner.run(make_jobs(tasks, [spec], 1))
        assert runner.stats.episodes == 2 and runner.stats.requests == 2
        assert runner.stats.completion_tokens == sum(t.completion_tokens for t in trajs) > 0
        assert runner.stats.wall_s > 0 and runner.stats.tok_s == runner.stats.completion_tokens / runner.stats.wall_s


def _token_ids(trajs: list[Trajectory]) -> dict[tuple[str, str, int], list[list[int]]]:
    return {(t.task_id, t.harness, t.attempt): [s.model_call.completion_ids for s in t.steps] for t in trajs}


def test_episodes_do_not_depend_on_how_many_run_at_once(tiny_policy):
    """Sampled at T=1 through the tiny random model: each request's own seed decides its sample,
    so one episode at a time and eight at once give the same episodes, token for token."""
    tasks = get_suite("toolcalc").tasks("dev", 3)
    specs = [shrunk(load_harness(n), max_steps=3, max_new_tokens=10) for n in ("json-tools", "react")]
    jobs = make_jobs(tasks, specs, 2)
    sampling = SamplingParams(temperature=1.0, seed=11)
    one = Runner(tiny_policy, sampling, progress=False, max_in_flight=1).run(jobs)
    eight = Runner(tiny_policy, sampling, progress=False, max_in_flight=8).run(jobs)
    assert len(one) == len(eight) == 12
    assert _token_ids(one) == _token_ids(eight)
    assert sum(len(s.model_call.completion_ids) for t in one for s in t.steps) > 12 * 3
    # and the seed matters: another run seed samples other tokens
    other = Runner(tiny_policy, sampling.model_copy(update={"seed": 12}), progress=False, max_in_flight=8).run(jobs)
    assert _token_ids(other) != _token_ids(one)


def test_seeded_script_gives_the_same_episodes_at_any_concurrency(tokenizer):
    """A policy whose reply depends on the request's seed only: the order in which replies come
    back (random here: every request is served after a random delay) changes nothing."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    class SeededReplies(ScriptedPolicy):
        def __init__(self):
            super().__init__(self._reply, tokenizer=tokenizer)
            self.pool = ThreadPoolExecutor(8)
            self.seed_of: dict[int, int] = {}

        def _reply(self, messages):
            n = random.Random(self._seed).randint(0, 9)
            if n == 0:
                return '{"tool": "submit", "arguments": {"answer": "0"}}'
            return '{"tool": "add", "arguments": {"a": %d, "b": %d}}' % (n, n * 7)

        def submit(self, request, sampling=None):
            def later():
                time.sleep(random.random() * 0.02)
                with self._lock:
                    self._seed = request.seed
                    return self._complete_one(request)

            return self.pool.submit(later)

    tasks = get_suite("toolcalc").tasks("dev", 4)
    spec = shrunk(load_harness("json-tools"), max_steps=4, demonstrations=[], loop_guard={"enabled": False})
    jobs = make_jobs(tasks, [spec], 3)
    runs = [Runner(SeededReplies(), SamplingParams(seed=3), progress=False, max_in_flight=k).run(jobs) for k in (1, 8)]
    assert _token_ids(runs[0]) == _token_ids(runs[1])
    texts = {s.model_call.text for t in runs[0] for s in t.steps}
    assert len(texts) > 3  # the seeds really vary the replies


@pytest.mark.parametrize(
    ("tool_s", "grace_s", "waited"),
    [(3.0, 10.0, (3.0, 6.0)), (20.0, 1.0, (1.0, 4.0))],
    ids=["tool-returns", "tool-stuck"],
)
def test_ctrl_c_stops_the_run_once_its_episodes_wound_down_and_keeps_what_was_recorded(
    tool_s, grace_s, waited, tokenizer, tmp_path, request, monkeypatch
):
    """SIGINT while an episode sits in a slow tool: run() raises KeyboardInterrupt once that tool
    has returned and the episode's environment is closed (a tool of 3 s), or after the grace
    (STOP_GRACE_S) when it does not return in time; the episodes recorded before are in the
    store, the interrupted one is not, and no episode starts afterwards."""
    import os
    import signal

    from harnessrl import rollout
    from harnessrl.tasks.base import Environment

    # Python's own SIGINT handler, even where this process started with SIGINT ignored (a shell
    # without job control ignores it for the commands it runs in the background)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    monkeypatch.setattr(rollout, "STOP_GRACE_S", grace_s)
    closed: list[int] = []
    close = Environment.close
    monkeypatch.setattr(Environment, "close", lambda env: (closed.append(id(env)), close(env))[1])
    started: list[str] = []
    slow_env: list[int] = []

    def interrupting_work(env, seconds):
        if seconds:
            slow_env.append(id(env))
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while this tool runs
            time.sleep(seconds)
        return "worked"

    tasks = _slow_suite(interrupting_work).tasks("dev", 6)
    slow_instruction = tasks[0].instruction

    class CountingScript(ScriptedPolicy):
        def submit(self, request, sampling=None):
            if sum(m.role == "assistant" for m in request.messages) == 0:
                started.append(next(m.content for m in request.messages if m.role == "user"))
            return super().submit(request, sampling)

    def script(messages):
        if any(m.content == slow_instruction for m in messages):
            return f'{{"tool": "work", "arguments": {{"seconds": {tool_s}}}}}'
        return '{"tool": "submit", "arguments": {}}'

    spec = shrunk(load_harness("json-tools"), demonstrations=[], loop_guard={"enabled": False})
    with RunStore(tmp_path / "run") as store:
        runner = Runner(
            CountingScript(script, tokenizer=tokenizer),
            SamplingParams(temperature=0.0),
            progress=False,
            max_in_flight=2,
            on_episode=store.add,
        )
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            runner.run(make_jobs(tasks, [spec], 1))
        took = time.monotonic() - t0
        assert waited[0] - 0.5 < took < waited[1], took
        # the slow episode's environment is closed once its tool returned, not before
        assert (slow_env[0] in closed) == (tool_s < grace_s)
        stored = {t.task_id for t in store.trajectories(with_tokens=False)}
        n_started = len(started)
        time.sleep(0.5)
        assert len(started) == n_started < 6  # nothing started after the interruption
        assert tasks[0].id not in stored and runner.stats.episodes == len(stored)
