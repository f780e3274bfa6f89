"""Kilo Code's CLI (npm `@kilocode/cli`), unmodified, on one harnessrl episode (kilo.yaml).

The glue is what Kilo's command line cannot say, written per episode into the episode's HOME
(the endpoint's URL holds the episode's token):

- a config file (kilo.json, named by KILO_CONFIG): the episode's endpoint as a custom provider
  `harnessrl` on an AI SDK package Kilo bundles (KILO_PROVIDER_PACKAGE in the spec:
  `@ai-sdk/openai-compatible` speaks chat completions, `@ai-sdk/openai` the Responses API) with
  the run's model (its context KILO_CONTEXT_WINDOW), that provider the only one enabled, the
  run's model as its model and small model, no auto update, no sharing; the built-in tools named
  in KILO_DISABLED_TOOLS (comma-separated) turned off;
- where the episode serves its task's tools over MCP (HARNESSRL_MCP_URL), that server as a
  remote MCP server `harnessrl`.

Then `kilo run` on the task with every permission approved (`--auto`), raw JSON events
(`--format json`) and stdin closed; the text parts of its events are written to the answer file
when it exits 0.
    usage: kilo.py [PREFIX]   (PREFIX: where install_kilo.sh put Kilo; default the
                               repository's .agents folder)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCHES = {"x86_64": "x64", "aarch64": "arm64"}
PROVIDER = "harnessrl"
# what the episode's contract provides (docs/external-harness.md, "The contract")
NEEDED = (
    "HOME",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
    "HARNESSRL_TASK_FILE",
    "HARNESSRL_WORKSPACE",
    "HARNESSRL_ANSWER_FILE",
)


def binary(prefix: Path) -> Path:
    """The compiled program of the npm package's platform package (what its `kilo` launcher runs)."""
    if platform.machine() not in ARCHES:
        sys.exit(f"kilo.py: no Kilo build for this machine ({platform.machine()}); Linux x86_64 and aarch64 have one")
    return prefix / "kilo" / "node_modules" / "@kilocode" / f"cli-linux-{ARCHES[platform.machine()]}" / "bin" / "kilo"


def config(env: dict[str, str]) -> dict:
    model = env["OPENAI_MODEL"]
    window = int(env.get("KILO_CONTEXT_WINDOW") or 32768)
    provider = {
        "npm": env.get("KILO_PROVIDER_PACKAGE") or "@ai-sdk/openai-compatible",
        "name": PROVIDER,
        "options": {"baseURL": env["OPENAI_BASE_URL"], "apiKey": env["OPENAI_API_KEY"]},
        "models": {model: {"name": model, "limit": {"context": window, "output": 1024}}},
    }
    settings: dict = {
        "provider": {PROVIDER: provider},
        # only the episode's provider: no model list of Kilo's gateway fetched
        "enabled_providers": [PROVIDER],
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
    }
    disabled = [name.strip() for name in env.get("KILO_DISABLED_TOOLS", "").split(",") if name.strip()]
    if disabled:
        settings["tools"] = {name: False for name in disabled}
    if env.get("HARNESSRL_MCP_URL"):
        settings["mcp"] = {PROVIDER: {"type": "remote", "url": env["HARNESSRL_MCP_URL"], "enabled": True}}
    return settings


def final_text(events: str) -> str:
    """The text parts of the run's JSON events, in order (its replies)."""
    texts = []
    for line in events.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        part = event.get("part") if isinstance(event, dict) else None
        if event.get("type") == "text" and isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts[-1] if texts else ""


def main() -> int:
    prefix = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent.parent / ".agents"
    kilo = binary(prefix.resolve())
    if not os.access(kilo, os.X_OK):
        print(f"kilo.py: no Kilo at {kilo} (run examples/agents/install_kilo.sh)", file=sys.stderr)
        return 127
    env = dict(os.environ)
    missing = [name for name in NEEDED if not env.get(name)]
    if missing:
        sys.exit(f"kilo.py: {', '.join(missing)} not set: it runs as a harnessrl episode (kilo.yaml)")
    window = env.get("KILO_CONTEXT_WINDOW", "32768")
    if not window.isdigit() or int(window) <= 0:
        sys.exit(f"kilo.py: KILO_CONTEXT_WINDOW must be a positive number of tokens, got {window!r}")
    path = Path(env["HOME"]) / "kilo.json"
    path.write_text(json.dumps(config(env), indent=2), encoding="utf-8")
    env["KILO_CONFIG"] = str(path)
    task = Path(env["HARNESSRL_TASK_FILE"]).read_text(encoding="utf-8")
    argv = [str(kilo), "run", "--format", "json", "--auto", "--dir", env["HARNESSRL_WORKSPACE"], task]
    ran = subprocess.run(
        argv, env=env, cwd=env["HARNESSRL_WORKSPACE"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    out = ran.stdout.decode("utf-8", "replace")
    sys.stdout.write(out)
    # an answer only when the run succeeded: a failed one ends `exited` with Kilo's exit status
    if ran.returncode == 0:
        Path(env["HARNESSRL_ANSWER_FILE"]).write_text(final_text(out), encoding="utf-8")
    return ran.returncode


if __name__ == "__main__":
    sys.exit(main())
