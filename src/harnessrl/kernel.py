"""The job kernel: what every job (eval, evolve, study, improve, train grpo / sft / distill) does
once before its own work, the same way for all of them.

`enter(job, config, out, resume=..., given=..., models=[...])` returns a JobContext:

- **the resume rule** (one for every job): `--resume` continues the run in `--out`. Options left
  off the command line take the values the run was started with (kept in OUT/options.json);
  options given are used as given. The job's run folder then compares what the run computes with
  what it recorded, and refuses a difference naming the option, except the options the job says
  may change (train's `--steps`, evolve's `--iterations`, every job's `--device`). A library
  caller (`given=None`) passes its whole config: nothing is filled in for it.
- **the models**, each chosen once (harnessrl.models.choice): spec parsed and checked, a local
  model's device and dtype resolved on this machine, the API-key variable named. The job and
  `load_policy` take the ModelChoice and resolve nothing again.
- **the suite, its tasks and the harnesses** a job's options name: each config marks those
  fields (harnessrl.config.Reads) and `read_inputs` reads them once into `JobContext.inputs`
  (through `job_suite`, `job_tasks`, `job_split`, `job_harness`, `job_harnesses`), each refusal
  naming the option; objects a library caller built may stand in for names (`objects`); what the
  run folder records of them and of the options, one way (`job_record`).
- **the preflight** (`--preflight`, eval and train grpo): `preflight_inputs`.
- **one error**: every refusal is a JobError (harnessrl.errors) naming the option.
- **isolation**: `--isolation required` refuses to start where bubblewrap does not work, and an
  agent program whose spec asks for the host's network (`network: host`) is refused unless
  `--allow-host-network` is given (then a warning names it), and always under `--isolation
  required` (`host_network`).

The context also carries how the job reports (progress, log, console) and where its episodes
run (executor). The job's entries (harnessrl.jobs.entries) call `enter` and then the job with its
context, which it takes whole: `run_eval(ctx)`, `Trainer(ctx)`, ...
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Generic, Iterable, Mapping, Protocol, TypeVar

from harnessrl.config import Options, Reads, option_name
from harnessrl.errors import JobError, JobFailed
from harnessrl.rundir import holds_run

if TYPE_CHECKING:
    from harnessrl.models.choice import ModelChoice
    from harnessrl.tasks.base import Suite, Task

OPTIONS = "options.json"

C = TypeVar("C", bound=Options)
R = TypeVar("R")


class HasSplits(Protocol):
    """What `job_split` reads of a suite (a Suite, or a trainer's own stand-in)."""

    @property
    def name(self) -> str: ...

    @property
    def split_sizes(self) -> Mapping[str, int]: ...


@dataclass(frozen=True)
class ModelRequest:
    """A model option of a job, as given: `option` ("--model", "--collect-model", ...), the spec
    text, the device and dtype asked for (local models), the API-key variable, whether the
    oracle is accepted there, and the option naming that variable in messages."""

    option: str
    text: str | None
    device: str = "auto"
    dtype: str = "auto"
    api_key_env: str | None = None
    oracle: bool = False
    key_option: str = "--api-key-env"


@dataclass(frozen=True)
class JobInputs:
    """What a job's options name, read once (`read_inputs`): the suite, the harness specs and the
    tasks, each by the config field that names it; the LLM judge of a `judge_model` option."""

    suite: Any = None
    harness: Mapping[str, Any] = field(default_factory=dict)  # field -> HarnessSpec or None
    harnesses: Mapping[str, list[Any]] = field(default_factory=dict)  # field -> [HarnessSpec]
    tasks: Mapping[str, list[Task]] = field(default_factory=dict)  # field -> the first N tasks
    judge: Any = None


@dataclass(frozen=True)
class JobContext:
    """A job's resolved set-up: `config` after the resume rule, the run folder `out`, whether it
    resumes, its models chosen once (by option), what its options name (`inputs`), and how it
    reports (`progress` bars, `log` lines, the rich `console`) and where its episodes run
    (`executor`; by default this process's LocalExecutor; the caller closes it)."""

    job: str
    config: Any
    out: Path
    resume: bool = False
    models: Mapping[str, ModelChoice] = field(default_factory=dict)
    keeps_options: bool = True  # False: a fresh start into a folder holding a run (the job refuses it)
    inputs: JobInputs = field(default_factory=JobInputs)
    progress: bool = True
    log: Callable[[str], None] = lambda message: None
    console: Any = None
    executor: Any = field(default_factory=lambda: _local_executor())

    def model(self, option: str = "--model") -> ModelChoice:
        """The model chosen for `option`; KeyError when the job has none there."""
        return self.models[option]

    def __enter__(self) -> JobContext:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        """The job ended: when it finished, was interrupted (Ctrl-C, SIGTERM) or failed as a run
        (JobFailed) with a run in `out`, its options are kept there for the next `--resume`.
        Nothing is written for a job that refused to run as asked (a JobError: a refused resume
        leaves the recorded options as they were) or crashed."""
        ran = error is None or isinstance(error, (KeyboardInterrupt, JobFailed))
        if ran and self.keeps_options and holds_run(self.out):
            record_options(self.job, self.config, self.out)


@dataclass(frozen=True)
class Finished(Generic[R]):
    """What an entry returns: the job's `result`, and the `config` it ran with (after the resume
    rule: what a caller prints beside the result)."""

    config: Any
    result: R


def option_values(config: Options) -> dict[str, Any]:
    """A job config's options as JSON values."""
    return config.model_dump(mode="json")


def stored_options(out: Path) -> dict[str, Any] | None:
    """The options a run in `out` was started with (OPTIONS), or None for a folder without them
    (a fresh one, or a run from before they were kept: its recorded configuration decides alone)."""
    path = Path(out) / OPTIONS
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise JobError(f"{path} is not valid JSON ({e}); start a new --out") from None
    options = stored.get("options") if isinstance(stored, dict) else None
    if not isinstance(options, dict):
        raise JobError(f"{path} holds no options object; start a new --out")
    return options


def resume_config(
    config: C,
    out: Path,
    given: Collection[str] | None,
    log: Callable[[str], None] = lambda message: None,
    earlier: Callable[[Path], dict[str, Any]] | None = None,
) -> C:
    """The resume rule's first half: `config` with every option not in `given` (the options
    written on the command line) set to the value the run in `out` was started with; each given
    option whose value differs is said in `log` (the job's run folder decides whether it may).
    `earlier(out)`: the options of a run from before OPTIONS was kept, where the job can read them
    from its own record (evolve's config.json holds its options)."""
    stored = stored_options(out)
    if stored is None and earlier is not None and given is not None:
        stored = earlier(out)
    if stored is None or given is None:
        return config
    now = option_values(config)
    taken = {k: v for k, v in stored.items() if k in now and k not in given and now[k] != v}
    for name in sorted(k for k in given if k in stored and k in now and now[k] != stored[k]):
        log(f"--resume: {option_name(name)} changed: {_shown(stored[name])} -> {_shown(now[name])}")
    try:
        return config.replace(**taken) if taken else config
    except (ValueError, TypeError) as e:
        raise JobError(f"{Path(out) / OPTIONS}: the recorded options are no longer valid ({e})") from None


def record_options(job: str, config: Any, out: Path) -> None:
    """Keep the options a run starts (or resumes) with in OUT/options.json (`out` exists)."""
    out = Path(out)
    tmp = out / f".{OPTIONS}.{os.getpid()}.tmp"  # every process of a torchrun launch writes the same
    tmp.write_text(json.dumps({"job": job, "options": option_values(config)}, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / OPTIONS)


def config_models(config: Any) -> list[ModelRequest]:
    """The model options of a job config, read by field: `model` (with `device`, `dtype` and
    `api_key_env` where the config has them; the oracle accepted where the config's class says
    `oracle_model = True`), `collect_model`
    (the study's and improve's collector: the oracle accepted) and `judge_model` (with
    `judge_api_key_env`). A field the config lacks or leaves None asks for nothing."""
    requests = [
        ModelRequest(
            "--model",
            config.model,
            getattr(config, "device", "auto"),
            getattr(config, "dtype", "auto"),
            getattr(config, "api_key_env", None),
            oracle=getattr(type(config), "oracle_model", False),
        )
    ]
    if getattr(config, "collect_model", None) is not None:
        requests.append(ModelRequest("--collect-model", config.collect_model, oracle=True))
    if getattr(config, "judge_model", None) is not None:
        requests.append(
            ModelRequest(
                "--judge-model",
                config.judge_model,
                api_key_env=getattr(config, "judge_api_key_env", None),
                key_option="--judge-api-key-env",
            )
        )
    return requests


def choose_models(requests: Iterable[ModelRequest]) -> dict[str, ModelChoice]:
    """Each requested model chosen once (harnessrl.models.choice.choose_model); JobError naming
    the option for a spec that cannot be used here. A request without text is skipped."""
    from harnessrl.models.choice import choose_model

    chosen = {}
    for r in requests:
        if r.text is None:
            continue
        try:
            chosen[r.option] = choose_model(
                r.text,
                device=r.device,
                dtype=r.dtype,
                api_key_env=r.api_key_env,
                option=r.option,
                key_option=r.key_option,
                oracle=r.oracle,
            )
        except JobError:
            raise
        except ValueError as e:
            raise JobError(str(e)) from None
    return chosen


def job_suite(name: str, error: type[JobError] = JobError, *, judge: Any = None) -> Suite:
    """The suite a job's `--suite` names (a built-in one or a task folder, harnessrl.tasks);
    `error` (the job's JobError class) naming the option for one that does not exist or cannot be
    read. `judge` grades the LLM-judge parts of the formats that have them."""
    from harnessrl.tasks import get_suite

    try:
        return get_suite(name) if judge is None else get_suite(name, judge=judge)
    except ValueError as e:
        raise error(f"--suite: {e}") from None


def job_tasks(suite: Suite, split: str, n: int | None, option: str, error: type[JobError] = JobError) -> list[Task]:
    """The first `n` tasks of `split` (the count `option` asked for), or `error` naming the option
    when the split cannot give them."""
    try:
        return suite.tasks(split, n)
    except ValueError as e:
        raise error(f"{option}: {e}") from None


def job_split(suite: HasSplits, split: str, wanted: int, option: str, error: type[JobError] = JobError) -> None:
    """`error` naming `option` when `split` of the suite holds fewer than the `wanted` tasks a job
    draws from it step by step (a trainer's tasks per step: nothing is read here)."""
    have = suite.split_sizes.get(split, 0)
    if wanted > have:
        held = f"has {have} tasks" if split in suite.split_sizes else "does not exist"
        raise error(f"{option}: split '{split}' of suite '{suite.name}' {held}; asked for {wanted}")


def job_record(
    options: Mapping[str, Any], model: ModelChoice, leave_out: Iterable[str] = (), **specs: Any
) -> dict[str, Any]:
    """What a job's run folder records (and compares on --resume): its options without the device
    and dtype as asked and without `leave_out` (options that play no part in this run), the model's
    precision as it resolved (ModelChoice.recorded: the device, the dtype when not float32), and
    `specs` (the harness specs it runs)."""
    dropped = {"device", "dtype", *leave_out}
    return {**{k: v for k, v in options.items() if k not in dropped}, **model.recorded(), **specs}


def job_harness(text: str, option: str, error: type[JobError] = JobError, *, loop_for: str | None = None) -> Any:
    """The harness a job's option names (a built-in name or a spec file), or `error` naming the
    option for one that cannot be read. `loop_for`: what the job does with it that needs
    harnessrl's own control loop (editing prompts, re-rendering conversations): an external
    agent program is refused there."""
    from harnessrl.harness.registry import load_harness

    try:
        spec = load_harness(text)
    except ValueError as e:
        raise error(f"{option}: {e}") from None
    return spec if loop_for is None else _loop(spec, loop_for, option, error)


def job_harnesses(texts: list[str], option: str, error: type[JobError] = JobError) -> list[Any]:
    """The harnesses a job's list option names (names, spec files, `all`), or `error` naming the
    option for one that cannot be read or a name given twice."""
    from harnessrl.harness.registry import resolve_harnesses

    try:
        return resolve_harnesses(texts)
    except ValueError as e:
        raise error(f"{option}: {e}") from None


def named(config: C, objects: Mapping[str, Any] | None) -> C:
    """`config` recording the names of the objects a library caller built in place of names, by
    field (a suite restricted to some tasks, harness specs with shrunk rules, lists of specs)."""
    if not objects:
        return config
    return config.replace(**{f: [v.name for v in o] if isinstance(o, list) else o.name for f, o in objects.items()})


def read_inputs(config: Options, error: type[JobError] = JobError, given: Mapping[str, Any] | None = None) -> JobInputs:
    """What the config's options name (their `Reads` marks, harnessrl.config), read in one pass:
    the suite first, then the harnesses and the tasks; `error` naming the option for one that
    cannot be read. `given`: objects a library caller built, by field, taken in place of what
    their names would read (a harness there is still refused where the job needs its own loop).
    A config with a `judge_model` gets its judge, handed to the suite."""
    given = dict(given or {})
    marks = {name: m for name, f in type(config).model_fields.items() for m in f.metadata if isinstance(m, Reads)}
    judge, judge_model = None, getattr(config, "judge_model", None)
    if judge_model is not None:
        from harnessrl.tasks.importers import make_judge

        try:
            judge = make_judge(judge_model, getattr(config, "judge_api_key_env", None))
        except ValueError as e:
            raise error(f"--judge-model: {e}") from None
    suite: Any = None
    harness: dict[str, Any] = {}
    harnesses: dict[str, list[Any]] = {}
    tasks: dict[str, list[Any]] = {}
    for name, mark in sorted(marks.items(), key=lambda item: item[1].kind != "suite"):
        value, option = getattr(config, name), option_name(name)
        if (mark.when is not None and not getattr(config, mark.when)) or (mark.unless and getattr(config, mark.unless)):
            continue
        if mark.kind == "suite":
            suite = given[name] if name in given else job_suite(value, error, judge=judge)
        elif mark.kind == "harness":
            spec = given[name] if name in given else None if value is None else job_harness(value, option, error)
            harness[name] = spec if spec is None or mark.loop_for is None else _loop(spec, mark.loop_for, option, error)
        elif mark.kind == "harnesses":
            harnesses[name] = list(given[name]) if name in given else job_harnesses(list(value), option, error)
        else:
            split = getattr(config, mark.split[1:]) if mark.split.startswith("@") else mark.split
            if mark.split.startswith("@") and split not in suite.split_sizes:  # the option naming it is at fault
                option = option_name(mark.split[1:])
            if mark.kind == "tasks":
                tasks[name] = job_tasks(suite, split, value, option, error)
            else:
                job_split(suite, split, value, option, error)
    return JobInputs(suite, harness, harnesses, tasks, judge)


def _loop(spec: Any, purpose: str, option: str, error: type[JobError]) -> Any:
    """`spec`, or `error` naming the option where it is an agent program (the job needs
    harnessrl's own control loop for `purpose`)."""
    from harnessrl.harness.spec import require_loop_harness

    try:
        return require_loop_harness(spec, purpose)
    except ValueError as e:
        raise error(f"{option}: {e}") from None


def preflight_inputs(config: Options, inputs: JobInputs, error: type[JobError], log: Callable[[str], None]) -> None:
    """The run option `--preflight` (eval, train grpo): every harness the job runs, its first
    request of the job's first task (the first of the tasks read, else the suite's first train
    task) measured against a local model's context before anything loads, one line each in
    `log`; `error` (exit 2) where one cannot fit, or where an agent program could not make its
    first request (harnessrl.preflight.check_before_run)."""
    from harnessrl.models.base import ModelUnavailable
    from harnessrl.preflight import check_before_run

    specs = [s for s in inputs.harness.values() if s is not None]
    specs += [s for listed in inputs.harnesses.values() for s in listed]
    tasks = next((listed for listed in inputs.tasks.values() if listed), None)
    if tasks is None and inputs.suite.split_sizes.get("train"):
        tasks = inputs.suite.tasks("train", 1)
    if not tasks:
        return
    try:
        check_before_run(getattr(config, "model"), specs, tasks[0], log)
    except (ValueError, ModelUnavailable) as e:  # PreflightRefused, or a model it cannot read
        raise error(str(e)) from None


def enter(
    job: str,
    config: Any,
    out: Path,
    *,
    resume: bool = False,
    given: Collection[str] | None = None,
    models: Callable[[Any], Iterable[ModelRequest]] = config_models,
    log: Callable[[str], None] = lambda message: None,
    earlier: Callable[[Path], dict[str, Any]] | None = None,
    isolation: str = "auto",
    allow_host_network: bool = False,
    error: type[JobError] = JobError,
    objects: Mapping[str, Any] | None = None,
    progress: bool = True,
    console: Any = None,
    executor: Any = None,
    preflight: bool = False,
) -> JobContext:
    """A job's context (see the module docstring), to run the job in as `with enter(...) as ctx:`
    (the options are kept in `out` when the block ends and the job has started a run there).
    `models(config)` lists the job's model options once the resume rule has filled the config in
    (default: `config_models`); then what the options name is read (`read_inputs`; `objects`:
    those a library caller built, by field). `isolation="required"` (the run option
    `--isolation required`): a JobError unless bubblewrap isolates sandboxed commands here, and
    from then on every sandboxed command of this process refuses to run without it; an agent
    program asking for the host's network is refused there, and elsewhere unless
    `allow_host_network` (the run option `--allow-host-network`; `host_network`). `error`: the
    job's JobError class, for its refusals. `progress`, `log`, `console`, `executor`: how the job
    reports and where its episodes run; `preflight`: the run option of that name
    (`preflight_inputs`). Nothing is written here: a refusal leaves the folder as it was."""
    out = Path(out)
    if isolation == "required":
        from harnessrl.tasks.sandbox_exec import IsolationRequired, require_isolation

        try:
            require_isolation()
        except IsolationRequired as e:
            raise JobError(str(e)) from None
    if resume:
        config = resume_config(config, out, given, log, earlier)
    config = named(config, objects)
    config.check(error)  # options that refuse each other, once the resume rule has filled them in
    chosen = choose_models(models(config))
    inputs = read_inputs(config, error, objects)
    host_network(config, inputs, isolation, allow_host_network, error, log)
    if preflight:
        preflight_inputs(config, inputs, error, log)
    keeps = resume or not holds_run(out)
    executor = executor if executor is not None else _local_executor()
    return JobContext(job, config, out, resume, chosen, keeps, inputs, progress, log, console, executor)


def host_network(
    config: Any,
    inputs: JobInputs,
    isolation: str,
    allowed: bool,
    error: type[JobError] = JobError,
    log: Callable[[str], None] = lambda message: None,
) -> None:
    """The rule of `network: host` (an agent program's spec asking for the host's network: every
    service on this machine's loopback, and the internet), for the harnesses the job's options
    name (`inputs`): under `--isolation required` (`isolation`) such a spec is refused whatever
    `allowed` says; else it is refused unless `allowed` (`--allow-host-network`), and with it a
    warning naming each goes to `log`. `error` names the option and the spec, before any episode."""
    from harnessrl.harness.spec import ExternalHarnessSpec

    named: list[tuple[str, str, Any]] = [(f, _text(getattr(config, f, None), s), s) for f, s in inputs.harness.items()]
    for f, specs in inputs.harnesses.items():
        named += [(f, text, s) for text, s in _texts(getattr(config, f, None), specs)]
    host = [(option_name(f), t, s) for f, t, s in named if isinstance(s, ExternalHarnessSpec) and s.network == "host"]
    for option, text, spec in host:
        what = f"{option}: harness '{spec.name}'{f' ({text})' if text != spec.name else ''} asks for the host's network"
        if isolation == "required":
            raise error(
                f"{what} (network: host), which --isolation required refuses whatever --allow-host-network "
                "says; drop network: host from its spec, or run without --isolation required"
            )
        if not allowed:
            raise error(
                f"{what} (network: host: every service on this machine's loopback, and the internet); pass "
                "--allow-host-network to run it so"
            )
        log(
            f"warning: {what} (network: host, allowed by --allow-host-network): its program reaches every "
            "service on this machine's loopback, and the internet"
        )


def _text(value: Any, spec: Any) -> str:
    """The text an option gave for `spec` (a spec file's path), else the spec's name."""
    return value if isinstance(value, str) else getattr(spec, "name", "")


def _texts(value: Any, specs: list[Any]) -> list[tuple[str, Any]]:
    """Each of `specs` with the text of a list option that named it (names, paths, comma lists,
    `all` for every built-in one); each spec's name where the texts do not line up with them."""
    from harnessrl.harness.registry import builtin_names

    texts = [t.strip() for v in (value or []) if isinstance(v, str) for t in v.split(",") if t.strip()]
    out: list[tuple[str, Any]] = []
    for text in texts:
        out += [(text, None)] * (len(builtin_names()) if text == "all" else 1)
    if len(out) != len(specs):
        return [(getattr(s, "name", ""), s) for s in specs]
    return [(text, s) for (text, _), s in zip(out, specs)]


def _local_executor() -> Any:
    from harnessrl.executors import LocalExecutor

    return LocalExecutor()


def _shown(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else "..."
