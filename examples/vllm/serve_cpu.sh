#!/bin/sh
# Start vLLM's CPU build (examples/vllm/install_cpu.sh) on a harnessrl model, with the flags
# GRPO's rollouts need (docs/scale.md, "vLLM on a CPU"):
#   usage: sh examples/vllm/serve_cpu.sh MODEL PORT [more vLLM flags...]
#   MODEL: smollm2-135m | tiny-random | hf:PATH   (the folder: `harnessrl models folder MODEL`)
# Environment (each optional):
#   VLLM_VENV       vLLM's environment (default: .venv-vllm in the repository)
#   HARNESSRL       the harnessrl command that names the model's folder (default: .venv/bin/harnessrl)
#   SERVED_NAME     the model's name on the server (default: base)
#   DTYPE           vLLM's --dtype (default float32: what the trainer computes on a CPU; bfloat16
#                   is vLLM's CPU default and its logprobs differ from a float32 trainer's)
#   KV_CACHE_GB     VLLM_CPU_KVCACHE_SPACE, GiB of key/value cache (default 2)
#   MAX_MODEL_LEN   --max-model-len (default 8192, SmolLM2's context)
#   VLLM_CPU_OMP_THREADS_BIND   vLLM's cores for its compute threads (default: vLLM's `auto`,
#                   which on this 2-core machine binds one core and leaves one to the API server)
#   HARNESSRL_ADMIN_KEY  vLLM's API key, which the trainer sends (default: one drawn here and printed)
# vLLM then answers a /v1 request only with `Authorization: Bearer KEY`: without a key any
# program that reaches the port (an agent program of the run among them) could load or unload
# the adapter every rollout samples from. It goes in as VLLM_API_KEY (vLLM's --api-key), kept
# off the command line, which every process of the machine can read.
# The server listens on 127.0.0.1:PORT; `exec` makes it this script's process, so killing the
# script's pid stops it.
set -eu
if [ $# -lt 2 ]; then
    echo "usage: sh $0 MODEL PORT [vLLM flags...]   (MODEL: smollm2-135m, tiny-random or hf:PATH)" >&2
    exit 2
fi
model=$1
port=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${VLLM_VENV:-$root/.venv-vllm}
harnessrl=${HARNESSRL:-$root/.venv/bin/harnessrl}
if [ ! -x "$venv/bin/python" ]; then
    echo "no vLLM environment at $venv: run sh examples/vllm/install_cpu.sh first" >&2
    exit 1
fi
folder=$("$harnessrl" models folder "$model")
preload=""
for lib in /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 "$venv/lib/libiomp5.so"; do
    [ -e "$lib" ] && preload="$preload${preload:+:}$lib"
done
export LD_PRELOAD="$preload${LD_PRELOAD:+:$LD_PRELOAD}"
# without it vLLM has no /v1/load_lora_adapter and /v1/unload_lora_adapter routes
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
if [ -z "${HARNESSRL_ADMIN_KEY:-}" ]; then
    HARNESSRL_ADMIN_KEY=$("$venv/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))')
    echo "serve_cpu.sh: HARNESSRL_ADMIN_KEY is not set; vLLM's API key was drawn:" \
        "export HARNESSRL_ADMIN_KEY=$HARNESSRL_ADMIN_KEY where the trainer runs" >&2
fi
export VLLM_API_KEY="$HARNESSRL_ADMIN_KEY"
export VLLM_CPU_KVCACHE_SPACE="${KV_CACHE_GB:-2}"
exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$folder" --served-model-name "${SERVED_NAME:-base}" \
    --host 127.0.0.1 --port "$port" \
    --dtype "${DTYPE:-float32}" --max-model-len "${MAX_MODEL_LEN:-8192}" \
    --enable-lora --max-lora-rank 16 --max-loras 2 \
    --logprobs-mode processed_logprobs --generation-config vllm \
    "$@"
