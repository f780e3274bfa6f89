"""What every command of the command line shares: the consoles, `fail`, `job_errors` (errors,
Ctrl-C and SIGTERM around a long job), model-spec checks, and
`config_command`, which builds a command's options from its pydantic config (every option is
declared once, as a field with its bounds and help text)."""

from __future__ import annotations

import inspect
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from harnessrl.config import option_name
from harnessrl.errors import JobError

# When piped, rich would squeeze tables into 80 columns; give them room instead.
out = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)


def fail(message: str, code: int = 2) -> NoReturn:
    """One clear line on stderr and a non-zero exit: for user errors, never a traceback."""
    err.print("[bold red]error:[/] ", end="")
    err.print(message, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (what `timeout`, `kill` and batch schedulers send) arrived: raised in the main
    thread where Ctrl-C raises KeyboardInterrupt, so a job stops the same way."""


INTERRUPTED = 130  # the exit status after Ctrl-C (128 + SIGINT)
TERMINATED = 143  # after SIGTERM (128 + SIGTERM)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside this block SIGTERM raises Terminated in the main thread (once: a later SIGTERM
    while the job winds down is ignored, SIGKILL still ends it); the previous handler is put back
    after. Outside the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def job_errors(out: str | Path, saved: str, *, say: bool = True) -> Iterator[None]:
    """Around a long-running command's job: a JobError (harnessrl.errors, the one error every job
    raises) is one line on stderr and its exit status (2 a user error; 1 a failure of the run
    itself, e.g. training diverged), never a traceback; Ctrl-C and SIGTERM stop the job alike
    (what it runs winds down as the KeyboardInterrupt passes: episodes, agent programs,
    services), say what is kept (`saved`) and how to continue in `out`, and exit 130 (Ctrl-C) or
    143 (SIGTERM). `say=False` (a process other than rank 0 under torchrun) exits the same,
    silently."""
    try:
        with sigterm_interrupts():
            yield
    except KeyboardInterrupt as e:
        how, code = ("terminated (SIGTERM)", TERMINATED) if isinstance(e, Terminated) else ("interrupted", INTERRUPTED)
        if say:
            err.print(f"{how}: {saved}; continue with --resume --out {out}", highlight=False)
        raise typer.Exit(code) from None
    except JobError as e:
        if say:
            fail(str(e), e.exit_code)
        raise typer.Exit(e.exit_code) from None


def check_measured(out_folder: str | Path) -> None:
    """After a job that runs episodes: exit 3 (NOTHING_MEASURED) with the first error when every
    episode under its run folder was an infrastructure error (harnessrl.jobs.measured)."""
    from harnessrl.jobs.measured import NOTHING_MEASURED, nothing_measured

    why = nothing_measured(out_folder)
    if why is not None:
        fail(why, NOTHING_MEASURED)


def executor_for(run: Any) -> Any:
    """The executor that a command's run options ask for (`--executor`, `--ray-address`), to use
    in a `with` block; exits 2 with the reason when it cannot be had (Ray not installed)."""
    from harnessrl.executors import ExecutorError, make_executor

    try:
        return make_executor(run.executor, run.ray_address)
    except ExecutorError as e:
        fail(str(e))


# ------------------------------------------------------------------------------------------------
# options from a config


def validation_message(e: ValidationError) -> str:
    """A pydantic error in the words of the options a user typed: `--tasks-per-step must be >= 1`."""
    parts = []
    for item in e.errors():
        loc = [str(x) for x in item.get("loc", ()) if not isinstance(x, int)]
        msg = item.get("msg", "invalid").removeprefix("Value error, ")
        msg = msg.replace("Input should be", "must be").replace("greater than or equal to", ">=")
        msg = msg.replace("less than or equal to", "<=").replace("greater than", ">").replace("less than", "<")
        parts.append(f"{option_name(loc[0])} {msg[0].lower() + msg[1:]}" if loc and msg else msg)
    return "; ".join(parts)


def _parameter(name: str, field: Any) -> inspect.Parameter:
    meta = (field.json_schema_extra or {}).get("cli", {}) if isinstance(field.json_schema_extra, dict) else {}
    flags = list(meta.get("flags") or [])
    annotation = list[str] if meta.get("repeat") else field.annotation
    if annotation is bool:
        long = flags[0] if flags else option_name(name)
        decls = [long] if meta.get("bool_flag") else [f"{long}/--no-{long[2:]}"]
        flags = decls + flags[1:]
    elif not flags:
        flags = [option_name(name)]
    # a field without a default is a required option
    default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
    if meta.get("repeat") and isinstance(default, dict):
        default = [f"{k}={v}" for k, v in default.items()]
    option = typer.Option(*flags, help=field.description or "")
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[annotation, option]
    )


def config_fields(model: type[BaseModel]) -> dict[str, Any]:
    """name -> FieldInfo of a job config (a pydantic model: Options and its kind)."""
    return dict(model.model_fields)


_GIVEN: set[str] = set()


def given_options() -> frozenset[str]:
    """The options (field names) written on the running command's line: the resume rule fills
    in the others from the run being resumed (harnessrl.kernel)."""
    return frozenset(_GIVEN)


def given_on_command_line(name: str) -> bool:
    """Whether option `name` (its field name) was written on the running command's line, as
    opposed to left at its default."""
    return name in _GIVEN


def config_command(*models: type[BaseModel]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate `fn(config_a, config_b, ...)` into a typer command whose options are the fields of
    the given pydantic models, in order. Values are validated by the models; a bad value exits 2
    with the option's name, never a traceback."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        params, owners = [], []
        for model in models:
            fields = config_fields(model)
            owners.append((model, list(fields)))
            params += [_parameter(n, f) for n, f in fields.items()]
        seen = [p.name for p in params]
        if len(set(seen)) != len(seen):
            raise TypeError(f"{fn.__name__}: option names declared twice across {[m.__name__ for m in models]}")

        def command(**values: Any) -> Any:
            ctx = values.pop("_typer_context", None)
            _GIVEN.clear()
            if ctx is not None:
                _GIVEN.update(n for n in seen if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE")
            configs = []
            for model, names in owners:
                try:
                    configs.append(model(**{n: values[n] for n in names}))
                except ValidationError as e:
                    fail(validation_message(e))
            return fn(*configs)

        context = inspect.Parameter("_typer_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        command.__signature__ = inspect.Signature([*params, context])  # type: ignore[attr-defined]
        command.__name__ = fn.__name__
        command.__doc__ = fn.__doc__
        command.__wrapped_config__ = models  # type: ignore[attr-defined]
        return command

    return decorate
