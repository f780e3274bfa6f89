"""The GRPO trainer: one LoRA-adapted model, several harnesses, a scheduler choosing who collects each batch.

One training step, read top to bottom in `Trainer.train_step`:

    scheduler.select(step)                 one harness (HarnessBandit, ...) or a mixture with shares
    sample tasks from the train split      tasks_per_step tasks (seeded); each goes to one harness
    runner.run(jobs)                       group_size episodes per task, generated with the CURRENT
                                           adapter (the policy wraps the very model being trained),
                                           sampled with this step's own seed (run seed, step)
    group advantages from grade.score      per (task, harness) group; infrastructure errors left out;
                                           a group with < 2 valid episodes gives no units
    (--dynamic-sampling) refill rounds     more groups, same selection, fresh tasks, until
                                           tasks_per_step groups have signal or the rounds run out
    units_from_trajectories                one training unit per model call
    old log-probs recomputed               no-grad teacher-forced pass on the current weights
                                           (with ppo_epochs or mini_batches > 1; else the loss's own)
    ppo_epochs passes over the units, each split into mini_batches; per mini-batch:
        micro-batches -> token_logprobs -> grpo_loss -> backward     (gradient accumulation)
        GradientSketch of the LoRA gradient (first pass only), BEFORE the optimizer step
        clip, AdamW step
    scheduler.observe(harness, advantages, sketch, rewards=scores)

Where each piece lives: the plan, the groups' advantages, the step's statistics and the
scheduler's observation in `harnessrl.train.step` (typed: StepPlan, GroupOutcome, BatchStats);
the plans made ahead, their collection, the rounds of a step and the policy versions on the
rollout servers in `harnessrl.train.pipeline` (`RolloutPipeline`, given the scheduler, the task
RNG, the servers, the runner and a callable that publishes weights; `StepRollouts` out); the
optimizer steps in `harnessrl.train.update` (UpdateContext in, UpdateResult out, gradient
accumulation described there); the checkpoint in `harnessrl.train.checkpoint`; the progress bar in
`harnessrl.train.progress`. This module holds the run: options, set-up, the loop, evaluation and
the step's record.

The old log-probs of the ratio are recomputed by the trainer before the batch's first update: a
no-grad teacher-forced pass over the units with the weights that sampled them (verl computes
old_log_prob with the actor the same way). The log-probs the engine recorded while sampling are
the same numbers up to float rounding (~1e-7), but that rounding depends on what else was in the
engine's batch and on prefix-cache hits, so they are not bit-for-bit reproducible; the recomputed
ones are a function of the weights and the units alone, which keeps a resumed run exactly equal
to an uninterrupted one. How far the recorded values are from the recomputed ones is logged
(rollout_logprob_diff_max / _mean: a health check of the generation engine). So the first
mini-step has ratio 1 and the clip is inert there; from the second mini-step on
(ppo_epochs > 1 or mini_batches > 1) the weights have moved and the clip acts. With one pass and
one mini-batch the step is a single on-policy update, and the no-grad pass is not run: the loss's
own forward is on the same weights and units, so its log-probs, detached, are the old ones (the
same function of the weights and the units; the ratio is exactly 1), which saves a forward over
the batch.

Rollouts and updates share one model (in process): the runner returns only when every episode has
ended, and the update runs inside `policy.paused()`, so no generation step can overlap a training
forward or backward. The update first drops the engine's prefix cache (stale after the optimizer step,
and its memory is better spent on the backward pass); the engine would also notice the changed
weights by itself.

The loss is computed with the model in eval mode (autograd does not need train mode): dropout,
of the base model or of LoRA, would make the training log-probs differ from the rollout's and
from one computation to the next.

A step whose advantages are all 0 (every group flat) has no signal: no backward and no optimizer
step, but the scheduler still observes the zero advantages (with no sketch), which is exactly
what tells HarnessBandit that this harness is not learnable right now.

A mixed step (scheduler "mixed") has one batch and one sketch: it is observed once per harness
present, each with that harness's own advantages.

Asynchronous collection (--max-off-policy-steps N > 0, only with --rollout-server: the plan of
step k + N is made at step k and collected while step k trains) and dynamic sampling
(--dynamic-sampling: refill rounds until the batch has enough groups with signal) are described
in `harnessrl.train.pipeline` and docs/training.md.

Several processes (torchrun / accelerate launch; `harnessrl.train.distributed`, docs/training.md
"Several processes"): every process selects the same harness and tasks from the same seeded
state, runs a contiguous share of the step's whole (task, harness) groups with its own copy of
the model and computes their advantages; the gradient is summed over the processes with the
loss normalised by the whole batch's tokens, so the sketch and the optimizer step are the ones
one process would have computed, on every process. Rank 0 alone writes the run folder: it gets
the other processes' episodes for the store, and every process gets every group's statistics
for the metrics and the scheduler. One process (no launcher) runs exactly as described above.

Files in the run folder OUT:
    config.json        every option (a resume with different options is refused, except
                       --steps and --checkpoint-every)
    metrics.jsonl      one line per step (`harnessrl.train.step.StepRecord`)
    eval.jsonl         periodic evaluation on dev tasks, one line per evaluation
    checkpoint/        adapter/, optimizer.pt, rng.pt, state.json (step, scheduler, RNG states);
                       written into a temporary folder and renamed into place
    adapter/           the final peft adapter (+ harnessrl.json naming the base model), loadable
                       with `--model hf:OUT/adapter`
    rollouts/run.db    every training episode (a RunStore: triage and reports work on it); a resumed
                       run first deletes the episodes of the steps after its checkpoint, so every
                       stored step holds exactly the episodes its update was computed from (episodes
                       collected ahead are stored when their step takes them)
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harnessrl.errors import JobError
from harnessrl.results import TrainEval, TrainResult
from harnessrl.rundir import RunFolder, RunFolderError, append_jsonl, truncate_jsonl
from harnessrl.train import checkpoint, lora
from harnessrl.train.config import TrainConfig
from harnessrl.train.distributed import Distributed, DistributedError
from harnessrl.train.grpo import TrainingUnit
from harnessrl.train.held_out import (
    check_held_out,
    evaluation_jobs,
    evaluation_seed,
    first_evaluation,
    summarize_evaluation,
)
from harnessrl.train.pipeline import RolloutPipeline, StepRollouts, Weights
from harnessrl.train.progress import GRPO_VIEW, StepProgress, mean
from harnessrl.train.schedulers import make_scheduler, random_state_json, set_random_state_json
from harnessrl.train.sketch import GradientSketch
from harnessrl.train.step import (
    FLAT,
    DynamicSamplingRecord,
    FlatSteps,
    RolloutServerRecord,
    StepRecord,
    StepTimes,
    allocate_tasks,
    attempt_base,
    observe,
    sampling_seed,
)
from harnessrl.train.update import (
    TrainingDiverged,
    UpdateContext,
    UpdateResult,
    cores_for_update,
    micro_batches,
    update_policy,
    update_threads,
)

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext
    from harnessrl.tasks.base import Task


class TrainSuite(Protocol):
    """What the trainer reads of a suite: a Suite, or a stand-in such as a suite restricted to some
    of its train tasks."""

    name: str
    split_sizes: dict[str, int]
    offers_shell: bool

    def tasks(self, split: str, n: int | None = None) -> list[Task]: ...


__all__ = [
    "RESUMABLE_CHANGES",
    "TrainConfig",
    "TrainError",
    "Trainer",
    "TrainingDiverged",
    "allocate_tasks",
    "micro_batches",
    "sampling_seed",
]

# Options that may change when a run is resumed: none changes what the next steps compute
# (`processes`, the number of training processes, changes only float rounding; which servers
# sample the rollouts changes nothing either: per-request seeds, same weights; `device` changes
# float rounding only, and gradient checkpointing recomputes the same activations; a different
# dtype is refused: it changes what every step computes).
RESUMABLE_CHANGES = ("steps", "checkpoint_every", "processes", "rollout_servers", "device", "gradient_checkpointing")


class TrainError(JobError):
    """Bad options or a refused run folder: reported before any training (the CLI exits 2)."""


# ------------------------------------------------------------------------------------- the trainer


class Trainer(lora.WritesAdapter):
    """`Trainer(ctx)` (its context from the job kernel, which read the suite, the harnesses and the
    task counts its options name) checks what is left (the held-out harnesses, the scheduler, the
    model, the processes, the run folder) and raises TrainError; `run()` loads the model and
    trains. Objects given to the kernel in place of names (tests shrink harness rules this way)
    are recorded by name, and every spec's full content beside it.
    """

    trained_by = "harnessrl train grpo"

    def __init__(self, ctx: JobContext):
        from rich.console import Console

        self.suite = ctx.inputs.suite
        self.specs, self.eval_specs = ctx.inputs.harnesses["harnesses"], ctx.inputs.harnesses.get("eval_harnesses", [])
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise TrainError(f"harness names must be unique, got {names}")
        try:  # the held-out harnesses: evaluated, never trained on (harnessrl.train.held_out)
            check_held_out(names, [s.name for s in self.eval_specs])
        except ValueError as e:
            raise TrainError(f"--eval-harnesses: {e}") from None
        self.config = config = ctx.config.replace(harnesses=names, eval_harnesses=[s.name for s in self.eval_specs])
        try:
            self.scheduler = make_scheduler(config.scheduler, names, seed=config.seed, **config.scheduler_options)
        except (ValueError, TypeError) as e:
            raise TrainError(str(e)) from None
        lora.check_trainable(config, TrainError)  # before the processes meet: a model that cannot be trained
        try:
            self.dist = Distributed.from_env()  # one process, or one of several (docs: "Several processes")
        except DistributedError as e:
            raise TrainError(str(e)) from None
        # The model chosen once, after the processes are set up: under torchrun "auto" is this
        # process's own GPU, which torch names only once Distributed.from_env has set it. The job
        # kernel's choice is taken as it is by a single process only.
        self.model_choice = lora.trained_model(config, TrainError, ctx.model() if self.dist.world_size == 1 else None)
        self.out, self.resume, self.progress, self.executor = ctx.out, ctx.resume, ctx.progress, ctx.executor
        self.folder: RunFolder | None = None  # rank 0's alone
        error = None
        if self.dist.is_main:
            try:
                self.folder = lora.open_run_folder(
                    self.out, "training", config, self.model_choice, resume=self.resume,
                    may_differ=RESUMABLE_CHANGES, recorded_when_on={"advantage_control": "none"},
                    harness_specs={s.name: s.to_dict() for s in [*self.specs, *self.eval_specs]},
                    processes=self.dist.world_size,
                )  # fmt: skip
            except RunFolderError as e:
                error = str(e)
            else:
                lora.record_start(self.folder, self.specs, self.suite.offers_shell, self.executor)
        error = self.dist.agree(error)  # a refused folder stops every process
        if error is not None:
            self.dist.close()
            raise TrainError(error)
        self.console = ctx.console if ctx.console is not None else Console(stderr=True)
        self.step = 0  # training steps completed
        self.task_rng = random.Random(f"harnessrl-train-tasks:{config.seed}")
        self.spec_by_name = {s.name: s for s in self.specs}
        self._last_update: tuple[float, float] | None = None  # the previous step's update (start, end)
        self._base_eval: TrainEval | None = None  # the evaluation at step 0 (the base weights): later ones pair with it
        self._idle_mark: list[float] = []

    @property
    def record(self) -> dict[str, Any]:
        """What OUT/config.json records: every option, the harness specs, machine facts (rank 0)."""
        if self.folder is None:
            raise RuntimeError("only rank 0 holds the run folder's record")
        return self.folder.config

    # -- setup (slow: the model) ----------------------------------------------------------------------
    def _setup(self) -> None:
        from harnessrl.models.base import SamplingParams
        from harnessrl.models.engine import usable_cpus
        from harnessrl.models.engine_config import EngineConfig
        from harnessrl.rollout import Runner

        cfg = self.config
        # several processes on one machine share its CPUs: each engine gets its share
        engine = self.dist.engine_config(EngineConfig.from_env())
        # on --device in --dtype; a device this machine lacks, or a model that will not fit, is one line
        policy = lora.load_local_policy(self.model_choice, TrainError, training=cfg, engine=engine)
        # LoRA in policy.model itself: generation uses the adapter; eval mode throughout (no dropout,
        # see the module docstring)
        self.peft_model, self.trainable, self.optimizer = lora.attach(policy, cfg, TrainError)
        self.policy = policy
        # the update takes the core the engine leaves to the episodes (none run during it)
        try:
            self.update_threads = update_threads(
                cfg,
                EngineConfig.from_env().threads,
                self.dist.cpus_per_process,
                usable_cpus(),
                self.trainable[0].device.type if self.trainable else "cpu",
            )
        except ValueError as e:
            raise TrainError(str(e)) from None
        self.tokenizer = policy.tokenizer
        self.sketcher = GradientSketch(dim=cfg.sketch_dim, seed=cfg.seed, kind=cfg.sketch_kind)
        # The runner's sampling seed is replaced at every step (`sampling_seed`).
        sampling = SamplingParams(temperature=cfg.temperature, top_p=1.0, seed=sampling_seed(cfg.seed, 0, "train"))
        self.servers = None
        if cfg.rollout_servers:
            from harnessrl.train.rollout_server import RolloutServerError, RolloutServers, new_run_id
            from harnessrl.wire.auth import env_admin_key

            # the adapters' names and folders are those of this launch, the same in every process
            run_id = self.dist.broadcast_object(new_run_id() if self.dist.is_main else None)
            try:
                self.servers = RolloutServers(
                    cfg.rollout_servers, run_id=run_id, max_concurrency=cfg.max_in_flight, admin_key=env_admin_key()
                )
                self.servers.check()
            except (ValueError, RolloutServerError) as e:
                raise TrainError(str(e)) from None
            self._idle_mark = self.servers.idle_seconds()
        self.runner = Runner(
            self.servers if self.servers is not None else policy,
            sampling,
            max_in_flight=cfg.max_in_flight,
            max_retries=cfg.retries,
            progress=False,
            executor=self.executor,
        )
        # Evaluation has its own policy object (same model) and so its own sampling-call counter,
        # reset before every evaluation: evaluations never perturb the training rollouts' noise,
        # and an evaluation's noise depends only on the run seed and the step it follows.
        self.eval_sampling = SamplingParams(
            temperature=cfg.eval_temperature, top_p=1.0, seed=sampling_seed(cfg.seed, 0, "eval")
        )
        # the same engine (one batch, one prefix cache, one thread) with its own counter
        self.eval_policy = policy.with_sampling(self.eval_sampling, name=f"{cfg.model}+lora")
        self.train_tasks = self.suite.tasks("train")
        # the plans, their collection (ahead, with --max-off-policy-steps) and the policy versions
        self.pipeline = RolloutPipeline(
            cfg,
            scheduler=self.scheduler,
            task_rng=self.task_rng,
            train_tasks=self.train_tasks,
            spec_by_name=self.spec_by_name,
            servers=self.servers,
            runner=self.runner,
            dist=self.dist,
            executor=self.executor,
            publish=self._publish,
            weights=lambda: lora.adapter_state(self.peft_model),
            error=TrainError,
        )

    def _open_logs(self) -> None:
        """The rollout store and TensorBoard (only when the tensorboard package is installed)."""
        import importlib.util

        cfg = self.config
        self.store = None
        self.tb = None
        if not self.dist.is_main:  # rank 0 stores every process's episodes and writes the logs
            return
        if cfg.save_rollouts:
            from harnessrl.store import RunStore

            self.store = RunStore(self.out / "rollouts")
            self.store.set_meta(
                "config",
                {
                    "kind": "train-rollouts",
                    "suite": cfg.suite,
                    "split": "train",
                    "model": cfg.model,
                    "seed": cfg.seed,
                    "attempts": cfg.group_size,
                },
            )
            # Episodes of steps after the checkpoint are from a killed attempt: they are re-run.
            self.store.delete_attempts_from(attempt_base(self.step, 0, cfg.group_size, self.pipeline.rounds))
            self.pipeline.save_into(self.store)
        if importlib.util.find_spec("tensorboard") is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.out / "tensorboard"))
            except Exception:  # noqa: BLE001 - logging extras must never stop training
                self.tb = None

    # -- checkpoints (harnessrl.train.checkpoint) ---------------------------------------------------
    def save_checkpoint(self) -> Path:
        """OUT/checkpoint, written in a temporary folder then renamed into place (state.json last)."""
        state = {
            "step": self.step,
            "policy_version": self.pipeline.version,
            "scheduler": self.scheduler.state_dict(),
            "task_rng": random_state_json(self.task_rng),
            "generate_calls": self.policy.generate_calls,
        }
        plans, pinned = self.pipeline.checkpoint()  # with --max-off-policy-steps: the plans made ahead
        state |= plans
        return checkpoint.save(self.out, self.peft_model, self.optimizer, state, pinned=pinned)

    def load_checkpoint(self) -> bool:
        """Restore adapter, optimizer, scheduler, RNGs and step; False when there is none yet.

        With several processes rank 0 reads the checkpoint and every process restores rank 0's
        copy: it holds nothing per process, so the number of processes may change on resume."""
        saved = self.dist.broadcast_object(checkpoint.read(self.out) if self.dist.is_main else None)
        if saved is None:
            return False
        state = checkpoint.restore(saved, self.peft_model, self.optimizer, TrainError)
        self.scheduler.load_state_dict(state["scheduler"])
        set_random_state_json(self.task_rng, state["task_rng"])
        self.policy.generate_calls = int(state["generate_calls"])
        self.step = int(state["step"])
        self.pipeline.version = int(state.get("policy_version", self.step))
        self.pipeline.restore(state, saved.pinned, self.step)
        return True

    def adapter_facts(self) -> dict[str, Any]:
        """harnessrl.json of OUT/adapter also names the suite, harnesses and scheduler."""
        cfg = self.config
        return {"suite": cfg.suite, "harnesses": cfg.harnesses, "scheduler": cfg.scheduler}

    # -- one step: plan -> collect -> advantages -> update -> observe ---------------------------------
    def update_context(self) -> UpdateContext:
        """What the optimizer steps read and change (`harnessrl.train.update`)."""
        return UpdateContext(
            self.config, self.peft_model, self.trainable, self.optimizer, self.sketcher, self.dist, self.policy.pad_id
        )

    def _update(self, units: list[TrainingUnit], step: int) -> UpdateResult:
        with cores_for_update(self.update_threads):
            return update_policy(self.update_context(), units, step)

    def train_step(self) -> dict[str, Any]:
        """One training step: a rollout batch and its optimizer steps (or a logged skip).
        Returns the step's line of metrics.jsonl (`StepRecord.as_dict()`, made by `_record`)."""
        step = self.step
        t_start = time.perf_counter()

        # 1. the current weights on the rollout servers; then the plans: this step's (synchronous),
        # or, with --max-off-policy-steps N, the one of step + N, whose collection starts now
        t_sync = self.pipeline.sync()
        t0 = time.perf_counter()
        pending = self.pipeline.plan(step)
        t_sched = time.perf_counter() - t0

        # 2. the rollouts: round 0 (collected ahead, or now), then dynamic sampling's refills,
        # always now, under the current weights (their decision needs every process's groups)
        batch = self.pipeline.collect(pending)

        # 3. the optimizer steps: ppo_epochs passes of mini_batches mini-steps each, with no
        # generation step of the in-process engine in between (paused() makes sure)
        update = UpdateResult()  # none taken
        version = self.pipeline.version  # the weights the batch is trained from
        previous_update, self._last_update = self._last_update, None
        if batch.stats.signal:
            t0 = time.perf_counter()
            with self.policy.paused():
                self.policy.clear_cache()
                update = self._update(batch.units, step)
            self._last_update = (t0, time.perf_counter())
            self.pipeline.version += 1  # one new policy version per step that updates

        # 4. the scheduler learns from this update: every group of every round, flat ones included
        t0 = time.perf_counter()
        transfer = observe(self.scheduler, batch.merged, batch.stats, update.sketch)
        t_sched += time.perf_counter() - t0

        self.step += 1
        return self._record(
            batch,
            update,
            transfer,
            version=version,
            previous=previous_update,
            t_sync=t_sync,
            t_sched=t_sched,
            t_start=t_start,
        ).as_dict()

    def _record(
        self,
        batch: StepRollouts,
        update: UpdateResult,
        transfer: dict[str, float],
        *,
        version: int,
        previous: tuple[float, float] | None,
        t_sync: float,
        t_sched: float,
        t_start: float,
    ) -> StepRecord:
        """The record of the step just taken (`StepRecord`: one line of metrics.jsonl). `version`:
        the policy version the batch was trained from; `previous`: when the previous step's update
        ran (start, end), if it took one; the seconds of the adapter sync and of the scheduler;
        when the step started."""
        cfg, plan, stats, rounds, lags = self.config, batch.pending.plan, batch.stats, batch.rounds, batch.lags
        dynamic = servers = None
        overlap = wait = None
        if cfg.dynamic_sampling:
            dynamic = DynamicSamplingRecord(
                sampling_rounds=len(rounds),
                groups_sampled=len(batch.merged.assignment),
                groups_dropped_flat=stats.flat_groups,
                groups_trained=stats.signal_groups,
                sampling_budget_exhausted=stats.signal_groups < cfg.tasks_per_step,
            )
        if self.servers is not None:
            first = rounds[0]
            overlap = 0.0
            if previous is not None:
                overlap = max(0.0, min(first.ended, previous[1]) - max(first.started, previous[0]))
            wait = sum(r.waited for r in rounds)
            n_calls = sum(lags.values())
            idle = self.servers.idle_seconds()
            servers = RolloutServerRecord(
                policy_lag_max=max(lags, default=0),
                policy_lag_mean=sum(k * n for k, n in lags.items()) / n_calls if n_calls else None,
                policy_lag_hist={str(k): lags[k] for k in sorted(lags)},
                policy_version=version,
                sampling_version=batch.pending.version,
                rollouts_overlapped=overlap > 0,
                servers_idle=[b - a for a, b in zip(self._idle_mark, idle)],
                rollout_requests=list(self.servers.sent),
                time_adapter_sync=t_sync,
            )
            self._idle_mark = idle
        tasks = None
        if dynamic is not None or servers is not None:
            tasks = [[task.id, spec.name] for task, spec in batch.merged.assignment]
        return StepRecord(
            step=self.step,
            harness=plan.selection.harness or "mixed",
            shares={h: c / cfg.tasks_per_step for h, c in plan.counts.items() if c},
            sampling_seed=batch.seed,
            episodes=stats.episodes,
            infra_errors=stats.infra_errors,
            reward_mean=mean(stats.rewards),
            reward_by_harness={h: mean(v) for h, v in stats.rewards_by_harness.items()},
            adv_abs_mean=mean([abs(a) for a in stats.advantages]),
            groups=stats.groups,
            groups_too_small=stats.groups_too_small,
            zero_std_frac=stats.flat_groups / stats.groups if stats.groups else None,
            probabilities=plan.probabilities,
            transfer=transfer,
            units=stats.units,
            units_trained=update.units_trained,
            completion_tokens=stats.completion_tokens,
            padded_tokens=update.padded_tokens,
            loss=update.loss,
            clip_fraction=update.clip_fraction,
            clip_fraction_by_epoch=update.clip_fraction_by_epoch,
            ratio_mean=update.ratio_mean,
            kl=update.kl,
            grad_norm=update.grad_norm,
            rollout_logprob_diff_max=update.rollout_logprob_diff_max,
            rollout_logprob_diff_mean=update.rollout_logprob_diff_mean,
            rollout_log_ratio_mean=update.rollout_log_ratio_mean,
            rollout_kl_mean=update.rollout_kl_mean,
            rollout_kl_max=update.rollout_kl_max,
            rollout_mismatch_frac=update.rollout_mismatch_frac,
            tis_weight_mean=update.tis_weight_mean,
            tis_capped_frac=update.tis_capped_frac,
            optimizer_step=stats.signal,
            optimizer_steps=update.optimizer_steps,
            skipped=None if stats.signal else (FLAT if stats.units else "no training units"),
            lr=cfg.lr,
            dynamic_sampling=dynamic,
            rollout_servers=servers,
            tasks=tasks,
            time=StepTimes(
                rollout=sum(r.ended - r.started for r in rounds),
                backward=update.time_backward,
                sketch=update.time_sketch,
                optimizer=update.time_optimizer,
                scheduler=t_sched,
                rollout_wait=wait,
                rollout_update_overlap=overlap,
                total=time.perf_counter() - t_start,
            ),
        )

    def _publish(self, version: int, weights: Weights | None) -> None:
        """The pipeline's way to put policy `version` on the rollout servers: the current
        weights, or `weights` (an older version a restored plan is bound to) put into the model
        while it is written. The first publication also probes the servers. One process writes
        and loads (all hold the same weights); a failure anywhere stops every process."""
        from harnessrl.train.rollout_server import RolloutServerError, teacher_forced

        servers, folder = self.servers, self.folder
        assert servers is not None  # the pipeline publishes only to rollout servers
        first = servers.version is None
        error = None
        if folder is not None:  # rank 0
            try:
                with lora.holding_weights(self.peft_model, weights, TrainError):
                    servers.publish(lambda folder: self.peft_model.save_pretrained(str(folder)), self.out, version)
                    if first:
                        # a harness that sends its tools natively needs the server's tool calling
                        native = any(getattr(getattr(s, "protocol", None), "native_tools", False) for s in self.specs)
                        with self.policy.paused():
                            report = servers.probe(
                                teacher_forced(self.peft_model), self.config.temperature, native_tools=native
                            )
                        folder.record(rollout_probe=report.as_dict())
                        self._say(
                            f"rollout servers probed: log-probs within {report.max_abs_diff:.2g} of the trainer's"
                        )
            except RolloutServerError as e:
                error = str(e)
        error = self.dist.agree(error)
        if error is not None:
            raise TrainError(error)

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self) -> TrainEval | None:
        """Every harness, the held-out ones (--eval-harnesses) included, on the first eval_tasks dev
        tasks, eval_attempts attempts each (harnessrl.train.held_out); paired against the run's
        first evaluation (step 0, the base weights).

        Several processes: each runs a contiguous share of the episodes and rank 0 gets them all
        and returns the record; the others return None."""
        from harnessrl.rollout import Runner

        cfg = self.config
        t0 = time.perf_counter()
        tasks = self.suite.tasks("dev", cfg.eval_tasks)
        self.eval_policy.generate_calls = 0
        # every evaluation with the base's seed, so that vs_base pairs the same random numbers
        self.eval_sampling = self.eval_sampling.model_copy(update={"seed": evaluation_seed(cfg.seed)})
        runner = Runner(
            self.eval_policy,
            self.eval_sampling,
            max_in_flight=cfg.max_in_flight,
            max_retries=cfg.retries,
            progress=False,
            executor=self.executor,
        )
        jobs = evaluation_jobs(tasks, [*self.specs, *self.eval_specs], cfg.eval_attempts)
        gathered = self.dist.gather_object(runner.run([jobs[i] for i in self.dist.shard(len(jobs))]))
        if gathered is None:
            return None
        record = summarize_evaluation(
            [t for part in gathered for t in part],
            [s.name for s in self.specs],
            [s.name for s in self.eval_specs],
            step=self.step,
            tasks=len(tasks),
            attempts=cfg.eval_attempts,
            temperature=cfg.eval_temperature,
            sampling_seed=self.eval_sampling.seed,
            base=self._base_eval,
            seconds=time.perf_counter() - t0,
        )
        if self._base_eval is None:
            self._base_eval = record
        return record

    # -- the loop -------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train until config.steps; returns a short summary. Raises TrainingDiverged on NaN."""
        cfg = self.config
        self._setup()
        main = self.dist.is_main  # several processes: rank 0 alone writes OUT
        self.dist.broadcast_tensors_(self.trainable)  # every process starts from rank 0's LoRA weights
        if main:
            self.out.mkdir(parents=True, exist_ok=True)
        metrics_path, eval_path = self.out / "metrics.jsonl", self.out / "eval.jsonl"
        if self.resume and self.load_checkpoint():
            self._say(f"resuming {self.out} from step {self.step}")
        elif self.resume:
            self._say(f"{self.out} has no checkpoint yet: starting from step 0")
        if self.step > cfg.steps:
            raise TrainError(
                f"--steps {cfg.steps} is below the checkpoint's step {self.step}; give --steps {self.step} or more"
            )
        if self.resume and main:
            truncate_jsonl(metrics_path, self.step)
            truncate_jsonl(eval_path, self.step)
            self._base_eval = first_evaluation(eval_path)
        if self.folder is not None:  # rank 0
            self.folder.start()  # config.json (again: --steps / --checkpoint-every may have changed)
        self._open_logs()
        try:
            return self._loop(metrics_path, eval_path)
        finally:
            self.pipeline.close()  # a stopped run: the collection under way ends, no other starts

    def _loop(self, metrics_path: Path, eval_path: Path) -> TrainResult:
        cfg = self.config
        main = self.dist.is_main
        self.pipeline.resume()  # a resumed asynchronous run: its plans' collections start again

        if cfg.eval_every and self.step == 0:
            self._log_eval(eval_path, self.evaluate())
        last: dict[str, Any] = {}
        flat = FlatSteps()
        with StepProgress(GRPO_VIEW, self.console, cfg.steps, self.step, enabled=self.progress and main) as bar:
            while self.step < cfg.steps:
                try:
                    record = self.train_step()
                except TrainingDiverged as e:
                    if not main:  # every process stops at the same step; rank 0 tells why
                        raise
                    at = checkpoint.step_of(self.out)
                    where = (
                        f"the last checkpoint ({self.out / 'checkpoint'}, step {at}) is intact: continue with --resume"
                        if at is not None
                        else "no checkpoint was written yet"
                    )
                    append_jsonl(metrics_path, {"step": self.step + 1, "stopped": str(e)})
                    raise TrainingDiverged(
                        f"{e}: training stopped; {where} (perhaps with a lower --lr in a new run)"
                    ) from None
                if main:
                    append_jsonl(metrics_path, record)
                    warning = flat.see(record, cfg.temperature, cfg.group_size, cfg.dynamic_sampling)
                    if warning is not None:
                        self.console.print(warning, style="yellow", highlight=False, markup=False)
                self._tensorboard(record)
                bar.update(record)
                last = record
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                    self._log_eval(eval_path, self.evaluate())
                if main and (self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps):
                    self.save_checkpoint()
        if main and not (self.out / "checkpoint").exists():
            self.save_checkpoint()
        adapter = self.save_adapter() if main else self.out / "adapter"
        self.pipeline.release()  # plans past --steps unpinned; the old versions off the servers
        self.policy.close()  # the engine thread (a later use of the policy starts a new one)
        if self.tb is not None:
            self.tb.close()
        if self.store is not None:
            self.store.close()
        self.dist.barrier()  # the others finish when rank 0 has written everything
        self.dist.close()
        return TrainResult(steps=self.step, adapter=str(adapter), last=last)

    def _log_eval(self, path: Path, record: TrainEval | None) -> None:
        if record is None:  # another process's share of a shared evaluation
            return
        append_jsonl(path, record.model_dump())
        if self.tb is not None:
            for h, v in record.mean_score.items():
                if v is not None:
                    self.tb.add_scalar(f"eval/{h}", v, record.step)
        scores = "  ".join(f"{h} {v:.3f}" for h, v in record.mean_score.items() if v is not None)
        self._say(f"eval at step {record.step}: {scores}")

    def _tensorboard(self, r: dict[str, Any]) -> None:
        if self.tb is None:
            return
        for key in ("reward_mean", "adv_abs_mean", "zero_std_frac", "loss", "clip_fraction", "kl", "grad_norm"):
            if r.get(key) is not None:
                self.tb.add_scalar(f"train/{key}", r[key], r["step"])
        for h, p in r["probabilities"].items():
            self.tb.add_scalar(f"probability/{h}", p, r["step"])
        for h, c in r["transfer"].items():
            self.tb.add_scalar(f"transfer/{r['harness']}_vs_{h}", c, r["step"])

    def _say(self, text: str) -> None:
        if self.progress and self.dist.is_main:
            self.console.print(text, highlight=False, markup=False)
