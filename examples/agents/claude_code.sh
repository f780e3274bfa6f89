#!/bin/sh
# Claude Code, unmodified, on one harnessrl episode (claude_code.yaml). The glue is what its
# command line cannot say: the episode's endpoint as its Anthropic base URL (Claude Code adds
# /v1/messages itself, so the URL without its /v1), the served model under every model role it
# has, the task read from its file on stdin, its final reply, which `claude -p` prints alone on
# stdout, copied to the answer file, and, where the episode serves its task's tools over MCP
# ($HARNESSRL_MCP_URL), that server as Claude Code's only MCP server (its tools reach the model
# as mcp__harnessrl__<tool>).
#   usage: claude_code.sh [PREFIX]   (PREFIX: where install_claude_code.sh put Claude Code;
#                                     default: the repository's .agents folder)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
claude="$prefix/claude-code/node_modules/.bin/claude"
if [ ! -x "$claude" ]; then
    echo "claude_code.sh: no Claude Code under $prefix (run examples/agents/install_claude_code.sh)" >&2
    exit 127
fi
ANTHROPIC_BASE_URL=${OPENAI_BASE_URL%/v1}
# sent as x-api-key; the episode's token in the URL is what the endpoint reads
ANTHROPIC_API_KEY=$OPENAI_API_KEY
# its main model and the ones it picks for side work: all the run's model, so no request names
# a model the endpoint would answer with another
ANTHROPIC_MODEL=$OPENAI_MODEL
ANTHROPIC_DEFAULT_OPUS_MODEL=$OPENAI_MODEL
ANTHROPIC_DEFAULT_SONNET_MODEL=$OPENAI_MODEL
ANTHROPIC_DEFAULT_HAIKU_MODEL=$OPENAI_MODEL
ANTHROPIC_SMALL_FAST_MODEL=$OPENAI_MODEL
# its settings, sessions and caches in the episode's own HOME, never the user's
CLAUDE_CONFIG_DIR=$HOME/.claude
export ANTHROPIC_BASE_URL ANTHROPIC_API_KEY ANTHROPIC_MODEL ANTHROPIC_DEFAULT_OPUS_MODEL \
    ANTHROPIC_DEFAULT_SONNET_MODEL ANTHROPIC_DEFAULT_HAIKU_MODEL ANTHROPIC_SMALL_FAST_MODEL CLAUDE_CONFIG_DIR

set -- -p --output-format text --no-session-persistence --dangerously-skip-permissions \
    --tools "${CLAUDE_CODE_TOOLS:-default}"
if [ -n "${HARNESSRL_MCP_URL:-}" ]; then
    # the URL is the endpoint's address and a URL-safe token: nothing in it needs JSON escaping
    printf '{"mcpServers": {"harnessrl": {"type": "http", "url": "%s"}}}\n' "$HARNESSRL_MCP_URL" > "$HOME/mcp.json"
    # that server only: none from a user's or a project's configuration
    set -- "$@" --mcp-config "$HOME/mcp.json" --strict-mcp-config
fi

cd "$HARNESSRL_WORKSPACE"
status=0
# headless (-p), every tool allowed without asking (the episode is the sandbox), no session kept
"$claude" "$@" < "$HARNESSRL_TASK_FILE" > "$HOME/claude.out" || status=$?
cat "$HOME/claude.out"
# an answer file only when the turn succeeded (exit 0): an API error or a limit leaves none, so
# the episode ends `exited` with Claude Code's exit status in its detail
if [ "$status" -eq 0 ]; then
    cp "$HOME/claude.out" "$HARNESSRL_ANSWER_FILE"
fi
exit $status
