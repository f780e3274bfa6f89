#!/usr/bin/env bash
# One whole GRPO step (rollouts and update) of the react gain workload, as the command line runs it,
# with this checkout's harnessrl and with an earlier commit's, alternating (before, now, now, before
# for 2 repeats), on the same machine in the same run: react, 8 toolcalc train tasks x group 4,
# T=1.0, lr 2e-4, seed 0, from the supervised warm start (runs/ws/sft/adapter, bench/doc 03).
#
#   bash bench/grpo_step_vs.sh BEFORE_REV [REPEATS] [WARM_START_ADAPTER]
#
# The earlier commit's src/ is checked out into a temporary git worktree and put first on
# PYTHONPATH (the .venv's editable install points at this checkout's src/). Each run's
# metrics.jsonl line (its `time` in parts, tokens, reward) and wall clock are printed, with the
# load average after it. Sampled tokens may differ between the two (log-prob rounding).
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: bash bench/grpo_step_vs.sh BEFORE_REV [REPEATS] [WARM_START_ADAPTER]}
repeats=${2:-2}
adapter=${3:-runs/ws/sft/adapter}
[ -d "$adapter" ] || { echo "no warm start at $adapter (bench/bandit_gain.py --until warm-start builds it)" >&2; exit 2; }
work=$(mktemp -d)
chmod 755 "$work"
trap 'git worktree remove --force "$work/before" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add -q --detach "$work/before" "$before"

step() {  # WHICH REPEAT
    local out="$work/$1-$2" src=()
    [ "$1" = before ] && src=(env "PYTHONPATH=$work/before/src")
    local t0 t1
    t0=$(date +%s.%N)
    "${src[@]}" .venv/bin/python -c "from harnessrl.cli import main; main()" train grpo \
        --model "hf:$adapter" --suite toolcalc --harnesses react --scheduler single:react --steps 1 \
        --tasks-per-step 8 --group-size 4 --lr 2e-4 --temperature 1.0 --seed 0 --no-progress \
        --out "$out" >"$out.log" 2>&1 || { echo "$1 repeat $2 failed:"; tail -5 "$out.log"; exit 1; }
    t1=$(date +%s.%N)
    .venv/bin/python - "$out/metrics.jsonl" "$1" "$2" "$(echo "$t1 - $t0" | bc)" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
path, which, repeat, wall, load = sys.argv[1:]
r = json.loads(open(path).readline())
keep = {k: r.get(k) for k in ("episodes", "completion_tokens", "reward_mean")}
print("STEP_JSON " + json.dumps({"which": which, "repeat": int(repeat), "wall_s": float(wall), "load": float(load), **keep, "time": r["time"]}))
PY
}

for r in $(seq 1 "$repeats"); do
    if [ $((r % 2)) -eq 1 ]; then step before "$r"; step now "$r"; else step now "$r"; step before "$r"; fi
done
