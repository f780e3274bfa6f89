"""harnessrl inside TRL's own GRPOTrainer (trl==1.16.0, on the CPU, the tiny random model).

The reference run: 4 optimizer steps of GRPOTrainer with HarnessRollout as its rollout_func, two
harnesses (plan-execute: two model turns with the harness's message between them; json-tools: one
turn), harness-bandit, 2 groups of 2 per batch, a checkpoint every 2 steps. Reward signal from a
random model: the test suite `textscore` grades the length parity of the answer, so groups of 2
often disagree. Checked against it: each batch is played by the harness the scheduler chose; the
scheduler observed every batch's advantages and a non-zero sketch; the same observations drive
our own trainer's `observe` to the same choices; the first batch's completions, masks and
log-probs are what harnessrl's own runner records for the same jobs and seeds; a run resumed from
checkpoint-2 plays the same harnesses on the same seeds. Around it: refusals in words, and the
episode-as-one-sequence rules on hand-made trajectories.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import shrunk
from test_trainer import TextScore, lines

from harnessrl.harness.registry import load_harness
from harnessrl.train.episode_sequence import PrefixBreak, episode_sequence
from harnessrl.train.harness_schedule import HarnessSchedule, ScheduleError, batch_advantages
from harnessrl.train.schedulers import Selection, make_scheduler
from harnessrl.types import Grade, ModelCall, Step, Termination, Trajectory

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'harnessrl[trl]')")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 4


PROMPT = "Reply with any text."  # every harness here: short answers are as good as any

SPECS = [
    shrunk(n, system_prompt=PROMPT, max_steps=2, max_new_tokens=8, demonstrations=[], plain_text_answer=True)
    for n in ("plan-execute", "json-tools")
]


class Recording:
    """A HarnessRollout that keeps what each batch returned to TRL and what the scheduler observed."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.outputs: list[dict] = []
        self.prompts: list[list] = []
        self.observed: list[dict] = []
        schedule = rollout.schedule
        observe = schedule.observe

        def recorded_observe():
            pending = schedule.pending
            self.observed.append(
                {
                    "plan": pending.plan,
                    "advantages": {h: list(v) for h, v in pending.advantages.items()},
                    "rewards": {h: list(v) for h, v in pending.rewards.items()},
                    "sketch": None if pending.sketch is None else pending.sketch.clone(),
                    "signal": pending.signal,
                }
            )
            return observe()

        schedule.observe = recorded_observe

    def __call__(self, prompts, trainer):
        out = self.rollout(prompts, trainer)
        self.prompts.append(prompts)
        self.outputs.append(out)
        return out


HELD_OUT = shrunk(
    "react", system_prompt=PROMPT, max_steps=1, max_new_tokens=8, demonstrations=[], plain_text_answer=True
)
EVAL = dict(eval_harnesses=[HELD_OUT], eval_every=2, eval_tasks=2, eval_attempts=2)


def make_rollout(**options):
    from harnessrl.integrations.trl import HarnessRollout

    options = {"scheduler": "harness-bandit", **EVAL, **options}
    return HarnessRollout(TextScore(), SPECS, seed=0, max_in_flight=4, **options)


def train(out: Path, rollout, resume: str | None = None, steps: int = STEPS, reward_funcs=None, model=None, **config):
    """GRPOTrainer over `model` (default: the tiny random model) with a LoRA adapter, `rollout` as its rollout_func."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from harnessrl.models.embedded import load_tokenizer, tiny_random_model

    recording = Recording(rollout)
    config = {"per_device_train_batch_size": 4, **config}
    args = GRPOConfig(
        output_dir=str(out),
        num_generations=2,
        max_steps=steps,
        learning_rate=5e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="steps",
        save_steps=2,
        seed=0,
        disable_tqdm=True,
        # TRL's default bf16 autocast is refused (docs/trl.md, "Precision")
        **{"bf16": False, "temperature": 1.0, **config},
    )
    trainer = GRPOTrainer(
        model=model if model is not None else tiny_random_model(),
        processing_class=copy.deepcopy(load_tokenizer()),  # TRL may set its pad token: not the shared one
        args=args,
        train_dataset=rollout.dataset("train"),
        reward_funcs=reward_funcs or rollout.reward,
        rollout_func=recording,
        callbacks=[rollout.callback],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, recording


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl") / "full"
    rollout = make_rollout()
    trainer, recording = train(out, rollout)
    return SimpleNamespace(out=out, rollout=rollout, trainer=trainer, recording=recording)


def test_every_batch_is_played_by_the_harness_the_scheduler_chose(full_run):
    history = full_run.rollout.history
    assert len(history) == STEPS  # one generation batch per optimizer step (TRL's default)
    assert {p.harness for p in history} == {"plan-execute", "json-tools"}, "the bandit explored both harnesses"
    for plan, out in zip(history, full_run.recording.outputs):
        assert plan.selection.harness is not None  # harness-bandit: one harness per batch
        assert set(out["harnessrl_harness"]) == {plan.harness}
    records = lines(full_run.out / "harnessrl" / "steps.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["harness"] for r in records] == [p.harness for p in history]
    assert all(r["optimizer_steps"] == 1 for r in records)
    # the history continues the sampled tokens: every episode is one sequence, every turn trained
    assert all(r["prefix_breaks"] == 0 and r["turns_kept"] == r["turns"] for r in records)
    assert sum(r["turns"] for r in records) > STEPS * 4, "plan-execute played episodes of two turns"


def test_the_scheduler_observed_advantages_and_a_nonzero_sketch(full_run):
    observed = full_run.recording.observed
    assert len(observed) == STEPS
    assert full_run.rollout.schedule.batches_observed == STEPS
    assert all(o["advantages"] for o in observed), "every batch had a group with two valid episodes"
    with_signal = [o for o in observed if o["signal"]]
    assert with_signal, "the parity grader gave some batch a group that disagreed"
    for o in with_signal:
        assert o["sketch"] is not None and float(o["sketch"].norm()) > 0
    # HarnessBandit's state moved with what it saw
    state = full_run.rollout.schedule.scheduler.state_dict()
    assert state["total"] == STEPS
    assert sum(state["count"].values()) == STEPS


def test_the_same_observations_make_our_trainer_choose_the_same(full_run):
    """The choices made inside TRL, replayed through `harnessrl train grpo`'s own observation
    (harnessrl.train.step.observe over a StepPlan and BatchStats) on a fresh scheduler."""
    from harnessrl.train.step import BatchStats, StepPlan, observe

    scheduler = make_scheduler("harness-bandit", [s.name for s in SPECS], seed=0)
    for batch, o in enumerate(full_run.recording.observed):
        probabilities = scheduler.probabilities()
        selection = scheduler.select(batch)
        assert selection == o["plan"].selection
        assert probabilities == pytest.approx(o["plan"].probabilities)
        plan = StepPlan(batch, selection, probabilities, {selection.harness: 2}, [])
        stats = BatchStats(advantages_by_harness=o["advantages"], rewards_by_harness=o["rewards"])
        observe(scheduler, plan, stats, o["sketch"] if o["signal"] else None)
    assert scheduler.state_dict() == full_run.rollout.schedule.scheduler.state_dict()


def test_completions_and_masks_are_what_our_runner_records_for_the_same_seeds(full_run):
    """Batch 0 ran on the initial weights (LoRA's B is zero): harnessrl's own runner, on a fresh
    copy of the model, plays the same jobs with the same seeds and records the same tokens."""
    from harnessrl.models.base import SamplingParams
    from harnessrl.models.embedded import load_tokenizer, tiny_random_model
    from harnessrl.models.hf import HFPolicy
    from harnessrl.rollout import Job, Runner
    from harnessrl.train.step import sampling_seed

    out = full_run.recording.outputs[0]
    plan = full_run.rollout.history[0]
    suite = TextScore()
    spec = {s.name: s for s in SPECS}[plan.harness]
    policy = HFPolicy(tiny_random_model(), load_tokenizer(), name="tiny-random")
    policy.sampled_history = True  # as HarnessRollout's policy
    task_ids = [full_run.rollout.task(p).id for p in full_run.recording.prompts[0]]
    # batch 0, group g, row j: attempt (0 * groups + g) * 2 + j, which is the row's index
    jobs = [Job(suite.task(t), spec, attempt=i) for i, t in enumerate(task_ids)]
    runner = Runner(
        policy, SamplingParams(temperature=1.0, top_p=1.0, seed=sampling_seed(0, 0, "train")), progress=False
    )
    trajectories = runner.run(jobs)
    assert [t.episode_id for t in trajectories] == out["harnessrl_episode"]
    for i, traj in enumerate(trajectories):
        seq = episode_sequence(traj)
        assert seq is not None
        assert out["prompt_ids"][i] == seq.prompt_ids
        assert out["completion_ids"][i] == seq.completion_ids
        assert out["env_mask"][i] == seq.env_mask
        assert out["logprobs"][i] == pytest.approx(seq.logprobs, abs=1e-4)
        assert out["harnessrl_score"][i] == traj.grade.score


def test_a_two_turn_episode_holds_the_harness_tokens_under_env_mask_zero(full_run):
    """plan-execute: the plan turn, the harness's message (masked), the answer turn; every
    sequence is token for token what the model saw at its last call."""
    from harnessrl.store import RunStore

    store = RunStore(full_run.out / "harnessrl" / "rollouts")
    episodes = list(store.trajectories())
    assert len(episodes) == STEPS * 4
    two_turns = [t for t in episodes if t.harness == "plan-execute" and len(t.steps) == 2]
    assert two_turns, "plan-execute played two turns"
    for traj in two_turns:
        seq = episode_sequence(traj, on_break="error")
        first, second = (s.model_call for s in traj.steps)
        assert seq.env_mask.count(1) == len(first.completion_ids) + len(second.completion_ids)
        assert 0 in seq.env_mask and seq.env_mask[0] == 1 and seq.env_mask[-1] == 1
        assert seq.prompt_ids + seq.completion_ids == second.prompt_ids + second.completion_ids
        env = [tok for tok, m in zip(seq.completion_ids, seq.env_mask) if m == 0]
        assert env == second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :]


def test_a_resumed_run_plays_the_same_harnesses_on_the_same_seeds(full_run, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(full_run.out, out)
    shutil.rmtree(out / "checkpoint-4")
    rollout = make_rollout()
    _, recording = train(out, rollout, resume=str(out / "checkpoint-2"))
    assert [p.harness for p in rollout.history] == [p.harness for p in full_run.rollout.history[2:]]
    assert [p.batch for p in rollout.history] == [2, 3]
    for mine, theirs in zip(recording.outputs, full_run.recording.outputs[2:]):
        assert mine["harnessrl_episode"] == theirs["harnessrl_episode"]
    records = lines(out / "harnessrl" / "steps.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # the resumed steps replaced, not appended
    assert [r["sampling_seed"] for r in records] == [
        r["sampling_seed"] for r in lines(full_run.out / "harnessrl" / "steps.jsonl")
    ]
    assert rollout.schedule.scheduler.state_dict()["total"] == STEPS
    evals = lines(out / "harnessrl" / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4]  # step 4's evaluation made again, paired with step 0's
    assert evals[2]["harnesses"]["react"]["vs_base"] is not None


def test_resuming_a_checkpoint_without_the_schedule_is_refused(full_run, tmp_path):
    from harnessrl.integrations.trl import HarnessRolloutError

    out = tmp_path / "resumed"
    shutil.copytree(full_run.out, out)
    state_file = out / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    del state["stateful_callbacks"]["HarnessRollout"]
    state_file.write_text(json.dumps(state))
    with pytest.raises(HarnessRolloutError, match="scheduler's state cannot be restored"):
        train(out, make_rollout(), resume=str(out / "checkpoint-2"))


def test_a_checkpoint_outside_output_dir_resumes_from_its_own_state(full_run, tmp_path):
    """resume_from_checkpoint names a folder of another run (output_dir is a fresh one): the
    schedule and the evaluations' base come from that folder, not from OUTPUT_DIR/checkpoint-2
    (absent here; in a folder holding another run's checkpoint-2, that run's state)."""
    elsewhere = tmp_path / "kept" / "checkpoint-2"
    shutil.copytree(full_run.out / "checkpoint-2", elsewhere)
    decoy = tmp_path / "fresh" / "checkpoint-2"  # another run's checkpoint at the same step
    decoy.mkdir(parents=True)
    (decoy / "trainer_state.json").write_text(json.dumps({"stateful_callbacks": {"HarnessRollout": {}}}))
    rollout = make_rollout()
    _, recording = train(tmp_path / "fresh", rollout, resume=str(elsewhere))
    assert [p.harness for p in rollout.history] == [p.harness for p in full_run.rollout.history[2:]]
    for mine, theirs in zip(recording.outputs, full_run.recording.outputs[2:]):
        assert mine["harnessrl_episode"] == theirs["harnessrl_episode"]
    evals = lines(tmp_path / "fresh" / "harnessrl" / "eval.jsonl")
    assert [e["step"] for e in evals] == [4]  # paired with the kept run's step 0, from the checkpoint
    assert (
        evals[-1]["harnesses"]["react"]["vs_base"]
        == lines(full_run.out / "harnessrl" / "eval.jsonl")[-1]["harnesses"]["react"]["vs_base"]
    )


def test_a_mixture_spreads_one_batchs_groups_over_the_harnesses(tmp_path):
    """ratio:1,1 over 2 groups: each group's 2 rows through its own harness, observed once per harness."""
    rollout = make_rollout(scheduler="ratio:plan-execute=1,json-tools=1", eval_harnesses=[], eval_every=0)
    _, recording = train(tmp_path / "mixed", rollout, steps=1)
    (out,) = recording.outputs
    assert out["harnessrl_harness"][:2] == ["plan-execute"] * 2 and out["harnessrl_harness"][2:] == ["json-tools"] * 2
    (record,) = lines(tmp_path / "mixed" / "harnessrl" / "steps.jsonl")
    assert record["harness"] == "mixed" and record["shares"] == {"plan-execute": 0.5, "json-tools": 0.5}


def test_the_harness_metrics_reach_trls_log(full_run):
    logged = [entry for entry in full_run.trainer.state.log_history if "loss" in entry]
    assert len(logged) == STEPS
    for entry, plan in zip(logged, full_run.rollout.history):
        assert entry[f"harnessrl/selected/{plan.harness}"] == 1.0
        assert entry["harnessrl/probability/plan-execute"] + entry["harnessrl/probability/json-tools"] == pytest.approx(
            1
        )
        assert "harnessrl/learnability" in entry and f"harnessrl/reward/{plan.harness}" in entry
        assert entry["harnessrl/untrained_token_frac"] == 0.0


def test_several_optimizer_steps_on_one_batch_are_one_observation(tmp_path):
    """steps_per_generation=2 with no accumulation: each batch takes 2 optimizer steps; their
    sketches are summed and the scheduler observes the batch once, after the second."""
    rollout = make_rollout(eval_harnesses=[], eval_every=0)
    _, recording = train(tmp_path / "two", rollout, steps=4, per_device_train_batch_size=2, steps_per_generation=2)
    assert [p.batch for p in rollout.history] == [0, 1]
    records = lines(tmp_path / "two" / "harnessrl" / "steps.jsonl")
    assert [(r["step"], r["optimizer_steps"]) for r in records] == [(2, 2), (4, 2)]
    assert rollout.schedule.batches_observed == 2


def test_a_mixing_setup_is_refused_before_the_first_step(tmp_path):
    from harnessrl.integrations.trl import TRLSetupError

    with pytest.raises(TRLSetupError, match="mixes two generation batches"):
        train(
            tmp_path / "mix",
            make_rollout(eval_harnesses=[], eval_every=0),
            steps=2,
            gradient_accumulation_steps=2,
            per_device_train_batch_size=2,
            steps_per_generation=1,
        )


class CrashingGrader(TextScore):
    """Every other task's grader crashes: those episodes are infrastructure errors."""

    def families(self):
        say = super().families()["say"]

        def flaky(rng):
            task = say(rng)
            if task["data"]["n"] % 2:
                task["check"] = lambda env: 1 / 0
            return task

        return {"say": flaky}


def test_infrastructure_errors_are_left_out_and_the_run_goes_on(tmp_path):
    from harnessrl.integrations.trl import HarnessRollout

    rollout = HarnessRollout(CrashingGrader(), SPECS, seed=0, max_in_flight=4, retries=0)
    _, recording = train(tmp_path / "crash", rollout, steps=2)
    records = lines(tmp_path / "crash" / "harnessrl" / "steps.jsonl")
    assert sum(r["infra_errors"] for r in records) > 0
    for out in recording.outputs:
        for score, mask in zip(out["harnessrl_score"], out["env_mask"]):
            if score is None:
                assert mask == [0]  # one masked token: nothing of it is trained
    assert len(records) == 2


def test_an_external_agent_program_trains_through_trl(tmp_path):
    """examples/agents/minimal.yaml (an OpenAI-client program of its own, through the recording
    endpoint) as a trained harness: its model calls are the completion, its grade the reward."""
    from harnessrl.integrations.trl import HarnessRollout

    agent = load_harness(str(Path(__file__).resolve().parents[1] / "examples" / "agents" / "minimal.yaml"))
    # three short replies at most: the tiny random model's episodes end fast
    agent = agent.model_copy(
        update={"limits": agent.limits.model_copy(update={"max_model_calls": 3, "max_new_tokens": 48})}
    )
    rollout = HarnessRollout(TextScore(), [agent, SPECS[1]], scheduler="single:minimal-agent", seed=0, max_in_flight=2)
    _, recording = train(tmp_path / "agent", rollout, steps=1, per_device_train_batch_size=2)
    (out,) = recording.outputs
    assert out["harnessrl_harness"] == ["minimal-agent"] * 2
    assert all(score is not None for score in out["harnessrl_score"]), "the agent's episodes were graded"
    for completion, mask in zip(out["completion_ids"], out["env_mask"]):
        assert len(completion) == len(mask) and mask[0] == 1  # its first reply is trained
    (record,) = lines(tmp_path / "agent" / "harnessrl" / "steps.jsonl")
    assert record["turns"] >= 2 and record["turns_kept"] >= 2


def test_an_agent_that_cannot_make_its_first_request_is_refused_before_any_episode(tmp_path):
    """The preflight `harnessrl train grpo` runs, before HarnessRollout's first batch: an agent
    program that is not found is refused with the reason and the fix, and nothing is recorded;
    preflight=False plays it, every episode an infrastructure error (no reward), never a 0."""
    from harnessrl.harness.spec import parse_spec
    from harnessrl.integrations.trl import HarnessRollout, HarnessRolloutError

    missing = parse_spec(
        {"name": "missing", "kind": "external", "command": ["no-such-agent-program-xyz"], "limits": {"wall_s": 20}}
    )
    rollout = HarnessRollout(TextScore(), [missing, SPECS[1]], scheduler="single:missing", seed=0, retries=0)
    with pytest.raises(HarnessRolloutError, match="harness missing: no first request measured") as refused:
        train(tmp_path / "refused", rollout, steps=1, per_device_train_batch_size=2)
    assert "'no-such-agent-program-xyz' was not found in the sandbox" in str(refused.value)
    assert "preflight=False" in str(refused.value)
    assert not (tmp_path / "refused" / "harnessrl" / "rollouts").exists()  # no episode ran
    rollout = HarnessRollout(
        TextScore(), [missing, SPECS[1]], scheduler="single:missing", seed=0, retries=0, preflight=False
    )
    _, recording = train(tmp_path / "played", rollout, steps=1, per_device_train_batch_size=2)
    (out,) = recording.outputs
    assert out["harnessrl_score"] == [None, None]  # infrastructure errors: no reward, not a 0
    (record,) = lines(tmp_path / "played" / "harnessrl" / "steps.jsonl")
    assert record["episodes"] == record["infra_errors"] == 2
    # held out: checked at the first batch (on its first task), before the base evaluation at step 0
    rollout = HarnessRollout(
        TextScore(), SPECS, seed=0, retries=0, eval_harnesses=[missing], eval_every=1, eval_tasks=1
    )
    with pytest.raises(HarnessRolloutError, match="harness missing: no first request measured on textscore/train/"):
        train(tmp_path / "held-out", rollout, steps=1, per_device_train_batch_size=2)
    assert not (tmp_path / "held-out" / "harnessrl" / "eval.jsonl").exists()


def test_a_held_out_harness_is_evaluated_and_reported_apart(full_run):
    """react is evaluated at steps 0 (the base weights), 2 and 4, never trained on: its pass@k and
    pass^k up to k = 2 and its paired difference against step 0 are reported apart."""
    assert "react" not in {p.harness for p in full_run.rollout.history}
    evals = lines(full_run.out / "harnessrl" / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 4]
    for e in evals:
        assert e["held_out"] == ["react"] and e["attempts"] == 2 and e["tasks"] == 2
        assert set(e["harnesses"]) == {"plan-execute", "json-tools", "react"}
        held = e["harnesses"]["react"]
        assert held["held_out"] is True and e["harnesses"]["json-tools"]["held_out"] is False
        assert set(held["pass_at_k"]) == set(held["pass_hat_k"]) == {"1", "2"}
        assert e["held_out_average"] == held["mean_score"]
        trained = [e["harnesses"][h]["mean_score"] for h in ("plan-execute", "json-tools")]
        assert e["average"] == pytest.approx(sum(trained) / 2)
    assert evals[0]["harnesses"]["react"]["vs_base"] is None  # step 0 is the base
    for e in evals[1:]:
        vs = e["harnesses"]["react"]["vs_base"]
        assert vs["n_tasks"] == 2
        base, now = evals[0]["task_scores"]["react"], e["task_scores"]["react"]
        assert vs["mean_difference"] == pytest.approx(sum(now[t] - base[t] for t in base) / 2)


def test_every_evaluation_samples_with_the_bases_seed_and_reaches_trls_log(full_run):
    """The pairing against step 0 compares weights: every evaluation draws with the base's seed
    (the same tasks, attempts and random numbers), and its figures are on TRL's log line of its step."""
    from harnessrl.train.held_out import evaluation_seed

    evals = lines(full_run.out / "harnessrl" / "eval.jsonl")
    assert {e["sampling_seed"] for e in evals} == {evaluation_seed(0)}
    logged = {e["step"]: e for e in full_run.trainer.state.log_history if "harnessrl/eval/react/mean" in e}
    assert sorted(logged) == [0, 2, 4]
    for e in evals:
        entry = logged[e["step"]]
        assert entry["harnessrl/eval/react/mean"] == pytest.approx(e["harnesses"]["react"]["mean_score"])
        assert entry["harnessrl/eval/held_out_average"] == pytest.approx(e["held_out_average"])
    assert "loss" in logged[2] and "loss" not in logged[0]  # on the step's own line; step 0 has none
    assert logged[4]["harnessrl/eval/react/vs_base"] == pytest.approx(
        evals[2]["harnesses"]["react"]["vs_base"]["mean_difference"]
    )


def test_inputs_are_read_by_the_job_kernel_naming_the_argument():
    """The suite, harnesses and evaluation tasks are read as `harnessrl train grpo` reads them
    (harnessrl.kernel.read_inputs): a JobError naming the option."""
    from harnessrl.errors import JobError
    from harnessrl.integrations.trl import HarnessRollout, RolloutInputError

    with pytest.raises(RolloutInputError, match="--suite") as e:
        HarnessRollout("no-such-suite", ["json-tools"])
    assert isinstance(e.value, JobError)
    with pytest.raises(RolloutInputError, match="--harnesses"):
        HarnessRollout("toolcalc", ["json-tools", "no-such-harness"])
    with pytest.raises(RolloutInputError, match="--eval-tasks"):
        make_rollout(eval_tasks=10_000)
    with pytest.raises(RolloutInputError, match="unique"):
        HarnessRollout(TextScore(), [SPECS[0], SPECS[0]])
    rollout = make_rollout()
    assert [s.name for s in rollout.specs] == ["plan-execute", "json-tools"]
    assert [t.id for t in rollout.eval_task_list] == ["textscore/dev/00000", "textscore/dev/00001"]


def test_a_trained_harness_cannot_be_held_out():
    from harnessrl.integrations.trl import HarnessRolloutError

    with pytest.raises(HarnessRolloutError, match="also trained on"):
        make_rollout(eval_harnesses=[SPECS[0]])
    with pytest.raises(HarnessRolloutError, match="needs --eval-every"):
        make_rollout(eval_every=0)


# ---------------------------------------------------------------------------------- refusals


def test_a_history_window_harness_is_refused_in_words():
    from harnessrl.integrations.trl import HarnessRollout, HarnessRolloutError

    windowed = shrunk("json-tools", system_prompt=PROMPT, history_window=2, max_steps=4)
    with pytest.raises(HarnessRolloutError, match="history_window = 2 below its max_steps.*harnessrl train"):
        HarnessRollout(TextScore(), [SPECS[0], windowed])
    elided = shrunk("json-tools", system_prompt=PROMPT, observation_window=1, max_steps=4)
    with pytest.raises(HarnessRolloutError, match="observation_window = 1 below"):
        HarnessRollout(TextScore(), [SPECS[0], elided])
    HarnessRollout(
        TextScore(), [SPECS[0], shrunk("json-tools", system_prompt=PROMPT, history_window=4, max_steps=4)]
    )  # never acts


def fake_args(**overrides):
    args = dict(
        steps_per_generation=1,
        num_iterations=1,
        gradient_accumulation_steps=1,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        generation_kwargs=None,
        scale_rewards="group",
        multi_objective_aggregation="sum_then_normalize",
        use_vllm=False,
        bf16=False,
        fp16=False,
        max_completion_length=512,
        output_dir="unused",
    )
    args.update(overrides)
    return SimpleNamespace(**args)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"top_k": -5}, "(?s)sampling settings cannot be applied.*top_k"),
        ({"repetition_penalty": 0.0}, "(?s)sampling settings cannot be applied.*repetition_penalty"),
        ({"min_p": 1.5}, "(?s)sampling settings cannot be applied.*min_p"),
        ({"generation_kwargs": {"typical_p": 0.9}}, "generation_kwargs cannot be applied"),
        ({"gradient_accumulation_steps": 4, "steps_per_generation": 2}, "mixes two generation batches"),
        ({"scale_rewards": "median"}, "scale_rewards 'median'"),
    ],
)
def test_unserved_trl_settings_are_refused_in_words(overrides, message):
    from harnessrl.integrations.trl.setup import TrainerFacts, TRLSetupError

    trainer = SimpleNamespace(args=fake_args(**overrides), use_vllm=False)
    with pytest.raises(TRLSetupError, match=message):
        TrainerFacts.of(trainer).check(None)


def test_trls_top_k_min_p_and_repetition_penalty_reach_the_engines_sampling():
    """TRL's own sampling fields are served: its defaults are the neutral values, a set value is
    what harnessrl's sampler applies (HarnessRollout builds each batch's SamplingParams from them)."""
    from harnessrl.integrations.trl.setup import TrainerFacts, check_args
    from harnessrl.models.base import SamplingParams

    def facts(**overrides):
        trainer = SimpleNamespace(args=fake_args(**{"temperature": 0.9, "top_p": 0.95, **overrides}), use_vllm=False)
        made = TrainerFacts.of(trainer)
        check_args(made.args)
        return made

    neutral = SamplingParams(temperature=0.9, top_p=1.0, **facts().shaping)
    assert not neutral.shapes()  # TRL's defaults (top_k 0, min_p None, repetition_penalty 1.0)
    shaping = facts(top_k=20, min_p=0.05, repetition_penalty=1.1).shaping
    assert shaping == {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
    assert facts(top_k=-1).shaping["top_k"] == 0  # vLLM's "off" is harnessrl's too


def test_trls_argument_refusals_come_at_on_train_begin():
    """use_vllm and the other argument refusals come from the callback's on_train_begin, before the
    step-0 evaluation and the first batch."""
    from transformers import TrainerControl, TrainerState

    from harnessrl.integrations.trl.setup import TRLSetupError

    rollout = make_rollout()
    for overrides, message in (
        ({"use_vllm": True}, "use_vllm=True is not served"),
        ({"bf16": True}, "bf16=True .*autocast.* is not served"),
        ({"fp16": True}, "fp16=True"),
        ({"max_completion_length": 0}, "max_completion_length must be at least 1"),
        ({"reward_weights": [1.0, 0.5]}, "reward_weights"),
    ):
        with pytest.raises(TRLSetupError, match=message):
            rollout.callback.on_train_begin(fake_args(**overrides), TrainerState(), TrainerControl())
    from harnessrl.models.embedded import tiny_random_model

    half = tiny_random_model().to(torch.bfloat16)
    with pytest.raises(TRLSetupError, match="weights are in bfloat16: not served"):
        rollout.callback.on_train_begin(fake_args(), TrainerState(), TrainerControl(), model=half)
    rollout.callback.on_train_begin(fake_args(), TrainerState(), TrainerControl(), model=tiny_random_model())


def test_bf16_autocast_is_refused_before_the_base_evaluation(tmp_path):
    from harnessrl.integrations.trl.setup import TRLSetupError

    with pytest.raises(TRLSetupError, match="bf16=True"):
        train(tmp_path / "bf16", make_rollout(), steps=1, bf16=True)
    assert not (tmp_path / "bf16" / "harnessrl" / "eval.jsonl").exists()


def test_extra_reward_functions_are_refused_before_the_base_evaluation(tmp_path):
    """A second reward function would make TRL's advantages differ from the scheduler's and sum an
    infrastructure error's None back into its group: refused at the first batch, before the step-0
    evaluation writes anything."""
    from harnessrl.integrations.trl.setup import TRLSetupError

    rollout = make_rollout()

    def length(completions=None, **kwargs):
        return [float(len(str(c))) for c in completions]

    with pytest.raises(TRLSetupError, match="1 reward function.* beside rollout.reward are not served"):
        train(tmp_path / "extra", rollout, steps=1, reward_funcs=[rollout.reward, length])
    assert not (tmp_path / "extra" / "harnessrl" / "eval.jsonl").exists()


def test_trl_tools_are_refused_in_words():
    from harnessrl.integrations.trl.setup import TrainerFacts, TRLSetupError

    rollout = make_rollout()
    trainer = SimpleNamespace(args=fake_args(), use_vllm=False, tools=[len], reward_funcs=[rollout.reward])
    with pytest.raises(TRLSetupError, match="tools=.* is not served"):
        TrainerFacts.of(trainer).check(rollout.reward)


def test_max_completion_length_caps_each_model_call():
    """TRL's max_completion_length is each model call's token cap, where it is below the harness's
    own max_new_tokens (trained and held-out harnesses alike); None leaves them as they are."""
    rollout = make_rollout()
    rollout.configure(fake_args(max_completion_length=5))
    assert [s.rules.max_new_tokens for s in rollout.specs + rollout.eval_specs] == [5, 5, 5]
    assert rollout.spec_by_name["json-tools"].rules.max_new_tokens == 5
    rollout.configure(fake_args(max_completion_length=512))  # above the specs' 8: theirs hold
    assert [s.rules.max_new_tokens for s in rollout.specs + rollout.eval_specs] == [8, 8, 8]
    fresh = make_rollout()
    fresh.configure(fake_args(max_completion_length=None))
    assert [s.rules.max_new_tokens for s in fresh.specs] == [8, 8]


def test_truncated_episodes_are_masked_by_the_rollout_not_by_trls_eos_test(tmp_path):
    """mask_truncated_completions: TRL's own test (last token not EOS or pad) would mask nearly every
    episode (its completion ends where the harness stopped the call); HarnessRollout switches it
    off and masks the episodes a budget cut (max_steps here: plan-execute's second call never comes
    in 1 step) through env_mask."""
    rollout = make_rollout(scheduler="single:plan-execute", eval_harnesses=[], eval_every=0)
    rollout.specs = [shrunk(SPECS[0], max_steps=1)]
    rollout.spec_by_name = {s.name: s for s in rollout.specs}
    trainer, recording = train(tmp_path / "masked", rollout, steps=1, mask_truncated_completions=True)
    assert trainer.mask_truncated_completions is False
    (out,) = recording.outputs
    eos = {*trainer.eos_token_ids, trainer.processing_class.pad_token_id}
    trl_would_mask = [ids[-1] not in eos for ids in out["completion_ids"]]
    assert all(trl_would_mask)  # the random model never samples EOS: TRL's test masks every row
    ours = [not any(m) for m in out["env_mask"]]
    assert any(ours)
    assert trainer.state.log_history[0]["harnessrl/truncated"] == sum(ours)


def test_an_episode_is_truncated_when_a_budget_or_a_token_cap_cut_it():
    from harnessrl.integrations.trl.rollout import is_truncated

    ended = trajectory(call([1, 2], [3, 4]))
    assert not is_truncated(ended)  # submitted, its last call ended on its own
    assert is_truncated(ended.model_copy(update={"termination": Termination.max_steps}))
    capped = ended.model_copy(deep=True)
    capped.steps[-1].model_call.finish_reason = "length"
    assert is_truncated(capped)
    assert not is_truncated(trajectory(call([1], [2]), error=True))


def test_vllm_generation_is_refused_in_words():
    from harnessrl.integrations.trl.setup import TrainerFacts, TRLSetupError

    with pytest.raises(TRLSetupError, match="use_vllm=True is not served"):
        TrainerFacts.of(SimpleNamespace(args=fake_args(), use_vllm=True)).check(None)


def test_a_prompt_without_a_task_id_is_refused_in_words():
    from harnessrl.integrations.trl import HarnessRolloutError

    rollout = make_rollout()
    with pytest.raises(HarnessRolloutError, match="without a task id"):
        rollout.task([{"role": "user", "content": "hello"}])
    with pytest.raises(HarnessRolloutError, match="not in suite"):
        rollout.task([{"role": "user", "content": "hi", "task_id": "textscore/train/999"}])
    row = rollout.dataset("train", 2)[0]
    assert rollout.task(row["prompt"]).id == row["task_id"] == "textscore/train/00000"


# ------------------------------------------------------------------- an episode as one sequence


def call(prompt: list[int], completion: list[int]) -> ModelCall:
    return ModelCall(prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5] * len(completion), text="x")


def trajectory(*calls: ModelCall, error: bool = False) -> Trajectory:
    return Trajectory(
        episode_id="t/train/0:h:0",
        task_id="t/train/0",
        suite="t",
        family="f",
        split="train",
        harness="h",
        attempt=0,
        instruction="",
        steps=[Step(index=i, model_call=c, action="text") for i, c in enumerate(calls)],
        termination=Termination.error if error else Termination.submitted,
        grade=None if error else Grade(score=1.0, passed=True),
    )


def test_a_prefix_chain_becomes_one_sequence_with_env_tokens_masked():
    seq = episode_sequence(
        trajectory(call([1, 2], [3, 4]), call([1, 2, 3, 4, 9, 9], [5]), call([1, 2, 3, 4, 9, 9, 5, 8], [6, 7]))
    )
    assert seq.prompt_ids == [1, 2]
    assert seq.completion_ids == [3, 4, 9, 9, 5, 8, 6, 7]
    assert seq.env_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert seq.logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, 0.0, -0.5, -0.5]
    assert (seq.turns, seq.turns_kept, seq.model_tokens, seq.model_tokens_kept) == (3, 3, 5, 5)
    assert not seq.broken


def test_a_prefix_break_is_cut_there_or_refused():
    """Call 2's prompt re-rendered call 1's reply (token 4 became 40): the model never saw call 2
    after [1, 2, 3, 4], so the sequence stops before it (or the episode is refused)."""
    broken = trajectory(call([1, 2], [3, 4]), call([1, 2, 3, 40, 9], [5, 6]))
    seq = episode_sequence(broken)
    assert seq.completion_ids == [3, 4] and seq.env_mask == [1, 1]
    assert (seq.turns, seq.turns_kept, seq.model_tokens, seq.model_tokens_kept) == (2, 1, 4, 2)
    assert seq.broken
    with pytest.raises(PrefixBreak, match="model call 1's prompt does not begin with call 0's.*token 3 of 4"):
        episode_sequence(broken, on_break="error")


def test_an_episode_without_sampled_tokens_has_no_sequence():
    assert episode_sequence(trajectory(error=True)) is None
    assert episode_sequence(trajectory(call([1], []))) is None


def test_an_infrastructure_error_is_one_masked_token_with_no_reward():
    rollout = make_rollout()
    rollout._policy = SimpleNamespace(stop_ids=[2], pad_id=0)
    good = trajectory(call([1, 2], [3, 4]))
    bad = trajectory(error=True)
    rows = rollout._rows([good, bad], [episode_sequence(good), None], [1.0, None])
    assert rows["completion_ids"][1] == [2] and rows["env_mask"][1] == [0] and rows["prompt_ids"][1] == [2]
    assert rows["harnessrl_score"] == [1.0, None]
    assert rollout.reward(harnessrl_score=rows["harnessrl_score"]) == [1.0, None]


# ------------------------------------------------------------------------------- the schedule


def test_batch_advantages_leave_out_infrastructure_errors_and_small_groups():
    out = batch_advantages([1.0, 0.0, None, 1.0, None, None, 0.5, 0.5], 2, "group")
    assert out[0] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert out[1] is None  # one valid episode: nothing to compare
    assert out[2] is None
    assert out[3] == [0.0, 0.0]
    assert batch_advantages([1.0, 0.0], 2, "none") == [[0.5, -0.5]]


def test_the_schedule_is_driven_in_order():
    schedule = HarnessSchedule(make_scheduler("round-robin", ["a", "b"], seed=0))
    with pytest.raises(ScheduleError, match="nothing to observe"):
        schedule.observe()
    plan = schedule.plan(0, 2)
    assert plan.group_harness == ["a", "a"]
    schedule.record(plan, [1.0, 0.0, 0.0, 0.0], 2, "group")
    with pytest.raises(ScheduleError, match="never observed"):
        schedule.plan(1, 2)
    with pytest.raises(ScheduleError, match="save after observe"):
        schedule.state_dict()
    schedule.add_sketch(torch.ones(512))
    obs, _ = schedule.observe()
    assert obs.groups == 2 and obs.flat_groups == 1 and obs.learnability == pytest.approx(0.5, abs=1e-4)
    assert schedule.plan(1, 2).group_harness == ["b", "b"]


def test_a_mixture_spreads_the_groups_by_its_shares():
    schedule = HarnessSchedule(make_scheduler("ratio:a=3,b=1", ["a", "b"], seed=0))
    plan = schedule.plan(0, 4)
    assert plan.selection == Selection({"a": 0.75, "b": 0.25})
    assert plan.group_harness == ["a", "a", "a", "b"] and plan.harness == "mixed"


def test_the_example_takes_a_model_folder_with_or_without_hf(tmp_path, monkeypatch):
    """The GPU recipe's `--model /models/NAME` (a local folder) and `hf:/models/NAME` load the same model."""
    import sys

    from harnessrl.models.embedded import load_tokenizer, tiny_random_model

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples" / "trl"))
    from train_toolcalc import load_model

    folder = tmp_path / "models" / "tiny"
    tiny_random_model().save_pretrained(folder)
    load_tokenizer().save_pretrained(folder)
    for spec in (str(folder), f"hf:{folder}"):
        model, tokenizer = load_model(spec, "float32")
        assert model.config.vocab_size == tiny_random_model().config.vocab_size and tokenizer is not None
    with pytest.raises(SystemExit, match="the path of a local model folder"):
        load_model(str(tmp_path / "models" / "absent"), "float32")
    sys.modules.pop("train_toolcalc", None)
