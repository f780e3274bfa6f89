"""Control loops: one episode of one task through one harness, as a step-wise state machine.

The runner owns time and the model; an Episode only answers two questions, over and over:
`request()` (what to ask the model next) and `consume(model_call)` (what the reply does to the
world). Loops:

- `react`: every model call is an action; its observations come back as the next message.
- `plan-execute`: the first model call writes a plan (no tools); the plan stays in the
  conversation for the rest of the episode and the loop then acts like `react`. The plan call
  is recorded as a step of kind `plan` and does not count against `max_steps`.

A reply's tool calls are the backend's own where it returned them as data (native function
calling, `protocol.native_tools` with a backend that has it), else what the protocol parses out
of its text (`read_reply`); native calls stay data in the conversation's history.
Demonstrations are written in the protocol's text either way.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Sequence
from typing import Any, TypeVar

from harnessrl.harness import rules as R
from harnessrl.harness.protocols import Protocol, get_protocol, read_reply
from harnessrl.harness.spec import HarnessSpec
from harnessrl.models.base import GenerationRequest, SampledPrefix
from harnessrl.tasks.base import Environment, Task, Tool, ToolBlocked, ToolFailed, ToolOutput, validate_arguments
from harnessrl.tasks.sandbox_exec import ExecLimits
from harnessrl.tasks.shell import shell_tool
from harnessrl.types import (
    ActionKind,
    BlockReason,
    InnerCall,
    Intervention,
    Message,
    ModelCall,
    Step,
    Termination,
    ToolCall,
    ToolResult,
    ToolSchema,
    Trajectory,
)

MAX_OBSERVATION_CHARS = 4000  # what the model is shown of one tool output
ToolLike = TypeVar("ToolLike", Tool, ToolSchema)  # a tool with its code, or only what the model is shown


class InfraError(Exception):
    """A tool, grader or environment crashed: an infrastructure failure, not the model's."""


def episode_id(task_id: str, harness: str, attempt: int) -> str:
    return "ep-" + hashlib.sha256(f"{task_id}|{harness}|{attempt}".encode()).hexdigest()[:16]


class Episode:
    def __init__(self, task: Task, spec: HarnessSpec, attempt: int, retries: int = 0):
        self.task = task
        self.spec = spec
        self.rules = spec.rules
        self.attempt = attempt
        self.retries = retries
        self.protocol: Protocol = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)
        self.started = time.time()
        self._t0 = time.monotonic()
        self.steps: list[Step] = []
        self.exchanges: list[list[Message]] = []
        self.observation_placeholders: list[str] = []  # one per exchange, for rules.observation_window
        self.memory: list[str] = []
        self.plan: list[Message] = []
        self.ledger: list[str] = []  # capabilities.ledger: one line per tool call so far
        self.checkpoint_done = False  # rules.submit_checkpoint fires once per episode
        self._helper_inner: list[InnerCall] = []  # the calls of the helper tool that ran last
        self._last_messages: list[Message] | None = None  # the messages of the last request (_sampled_prefix)
        self.done = False
        self.termination: Termination | None = None
        self.detail = ""
        self.infra_error: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.tools: list[Tool] = list(task.tools) + self._harness_tools() + self._shell_tools()
        self.schemas = [t.schema for t in self.tools]
        self._format_reminder = self.protocol.format_reminder(self.schemas)
        self.needs_plan = spec.loop.kind == "plan-execute"
        try:
            self.env: Environment = task.make_env()
        except Exception as e:
            raise InfraError(f"environment setup failed: {short_traceback(e)}") from e
        self._intro = self._demonstrations() + [Message(role="user", content=task.instruction)]
        # own time (see elapsed): setting up counts, then model latency of its turns and its own steps
        self.own_s = time.monotonic() - self._t0

    # -- harness-provided tools -------------------------------------------------------------------
    def _harness_tools(self) -> list[Tool]:
        return self._memory_tools() + self._helper_tools()

    def _helper_tools(self) -> list[Tool]:
        """capabilities.helper_tools whose every call names a tool of the task."""
        task_tools = {t.name: t for t in self.task.tools}
        return [
            Tool(h.name, h.description, R.helper_parameters(h), self._helper_fn(h, task_tools))
            for h in self.spec.capabilities.helper_tools
            if all(c.tool in task_tools for c in h.calls)
        ]

    def _helper_fn(self, helper: Any, task_tools: dict[str, Tool]):
        def run(env: Environment, **args: Any) -> str:
            outputs = []
            inner: list[InnerCall] = []
            try:
                for call in helper.calls:
                    tc = ToolCall(name=call.tool, arguments=R.fill_helper_arguments(call.arguments, args))
                    result = self._execute(tc, list(task_tools.values()))
                    inner.append(InnerCall(call=tc, result=result))
                    if result.blocked is not None:
                        raise ToolBlocked(f"{call.tool}: {result.output}", result.blocked.value)
                    if not result.ok:
                        raise ToolFailed(f"{call.tool}: {result.output}")
                    outputs.append(f"[{call.tool}]\n{result.output}")
            finally:
                # set after the inner calls (each _execute clears it); the helper's _execute reads it
                self._helper_inner = inner
            return "\n".join(outputs)

        return run

    def _memory_tools(self) -> list[Tool]:
        if not self.spec.bootstrap.memory_tool:
            return []

        def remember(env: Environment, note: str) -> str:
            if len(self.memory) >= 20:
                raise ToolBlocked("memory is full (20 notes)", "guard")
            self.memory.append(note[:300])
            return "Saved."

        return [
            Tool(
                "remember",
                "Save a short note; saved notes are shown to you at every step.",
                {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]},
                remember,
            )
        ]

    def _shell_tools(self) -> list[Tool]:
        """rules.shell, for a task that offers a shell (a harness knows no suite: the task says)."""
        shell = self.rules.shell
        if not (shell.enabled and self.task.offers_shell):
            return []
        limits = ExecLimits(
            wall_s=shell.wall_s,
            cpu_s=shell.cpu_s,
            memory_mb=shell.memory_mb,
            file_size_mb=shell.file_size_mb,
            processes=shell.processes,
            output_bytes=shell.stored_bytes,
        )
        return [shell_tool(limits, shell.shown_chars)]

    # -- prompt -----------------------------------------------------------------------------------
    def _system_prompt(self) -> str:
        boot = "\n".join(f"## {name}\n{text.rstrip()}" for name, text in self.spec.bootstrap.files.items())
        memory = "\n".join(f"- {m}" for m in self.memory) or "(none yet)"
        prompt = self.spec.system_prompt.format_map(
            {
                "tools": self.protocol.render_tools(self.schemas),
                "max_steps": self.rules.max_steps,
                "bootstrap": boot,
                "memory": memory,
            }
        ).strip()
        extra = R.capability_sections(self.spec.capabilities, self.ledger)
        return prompt + ("\n\n" + extra if extra else "")

    def _demonstrations(self) -> list[Message]:
        available = {t.name for t in self.tools}
        out: list[Message] = []
        for demo in self.rules.demonstrations:
            if not demo.tool_names() <= available:
                continue  # a harness knows no suite: show only demos whose tools this task has
            out.append(Message(role="user", content=demo.instruction))
            for c in demo.calls:
                call = ToolCall(name=c.name, arguments=c.arguments)
                out.append(Message(role="assistant", content=self.protocol.render_call(call, thought=c.thought)))
                if c.name != "submit":
                    res = ToolResult(name=c.name, output=c.result)
                    out.append(Message(role="tool", name=c.name, content=self.protocol.render_result(res)))
        return out

    def messages(self) -> list[Message]:
        msgs = [Message(role="system", content=self._system_prompt()), *self._intro]
        if self.needs_plan:
            msgs.append(Message(role="user", content=self.spec.loop.plan_prompt))
            return msgs
        msgs.extend(self.plan)
        exchanges = R.elide_observations(self.exchanges, self.observation_placeholders, self.rules.observation_window)
        msgs.extend(R.windowed(exchanges, self.rules.history_window))
        return msgs

    def request(self) -> GenerationRequest:
        max_new = self.rules.max_new_tokens
        if self.rules.max_total_tokens is not None:
            max_new = max(1, min(max_new, self.rules.max_total_tokens - self.completion_tokens))
        messages = self.messages()
        prefix = self._sampled_prefix(messages)
        self._last_messages = messages
        return GenerationRequest(
            messages=messages,
            max_new_tokens=max_new,
            stop=[] if self.needs_plan else self.protocol.stop_strings(),
            tools=self.schemas,
            native_tools=self.spec.protocol.native_tools,
            sampled_prefix=prefix,
        )

    def _sampled_prefix(self, messages: list[Message]) -> SampledPrefix | None:
        """The previous call's tokens, where `messages` are the previous request's messages, then
        the assistant's reply to them, then new ones (no history window or elision acted): a
        policy may continue from the tokens as sampled instead of re-rendering the reply's text."""
        last = self._last_messages
        if not self.steps or last is None:
            return None
        call = self.steps[-1].model_call
        n = len(last)
        if not call.completion_ids or not call.prompt_ids or len(messages) <= n + 1 or messages[:n] != last:
            return None
        if messages[n].role != "assistant" or messages[n].tool_calls:
            return None
        return SampledPrefix(ids=[*call.prompt_ids, *call.completion_ids], messages=n + 1)

    # -- acting -----------------------------------------------------------------------------------
    @property
    def acting_steps(self) -> int:
        return sum(1 for s in self.steps if s.action != ActionKind.plan)

    def elapsed(self) -> float:
        """The episode's own time, which rules.timeout_s limits: its setup, the latency of the model
        calls that served it (charged by the runner, `add_model_time`), its own `consume` calls
        (tools) and, once finished, its grading. Time it spent on anything else (waiting for the
        runner to pick up its next turn) is in `wall_s` only."""
        return self.own_s

    def wall_s(self) -> float:
        """Wall-clock time since the episode started, waiting included."""
        return time.monotonic() - self._t0

    def add_model_time(self, seconds: float) -> None:
        self.own_s += seconds

    def terminate(self, reason: Termination, detail: str = "") -> None:
        if not self.done:
            self.done, self.termination, self.detail = True, reason, detail

    def consume(self, call: ModelCall) -> None:
        """Apply one model reply. Raises InfraError when a tool crashes. Its duration is own time."""
        t0 = time.monotonic()
        try:
            self._consume(call)
        finally:
            self.own_s += time.monotonic() - t0

    def _consume(self, call: ModelCall) -> None:
        if self.done:
            raise RuntimeError("episode already finished")
        self.prompt_tokens += call.prompt_tokens
        self.completion_tokens += call.completion_tokens
        index = len(self.steps)
        if self.needs_plan:
            self.needs_plan = False
            self.plan = [
                Message(role="user", content=self.spec.loop.plan_prompt),
                Message(role="assistant", content=call.text.strip() or "(no plan)"),
                Message(role="user", content=self.spec.loop.execute_prompt),
            ]
            self.steps.append(
                Step(
                    index=index,
                    model_call=call,
                    action=ActionKind.plan,
                    interventions=[Intervention(kind="plan", message=call.text.strip())],
                )
            )
            self._check_budgets()
            return

        parsed = read_reply(self.protocol, call, self.schemas)  # native calls as they came, else parsed
        step = Step(index=index, model_call=call, action=ActionKind.tool_calls)
        notes: list[str] = []
        if parsed.empty:
            step.action = ActionKind.empty
            step.parse_error = "empty reply"
            notes.append(self._feedback_malformed(step, "the reply was empty."))
        elif parsed.error:
            step.action = ActionKind.malformed
            step.parse_error = parsed.error
            notes.append(self._feedback_malformed(step, parsed.error))
        elif not parsed.calls:
            if self.rules.plain_text_answer:
                step.action = ActionKind.text
                self.env.submitted, self.env.answer = True, (parsed.thought or call.text).strip()
            else:
                step.action = ActionKind.malformed
                step.parse_error = "no tool call found in the reply"
                notes.append(self._feedback_malformed(step, "no tool call found in the reply."))
        else:
            step.tool_calls = parsed.calls
            for tc in parsed.calls:
                if tc.name == "submit" and self.rules.submit_checkpoint.enabled and not self.checkpoint_done:
                    # held back once: the reminder is the submit's result, the episode goes on
                    self.checkpoint_done = True
                    message = self.rules.submit_checkpoint.message
                    step.tool_results.append(ToolResult(name="submit", output=message))
                    step.interventions.append(Intervention(kind="submit_checkpoint", message=message))
                    break
                result = self._execute(tc)
                step.tool_results.append(result)
                if self.spec.capabilities.ledger.enabled:
                    self.ledger.append(R.ledger_entry(len(self.steps) + 1, tc, result))
                if result.blocked is not None:
                    notes_for = R.blocked_feedback(
                        self.rules,
                        result.output,
                        self._format_reminder,
                        result.blocked == BlockReason.invalid_arguments,
                    )
                    step.interventions.append(Intervention(kind="blocked_feedback", message=notes_for))
                if self.env.submitted:
                    break
        self.steps.append(step)

        if self.env.submitted:
            self.terminate(Termination.submitted)
            return
        if self.rules.loop_guard.enabled and R.repeated_tail(self.steps, self.rules.loop_guard.repeats):
            msg = self.rules.loop_guard.message
            step.interventions.append(Intervention(kind="loop_guard", message=msg))
            if self.rules.loop_guard.action == "stop":
                self.terminate(Termination.loop_guard, f"same action and result {self.rules.loop_guard.repeats} times")
                return
            notes.append(msg)
        if self._check_budgets():
            return
        notice = R.budget_notice(self.rules, self.rules.max_steps - self.acting_steps)
        if notice:
            step.interventions.append(Intervention(kind="budget_notice", message=notice))
            notes.append(notice)
        self._observe(step, call, notes)

    def _check_budgets(self) -> bool:
        if self.acting_steps >= self.rules.max_steps:
            self.terminate(Termination.max_steps, f"{self.rules.max_steps} steps used")
        elif self.rules.max_total_tokens is not None and self.completion_tokens >= self.rules.max_total_tokens:
            self.terminate(Termination.max_tokens, f"{self.completion_tokens} completion tokens used")
        return self.done

    def _feedback_malformed(self, step: Step, reason: str) -> str:
        msg = R.malformed_feedback(self.rules, reason, self._format_reminder)
        step.interventions.append(Intervention(kind="malformed_feedback", message=msg))
        return msg

    def _observe(self, step: Step, call: ModelCall, notes: list[str]) -> None:
        parts = [self.protocol.render_result(r) for r in step.tool_results]
        for iv in step.interventions:
            if iv.kind == "blocked_feedback":
                parts.append(iv.message)
        parts.extend(notes)
        observation = "\n".join(p for p in parts if p) or "(no observation)"
        self.exchanges.append(
            [
                # a reply's native calls stay data in the history (the backend that made them sends them back)
                Message(role="assistant", content=call.text, tool_calls=call.tool_calls or None),
                Message(role="tool" if step.tool_results else "user", content=observation, name=None),
            ]
        )
        self.observation_placeholders.append(R.observation_placeholder(step))

    def _execute(self, tc: ToolCall, tools: list[Tool] | None = None) -> ToolResult:
        tool, args, refusal = check_tool_call(tc, self.tools if tools is None else tools)
        if refusal is not None:
            return refusal
        assert tool is not None  # (check_tool_call refuses a call no tool takes)
        self._helper_inner = []
        result = self._run_tool(tool, tc, args)
        # a helper tool leaves its calls there, whatever their outcome; any other tool leaves it empty
        result.inner_calls, self._helper_inner = self._helper_inner, []
        return result

    def _run_tool(self, tool: Tool, tc: ToolCall, args: dict[str, Any]) -> ToolResult:
        return run_tool(self.env, tool, tc, args)

    # -- end ----------------------------------------------------------------------------------------
    def finish(self) -> Trajectory:
        """Grade (unless an infrastructure error ended the episode), delete the workspace, return the record.
        Grading is own time."""
        grade = None
        t0 = time.monotonic()
        try:
            if self.termination != Termination.error:
                try:
                    grade = self.task.grade(self.env)
                except Exception as e:
                    self.termination = Termination.error
                    self.infra_error = f"grader crashed: {short_traceback(e)}"
        finally:
            self.env.close()
            self.own_s += time.monotonic() - t0
        return self.trajectory(grade)

    def trajectory(self, grade: Any = None) -> Trajectory:
        return Trajectory(
            episode_id=episode_id(self.task.id, self.spec.name, self.attempt),
            task_id=self.task.id,
            suite=self.task.suite,
            family=self.task.family,
            split=self.task.split,
            harness=self.spec.name,
            attempt=self.attempt,
            instruction=self.task.instruction,
            steps=self.steps,
            termination=self.termination,
            termination_detail=self.detail,
            submitted=bool(self.env.submitted),
            answer=self.env.answer,
            grade=grade,
            infra_error=self.infra_error,
            retries=self.retries,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            started_at=self.started,
            duration_s=round(self.wall_s(), 4),
            own_s=round(self.own_s, 4),
            meta={"required_observations": self.task.required_observations, "memory": list(self.memory)},
        )


def check_tool_call(
    call: ToolCall, tools: Sequence[ToolLike], listed_as: str = "available"
) -> tuple[ToolLike | None, dict[str, Any], ToolResult | None]:
    """(the tool of `tools` the call names, its checked arguments, None), or, for a call none of
    them can take (an unknown tool, arguments its schema refuses), the blocked-call record third.
    `listed_as` introduces the tool names in the unknown-tool message."""
    tool = next((t for t in tools if t.name == call.name), None)
    if tool is None:
        reason = BlockReason.unknown_tool
        output = f"unknown tool '{call.name}' ({listed_as}: {', '.join(t.name for t in tools)})"
    else:
        args, error = validate_arguments(tool.parameters, call.arguments)
        if not error:
            return tool, args, None
        reason, output = BlockReason.invalid_arguments, f"invalid arguments for {call.name}: {error}"
    return tool, {}, ToolResult(name=call.name, output=output, ok=False, blocked=reason)


def run_tool(env: Environment, tool: Tool, tc: ToolCall, args: dict[str, Any]) -> ToolResult:
    """Run one checked call of `tool` on `env` (its arguments `args` as check_tool_call returned
    them) and record it in `env.calls`: a refusal (ToolBlocked) is a blocked call, an ordinary
    failure (ToolFailed) a failed one, and any other exception an InfraError. What the model is
    shown of a long output is cut at MAX_OBSERVATION_CHARS; the result keeps it whole. The
    built-in loops and the task tools served over MCP to agent programs (harness/mcp_tools.py)
    run every call through here."""
    try:
        output = tool.fn(env, **args)
    except ToolBlocked as e:
        reason = BlockReason(e.reason) if e.reason in BlockReason.__members__ else BlockReason.sandbox
        return ToolResult(name=tc.name, output=str(e), ok=False, blocked=reason)
    except ToolFailed as e:
        return ToolResult(name=tc.name, output=f"error: {e}", ok=False)
    except Exception as e:
        raise InfraError(f"tool '{tc.name}' crashed: {short_traceback(e)}") from e
    if isinstance(output, ToolOutput):  # the tool chose what the model sees; the store keeps it all
        env.calls.append((tc.name, args, output.full))
        full = None if output.full == output.shown else output.full
        return ToolResult(name=tc.name, output=output.shown, ok=output.ok, full_output=full)
    output = str(output)
    env.calls.append((tc.name, args, output))
    if len(output) > MAX_OBSERVATION_CHARS:
        return ToolResult(
            name=tc.name,
            output=output[:MAX_OBSERVATION_CHARS] + f"\n[... {len(output) - MAX_OBSERVATION_CHARS} more characters]",
            full_output=output,
        )
    return ToolResult(name=tc.name, output=output)


def short_traceback(e: BaseException) -> str:
    """`Type: message (file:line <- file:line)`: an exception and its last two frames (innermost
    first) on one line, as infrastructure errors record it."""
    frames = traceback.extract_tb(e.__traceback__)[-2:]
    where = " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in reversed(frames))
    return f"{type(e).__name__}: {e} ({where})"
