#!/bin/sh
# GitHub Copilot CLI (npm `@github/copilot`), pinned, for examples/agents/copilot.yaml
# (docs/external-harness.md, "GitHub Copilot CLI"). The npm package is a Node launcher plus a
# platform package holding Copilot's native program; copilot.sh runs the native program itself,
# so no particular Node is needed at run time, only npm to install. Into PREFIX (default: the
# repository's .agents folder, git-ignored), which must be readable by the sandbox's user
# (harnessrl running as root runs the agent as an unprivileged one): not under /root or /tmp.
#   usage: sh examples/agents/install_copilot.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
COPILOT_VERSION=1.0.102
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
npm install --no-audit --no-fund --loglevel=error --prefix "$prefix/copilot" "@github/copilot@$COPILOT_VERSION"
# readable by the sandbox's user: the installed files and the prefix itself
chmod -R a+rX "$prefix/copilot"
chmod a+rx "$prefix"
"$prefix/copilot/node_modules/.bin/copilot" --version
