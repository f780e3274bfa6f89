"""Cline's CLI (npm `cline`), unmodified, on one harnessrl episode (cline.yaml).

The glue is what Cline's command line cannot say, written per episode into a data folder of
the episode's own (`--data-dir $HOME/cline-data`, Cline's isolated local state):

- settings/global-settings.json: `telemetryOptOut` and no auto update (its OpenTelemetry export
  to otel.cline.bot off), written in the data folder and in ~/.cline/data, where Cline 3.0.65
  reads the opt-out whatever --data-dir says;
- the provider, set with Cline's own `cline auth`: its OpenAI-compatible provider
  (`openai`, stored as `openai-compatible`) with the episode's endpoint as its base URL, the
  run's model and key (CLINE_PROVIDER in the spec picks another provider id, such as
  `openai-native`, Cline's OpenAI provider, which speaks the Responses API).

Then the task as its one-shot prompt in yolo mode (`--yolo`: every tool approved, its
`submit_and_exit` tool on, sub-agents and teams off) with NDJSON output (`--json`) and stdin
closed; the summary of its `submit_and_exit` call (else the text of its `run_result` event) is
written to the answer file when the run completed and Cline exited 0. Where the episode serves
its task's tools over MCP (HARNESSRL_MCP_URL), that server is Cline's one MCP server
(settings/cline_mcp_settings.json), its tools shown to the model as harnessrl__<tool>.
    usage: cline.py [PREFIX]   (PREFIX: where install_cline.sh put Cline; default the
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
    """The compiled program of the npm package's platform package (what its `cline` launcher runs)."""
    if platform.machine() not in ARCHES:
        sys.exit(f"cline.py: no Cline build for this machine ({platform.machine()}); Linux x86_64 and aarch64 have one")
    return prefix / "cline" / "node_modules" / "@cline" / f"cli-linux-{ARCHES[platform.machine()]}" / "bin" / "cline"


def final_text(ndjson: str) -> str | None:
    """The answer of a completed run, else None: the `summary` of its last `submit_and_exit`
    call (yolo mode's way to end; Cline's own text after it prefixes "Submission recorded"), or
    the text of its `run_result` event where it ended without one."""
    result, submitted = None, None
    for line in ndjson.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "run_result":
            result = event
        inner = event.get("event") if event.get("type") == "agent_event" else None
        if (
            isinstance(inner, dict)
            and inner.get("toolName") == "submit_and_exit"
            and isinstance(inner.get("input"), dict)
        ):
            submitted = inner["input"].get("summary", submitted)
    if result is None or result.get("finishReason") != "completed":
        return None
    return str(submitted if submitted is not None else result.get("text") or "")


def main() -> int:
    prefix = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent.parent / ".agents"
    cline = binary(prefix.resolve())
    if not os.access(cline, os.X_OK):
        print(f"cline.py: no Cline at {cline} (run examples/agents/install_cline.sh)", file=sys.stderr)
        return 127
    env = dict(os.environ)
    missing = [name for name in NEEDED if not env.get(name)]
    if missing:
        sys.exit(f"cline.py: {', '.join(missing)} not set: it runs as a harnessrl episode (cline.yaml)")
    data = Path(env["HOME"]) / "cline-data"
    settings = json.dumps({"telemetryOptOut": True, "autoUpdateEnabled": False})
    for folder in (data, Path(env["HOME"]) / ".cline" / "data"):
        (folder / "settings").mkdir(parents=True, exist_ok=True)
        (folder / "settings" / "global-settings.json").write_text(settings, encoding="utf-8")
    if env.get("HARNESSRL_MCP_URL"):
        # the episode's task tools (Streamable HTTP) as Cline's one MCP server
        servers = {"mcpServers": {"harnessrl": {"type": "streamableHttp", "url": env["HARNESSRL_MCP_URL"]}}}
        (data / "settings" / "cline_mcp_settings.json").write_text(json.dumps(servers), encoding="utf-8")
    provider = env.get("CLINE_PROVIDER") or "openai"
    auth = [str(cline), "auth", "--provider", provider, "--apikey", env["OPENAI_API_KEY"]]
    auth += ["--modelid", env["OPENAI_MODEL"], "--baseurl", env["OPENAI_BASE_URL"], "--data-dir", str(data)]
    done = subprocess.run(auth, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"cline.py: `cline auth` failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
    task = Path(env["HARNESSRL_TASK_FILE"]).read_text(encoding="utf-8")
    argv = [str(cline), "--data-dir", str(data), "--json", "--yolo", "--cwd", env["HARNESSRL_WORKSPACE"], task]
    ran = subprocess.run(
        argv, env=env, cwd=env["HARNESSRL_WORKSPACE"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE
    )
    out = ran.stdout.decode("utf-8", "replace")
    sys.stdout.write(out)
    text = final_text(out)
    # an answer only when the run completed: a failed one ends `exited` with Cline's exit status
    if ran.returncode == 0 and text is not None:
        Path(env["HARNESSRL_ANSWER_FILE"]).write_text(text, encoding="utf-8")
    return ran.returncode


if __name__ == "__main__":
    sys.exit(main())
