"""Preflight: the first request each harness would send the model, measured against the model's
context before anything runs (`harnessrl preflight`, and `eval` / `train grpo` by default).

For each harness, on the first task:

- a loop harness's first request is built as its episode builds it (system prompt with the tool
  block in its protocol, demonstrations, the task) without any model call;
- an external agent is run as an episode runs it (the same sandbox, environment variables and
  recording endpoint) until its first model call; a stand-in for the model (`FirstRequest`)
  keeps that request, its tools already shown in the spec's `tool_protocol` as a local model
  gets them, and fails it, so the program is stopped. The route it used is its dialect.

The request is rendered through the model's chat template and counted with its tokenizer, and
compared with its context (`max_position_embeddings`): `fits`, `tight` (a reply of the
harness's max_new_tokens would be cut: fewer tokens are left), `too big` (the prompt alone does
not fit: the endpoint refuses it, the engine cannot run it). The report names the request's parts
(tool definitions, system prompt, messages, the template's markup) and the largest tool
definitions, and says what to trim. A model served elsewhere (`openai:`) renders its prompts on
its own server: its requests are captured and sized in characters, their tokens `unknown`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from harnessrl.errors import JobError
from harnessrl.harness.external import ExternalEpisode, Turn
from harnessrl.harness.recording import RecordingEndpoint
from harnessrl.harness.spec import AnyHarnessSpec, ExternalHarnessSpec, HarnessSpec
from harnessrl.models.base import GenerationRequest, Policy, PolicyError, SamplingParams
from harnessrl.models.prompt_model import PromptModel, prompt_model, served_elsewhere
from harnessrl.tasks.sandbox_needs import TreeUse
from harnessrl.types import Message, ModelCall, ToolSchema
from harnessrl.wire.chat import ChatCompletionRequest

if TYPE_CHECKING:
    from fastapi import FastAPI

    from harnessrl.tasks.base import Task

Verdict = Literal["fits", "tight", "too big", "unknown", "no request"]
WAIT_S = 120.0  # how long an agent program gets to make its first model call
TOP_TOOLS = 3  # the largest tool definitions named in a report
# the route of a model call on the recording endpoint -> the API it speaks
_DIALECTS = (
    ("/chat/completions", "chat"),
    ("/responses", "responses"),
    ("/messages/count_tokens", ""),  # counting, not a model call
    ("/messages", "messages"),
    (":generateContent", "gemini"),
    (":streamGenerateContent", "gemini"),
)


class PromptPart(BaseModel):
    """One part of a first request and its size (tokens, or characters where tokens are unknown)."""

    model_config = ConfigDict(extra="forbid")

    part: str
    size: int


class PreflightReport(BaseModel):
    """The first request of one harness for one model (see the module docstring). Sizes are in
    tokens of the model's tokenizer, or in characters when `unit` says so (a model served
    elsewhere)."""

    model_config = ConfigDict(extra="forbid")

    harness: str
    kind: Literal["loop", "external"]
    model: str
    task: str
    dialect: str  # chat, responses, messages or gemini (an agent program); "-" for a loop harness
    tool_format: str  # the protocol the tools are shown and parsed in (its `native` variant: the template's)
    unit: Literal["tokens", "characters"]
    context: int | None  # the model's (None: not known here)
    verdict: Verdict
    # the rest is None (empty) when no request was captured
    tools: int = 0
    prompt: int | None = None  # the whole rendered request
    system: int | None = None  # the system prompt, its tool block left out
    tool_definitions: int | None = None
    max_new_tokens: int | None = None
    left: int | None = None  # context - prompt
    parts: list[PromptPart] = []  # largest first
    largest_tools: list[PromptPart] = []
    advice: str = ""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ----------------------------------------------------------------------------- the first request


@dataclass
class Captured:
    """A first request as the model would get it, and what it is made of."""

    request: GenerationRequest
    tools: list[ToolSchema]
    tool_block: str  # the tools as the request shows them in its system prompt ("" when not there)
    dialect: str
    tool_format: str


def first_loop_request(spec: HarnessSpec, task: Task) -> Captured:
    """The first request of a loop harness's episode of `task` (its environment set up and closed)."""
    from harnessrl.harness.loops import Episode

    episode = Episode(task, spec, attempt=0)
    try:
        request = episode.request()
    finally:
        episode.env.close()
    block = episode.protocol.render_tools(episode.schemas)
    system = request.messages[0].content if request.messages and request.messages[0].role == "system" else ""
    native = spec.protocol.native_tools
    return Captured(
        request=request,
        tools=list(episode.schemas),
        tool_block=block if block and block in system else "",
        dialect="-",
        tool_format=f"{spec.protocol.format} (native)" if native else spec.protocol.format,
    )


class FirstRequest(Policy):
    """Stands for the model in an agent's preflight episode: keeps the first request the program
    sends (and which route it came by) and fails it, so the episode ends and the program is
    stopped. No context is enforced here (a request too big for the model is still measured);
    `prompt_ids` answers the Messages API's count_tokens with the model's own count."""

    native_tool_calls = False

    def __init__(self, model: PromptModel):
        self.name = model.name
        self.measure = model
        self.requests: list[GenerationRequest] = []
        self.tools: dict[int, list[ToolSchema]] = {}  # id of an admitted request -> the agent's tools
        if model.tokenizer is not None:
            self.prompt_ids = model.prompt_ids

    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None) -> Future[ModelCall]:
        self.requests.append(request)
        future: Future[ModelCall] = Future()
        future.set_exception(PolicyError("preflight: the first request is measured, not answered"))
        return future

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        raise PolicyError("preflight: requests are measured, not answered")


class _ToolsNoted(ExternalEpisode):
    """An agent's episode that tells its FirstRequest the tools of each request it admits."""

    def admit(self, body: ChatCompletionRequest) -> Turn:
        turn = super().admit(body)
        if isinstance(self.policy, FirstRequest):
            self.policy.tools[id(turn.request)] = turn.tools
        return turn


class _RoutesNoted(RecordingEndpoint):
    """The recording endpoint, noting the path of every request it gets in `paths` (a subclass
    names the list): the route of a model call is its dialect."""

    paths: list[str]

    def _app(self) -> FastAPI:
        from starlette.requests import Request

        app = super()._app()

        @app.middleware("http")
        async def note(request: Request, call_next: Any) -> Any:
            self.paths.append(request.url.path)
            return await call_next(request)

        return app


def _dialect(paths: list[str]) -> str:
    for path in paths:
        for suffix, name in _DIALECTS:
            if path.endswith(suffix):
                if name:
                    return name
                break
    return "?"


def first_agent_request(
    spec: ExternalHarnessSpec, task: Task, model: PromptModel, wait_s: float = WAIT_S
) -> Captured | str:
    """Run the agent program on `task` as an episode until its first model call (at most
    `wait_s`, or its own wall clock); the request, or why there is none."""
    from harnessrl.harness.external import ExternalEpisodes
    from harnessrl.rollout import Job

    paths: list[str] = []

    class Noted(_RoutesNoted):
        pass

    Noted.paths = paths

    class Episodes(ExternalEpisodes):
        endpoint_class = Noted
        episode_class = _ToolsNoted

    standin = FirstRequest(model)
    episodes = Episodes(lambda latency, call: None)
    stop = threading.Event()
    timer = threading.Timer(wait_s, stop.set)
    timer.daemon = True
    timer.start()
    try:
        trajectory = episodes.play(Job(task, spec, 0), standin, SamplingParams(), stop)
    finally:
        timer.cancel()
        episodes.close()
    if not standin.requests:
        if trajectory is None:
            return f"the agent made no model call within {wait_s:g} s"
        if trajectory.is_infra_error:
            return f"the agent did not run: {trajectory.infra_error}"
        return f"the agent made no model call: {trajectory.termination_detail}"
    from harnessrl.harness.protocols import get_protocol

    request = standin.requests[0]
    tools = standin.tools.get(id(request), [])
    block = get_protocol(spec.tool_protocol, lenient=True).render_tools(tools) if tools else ""
    system = request.messages[0].content if request.messages and request.messages[0].role == "system" else ""
    return Captured(
        request=request,
        tools=tools,
        tool_block=block if block and block in system else "",
        dialect=_dialect(paths),
        tool_format=spec.tool_protocol,
    )


# ------------------------------------------------------------------------- what the sandbox must give

# The limits an agent program runs under while what it needs is measured: far out of its way.
ROOMY_LIMITS = {"file_size_mb": 4096, "memory_mb": 1_048_576, "processes": 4096, "disk_mb": 8192}


@dataclass
class SandboxNeeds:
    """What an agent program took of the sandbox to make its first model call (`harnessrl
    preflight --needs`): its peaks (tasks/sandbox_needs.TreeUse) and how long the call took to come."""

    harness: str
    note: str  # "" when it made its first call; else why it did not
    seconds: float
    use: TreeUse


def sandbox_needs(spec: ExternalHarnessSpec, task: Task, model: PromptModel, wait_s: float = WAIT_S) -> SandboxNeeds:
    """Run the agent program to its first model call as the preflight does, its sandbox limits
    raised to ROOMY_LIMITS, while the host samples its process tree and HOME (one program at a
    time: every sandbox of this process is counted). The peaks are what its own limits must allow."""
    from harnessrl.tasks.sandbox_needs import TreeWatch

    roomy = spec.model_copy(update={"limits": spec.limits.model_copy(update=ROOMY_LIMITS)})
    watch = TreeWatch()
    watch.start()
    t0 = time.monotonic()
    try:
        captured = first_agent_request(roomy, task, model, wait_s)
    finally:
        use = watch.stop()
    return SandboxNeeds(spec.name, captured if isinstance(captured, str) else "", time.monotonic() - t0, use)


# -------------------------------------------------------------------------------------- measuring


def measure(spec: AnyHarnessSpec, task: Task, model: PromptModel, captured: Captured | str) -> PreflightReport:
    """The report of one harness's first request (or of why there is none)."""
    kind: Literal["loop", "external"] = "external" if isinstance(spec, ExternalHarnessSpec) else "loop"
    common: dict[str, Any] = {"harness": spec.name, "kind": kind, "model": model.name, "task": task.id}
    common.update(unit=model.unit, context=model.context)
    if isinstance(captured, str):
        tool_format = spec.tool_protocol if isinstance(spec, ExternalHarnessSpec) else spec.protocol.format
        return PreflightReport(
            **common,
            dialect="?",
            tool_format=tool_format,
            verdict="no request",
            note=captured,
            advice=no_request_fix(captured),
        )
    request = captured.request
    if model.tokenizer is not None:
        prompt = len(model.prompt_ids(request))
    else:
        prompt = sum(len(m.content) for m in request.messages)  # (the tool block is in the system prompt)
    system_text = request.messages[0].content if request.messages and request.messages[0].role == "system" else ""
    block = model.size(captured.tool_block) if captured.tool_block else 0
    system = max(0, model.size(system_text) - block) if system_text else 0
    if not captured.tool_block and captured.tools and model.tokenizer is not None:
        # tools shown by the chat template itself: what they add to the rendering
        block = max(0, prompt - len(model.prompt_ids(request.model_copy(update={"tools": None}))))
    rest = [m for m in request.messages if m.role != "system"]
    messages = sum(model.size(m.content) for m in rest)
    parts = [
        PromptPart(part=f"tool definitions ({len(captured.tools)} tools)", size=block),
        PromptPart(part="system prompt", size=system),
        PromptPart(part=_messages_part(rest, kind == "loop"), size=messages),
    ]
    if model.tokenizer is not None:
        parts.append(PromptPart(part="chat template markup", size=max(0, prompt - block - system - messages)))
    parts = sorted((p for p in parts if p.size), key=lambda p: -p.size)
    largest = _largest_tools(spec, captured.tools, model)
    left = None if model.context is None or model.tokenizer is None else model.context - prompt
    max_new = request.max_new_tokens
    verdict: Verdict = "unknown" if left is None else "too big" if left <= 0 else "tight" if left < max_new else "fits"
    report = PreflightReport(
        **common,
        dialect=captured.dialect,
        tool_format=captured.tool_format,
        verdict=verdict,
        tools=len(captured.tools),
        prompt=prompt,
        system=system,
        tool_definitions=block,
        max_new_tokens=max_new,
        left=left,
        parts=parts,
        largest_tools=largest,
    )
    report.advice = advice(report, spec)
    if model.tokenizer is None:
        report.note = f"{model.name} renders its prompts on its own server: sizes are characters, tokens unknown here"
    return report


def _messages_part(messages: list[Message], loop: bool) -> str:
    if loop and sum(m.role == "user" for m in messages) > 1:  # its demonstrations come before the task
        return f"messages ({len(messages)}: demonstrations and the task)"
    return f"messages ({len(messages)}: the task)" if len(messages) == 1 else f"messages ({len(messages)})"


def _largest_tools(spec: AnyHarnessSpec, tools: list[ToolSchema], model: PromptModel) -> list[PromptPart]:
    from harnessrl.harness.protocols import get_protocol

    name = spec.tool_protocol if isinstance(spec, ExternalHarnessSpec) else spec.protocol.format
    protocol = get_protocol(name, lenient=True)
    sized = [PromptPart(part=t.name, size=model.size(protocol.render_tools([t]))) for t in tools]
    return sorted(sized, key=lambda p: -p.size)[:TOP_TOOLS]


def advice(report: PreflightReport, spec: AnyHarnessSpec) -> str:
    """What to trim, for a request that does not leave room for a whole reply ("" when it does)."""
    if report.verdict not in ("tight", "too big") or report.prompt is None or report.context is None:
        return ""
    assert report.max_new_tokens is not None and report.left is not None
    external = isinstance(spec, ExternalHarnessSpec)
    short = report.max_new_tokens - report.left
    lines = [
        f"the prompt takes {report.prompt:,} of the model's {report.context:,} tokens: "
        + (
            "it does not fit at all"
            if report.verdict == "too big"
            else f"{report.left:,} are left for a reply of up to {report.max_new_tokens:,}"
        )
        + f"; {short:,} tokens must go for a whole reply"
    ]
    for part in report.parts:
        if part.part.startswith("tool definitions"):
            tools = ", ".join(f"{t.part} ({t.size:,})" for t in report.largest_tools)
            where = (
                "in the agent's own settings or command line"
                if external
                else "(the harness's helper tools, the suite's shell)"
            )
            lines.append(f"limit the tools {where}: {part.part} take {part.size:,} tokens; the largest: {tools}")
        elif part.part == "system prompt":
            whose = (
                "the agent's system prompt (its settings, memory and instruction files)"
                if external
                else "the spec's system_prompt or bootstrap files"
            )
            lines.append(f"shorten {whose}: {part.size:,} tokens")
        elif part.part.startswith("messages") and "demonstrations" in part.part:
            lines.append(f"show fewer demonstrations (rules.demonstrations): {part.part} take {part.size:,} tokens")
    limit = "limits.max_new_tokens" if external else "rules.max_new_tokens"
    if report.verdict == "tight":
        lines.append(f"or lower {limit} ({report.max_new_tokens:,}) below {report.left:,}")
    lines.append("or use a model with a longer context")
    return "; ".join(lines)


def preflight(
    specs: list[AnyHarnessSpec],
    task: Task,
    model: PromptModel,
    *,
    wait_s: float = WAIT_S,
    on_report: Callable[[PreflightReport], None] | None = None,
) -> list[PreflightReport]:
    """The report of every harness's first request of `task` for `model`, in `specs` order
    (`on_report(report)` is told of each as it is made)."""
    reports = []
    for spec in specs:
        if isinstance(spec, ExternalHarnessSpec):
            captured: Captured | str = first_agent_request(spec, task, model, wait_s)
        else:
            captured = first_loop_request(spec, task)
        report = measure(spec, task, model, captured)
        if on_report is not None:
            on_report(report)
        reports.append(report)
    return reports


def refusal(reports: list[PreflightReport], skip: str = "--no-preflight") -> str | None:
    """Why a run must not start, or None: a harness whose first request does not fit the model,
    or an agent program that could not make its first request at all (every episode of it would
    be an infrastructure error: nothing of the model's would be measured). `skip`: how the caller
    runs it anyway."""
    too_big = [r for r in reports if r.verdict == "too big"]
    unmeasured = [r for r in reports if r.verdict == "no request"]
    if not too_big and not unmeasured:
        return None
    lines = [
        f"harness {r.harness}: its first request ({r.prompt:,} tokens of {r.task}) does not fit "
        f"{r.model}'s context of {r.context:,} tokens; {r.advice}"
        for r in too_big
    ]
    lines += [
        f"harness {r.harness}: no first request measured on {r.task}: {r.note}; so every episode of it would be "
        f"an infrastructure error and nothing of the model's measured. Fix: {r.advice}"
        for r in unmeasured
    ]
    anyway = []
    if too_big:
        anyway.append("every such request is refused")
    if unmeasured:
        anyway.append("an agent that makes no model call is an infrastructure error, retried per --retries")
    return "\n".join(lines) + f"\n({skip} runs it anyway: {'; '.join(anyway)})"


# the words of a reason that name the cause, and what to do about it (the first that matches)
_NO_REQUEST_FIXES = (
    (
        ("limits.",),
        "raise the limit the reason names in the spec's `limits` (docs/external-harness.md, 'Sandbox limits "
        "before the first call')",
    ),
    (
        ("cannot start the agent program",),
        "the sandbox could not start the program: see its message (a path it cannot show, bubblewrap's refusal)",
    ),
    (
        ("exit code 127", "not found", "No such file or directory"),
        "the program was not found in the sandbox: name an interpreter on the sandbox's PATH or an absolute path "
        "in `command`, and list the program's folder under `read_only` (docs/external-harness.md, 'What the agent "
        "sees')",
    ),
    (
        ("exit code 126", "Permission denied"),
        "the program could not be run: make it executable and readable by others, or run it through its "
        "interpreter (`command: [sh, agent.sh]`)",
    ),
    (
        (" got 4",),
        "the endpoint refused the agent's first request (the message says why): point the agent at "
        "OPENAI_BASE_URL in a dialect it serves (chat, responses, messages, gemini) and send what it accepts",
    ),
    (
        ("within",),
        "the program made no model call in time: check that it reads its task and calls OPENAI_BASE_URL at once "
        "(no prompt for input, no network it does not have), or raise limits.wall_s",
    ),
)


def no_request_fix(note: str) -> str:
    """What to do about an agent program that made no first request, by its reason (`note`)."""
    for words, fix in _NO_REQUEST_FIXES:
        if any(w in note for w in words):
            return fix
    return (
        "run the program by hand with the contract's environment (docs/external-harness.md, 'The contract'), "
        "see why it stops before its first request (its exit status and stderr are in the reason), and fix its "
        "command, settings or spec"
    )


class PreflightRefused(JobError):
    """A harness's first request does not fit the model, or an agent program could not make its
    first request: the run must not start."""


def check_before_run(
    model: str | PromptModel,
    specs: list[AnyHarnessSpec],
    task: Task,
    log: Callable[[str], None],
    *,
    wait_s: float = WAIT_S,
    skip: str = "--no-preflight",
) -> list[PreflightReport]:
    """What `eval`, `train grpo` and the TRL integration run first: every harness's first request
    of `task` measured for a local model (a spec, or the PromptModel of a model already loaded),
    one line each through `log` (with the advice where it is tight); raises PreflightRefused where
    one does not fit, or where an agent program made no first request (not found, crashed, its
    first request refused, a limit or a hang before it: each of its episodes would be an
    infrastructure error). A model served elsewhere is not checked (its server renders the
    prompts), nor is the oracle (no model); a loop harness's first request is always built.
    `skip`: how the caller's user runs it anyway, named in the refusal."""
    if isinstance(model, str):
        if served_elsewhere(model):
            return []
        model = prompt_model(model)

    def say(r: PreflightReport) -> None:
        if r.prompt is None:
            log(f"preflight: {r.harness}: no first request measured ({r.note})")
            return
        log(f"preflight: {r.harness}: {summary_line(r)}")
        if r.verdict == "tight":
            log(f"preflight: {r.harness}: warning: {r.advice}")

    reports = preflight(specs, task, model, wait_s=wait_s, on_report=say)
    why = refusal(reports, skip)
    if why is not None:
        raise PreflightRefused(why)
    return reports


def summary_line(r: PreflightReport) -> str:
    """`7,672 of 8,192 tokens, 520 left (max_new_tokens 1,024): tight`, for one report."""
    if r.prompt is None:
        return f"no request: {r.note}"
    unit = r.unit
    if r.context is None or r.left is None:
        return f"{r.prompt:,} {unit}, context unknown: {r.verdict}"
    return f"{r.prompt:,} of {r.context:,} {unit}, {r.left:,} left (max_new_tokens {r.max_new_tokens:,}): {r.verdict}"
