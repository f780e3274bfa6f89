"""`harnessrl serve`: an OpenAI-compatible server over a local model (docs/serve.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from pydantic import Field

from harnessrl.cli.common import config_command, err, fail
from harnessrl.config import DTYPE_HELP, Device, Dtype, Options, cli

if TYPE_CHECKING:
    from harnessrl.models.choice import ModelChoice

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


def _served(model: ModelChoice, served_model_name: str | None, max_loras: int, **options):
    """The chosen local model, loaded where it was resolved to run, as the server's models;
    `options`: the other keywords of ServedModels."""
    from harnessrl.models import load_policy
    from harnessrl.models.hf import HFPolicy
    from harnessrl.serve import ServedModels

    policy = load_policy(model)
    assert isinstance(policy, HFPolicy)  # a local spec loads one
    return ServedModels(
        policy, served_model_name or model.text, root=model.text, max_loras=max_loras, owns_base=True, **options
    )


class ServeConfig(Options):
    """`harnessrl serve`: a local model behind an OpenAI-compatible server (vLLM's flags where
    vLLM has them)."""

    model: str = Field(description="local model: tiny-random, smollm2-135m or hf:PATH")
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, le=65535, description="port (0 = any free port)")
    max_loras: int = Field(
        4, ge=0, description="most LoRA adapters loaded at once (each holds a copy of the base weights)"
    )
    served_model_name: Optional[str] = Field(
        None, description="the base model's name in requests and /v1/models (default: --model)"
    )
    device: Device = "auto"
    dtype: Dtype = Field("auto", description=DTYPE_HELP + "; int8 serves no LoRA adapters")
    lora_modules: list[str] = Field(
        default_factory=list,
        description="NAME=PATH: a peft adapter folder to load at start (repeatable)",
        json_schema_extra=cli(repeat=True),
    )
    max_lora_rank: int = Field(
        16, description="highest LoRA rank an adapter may have (vLLM's choices: 1, 8, 16, 32, 64, 128, 256, 320, 512)"
    )
    generation_config: str = Field(
        "vllm",
        description="vllm: a sampling field a request does not send takes the neutral default; auto (vLLM's "
        "default): it takes the model folder's generation_config.json value",
    )
    logprobs_mode: str = Field(
        "processed_logprobs",
        description="processed_logprobs: log-probs of the distribution sampled from (temperature applied); "
        "raw_logprobs (vLLM's default): of the untempered logits",
    )
    enable_auto_tool_choice: bool = Field(
        False,
        description="serve native tool calls (requests with `tools`): shown in the prompt and parsed back into "
        "tool_calls with --tool-call-parser (vLLM's flag; without it such requests get vLLM's 400)",
        json_schema_extra=cli(bool_flag=True),
    )
    tool_call_parser: Optional[str] = Field(
        None,
        description="the tool-call format of --enable-auto-tool-choice: a registered protocol (hermes for "
        "Qwen2.5/Qwen3, json, xml, react, code, or a plugin's; docs/serve.md#native-tool-calls)",
    )
    log_level: str = Field("info", description="the server's log level: critical, error, warning, info, debug, trace")
    admin_key: Optional[str] = Field(
        None,
        description="the key /v1/load_lora_adapter and /v1/unload_lora_adapter need, sent as 'Authorization: "
        "Bearer KEY' (default: $HARNESSRL_ADMIN_KEY, which keeps it out of the process list; neither given: "
        "one is drawn and written to a file only this user may read, whose path is printed at start)",
    )


def _admin_key(given: str | None) -> tuple[str, str, Path | None]:
    """(the key of the adapter routes, the line that tells the user how to send it, the file
    holding a drawn key): --admin-key, else $HARNESSRL_ADMIN_KEY, else a fresh key, written to a
    file only this user may read (never printed: the output may go to a log others read)."""
    from harnessrl.wire.auth import ADMIN_KEY_ENV, draw_admin_key, env_admin_key, write_key_file

    routes = "/v1/load_lora_adapter and /v1/unload_lora_adapter need 'Authorization: Bearer KEY'"
    if given:
        return given, f"{routes}, KEY being --admin-key", None
    key = env_admin_key()
    if key is not None:
        return key, f"{routes}, KEY being ${ADMIN_KEY_ENV}", None
    key = draw_admin_key()
    path = write_key_file(key)
    return (
        key,
        (
            f"{routes}; neither --admin-key nor ${ADMIN_KEY_ENV} was given, so KEY was drawn and written to {path} "
            f"(mode 0600, removed when the server stops): export {ADMIN_KEY_ENV}=$(cat {path}) where harnessrl train "
            "grpo --rollout-server runs"
        ),
        path,
    )


@config_command(ServeConfig)
def serve_cmd(config: ServeConfig) -> None:
    """Serve a local model over OpenAI's chat completions API (/v1/chat/completions, /v1/models,
    runtime LoRA adapters behind an admin key; native tool calls with --enable-auto-tool-choice
    --tool-call-parser); Ctrl-C stops."""
    from harnessrl.models import ModelUnavailable

    if config.dtype == "int8" and config.lora_modules:
        fail("--lora-modules: LoRA adapters are merged into float weights; serve with --dtype float32 or bfloat16")
    from harnessrl.serve.models import GENERATION_CONFIGS, LOGPROBS_MODES, MAX_LORA_RANKS

    if config.max_lora_rank not in MAX_LORA_RANKS:
        fail(f"--max-lora-rank must be one of {', '.join(map(str, MAX_LORA_RANKS))}, got {config.max_lora_rank}")
    if config.generation_config not in GENERATION_CONFIGS:
        fail(f"--generation-config must be {' or '.join(GENERATION_CONFIGS)}, got {config.generation_config!r}")
    if config.logprobs_mode not in LOGPROBS_MODES:
        fail(f"--logprobs-mode must be {' or '.join(LOGPROBS_MODES)}, got {config.logprobs_mode!r}")
    from harnessrl.serve.tools import check_tool_parser

    try:  # the registered formats, plugins included, are the choices
        tool_call_parser = check_tool_parser(config.enable_auto_tool_choice, config.tool_call_parser)
    except ValueError as e:
        fail(str(e))
    if config.log_level not in LOG_LEVELS:
        fail(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {config.log_level!r}")
    if config.max_loras < len(config.lora_modules):
        fail(f"--lora-modules names {len(config.lora_modules)} adapters but --max-loras is {config.max_loras}")
    modules = _lora_modules(config.lora_modules)
    from harnessrl.models.choice import choose_local
    from harnessrl.serve import ServeError, run_server
    from harnessrl.serve.models import LOCAL_ONLY

    try:  # before anything loads: not a local model, a device this machine lacks, int8 on a GPU
        chosen = choose_local(
            config.model, f"{LOCAL_ONLY}; {config.model.strip()!r} is not one", device=config.device, dtype=config.dtype
        )
    except ValueError as e:
        fail(str(e))
    try:
        models = _served(
            chosen,
            config.served_model_name,
            config.max_loras,
            max_lora_rank=config.max_lora_rank,
            generation_config=config.generation_config,
            logprobs_mode=config.logprobs_mode,
            tool_call_parser=tool_call_parser,
        )
    except (ValueError, ModelUnavailable, OSError) as e:
        fail(f"cannot serve {config.model!r}: {e}")
    try:
        for name, path in modules.items():
            try:
                models.load_adapter(name, path)
            except ServeError as e:
                fail(f"--lora-modules {name}={path}: {e.message}")
        names = ", ".join([models.base_name, *models.adapter_names()])
        key, how, key_file = _admin_key(config.admin_key)

        def announce(url: str) -> None:
            err.print(f"serving {names} at {url}  (Ctrl-C to stop)\n{how}", markup=False, highlight=False)

        try:
            run_server(
                models,
                host=config.host,
                port=config.port,
                log_level=config.log_level,
                announce=announce,
                admin_key=key,
            )
        except OSError as e:
            fail(f"cannot listen on {config.host}:{config.port}: {e}")
        finally:
            if key_file is not None:
                from harnessrl.wire.auth import remove_key_file

                remove_key_file(key_file)
    finally:
        models.close()
