"""HarnessBandit inside TRL's AsyncGRPOTrainer (trl==1.16.0), on the CPU, the tiny random model.

The reference run: AsyncGRPOTrainer with HarnessRolloutWorker as its rollout worker and the
worker's ServeAdapterTransfer as its weight transfer, `harnessrl serve` in this process as the
rollout server (keyed adapter route), two harnesses (examples/agents/minimal.yaml, an agent
program of its own, and a shrunk json-tools), harness-bandit, 2 groups of 2 per batch, one
optimizer step per batch of samples, 4 steps, max_staleness 1. The two pieces of the trainer
that need CUDA are replaced (`cpu_stand_ins`: TRL's peak-FLOPs lookup and its FA3 tree
attention, docs/trl-async.md "What needs CUDA"); everything else is TRL's own code.

Checked against it: every batch is played by the harness the scheduler drew (replayed from the
seed and the probabilities it had), both harnesses were drawn; every adapter version reached the
server before TRL announced it, and the log-probs each sample carries are the ones the trainer's
base with that version's adapter gives its tokens at T (so TRL's ratio is exactly its policy
change); the first step (trainer and sampler on the same weights) has TRL's ratio 1; no sample
past the staleness bound reached the loss; the scheduler observed the trained batches, with the
sketch of the steps that trained them alone.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from helpers import keyed_server
from test_trainer import SPECS, TextScore

from harnessrl.harness.registry import load_harness

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'harnessrl[trl]')")
pytest.importorskip("peft")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 4
TEMPERATURE = 1.0
ROOT = Path(__file__).resolve().parents[1]


def agent_spec():
    """examples/agents/minimal.yaml with three short replies at most (the tiny model's episodes end fast)."""
    agent = load_harness(str(ROOT / "examples" / "agents" / "minimal.yaml"))
    return agent.model_copy(
        update={"limits": agent.limits.model_copy(update={"max_model_calls": 3, "max_new_tokens": 48})}
    )


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    """The tiny random model as a folder (AsyncGRPOTrainer loads its model from a path); the same
    weights `harnessrl serve tiny-random` serves."""
    from harnessrl.models.embedded import load_tokenizer, tiny_random_model

    folder = tmp_path_factory.mktemp("tiny-base")
    tiny_random_model().save_pretrained(folder)
    load_tokenizer().save_pretrained(folder)
    return folder


def config(out: Path, **change):
    from trl.experimental.async_grpo import AsyncGRPOConfig

    settings = dict(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=2,
        token_budget=0,
        max_staleness=1,
        learning_rate=5e-3,
        bf16=False,  # TRL's default autocasts to bf16; the server samples in float32
        temperature=TEMPERATURE,
        use_cpu=True,
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        seed=0,
    )
    settings.update(change)
    return AsyncGRPOConfig(**settings)


def lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def reference(base_folder, tmp_path_factory):
    """The reference run (module docstring); what the worker handed out and every adapter version kept."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from harnessrl.integrations.trl.async_serve import cpu_stand_ins
    from harnessrl.integrations.trl.async_worker import HarnessRolloutWorker

    out = tmp_path_factory.mktemp("trl-async")
    kept = out / "kept-adapters"
    handed: list[tuple[object, bool, int]] = []  # (sample, handed to the trainer, trainer's version then)
    with keyed_server("tiny-random") as url, cpu_stand_ins():
        worker = HarnessRolloutWorker(
            TextScore(),
            [agent_spec(), SPECS[0]],
            url,
            scheduler="harness-bandit",
            # a floor of 0.4 keeps each harness's chance in [0.4, 0.6]: seed 0's first four draws
            # (0.84, 0.76, 0.42, 0.26) then pick both harnesses whatever the observations' timing
            scheduler_options={"floor": 0.4},
            seed=0,
            max_in_flight=4,
        )
        transfer = worker.weight_transfer
        save = transfer._save

        def keep(folder: Path) -> None:  # every version's adapter, for the log-prob check
            save(folder)
            shutil.copytree(folder, kept / f"v{transfer.version + 1}")

        transfer._save = keep  # type: ignore[method-assign]
        hand_out = worker._hand_out

        def record(sample) -> bool:
            version = worker._version
            accepted = hand_out(sample)
            handed.append((sample, accepted, version))
            return accepted

        worker._hand_out = record  # type: ignore[method-assign]
        trainer = AsyncGRPOTrainer(
            model=str(base_folder),
            args=config(out / "run"),
            train_dataset=worker.dataset(),
            peft_config=lora(),
            rollout_worker=worker,
            weight_transfer=transfer,
        )
        worker.attach(trainer)
        trainer.train()
    return worker, trainer, handed, kept, out / "run"


def test_each_batch_is_played_by_the_harness_harness_bandit_drew(reference):
    worker, trainer, _, _, _ = reference
    names = worker.scheduler.harnesses
    rng = random.Random(0)  # the scheduler's RNG: one draw per batch, from the probabilities it had
    for record in worker.batches:
        assert record.group_harness == [record.harness] * worker.groups_per_batch
        drawn = rng.choices(names, weights=[record.probabilities[h] for h in names])[0]
        assert record.harness == drawn
    assert len(worker.batches) >= STEPS
    assert {r.harness for r in worker.batches} == {"minimal-agent", SPECS[0].name}
    agent_batches = [r for r in worker.batches if r.harness == "minimal-agent"]
    assert any(r.pushed for r in agent_batches), "the agent program's episodes reached the trainer"
    assert all(s is not None for r in agent_batches for s in r.scores), "the agent's episodes were graded"
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(log) == STEPS
    assert all(f"harnessrl/probability/{h}" in log[0] for h in names)


def test_every_sample_carries_the_log_probs_of_the_adapter_version_that_sampled_it(reference, base_folder):
    """The server sampled each version's adapter as the trainer saved it, at TRL's temperature:
    the trainer's base with that adapter gives the sample's tokens the log-probs it carries."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from harnessrl.train.grpo import token_logprobs

    worker, trainer, handed, kept, _ = reference
    transfer = worker.weight_transfer
    assert transfer.version == trainer.model_version == STEPS + 1  # the cold sync, then one per step
    assert len(set(transfer.tensors_sent)) == 1 and transfer.tensors_sent[0] > 0
    versions = sorted({s.model_version for s, accepted, _ in handed if accepted})
    assert len(versions) >= 2, "the policy moved during the run and the worker followed it"
    checked = 0
    for version in versions:
        base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
        model = PeftModel.from_pretrained(base, kept / f"v{version}").eval()
        for sample, _, _ in [h for h in handed if h[0].model_version == version]:
            ids = torch.tensor([sample.input_ids.tolist()])
            mask = torch.tensor([sample.completion_mask.tolist()])
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": mask}
            with torch.no_grad():
                recomputed = token_logprobs(model, batch, TEMPERATURE)[0]
            trained = mask[0].bool()
            carried = torch.tensor(sample.old_log_probs)[trained]
            assert torch.allclose(recomputed[trained].float(), carried, atol=1e-4), (version, sample.group_id)
            checked += 1
    assert checked >= 4
    # at train end every version was unloaded and its folder deleted
    assert not list((worker.output_dir / "harnessrl" / "rollout-adapters").iterdir())


def test_trl_takes_the_samples_as_its_own_and_the_staleness_bound_holds(reference):
    worker, trainer, handed, _, run = reference
    log = [entry for entry in trainer.state.log_history if "loss" in entry]
    # step 1: trainer and sampler on version 1, so TRL's ratio is 1 up to float noise
    assert log[0]["sample/staleness_max"] == 0
    assert abs(log[0]["ratio"] - 1.0) < 1e-3 and abs(log[0]["kl"]) < 1e-4
    assert all(entry["sample/staleness_max"] <= 1 for entry in log)
    assert not any("sample/dropped_stale_total" in entry for entry in log)  # the worker dropped first
    for sample, accepted, version in handed:
        assert accepted == (version - sample.model_version <= 1)
    dropped = sum(not accepted for _, accepted, _ in handed)
    assert dropped == sum(r.dropped_stale for r in worker.batches if r.pushed)
    assert any(entry["grad_norm"] > 0 for entry in log), "no step had a signal: the weights never moved"


def test_the_scheduler_observes_trained_batches_with_the_sketch_of_their_own_steps(reference):
    worker, _, _, _, run = reference
    observed = [r for r in worker.batches if r.observed]
    assert observed, "no batch was observed"
    for record in observed:
        assert record.trained + record.dropped_stale == record.pushed
    trained = [r for r in worker.batches if r.trained]
    assert sum(r.trained for r in trained) == STEPS * worker.samples_per_step
    assert any(r.pure_steps and r.sketch is not None and bool(r.sketch.any()) for r in observed)
    if not any(r.dropped_stale for r in worker.batches if r.pushed):  # nothing shifted the steps
        # every batch fills whole steps (align_steps), so every step trained one batch alone
        assert sum(r.pure_steps for r in worker.batches) == STEPS
        assert not any(r.mixed_steps for r in worker.batches)
    with_advantages = sum(1 for r in observed for h in dict.fromkeys(r.group_harness) if r.advantages.get(h))
    assert worker.scheduler.total == with_advantages
    lines = [json.loads(x) for x in (run / "harnessrl" / "batches.jsonl").read_text().splitlines()]
    assert sorted(line["batch"] for line in lines) == sorted(r.batch for r in observed)
    assert all(set(line["probabilities_after"]) == set(worker.scheduler.harnesses) for line in lines)
    from harnessrl.store import RunStore

    with RunStore(run / "harnessrl" / "rollouts") as store:
        assert len(list(store.trajectories())) == sum(len(r.scores) for r in worker.batches)


def test_trl_advantages_are_trls():
    from harnessrl.integrations.trl.async_worker import trl_advantages

    assert trl_advantages([1.0, 0.0]) == pytest.approx([1.0, -1.0])
    assert trl_advantages([1.0, None, 0.0]) == pytest.approx([1.0, 0.0, -1.0])
    assert trl_advantages([None, None]) == [0.0, 0.0]
    assert trl_advantages([0.5, 0.5]) == [0.0, 0.0]


def test_a_short_batch_is_cut_to_whole_optimizer_steps():
    """align_steps: 7 samples, 4 a step -> 4 pushed; those of advantage 0 are left out first."""
    from harnessrl.integrations.trl.async_worker import steps_aligned

    assert steps_aligned([1.0, -1.0, 1.0, -1.0], 4) == [0, 1, 2, 3]
    assert steps_aligned([1.0, -1.0, 0.0, 0.0, 1.0, -1.0, 0.5], 4) == [0, 1, 4, 5]
    assert steps_aligned([1.0, -1.0, 0.0, 1.0, -1.0], 4) == [0, 1, 3, 4]
    assert steps_aligned([1.0, -1.0, 1.0, -1.0, 1.0], 4) == [0, 1, 2, 3]
    assert steps_aligned([1.0, -1.0, 1.0], 4) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CUDA-only line is only reached without CUDA")
def test_without_the_stand_ins_the_trainer_cannot_be_built_on_the_cpu(base_folder, tmp_path):
    """The line docs/trl-async.md names: AsyncGRPOTrainer.__init__ asks CUDA for the device's name."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from harnessrl.integrations.trl.async_worker import HarnessRolloutWorker

    worker = HarnessRolloutWorker(TextScore(), SPECS, "http://127.0.0.1:9/v1", preflight=False)
    with pytest.raises((AssertionError, RuntimeError), match="CUDA|cuda") as raised:
        AsyncGRPOTrainer(
            model=str(base_folder),
            args=config(tmp_path),
            train_dataset=worker.dataset(),
            peft_config=lora(),
            rollout_worker=worker,
            weight_transfer=worker.weight_transfer,
        )
    frames = [(Path(f.filename).name, f.lineno) for f in __import__("traceback").extract_tb(raised.tb)]
    assert ("async_grpo_trainer.py", 1240) in frames and ("utils.py", 1824) in frames


def test_set_ups_the_worker_cannot_serve_are_refused(base_folder, tmp_path):
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from harnessrl.integrations.trl import HarnessRolloutError
    from harnessrl.integrations.trl.async_serve import cpu_stand_ins
    from harnessrl.integrations.trl.async_worker import HarnessRolloutWorker

    worker = HarnessRolloutWorker(TextScore(), SPECS, "http://127.0.0.1:9/v1", preflight=False)
    with pytest.raises(HarnessRolloutError, match="attach"):
        worker.start()
    with cpu_stand_ins():
        trainer = AsyncGRPOTrainer(
            model=str(base_folder),
            args=config(tmp_path, token_budget=64),
            train_dataset=worker.dataset(),
            peft_config=lora(),
            rollout_worker=worker,
            weight_transfer=worker.weight_transfer,
        )
        with pytest.raises(HarnessRolloutError, match="token_budget=0"):
            worker.attach(trainer)
        trainer.args.token_budget = 0
        worker.attach(trainer)
        with pytest.raises(HarnessRolloutError, match="version 3"):
            worker.update_model_version(3)  # TRL announcing a version this transfer never published
        other = HarnessRolloutWorker(TextScore(), SPECS, "http://127.0.0.1:9/v1", preflight=False)
        with pytest.raises(HarnessRolloutError, match="rollout_worker=worker"):
            other.attach(trainer)
    with pytest.raises(HarnessRolloutError, match="not a PeftModel"):
        worker.weight_transfer.bind(torch.nn.Linear(2, 2))
    with pytest.raises(HarnessRolloutError, match="does not answer"):
        worker.weight_transfer.init_weight_transfer()


def test_a_resumed_run_goes_on_from_the_schedulers_saved_state(base_folder, tmp_path):
    """Checkpoints hold the scheduler's state and the next batch's number: a run resumed from
    one selects its first batch from exactly that state (its probabilities, its RNG), numbers its
    batches on from there, and keeps the first run's records of the batches before them."""
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    from harnessrl.integrations.trl.async_serve import cpu_stand_ins
    from harnessrl.integrations.trl.async_worker import STATE_FILE, HarnessRolloutWorker
    from harnessrl.train.schedulers import make_scheduler

    out = tmp_path / "run"

    def train(steps: int, resume: str | None = None, **change):
        worker = HarnessRolloutWorker(TextScore(), SPECS, url, seed=0, max_in_flight=4)
        trainer = AsyncGRPOTrainer(
            model=str(base_folder),
            args=config(out, max_steps=steps, **change),
            train_dataset=worker.dataset(),
            peft_config=lora(),
            rollout_worker=worker,
            weight_transfer=worker.weight_transfer,
        )
        worker.attach(trainer)
        trainer.train(resume_from_checkpoint=resume)
        return worker, trainer

    with keyed_server("tiny-random") as url, cpu_stand_ins():
        first, _ = train(2, save_strategy="steps", save_steps=2)
        saved = json.loads((out / "checkpoint-2" / STATE_FILE).read_text())
        second, trainer = train(4, resume=str(out / "checkpoint-2"))
    assert trainer.state.global_step == 4
    assert saved["next_batch"] >= 2 and saved["scheduler"]["total"] >= 1
    assert second.batches[0].batch == saved["next_batch"]
    replay = make_scheduler("harness-bandit", [s.name for s in SPECS], 0)
    replay.load_state_dict(saved["scheduler"])
    assert second.batches[0].probabilities == pytest.approx(replay.probabilities())
    assert second.batches[0].harness == replay.select(saved["next_batch"]).harness
    lines = [json.loads(x) for x in (out / "harnessrl" / "batches.jsonl").read_text().splitlines()]
    before = {r.batch for r in first.batches if r.observed and r.batch < saved["next_batch"]}
    assert {x["batch"] for x in lines if x["batch"] < saved["next_batch"]} == before
    assert {x["batch"] for x in lines if x["batch"] >= saved["next_batch"]} == {
        r.batch for r in second.batches if r.observed
    }


def test_staleness_drops_and_gradient_attribution_step_by_step(tmp_path):
    """The worker's bookkeeping without timing: a sample past the bound is dropped by the queue
    (and its batch observed without a sketch once nothing of it is left); a step on one batch alone
    gives that batch its sketch; a step that mixes two batches gives neither one."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from harnessrl.integrations.trl.async_worker import BatchRecord, HarnessRolloutWorker

    names = [s.name for s in SPECS]
    worker = HarnessRolloutWorker(TextScore(), SPECS, "http://127.0.0.1:9/v1", preflight=False)
    # what attach reads of a trainer: 2 samples per optimizer step, groups of 2, one group a batch
    worker.num_generations, worker.samples_per_step, worker.groups_per_batch = 2, 2, 1
    worker.max_staleness, worker.output_dir = 1, tmp_path

    def batch(number: int, harness: str, version: int, advantages: list[float]) -> list:
        record = BatchRecord(number, version, harness, {harness: 1.0}, {h: 0.5 for h in names}, [harness], 0)
        record.advantages = {harness: advantages}
        record.rewards = {harness: [1.0, 0.0][: len(advantages)]}
        record.pushed = record.left = len(advantages)
        worker.batches.append(record)
        return [
            RolloutSample([], [], np.arange(4), np.array([0, 0, 1, 1]), np.zeros(4, np.float32), a, version, number, {})
            for a in advantages
        ]

    model = torch.nn.Linear(3, 3)
    model.weight.grad, model.bias.grad = torch.ones(3, 3), torch.ones(3)

    worker._version = 3  # batch 0 (version 1) is two versions behind when the trainer asks
    for sample in batch(0, names[0], 1, [1.0, -1.0]) + batch(1, names[1], 2, [1.0, -1.0]):
        worker.rollout_buffer.put(sample)
    taken = [worker.rollout_buffer.get(timeout=1), worker.rollout_buffer.get(timeout=1)]
    assert [s.group_id for s in taken] == [1, 1]  # batch 0's samples were dropped on the way
    first, second = worker.batches
    assert first.dropped_stale == 2 and first.observed and first.sketch is None
    assert worker.metrics_queue.get_nowait() == {"harnessrl/dropped_stale_total": 1.0}
    worker._step_trained(0, model)  # step 0: batch 1 alone
    assert second.pure_steps == 1 and second.observed and second.sketch is not None and bool(second.sketch.any())
    assert set(worker.scheduler.sketch_avg) == {names[1]}

    for sample in batch(2, names[0], 3, [0.5]) + batch(3, names[1], 3, [0.5]):  # one sample each
        worker.rollout_buffer.put(sample)
    worker.rollout_buffer.get(timeout=1), worker.rollout_buffer.get(timeout=1)
    worker._step_trained(1, model)  # step 1: batches 2 and 3 together
    third, fourth = worker.batches[2:]
    assert (third.mixed_steps, fourth.mixed_steps, third.pure_steps, fourth.pure_steps) == (1, 1, 0, 0)
    assert third.observed and fourth.observed and third.sketch is None and fourth.sketch is None
    assert set(worker.scheduler.sketch_avg) == {names[1]}  # nothing of the mixed step was attributed
    assert worker.scheduler.count == {names[0]: 2, names[1]: 2}
    from harnessrl.integrations.trl import HarnessRolloutError

    with pytest.raises(HarnessRolloutError, match="only 4 were"):
        worker._step_trained(2, model)  # a step with no samples handed out for it
