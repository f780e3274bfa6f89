#!/bin/sh
# mini-swe-agent, unmodified, on one harnessrl episode (mini_swe_agent.yaml). The glue is what its
# command line cannot say: the model's name and address from the episode's environment (litellm's
# `openai/` provider speaks chat completions to any OpenAI-compatible address), mini's model class
# (MINI_MODEL_CLASS: `litellm`, chat completions, or `litellm_response`, the Responses API), the
# task read from its file, and the final answer taken from the trajectory mini writes (its
# `submission`).
#   usage: mini_swe_agent.sh PYTHON   (the spec passes {python}, which has mini-swe-agent)
set -eu
python=$1
here=$(cd "$(dirname "$0")" && pwd)
trajectory="$HOME/mini.traj.json"
status=0
"$python" -m minisweagent \
    -c "$here/mini_swe_agent.config.yaml" \
    -c "model.model_kwargs.api_base=$OPENAI_BASE_URL" \
    -c "model.model_class=${MINI_MODEL_CLASS:-litellm}" \
    -m "openai/$OPENAI_MODEL" \
    -t "$(cat "$HARNESSRL_TASK_FILE")" \
    -y --exit-immediately -o "$trajectory" || status=$?
# an answer file only when mini submitted: any other exit (format errors, a refused request)
# leaves none, so the episode ends `exited` with mini's exit status in its detail
"$python" - "$trajectory" <<'PY'
import json, os, sys
info = json.load(open(sys.argv[1]))["info"]
print(f"mini-swe-agent: exit_status={info['exit_status']} api_calls={info['model_stats']['api_calls']}")
if info["exit_status"] == "Submitted":
    with open(os.environ["HARNESSRL_ANSWER_FILE"], "w") as f:
        f.write(info["submission"])
PY
exit $status
