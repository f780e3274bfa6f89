"""`harnessrl serve`: an OpenAI-compatible server over a local model (docs/serve.md)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from harnessrl.cli.common import err, fail
from harnessrl.config import DEVICE_HELP, DTYPE_HELP, device_spec, inference_dtype_spec

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


def _served(model: str, served_model_name: str | None, max_loras: int, dtype: str, device: str, **options):
    """The local model `model` loaded on `device` in `dtype`, as the server's models (ValueError
    for a spec that is not a local model, as ServedModels.from_spec, which takes no device);
    `options`: the other keywords of ServedModels."""
    from harnessrl.models import ModelSpec, check_spec, load_policy
    from harnessrl.models.hf import HFPolicy
    from harnessrl.serve import ServedModels
    from harnessrl.serve.models import LOCAL_ONLY

    spec = model.strip()
    if ModelSpec.parse_local(spec) is None:
        raise ValueError(f"{LOCAL_ONLY}; {spec!r} is not one")
    check_spec(spec, option="--model")
    policy = load_policy(spec, dtype=dtype, device=device)
    assert isinstance(policy, HFPolicy)  # a local spec loads one
    return ServedModels(policy, served_model_name or spec, root=spec, max_loras=max_loras, owns_base=True, **options)


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
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP + "; int8 serves no LoRA adapters")] = "auto",
    lora_modules: Annotated[
        Optional[list[str]], typer.Option(help="NAME=PATH: a peft adapter folder to load at start (repeatable)")
    ] = None,
    max_lora_rank: Annotated[
        int,
        typer.Option(
            help="highest LoRA rank an adapter may have (vLLM's choices: 1, 8, 16, 32, 64, 128, 256, 320, 512)"
        ),
    ] = 16,
    generation_config: Annotated[
        str,
        typer.Option(
            help="vllm: a sampling field a request does not send takes the neutral default; auto (vLLM's default): "
            "it takes the model folder's generation_config.json value"
        ),
    ] = "vllm",
    logprobs_mode: Annotated[
        str,
        typer.Option(
            help="processed_logprobs: log-probs of the distribution sampled from (temperature applied); "
            "raw_logprobs (vLLM's default): of the untempered logits"
        ),
    ] = "processed_logprobs",
    enable_auto_tool_choice: Annotated[
        bool,
        typer.Option(
            "--enable-auto-tool-choice",
            help="serve native tool calls (requests with `tools`): shown in the prompt and parsed back into "
            "tool_calls with --tool-call-parser (vLLM's flag; without it such requests get vLLM's 400)",
        ),
    ] = False,
    tool_call_parser: Annotated[
        Optional[str],
        typer.Option(
            help="the tool-call format of --enable-auto-tool-choice: a registered protocol (hermes for Qwen2.5/Qwen3, "
            "json, xml, react, code, or a plugin's; docs/serve.md#native-tool-calls)"
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="the server's log level: critical, error, warning, info, debug, trace")
    ] = "info",
) -> None:
    """Serve a local model over OpenAI's chat completions API (/v1/chat/completions, /v1/models,
    runtime LoRA adapters; native tool calls with --enable-auto-tool-choice --tool-call-parser);
    Ctrl-C stops."""
    from harnessrl.models import ModelUnavailable

    for option, check, value in (("--device", device_spec, device), ("--dtype", inference_dtype_spec, dtype)):
        try:
            check(value)
        except ValueError as e:
            fail(f"{option} {e}")
    device, dtype = device_spec(device), inference_dtype_spec(dtype)
    if dtype == "int8" and lora_modules:
        fail("--lora-modules: LoRA adapters are merged into float weights; serve with --dtype float32 or bfloat16")
    from harnessrl.serve.models import GENERATION_CONFIGS, LOGPROBS_MODES, MAX_LORA_RANKS

    if max_lora_rank not in MAX_LORA_RANKS:
        fail(f"--max-lora-rank must be one of {', '.join(map(str, MAX_LORA_RANKS))}, got {max_lora_rank}")
    if generation_config not in GENERATION_CONFIGS:
        fail(f"--generation-config must be {' or '.join(GENERATION_CONFIGS)}, got {generation_config!r}")
    if logprobs_mode not in LOGPROBS_MODES:
        fail(f"--logprobs-mode must be {' or '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}")
    from harnessrl.serve.tools import check_tool_parser

    try:  # the registered formats, plugins included, are the choices
        tool_call_parser = check_tool_parser(enable_auto_tool_choice, tool_call_parser)
    except ValueError as e:
        fail(str(e))
    if log_level not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    if max_loras < len(lora_modules or []):
        fail(f"--lora-modules names {len(lora_modules or [])} adapters but --max-loras is {max_loras}")
    modules = _lora_modules(lora_modules or [])
    from harnessrl.models.device import DeviceUnavailable, resolve_device, resolve_dtype
    from harnessrl.serve import ServeError, run_server

    try:  # before anything loads: a device this machine lacks, int8 on a GPU
        where = resolve_device(device)
        dtype = resolve_dtype(dtype, where)
    except DeviceUnavailable as e:
        fail(str(e))
    try:
        models = _served(
            model,
            served_model_name,
            max_loras,
            dtype,
            str(where),
            max_lora_rank=max_lora_rank,
            generation_config=generation_config,
            logprobs_mode=logprobs_mode,
            tool_call_parser=tool_call_parser,
        )
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
