"""External harnesses: an agent program of its own runs the episode, and every model call it
makes through the run's recording endpoint is a step of the trajectory.

A harness spec with `kind: external` (ExternalHarnessSpec) names a command. For each episode:

1. the task's environment is set up as for any harness (its workspace, its files);
2. the episode opens its route on the run's recording endpoint (harness/recording.py, started the
   first time an external episode runs, stopped when the run ends) under an unguessable token;
3. the command runs through `run_sandboxed` with the workspace writable (at the task's mount
   point, where it has one), a control folder holding the task file and the answer file, a
   network namespace of its own whose 127.0.0.1:PORT is relayed to the endpoint's Unix socket
   (tasks/sandbox_net.py: the endpoint and nothing else of the host or beyond; `network: host`
   in the spec keeps the host's network instead), and the environment variables of the contract
   (OPENAI_BASE_URL, HARNESSRL_TASK_FILE, ...);
4. each request of the agent is checked against the limits, turned into a GenerationRequest (its
   `tools` rendered into the prompt through `tool_protocol` for a local model, passed natively to
   an `openai:` model; where it carries back a reply the endpoint handed out, with that call's
   sampled token ids as its `sampled_prefix`: harness/sampled_turns.py), submitted to the run's
   policy with the episode's own per-call seed, and
   recorded as a Step: the ModelCall with its token ids and logprobs, the tool calls parsed from
   the completion (unknown tools and arguments that do not match the agent's own schemas are
   recorded as blocked calls), and, once the agent sends them back in a later request, the
   results of those calls;
   Requests the endpoint refuses (an unknown route, a malformed body, a request past a limit) are
   kept in the trajectory's `refused_requests` (route, method, status, message);
5. when the program ends, the answer file (if any) is the answer, the task's grader grades the
   final environment, and the program's exit status, stdout and stderr (capped) go into the
   trajectory's meta under "agent".

Outcomes (termination): `submitted` (the answer file exists when the program ends on its own),
`exited` (it ended without one, whatever its exit status), `timeout` (past `limits.wall_s`),
`max_steps` / `max_tokens` (a request past `limits.max_model_calls` / `limits.max_total_tokens`:
refused, and the program is stopped), and `error` where nothing of the model's is to be scored:
the model backend failed, the sandbox could not start the program, the grader crashed, or the
program made no model call at all (not found, refused at its first request, crashed or killed by
a limit before it; the reason names the first request the endpoint refused, if any, e.g. "the
agent's POST /v1/foo got 404 (route not served: ...)"): retried like any infrastructure error.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from typing import Protocol as Interface

from harnessrl.harness.agent_view import NoAgentPython, agent_private_paths, agent_python, host_paths
from harnessrl.harness.loops import check_tool_call, episode_id, short_traceback
from harnessrl.harness.mcp_tools import TaskToolServer, find_call, served_tools
from harnessrl.harness.prompt_tools import PromptTools, reply_message
from harnessrl.harness.protocols import Protocol, get_protocol
from harnessrl.harness.recording import RecordingEndpoint
from harnessrl.harness.sampled_turns import Match, SampledTurns
from harnessrl.harness.spec import PYTHON_PLACEHOLDER, AnyHarnessSpec, ExternalHarnessSpec
from harnessrl.models.base import GenerationRequest, Policy, SamplingParams, request_seed
from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment
from harnessrl.tasks.sandbox_exec import ExecLimits, ExecResult, run_sandboxed
from harnessrl.tasks.sandbox_limits import not_started, sandbox_limit
from harnessrl.tasks.sandbox_net import socket_path
from harnessrl.types import (
    ActionKind,
    ModelCall,
    RefusedRequest,
    Step,
    Termination,
    ToolCall,
    ToolResult,
    ToolSchema,
    Trajectory,
)
from harnessrl.wire.chat import (
    ChatCompletionRequest,
    ServeError,
    check_stop_token_ids,
    content_text,
    to_generation,
    tool_schemas,
)

if TYPE_CHECKING:
    from harnessrl.tasks.base import Task

TASK_FILE = "task.md"
ANSWER_FILE = "answer.txt"
MAX_ANSWER_BYTES = 100_000  # what is read of the answer file
STDERR_TAIL_CHARS = 300  # of stderr, in the termination detail of a program that failed
_CALL_ID = re.compile(r"^call_(\d+)_(\d+)$")  # the ids of the tool calls this endpoint hands out
# the same id with its non-alphanumerics dropped, as some agents rewrite every tool call id they
# replay (OpenClaw's "strict" mode: call_0_1 comes back as call01)
_STRIPPED_CALL_ID = re.compile(r"^call(\d{2,})$")
_STOP_POLL_S = 0.2  # how often a running program looks whether the run was interrupted
MAX_REFUSED_RECORDED = 100  # refused requests kept per episode (a program may loop on one)
REFUSAL_DETAIL_CHARS = 200  # of the first refusal's message, in the termination detail
MAX_TOOL_CALLS_RECORDED = 200  # task tool calls over MCP kept in the meta per episode


class ExternalJob(Interface):
    """What an external episode needs of the runner's job (rollout.Job, whose harness the runner
    has checked is external)."""

    task: Task
    attempt: int
    retries: int

    @property
    def harness(self) -> AnyHarnessSpec: ...


def external_spec(job: ExternalJob) -> ExternalHarnessSpec:
    """The job's harness, which the runner hands here only when it is an agent program."""
    spec = job.harness
    if not isinstance(spec, ExternalHarnessSpec):
        raise TypeError(f"harness {spec.name!r} is a loop harness, not an agent program")
    return spec


# ------------------------------------------------------------------------------- one episode


@dataclass
class Turn:
    """One admitted request: what goes to the policy, and what parsing its reply needs."""

    index: int  # the episode's call index (its step index and its seed's turn)
    request: GenerationRequest
    tools: list[ToolSchema]
    match: Match = field(default_factory=Match)  # the earlier reply it continues from (harness/sampled_turns.py)


@dataclass
class _Recorded:
    step: Step
    results: dict[int, ToolResult] = field(default_factory=dict)  # call position -> its result


class ExternalEpisode:
    """What the recording endpoint knows of one running episode, and what it records; every
    method may be called from several threads at once (an agent may send requests in parallel)."""

    def __init__(
        self,
        job: ExternalJob,
        policy: Policy,
        sampling: SamplingParams,
        count: Callable[[float, ModelCall | None], None],
    ):
        spec = external_spec(job)
        self.job = job
        self.spec = spec
        self.limits = spec.limits
        self.policy = policy
        self.sampling = sampling
        self.model_name = getattr(policy, "name", "model")
        self._count = count
        self.token = secrets.token_urlsafe(24)
        # a backend with function calling (an openai: model) takes the agent's tools natively, and
        # its tool calls come back as data
        self.native = spec.native_tools and policy.native_tool_calls
        self.protocol: Protocol = get_protocol("json" if self.native else spec.tool_protocol, lenient=True)
        self.prompt_tools = PromptTools(self.protocol, native=self.native)  # shared with `harnessrl serve`
        self.kill = threading.Event()  # set: the program is stopped (a limit, a backend failure)
        self._lock = threading.Lock()
        self._recorded: dict[int, _Recorded] = {}
        self.sampled = SampledTurns()  # the replies handed out, to continue from their sampled tokens
        self.calls = 0  # requests admitted
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.termination: Termination | None = None  # set by a limit or a backend failure
        self.detail = ""
        self.infra_error: str | None = None
        self.refusals: list[RefusedRequest] = []  # the first MAX_REFUSED_RECORDED
        self.refused_total = 0
        self.tool_server: TaskToolServer | None = None  # the task's tools over MCP, where it serves any
        self.tool_calls: list[dict[str, Any]] = []  # the calls of them, in order (the first MAX_TOOL_CALLS_RECORDED)
        self.tool_calls_total = 0

    # -- requests (called by the endpoint) ------------------------------------------------------------
    def admit(self, body: ChatCompletionRequest) -> Turn:
        """Check one request against the limits and turn it into the policy's request. ServeError:
        400 for a request that cannot be served, 429 / 400 for a limit (the episode then ends with
        that termination and the program is stopped)."""
        request, tools, match = self._request(body)
        self._check_prompt(request)
        self._note_results(body)
        with self._lock:
            if self.termination is not None:
                raise ServeError(429 if self.termination == Termination.max_steps else 400, self.detail)
            if self.calls >= self.limits.max_model_calls:
                self._end(
                    Termination.max_steps,
                    f"the agent asked for more than {self.limits.max_model_calls} model calls (limits.max_model_calls)",
                )
                raise ServeError(429, f"{self.detail}; no more requests are answered")
            budget = self.limits.max_total_tokens
            if budget is not None and self.completion_tokens >= budget:
                self._end(
                    Termination.max_tokens,
                    f"{self.completion_tokens} completion tokens used of {budget} (limits.max_total_tokens)",
                )
                raise ServeError(400, f"{self.detail}; no more requests are answered")
            max_new = min(request.max_new_tokens, self.limits.max_new_tokens)
            if budget is not None:
                max_new = max(1, min(max_new, budget - self.completion_tokens))
            index = self.calls
            self.calls += 1
        seed = request_seed(self.sampling.seed, self.job.task.id, self.job.attempt, index)
        request = request.model_copy(update={"max_new_tokens": max_new, "seed": seed})
        return Turn(index=index, request=request, tools=tools, match=match)

    def _request(self, body: ChatCompletionRequest) -> tuple[GenerationRequest, list[ToolSchema], Match]:
        """The policy's request for `body` (its tools shown as the episode shows them, continuing
        from the sampled tokens of the last earlier reply it carries back), the tools, and the match."""
        tools = tool_schemas(body)
        # the run's sampling applies, not the request's
        request, _ = to_generation(body, self.limits.max_new_tokens, tools=True)
        embeddings = getattr(getattr(self.policy, "model", None), "get_input_embeddings", None)
        if request.stop_token_ids and callable(embeddings):
            # the agent's mistake is a 400 to it: the engine's refusal would be a backend failure,
            # an infrastructure error the agent could raise at will to have an episode not scored
            check_stop_token_ids(request.stop_token_ids, embeddings().num_embeddings)
        shown = self.prompt_tools.with_tools(request, tools)
        match = self.sampled.match(request.messages, shown.messages, shown.tools)
        return shown.model_copy(update={"sampled_prefix": match.prefix}), tools, match

    def count_tokens(self, body: ChatCompletionRequest) -> int:
        """The prompt tokens `body` would take (the Messages API's count_tokens): nothing is
        admitted, counted against the limits or recorded."""
        prompt = self._check_prompt(self._request(body)[0])
        if prompt is None:
            raise ServeError(400, "count_tokens: this episode's model renders its prompt on its own server, not here")
        return len(prompt)

    def _check_prompt(self, request: GenerationRequest) -> list[int] | None:
        """A local model renders the prompt here first: messages its chat template cannot render,
        or a prompt past its context, are the agent's failure (400), not the backend's. Returns
        the prompt's ids (None: the policy renders it elsewhere)."""
        render = getattr(self.policy, "prompt_ids", None)
        if render is None:
            return None
        try:
            prompt = render(request)
        except Exception as exc:  # noqa: BLE001 - the template could not render these messages
            raise ServeError(
                400, f"cannot render the messages with the chat template: {type(exc).__name__}: {exc}", param="messages"
            ) from None
        config = getattr(getattr(self.policy, "model", None), "config", None)
        context = getattr(config, "max_position_embeddings", None)
        if isinstance(context, int) and len(prompt) >= context:
            raise ServeError(
                400,
                f"This model's maximum context length is {context} tokens; the messages take {len(prompt)}.",
                param="messages",
            )
        return prompt

    def _note_results(self, body: ChatCompletionRequest) -> None:
        """The results of earlier tool calls, as the agent sends them back in `tool` messages."""
        for i, m in enumerate(body.messages):
            if m.role != "tool":
                continue
            found = self._call_position(m.tool_call_id or "")
            if found is None:
                continue
            index, position = found
            with self._lock:
                rec = self._recorded.get(index)
                if rec is None or position >= len(rec.step.tool_calls) or position in rec.results:
                    continue
                name = rec.step.tool_calls[position].name
                rec.results[position] = ToolResult(name=name, output=content_text(m, i))

    def _call_position(self, call_id: str) -> tuple[int, int] | None:
        """(call index, position of the tool call in it) named by a tool message's id: ours as
        handed out, or with its underscores dropped when that names one recorded call only (the
        digits split at one place between a recorded call and a tool call it made; a split with a
        leading zero is not how we write numbers)."""
        found = _CALL_ID.match(call_id)
        if found is not None:
            return int(found.group(1)), int(found.group(2))
        found = _STRIPPED_CALL_ID.match(call_id)
        if found is None:
            return None
        digits = found.group(1)
        with self._lock:
            made = {index: len(rec.step.tool_calls) for index, rec in self._recorded.items()}
        candidates = [
            (int(digits[:j]), int(digits[j:]))
            for j in range(1, len(digits))
            if str(int(digits[:j])) == digits[:j] and str(int(digits[j:])) == digits[j:]
        ]
        candidates = [(index, position) for index, position in candidates if position < made.get(index, 0)]
        return candidates[0] if len(candidates) == 1 else None

    def record(self, turn: Turn, call: ModelCall, latency: float) -> dict:
        """Record the reply as a step; returns the response's assistant message (with `tool_calls`
        when the reply made calls, as data or in the protocol's text, in a request that offered tools)."""
        self._count(latency, call)
        step = Step(index=turn.index, model_call=call, action=ActionKind.text)
        message: dict = {"role": "assistant", "content": call.text}
        blocked: dict[int, ToolResult] = {}
        if not call.text.strip() and not call.tool_calls and call.tool_call_error is None:
            step.action = ActionKind.empty
        elif turn.tools:
            parsed = self.prompt_tools.parse(call, turn.tools)
            if parsed.error:
                step.action, step.parse_error = ActionKind.malformed, parsed.error
            elif parsed.calls:
                step.action, step.tool_calls = ActionKind.tool_calls, parsed.calls
                message = reply_message(parsed, [f"call_{turn.index}_{k}" for k in range(len(parsed.calls))]) or message
                for k, tc in enumerate(parsed.calls):
                    refusal = check_tool_call(tc, turn.tools, listed_as="the agent offers")[2]
                    if refusal is not None:
                        blocked[k] = refusal
        self.sampled.record(turn.index, turn.match, call, message)
        with self._lock:
            self._recorded[turn.index] = _Recorded(step=step, results=blocked)
            self.prompt_tokens += call.prompt_tokens
            self.completion_tokens += call.completion_tokens
        return message

    def backend_failed(self, message: str, latency: float) -> None:
        """The policy could not answer: our side failed, so the episode is an infrastructure error."""
        self._count(latency, None)
        with self._lock:
            self.infra_error = f"model backend failed: {message}"
            self._end(Termination.error, "model backend failed")

    def refused(self, method: str, route: str, status: int, message: str) -> None:
        """The endpoint refused one of the agent's requests: kept in the trajectory, and the
        first one is named in the termination detail of an episode it explains."""
        with self._lock:
            self.refused_total += 1
            if len(self.refusals) < MAX_REFUSED_RECORDED:
                self.refusals.append(
                    RefusedRequest(method=method, route=route, status=status, message=message, after_calls=self.calls)
                )

    def tool_called(self, call: ToolCall, result: ToolResult) -> None:
        """A task tool the agent called over MCP ran, or was refused: its result is the result of
        the model's call it carries out (`find_call`: the first recorded call still without one
        that names the tool), where one does, and the call is kept for the meta either way."""
        with self._lock:
            open_calls = [
                (index, k, made)
                for index, rec in sorted(self._recorded.items())
                for k, made in enumerate(rec.step.tool_calls)
                if k not in rec.results
            ]
            found = find_call(open_calls, call.name, call.arguments)
            if found is not None:
                self._recorded[found[0]].results[found[1]] = result
            if len(self.tool_calls) < MAX_TOOL_CALLS_RECORDED:
                self.tool_calls.append(
                    {
                        "call": call.model_dump(),
                        "result": result.model_dump(exclude_none=True),
                        "step": None if found is None else found[0],
                        "position": None if found is None else found[1],
                    }
                )
            self.tool_calls_total += 1

    def tool_crashed(self, message: str) -> None:
        """A task tool crashed on our side: the episode is an infrastructure error."""
        with self._lock:
            self.infra_error = message
            self._end(Termination.error, "a task tool crashed")

    def _end(self, termination: Termination, detail: str) -> None:
        """(under the lock) The episode ends here: the program is stopped."""
        if self.termination is None:
            self.termination, self.detail = termination, detail
        self.kill.set()

    def steps(self) -> list[Step]:
        """The recorded steps in call order, each with the results the agent sent back for its
        calls: those of its first calls, up to the first call whose result never came."""
        with self._lock:
            out = []
            for index in sorted(self._recorded):
                rec = self._recorded[index]
                step = rec.step.model_copy(deep=False)
                results = []
                for k in range(len(step.tool_calls)):
                    if k not in rec.results:
                        break
                    results.append(rec.results[k])
                step.tool_results = results
                out.append(step)
            return out


# ------------------------------------------------------------------------------- the run's side


class ExternalEpisodes:
    """Plays the external episodes of one `Runner.run`: the recording endpoint is started by the
    first one and stopped by `close()` (at the end of the run)."""

    # what serves and what records the episodes (preflight's own note the route and tools of a request)
    endpoint_class: type[RecordingEndpoint] = RecordingEndpoint
    episode_class: type[ExternalEpisode] = ExternalEpisode

    def __init__(self, count: Callable[[float, ModelCall | None], None]):
        self.count = count
        self._endpoint: RecordingEndpoint | None = None
        self._lock = threading.Lock()
        self._closed = False

    def endpoint(self) -> RecordingEndpoint:
        with self._lock:
            if self._closed:
                raise RuntimeError("the run has ended")
            if self._endpoint is None:
                endpoint = self.endpoint_class(unix_path=socket_path(f"recording-{secrets.token_hex(6)}.sock"))
                endpoint.start()
                self._endpoint = endpoint
            return self._endpoint

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._endpoint is not None:
                self._endpoint.stop()
                self._endpoint = None

    def play(
        self, job: ExternalJob, policy: Policy, sampling: SamplingParams, stop: threading.Event
    ) -> Trajectory | None:
        """One episode answered by `policy`, in the calling (worker) thread; None when the run
        was interrupted."""
        started, t0 = time.time(), time.monotonic()
        record = _Record(job, started, t0)
        try:
            env = job.task.make_env()
        except Exception as e:
            return record.infra(f"environment setup failed: {short_traceback(e)}")
        episode = self.episode_class(job, policy, sampling, self.count)
        tools = served_tools(job.task, external_spec(job).mcp_tools)
        if tools:
            episode.tool_server = TaskToolServer(tools, env, episode.tool_called, episode.tool_crashed)
        control = Path(tempfile.mkdtemp(prefix="harnessrl-agent-"))
        control.chmod(0o711)  # the sandbox user must reach a workspace made inside it
        try:
            try:
                endpoint = self.endpoint()
            except Exception as e:  # noqa: BLE001 - our side failed: this episode's infrastructure error
                return record.infra(f"the recording endpoint did not start: {type(e).__name__}: {e}", env)
            endpoint.register(episode)
            try:
                result = self._run_program(job, env, episode, endpoint, control, stop)
            finally:
                endpoint.unregister(episode)  # nothing more is answered or recorded
                if episode.tool_server is not None:
                    episode.tool_server.close()  # a call still running ends before grading
            if stop.is_set():
                env.close()
                return None
            if isinstance(result, str):
                return record.infra(result, env)
            return record.finish(env, episode, result, control)
        finally:
            shutil.rmtree(control, ignore_errors=True)

    def _run_program(
        self,
        job: ExternalJob,
        env: Environment,
        episode: ExternalEpisode,
        endpoint: RecordingEndpoint,
        control: Path,
        stop: threading.Event,
    ) -> ExecResult | str:
        """Run the agent program to its end; the ExecResult, or why it could not be started."""
        spec = external_spec(job)
        url = endpoint.url(episode)
        forward = endpoint.forward()
        (control / TASK_FILE).write_text(job.task.instruction, encoding="utf-8")
        (control / "home").mkdir()
        if env.workspace is not None:
            workdir = env.workspace.root
        else:  # a task without a workspace: the program still gets a folder of its own to work in
            workdir = control / "workspace"
            workdir.mkdir()
        inside = env.workspace_mount or str(workdir)
        argv = spec.argv()
        try:
            shown = host_paths(argv, spec.read_only, agent_private_paths(job.task))
        except ValueError as e:
            return f"cannot start the agent program: {e}"
        extra: dict[str, str] = {}
        if PYTHON_PLACEHOLDER in argv:
            try:
                python, extra = agent_python()
            except NoAgentPython as e:
                return str(e)
            argv = [python if w == PYTHON_PLACEHOLDER else w for w in argv]
        variables = agent_environment(
            spec,
            extra,
            control=control,
            inside=inside,
            url=url,
            model=episode.model_name,
            task_id=job.task.id,
            attempt=job.attempt,
            mcp_url=endpoint.mcp_url(episode) if episode.tool_server is not None else None,
        )
        limits = agent_limits(spec)
        done = threading.Event()

        def watch_run() -> None:  # Ctrl-C of the run stops the program too
            while not done.wait(_STOP_POLL_S):
                if stop.is_set():
                    episode.kill.set()
                    return

        watcher = threading.Thread(target=watch_run, name="external-watch", daemon=True)
        watcher.start()
        try:
            return run_sandboxed(
                argv,
                workdir=workdir,
                mounts={inside: workdir, str(control): control},
                env=variables,
                limits=limits,
                network=spec.network == "host",
                forward=[forward] if forward is not None else [],
                cwd_in_sandbox=inside,
                stop=episode.kill,
                read_only=shown.read_only,
                hidden=shown.hidden,
            )
        except (ValueError, OSError) as e:  # the sandbox cannot run it here (a mount point, bwrap's refusal, no uid)
            return f"cannot start the agent program: {e}"
        finally:
            done.set()


def agent_environment(
    spec: ExternalHarnessSpec,
    extra: dict[str, str],
    *,
    control: Path,
    inside: str,
    url: str,
    model: str,
    task_id: str,
    attempt: int,
    mcp_url: str | None = None,
) -> dict[str, str]:
    """The environment variables of the contract (docs/external-harness.md) for a program the
    spec starts: its own `env`, `extra` (what `{python}` needs), and the episode's (the endpoint's
    `url`, the control folder's files, the workspace `inside` the sandbox, and `mcp_url` where
    the episode serves its task's tools over MCP)."""
    variables = {
        **spec.env,
        **extra,
        "HOME": str(control / "home"),
        "OPENAI_BASE_URL": url,
        "OPENAI_API_KEY": "EMPTY",
        "OPENAI_MODEL": model,
        "HARNESSRL_TASK_FILE": str(control / TASK_FILE),
        "HARNESSRL_TASK_ID": task_id,
        "HARNESSRL_ATTEMPT": str(attempt),
        "HARNESSRL_WORKSPACE": inside,
        "HARNESSRL_ANSWER_FILE": str(control / ANSWER_FILE),
        "HARNESSRL_MAX_MODEL_CALLS": str(spec.limits.max_model_calls),
    }
    if mcp_url is not None:
        variables["HARNESSRL_MCP_URL"] = mcp_url
    if "PYTHONPATH" in spec.env and "PYTHONPATH" in extra:
        variables["PYTHONPATH"] = os.pathsep.join([spec.env["PYTHONPATH"], extra["PYTHONPATH"]])
    return variables


def agent_limits(spec: ExternalHarnessSpec, wall_s: float | None = None) -> ExecLimits:
    """The sandbox limits of the spec's program (`wall_s`: a shorter wall clock)."""
    lim = spec.limits
    return ExecLimits(
        wall_s=lim.wall_s if wall_s is None else min(lim.wall_s, wall_s),
        cpu_s=lim.cpu_s,
        memory_mb=lim.memory_mb,
        file_size_mb=lim.file_size_mb,
        processes=lim.processes,
        disk_mb=lim.disk_mb,
        output_bytes=lim.output_bytes,
    )


@dataclass
class _Record:
    """Builds the trajectory of one external episode."""

    job: ExternalJob
    started: float
    t0: float

    def _trajectory(self, **fields) -> Trajectory:
        t, spec = self.job.task, self.job.harness
        wall = round(time.monotonic() - self.t0, 4)
        return Trajectory(
            episode_id=episode_id(t.id, spec.name, self.job.attempt),
            task_id=t.id,
            suite=t.suite,
            family=t.family,
            split=t.split,
            harness=spec.name,
            attempt=self.job.attempt,
            instruction=t.instruction,
            retries=self.job.retries,
            started_at=self.started,
            duration_s=wall,
            own_s=wall,  # everything the program did is the episode's own
            **fields,
        )

    def infra(self, error: str, env: Environment | None = None) -> Trajectory:
        if env is not None:
            env.close()
        return self._trajectory(
            termination=Termination.error, termination_detail="infrastructure error", infra_error=error
        )

    def finish(self, env: Environment, episode: ExternalEpisode, result: ExecResult, control: Path) -> Trajectory:
        steps = episode.steps()
        meta: dict[str, Any] = {
            "required_observations": self.job.task.required_observations,
            "agent": _agent_meta(result, external_spec(self.job).network),
        }
        if steps:  # how many calls continued the sampled tokens of earlier replies, and the prefix breaks
            meta["sampled_turns"] = episode.sampled.summary([(s.index, s.model_call) for s in steps])
        if episode.refused_total > len(episode.refusals):
            meta["refused_requests_total"] = episode.refused_total
        if episode.tool_server is not None:
            served = [t.name for t in episode.tool_server.tools]
            meta["mcp"] = {"tools": served, "calls": episode.tool_calls, "calls_total": episode.tool_calls_total}
        answer, answer_refused = _read_answer(control)
        if answer_refused:
            meta["answer_file"] = answer_refused
        called = episode.calls > 0 or bool(steps)  # a request admitted to the model, answered or not
        termination, detail = _outcome(episode, result, answer, called)
        if answer_refused and termination == Termination.exited:
            detail = f"{detail}; {answer_refused}"
        infra_error = episode.infra_error
        if not called and termination != Termination.error:
            # no request reached the model: nothing of it is in this episode to score, whatever the
            # program left (a missing program, a refused first request, a crash or a limit before
            # it): an infrastructure error with the reason, retried, never a 0 in the mean
            termination, infra_error = Termination.error, _unserved_route(episode) or detail
            detail = "infrastructure error"
        grade = None
        try:
            if termination != Termination.error:
                if termination == Termination.submitted:
                    env.submitted, env.answer = True, answer
                try:
                    grade = self.job.task.grade(env)
                except Exception as e:
                    termination, detail = Termination.error, "infrastructure error"
                    infra_error, grade = f"grader crashed: {short_traceback(e)}", None
        finally:
            env.close()
        return self._trajectory(
            steps=steps,
            termination=termination,
            termination_detail=detail,
            submitted=termination == Termination.submitted,
            answer=answer if termination == Termination.submitted else None,
            grade=grade,
            infra_error=infra_error,
            prompt_tokens=episode.prompt_tokens,
            completion_tokens=episode.completion_tokens,
            refused_requests=list(episode.refusals),
            meta=meta,
        )


def _read_answer(control: Path) -> tuple[str | None, str]:
    """(the answer file's text, "") or (None, why it was not read): a link, a hard-linked file, a
    FIFO or device left where the answer goes is never followed or opened (the program may have
    pointed it at a host file); at most MAX_ANSWER_BYTES are read."""
    try:
        data = untrusted.read_bytes(control, ANSWER_FILE, MAX_ANSWER_BYTES, truncate=True)
    except untrusted.Refused as e:
        return None, "" if e.reason == "missing" else f"the answer file was not read: {e}"
    except OSError as e:
        return None, f"the answer file could not be read: {e.strerror or e}"
    return data.decode("utf-8", "replace").strip(), ""


def _outcome(episode: ExternalEpisode, result: ExecResult, answer: str | None, called: bool) -> tuple[Termination, str]:
    """(termination, its detail); for a program that made no model call, the detail says why, as
    the reason of the infrastructure error the episode becomes."""
    how = _how_it_ended(result)
    limit = sandbox_limit(result, episode.limits, "limits.")
    if limit:
        how = f"{how}; {limit}"
    if episode.termination is not None:  # a limit or a backend failure stopped it
        return episode.termination, episode.detail
    first = _first_refusal(episode)
    if not called:
        if result.timed_out:
            return Termination.timeout, (
                f"the agent made no model call within limits.wall_s ({result.reason}); raise limits.wall_s "
                f"({episode.limits.wall_s:g} s) in the spec if the program needs longer to start"
            )
        if first:
            return Termination.exited, f"{first}; the agent made no model call ({how})"
        missing = not_started(result, episode.spec.argv()[0])
        return Termination.exited, f"{missing + '; ' if missing else ''}the agent made no model call ({how})"
    if result.timed_out:
        return Termination.timeout, f"the agent ran past limits.wall_s ({result.reason})"
    if answer is not None:
        return Termination.submitted, "" if how == "exit code 0" else how
    return Termination.exited, f"ended without an answer file ({how}){f'; first refused: {first}' if first else ''}"


def _unserved_route(episode: ExternalEpisode) -> str:
    """Why an episode whose agent made no model call is ours to answer for: its first refused
    request asked for a route the endpoint does not serve (another API dialect); "" otherwise."""
    if not episode.refusals or episode.refusals[0].status not in (404, 405):
        return ""
    return (
        f"{_first_refusal(episode)}; the agent made no model call: it speaks an API or route the "
        "recording endpoint does not serve (not the model's failure)"
    )


def _first_refusal(episode: ExternalEpisode) -> str:
    """ "the agent's POST /v1/foo got 404 (route not served: ...)" for its first refused request."""
    if not episode.refusals:
        return ""
    r = episode.refusals[0]
    message = r.message if len(r.message) <= REFUSAL_DETAIL_CHARS else r.message[:REFUSAL_DETAIL_CHARS] + "..."
    return f"the agent's {r.method} {r.route} got {r.status} ({message})"


def _how_it_ended(result: ExecResult) -> str:
    parts = [f"exit code {result.returncode}"]
    if result.reason:
        parts.append(result.reason)
    if result.returncode not in (0, None) and result.stderr.strip():
        tail = result.stderr.strip()[-STDERR_TAIL_CHARS:]
        parts.append(f"stderr: {' '.join(tail.split())}")
    return "; ".join(parts)


def _agent_meta(result: ExecResult, network: str) -> dict:
    """The program's side of the episode; `network` is what it had: "sandbox" (a namespace of its
    own, the endpoint only) or "host" (asked by its spec, or without bubblewrap)."""
    return {
        "exit_code": result.returncode,
        "timed_out": result.timed_out,
        "stopped": result.stopped,
        "reason": result.reason,
        "duration_s": round(result.duration_s, 3),
        "isolation": result.isolation,
        "network": network if result.isolation == "bwrap" else "host",
        "output_truncated": result.output_truncated,
        "stdout": result.stdout,
        "stderr": result.stderr,
    }
