"""Plain data records shared by every part of harnessrl.

Everything here is a pydantic model so a trajectory serialises to JSON and back losslessly
(`Trajectory.model_validate_json(t.model_dump_json()) == t`).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OmitsWhenNone(_Record):
    """A record whose fields named in `_omit_when_none` are left out of its serialised form while
    they are None: here the native tool-call fields, so that what is recorded without native tool
    calls reads exactly as it did before them (results.py: the keys a job adds only when it did
    the thing)."""

    _omit_when_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _serialise(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key in self._omit_when_none:
            if data.get(key, 0) is None:
                del data[key]
        return data


class Message(OmitsWhenNone):
    """One chat message as the model sees it.

    Native tool calls (a backend with function calling, docs/protocols.md "Native tool calls"):
    an assistant message may carry the calls it made as data (`tool_calls`, `content` then holds
    the prose around them), and a tool message the id of the call it answers (`tool_call_id`).
    A backend without function calling never sees either: the harness writes calls and results
    as text in its protocol."""

    _omit_when_none: ClassVar[tuple[str, ...]] = ("tool_calls", "tool_call_id")

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None  # tool name for role == "tool"
    tool_calls: list[ToolCall] | None = None  # role == "assistant": the native calls it made
    tool_call_id: str | None = None  # role == "tool": the id of the native call it answers


class ToolSchema(_Record):
    """What a harness shows the model about one tool."""

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolCall(OmitsWhenNone):
    """One action of a model reply: parsed from its text by a protocol, or returned as data by a
    backend with native function calling."""

    _omit_when_none: ClassVar[tuple[str, ...]] = ("id",)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw: str = ""  # the exact text span the protocol parsed this call from ("" for a native call)
    id: str | None = None  # a native call's id, as the backend named it


class BlockReason(str, Enum):
    unknown_tool = "unknown_tool"
    invalid_arguments = "invalid_arguments"
    sandbox = "sandbox"  # path escape, oversize write, symlink out, ...
    guard = "guard"  # refused by a harness guard


class ToolResult(_Record):
    """What came back from executing one ToolCall."""

    name: str
    output: str  # what the model is shown
    ok: bool = True
    blocked: BlockReason | None = None  # set when the call was refused before or while running
    full_output: str | None = None  # untruncated output when `output` was shortened for the model
    # A helper tool's own calls of the task's tools, in order, up to the first refused or failed
    # one; empty for every other tool.
    inner_calls: list[InnerCall] = Field(default_factory=list)


class InnerCall(_Record):
    """One call a helper tool (capabilities.helper_tools) made, with what came back."""

    call: ToolCall
    result: ToolResult


ToolResult.model_rebuild()
Message.model_rebuild()


class ModelCall(OmitsWhenNone):
    """One generation: token in, token out. Never re-tokenize the text the model produced."""

    _omit_when_none: ClassVar[tuple[str, ...]] = ("tool_calls", "tool_call_error", "sampled_logprobs")

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # log-probability of each sampled completion token: log softmax(logits / T)
    # The log-probability of each token under the distribution it was actually drawn from, where
    # that is not the one above: after penalties, min_p, top_k and top_p, renormalised. None: the
    # token was drawn from log softmax(logits / T) itself (no shaping), so `logprobs` is both.
    sampled_logprobs: list[float] | None = None
    text: str  # decoded completion, special tokens stripped (with native tool calls: the prose around them)
    # Native function calling (a backend that returns tool calls as data: an OpenAI-compatible
    # server's `message.tool_calls`): the calls, in order. None where the backend returned text
    # only (every local model): the harness parses calls out of `text` with its protocol.
    tool_calls: list[ToolCall] | None = None
    # The backend returned tool calls that are not calls (arguments that are not a JSON object):
    # what was wrong, in words for the model. The harness records the reply as malformed.
    tool_call_error: str | None = None
    finish_reason: Literal["stop", "length", "error"] = "stop"
    messages: list[Message] = Field(default_factory=list)  # the rendered conversation (prompt)
    # Token counts reported by a backend that returns no token ids (an OpenAI-compatible server
    # without token ids); None when the ids above are the truth.
    n_prompt_tokens: int | None = None
    n_completion_tokens: int | None = None
    # The policy version that sampled it, where the weights move during a run (GRPO with
    # --rollout-server: the optimizer steps behind the adapter the server held); None elsewhere.
    policy_version: int | None = None
    # Where the call's time went, in seconds (docs/engine.md, "Timings"). None where the backend
    # cannot know (the openai: backend knows the latency only) and in records written before them.
    # They are measurements, not content: equality (`==`) leaves them out, so the same tokens
    # sampled twice are the same call however long each took.
    latency_s: float | None = None  # the policy got the request -> it returned the completion
    queue_s: float | None = None  # submitted to the engine -> first scheduled (taken off its queue)
    prefill_s: float | None = None  # scheduled -> its prompt prefilled and first token sampled
    decode_s: float | None = None  # the wall time of every batched decode step it took part in
    ttft_s: float | None = None  # the policy got the request -> its first completion token

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelCall):
            return NotImplemented
        mine = {k: v for k, v in self.__dict__.items() if k not in CALL_TIMINGS}
        theirs = {k: v for k, v in other.__dict__.items() if k not in CALL_TIMINGS}
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]  # (as every pydantic model: mutable, so unhashable)

    @property
    def completion_tokens(self) -> int:
        return len(self.completion_ids) if self.completion_ids else (self.n_completion_tokens or 0)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids) if self.prompt_ids else (self.n_prompt_tokens or 0)


CALL_TIMINGS = ("latency_s", "queue_s", "prefill_s", "decode_s", "ttft_s")


class Intervention(_Record):
    """A guard or rule of the harness that acted on the episode."""

    kind: Literal[
        "malformed_feedback",
        "blocked_feedback",
        "loop_guard",
        "budget_notice",
        "history_truncated",
        "plan",
        "submit_checkpoint",  # a submit held back once (rules.submit_checkpoint): not the submission
    ]
    message: str = ""


class ActionKind(str, Enum):
    tool_calls = "tool_calls"
    malformed = "malformed"  # the protocol could not parse a call out of the completion
    empty = "empty"  # the model produced nothing (or only whitespace)
    text = "text"  # prose with no call, when the harness treats that as a final answer
    plan = "plan"  # the plan turn of a plan-execute loop


class Step(_Record):
    index: int
    model_call: ModelCall
    action: ActionKind
    tool_calls: list[ToolCall] = Field(default_factory=list)
    parse_error: str | None = None
    tool_results: list[ToolResult] = Field(default_factory=list)
    interventions: list[Intervention] = Field(default_factory=list)


class RefusedRequest(_Record):
    """A request of an external agent program that the recording endpoint refused (an unknown
    route, a malformed body, a request past a limit): what the agent asked and what it was told."""

    method: str
    route: str  # the path under the episode's address, e.g. "/v1/chat/completions"
    status: int  # the HTTP status it was answered with
    message: str
    after_calls: int = 0  # model calls the episode had admitted before it


class Termination(str, Enum):
    submitted = "submitted"
    max_steps = "max_steps"
    max_tokens = "max_tokens"
    timeout = "timeout"
    loop_guard = "loop_guard"
    exited = "exited"  # an external agent program ended on its own without submitting (docs/external-harness.md)
    error = "error"  # infrastructure error (tool/grader/model backend crashed); excluded from metrics


class Grade(_Record):
    score: float  # in [0, 1]
    subscores: dict[str, float] = Field(default_factory=dict)
    passed: bool
    threshold: float = 1.0
    details: dict[str, Any] = Field(default_factory=dict)


class Trajectory(_Record):
    """One attempt of one task through one harness."""

    episode_id: str
    task_id: str
    suite: str
    family: str
    split: str
    harness: str
    attempt: int
    instruction: str
    steps: list[Step] = Field(default_factory=list)
    termination: Termination | None = None
    termination_detail: str = ""
    submitted: bool = False
    answer: str | None = None
    grade: Grade | None = None
    infra_error: str | None = None  # traceback summary when termination == error
    retries: int = 0  # infrastructure retries spent before this record
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started_at: float = 0.0
    duration_s: float = 0.0  # wall clock from start to record, waiting for other episodes included
    # the episode's own time: setup, latency of the model calls that served it, its own tool steps
    # (what rules.timeout_s limits); 0.0 in records written before it was kept
    own_s: float = 0.0
    # external harnesses: the agent's requests the recording endpoint refused, in order (the
    # first MAX_REFUSED_RECORDED of them); empty for every other harness and in older records
    refused_requests: list[RefusedRequest] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_infra_error(self) -> bool:
        return self.termination == Termination.error

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.task_id, self.harness, self.attempt)
