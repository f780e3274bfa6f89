#!/bin/sh
# Codex CLI (npm `@openai/codex`), pinned, for examples/agents/codex.yaml (docs/external-harness.md,
# "Codex CLI"). The npm package is a launcher plus a native binary (its platform package); codex.py
# runs the binary itself, so no particular Node is needed at run time, only npm to install. Into
# PREFIX (default: the repository's .agents folder, git-ignored), which must be readable by the
# sandbox's user (harnessrl running as root runs the agent as an unprivileged one): not under
# /root or /tmp. Measured here: ~10 s, ~400 MB on disk.
#   usage: sh examples/agents/install_codex.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
CODEX_VERSION=0.169.1
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
npm install --no-audit --no-fund --loglevel=error --prefix "$prefix/codex" "@openai/codex@$CODEX_VERSION"
# readable by the sandbox's user: the installed files and the prefix itself
chmod -R a+rX "$prefix/codex"
chmod a+rx "$prefix"
"$prefix/codex/node_modules/.bin/codex" --version
