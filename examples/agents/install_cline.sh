#!/bin/sh
# Cline's CLI (npm `cline`), pinned, for examples/agents/cline.yaml (docs/external-harness.md,
# "Cline"). The npm package is a Node launcher plus a platform package holding Cline's compiled
# program (Bun inside); cline.py runs that program itself, so no particular Node is needed at
# run time, only npm to install. Into PREFIX (default: the repository's .agents folder,
# git-ignored), which must be readable by the sandbox's user (harnessrl running as root runs the
# agent as an unprivileged one): not under /root or /tmp.
#   usage: sh examples/agents/install_cline.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
CLINE_VERSION=3.0.65
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
npm install --no-audit --no-fund --loglevel=error --prefix "$prefix/cline" "cline@$CLINE_VERSION"
# readable by the sandbox's user: the installed files and the prefix itself
chmod -R a+rX "$prefix/cline"
chmod a+rx "$prefix"
case $(uname -m) in aarch64) arch=arm64 ;; *) arch=x64 ;; esac
"$prefix/cline/node_modules/@cline/cli-linux-$arch/bin/cline" --version
