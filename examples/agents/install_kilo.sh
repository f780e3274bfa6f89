#!/bin/sh
# Kilo Code's CLI (npm `@kilocode/cli`), pinned, for examples/agents/kilo.yaml
# (docs/external-harness.md, "Kilo Code CLI"). The npm package is a Node launcher plus a platform
# package holding Kilo's compiled program (Bun inside); kilo.py runs that program itself, so no
# particular Node is needed at run time, only npm to install. Into PREFIX (default: the
# repository's .agents folder, git-ignored), which must be readable by the sandbox's user
# (harnessrl running as root runs the agent as an unprivileged one): not under /root or /tmp.
#   usage: sh examples/agents/install_kilo.sh [PREFIX]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
prefix=${1:-$here/../../.agents}
# 7.7.7, not the newest 7.8.1: the registry here had no linux platform package of 7.8.1 ("No
# matching version found for @kilocode/cli-linux-x64@7.8.1" from its install script)
KILO_VERSION=7.7.7
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
npm install --no-audit --no-fund --loglevel=error --prefix "$prefix/kilo" "@kilocode/cli@$KILO_VERSION"
# readable by the sandbox's user: the installed files and the prefix itself
chmod -R a+rX "$prefix/kilo"
chmod a+rx "$prefix"
case $(uname -m) in aarch64) arch=arm64 ;; *) arch=x64 ;; esac
"$prefix/kilo/node_modules/@kilocode/cli-linux-$arch/bin/kilo" --version
