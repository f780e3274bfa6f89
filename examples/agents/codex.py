"""Codex CLI (npm `@openai/codex`), unmodified, on one harnessrl episode (codex.yaml).

The glue is what Codex's command line cannot say, written per episode into its own CODEX_HOME
(the endpoint's URL holds the episode's token):

- config.toml: the episode's endpoint as a model provider of its own speaking the Responses API
  (`wire_api = "responses"`, the key read from OPENAI_API_KEY), approvals off, and everything
  that would reach another host off: update checks, analytics, feedback, OpenTelemetry export,
  web search, plugins and apps, remote model lists;
- with CODEX_MODEL_FAMILY set (codex.yaml sets it), a model catalog entry for the served model,
  made from that family's entry in the catalog bundled in the installed Codex itself (its prompt
  and tool set: `apply_patch` as a custom freeform tool, `exec_command`, ...) with what the
  served model does not have taken out: reasoning levels, verbosity, images,
  OpenAI's hosted tool search (MCP tools are listed to the model itself), and a context window of
  CODEX_CONTEXT_WINDOW. Without it Codex uses its fallback metadata for an
  unknown model (a different prompt and tools, no apply_patch).

Where the episode serves its task's tools over MCP (HARNESSRL_MCP_URL), config.toml names that
server as Codex's MCP server `harnessrl` (Streamable HTTP: `url`), whose tools reach the model as
`mcp__harnessrl__<tool>`.

Then `codex exec` on the task, with stdin closed (it waits on an open one), its last message
written to the answer file when it succeeds.
    usage: codex.py [PREFIX]   (PREFIX: where install_codex.sh put Codex; default the
                                repository's .agents folder)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = {
    "x86_64": ("linux-x64", "x86_64-unknown-linux-musl"),
    "aarch64": ("linux-arm64", "aarch64-unknown-linux-musl"),
}
PROVIDER = "harnessrl"
# what the episode's contract provides (docs/external-harness.md, "The contract")
NEEDED = (
    "HOME",
    "OPENAI_BASE_URL",
    "OPENAI_MODEL",
    "HARNESSRL_TASK_FILE",
    "HARNESSRL_WORKSPACE",
    "HARNESSRL_ANSWER_FILE",
)


def binary(prefix: Path) -> Path:
    """The native program inside the npm package (what its `codex` launcher runs)."""
    if platform.machine() not in TARGETS:
        sys.exit(f"codex.py: no Codex build for this machine ({platform.machine()}); Linux x86_64 and aarch64 have one")
    package, triple = TARGETS[platform.machine()]
    return prefix / "codex" / "node_modules" / "@openai" / f"codex-{package}" / "vendor" / triple / "bin" / "codex"


def toml(value: object) -> str:
    """A TOML value: JSON's strings, numbers and booleans are TOML's."""
    return json.dumps(value, ensure_ascii=False)


def model_entry(codex: Path, env: dict[str, str], family: str, model: str, window: int) -> dict:
    """The served model's catalog entry, from `family`'s in the installed Codex's bundled catalog."""
    out = subprocess.run(
        [str(codex), "debug", "models", "--bundled"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"codex.py: `codex debug models --bundled` failed: {out.stderr.strip()[-2000:]}")
    try:
        entries = {m.get("slug"): m for m in json.loads(out.stdout).get("models", [])}
    except (ValueError, AttributeError) as e:
        sys.exit(f"codex.py: `codex debug models --bundled` printed no catalog this script can read: {e}")
    if family not in entries:
        sys.exit(f"codex.py: CODEX_MODEL_FAMILY {family!r} is not in Codex's bundled catalog: {', '.join(entries)}")
    return {
        **entries[family],
        "slug": model,
        "display_name": model,
        "description": f"served by harnessrl, described as Codex's {family}",
        # what the endpoint refuses (a 400 naming it): a reasoning effort other than "none" (the
        # family's default is "medium"; these models do not reason) and a verbosity other than
        # "medium" (the family's default is "low"; they have no verbosity control)
        "supported_reasoning_levels": [],
        "default_reasoning_level": None,
        "support_verbosity": False,
        "default_verbosity": None,
        "input_modalities": ["text"],
        # MCP tools listed to the model itself, not behind OpenAI's hosted tool_search
        "supports_search_tool": False,
        "context_window": window,
        "max_context_window": window,
        "upgrade": None,
    }


def config(env: dict[str, str], catalog: Path | None) -> str:
    lines = [
        f"model = {toml(env['OPENAI_MODEL'])}",
        f"model_provider = {toml(PROVIDER)}",
        *([f"model_catalog_json = {toml(str(catalog))}"] if catalog else []),
        # no prompts: harnessrl's sandbox is the isolation, Codex's own one (bubblewrap) is not nested in it
        'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"',
        # nothing that reaches another host
        "check_for_update_on_startup = false",
        'web_search = "disabled"',
        "[analytics]",
        "enabled = false",
        "[feedback]",
        "enabled = false",
        "[otel]",
        'exporter = "none"',
        'metrics_exporter = "none"',
        'trace_exporter = "none"',
        "[history]",
        'persistence = "none"',
        "[agents]",
        "enabled = false",
        "[features]",
        "plugins = false",
        "apps = false",
        "remote_plugin = false",
        "plugin_sharing = false",
        "api_key_model_discovery = false",
        "image_generation = false",
        "browser_use = false",
        "computer_use = false",
        "goals = false",
        f"[model_providers.{PROVIDER}]",
        f"name = {toml(PROVIDER)}",
        f"base_url = {toml(env['OPENAI_BASE_URL'])}",
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
    ]
    if env.get("HARNESSRL_MCP_URL"):
        lines += [f"[mcp_servers.{PROVIDER}]", f"url = {toml(env['HARNESSRL_MCP_URL'])}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    prefix = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent.parent / ".agents"
    codex = binary(prefix.resolve())
    if not os.access(codex, os.X_OK):
        print(f"codex.py: no Codex at {codex} (run examples/agents/install_codex.sh)", file=sys.stderr)
        return 127
    env = dict(os.environ)
    missing = [name for name in NEEDED if not env.get(name)]
    if missing:
        sys.exit(f"codex.py: {', '.join(missing)} not set: it runs as a harnessrl episode (codex.yaml)")
    window_text = env.get("CODEX_CONTEXT_WINDOW", "32768")
    if not window_text.isdigit() or int(window_text) <= 0:
        sys.exit(f"codex.py: CODEX_CONTEXT_WINDOW must be a positive number of tokens, got {window_text!r}")
    home = Path(env["HOME"]) / "codex-home"
    home.mkdir(parents=True, exist_ok=True)
    env["CODEX_HOME"] = str(home)
    catalog = None
    family = env.get("CODEX_MODEL_FAMILY", "")
    if family:
        catalog = home / "models.json"
        entry = model_entry(codex, env, family, env["OPENAI_MODEL"], int(window_text))
        catalog.write_text(json.dumps({"models": [entry]}), encoding="utf-8")
    (home / "config.toml").write_text(config(env, catalog), encoding="utf-8")
    task = Path(env["HARNESSRL_TASK_FILE"]).read_text(encoding="utf-8")
    last = home / "last_message.txt"
    # --strict-config: a key this Codex does not know is an error, not a setting silently left on
    argv = [str(codex), "exec", "--strict-config", "--skip-git-repo-check", "--ephemeral", "--color", "never"]
    argv += ["--cd", env["HARNESSRL_WORKSPACE"], "--output-last-message", str(last), task]
    status = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL).returncode
    # an answer only when the turn succeeded: a failed one ends `exited` with Codex's exit status
    if status == 0 and last.exists():
        shutil.copyfile(last, env["HARNESSRL_ANSWER_FILE"])
    return status


if __name__ == "__main__":
    sys.exit(main())
