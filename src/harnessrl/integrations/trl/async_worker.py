"""HarnessRolloutWorker: a harness scheduler inside TRL's AsyncGRPOTrainer (docs/trl-async.md).

    worker = HarnessRolloutWorker("toolcalc", ["json-tools", "react"], "http://127.0.0.1:8000/v1")
    trainer = AsyncGRPOTrainer(model=PATH, args=AsyncGRPOConfig(..., token_budget=0),
                               train_dataset=worker.dataset(), peft_config=LoraConfig(...),
                               rollout_worker=worker, weight_transfer=worker.weight_transfer)
    worker.attach(trainer)
    trainer.train()

TRL's own worker (`AsyncRolloutWorker`) walks the dataset in a spawned process. This one lives in
the trainer's process (a thread on rank 0), so the scheduler is the trainer's: it sees what
each batch scored and what the optimizer did with it. Each batch:

1. **The scheduler chooses.** When the worker may plan batch b (the queue holds less than
   `max(max_staleness, 1)` optimizer steps of samples, and at most `scheduler_lag` batches before
   it are not yet wholly handed to the trainer), it takes the live policy version v, pins it on
   the servers, and asks the scheduler for b's harness (or shares, for `mixed` / `ratio:`).
2. **The groups play through harnessrl's Runner**, `groups_per_batch` tasks of the split in
   turn, `num_generations` attempts each, against `harnessrl serve` (RolloutServers, the
   `openai:` backend: token ids and log-probs per call) at version v's adapter, whatever is
   published meanwhile; TRL's temperature, top_p, top_k, min_p and repetition_penalty, seed
   `sampling_seed(seed, b, "train")`.
3. **Each episode is one RolloutSample** (harnessrl.train.episode_sequence): input_ids = the
   first prompt and every model turn with the harness's tokens between; completion_mask 1 on the
   model's tokens; old_log_probs = the sampler's log-prob of each model token (0 elsewhere);
   advantage = TRL's own ((r - mean) / (std + 1e-8) over the group's graded episodes; 0 for the
   others); model_version = v; group_id = b * groups_per_batch + g. An episode without a model
   token (an infrastructure error) is not pushed, as TRL's worker pushes no row without a
   trained token.
4. **The staleness bound.** TRL drops a sample whose version is more than `max_staleness`
   behind the trainer's when it takes it (RolloutQueueDataset). The worker applies the same rule
   at the same moment (its queue's `get`, on the trainer's thread, with the version TRL will read
   next), so it knows which samples were dropped and which were trained; a batch already too
   stale when it is scored is not pushed. Both are counted (`harnessrl/dropped_stale`).
5. **The mismatch correction is TRL's**: its loss takes the ratio of the trainer's log-prob
   (log softmax(z / T)) to `old_log_probs`, clipped by epsilon / epsilon_high. So the samples
   carry the sampler's log-probs of the version that drew them (one version per episode: the
   batch is pinned to v), computed at T by the server (`harnessrl serve` reports processed
   log-probs), which is what makes the ratio 1 when trainer and sampler hold the same weights.
6. **The scheduler observes** the batch's advantages (harnessrl's group advantages,
   `batch_advantages`) and scores once every sample pushed of it was trained or dropped. The
   gradient sketch it is given is the sum of the sketches of the optimizer steps whose samples
   all came from this batch ("pure" steps); a step that mixes batches (of several harnesses, or of
   one harness and several versions) has one summed gradient that belongs to no one batch, and
   gives no batch a sketch. A batch with no pure step is observed without a sketch, and
   HarnessBandit then holds its transferability term neutral (0.5). The step of a sample is
   known because TRL's FixedCountBatcher (`token_budget=0`, required) gives every micro-batch
   `per_device_train_batch_size * num_processes` consecutive samples and every optimizer step
   `gradient_accumulation_steps` micro-batches. A batch short of samples is pushed cut to whole
   steps (`align_steps`, `steps_aligned`), so the steps after it still train one batch each.

Rank 0 writes OUTPUT_DIR/harnessrl/: `batches.jsonl` (a line per batch at its observation) and
`rollouts/run.db` (every episode, for `harnessrl triage` / `report`). Each TRL checkpoint gets
`harnessrl_async_schedule.json` (the scheduler's state, the next batch's number); a run resumed
from it goes on from there (the samples in flight at the checkpoint are not restored: TRL
checkpoints no queue).
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import TrainerCallback

from harnessrl.harness.spec import AnyHarnessSpec
from harnessrl.integrations.trl.async_serve import ServeAdapterTransfer
from harnessrl.integrations.trl.setup import HarnessRolloutError
from harnessrl.models.base import GenerationRequest, Policy, SamplingParams
from harnessrl.rollout import Job
from harnessrl.tasks.base import Suite, Task
from harnessrl.train.episode_sequence import EpisodeSequence, OnBreak, episode_sequence
from harnessrl.train.harness_schedule import batch_advantages
from harnessrl.train.rollout_server import RolloutServerError, RolloutServers
from harnessrl.train.schedulers import Scheduler, make_scheduler
from harnessrl.train.sketch import GradientSketch
from harnessrl.train.step import allocate_tasks, observe_harnesses, sampling_seed
from harnessrl.types import ModelCall, Trajectory
from harnessrl.wire.auth import ADMIN_KEY_ENV

if TYPE_CHECKING:
    import torch

RECORD_FOLDER = "harnessrl"  # under TRL's output_dir
STATE_FILE = "harnessrl_async_schedule.json"  # in each TRL checkpoint folder
POLL_S = 0.05


@dataclass
class BatchRecord:
    """One planned batch, from its selection to its observation."""

    batch: int
    version: int  # the policy version its episodes were sampled from
    harness: str  # the selected harness, or "mixed"
    shares: dict[str, float]
    probabilities: dict[str, float]  # the scheduler's, at selection
    group_harness: list[str]
    unobserved_before: int  # batches selected and not yet observed when this one was selected
    scores: list[float | None] = field(default_factory=list)
    advantages: dict[str, list[float]] = field(default_factory=dict)  # harnessrl's, for the scheduler
    rewards: dict[str, list[float]] = field(default_factory=dict)
    pushed: int = 0  # samples put in the queue
    handed: int = 0  # of those, handed to the trainer
    left: int = 0  # of those, not yet trained or dropped
    trained: int = 0
    dropped_stale: int = 0
    left_out: int = 0  # samples not pushed so that the batch fills whole optimizer steps (align_steps)
    pure_steps: int = 0  # optimizer steps on this batch alone: their sketches are its sketch
    mixed_steps: int = 0  # optimizer steps shared with other batches: no sketch for anyone
    sketch: torch.Tensor | None = None
    rollout_s: float = 0.0
    infra_errors: int = 0
    prefix_breaks: int = 0
    observed: bool = False
    probabilities_after: dict[str, float] = field(default_factory=dict)

    @property
    def signal(self) -> bool:
        return any(a != 0 for v in self.advantages.values() for a in v)


class _Beating(Policy):
    """A batch's policy (its pinned version on the servers) that tells the worker each time a
    model call comes back: the heartbeat TRL's health check reads (an agent's episode may take
    longer than TRL's `heartbeat_stale_after_s`, its calls do not)."""

    def __init__(self, inner: Policy, beat: Callable[[], None]):
        self.inner = inner
        self.beat = beat
        self.name = inner.name
        self.max_concurrency = inner.max_concurrency
        self.native_tool_calls = inner.native_tool_calls

    def submit(self, request: GenerationRequest, sampling: SamplingParams | None = None) -> Future[ModelCall]:
        future = self.inner.submit(request, sampling)  # type: ignore[arg-type]  # None: the policy's own
        future.add_done_callback(lambda _: self.beat())
        return future

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        futures = [self.submit(r, sampling) for r in requests]
        return [f.result() for f in futures]

    def describe(self) -> dict:
        return self.inner.describe()


class _FreshQueue(queue.Queue):
    """The rollout buffer: `get` hands the trainer only samples TRL will not drop as stale, and
    tells the worker which it handed out (module docstring, 4)."""

    def __init__(self, worker: HarnessRolloutWorker):
        super().__init__()
        self._worker = worker

    def get(self, block: bool = True, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            sample = super().get(block, left)
            if self._worker._hand_out(sample):
                return sample


class _StepAttribution(TrainerCallback):
    """The worker's side of the trainer's loop: which batches each optimizer step trained, the
    sketch of a step on one batch alone, and the scheduler's observations (module docstring, 6);
    the scheduler's state into each checkpoint."""

    def __init__(self, worker: HarnessRolloutWorker):
        self.worker = worker
        self.first_step = 0  # TRL's global_step when this train() began (set by worker.start)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.worker.save_state(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if model is None:
            raise RuntimeError("transformers did not pass the model to on_pre_optimizer_step")
        self.worker._step_trained(state.global_step - self.first_step, model)


class HarnessRolloutWorker:
    """TRL's RolloutWorkerProtocol with a harness scheduler (module docstring).

    suite: a suite name or object; harnesses: built-in names, spec files or specs (agent programs
    too); servers: `harnessrl serve` base URL(s) (ending in /v1) or a RolloutServers.
    scheduler / scheduler_options / seed: as `harnessrl train grpo`. groups_per_batch: tasks per
    batch (default: one optimizer step's samples, `per_device_train_batch_size *
    gradient_accumulation_steps * num_processes / num_generations`). scheduler_lag: how many
    earlier batches may still be waiting to be handed to the trainer when a batch is selected
    (0: the scheduler chooses after every earlier batch was taken; larger overlaps generation
    more). admin_key: the servers' admin key (default $HARNESSRL_ADMIN_KEY). adapter_dir: where
    adapter versions are written (default OUTPUT_DIR/harnessrl). preflight: measure every
    harness's first request against the trainer's tokenizer before the first batch.
    align_steps: push a batch short of samples (episodes without a model token) as a whole
    number of optimizer steps, leaving out its remainder (samples of advantage 0 first), so the
    steps after it still train one batch each and their sketches stay attributable.
    """

    def __init__(
        self,
        suite: str | Suite,
        harnesses: Sequence[str | AnyHarnessSpec],
        servers: str | Sequence[str] | RolloutServers,
        *,
        scheduler: str = "harness-bandit",
        scheduler_options: dict[str, Any] | None = None,
        seed: int = 0,
        split: str = "train",
        groups_per_batch: int | None = None,
        scheduler_lag: int = 1,
        sketch_dim: int = 512,
        sketch_kind: str = "countsketch",
        on_prefix_break: OnBreak = "truncate",
        max_in_flight: int = 16,
        retries: int = 2,
        executor=None,
        admin_key: str | None = None,
        adapter_dir: str | Path | None = None,
        preflight: bool = True,
        align_steps: bool = True,
    ):
        from harnessrl.harness.registry import resolve_harnesses
        from harnessrl.harness.spec import SpecError
        from harnessrl.tasks import get_suite

        try:
            self.suite = get_suite(suite) if isinstance(suite, str) else suite
            self.specs: list[AnyHarnessSpec] = [
                s for h in harnesses for s in (resolve_harnesses([h]) if isinstance(h, str) else [h])
            ]
            self.tasks: list[Task] = self.suite.tasks(split)
        except (ValueError, SpecError) as e:
            raise HarnessRolloutError(str(e)) from None
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise HarnessRolloutError(f"harness names must be unique, got {names}")
        if not self.tasks:
            raise HarnessRolloutError(f"split {split!r} of suite {self.suite.name!r} has no tasks")
        if groups_per_batch is not None and groups_per_batch < 1:
            raise HarnessRolloutError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        if scheduler_lag < 0:
            raise HarnessRolloutError(f"scheduler_lag must be >= 0, got {scheduler_lag}")
        try:
            self.scheduler: Scheduler = make_scheduler(scheduler, names, seed, **(scheduler_options or {}))
        except ValueError as e:
            raise HarnessRolloutError(f"scheduler: {e}") from None
        if isinstance(servers, RolloutServers):
            self.servers = servers
        else:
            urls = [servers] if isinstance(servers, str) else list(servers)
            key = admin_key if admin_key is not None else os.environ.get(ADMIN_KEY_ENV)
            try:
                self.servers = RolloutServers(urls, max_concurrency=max_in_flight, admin_key=key)
            except ValueError as e:
                raise HarnessRolloutError(str(e)) from None
        self.seed = seed
        self.split = split
        self.groups_per_batch = groups_per_batch
        self.scheduler_lag = scheduler_lag
        self.sketcher = GradientSketch(dim=sketch_dim, seed=seed, kind=sketch_kind)
        self.on_prefix_break = on_prefix_break
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.executor = executor
        self.preflight = preflight
        self.align_steps = align_steps
        self._adapter_dir = None if adapter_dir is None else Path(adapter_dir)
        self.weight_transfer = ServeAdapterTransfer(self.servers, self._adapter_dir or Path("."))

        # TRL's RolloutWorkerProtocol
        self.rollout_buffer: queue.Queue = _FreshQueue(self)
        self.metrics_queue: queue.Queue = queue.Queue()

        self.batches: list[BatchRecord] = []  # every batch planned by this worker, in order
        self._batch_base = 0  # the number of its first batch (after a resume: the checkpoint's next)
        self.callback = _StepAttribution(self)
        self._lock = threading.Lock()  # the scheduler, the batch records, the hand-out log
        self._handed: list[int] = []  # the batch of every sample handed to the trainer, in order
        self._version = 0  # the live policy version (TRL's model_version)
        self._trainer: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._failure_trace = ""
        self._heartbeat = time.time()

    # -------------------------------------------------------------------------------- set-up
    def dataset(self):
        """The split's tasks as a `datasets.Dataset` (a `prompt` and a `task_id` per task):
        AsyncGRPOTrainer wants a train_dataset; this worker walks `self.tasks` itself."""
        from datasets import Dataset

        return Dataset.from_list(
            [{"prompt": [{"role": "user", "content": t.instruction}], "task_id": t.id} for t in self.tasks]
        )

    def attach(self, trainer) -> None:
        """Bind the worker and its weight transfer to `trainer` (an AsyncGRPOTrainer built with
        rollout_worker=self and weight_transfer=self.weight_transfer): reads its settings,
        refuses the set-ups this worker cannot serve, and adds the step callback."""
        if trainer.rollout_worker is not self or trainer.weight_transfer is not self.weight_transfer:
            raise HarnessRolloutError(
                "build the trainer with rollout_worker=worker and weight_transfer=worker.weight_transfer"
            )
        args = trainer.args
        if args.token_budget != 0:
            raise HarnessRolloutError(
                f"AsyncGRPOConfig(token_budget={args.token_budget}): set token_budget=0. The worker attributes each "
                "optimizer step's gradient to the batches it trained from TRL's fixed-count micro-batches "
                "(FixedCountBatcher); a token budget makes them dynamic (and None asks a vLLM server for its length)"
            )
        if trainer.accelerator.num_processes != 1:
            raise HarnessRolloutError("HarnessRolloutWorker runs one training process (see docs/trl-async.md)")
        self.num_generations = int(args.num_generations)
        self.samples_per_step = int(args.per_device_train_batch_size * args.gradient_accumulation_steps)
        if self.groups_per_batch is None:
            if self.samples_per_step % self.num_generations:
                raise HarnessRolloutError(
                    f"{self.samples_per_step} samples per optimizer step do not make groups of num_generations="
                    f"{self.num_generations}: pass groups_per_batch"
                )
            self.groups_per_batch = self.samples_per_step // self.num_generations
        self.max_staleness = int(args.max_staleness)
        self.max_queued = max(self.max_staleness, 1) * self.samples_per_step
        self.temperature = float(args.temperature)
        self.top_p = float(args.top_p)
        self.shaping = trl_shaping(args)
        self.output_dir = Path(args.output_dir)
        if self._adapter_dir is None:
            self.weight_transfer.adapter_dir = self.output_dir / RECORD_FOLDER
        self.tokenizer = trainer.processing_class
        self.weight_transfer.bind(trainer.model)
        self._trainer = trainer
        if not any(isinstance(c, _StepAttribution) and c.worker is self for c in trainer.callback_handler.callbacks):
            trainer.add_callback(self.callback)

    # ------------------------------------------------------------------- RolloutWorkerProtocol
    def start(self) -> None:
        """Called by TRL after the first weight sync: the preflight, then the worker's thread."""
        if self._trainer is None:
            raise HarnessRolloutError("call worker.attach(trainer) before trainer.train()")
        if self._thread is not None:
            return
        step = int(self._trainer.state.global_step)
        self.callback.first_step = step
        if step > 0 and not self.batches:
            self._resume(step)
        if self.preflight:
            self._preflight()
        self._stop.clear()
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._run, name="harnessrl-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Called by TRL at train end: the batch in flight finishes (its episodes are not cut)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def update_model_version(self, model_version: int) -> None:
        if model_version != self.weight_transfer.version:
            raise HarnessRolloutError(
                f"TRL announced policy version {model_version}, the servers hold version "
                f"{self.weight_transfer.version}: pass weight_transfer=worker.weight_transfer to the trainer"
            )
        self._version = model_version

    def check_health(self, stale_after_s: float) -> None:
        if self._failure is not None:
            raise RuntimeError(
                f"the harnessrl rollout worker failed: {self._failure}\n{self._failure_trace}"
            ) from self._failure
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the harnessrl rollout worker is not running (start() was not called, or it ended)")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RuntimeError(
                f"the harnessrl rollout worker got no model call back for {age:.0f} s (> {stale_after_s} s, TRL's "
                "heartbeat_stale_after_s): the server is not answering, or one call takes longer than that"
            )

    # ------------------------------------------------------------------------------- the loop
    def _run(self) -> None:
        from harnessrl.store import RunStore

        store = RunStore(self.output_dir / RECORD_FOLDER / "rollouts")
        try:
            batch = self._batch_base
            while not self._stop.is_set():
                if not self._wait_for_room():
                    return
                self._play(batch, store)
                batch += 1
        except BaseException as e:  # reported by check_health, on the trainer's thread
            self._failure_trace = traceback.format_exc()
            self._failure = e
        finally:
            store.close()

    def _wait_for_room(self) -> bool:
        """Until the queue holds less than max_queued samples and at most scheduler_lag batches
        are not wholly handed out; False when stopped meanwhile."""
        while not self._stop.is_set():
            self._heartbeat = time.time()
            with self._lock:
                waiting = sum(1 for b in self.batches if self._not_handed_out(b))
            if self.rollout_buffer.qsize() < self.max_queued and waiting <= self.scheduler_lag:
                return True
            time.sleep(POLL_S)
        return False

    @staticmethod
    def _not_handed_out(record: BatchRecord) -> bool:
        """Whether some sample pushed of `record` is still in the queue."""
        return record.handed + record.dropped_stale < record.pushed

    def _play(self, batch: int, store) -> None:
        from harnessrl.executors import LocalExecutor
        from harnessrl.rollout import Runner

        started = time.perf_counter()
        G, N = self.groups_per_batch, self.num_generations
        assert G is not None
        version = self._version
        self.servers.pin(version)
        try:
            with self._lock:
                probabilities = self.scheduler.probabilities()
                selection = self.scheduler.select(batch)
                unobserved = sum(1 for b in self.batches if not b.observed)
                counts = allocate_tasks(selection.shares, G, batch)
                record = BatchRecord(
                    batch=batch,
                    version=version,
                    harness=selection.harness or "mixed",
                    shares=dict(selection.shares),
                    probabilities=probabilities,
                    group_harness=[h for h, c in counts.items() for _ in range(c)],
                    unobserved_before=unobserved,
                )
                self.batches.append(record)
            specs = {s.name: s for s in self.specs}
            jobs = [
                Job(self.tasks[(batch * G + g) % len(self.tasks)], specs[h], (batch * G + g) * N + i)
                for g, h in enumerate(record.group_harness)
                for i in range(N)
            ]
            sampling = SamplingParams(
                temperature=self.temperature,
                top_p=self.top_p,
                seed=sampling_seed(self.seed, batch, "train"),
                **self.shaping,
            )
            runner = Runner(
                _Beating(self.servers.at_version(version), self._beat),
                sampling,
                max_in_flight=self.max_in_flight,
                max_retries=self.retries,
                on_episode=self._beat,
                progress=False,
                executor=self.executor if self.executor is not None else LocalExecutor(),
            )
            trajectories = runner.run(jobs)
        finally:
            self.servers.unpin(version)
        for traj in trajectories:
            store.add(traj)
        record.rollout_s = time.perf_counter() - started
        self._push(record, trajectories)

    def _beat(self, _: Trajectory | None = None) -> None:
        self._heartbeat = time.time()

    def _push(self, record: BatchRecord, trajectories: list[Trajectory]) -> None:
        """Score the batch, push its samples (or drop them all when already too stale)."""
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

        N = self.num_generations
        scores = [None if t.is_infra_error or t.grade is None else float(t.grade.score) for t in trajectories]
        record.scores = scores
        record.infra_errors = sum(s is None for s in scores)
        for g, advantages in enumerate(batch_advantages(scores, N, "group")):
            h = record.group_harness[g]
            record.rewards.setdefault(h, []).extend(s for s in scores[g * N : (g + 1) * N] if s is not None)
            if advantages is not None:
                record.advantages.setdefault(h, []).extend(advantages)
        samples = []
        for g, h in enumerate(record.group_harness):
            group = trajectories[g * N : (g + 1) * N]
            for traj, advantage in zip(group, trl_advantages(scores[g * N : (g + 1) * N])):
                seq = None if traj.is_infra_error else episode_sequence(traj, self.on_prefix_break)
                if seq is None or not any(seq.env_mask):
                    continue
                record.prefix_breaks += seq.broken
                samples.append(self._sample(RolloutSample, record, g, traj, seq, advantage))
        if self.align_steps:
            keep = steps_aligned([s.advantage for s in samples], self.samples_per_step)
            record.left_out = len(samples) - len(keep)
            samples = [samples[i] for i in keep]
        stale = self._version - record.version > self.max_staleness
        with self._lock:
            if stale:
                record.dropped_stale = len(samples)
            else:
                record.pushed = record.left = len(samples)
        self._metrics(record)
        if stale or not samples:
            self._observe(record)
            return
        for sample in samples:
            sample.enqueued_at = time.time()
            self.rollout_buffer.put(sample)

    def _sample(self, cls, record: BatchRecord, g: int, traj: Trajectory, seq: EpisodeSequence, advantage: float):
        prompt_len = len(seq.prompt_ids)
        score = None if traj.grade is None else float(traj.grade.score)
        return cls(
            prompt=[{"role": "user", "content": traj.instruction}],
            completion=[{"role": "assistant", "content": traj.answer or ""}],
            input_ids=np.asarray(seq.prompt_ids + seq.completion_ids, dtype=np.int64),
            completion_mask=np.asarray([0] * prompt_len + seq.env_mask, dtype=np.int64),
            old_log_probs=np.asarray([0.0] * prompt_len + seq.logprobs, dtype=np.float32),
            advantage=float(advantage),
            model_version=record.version,
            group_id=record.batch * (self.groups_per_batch or 1) + g,
            metrics={"reward": math.nan if score is None else score},
        )

    # ------------------------------------------------------- the trainer's side (its thread)
    def _hand_out(self, sample) -> bool:
        """The queue's `get`: False (dropped) when TRL would drop the sample as stale."""
        batch = sample.group_id // (self.groups_per_batch or 1)
        with self._lock:
            record = self.batches[batch - self._batch_base]
            if self._version - sample.model_version > self.max_staleness:
                record.dropped_stale += 1
                record.left -= 1
                done = record.left == 0
            else:
                record.handed += 1
                self._handed.append(batch)
                return True
        self.metrics_queue.put({"harnessrl/dropped_stale_total": 1.0})
        if done:
            self._observe(record)
        return False

    def _step_trained(self, step: int, model) -> None:
        """At optimizer step `step` (0: this train()'s first): the batches its samples came from;
        the sketch goes to the batch when it is the only one; batches wholly trained are observed."""
        n = self.samples_per_step
        with self._lock:
            handed = self._handed[step * n : (step + 1) * n]
        if len(handed) != n:
            raise HarnessRolloutError(
                f"optimizer step {step} should train samples {step * n}-{(step + 1) * n - 1} handed out, only "
                f"{len(self._handed)} were: the trainer does not batch as FixedCountBatcher (token_budget=0) does"
            )
        counts = Counter(handed)
        sketch = self.sketcher.sketch_model(model).float().cpu() if len(counts) == 1 else None
        finished = []
        with self._lock:
            for batch, k in counts.items():
                record = self.batches[batch - self._batch_base]
                record.trained += k
                record.left -= k
                if sketch is not None:
                    record.sketch = sketch if record.sketch is None else record.sketch + sketch
                    record.pure_steps += 1
                else:
                    record.mixed_steps += 1
                if record.left == 0:
                    finished.append(record)
        for record in finished:
            self._observe(record)

    def _observe(self, record: BatchRecord) -> None:
        """The scheduler learns from `record`: advantages, scores, the sketch of its pure steps."""
        with self._lock:
            if record.observed:
                return
            sketch = (
                record.sketch if record.signal and record.sketch is not None and bool(record.sketch.any()) else None
            )
            harnesses = list(dict.fromkeys(record.group_harness))
            observe_harnesses(self.scheduler, harnesses, record.advantages, record.rewards, sketch)
            record.observed = True
            record.probabilities_after = self.scheduler.probabilities()
        line = {
            "batch": record.batch,
            "version": record.version,
            "harness": record.harness,
            "shares": record.shares,
            "probabilities": record.probabilities,
            "probabilities_after": record.probabilities_after,
            "unobserved_before": record.unobserved_before,
            "sampling_seed": sampling_seed(self.seed, record.batch, "train"),
            "episodes": len(record.scores),
            "infra_errors": record.infra_errors,
            "reward_by_harness": {h: (sum(v) / len(v) if v else None) for h, v in record.rewards.items()},
            "pushed": record.pushed,
            "trained": record.trained,
            "dropped_stale": record.dropped_stale,
            "left_out": record.left_out,
            "pure_steps": record.pure_steps,
            "mixed_steps": record.mixed_steps,
            "sketch_norm": None if sketch is None else float(sketch.norm()),
            "prefix_breaks": record.prefix_breaks,
            "rollout_s": round(record.rollout_s, 3),
        }
        folder = self.output_dir / RECORD_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock, open(folder / "batches.jsonl", "a", encoding="utf-8") as f:  # two threads observe
            f.write(json.dumps(line) + "\n")

    def _metrics(self, record: BatchRecord) -> None:
        """The batch's numbers for TRL's log (drained by the trainer in `log()`)."""
        out: dict[str, float] = {}
        for h in self.scheduler.harnesses:
            out[f"harnessrl/selected/{h}"] = float(record.shares.get(h, 0.0))
            out[f"harnessrl/probability/{h}"] = float(record.probabilities.get(h, 0.0))
        for h, values in record.rewards.items():
            if values:
                out[f"harnessrl/reward/{h}"] = sum(values) / len(values)
        values = [abs(a) for v in record.advantages.values() for a in v]
        if values:
            out["harnessrl/learnability"] = sum(values) / len(values)
        out["harnessrl/infra_errors"] = float(record.infra_errors)
        out["harnessrl/prefix_breaks"] = float(record.prefix_breaks)
        out["harnessrl/rollout_s"] = record.rollout_s
        out["harnessrl/unobserved_before"] = float(record.unobserved_before)
        if record.dropped_stale:
            out["harnessrl/dropped_stale_total"] = float(record.dropped_stale)
        if record.left_out:
            out["harnessrl/left_out_total"] = float(record.left_out)
        self.metrics_queue.put(out)

    # ---------------------------------------------------------------------------- checkpoints
    def save_state(self, checkpoint: Path) -> None:
        """The scheduler's state (what it observed so far) and the next batch's number, into a TRL
        checkpoint folder (done by the callback at every save)."""
        with self._lock:
            state = {
                "scheduler": self.scheduler.state_dict(),
                "next_batch": self._batch_base + len(self.batches),
                "observed": [r.batch for r in self.batches if r.observed],
            }
        checkpoint.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(checkpoint / STATE_FILE)

    def _resume(self, step: int) -> None:
        """A run resumed from checkpoint-STEP: the scheduler as it was saved, batch numbers (and
        so attempts and seeds) going on from the checkpoint's next, and the records of batches a
        crashed run numbered from there removed."""
        path = self.output_dir / f"checkpoint-{step}" / STATE_FILE
        if not path.is_file():
            raise HarnessRolloutError(
                f"{path} does not exist: the checkpoint was not written with HarnessRolloutWorker attached, so the "
                "scheduler's state cannot be restored"
            )
        try:
            state = json.loads(path.read_text())
            self.scheduler.load_state_dict(state["scheduler"])
            self._batch_base = int(state["next_batch"])
        except (ValueError, KeyError) as e:
            raise HarnessRolloutError(f"{path}: {e}") from None
        folder = self.output_dir / RECORD_FOLDER
        lines = folder / "batches.jsonl"
        if lines.is_file():
            kept = [x for x in lines.read_text().splitlines() if json.loads(x)["batch"] < self._batch_base]
            lines.write_text("".join(x + "\n" for x in kept))
        from harnessrl.store import RunStore

        with RunStore(folder / "rollouts") as store:
            store.delete_attempts_from(self._batch_base * (self.groups_per_batch or 1) * self.num_generations)

    def _preflight(self) -> None:
        """Every harness's first request of the first task, measured against the trainer's
        tokenizer and context (harnessrl.preflight.check_before_run), before any episode."""
        import sys

        from harnessrl.integrations.trl.setup import text_tokenizer
        from harnessrl.models.prompt_model import PromptModel
        from harnessrl.preflight import PreflightRefused, check_before_run

        config = getattr(self._trainer.model, "config", None)
        context = getattr(config, "max_position_embeddings", None)
        model = PromptModel("trl-model", text_tokenizer(self.tokenizer), int(context) if context else None)
        try:
            check_before_run(
                model,
                self.specs,
                self.tasks[0],
                lambda line: print(f"[harnessrl] {line}", file=sys.stderr, flush=True),
                skip="HarnessRolloutWorker(preflight=False)",
            )
        except PreflightRefused as e:
            raise HarnessRolloutError(str(e)) from None
        except RolloutServerError as e:
            raise HarnessRolloutError(str(e)) from None
        self.preflight = False


def trl_shaping(args) -> dict[str, Any]:
    """AsyncGRPOConfig's top_k, min_p and repetition_penalty as SamplingParams fields (None and
    top_k -1, TRL's "unset", are the neutral values), sent to the server as vLLM's fields."""
    return {
        "top_k": int(args.top_k) if args.top_k not in (None, -1) else 0,
        "min_p": float(args.min_p) if args.min_p is not None else 0.0,
        "repetition_penalty": float(args.repetition_penalty) if args.repetition_penalty is not None else 1.0,
    }


def steps_aligned(advantages: list[float], per_step: int) -> list[int]:
    """Which of a batch's samples (their advantages, in push order) to push so that it fills whole
    optimizer steps of `per_step` samples: all of them when it does; else the remainder is left
    out, samples of advantage 0 (no gradient) first, then the last ones. Indices in order."""
    extra = len(advantages) % per_step
    if not extra:
        return list(range(len(advantages)))
    flat = [i for i in reversed(range(len(advantages))) if advantages[i] == 0]
    rest = [i for i in reversed(range(len(advantages))) if advantages[i] != 0]
    out = set((flat + rest)[:extra])
    return [i for i in range(len(advantages)) if i not in out]


def trl_advantages(scores: list[float | None]) -> list[float]:
    """TRL's advantages of one group (its AsyncRolloutWorker's `_score_group`): (r - mean) /
    (std + 1e-8) over the graded episodes (population std), 0 for an episode without a grade."""
    graded = np.array([s for s in scores if s is not None], dtype=float)
    if graded.size == 0:
        return [0.0] * len(scores)
    mean, std = float(graded.mean()), float(graded.std())
    return [0.0 if s is None else (s - mean) / (std + 1e-8) for s in scores]
