"""The harness spec: everything around a frozen model, as validated data.

A harness is a YAML file that loads into `HarnessSpec` (pydantic), validates with a clear
error (file, field, reason), dumps back to YAML and round-trips. Edits of a harness are diffs
of this spec. `harnessrl harness schema` prints its JSON schema.

Two kinds of harness share the file format. The default (`kind: loop`, or no `kind`) is run by
harnessrl's own control loop (harness/loops.py) and described by `HarnessSpec`. `kind: external`
is an agent program of its own, run in a sandbox against a recording endpoint
(harness/external.py, docs/external-harness.md), and described by `ExternalHarnessSpec`.
"""

from __future__ import annotations

import os
import re
import shlex
import string
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from harnessrl.harness.protocols import ProtocolPluginError, protocol_class, protocol_names

# Placeholders a system prompt template may use.
PROMPT_FIELDS = {
    "tools": "the protocol's tool block: how to call a tool, and every tool with its arguments",
    "max_steps": "the step budget",
    "bootstrap": "workspace bootstrap files (AGENTS.md, MEMORY.md, ...) rendered as sections",
    "memory": "notes saved with the memory tool so far",
}


class SpecError(ValueError):
    """An invalid harness spec: says which file, which field and why."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _list_formats(schema: dict[str, Any]) -> None:
    schema["enum"] = list(protocol_names())


class ProtocolSpec(_Spec):
    # a registered tool-call format, built in or a plugin (harness/protocols/registry.py); the
    # JSON schema lists them
    format: str = Field("json", json_schema_extra=_list_formats)
    lenient: bool = True  # accept near-misses (extra keys, alias names, fences, prose around calls)
    native_tools: bool = False  # json only: use the server's native function calling when it has one

    @field_validator("format", mode="before")
    @classmethod
    def _registered_format(cls, v: Any) -> Any:
        if not isinstance(v, str):
            raise ValueError(f"expected the name of a format, one of: {', '.join(protocol_names())}")
        try:
            protocol_class(v)  # loads a plugin the first time it is named
        except ProtocolPluginError as e:
            raise ValueError(str(e)) from None
        except ValueError:
            raise ValueError(f"unknown format {v!r}; known formats: {', '.join(protocol_names())}") from None
        return v

    @model_validator(mode="after")
    def _native_only_json(self) -> "ProtocolSpec":
        if self.native_tools and self.format != "json":
            raise ValueError("native_tools is only available with format 'json'")
        return self


class LoopSpec(_Spec):
    kind: Literal["react", "plan-execute"] = "react"
    plan_prompt: str = (
        "Before acting, write a short numbered plan (at most 5 steps) for this task. Do not call any tool yet."
    )
    execute_prompt: str = "Now carry out your plan, one tool call at a time."


class DemoCall(_Spec):
    thought: str = ""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str = ""  # what the tool answered (not used for the final submit)


class Demonstration(_Spec):
    """A worked example shown as earlier turns of the conversation, in the harness's own format.

    It is only shown when every tool it uses exists in the task (harnesses know no suite).
    """

    instruction: str
    calls: list[DemoCall] = Field(min_length=1)

    def tool_names(self) -> set[str]:
        return {c.name for c in self.calls}


class FeedbackSpec(_Spec):
    malformed: bool = True  # tell the model its reply could not be parsed
    blocked: bool = True  # tell the model why a call was refused (else a bare "call refused")
    show_format: bool = True  # include the protocol's format reminder in the feedback


class LoopGuardSpec(_Spec):
    enabled: bool = False
    repeats: int = Field(3, ge=2, le=20)  # identical (action, observation) in a row that trigger it
    action: Literal["warn", "stop"] = "warn"
    message: str = "You are repeating the same action with the same result. Try something different or submit."


class BudgetNoticeSpec(_Spec):
    enabled: bool = False
    remaining_steps: int = Field(2, ge=1, le=50)  # start telling the model when this many remain
    message: str = "Note: {remaining} step(s) left. Submit your result before the budget runs out."


class SubmitCheckpointSpec(_Spec):
    """Verify before submit: the first `submit` of an episode is held back once with a reminder."""

    enabled: bool = False
    message: str = (
        "Checkpoint before submitting: check that you read the files your answer depends on and "
        "that every file the task asks for has the exact name and content. Then call submit again."
    )


class ShellSpec(_Spec):
    """The sandboxed `shell(command)` tool and its limits (see docs/suites.md, "Sandboxed shell").

    Offered only when it is enabled here AND the task offers a shell (`Task.offers_shell`).
    """

    enabled: bool = False
    wall_s: float = Field(30.0, gt=0, le=600)  # wall clock per command; the whole process tree is killed
    cpu_s: int = Field(30, ge=1, le=3600)  # CPU seconds per command
    memory_mb: int = Field(1024, ge=64, le=65536)  # address space per process
    file_size_mb: int = Field(64, ge=1, le=4096)  # largest file a command may write
    processes: int = Field(64, ge=4, le=4096)  # processes per command (contains fork bombs)
    shown_chars: int = Field(4000, ge=200, le=100_000)  # what the model sees of one output (head and tail)
    stored_bytes: int = Field(1_000_000, ge=1000, le=100_000_000)  # kept per stream in the run store


class RulesSpec(_Spec):
    max_steps: int = Field(12, ge=1, le=500)
    max_new_tokens: int = Field(256, ge=1, le=32768)
    max_total_tokens: int | None = Field(None, ge=1)  # completion tokens over the whole episode
    timeout_s: float | None = Field(None, gt=0)  # the episode's own time: its model calls + its tools
    history_window: int | None = Field(None, ge=1)  # keep the last N exchanges verbatim; None = all
    # keep the last N tool observations verbatim, older ones become a one-line placeholder; None = all
    observation_window: int | None = Field(None, ge=1)
    plain_text_answer: bool = False  # a reply with no tool call is taken as the final answer
    demonstrations: list[Demonstration] = Field(default_factory=list)
    feedback: FeedbackSpec = Field(default_factory=FeedbackSpec)
    loop_guard: LoopGuardSpec = Field(default_factory=LoopGuardSpec)
    budget_notice: BudgetNoticeSpec = Field(default_factory=BudgetNoticeSpec)
    shell: ShellSpec = Field(default_factory=ShellSpec)  # opt-in sandboxed shell tool
    submit_checkpoint: SubmitCheckpointSpec = Field(default_factory=SubmitCheckpointSpec)


class BootstrapSpec(_Spec):
    """Workspace-agent style bootstrap: files injected into the system prompt, a memory tool."""

    files: dict[str, str] = Field(default_factory=dict)  # name -> content, shown as sections
    memory_tool: bool = False  # offer `remember(note)`; notes appear in {memory}


class LedgerSpec(_Spec):
    """A state ledger: the harness records every tool call and its outcome and shows the list."""

    enabled: bool = False
    max_entries: int = Field(10, ge=1, le=50)  # the most recent entries shown


class HelperCall(_Spec):
    tool: str = Field(min_length=1)  # a tool of the task (never another helper, never submit)
    # string values may name the helper's parameters as {param}; a value that is exactly
    # "{param}" is replaced by the argument itself
    arguments: dict[str, Any] = Field(default_factory=dict)


class HelperToolSpec(_Spec):
    """An extra tool built from the task's own tools: calls them in order, returns all outputs.

    Offered only when every tool it calls exists in the task (harnesses know no suite).
    """

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=40)
    description: str = Field(min_length=1)
    parameters: dict[str, str] = Field(default_factory=dict)  # name -> description; strings, required
    calls: list[HelperCall] = Field(min_length=1, max_length=8)

    @model_validator(mode="after")
    def _well_formed(self) -> "HelperToolSpec":
        if self.name == "submit" or any(c.tool == "submit" for c in self.calls):
            raise ValueError("a helper tool can neither be called submit nor call submit")
        for c in self.calls:
            for v in c.arguments.values():
                if isinstance(v, str):
                    try:
                        used = [f for _, f, _, _ in string.Formatter().parse(v) if f is not None]
                    except ValueError as e:
                        raise ValueError(f"helper '{self.name}': bad template {v!r} ({e})") from None
                    unknown = [f for f in used if f not in self.parameters]
                    if unknown:
                        raise ValueError(f"helper '{self.name}': argument uses unknown parameter '{{{unknown[0]}}}'")
        return self


class CapabilitiesSpec(_Spec):
    """What the harness adds to the model's abilities beyond prompts and guards."""

    ledger: LedgerSpec = Field(default_factory=LedgerSpec)
    # short lessons from earlier failures, shown in the system prompt
    experiences: list[str] = Field(default_factory=list, max_length=20)
    helper_tools: list[HelperToolSpec] = Field(default_factory=list, max_length=8)

    @field_validator("experiences")
    @classmethod
    def _short_lessons(cls, v: list[str]) -> list[str]:
        for lesson in v:
            if not lesson.strip() or len(lesson) > 400:
                raise ValueError("each experience is a non-empty lesson of at most 400 characters")
        return v

    @field_validator("helper_tools")
    @classmethod
    def _unique_helpers(cls, v: list[HelperToolSpec]) -> list[HelperToolSpec]:
        names = [h.name for h in v]
        if len(set(names)) != len(names):
            raise ValueError("helper tool names must be unique")
        return v


class HarnessSpec(_Spec):
    """A harness run by harnessrl's own control loop (`kind: loop`, the default)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    system_prompt: str = Field(min_length=1)
    protocol: ProtocolSpec = Field(default_factory=ProtocolSpec)
    loop: LoopSpec = Field(default_factory=LoopSpec)
    rules: RulesSpec = Field(default_factory=RulesSpec)
    bootstrap: BootstrapSpec = Field(default_factory=BootstrapSpec)
    capabilities: CapabilitiesSpec = Field(default_factory=CapabilitiesSpec)

    @field_validator("system_prompt")
    @classmethod
    def _known_placeholders(cls, v: str) -> str:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(v) if f is not None]
        except ValueError as e:
            raise ValueError(f"bad template ({e}); write literal braces as '{{{{' and '}}}}'") from None
        for f in fields:
            if f not in PROMPT_FIELDS:
                raise ValueError(f"unknown placeholder '{{{f}}}' (known: {', '.join(sorted(PROMPT_FIELDS))})")
        return v

    @property
    def kind(self) -> str:
        return "loop"

    # -- YAML -------------------------------------------------------------------------------------
    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ------------------------------------------------------------------------------------ external


class ExternalLimits(_Spec):
    """What one run of an external agent program may use (see docs/external-harness.md)."""

    wall_s: float = Field(600.0, gt=0, le=86400)  # the program's wall clock; its process tree is killed
    max_model_calls: int = Field(50, ge=1, le=100_000)  # requests past this are refused (termination max_steps)
    max_total_tokens: int | None = Field(None, ge=1)  # completion tokens per episode (termination max_tokens)
    max_new_tokens: int = Field(512, ge=1, le=32768)  # per request: the agent's max_tokens is capped here
    output_bytes: int = Field(100_000, ge=1000, le=100_000_000)  # stdout and stderr kept, each
    cpu_s: int = Field(600, ge=1, le=86400)  # CPU seconds of the program
    memory_mb: int = Field(4096, ge=64, le=1_048_576)  # address space per process
    # largest file it may write: 256 lets every agent program measured start (GitHub Copilot CLI
    # unpacks a 138.5 MB file into its home first; docs/external-harness.md, "Sandbox limits ...")
    file_size_mb: int = Field(256, ge=1, le=4096)
    processes: int = Field(64, ge=4, le=4096)  # processes and threads
    # what it may add to the disk: its /tmp and /dev/shm (two tmpfs holding this much together,
    # under bubblewrap) and its workspace and home, measured twice a second (past it: killed)
    disk_mb: int = Field(1024, ge=1, le=1_048_576)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A word of a command that may name a file next to the spec (no shell syntax in it).
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_.+@%=:,/-]+$")
# Environment variables the episode sets itself; `env` may not set them.
RESERVED_ENV = (
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
    "HARNESSRL_TASK_FILE",
    "HARNESSRL_TASK_ID",
    "HARNESSRL_ATTEMPT",
    "HARNESSRL_WORKSPACE",
    "HARNESSRL_ANSWER_FILE",
    "HARNESSRL_AGENT_DIR",
    "HARNESSRL_MAX_MODEL_CALLS",
    "HARNESSRL_MCP_URL",
)
PYTHON_PLACEHOLDER = "{python}"  # a command word: a Python that has harnessrl's packages (openai)


class ExternalHarnessSpec(_Spec):
    """An agent program of its own (`kind: external`): any language, any loop, speaking OpenAI's
    chat completions to the run's recording endpoint. See docs/external-harness.md."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    kind: Literal["external"] = "external"
    description: str = ""
    # an argv list, or one string run by /bin/sh -c; words naming the program's files next to the
    # spec file (or paths read_only lists) are made absolute when the file is loaded; the word
    # {python} is a Python with harnessrl's packages
    command: list[str] | str
    env: dict[str, str] = Field(default_factory=dict)  # extra environment variables
    # host files and folders the program needs besides its command's own (an installed agent's
    # folder, e.g. node_modules): shown read-only at their own path; relative to the spec file.
    # Nothing else of the machine is visible to it beyond the system (docs/external-harness.md).
    read_only: list[str] = Field(default_factory=list)
    limits: ExternalLimits = Field(default_factory=ExternalLimits)
    # how the `tools` of the agent's requests are shown to a local model and its replies parsed
    # back into tool_calls: a registered tool-call format (docs/protocols.md)
    tool_protocol: str = Field("hermes", json_schema_extra=_list_formats)
    # with an openai: model, pass the agent's tools to the server as native tools (false: render
    # them through tool_protocol, as for a local model)
    native_tools: bool = True
    # "sandbox" (the default): under bubblewrap the program has a network namespace of its own
    # and reaches the recording endpoint only; "host": the host's network (every loopback service,
    # and the internet where the machine has it), recorded in each trajectory's meta
    network: Literal["sandbox", "host"] = "sandbox"
    # which of the task's tools the episode serves the program over MCP (harness/mcp_tools.py,
    # at $HARNESSRL_MCP_URL): "auto" those an agent has no own stand-in for (all but the
    # workspace file tools and submit: a task's services, calculators, ...), "all" the file
    # tools too, "none" no server
    mcp_tools: Literal["auto", "all", "none"] = "auto"

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("the command must not be empty")
        else:
            if not v or not v[0].strip():
                raise ValueError("the command must be a non-empty list whose first word is the program")
            if any("\x00" in w for w in v):
                raise ValueError("a command word contains a NUL byte")
        return v

    @field_validator("read_only")
    @classmethod
    def _read_only(cls, v: list[str]) -> list[str]:
        for path in v:
            if not path.strip() or "\x00" in path:
                raise ValueError(f"read_only holds {path!r}, which is not a path")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by harnessrl for every episode; it cannot be set in env")
            if "\x00" in value:
                raise ValueError(f"the value of {key} contains a NUL byte")
        return v

    @field_validator("tool_protocol", mode="before")
    @classmethod
    def _registered_protocol(cls, v: Any) -> Any:
        return ProtocolSpec._registered_format(v)

    def argv(self) -> list[str]:
        """The command as an argv list (a string command runs under /bin/sh -c)."""
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)

    def resolved_against(self, folder: Path) -> "ExternalHarnessSpec":
        """The spec with its `read_only` paths made absolute against `folder` (the spec file's
        folder), and each command word that names an existing path relative to `folder` replaced
        by its absolute path where that path is one `read_only` lists (or inside one), or the
        program's own file: a file there whose name and folders on the way start with no dot,
        and no link out of `folder`. Any other word stays as written (a folder such as `runs`, a
        hidden file such as `.env`, a path outside `folder`): no host path is made of it unless
        `read_only` lists it, and in the sandbox it names what the program finds there."""
        folder = folder.resolve()
        read_only = [os.path.normpath(folder / p) for p in self.read_only]  # absolute ones stay

        def listed(target: str) -> bool:
            return any(target == entry or target.startswith(entry.rstrip("/") + "/") for entry in read_only)

        def resolve(word: str) -> str | None:
            if not _PLAIN_WORD.match(word) or word.startswith("/") or word in (".", ".."):
                return None
            target = os.path.normpath(folder / word)
            if not os.path.lexists(target):
                return None
            if listed(target):
                return target
            hidden = any(part.startswith(".") for part in Path(os.path.normpath(word)).parts)
            inside = Path(os.path.realpath(target)).is_relative_to(folder)
            return target if os.path.isfile(target) and not hidden and inside else None

        if isinstance(self.command, str):
            # the words of the shell line, split on blanks; only plain words (no quotes, no $) change
            parts = re.split(r"(\s+)", self.command)
            command: list[str] | str = "".join(
                shlex.quote(path) if (path := resolve(p)) is not None else p for p in parts
            )
        else:
            command = [path if (path := resolve(w)) is not None else w for w in self.command]
        return self.model_copy(update={"command": command, "read_only": read_only})

    def exposure(self) -> str | None:
        """Why this spec would show its program what is never shown (exposure.never_shown: a
        command word or `read_only` path naming the root, the temp folder, a home, a run folder, a
        source checkout), naming the word, the reason and the fix; None when it would not. Paths
        are taken as they stand (a loaded spec's are absolute)."""
        from harnessrl.harness.exposure import exposure_problems

        problems = exposure_problems(self.argv(), self.read_only)
        return problems[0] if problems else None

    # -- YAML -------------------------------------------------------------------------------------
    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


AnyHarnessSpec = Union[HarnessSpec, ExternalHarnessSpec]
KINDS = ("loop", "external")


def require_loop_harness(spec: AnyHarnessSpec, purpose: str) -> HarnessSpec:
    """`spec` if harnessrl's own loop runs it; SpecError for an external harness, which `purpose`
    (editing prompts and rules, re-rendering conversations) cannot work on."""
    if isinstance(spec, ExternalHarnessSpec):
        raise SpecError(
            f"harness '{spec.name}' is an external agent program (kind: external): {purpose} needs a "
            "harness spec run by harnessrl's own control loop"
        )
    return spec


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


def parse_spec(data: Any, source: str = "<spec>", *, check_paths: bool = True) -> AnyHarnessSpec:
    """A harness spec from its mapping: `kind: external` is an ExternalHarnessSpec, no kind (or
    `kind: loop`) a HarnessSpec. An external spec whose command words or `read_only` paths name
    what is never shown to its program (ExternalHarnessSpec.exposure) is refused (`check_paths`:
    load_spec checks once the paths are made absolute)."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: a harness spec must be a mapping, got {type(data).__name__}")
    kind = data.get("kind", "loop")
    if kind not in KINDS:
        raise SpecError(
            f"{source}: kind: {kind!r} is not a harness kind; use 'loop' (harnessrl's control loop, the "
            "default) or 'external' (an agent program of its own)"
        )
    try:
        if kind != "external":
            return HarnessSpec.model_validate({k: v for k, v in data.items() if k != "kind"})
        spec = ExternalHarnessSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{source}: {_format_errors(e)}") from None
    if check_paths:
        _refuse_exposure(spec, source)
    return spec


def _refuse_exposure(spec: ExternalHarnessSpec, source: str) -> None:
    """SpecError naming the file when the spec would show its program what is never shown."""
    problem = spec.exposure()
    if problem is not None:
        raise SpecError(f"{source}: {problem}")


def load_spec(path: str | Path) -> AnyHarnessSpec:
    """Load and validate a harness spec file; SpecError names the file, the field and the reason.
    The command of an external harness has its words that name its own files next to the spec,
    or paths its `read_only` lists, made absolute (ExternalHarnessSpec.resolved_against); a
    command word or `read_only` path naming what is never shown to the program is refused
    (ExternalHarnessSpec.exposure)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such harness spec file")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise SpecError(f"{p}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{p}: not a UTF-8 text file") from None
    spec = parse_spec(data, str(p), check_paths=False)
    if isinstance(spec, ExternalHarnessSpec):
        spec = spec.resolved_against(p.parent)
        _refuse_exposure(spec, str(p))
    return spec


def spec_json_schema() -> dict[str, Any]:
    """The JSON schema of a spec file: a loop harness (HarnessSpec) or an external one."""
    schema = TypeAdapter(AnyHarnessSpec).json_schema()
    return {"title": "HarnessSpec", **schema}
