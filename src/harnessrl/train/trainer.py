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
    scheduler.observe(harness, advantages, sketch)

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
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from harnessrl import __version__
from harnessrl.harness.spec import HarnessSpec
from harnessrl.rundir import RunFolder, RunFolderError, append_jsonl, truncate_jsonl, write_json
from harnessrl.tasks.base import Suite
from harnessrl.train.config import TrainConfig
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

# Options that may change when a run is resumed: neither changes what the next steps compute.
RESUMABLE_CHANGES = ("steps", "checkpoint_every")
ADAPTER_META = "harnessrl.json"


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


def split_mini_batches(units: list[TrainingUnit], n: int, seed: str) -> list[list[TrainingUnit]]:
    """The units of one pass in n mini-batches (one optimizer step each), sizes differing by at most 1.

    One mini-batch is the units as given. Several: the units are shuffled by a generator seeded
    with `seed` first, so each pass mixes groups and harnesses differently; a string seed keeps
    this independent of any RNG state (a resumed run splits exactly as an uninterrupted one).
    More mini-batches than units gives one unit each.
    """
    if n <= 1 or len(units) <= 1:
        return [list(units)]
    order = list(units)
    random.Random(seed).shuffle(order)
    n = min(n, len(order))
    size, extra = divmod(len(order), n)
    batches, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        batches.append(order[start:end])
        start = end
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


def lora_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


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
        _check_model_spec(config.model)

        self.out = Path(out)
        self.resume = resume
        self.progress = progress
        record = {**config.to_dict(), "harness_specs": {s.name: s.to_dict() for s in self.specs}}
        try:
            self.folder = RunFolder.open(self.out, "training", record, resume=resume, may_differ=RESUMABLE_CHANGES)
        except RunFolderError as e:
            raise TrainError(str(e)) from None
        self.folder.record_shell_isolation(self.specs, self.suite.offers_shell)
        self.executor = executor if executor is not None else LocalExecutor()  # the caller closes it
        self.folder.record(executor=self.executor.describe())
        if console is None:
            from rich.console import Console

            console = Console(stderr=True)
        self.console = console
        self.step = 0  # training steps completed
        self.task_rng = random.Random(f"harnessrl-train-tasks:{config.seed}")
        self.spec_by_name = {s.name: s for s in self.specs}

    @property
    def record(self) -> dict[str, Any]:
        """What OUT/config.json records: every option, the harness specs, machine facts."""
        return self.folder.config

    # -- setup (slow: the model) ----------------------------------------------------------------------
    def _setup(self) -> None:
        from peft import LoraConfig, get_peft_model

        from harnessrl.models import load_policy
        from harnessrl.models.base import ModelUnavailable, SamplingParams
        from harnessrl.models.hf import HFPolicy
        from harnessrl.rollout import Runner

        cfg = self.config
        try:
            policy = load_policy(cfg.model)
        except (ValueError, ModelUnavailable, OSError) as e:
            raise TrainError(f"cannot load model '{cfg.model}': {e}") from None
        if not isinstance(policy, HFPolicy):
            raise TrainError(
                f"training needs a local transformers model (tiny-random, smollm2-135m, hf:PATH), not {cfg.model!r}"
            )
        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=0.0,  # dropout would make training log-probs differ from the rollout's
            target_modules=list(cfg.lora_targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            with torch.random.fork_rng(devices=[]):  # the LoRA init depends only on the seed
                torch.manual_seed(cfg.seed)
                self.peft_model = get_peft_model(policy.model, lora)
        except ValueError as e:
            raise TrainError(
                f"cannot apply LoRA to {cfg.model} (--lora-targets {','.join(cfg.lora_targets)}): {e}"
            ) from None
        # The LoRA layers are injected into policy.model in place: generation uses the adapter.
        assert self.peft_model.get_base_model() is policy.model
        self.peft_model.eval()  # and it stays so, in training too: no dropout (see the module docstring)
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.trainable = [p for _, p in lora_parameters(self.peft_model)]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.sketcher = GradientSketch(dim=cfg.sketch_dim, seed=cfg.seed, kind=cfg.sketch_kind)
        # The runner's sampling seed is replaced at every step (`sampling_seed`).
        self.sampling = SamplingParams(temperature=cfg.temperature, top_p=1.0, seed=sampling_seed(cfg.seed, 0, "train"))
        self.runner = Runner(
            policy,
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
        self.tb = None
        if importlib.util.find_spec("tensorboard") is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.out / "tensorboard"))
            except Exception:  # noqa: BLE001 - logging extras must never stop training
                self.tb = None

    # -- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """OUT/checkpoint, written in a temporary folder then renamed into place (state.json last)."""
        tmp = Path(tempfile.mkdtemp(prefix=".checkpoint-tmp-", dir=self.out))
        final, old = self.out / "checkpoint", self.out / ".checkpoint-old"
        try:
            self.peft_model.save_pretrained(str(tmp / "adapter"))
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
            write_json(
                tmp / "state.json",
                {
                    "step": self.step,
                    "scheduler": self.scheduler.state_dict(),
                    "task_rng": _rng_state(self.task_rng),
                    "generate_calls": self.policy.generate_calls,
                },
            )
            if old.exists():
                shutil.rmtree(old)
            if final.exists():
                os.rename(final, old)  # a crash right here leaves .checkpoint-old, which resume uses
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

    def _checkpoint_folder(self) -> Path | None:
        for folder in (self.out / "checkpoint", self.out / ".checkpoint-old"):
            if (folder / "state.json").is_file():
                return folder
        return None

    def load_checkpoint(self) -> bool:
        """Restore adapter, optimizer, scheduler, RNGs and step; False when there is none yet."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = self._checkpoint_folder()
        if folder is None:
            return False
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        weights = load_file(str(folder / "adapter" / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(self.peft_model, weights)
        if getattr(result, "unexpected_keys", None):
            raise TrainError(f"{folder}: adapter weights do not fit this model: {result.unexpected_keys[:3]}")
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        torch.set_rng_state(torch.load(folder / "rng.pt", weights_only=True)["torch"])
        self.scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(self.task_rng, state["task_rng"])
        self.policy.generate_calls = int(state["generate_calls"])
        self.step = int(state["step"])
        return True

    def save_adapter(self) -> Path:
        """OUT/adapter: a standard peft adapter folder plus harnessrl.json naming the base model."""
        base = self.config.model
        if base.startswith("hf:"):
            base = "hf:" + str(Path(base[3:]).expanduser().resolve())
        tmp = Path(tempfile.mkdtemp(prefix=".adapter-tmp-", dir=self.out))
        final = self.out / "adapter"
        try:
            self.peft_model.save_pretrained(str(tmp))
            write_json(
                tmp / ADAPTER_META,
                {
                    "base_model": base,
                    "trained_by": "harnessrl train grpo",
                    "harnessrl_version": __version__,
                    "steps": self.step,
                    "suite": self.config.suite,
                    "harnesses": self.config.harnesses,
                    "scheduler": self.config.scheduler,
                },
            )
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final

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
        jobs = [Job(task, spec, step * G + i) for task, spec in assignment for i in range(G)]
        self.sampling = self.sampling.model_copy(update={"seed": sampling_seed(cfg.seed, step, "train")})
        self.runner.sampling = self.sampling
        t0 = time.perf_counter()
        trajectories = self.runner.run(jobs)
        t_rollout = time.perf_counter() - t0

        # 3. advantages per group (one task under one harness)
        by_group: dict[tuple[str, str], list] = defaultdict(list)
        for traj in trajectories:
            by_group[(traj.task_id, traj.harness)].append(traj)
        advantage_of: dict[str, float] = {}
        adv_by_harness: dict[str, list[float]] = defaultdict(list)
        rewards_by_harness: dict[str, list[float]] = defaultdict(list)
        trained = []
        n_groups = n_flat = n_too_small = n_infra = 0
        for task, spec in assignment:
            group = sorted(by_group[(task.id, spec.name)], key=lambda t: t.attempt)
            valid = [t for t in group if not t.is_infra_error and t.grade is not None]
            n_infra += len(group) - len(valid)
            scores = [t.grade.score for t in valid]
            rewards_by_harness[spec.name].extend(scores)
            if len(valid) < 2:
                n_too_small += 1
                continue
            A = group_advantages(torch.tensor([scores], dtype=torch.float64), scale=cfg.scale_advantages)[0].tolist()
            n_groups += 1
            n_flat += all(a == 0 for a in A)
            for traj, a in zip(valid, A):
                advantage_of[traj.episode_id] = a
                adv_by_harness[spec.name].append(a)
                trained.append(traj)
        units = units_from_trajectories(trained, advantage_of)
        all_adv = [a for values in adv_by_harness.values() for a in values]
        all_rewards = [r for values in rewards_by_harness.values() for r in values]
        signal = any(u.advantage != 0 for u in units)

        # 4.-6. the optimizer steps: ppo_epochs passes of mini_batches mini-steps each, with no
        # generation step in between (the runner is done; paused() makes sure)
        update = None
        if signal:
            with self.policy.paused():
                self.policy.clear_cache()
                update = self._update(units, step)
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
                self.scheduler.observe(h, adv_by_harness[h], sketch)
        t_sched += time.perf_counter() - t0

        self.step += 1
        completion_tokens = sum(len(u.completion_ids) for u in units)
        return {
            "step": self.step,
            "harness": selection.harness or "mixed",
            "shares": {h: c / cfg.tasks_per_step for h, c in counts.items() if c},
            "sampling_seed": self.sampling.seed,
            "episodes": len(trajectories),
            "infra_errors": n_infra,
            "reward_mean": _mean(all_rewards),
            "reward_by_harness": {h: _mean(v) for h, v in rewards_by_harness.items()},
            "adv_abs_mean": _mean([abs(a) for a in all_adv]),
            "groups": n_groups,
            "groups_too_small": n_too_small,
            "zero_std_frac": n_flat / n_groups if n_groups else None,
            "probabilities": probabilities,
            "transfer": transfer,
            "units": len(units),
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
            "skipped": None if signal else ("all advantages are zero" if units else "no training units"),
            "lr": cfg.lr,
            "time": {
                "rollout": t_rollout,
                "backward": t_backward,
                "sketch": t_sketch,
                "optimizer": t_opt,
                "scheduler": t_sched,
                "total": time.perf_counter() - t_start,
            },
        }

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
        """
        cfg = self.config
        t0 = time.perf_counter()
        units, drift = self._recompute_old_logprobs(units)
        t_old = time.perf_counter() - t0
        batch_tokens = sum(len(u.completion_ids) for u in units)
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
            for mb in split_mini_batches(units, cfg.mini_batches, split_seed):
                t0 = time.perf_counter()
                self.optimizer.zero_grad(set_to_none=True)
                stats, n_active, active_tokens, padded = self._accumulate_gradient(mb)
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
                    part = self.sketcher.sketch_model(self.peft_model)
                    if len(mb) != len(units):  # its share of the batch's loss normaliser
                        if cfg.aggregation == "token-mean":
                            part = part * (sum(len(u.completion_ids) for u in mb) / batch_tokens)
                        else:
                            part = part * (len(mb) / len(units))
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
        fresh = [dataclasses.replace(u, old_logprobs=recomputed[id(u)]) if id(u) in recomputed else u for u in units]
        drift = {
            "rollout_logprob_diff_max": diff_max if tokens else None,
            "rollout_logprob_diff_mean": diff_sum / tokens if tokens else None,
        }
        return fresh, drift

    def _accumulate_gradient(self, units: list[TrainingUnit]) -> tuple[dict[str, float], int, int, int]:
        """Backward of the GRPO loss of `units` (one mini-batch), one micro-batch at a time.

        The micro-batch loss is weighted by its share of `units` (completion tokens for
        token-mean, sequences for seq-mean), so the accumulated gradient is that of the loss of
        all of `units`. The model stays in eval mode (no dropout). Returns the stats (loss;
        clip_fraction, ratio_mean, kl over the forwarded tokens), the number of units forwarded,
        their completion tokens and the padded tokens.
        """
        cfg = self.config
        total_tokens = sum(len(u.completion_ids) for u in units)
        total_units = len(units)
        active = units if cfg.kl_coef > 0 else [u for u in units if u.advantage != 0]
        pad_id = self.policy.pad_id
        sums = {"loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
        active_tokens = sum(len(u.completion_ids) for u in active)
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
            if not torch.isfinite(loss):
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

    # -- evaluation -----------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        """Mean score of every harness on the first eval_tasks dev tasks (one attempt each)."""
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
        trajectories = runner.run(make_jobs(tasks, self.specs, 1))
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
        if self.resume:
            truncate_jsonl(metrics_path, self.step)
            truncate_jsonl(eval_path, self.step)
        self.folder.start()  # config.json (again: --steps / --checkpoint-every may have changed)
        self._open_logs()

        if cfg.eval_every and self.step == 0:
            self._log_eval(eval_path, self.evaluate())
        last: dict[str, Any] = {}
        with _StepProgress(self.console, cfg.steps, self.step, enabled=self.progress) as bar:
            while self.step < cfg.steps:
                try:
                    record = self.train_step()
                except TrainingDiverged as e:
                    folder = self._checkpoint_folder()
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
                append_jsonl(metrics_path, record)
                self._tensorboard(record)
                bar.update(record)
                last = record
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                    self._log_eval(eval_path, self.evaluate())
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    self.save_checkpoint()
        if not (self.out / "checkpoint").exists():
            self.save_checkpoint()
        adapter = self.save_adapter()
        self.policy.close()  # the engine thread (a later use of the policy starts a new one)
        if self.tb is not None:
            self.tb.close()
        if self.store is not None:
            self.store.close()
        return {"steps": self.step, "adapter": str(adapter), "last": last}

    def _log_eval(self, path: Path, record: dict[str, Any]) -> None:
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
        if self.progress:
            self.console.print(text, highlight=False, markup=False)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class _StepProgress:
    """A rich bar on a terminal; a plain line per step otherwise (CI logs, `| tee`)."""

    def __init__(self, console, total: int, done: int, enabled: bool):
        self.console, self.total, self.enabled = console, total, enabled
        self.live = enabled and console.is_terminal
        self.bar = None
        self.done = done

    def __enter__(self):
        if self.live:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("[bold]step"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[harness]}"),
                TextColumn("reward {task.fields[reward]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bar.__enter__()
            self.task = self.bar.add_task("train", total=self.total, completed=self.done, harness="-", reward="-")
        return self

    def update(self, r: dict[str, Any]) -> None:
        reward = "-" if r["reward_mean"] is None else f"{r['reward_mean']:.3f}"
        if self.bar is not None:
            self.bar.update(self.task, completed=r["step"], harness=r["harness"], reward=reward)
        elif self.enabled:
            loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
            adv = "-" if r["adv_abs_mean"] is None else f"{r['adv_abs_mean']:.3f}"
            self.console.print(
                f"step {r['step']}/{self.total}  {r['harness']}  reward {reward}  |A| {adv}  loss {loss}  "
                f"{'update' if r['optimizer_step'] else 'skipped'}  {r['time']['total']:.1f} s",
                highlight=False,
                markup=False,
            )

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


# ------------------------------------------------------------------------------------- validation


def _check_model_spec(model: str) -> None:
    from harnessrl.models import MODEL_NAMES

    if model in MODEL_NAMES:
        return
    if model.startswith("hf:"):
        if not model[3:] or not Path(model[3:]).expanduser().exists():
            raise TrainError(f"model path '{model[3:]}' does not exist")
        return
    raise TrainError(f"cannot train '{model}': training needs a local model ({', '.join(MODEL_NAMES)} or hf:PATH)")
