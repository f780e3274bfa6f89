#!/bin/sh
# GitHub Copilot CLI, unmodified, on one harnessrl episode (copilot.yaml). The glue is what its
# command line cannot say: the episode's endpoint as its own model provider (BYOK: Copilot's
# documented COPILOT_PROVIDER_* variables, offline, no GitHub sign-in), its state in the
# episode's HOME, the task as its non-interactive prompt (`copilot -p`), and its final reply
# copied to the answer file.
#   usage: copilot.sh [PREFIX]   (PREFIX: where install_copilot.sh put Copilot;
#                                 default: the repository's .agents folder)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
case $(uname -m) in
    x86_64) arch=x64 ;;
    aarch64) arch=arm64 ;;
    *) echo "copilot.sh: no Copilot CLI build for $(uname -m)" >&2; exit 127 ;;
esac
# the native program of the npm package's platform package (what its Node launcher runs)
copilot="$prefix/copilot/node_modules/@github/copilot-linux-$arch/copilot"
if [ ! -x "$copilot" ]; then
    echo "copilot.sh: no Copilot CLI under $prefix (run examples/agents/install_copilot.sh)" >&2
    exit 127
fi
# the provider (BYOK): the episode's endpoint as an OpenAI-compatible one ("completions", chat
# completions, by default; COPILOT_PROVIDER_WIRE_API=responses in the spec for the Responses
# API), the run's model by name, the key sent as Authorization (read as nothing: the episode's
# token in the URL is what the endpoint reads)
COPILOT_PROVIDER_BASE_URL=$OPENAI_BASE_URL
COPILOT_PROVIDER_API_KEY=$OPENAI_API_KEY
COPILOT_MODEL=$OPENAI_MODEL
# its configuration, sessions and logs in the episode's own HOME, never the user's
COPILOT_HOME=$HOME/.copilot
export COPILOT_PROVIDER_BASE_URL COPILOT_PROVIDER_API_KEY COPILOT_MODEL COPILOT_HOME

set -- --allow-all --no-ask-user --no-auto-update --disable-client-telemetry --no-color \
    --no-custom-instructions --log-dir "$HOME/copilot-logs" -s
# the built-in tools offered (COPILOT_TOOLS, comma-separated; unset or empty: all of them)
tools=${COPILOT_TOOLS:-}
if [ -n "${HARNESSRL_MCP_URL:-}" ]; then
    # the episode's task tools (Streamable HTTP) as its one added MCP server; its tools reach the
    # model as harnessrl-<tool>, and the server's name in --available-tools names them all
    printf '{"mcpServers": {"harnessrl": {"type": "http", "url": "%s", "tools": ["*"]}}}\n' \
        "$HARNESSRL_MCP_URL" > "$HOME/mcp.json"
    set -- "$@" --additional-mcp-config "@$HOME/mcp.json"
    if [ -n "$tools" ]; then
        tools="$tools,harnessrl"
    fi
fi
if [ -n "$tools" ]; then
    set -- "$@" "--available-tools=$tools"
fi

cd "$HARNESSRL_WORKSPACE"
status=0
# non-interactive (-p), every tool, path and URL allowed without asking (the episode is the
# sandbox), only the agent's reply printed (-s)
"$copilot" "$@" -p "$(cat "$HARNESSRL_TASK_FILE")" > "$HOME/copilot.out" || status=$?
cat "$HOME/copilot.out"
# an answer file only when the turn succeeded (exit 0): an API error or a limit leaves none, so
# the episode ends `exited` with Copilot's exit status in its detail
if [ "$status" -eq 0 ]; then
    cp "$HOME/copilot.out" "$HARNESSRL_ANSWER_FILE"
fi
exit $status
