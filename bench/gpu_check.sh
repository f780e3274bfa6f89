#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU and access to PyPI and the Hugging Face hub:
#   1. installs vLLM and harnessrl into a virtual environment of their own ($VENV);
#   2. starts vLLM on a small instruct model with runtime LoRA updating on;
#   3. bench/served_throughput.py: harnessrl's runner against vLLM, and vLLM's own speed on the
#      same requests sent all at once;
#   4. 3 GRPO steps with rollouts on vLLM and the adapter hot-reloaded after every update
#      (the trainer itself runs in this process, on the CPU unless the model is moved);
#   5. prints one GPU_CHECK_JSON line.
#
#   bash bench/gpu_check.sh                                  # defaults below
#   MODEL=Qwen/Qwen2.5-1.5B-Instruct EPISODES=128 bash bench/gpu_check.sh
#
# Everything it writes goes under $OUT (default runs/gpu-check); the vLLM log is $OUT/vllm.log.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
PORT=${PORT:-8011}
VENV=${VENV:-.venv-gpu}
OUT=${OUT:-runs/gpu-check}
EPISODES=${EPISODES:-64}
IN_FLIGHT=${IN_FLIGHT:-64}
GPU_MEMORY=${GPU_MEMORY:-0.6}
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/vllm" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet vllm      # brings its own CUDA build of torch
    "$VENV/bin/pip" install --quiet -e .
fi
PY="$VENV/bin/python"

# the trainer loads the same weights from a local folder (hf:PATH)
MODEL_DIR=$("$PY" -c "from huggingface_hub import snapshot_download; print(snapshot_download('$MODEL'))")

VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "$VENV/bin/vllm" serve "$MODEL_DIR" --served-model-name base \
    --port "$PORT" --enable-lora --max-lora-rank 16 --max-loras 2 \
    --gpu-memory-utilization "$GPU_MEMORY" >"$OUT/vllm.log" 2>&1 &
VLLM_PID=$!
trap 'kill $VLLM_PID 2>/dev/null || true' EXIT
URL="http://127.0.0.1:$PORT/v1"
for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; then break; fi
    if ! kill -0 "$VLLM_PID" 2>/dev/null; then echo "vLLM exited; see $OUT/vllm.log" >&2; exit 1; fi
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "vLLM did not start in 10 min" >&2; exit 1; }

"$PY" bench/served_throughput.py --url "$URL" --model base --episodes "$EPISODES" --in-flight "$IN_FLIGHT" \
    --json-out "$OUT/throughput.json" | tee "$OUT/throughput.log"

rm -rf "$OUT/grpo"
"$VENV/bin/harnessrl" train grpo --model "hf:$MODEL_DIR" --rollout-server "$URL" --suite toolcalc \
    --harnesses json-tools,react --steps 3 --tasks-per-step 4 --group-size 4 --no-progress \
    --out "$OUT/grpo" 2>&1 | tee "$OUT/grpo.log"

"$PY" - "$OUT" "$MODEL" <<'EOF'
import json, sys
from pathlib import Path

out, model = Path(sys.argv[1]), sys.argv[2]
throughput = json.loads((out / "throughput.json").read_text())
steps = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines() if line.strip()]
keys = ("step", "harness", "reward_mean", "zero_std_frac", "loss", "optimizer_step", "policy_lag_max",
        "time_adapter_sync")
print("GPU_CHECK_JSON " + json.dumps({
    "model": model,
    "runner_tok_s": throughput["runner"]["tok_s"],
    "replay_tok_s": throughput["replay"]["tok_s"],
    "runner_over_replay": throughput["runner_over_replay"],
    "episodes": throughput["episodes"],
    "grpo_steps": [{k: s.get(k) for k in keys} | {"rollout_s": s["time"]["rollout"]} for s in steps],
}))
EOF
