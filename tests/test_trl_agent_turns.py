"""mini-swe-agent, unmodified, trained through TRL's GRPOTrainer (trl==1.16.0, HarnessRollout as its
rollout_func, the tiny random model, one step): every model call of its episodes is in the row TRL
computes its loss on.

The tiny random model's replies are noise, and mini-swe-agent does not send a reply it cannot
parse back (tests/test_turns_kept.py), so no row of its episodes could hold two calls. The model is
first taught one episode of mini on the task TRL plays: a scripted play of that episode (the
script's replies on the prompts harnessrl's engine renders, earlier replies continued as sampled)
gives each call's prompt and reply, and a few Adam steps on the replies' negative log-likelihood
(harnessrl's teacher-forced log-probs) go on until the whole episode has probability above 0.999 at
the temperature TRL samples with. Then GRPOTrainer plays one group of two episodes with mini
sampling from that model: three bash calls, the third submitting. Checked on the inputs of TRL's
compute_loss, row by row: the prompt is the first call's, the completion is every call's sampled
tokens in order with mini's messages and the tools' outputs between them, and the loss mask is 1
on the model's tokens and 0 on the others; the calls in a row are the episode's recorded model
calls (meta["sampled_turns"]).
"""

from __future__ import annotations

import pytest
import torch
from test_trainer import TextScore
from test_trl import train  # skips here where TRL is not installed
from test_turns_kept import bash, mini

from harnessrl.harness.spec import ExternalHarnessSpec
from harnessrl.models import chat
from harnessrl.models.base import GenerationRequest
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.types import ModelCall, Termination, Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SUBMIT = "printf 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n%s\\n' 'done'"
TEMPERATURE = 0.25  # TRL's sampling temperature here
SCRIPT = ["I will say it.\n" + bash("echo one"), bash("echo two"), bash(SUBMIT)]


class OneTask(TextScore):
    """textscore with one task per split: TRL's dataset is the task the model was taught on."""

    split_sizes = {"train": 1, "dev": 1, "test": 1}


class Teacher(ScriptedPolicy):
    """The script's replies, tokenized as the tokenizer does, on the prompts `policy` (an HFPolicy
    continuing sampled prefixes) renders: the calls the taught model will make."""

    def __init__(self, script, policy):
        super().__init__(script, tokenizer=policy.tokenizer, name="teacher")
        self.policy = policy

    def _complete_one(self, request: GenerationRequest) -> ModelCall:
        ids = [*self.tokenizer(self.reply(request.messages), add_special_tokens=False)["input_ids"], self.end_of_turn]
        return chat.finish_call(self.tokenizer, request, self.policy.prompt_ids(request), ids, [0.0] * len(ids), "stop")


def mini_spec() -> ExternalHarnessSpec:
    spec = mini(len(SCRIPT))  # skips where mini-swe-agent is not installed
    limits = spec.limits.model_copy(update={"max_new_tokens": 64})  # the submitting call is ~40 tokens
    return spec.model_copy(update={"limits": limits})


def taught_model(spec: ExternalHarnessSpec, tokenizer):
    """The tiny random model taught the scripted episode of mini on OneTask's train task."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy
    from harnessrl.train.grpo import token_logprobs, units_from_trajectories
    from harnessrl.train.packing import pad_packed

    model = tiny_random_model()
    renderer = HFPolicy(model, tokenizer, name="tiny-random")
    renderer.sampled_history = True  # as HarnessRollout's policy
    runner = Runner(Teacher(SCRIPT, renderer), max_in_flight=1, max_retries=0, progress=False)
    [episode] = runner.run(make_jobs(OneTask().tasks("train"), [spec], 1))
    assert episode.termination == Termination.submitted, (episode.termination_detail, episode.meta["agent"])
    assert [len(s.tool_calls) for s in episode.steps] == [1, 1, 1]
    batch = pad_packed(units_from_trajectories([episode], {episode.episode_id: 0.0}), tokenizer.pad_token_id)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(100):
        with torch.no_grad():  # the episode's negative log-likelihood as TRL samples it
            unlikely = -float(token_logprobs(model, batch, temperature=TEMPERATURE).sum())
        if unlikely < 1e-3:  # the whole episode has probability above 0.999
            break
        optimizer.zero_grad()
        (-token_logprobs(model, batch).sum()).backward()
        optimizer.step()
    else:
        raise AssertionError(f"the model did not learn the episode: its negative log-likelihood is {unlikely}")
    model.eval()
    return model


def calls_of(trajectory: Trajectory) -> list[ModelCall]:
    return [s.model_call for s in trajectory.steps if s.model_call is not None and s.model_call.completion_ids]


def expected_row(calls: list[ModelCall]) -> tuple[list[int], list[int], list[int]]:
    """The episode as one row (prompt, completion, loss mask), built from its calls alone: each
    call's prompt extends the one before it and its reply, and the tokens it adds are mini's
    messages and the tools' outputs, under mask 0."""
    completion: list[int] = []
    mask: list[int] = []
    for before, call in zip([None, *calls], calls):
        if before is not None:
            seen = len(before.prompt_ids) + len(before.completion_ids)
            assert call.prompt_ids[:seen] == [*before.prompt_ids, *before.completion_ids], "not one prefix chain"
            added = call.prompt_ids[seen:]
            completion += added
            mask += [0] * len(added)
        completion += call.completion_ids
        mask += [1] * len(call.completion_ids)
    return list(calls[0].prompt_ids), completion, mask


def model_runs(completion: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of tokens under mask 1, in order."""
    runs: list[list[int]] = []
    for k, (token, m) in enumerate(zip(completion, mask)):
        if m == 1:
            if k == 0 or mask[k - 1] == 0:
                runs.append([])
            runs[-1].append(token)
    return runs


def test_mini_swe_agent_trains_through_trl_with_every_model_call_in_the_row(tmp_path, tokenizer, monkeypatch):
    from trl import GRPOTrainer

    from harnessrl.integrations.trl import HarnessRollout

    spec = mini_spec()
    model = taught_model(spec, tokenizer)

    stepped: list[dict] = []  # the inputs of every loss TRL computed
    compute_loss = GRPOTrainer.compute_loss

    def recorded(self, model, inputs, *args, **kwargs):
        stepped.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "compute_loss", recorded)
    rollout = HarnessRollout(OneTask(), [spec], scheduler=f"single:{spec.name}", seed=0, max_in_flight=2)
    out = tmp_path / "mini"
    trainer, recording = train(
        out, rollout, steps=1, per_device_train_batch_size=2, model=model, temperature=TEMPERATURE
    )
    assert trainer.state.global_step == 1
    (batch,) = recording.outputs
    assert batch["harnessrl_harness"] == [spec.name] * 2

    episodes = {t.episode_id: t for t in RunStore(out / "harnessrl" / "rollouts").trajectories()}
    assert sorted(episodes) == sorted(batch["harnessrl_episode"])
    expected = {}
    for trajectory in episodes.values():
        detail = (trajectory.termination_detail, trajectory.meta["agent"]["stderr"][-2000:])
        assert trajectory.termination == Termination.submitted, detail
        calls = calls_of(trajectory)
        assert len(calls) == trajectory.meta["sampled_turns"]["calls"] == len(SCRIPT), detail
        assert [len(s.tool_calls) for s in trajectory.steps] == [1, 1, 1]
        assert [s.tool_calls[0].arguments["command"] for s in trajectory.steps] == ["echo one", "echo two", SUBMIT]
        expected[trajectory.episode_id] = expected_row(calls)

    # what the rollout handed TRL
    for i, episode_id in enumerate(batch["harnessrl_episode"]):
        prompt, completion, mask = expected[episode_id]
        assert (batch["prompt_ids"][i], batch["completion_ids"][i], batch["env_mask"][i]) == (prompt, completion, mask)

    # what TRL stepped with: one loss over both rows (in TRL's order), each row one episode
    (inputs,) = stepped
    rows = []
    for r in range(inputs["completion_ids"].shape[0]):
        prompt = inputs["prompt_ids"][r][inputs["prompt_mask"][r] == 1].tolist()
        kept = inputs["completion_mask"][r] == 1
        completion = inputs["completion_ids"][r][kept].tolist()
        loss_mask = (inputs["completion_mask"][r] * inputs["tool_mask"][r])[kept].tolist()
        rows.append((prompt, completion, loss_mask))
    assert sorted(rows) == sorted(expected[e] for e in batch["harnessrl_episode"])
    for row in rows:
        episode_id = next(e for e in batch["harnessrl_episode"] if expected[e] == row)
        _, completion, loss_mask = row
        runs = model_runs(completion, loss_mask)
        calls = calls_of(episodes[episode_id])
        assert runs == [c.completion_ids for c in calls]  # every call's sampled tokens, in order
        assert len(runs) == episodes[episode_id].meta["sampled_turns"]["calls"]
        assert 0 < loss_mask.count(0) < len(loss_mask)  # mini's messages and the outputs, out of the loss
