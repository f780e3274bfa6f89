"""`harnessrl serve`: an OpenAI-compatible server over a local model (docs/serve.md)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from harnessrl.cli.common import err, fail

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _lora_modules(values: list[str]) -> dict[str, str]:
    modules: dict[str, str] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            fail(f"--lora-modules wants NAME=PATH, got {value!r}")
        if name.strip() in modules:
            fail(f"--lora-modules: {name.strip()!r} is given twice")
        modules[name.strip()] = path.strip()
    return modules


def serve_cmd(
    model: Annotated[str, typer.Option("--model", help="local model: tiny-random, smollm2-135m or hf:PATH")],
    host: Annotated[str, typer.Option(help="address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0 = any free port)")] = 8000,
    max_loras: Annotated[
        int, typer.Option(min=0, help="most LoRA adapters loaded at once (each holds a copy of the base weights)")
    ] = 4,
    served_model_name: Annotated[
        Optional[str], typer.Option(help="the base model's name in requests and /v1/models (default: --model)")
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="weights: float32 (exact, reproducible), bfloat16 (faster on some CPUs) or int8 (linear layers "
            "in int8 on the CPU: faster, less accurate; no LoRA adapters)"
        ),
    ] = "float32",
    lora_modules: Annotated[
        Optional[list[str]], typer.Option(help="NAME=PATH: a peft adapter folder to load at start (repeatable)")
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="the server's log level: critical, error, warning, info, debug, trace")
    ] = "info",
) -> None:
    """Serve a local model over OpenAI's chat completions API (/v1/chat/completions, /v1/models,
    runtime LoRA adapters); Ctrl-C stops."""
    from harnessrl.models import DTYPES, ModelUnavailable, dtype_choices

    if dtype not in DTYPES:
        fail(f"--dtype must be {dtype_choices()}, got {dtype!r}")
    if dtype == "int8" and lora_modules:
        fail("--lora-modules: LoRA adapters are merged into float weights; serve with --dtype float32 or bfloat16")
    if log_level not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    if max_loras < len(lora_modules or []):
        fail(f"--lora-modules names {len(lora_modules or [])} adapters but --max-loras is {max_loras}")
    modules = _lora_modules(lora_modules or [])
    from harnessrl.serve import ServedModels, ServeError, run_server

    try:
        models = ServedModels.from_spec(model, served_model_name=served_model_name, max_loras=max_loras, dtype=dtype)
    except (ValueError, ModelUnavailable, OSError) as e:
        fail(f"cannot serve {model!r}: {e}")
    try:
        for name, path in modules.items():
            try:
                models.load_adapter(name, path)
            except ServeError as e:
                fail(f"--lora-modules {name}={path}: {e.message}")
        names = ", ".join([models.base_name, *models.adapter_names()])

        def announce(url: str) -> None:
            err.print(f"serving {names} at {url}  (Ctrl-C to stop)", markup=False, highlight=False)

        try:
            run_server(models, host=host, port=port, log_level=log_level, announce=announce)
        except OSError as e:
            fail(f"cannot listen on {host}:{port}: {e}")
    finally:
        models.close()
