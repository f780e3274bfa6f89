"""Every turn of an agent program's episode in one sequence (harness/sampled_turns.py): when the
agent sends back a reply the recording endpoint handed out, the next prompt continues from the
token ids the model sampled for it, so each call's prompt begins with the previous call's prompt
and completion and episode_sequence keeps every turn.

A scripted agent (the standard library, urllib against OPENAI_BASE_URL) makes 3 calls, the 2nd
and 3rd carrying back the earlier replies: on the tiny random model (plain text), and on a
scripted model whose tokens are split as a tokenizer never would (a plain reply, then a tool call
and its result), once as handed out and once reformatted the way agents do. A reply the agent
altered falls back to rendering from text and is counted. Then mini-swe-agent, unmodified, on the
tiny random model: every model call of its episodes is in the trained sequence.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from harnessrl.harness.spec import ExternalHarnessSpec, load_spec, parse_spec
from harnessrl.models import chat
from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks import get_suite
from harnessrl.train.episode_sequence import episode_sequence
from harnessrl.types import ModelCall, Termination, Trajectory

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "examples" / "agents" / "mini_swe_agent.yaml"

# The agent: 3 chat completions, each carrying back the replies before it. MODE (argv[1]):
# "verbatim" sends every reply back as it came; "reformatted" collapses the whitespace of its text,
# drops a None content and rewrites the arguments of its tool calls with other spacing and key
# order; "altered" appends a word to the first reply. A reply with tool calls is answered with a
# tool message for each call.
AGENT = r"""
import json, os, sys, urllib.request
mode = sys.argv[1]
tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a key up.",
          "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer"}}}}}]
def ask(messages):
    body = {"model": "m", "messages": messages, "max_tokens": 16, "tools": tools}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request).read())["choices"][0]["message"]
def back(reply, first):
    message = {"role": "assistant", "content": reply.get("content")}
    if mode == "reformatted":
        message["content"] = " ".join((reply.get("content") or "").split()) or None
        if message["content"] is None:
            del message["content"]
    if mode == "altered" and first:
        message["content"] = (reply.get("content") or "") + " (edited)"
    calls = reply.get("tool_calls") or []
    if calls:
        message["tool_calls"] = []
        for call in calls:
            arguments = call["function"]["arguments"]
            if mode == "reformatted":
                arguments = json.dumps(dict(reversed(list(json.loads(arguments).items()))), indent=2)
            message["tool_calls"].append({"id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"], "arguments": arguments}})
    after = [{"role": "tool", "tool_call_id": c["id"], "content": "the value is 42"} for c in calls]
    return [message, *after] if calls else [message, {"role": "user", "content": "Go on."}]
messages = [{"role": "system", "content": "You are a careful agent."},
            {"role": "user", "content": open(os.environ["HARNESSRL_TASK_FILE"]).read()}]
for turn in range(3):
    reply = ask(messages)
    if turn < 2:
        messages += back(reply, turn == 0)
open(os.environ["HARNESSRL_ANSWER_FILE"], "w").write(reply.get("content") or "")
"""


def agent(mode: str) -> ExternalHarnessSpec:
    spec = parse_spec(
        {
            "name": f"three-calls-{mode}",
            "kind": "external",
            "command": ["{python}", "-c", AGENT, mode],
            "limits": {"wall_s": 60, "max_model_calls": 3, "max_new_tokens": 16},
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


class SampledScript(ScriptedPolicy):
    """A scripted model that samples as a model may: each reply's tokens one character each (a
    split the tokenizer never makes of that text, so rendering the reply from its text gives other
    tokens), and, with `sampled_history`, prompts that continue a request's sampled prefix as
    HFPolicy's do (chat.continue_prompt_ids)."""

    def __init__(self, script, tokenizer, sampled_history: bool = True):
        super().__init__(script, tokenizer=tokenizer, name="sampled-script")
        self.sampled_history = sampled_history

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if self.sampled_history and request.sampled_prefix is not None:
            ids = chat.continue_prompt_ids(
                self.tokenizer, request.sampled_prefix, request.messages, [self.end_of_turn], self.tool_role
            )
            if ids is not None:
                return ids
        return chat.render_prompt_ids(self.tokenizer, request.messages, self.tool_role, request.tools)

    def _complete_one(self, request: GenerationRequest) -> ModelCall:
        text = self.reply(request.messages)
        ids = [i for ch in text for i in self.tokenizer(ch, add_special_tokens=False)["input_ids"]]
        assert ids != self.tokenizer(text, add_special_tokens=False)["input_ids"], "the split must be the model's own"
        ids.append(self.end_of_turn)
        return chat.finish_call(self.tokenizer, request, self.prompt_ids(request), ids, [0.0] * len(ids), "stop")


TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha  beta", "n": 2}}\n</tool_call>'
SCRIPT = ["First,   I will look.\n", f"Looking it up now.\n{TOOL_CALL}", "The answer is 42."]


def play(policy, spec: ExternalHarnessSpec, temperature: float = 0.0) -> Trajectory:
    task = get_suite("workspace").tasks("dev", 1)[0]
    runner = Runner(policy, SamplingParams(temperature=temperature), max_in_flight=1, max_retries=0, progress=False)
    [trajectory] = runner.run(make_jobs([task], [spec], 1))
    assert not trajectory.is_infra_error, trajectory.infra_error
    return trajectory


def chained(trajectory: Trajectory) -> bool:
    """Whether every call's prompt begins with the previous call's prompt and completion."""
    calls = [s.model_call for s in trajectory.steps]
    return all(
        list(b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)]) == [*a.prompt_ids, *a.completion_ids]
        for a, b in zip(calls, calls[1:])
    )


def kept(trajectory: Trajectory) -> tuple[int, int]:
    sequence = episode_sequence(trajectory)
    assert sequence is not None
    return sequence.turns_kept, sequence.turns


@pytest.fixture(scope="module")
def tiny_sampled(tokenizer):
    """An HFPolicy over the tiny random model that continues sampled prefixes (as HarnessRollout's)."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    policy = HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")
    policy.sampled_history = True
    yield policy
    policy.close()


# ------------------------------------------------------------------------ the scripted agent


def test_three_calls_on_the_tiny_random_model_are_one_sequence(tiny_sampled):
    trajectory = play(tiny_sampled, agent("verbatim"), temperature=1.0)
    assert trajectory.termination == Termination.submitted, trajectory.termination_detail
    assert len(trajectory.steps) == 3
    assert chained(trajectory)
    assert kept(trajectory) == (3, 3)
    stats = trajectory.meta["sampled_turns"]
    assert stats == {"calls": 3, "continued": 2, "altered_replies": 0, "dropped_replies": 0, "prefix_breaks": 0}


@pytest.mark.parametrize("mode", ["verbatim", "reformatted"])
def test_a_plain_reply_and_a_tool_call_with_its_result_come_back_as_sampled(mode, tokenizer):
    trajectory = play(SampledScript(SCRIPT, tokenizer), agent(mode))
    assert trajectory.termination == Termination.submitted, trajectory.termination_detail
    steps = trajectory.steps
    assert [len(s.tool_calls) for s in steps] == [0, 1, 0]  # the 2nd reply was handed out as a tool call
    assert [r.output for r in steps[1].tool_results] == ["the value is 42"]
    assert chained(trajectory)
    assert kept(trajectory) == (3, 3)
    assert trajectory.meta["sampled_turns"] == {
        "calls": 3,
        "continued": 2,
        "altered_replies": 0,
        "dropped_replies": 0,
        "prefix_breaks": 0,
    }
    # the reply's own tokens, not its text rendered again, are in the next prompts
    first = steps[0].model_call
    assert steps[2].model_call.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == [
        *first.prompt_ids,
        *first.completion_ids,
    ]


def test_rendered_from_text_the_same_episode_breaks(tokenizer):
    """The control: a policy that renders every prompt from the messages' text (as without the
    endpoint's prefixes) cannot chain these replies, so the test above can fail."""
    trajectory = play(SampledScript(SCRIPT, tokenizer, sampled_history=False), agent("verbatim"))
    assert not chained(trajectory)
    assert kept(trajectory) == (1, 3)
    stats = trajectory.meta["sampled_turns"]
    assert stats["continued"] == 0 and stats["prefix_breaks"] == 2
    assert "rendered call 0's reply from text" in stats["first_break"]


def test_a_reply_the_agent_altered_is_rendered_from_text_and_counted(tokenizer):
    trajectory = play(SampledScript(SCRIPT, tokenizer), agent("altered"))
    assert trajectory.termination == Termination.submitted, trajectory.termination_detail
    calls = [s.model_call for s in trajectory.steps]
    # the altered first reply is in the 2nd prompt as the agent's text, not as the sampled tokens
    assert calls[1].prompt_ids[: len(calls[0].prompt_ids) + len(calls[0].completion_ids)] != [
        *calls[0].prompt_ids,
        *calls[0].completion_ids,
    ]
    assert "(edited)" in chat.decode(tokenizer, calls[1].prompt_ids)
    stats = trajectory.meta["sampled_turns"]
    # the 3rd request carries the altered reply again (counted again) and the 2nd reply as handed
    # out: it continues the 2nd call's tokens, so only the 2nd call breaks the chain
    assert stats["altered_replies"] == 2 and stats["prefix_breaks"] == 1 and stats["continued"] == 1
    assert stats["first_break"] == (
        "call 1: the agent sent call 0's reply back altered: the history was rendered from text"
    )
    assert kept(trajectory) == (1, 3)


# The same three calls in the other dialects: Anthropic's Messages API (the reply's content blocks
# sent back as they came, a tool_use answered by a tool_result) and the Responses API (each request
# goes on from the last through previous_response_id, a function_call answered by its output).
DIALECTS = r"""
import json, os, sys, urllib.request
base = os.environ["OPENAI_BASE_URL"]
task = open(os.environ["HARNESSRL_TASK_FILE"]).read()
schema = {"type": "object", "properties": {"key": {"type": "string"}, "n": {"type": "integer"}}}
def post(route, body):
    request = urllib.request.Request(base + route, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request).read())
if sys.argv[1] == "messages":
    tools = [{"name": "lookup", "description": "Look a key up.", "input_schema": schema}]
    messages = [{"role": "user", "content": task}]
    for turn in range(3):
        reply = post("/messages", {"model": "m", "max_tokens": 16, "system": "You are a careful agent.",
                                   "messages": messages, "tools": tools})
        uses = [b for b in reply["content"] if b["type"] == "tool_use"]
        messages.append({"role": "assistant", "content": reply["content"]})
        results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "the value is 42"} for b in uses]
        messages.append({"role": "user", "content": results or "Go on."})
else:
    tools = [{"type": "function", "name": "lookup", "description": "Look a key up.", "parameters": schema}]
    body = {"model": "m", "instructions": "You are a careful agent.", "input": task, "tools": tools,
            "max_output_tokens": 16}
    for turn in range(3):
        reply = post("/responses", body)
        calls = [item for item in reply["output"] if item["type"] == "function_call"]
        outputs = [{"type": "function_call_output", "call_id": c["call_id"], "output": "the value is 42"}
                   for c in calls]
        body = {**body, "previous_response_id": reply["id"], "input": outputs or "Go on."}
open(os.environ["HARNESSRL_ANSWER_FILE"], "w").write("done")
"""


@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_the_messages_and_responses_dialects_send_replies_back_as_sampled(dialect, tokenizer):
    spec = parse_spec(
        {
            "name": f"three-calls-{dialect}",
            "kind": "external",
            "command": ["{python}", "-c", DIALECTS, dialect],
            "limits": {"wall_s": 60, "max_model_calls": 3, "max_new_tokens": 16},
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    trajectory = play(SampledScript(SCRIPT, tokenizer), spec)
    assert trajectory.termination == Termination.submitted, trajectory.termination_detail
    assert [len(s.tool_calls) for s in trajectory.steps] == [0, 1, 0]
    assert [r.output for r in trajectory.steps[1].tool_results] == ["the value is 42"]
    assert chained(trajectory), trajectory.meta["sampled_turns"]
    assert kept(trajectory) == (3, 3)
    assert trajectory.meta["sampled_turns"]["continued"] == 2


# ------------------------------------------------------------------------ mini-swe-agent


def mini(calls: int) -> ExternalHarnessSpec:
    """examples/agents/mini_swe_agent.yaml with `calls` model calls; skips where mini is not installed."""
    try:
        importlib.metadata.version("mini-swe-agent")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mini-swe-agent is not installed (pip install -e '.[agents]')")
    spec = load_spec(MINI)
    assert isinstance(spec, ExternalHarnessSpec)
    limits = spec.limits.model_copy(update={"max_model_calls": calls, "max_new_tokens": 24})
    return spec.model_copy(update={"limits": limits})


def bash(command: str) -> str:
    return '<tool_call>\n{"name": "bash", "arguments": {"command": ' + json.dumps(command) + "}}\n</tool_call>"


MINI_SCRIPT = [
    "Let me see the folder.\n" + bash("ls"),
    bash("echo looked"),
    bash("printf 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n%s\\n' 'done'"),
]


def test_mini_swe_agent_keeps_every_turn_when_it_sends_its_replies_back(tokenizer):
    """mini-swe-agent, unmodified: each valid bash call comes back in its next request with the
    command's output, so its three calls are one sequence (rendered from text, they are not)."""
    spec = mini(3)
    trajectory = play(SampledScript(MINI_SCRIPT, tokenizer), spec)
    detail = (trajectory.termination_detail, trajectory.meta["agent"]["stderr"][-2000:])
    assert [len(s.tool_calls) for s in trajectory.steps] == [1, 1, 1], detail
    assert chained(trajectory), trajectory.meta["sampled_turns"]
    assert kept(trajectory) == (3, 3)
    assert trajectory.meta["sampled_turns"]["continued"] == 2
    assert trajectory.meta["sampled_turns"]["prefix_breaks"] == 0
    control = play(SampledScript(MINI_SCRIPT, tokenizer, sampled_history=False), spec)
    assert kept(control) == (1, 3)


def test_mini_swe_agent_on_the_tiny_random_model_drops_the_replies_it_cannot_parse(tiny_sampled):
    """On the tiny random model no reply is a valid bash call, and mini-swe-agent (2.4.6) sends a
    reply it cannot parse back not at all, only its format error: the model never sees that reply
    again, so no sequence holds two of these calls. Every call is recorded, and each break is
    counted with that reason; nothing is glued together."""
    trajectory = play(tiny_sampled, mini(3), temperature=1.0)
    assert len(trajectory.steps) == 3, (trajectory.termination_detail, trajectory.meta["agent"]["stderr"][-2000:])
    assert all(s.model_call.messages[-1].role == "user" for s in trajectory.steps)
    assert not any(m.role == "assistant" for s in trajectory.steps for m in s.model_call.messages)
    stats = trajectory.meta["sampled_turns"]
    assert stats["dropped_replies"] == 2 and stats["prefix_breaks"] == 2 and stats["continued"] == 0
    assert stats["first_break"] == "call 1: the agent went on from call 0's messages without its reply"
    assert kept(trajectory) == (1, 3)


# ------------------------------------------------------------------------ through TRL


def test_the_three_call_agent_trains_through_trl_with_every_turn(tmp_path):
    """The 3-call agent as a trained harness of the TRL integration's rollout (HarnessRollout in
    TRL's GRPOTrainer, the tiny random model, one step): every episode's three calls are in its
    completion, none left out by a prefix break."""
    from test_trainer import TextScore
    from test_trl import SPECS, lines, train  # skips here where TRL is not installed

    from harnessrl.integrations.trl import HarnessRollout

    spec = agent("verbatim")
    rollout = HarnessRollout(TextScore(), [spec, SPECS[1]], scheduler=f"single:{spec.name}", seed=0, max_in_flight=2)
    _, recording = train(tmp_path / "agent", rollout, steps=1, per_device_train_batch_size=2)
    (out,) = recording.outputs
    assert out["harnessrl_harness"] == [spec.name] * 2
    for mask in out["env_mask"]:
        # three runs of the model's own tokens, with the agent's messages between them
        runs = sum(1 for k, m in enumerate(mask) if m == 1 and (k == 0 or mask[k - 1] == 0))
        assert runs == 3, mask
    (record,) = lines(tmp_path / "agent" / "harnessrl" / "steps.jsonl")
    assert record["turns"] == record["turns_kept"] == 6, record
    assert record["prefix_breaks"] == 0
