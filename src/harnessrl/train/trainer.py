"""The GRPO trainer: one LoRA-adapted model, several harnesses, a scheduler choosing who collects each batch.

One training step, read top to bottom in `Trainer.train_step`:

    scheduler.select(step)                 one harness (HarnessBandit, ...) or a mixture with shares
    sample tasks from the train split      tasks_per_step tasks (seeded); each goes to one harness
    runner.run(jobs)                       group_size episodes per task, generated with the CURRENT
                                           adapter (the policy wraps the very model being trained),
                                           sampled with this step's own seed (run seed, step)
    group advantages from grade.score      per (task, harness) group; infrastructure errors left out;
                                           a group with < 2 valid episodes gives no units
    units_from_trajectories                one training unit per model call
    old log-probs recomputed               no-grad teacher-forced pass on the current weights
    ppo_epochs passes over the units, each split into mini_batches; per mini-batch:
        micro-batches -> token_logprobs -> grpo_loss -> backward     (gradient accumulation)
        GradientSketch of the LoRA gradient (first pass only), BEFORE the optimizer step
        clip, AdamW step
    scheduler.observe(harness, advantages, sketch, rewards=scores)

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
one mini-batch the step is a single on-policy update.

Rollouts and updates share one model: the runner returns only when every episode has ended, and
the update runs inside `policy.paused()`, so no generation step can overlap a training forward
or backward. The update first drops the engine's prefix cache (stale after the optimizer step,
and its memory is better spent on the backward pass); the engine would also notice the changed
weights by itself.

Gradient accumulation reproduces the mini-batch loss exactly: each micro-batch's loss (a mean
over its own tokens, or sequences for "seq-mean") is weighted by its share of the mini-batch's
completion tokens (or sequences). With the KL term off, units whose advantage is exactly 0 have
zero gradient, so they are not forwarded at all; they still count in the normaliser, so the
gradient is the same as if they had been.

The loss is computed with the model in eval mode (autograd does not need train mode): dropout,
of the base model or of LoRA, would make the training log-probs differ from the rollout's and
from one computation to the next.

A step whose advantages are all 0 (every group flat) has no signal: no backward and no optimizer
step, but the scheduler still observes the zero advantages (with no sketch), which is exactly
what tells HarnessBandit that this harness is not learnable right now.

A mixed step (scheduler "mixed") has one batch and one sketch: it is observed once per harness
present, each with that harness's own advantages.

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
    metrics.jsonl      one line per step (see `train_step`)
    eval.jsonl         periodic evaluation on dev tasks, one line per evaluation
    checkpoint/        adapter/, optimizer.pt, rng.pt, state.json (step, scheduler, RNG states);
                       written into a temporary folder and renamed into place
    adapter/           the final peft adapter (+ harnessrl.json naming the base model), loadable
                       with `--model hf:OUT/adapter`
    rollouts/run.db    every training episode (a RunStore: triage and reports work on it); a resumed
                       run first deletes the episodes of the steps after its checkpoint, so every
                       stored step holds exactly the episodes its update was computed from
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from harnessrl.harness.spec import HarnessSpec
from harnessrl.rundir import RunFolder, RunFolderError, append_jsonl, truncate_jsonl
from harnessrl.tasks.base import Suite
from harnessrl.train import lora
from harnessrl.train.config import TrainConfig
from harnessrl.train.distributed import Distributed, DistributedError, local_mini_batches
from harnessrl.train.grpo import (
    TrainingUnit,
    group_advantages,
    grpo_loss,
    pad_units,
    token_logprobs,
    units_from_trajectories,
)
from harnessrl.train.schedulers import _rng_state, _set_rng_state, make_scheduler
from harnessrl.train.sketch import GradientSketch, cosine

# Options that may change when a run is resumed: none changes what the next steps compute
# (`processes`, the number of training processes, changes only float rounding; which servers
# sample the rollouts changes nothing either: per-request seeds, same weights).
RESUMABLE_CHANGES = ("steps", "checkpoint_every", "processes", "rollout_servers")


class TrainError(ValueError):
    """Bad options or a refused run folder: reported before any training (the CLI exits 2)."""


class TrainingDiverged(RuntimeError):
    """The loss or the gradient became NaN / inf: training stopped, the last checkpoint is intact."""


# ------------------------------------------------------------------------------ small pure pieces


def allocate_tasks(shares: dict[str, float], n: int, step: int) -> dict[str, int]:
    """How many of the step's n tasks each harness gets: shares * n by largest remainder.

    Ties between equal remainders rotate with the step, so with 6 equal shares and 8 tasks the
    two extra tasks go to different harnesses from step to step (not always the first two).
    """
    names = list(shares)
    exact = [shares[h] * n for h in names]
    counts = [int(math.floor(x + 1e-9)) for x in exact]
    left = n - sum(counts)
    K = len(names)
    order = sorted(range(K), key=lambda i: (-round(exact[i] - counts[i], 9), (i - step) % K))
    for i in order[:left]:
        counts[i] += 1
    return dict(zip(names, counts))


def micro_batches(units: list[TrainingUnit], max_tokens: int) -> list[list[TrainingUnit]]:
    """Pack units into micro-batches of at most `max_tokens` padded tokens (rows x longest row).

    Longest first, so a batch's width is set by its first unit; a unit longer than the budget
    goes alone. Deterministic for a given list.
    """
    order = sorted(units, key=lambda u: len(u.prompt_ids) + len(u.completion_ids), reverse=True)
    batches: list[list[TrainingUnit]] = []
    current: list[TrainingUnit] = []
    width = 0
    for u in order:
        n = len(u.prompt_ids) + len(u.completion_ids)
        if current and max(width, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, width = [], 0
        current.append(u)
        width = max(width, n)
    if current:
        batches.append(current)
    return batches


def sampling_seed(seed: int, step: int, purpose: str) -> int:
    """The SamplingParams.seed of the rollouts of step `step` (purpose "train") or of the
    evaluation after `step` optimizer steps ("eval").

    A function of the run seed and the step only: every step samples afresh (the same task and
    attempt number never replay one random stream) and a resumed step samples what the
    uninterrupted run would have.
    """
    digest = hashlib.sha256(f"harnessrl-train-{purpose}:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # a non-negative 63-bit integer


# ------------------------------------------------------------------------------------- the trainer


class Trainer:
    """`Trainer(config, out, resume=...)` checks everything cheap (options, harnesses, suite,
    scheduler, the run folder) and raises TrainError; `run()` loads the model and trains.

    `suite` and `specs` may be given as objects instead of names (tests shrink harness rules
    this way); the recorded config then holds their names and the specs' full content.
    """

    def __init__(
        self,
        config: TrainConfig,
        out: str | os.PathLike,
        *,
        resume: bool = False,
        suite: Suite | None = None,
        specs: list[HarnessSpec] | None = None,
        progress: bool = True,
        console=None,
        executor=None,
    ):
        from harnessrl.executors import LocalExecutor
        from harnessrl.harness.registry import resolve_harnesses
        from harnessrl.harness.spec import SpecError
        from harnessrl.tasks import get_suite

        try:
            self.suite = suite if suite is not None else get_suite(config.suite)
        except ValueError as e:
            raise TrainError(str(e)) from None
        try:
            self.specs = list(specs) if specs is not None else resolve_harnesses(list(config.harnesses))
        except SpecError as e:
            raise TrainError(str(e)) from None
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise TrainError(f"harness names must be unique, got {names}")
        self.config = config = dataclasses.replace(config, suite=self.suite.name, harnesses=names)
        try:
            self.scheduler = make_scheduler(config.scheduler, names, seed=config.seed, **config.scheduler_options)
        except (ValueError, TypeError) as e:
            raise TrainError(str(e)) from None
        for split, wanted, option in (
            ("train", config.tasks_per_step, "--tasks-per-step"),
            ("dev", config.eval_tasks if config.eval_every else 0, "--eval-tasks"),
        ):
            have = self.suite.split_sizes.get(split, 0)
            if wanted > have:
                raise TrainError(
                    f"{option} {wanted} is more than the {have} {split} tasks of suite '{self.suite.name}'"
                )
        lora.check_local_model(config.model, TrainError)

        try:
            self.dist = Distributed.from_env()  # one process, or one of several (docs: "Several processes")
        except DistributedError as e:
            raise TrainError(str(e)) from None

        self.out = Path(out)
        self.resume = resume
        self.progress = progress
        self.executor = executor if executor is not None else LocalExecutor()  # the caller closes it
        record = {
            **config.to_dict(),
            "harness_specs": {s.name: s.to_dict() for s in self.specs},
            "processes": self.dist.world_size,
        }
        self.folder: RunFolder | None = None  # rank 0's alone
        error = None
        if self.dist.is_main:
            try:
                self.folder = RunFolder.open(self.out, "training", record, resume=resume, may_differ=RESUMABLE_CHANGES)
            except RunFolderError as e:
                error = str(e)
            else:
                self.folder.record_shell_isolation(self.specs, self.suite.offers_shell)
                self.folder.record(executor=self.executor.describe())
        error = self.dist.agree(error)  # a refused folder stops every process
        if error is not None:
            self.dist.close()
            raise TrainError(error)
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.console = console
        self.step = 0  # training steps completed
        self.task_rng = random.Random(f"harnessrl-train-tasks:{config.seed}")
        self.spec_by_name = {s.name: s for s in self.specs}

    @property
    def record(self) -> dict[str, Any]:
        """What OUT/config.json records: every option, the harness specs, machine facts (rank 0)."""
        if self.folder is None:
            raise RuntimeError("only rank 0 holds the run folder's record")
        return self.folder.config

    # -- setup (slow: the model) ----------------------------------------------------------------------
    def _setup(self) -> None:
        from harnessrl.models.base import SamplingParams
        from harnessrl.rollout import Runner

        cfg = self.config
        policy = lora.load_local_policy(cfg.model, TrainError)
        # LoRA in policy.model itself: generation uses the adapter; eval mode throughout (no dropout,
        # see the module docstring)
        self.peft_model, self.trainable, self.optimizer = lora.attach(policy, cfg, TrainError)
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.sketcher = GradientSketch(dim=cfg.sketch_dim, seed=cfg.seed, kind=cfg.sketch_kind)
        # The runner's sampling seed is replaced at every step (`sampling_seed`).
        self.sampling = SamplingParams(temperature=cfg.temperature, top_p=1.0, seed=sampling_seed(cfg.seed, 0, "train"))
        self._weights_version = 0  # optimizer steps behind the weights as they are (see _sync_servers)
        self.servers = None
        if cfg.rollout_servers:
            from harnessrl.train.rollout_server import RolloutServerError, RolloutServers

            try:
                self.servers = RolloutServers(cfg.rollout_servers, max_concurrency=cfg.max_in_flight)
                self.servers.check()
            except (ValueError, RolloutServerError) as e:
                raise TrainError(str(e)) from None
        self.runner = Runner(
            self.servers if self.servers is not None else policy,
            self.sampling,
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
            self.store.delete_attempts_from(self.step * cfg.group_size)
            self.runner.on_episode = self.store.add
        if importlib.util.find_spec("tensorboard") is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.out / "tensorboard"))
            except Exception:  # noqa: BLE001 - logging extras must never stop training
                self.tb = None

    # -- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """OUT/checkpoint, written in a temporary folder then renamed into place (state.json last)."""
        return lora.write_checkpoint(
            self.out,
            self.peft_model,
            self.optimizer,
            {
                "step": self.step,
                "scheduler": self.scheduler.state_dict(),
                "task_rng": _rng_state(self.task_rng),
                "generate_calls": self.policy.generate_calls,
            },
            {"rng.pt": {"torch": torch.get_rng_state()}},
        )

    def load_checkpoint(self) -> bool:
        """Restore adapter, optimizer, scheduler, RNGs and step; False when there is none yet.

        With several processes rank 0 reads the checkpoint and every process restores rank 0's
        copy: it holds nothing per process, so the number of processes may change on resume."""
        saved = self.dist.broadcast_object(self._read_checkpoint() if self.dist.is_main else None)
        if saved is None:
            return False
        folder, state, weights, optimizer, rng = saved
        lora.load_adapter_weights(self.peft_model, weights, folder, TrainError)
        self.optimizer.load_state_dict(optimizer)
        torch.set_rng_state(rng["torch"])
        self.scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(self.task_rng, state["task_rng"])
        self.policy.generate_calls = int(state["generate_calls"])
        self.step = int(state["step"])
        self._weights_version = self.step
        return True

    def _read_checkpoint(self) -> tuple[str, dict, dict, dict, dict] | None:
        """(folder, state.json, adapter weights, optimizer state, RNG state) of the checkpoint, or None."""
        folder = lora.checkpoint_folder(self.out)
        if folder is None:
            return None
        return (
            str(folder),
            json.loads((folder / "state.json").read_text(encoding="utf-8")),
            lora.read_adapter_weights(folder),
            torch.load(folder / "optimizer.pt", weights_only=True),
            torch.load(folder / "rng.pt", weights_only=True),
        )

    def save_adapter(self) -> Path:
        """OUT/adapter (lora.write_adapter); harnessrl.json also names the suite, harnesses and scheduler."""
        cfg = self.config
        return lora.write_adapter(
            self.out,
            self.peft_model,
            cfg.model,
            "harnessrl train grpo",
            steps=self.step,
            suite=cfg.suite,
            harnesses=cfg.harnesses,
            scheduler=cfg.scheduler,
        )

    # -- one step -------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One training step: a rollout batch and its optimizer steps (or a logged skip).
        Returns the metrics record of the step."""
        from harnessrl.rollout import Job

        cfg, step = self.config, self.step
        G = cfg.group_size
        t_start = time.perf_counter()

        # 1. the scheduler chooses who collects the batch
        probabilities = self.scheduler.probabilities()
        selection = self.scheduler.select(step)
        t_sched = time.perf_counter() - t_start
        counts = allocate_tasks(selection.shares, cfg.tasks_per_step, step)

        # 2. tasks (seeded sample of the train split), each to one harness; G attempts each.
        # Attempt numbers are unique over the run (step * G + i): unique episode ids and store keys.
        picked = iter(self.task_rng.sample(range(len(self.train_tasks)), cfg.tasks_per_step))
        assignment = [
            (self.train_tasks[next(picked)], self.spec_by_name[h]) for h, c in counts.items() for _ in range(c)
        ]
        # Several processes take this decision each from the same seeded state: it must agree.
        self.dist.check_same((step, selection.shares, [t.id for t, _ in assignment]), "the step's harnesses and tasks")
        # This process's groups (all of them in one process): whole groups, a contiguous run.
        mine = self.dist.shard(len(assignment))
        jobs = [Job(task, spec, step * G + i) for task, spec in (assignment[g] for g in mine) for i in range(G)]
        self.sampling = self.sampling.model_copy(update={"seed": sampling_seed(cfg.seed, step, "train")})
        self.runner.sampling = self.sampling
        t0 = time.perf_counter()
        t_sync = self._sync_servers()
        trajectories = self.runner.run(jobs)
        t_rollout = time.perf_counter() - t0
        lag = self._policy_lag(trajectories)

        # 3. advantages per group (one task under one harness), where the group ran
        by_group: dict[tuple[str, str], list] = defaultdict(list)
        for traj in trajectories:
            by_group[(traj.task_id, traj.harness)].append(traj)
        advantage_of: dict[str, float] = {}
        trained = []
        outcomes: dict[int, tuple[int, list[float], list[float] | None]] = {}  # group: size, scores, advantages
        for g in mine:
            task, spec = assignment[g]
            group = sorted(by_group[(task.id, spec.name)], key=lambda t: t.attempt)
            valid = [t for t in group if not t.is_infra_error and t.grade is not None]
            scores = [t.grade.score for t in valid]
            A = None
            if len(valid) >= 2:
                A = group_advantages(torch.tensor([scores], dtype=torch.float64), scale=cfg.scale_advantages)
                A = A[0].tolist()
                for traj, a in zip(valid, A):
                    advantage_of[traj.episode_id] = a
                    trained.append(traj)
            outcomes[g] = (len(group), scores, A)
        units = units_from_trajectories(trained, advantage_of)
        local = {
            "groups": outcomes,
            "units": len(units),
            "tokens": sum(len(u.completion_ids) for u in units),
            "signal": any(u.advantage != 0 for u in units),
        }
        shared = self.dist.all_gather_object(local)  # every process's groups, on every process
        if cfg.save_rollouts and self.dist.enabled:  # rank 0 stored its own episodes as they ended
            others = self.dist.gather_object([] if self.dist.is_main else trajectories)
            if self.store is not None:
                for traj in (t for part in others[1:] for t in part):
                    self.store.add(traj)
        # the step's statistics over every group, in assignment order (the same on every process)
        outcomes = {g: o for part in shared for g, o in part["groups"].items()}
        adv_by_harness: dict[str, list[float]] = defaultdict(list)
        rewards_by_harness: dict[str, list[float]] = defaultdict(list)
        n_groups = n_flat = n_too_small = n_infra = n_episodes = 0
        for g, (task, spec) in enumerate(assignment):
            size, scores, A = outcomes[g]
            n_episodes += size
            n_infra += size - len(scores)
            rewards_by_harness[spec.name].extend(scores)
            if A is None:
                n_too_small += 1
                continue
            n_groups += 1
            n_flat += all(a == 0 for a in A)
            adv_by_harness[spec.name].extend(A)
        all_adv = [a for values in adv_by_harness.values() for a in values]
        all_rewards = [r for values in rewards_by_harness.values() for r in values]
        n_units = sum(part["units"] for part in shared)
        signal = any(part["signal"] for part in shared)

        # 4.-6. the optimizer steps: ppo_epochs passes of mini_batches mini-steps each, with no
        # generation step in between (the runner is done; paused() makes sure)
        update = None
        if signal:
            with self.policy.paused():
                self.policy.clear_cache()
                update = self._update(units, step)
            self._weights_version = self.step + 1  # the weights now are those after this step
        t_backward = update["time_backward"] if update else 0.0
        t_sketch = update["time_sketch"] if update else 0.0
        t_opt = update["time_optimizer"] if update else 0.0
        sketch = update["sketch"] if update else None

        # 7. the scheduler learns from this update
        t0 = time.perf_counter()
        transfer: dict[str, float] = {}
        sketch_avg = getattr(self.scheduler, "sketch_avg", None)
        if sketch is not None and selection.harness is not None and sketch_avg is not None:
            transfer = {o: cosine(sketch, avg) for o, avg in sketch_avg.items() if o != selection.harness}
        for h in counts:
            if adv_by_harness.get(h):  # a harness whose groups were all too small has nothing to report
                self.scheduler.observe(h, adv_by_harness[h], sketch, rewards=rewards_by_harness[h])
        t_sched += time.perf_counter() - t0

        self.step += 1
        completion_tokens = sum(part["tokens"] for part in shared)
        return {
            "step": self.step,
            "harness": selection.harness or "mixed",
            "shares": {h: c / cfg.tasks_per_step for h, c in counts.items() if c},
            "sampling_seed": self.sampling.seed,
            "episodes": n_episodes,
            "infra_errors": n_infra,
            "reward_mean": _mean(all_rewards),
            "reward_by_harness": {h: _mean(v) for h, v in rewards_by_harness.items()},
            "adv_abs_mean": _mean([abs(a) for a in all_adv]),
            "groups": n_groups,
            "groups_too_small": n_too_small,
            "zero_std_frac": n_flat / n_groups if n_groups else None,
            "probabilities": probabilities,
            "transfer": transfer,
            "units": n_units,
            "units_trained": update["units_trained"] if update else 0,
            "completion_tokens": completion_tokens,
            "padded_tokens": update["padded_tokens"] if update else 0,
            "loss": update["loss"] if update else None,
            "clip_fraction": update["clip_fraction"] if update else None,
            "clip_fraction_by_epoch": update["clip_fraction_by_epoch"] if update else None,
            "ratio_mean": update["ratio_mean"] if update else None,
            "kl": update["kl"] if update else None,
            "grad_norm": update["grad_norm"] if update else None,
            "rollout_logprob_diff_max": update["rollout_logprob_diff_max"] if update else None,
            "rollout_logprob_diff_mean": update["rollout_logprob_diff_mean"] if update else None,
            "optimizer_step": signal,
            "optimizer_steps": update["optimizer_steps"] if update else 0,
            "skipped": None if signal else ("all advantages are zero" if n_units else "no training units"),
            "lr": cfg.lr,
            **(
                {"policy_lag_max": lag, "rollout_requests": list(self.servers.sent), "time_adapter_sync": t_sync}
                if self.servers is not None
                else {}
            ),
            "time": {
                "rollout": t_rollout,
                "backward": t_backward,
                "sketch": t_sketch,
                "optimizer": t_opt,
                "scheduler": t_sched,
                "total": time.perf_counter() - t_start,
            },
        }

    def _sync_servers(self) -> float:
        """With --rollout-server: the adapter as it is now, saved into OUT/rollout-adapter and
        loaded in place by every server, unless they hold it already; returns the seconds spent."""
        if self.servers is None:
            return 0.0
        from harnessrl.train.rollout_server import ADAPTER_DIR, RolloutServerError

        version = self._weights_version
        if self.servers.version == version:
            return 0.0
        t0 = time.perf_counter()
        # One process writes and reloads (all hold the same weights); the others wait for it.
        error = None
        if self.dist.is_main:
            folder = self.out / ADAPTER_DIR
            self.peft_model.save_pretrained(str(folder))
            try:
                self.servers.load_adapter(folder, version)
            except RolloutServerError as e:
                error = str(e)
        error = self.dist.agree(error)
        if error is not None:
            raise TrainError(error)
        self.servers.version = version
        return time.perf_counter() - t0

    def _policy_lag(self, trajectories: list) -> int | None:
        """How many optimizer steps the oldest model call of the batch was sampled behind the
        weights it is trained on (0: on-policy; rollouts here are synchronous, so it stays 0 unless
        a server served a stale adapter). None without --rollout-server."""
        if self.servers is None:
            return None
        now = self._weights_version
        versions = [
            s.model_call.policy_version
            for t in trajectories
            for s in t.steps
            if s.model_call is not None and s.model_call.policy_version is not None
        ]
        return max((now - v for v in versions), default=0)

    def _update(self, units: list[TrainingUnit], step: int) -> dict[str, Any]:
        """The optimizer steps of one rollout batch: ppo_epochs passes, each of mini_batches mini-steps.

        Every mini-step's loss compares the current log-probs with the old ones, recomputed here
        first under the weights that sampled the batch (`_recompute_old_logprobs`), so from the
        second mini-step on the ratio moves away from 1 and the clip acts. The sketch is of the
        first pass's gradients, each mini-batch's weighted by its share of the batch: the whole
        batch's gradient at the sampling policy when there is one mini-batch (each later
        mini-batch's is taken where the earlier mini-steps left the weights).
        Mini-batches whose units all have advantage 0 (KL off) have no gradient: no step.

        Returns loss (mean over mini-steps), clip_fraction / ratio_mean / kl (over every trained
        token of every pass), clip_fraction_by_epoch, grad_norm (mean of the mini-steps' norms
        before clipping), optimizer_steps, units_trained (first pass), padded_tokens (all passes),
        rollout_logprob_diff_max / _mean, the sketch and the time split.

        Several processes: `units` are this process's; the batch is every process's units in rank
        order. Each mini-batch is the one-process mini-batch (`local_mini_batches`), its loss is
        normalised by the whole mini-batch's tokens (or units), and the gradient is summed over
        the processes before the sketch, the clip and the step: every process takes the step one
        process would have taken on the whole batch (up to float rounding).
        """
        cfg = self.config
        t0 = time.perf_counter()
        units, drift = self._recompute_old_logprobs(units)
        t_old = time.perf_counter() - t0
        sizes = self.dist.all_gather_object((len(units), sum(len(u.completion_ids) for u in units)))
        n_units, batch_tokens = sum(n for n, _ in sizes), sum(t for _, t in sizes)
        offset = sum(n for n, _ in sizes[: self.dist.rank])  # where this process's units start in the batch
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        sketch = None
        losses: list[float] = []
        grad_norms: list[float] = []
        token_sums = {"clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
        trained_tokens = 0
        clip_by_epoch: list[float | None] = []
        units_trained = padded_tokens = 0
        t_backward = t_sketch = t_opt = 0.0
        for epoch in range(cfg.ppo_epochs):
            epoch_clip, epoch_tokens = 0.0, 0
            split_seed = f"harnessrl-train-minibatches:{cfg.seed}:{step}:{epoch}"
            for mb in local_mini_batches(units, offset, n_units, cfg.mini_batches, split_seed):
                t0 = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                totals = self._global_totals(mb) if self.dist.enabled else None
                if totals is not None and not totals[2]:
                    continue  # no process has a trainable unit in this mini-batch
                stats, n_active, active_tokens, padded = self._accumulate_gradient(mb, totals)
                if totals is not None:
                    stats, n_active, padded = self._all_reduce_gradient(stats, n_active, padded)
                t_backward += time.perf_counter() - t0
                if not n_active:
                    continue
                padded_tokens += padded
                losses.append(stats["loss"])
                for key in token_sums:
                    token_sums[key] += stats[key] * active_tokens
                trained_tokens += active_tokens
                epoch_clip += stats["clip_fraction"] * active_tokens
                epoch_tokens += active_tokens

                if epoch == 0:  # the scheduler's sketch, before the optimizer touches anything
                    units_trained += n_active
                    t0 = time.perf_counter()
                    part = self.sketcher.sketch_model(self.peft_model)  # of the summed gradient
                    mb_tokens, mb_units = totals[:2] if totals else (sum(len(u.completion_ids) for u in mb), len(mb))
                    if mb_units != n_units:  # its share of the batch's loss normaliser
                        if cfg.aggregation == "token-mean":
                            part = part * (mb_tokens / batch_tokens)
                        else:
                            part = part * (mb_units / n_units)
                    sketch = part if sketch is None else sketch + part
                    t_sketch += time.perf_counter() - t0

                t0 = time.perf_counter()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, max_norm))
                if not math.isfinite(grad_norm):
                    self.optimizer.zero_grad(set_to_none=True)
                    raise TrainingDiverged(f"step {step + 1}: the gradient norm is {grad_norm}")
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                grad_norms.append(grad_norm)
                t_opt += time.perf_counter() - t0
            clip_by_epoch.append(epoch_clip / epoch_tokens if epoch_tokens else None)
        return {
            "loss": _mean(losses),
            **{key: token_sums[key] / trained_tokens if trained_tokens else None for key in token_sums},
            "clip_fraction_by_epoch": clip_by_epoch,
            "grad_norm": _mean(grad_norms),
            "optimizer_steps": len(grad_norms),
            "units_trained": units_trained,
            "padded_tokens": padded_tokens,
            "sketch": sketch,
            **drift,
            "time_backward": t_backward + t_old,
            "time_sketch": t_sketch,
            "time_optimizer": t_opt,
        }

    def _recompute_old_logprobs(self, units: list[TrainingUnit]) -> tuple[list[TrainingUnit], dict[str, Any]]:
        """The units with their old log-probs recomputed by a no-grad teacher-forced pass on the
        current weights (the weights that sampled them), and how far the rollout's recorded
        log-probs were from these: rollout_logprob_diff_max / _mean over the recomputed tokens.

        Only the units the loss will forward are recomputed (with the KL term off, those with a
        nonzero advantage); the others keep the rollout's numbers, which nothing reads. Same
        micro-batches as the loss, in eval mode (no dropout); the order of the units is kept.
        """
        cfg = self.config
        active = [u for u in units if cfg.kl_coef > 0 or u.advantage != 0]
        recomputed: dict[int, list[float]] = {}
        diff_max, diff_sum, tokens = 0.0, 0.0, 0
        self.peft_model.eval()
        with torch.no_grad():
            for mb in micro_batches(active, cfg.micro_batch):
                batch = pad_units(mb, self.policy.pad_id)
                logprobs = token_logprobs(self.peft_model, batch, temperature=cfg.temperature)
                for row, u in enumerate(mb):
                    p, c = len(u.prompt_ids), len(u.completion_ids)
                    new = logprobs[row, p : p + c]
                    diff = (new - batch["old_logprobs"][row, p : p + c]).abs()
                    diff_max = max(diff_max, float(diff.max()))
                    diff_sum += float(diff.sum())
                    tokens += c
                    recomputed[id(u)] = new.tolist()
        if self.dist.enabled:  # over every process's units
            parts = self.dist.all_gather_object((diff_max, diff_sum, tokens))
            diff_max, diff_sum, tokens = max(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts)
        fresh = [dataclasses.replace(u, old_logprobs=recomputed[id(u)]) if id(u) in recomputed else u for u in units]
        drift = {
            "rollout_logprob_diff_max": diff_max if tokens else None,
            "rollout_logprob_diff_mean": diff_sum / tokens if tokens else None,
        }
        return fresh, drift

    def _accumulate_gradient(
        self, units: list[TrainingUnit], totals: tuple[int, int, int] | None = None
    ) -> tuple[dict[str, float], int, int, int]:
        """Backward of the GRPO loss of `units` (one mini-batch), one micro-batch at a time.

        The micro-batch loss is weighted by its share of `units` (completion tokens for
        token-mean, sequences for seq-mean), so the accumulated gradient is that of the loss of
        all of `units`. The model stays in eval mode (no dropout). Returns the stats (loss;
        clip_fraction, ratio_mean, kl over the forwarded tokens), the number of units forwarded,
        their completion tokens and the padded tokens.

        `totals`: (completion tokens, units, trained completion tokens) of the whole mini-batch
        when `units` are only this process's part of it (`_global_totals`): the shares are then
        of the whole, and the processes' sums add up to the whole mini-batch's gradient and stats.
        """
        cfg = self.config
        active = units if cfg.kl_coef > 0 else [u for u in units if u.advantage != 0]
        if totals is None:
            total_tokens = sum(len(u.completion_ids) for u in units)
            total_units = len(units)
            active_tokens = sum(len(u.completion_ids) for u in active)
        else:
            total_tokens, total_units, active_tokens = totals
        pad_id = self.policy.pad_id
        sums = {"loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
        padded = 0
        self.peft_model.eval()  # whatever mode something left it in: no dropout in these log-probs
        for mb in micro_batches(active, cfg.micro_batch):
            batch = pad_units(mb, pad_id)
            padded += batch["input_ids"].numel()
            logprobs = token_logprobs(self.peft_model, batch, temperature=cfg.temperature)
            ref = None
            if cfg.kl_coef > 0:
                with torch.no_grad(), self.peft_model.disable_adapter():
                    ref = token_logprobs(self.peft_model, batch, temperature=cfg.temperature)
            loss, stats = grpo_loss(
                logprobs,
                batch["old_logprobs"],
                batch["advantages"],
                batch["completion_mask"],
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.aggregation,
                ref_logprobs=ref,
                kl_coef=cfg.kl_coef,
            )
            # (with several processes the others wait for this gradient: a non-finite loss goes into
            # the summed loss instead, and every process stops there, in `_all_reduce_gradient`)
            if not torch.isfinite(loss) and totals is None:
                self.optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(f"step {self.step + 1}: the loss is {float(loss.detach())}")
            mb_tokens = sum(len(u.completion_ids) for u in mb)
            weight = mb_tokens / total_tokens if cfg.aggregation == "token-mean" else len(mb) / total_units
            (loss * weight).backward()
            sums["loss"] += float(loss.detach()) * weight
            share = mb_tokens / active_tokens  # the per-token stats, over the trained tokens
            for key in ("clip_fraction", "ratio_mean", "kl"):
                sums[key] += stats[key] * share
        return sums, len(active), active_tokens, padded

    def _global_totals(self, units: list[TrainingUnit]) -> tuple[int, int, int]:
        """(completion tokens, units, trained completion tokens) of a mini-batch over every process."""
        active = units if self.config.kl_coef > 0 else [u for u in units if u.advantage != 0]
        counts = [sum(len(u.completion_ids) for u in units), len(units), sum(len(u.completion_ids) for u in active)]
        totals = self.dist.all_reduce_(torch.tensor(counts, dtype=torch.int64))
        return int(totals[0]), int(totals[1]), int(totals[2])

    def _all_reduce_gradient(self, stats: dict[str, float], n_active: int, padded: int) -> tuple[dict, int, int]:
        """Sum the LoRA gradient, the stats, the forwarded units and the padded tokens of one
        mini-batch over the processes (one flat buffer for the gradient). Every process gets the
        same sums, so the sketch, the clip and the optimizer step that follow are the same
        everywhere. A non-finite summed loss stops every process here."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.trainable]
        flat = self.dist.all_reduce_(torch.cat([g.reshape(-1) for g in grads]))
        start = 0
        for p in self.trainable:
            p.grad = flat[start : start + p.numel()].view_as(p)
            start += p.numel()
        keys = ("loss", "clip_fraction", "ratio_mean", "kl")
        sums = self.dist.all_reduce_(torch.tensor([*(stats[k] for k in keys), n_active, padded], dtype=torch.float64))
        stats = dict(zip(keys, sums[:4].tolist()))
        if not math.isfinite(stats["loss"]):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(f"step {self.step + 1}: the loss is {stats['loss']}")
        return stats, int(sums[4]), int(sums[5])

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any] | None:
        """Mean score of every harness on the first eval_tasks dev tasks (one attempt each).

        Several processes: each runs a contiguous share of the episodes and rank 0 gets them all
        and returns the record; the others return None."""
        from harnessrl.metrics import summarize_harness
        from harnessrl.rollout import Runner, make_jobs

        cfg = self.config
        t0 = time.perf_counter()
        tasks = self.suite.tasks("dev", cfg.eval_tasks)
        self.eval_policy.generate_calls = 0
        self.eval_sampling = self.eval_sampling.model_copy(update={"seed": sampling_seed(cfg.seed, self.step, "eval")})
        runner = Runner(
            self.eval_policy,
            self.eval_sampling,
            max_in_flight=cfg.max_in_flight,
            max_retries=cfg.retries,
            progress=False,
            executor=self.executor,
        )
        jobs = make_jobs(tasks, self.specs, 1)
        gathered = self.dist.gather_object(runner.run([jobs[i] for i in self.dist.shard(len(jobs))]))
        if gathered is None:
            return None
        trajectories = [t for part in gathered for t in part]
        summaries = {s.name: summarize_harness([t for t in trajectories if t.harness == s.name], 1) for s in self.specs}
        scores = {h: m["mean_score"] for h, m in summaries.items()}
        known = [v for v in scores.values() if v is not None]
        return {
            "step": self.step,
            "temperature": cfg.eval_temperature,
            "sampling_seed": self.eval_sampling.seed,
            "tasks": len(tasks),
            "mean_score": scores,
            "pass_at_1": {h: (m["pass_at_k"] or {}).get("1") for h, m in summaries.items()},
            "delivery_rate": {h: m["delivery_rate"] for h, m in summaries.items()},
            "average": _mean(known),
            "seconds": time.perf_counter() - t0,
        }

    # -- the loop -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
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
        if main:
            self.folder.start()  # config.json (again: --steps / --checkpoint-every may have changed)
        self._open_logs()

        if cfg.eval_every and self.step == 0:
            self._log_eval(eval_path, self.evaluate())
        last: dict[str, Any] = {}
        with _GRPOProgress(self.console, cfg.steps, self.step, enabled=self.progress and main) as bar:
            while self.step < cfg.steps:
                try:
                    record = self.train_step()
                except TrainingDiverged as e:
                    if not main:  # every process stops at the same step; rank 0 tells why
                        raise
                    folder = lora.checkpoint_folder(self.out)
                    at = json.loads((folder / "state.json").read_text())["step"] if folder else None
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
        self.policy.close()  # the engine thread (a later use of the policy starts a new one)
        if self.tb is not None:
            self.tb.close()
        if self.store is not None:
            self.store.close()
        self.dist.barrier()  # the others finish when rank 0 has written everything
        self.dist.close()
        return {"steps": self.step, "adapter": str(adapter), "last": last}

    def _log_eval(self, path: Path, record: dict[str, Any] | None) -> None:
        if record is None:  # another process's share of a shared evaluation
            return
        append_jsonl(path, record)
        if self.tb is not None:
            for h, v in record["mean_score"].items():
                if v is not None:
                    self.tb.add_scalar(f"eval/{h}", v, record["step"])
        scores = "  ".join(f"{h} {v:.3f}" for h, v in record["mean_score"].items() if v is not None)
        self._say(f"eval at step {record['step']}: {scores}")

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


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class StepProgress:
    """A rich bar over the optimizer steps on a terminal; a plain line per step otherwise (CI logs,
    `| tee`). A subclass names the bar's own columns (`columns`: field -> column text), what a
    step's record shows in them (`shown`) and as a line (`line`)."""

    title = "step"
    columns: dict[str, str] = {}

    def __init__(self, console, total: int, done: int, enabled: bool):
        self.console, self.total, self.done, self.enabled = console, total, done, enabled
        self.bar = None

    def shown(self, r: dict[str, Any]) -> dict[str, str]:
        raise NotImplementedError

    def line(self, r: dict[str, Any]) -> str:
        raise NotImplementedError

    def __enter__(self):
        if self.enabled and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn(f"[bold]{self.title}"),
                BarColumn(),
                MofNCompleteColumn(),
                *(TextColumn(text) for text in self.columns.values()),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(
                self.title, total=self.total, completed=self.done, **dict.fromkeys(self.columns, "-")
            )
        return self

    def update(self, r: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=r["step"], **self.shown(r))
        elif self.enabled:
            self.console.print(self.line(r), highlight=False, markup=False)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


class _GRPOProgress(StepProgress):
    columns = {"harness": "{task.fields[harness]}", "reward": "reward {task.fields[reward]}"}

    def shown(self, r: dict[str, Any]) -> dict[str, str]:
        return {"harness": r["harness"], "reward": _shown(r["reward_mean"], ".3f")}

    def line(self, r: dict[str, Any]) -> str:
        return (
            f"step {r['step']}/{self.total}  {r['harness']}  reward {_shown(r['reward_mean'], '.3f')}  "
            f"|A| {_shown(r['adv_abs_mean'], '.3f')}  loss {_shown(r['loss'], '.4f')}  "
            f"{'update' if r['optimizer_step'] else 'skipped'}  {r['time']['total']:.1f} s"
        )


def _shown(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
