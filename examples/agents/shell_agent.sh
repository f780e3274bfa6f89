#!/bin/sh
# A shell-only agent program, usable as a harnessrl external harness (see shell_agent.yaml).
#
# It talks to the model with curl, keeps the conversation as JSON in $HOME, and offers the
# model two native tools: run(command), a shell command run in the workspace, and
# submit(answer). JSON is read and written with python3's standard library (no packages).
# A reply without a tool call is the final answer. The contract's environment variables
# (docs/external-harness.md): OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL,
# HARNESSRL_TASK_FILE, HARNESSRL_WORKSPACE, HARNESSRL_ANSWER_FILE, HARNESSRL_MAX_MODEL_CALLS.
set -eu

conversation="$HOME/conversation.json"
max_calls="${HARNESSRL_MAX_MODEL_CALLS:-10}"
max_tokens="${AGENT_MAX_TOKENS:-256}"
command_timeout="${AGENT_COMMAND_TIMEOUT:-30}"

json() { python3 -c "$@"; }

# The conversation so far: the system prompt and the task.
json '
import json, os, sys
system = ("You solve tasks in a workspace folder with shell commands. Call run with one command "
          "at a time and read its output. When the task is done, call submit with your final answer "
          "(empty if the task asks for none).")
task = open(os.environ["HARNESSRL_TASK_FILE"]).read()
json.dump([{"role": "system", "content": system}, {"role": "user", "content": task}], open(sys.argv[1], "w"))
' "$conversation"

calls=0
while [ "$calls" -lt "$max_calls" ]; do
    calls=$((calls + 1))
    # The request: the conversation and the two tools.
    json '
import json, os, sys
tools = [
    {"type": "function", "function": {"name": "run", "description": "Run a shell command in the workspace.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Finish with your final answer.",
     "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": []}}},
]
body = {"model": os.environ.get("OPENAI_MODEL", "model"), "messages": json.load(open(sys.argv[1])),
        "tools": tools, "max_tokens": int(sys.argv[2])}
json.dump(body, open(sys.argv[3], "w"))
' "$conversation" "$max_tokens" "$HOME/request.json"
    status=$(curl -sS -o "$HOME/reply.json" -w '%{http_code}' -X POST "$OPENAI_BASE_URL/chat/completions" \
        -H "Content-Type: application/json" -H "Authorization: Bearer $OPENAI_API_KEY" \
        --data-binary "@$HOME/request.json")
    if [ "$status" != 200 ]; then
        echo "shell agent: the model answered HTTP $status: $(cat "$HOME/reply.json")" >&2
        exit 1
    fi
    # Keep the reply; write its first tool call (id, name, argument) to files, or say there is none.
    json '
import json, sys
home, conversation = sys.argv[1], sys.argv[2]
message = json.load(open(home + "/reply.json"))["choices"][0]["message"]
messages = json.load(open(conversation))
messages.append({k: v for k, v in message.items() if v is not None})
calls = message.get("tool_calls") or []
for extra in calls[1:]:  # one command per turn: the others are answered, not run
    messages.append({"role": "tool", "tool_call_id": extra["id"], "content": "not run: one call per turn"})
json.dump(messages, open(conversation, "w"))
if not calls:
    open(home + "/call.name", "w").write("")
    open(home + "/call.arg", "w").write(message.get("content") or "")
else:
    call = calls[0]
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = {}
    open(home + "/call.id", "w").write(call["id"])
    open(home + "/call.name", "w").write(call["function"]["name"])
    open(home + "/call.arg", "w").write(str(args.get("command", args.get("answer", ""))))
' "$HOME" "$conversation"
    name=$(cat "$HOME/call.name")
    if [ "$name" = "" ] || [ "$name" = submit ]; then
        cp "$HOME/call.arg" "$HARNESSRL_ANSWER_FILE"
        exit 0
    fi
    if [ "$name" = run ]; then
        command=$(cat "$HOME/call.arg")
        code=0
        (cd "$HARNESSRL_WORKSPACE" && timeout "$command_timeout" sh -c "$command") > "$HOME/call.full" 2>&1 \
            || code=$?
        head -c 4000 "$HOME/call.full" > "$HOME/call.output"
        printf '\n[exit status %s]' "$code" >> "$HOME/call.output"
    else
        printf 'unknown tool: %s' "$name" > "$HOME/call.output"
    fi
    json '
import json, sys
home, conversation = sys.argv[1], sys.argv[2]
messages = json.load(open(conversation))
messages.append({"role": "tool", "tool_call_id": open(home + "/call.id").read(), "content": open(home + "/call.output").read()})
json.dump(messages, open(conversation, "w"))
' "$HOME" "$conversation"
done
echo "shell agent: out of model calls without an answer" >&2
exit 1
