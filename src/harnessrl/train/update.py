"""The optimizer steps of one GRPO rollout batch: old log-probs recomputed, then ppo_epochs passes
of mini_batches mini-steps, each accumulated over micro-batches, sketched, clipped and stepped.

    update_policy(ctx, units, step)
        recompute_old_logprobs              no-grad teacher-forced pass on the sampling weights; the
                                            sampler's log-probs are kept and compared (RolloutMismatch);
                                            with one pass of one mini-batch (the default) there is
                                            one optimizer step, on those same weights: the loss's
                                            own forward gives the old log-probs, and no pass is added
        for each epoch, for each mini-batch:
            accumulate_gradient             micro-batches -> token_logprobs -> grpo_loss -> backward
                                            (--rollout-correction tis: truncated_is_weights in the loss;
                                            --share-prefixes: what the rows of a micro-batch share
                                            forwarded once, `harnessrl.train.prefix_share`)
            (several processes: all_reduce_gradient sums the LoRA gradient)
            sketch (first pass only), clip, AdamW step

Everything the update needs is in one `UpdateContext` (the model, its trainable LoRA weights, the
optimizer, the sketcher, the processes, the device); the result is one typed `UpdateResult`. The
trainer's module docstring says why the old log-probs are recomputed and why the model stays in
eval mode; this module is the code of those rules.

On a CPU the update takes every core of the process's share (`update_threads`, `cores_for_update`)
where nothing else runs beside it: the engine leaves one core to the episodes while they run, but
in a synchronous step they have all finished before the update starts. On the embedded model on
2 idle cores the LoRA update took 1.7x less time on 2 threads than on 1 (docs/BENCHMARKS.md,
"Threads and the OpenMP wait policy"). A thread count the user set ($HARNESSRL_THREADS) is kept;
$HARNESSRL_UPDATE_THREADS sets the update's own.

Gradient accumulation reproduces the mini-batch loss exactly: each micro-batch's loss (a mean over
its own tokens, or sequences for "seq-mean") is weighted by its share of the mini-batch's
completion tokens (or sequences). With the KL term off, units whose advantage is exactly 0 have
zero gradient, so they are not forwarded at all; they still count in the normaliser.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch

from harnessrl.errors import JobFailed
from harnessrl.train.config import TrainConfig
from harnessrl.train.distributed import local_mini_batches
from harnessrl.train.grpo import (
    Aggregation,
    TISLevel,
    TrainingUnit,
    grpo_loss,
    pad_units,
    token_logprobs,
    truncated_is_weights,
)
from harnessrl.train.packing import packed_rows, pad_packed
from harnessrl.train.prefix_share import plan_of, shared_micro_batches, shared_token_logprobs, supports
from harnessrl.train.progress import mean
from harnessrl.train.sketch import GradientSketch

UPDATE_THREADS_ENV = "HARNESSRL_UPDATE_THREADS"


def update_threads(
    config: TrainConfig,
    threads_set: int | None,
    cpus_per_process: int | None,
    cpus: int,
    device: str = "cpu",
    env: Mapping[str, str] | None = None,
) -> int | None:
    """The torch threads of the update, or None to keep the engine's count.

    $HARNESSRL_UPDATE_THREADS, a count, wins. Else: `threads_set`, the count the user set for the
    engine (EngineConfig.threads from $HARNESSRL_THREADS or the engine options), is kept as given;
    `cpus_per_process` is each process's share of the machine when several processes share it
    (`Distributed.cpus_per_process`), else `cpus` (the CPUs this process may run on). The update
    takes the whole share only where no rollout runs beside it: with --max-off-policy-steps the next
    steps' rollouts are collected during the update (on servers that may share the machine), so the
    count stays. On another device the threads do not matter."""
    env = os.environ if env is None else env
    given = env.get(UPDATE_THREADS_ENV, "").strip()
    if given:
        try:
            count = int(given)
        except ValueError:
            count = 0
        if count < 1:
            raise ValueError(f"{UPDATE_THREADS_ENV} must be a number of threads (1 or more), got {given!r}")
        return count
    if device != "cpu" or threads_set is not None or config.max_off_policy_steps > 0:
        return None
    share = cpus_per_process if cpus_per_process is not None else cpus
    return share if share > torch.get_num_threads() else None


@contextlib.contextmanager
def cores_for_update(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` for the block (None: unchanged), restored after."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _aggregation(cfg: TrainConfig) -> Aggregation:
    """cfg.aggregation as its Literal type (TrainConfig's validator admits only these values)."""
    return cast(Aggregation, cfg.aggregation)


def _tis_level(cfg: TrainConfig) -> TISLevel:
    """cfg.tis_level as its Literal type (TrainConfig's validator admits only these values)."""
    return cast(TISLevel, cfg.tis_level)


class TrainingDiverged(JobFailed):
    """The loss or the gradient became NaN / inf: training stopped, the last checkpoint is intact."""


def micro_batches(
    units: list[TrainingUnit], max_tokens: int, pack: bool = False, share: bool = False
) -> list[list[TrainingUnit]]:
    """Pack units into micro-batches of at most `max_tokens` padded tokens (rows x longest row).

    Longest first, so a batch's width is set by its first row; a row longer than the budget goes
    alone. A row is one unit, or with `pack` the units `packed_rows` puts in one (they stay in
    one micro-batch). With `share` the rows that share prefixes go together and the budget is of
    the tokens their shared forward runs, each shared token once
    (`harnessrl.train.prefix_share.shared_micro_batches`). Deterministic for a given list.
    """
    if share:
        return shared_micro_batches(units, max_tokens, pack)
    if pack:
        rows = [[units[i] for i in members] for members in packed_rows(units)]
    else:
        rows = [[u] for u in units]
    order = sorted(rows, key=lambda row: len(row[0].prompt_ids) + len(row[0].completion_ids), reverse=True)
    batches: list[list[TrainingUnit]] = []
    current: list[TrainingUnit] = []
    width = n_rows = 0
    for row in order:
        n = len(row[0].prompt_ids) + len(row[0].completion_ids)
        if current and max(width, n) * (n_rows + 1) > max_tokens:
            batches.append(current)
            current, width, n_rows = [], 0, 0
        current.extend(row)
        width, n_rows = max(width, n), n_rows + 1
    if current:
        batches.append(current)
    return batches


def padded_batch(
    units: list[TrainingUnit], pad_id: int, device: torch.device | str | None, pack: bool = False
) -> dict[str, torch.Tensor]:
    """`pad_units` (with `pack`: `pad_packed`, the units of an episode sharing rows) with every
    tensor on the model's device (the loss compares them with its log-probs)."""
    batch = pad_packed(units, pad_id) if pack else pad_units(units, pad_id)
    if device is None:
        return batch
    return {k: v.to(device) for k, v in batch.items()}


@dataclass
class UpdateContext:
    """What the optimizer steps read and change: the LoRA model, its trainable weights and their
    optimizer, the gradient sketcher, the processes (`harnessrl.train.distributed.Distributed`)."""

    config: TrainConfig
    model: Any  # the peft model
    trainable: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    sketcher: GradientSketch
    dist: Any
    pad_id: int

    @property
    def device(self) -> torch.device:
        return self.trainable[0].device if self.trainable else torch.device("cpu")

    @property
    def shares(self) -> bool:
        """Whether the rows of a micro-batch forward what they share once
        (`harnessrl.train.prefix_share`): --share-prefixes (the default), on a model whose forward
        can (`supports`). Exact for every loss: the rows themselves do not change."""
        return self.config.share_prefixes and supports(self.model)

    def logprobs(self, batch: dict[str, torch.Tensor], shared: bool) -> torch.Tensor:
        """`token_logprobs` of a micro-batch at the run temperature, in float32 (the loss's dtype,
        whatever the model computes in); with `shared`, its rows forwarded as a tree
        (`shared_token_logprobs`)."""
        if shared:
            return shared_token_logprobs(self.model, batch, temperature=self.config.temperature).float()
        return token_logprobs(self.model, batch, temperature=self.config.temperature).float()

    def forwarded(self, batch: dict[str, torch.Tensor], shared: bool) -> int:
        """The tokens a micro-batch's forward runs, padding included."""
        return plan_of(batch).forwarded if shared else batch["input_ids"].numel()

    @property
    def packs(self) -> bool:
        """Whether an episode's calls share rows (`harnessrl.train.packing`): for a loss that is
        a sum over tokens (token-mean, no sequence-level TIS), where that changes nothing."""
        cfg = self.config
        return cfg.aggregation == "token-mean" and not (cfg.rollout_correction == "tis" and cfg.tis_level == "sequence")

    def active(self, units: list[TrainingUnit]) -> list[TrainingUnit]:
        """The units the loss forwards: all with the KL term on, else those with a nonzero advantage."""
        return units if self.config.kl_coef > 0 else [u for u in units if u.advantage != 0]


@dataclass
class UpdateResult:
    """One batch's optimizer steps. `UpdateResult()` is the step that took none (no signal).

    loss is the mean over mini-steps; clip_fraction / ratio_mean / kl are over every trained token
    of every pass; grad_norm is the mean of the mini-steps' norms before clipping; units_trained
    counts the first pass, padded_tokens all passes; the sketch is of the first pass's gradient.
    rollout_* and tis_* compare the sampler with the trainer before the first step (`RolloutMismatch`)."""

    loss: float | None = None
    clip_fraction: float | None = None
    ratio_mean: float | None = None
    kl: float | None = None
    clip_fraction_by_epoch: list[float | None] | None = None
    grad_norm: float | None = None
    optimizer_steps: int = 0
    units_trained: int = 0
    padded_tokens: int = 0
    sketch: torch.Tensor | None = None
    rollout_logprob_diff_max: float | None = None
    rollout_logprob_diff_mean: float | None = None
    # the sampler against the trainer on the trained tokens (`RolloutMismatch`); tis_* only with
    # --rollout-correction tis
    rollout_log_ratio_mean: float | None = None
    rollout_kl_mean: float | None = None
    rollout_kl_max: float | None = None
    rollout_mismatch_frac: float | None = None
    tis_weight_mean: float | None = None
    tis_capped_frac: float | None = None
    time_backward: float = 0.0
    time_sketch: float = 0.0
    time_optimizer: float = 0.0


def update_policy(ctx: UpdateContext, units: list[TrainingUnit], step: int) -> UpdateResult:
    """The optimizer steps of one rollout batch: ppo_epochs passes, each of mini_batches mini-steps.

    Every mini-step's loss compares the current log-probs with the old ones, recomputed here first
    under the weights that sampled the batch (`recompute_old_logprobs`), so from the second
    mini-step on the ratio moves away from 1 and the clip acts. With --rollout-correction tis each
    token's policy-gradient term is weighted by its truncated importance weight trainer / sampler
    (`truncated_is_weights`; the same weights in every pass). The sketch is of the first pass's
    gradients, each mini-batch's weighted by its share of the batch: the whole batch's gradient at
    the sampling policy when there is one mini-batch (each later mini-batch's is taken where the
    earlier mini-steps left the weights). Mini-batches whose units all have advantage 0 (KL off)
    have no gradient: no step.

    Several processes: `units` are this process's; the batch is every process's units in rank
    order. Each mini-batch is the one-process mini-batch (`local_mini_batches`), its loss is
    normalised by the whole mini-batch's tokens (or units), and the gradient is summed over the
    processes before the sketch, the clip and the step: every process takes the step one process
    would have taken on the whole batch (up to float rounding).
    """
    cfg, dist = ctx.config, ctx.dist
    t0 = time.perf_counter()
    # one optimizer step on the weights that sampled the batch: its forward gives the old log-probs
    running = MismatchSums(cfg) if cfg.ppo_epochs == 1 and cfg.mini_batches == 1 else None
    if running is None:
        units, mismatch = recompute_old_logprobs(ctx, units)
    t_old = time.perf_counter() - t0
    sizes = dist.all_gather_object((len(units), sum(len(u.completion_ids) for u in units)))
    n_units, batch_tokens = sum(n for n, _ in sizes), sum(t for _, t in sizes)
    offset = sum(n for n, _ in sizes[: dist.rank])  # where this process's units start in the batch
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
            ctx.optimizer.zero_grad(set_to_none=True)
            totals = global_totals(ctx, mb) if dist.enabled else None
            if totals is not None and not totals[2]:
                continue  # no process has a trainable unit in this mini-batch
            stats, n_active, active_tokens, padded = accumulate_gradient(ctx, mb, step, totals, running)
            if totals is not None:
                stats, n_active, padded = all_reduce_gradient(ctx, stats, n_active, padded, step)
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
                part = ctx.sketcher.sketch_model(ctx.model)  # of the summed gradient
                mb_tokens, mb_units = totals[:2] if totals else (sum(len(u.completion_ids) for u in mb), len(mb))
                if mb_units != n_units:  # its share of the batch's loss normaliser
                    if cfg.aggregation == "token-mean":
                        part = part * (mb_tokens / batch_tokens)
                    else:
                        part = part * (mb_units / n_units)
                sketch = part if sketch is None else sketch + part
                t_sketch += time.perf_counter() - t0

            t0 = time.perf_counter()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(ctx.trainable, max_norm))
            if not math.isfinite(grad_norm):
                ctx.optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(f"step {step + 1}: the gradient norm is {grad_norm}")
            ctx.optimizer.step()
            ctx.optimizer.zero_grad(set_to_none=True)
            grad_norms.append(grad_norm)
            t_opt += time.perf_counter() - t0
        clip_by_epoch.append(epoch_clip / epoch_tokens if epoch_tokens else None)
    if running is not None:
        mismatch = running.result(dist)
    per_token = {key: token_sums[key] / trained_tokens if trained_tokens else None for key in token_sums}
    return UpdateResult(
        loss=mean(losses),
        clip_fraction=per_token["clip_fraction"],
        ratio_mean=per_token["ratio_mean"],
        kl=per_token["kl"],
        clip_fraction_by_epoch=clip_by_epoch,
        grad_norm=mean(grad_norms),
        optimizer_steps=len(grad_norms),
        units_trained=units_trained,
        padded_tokens=padded_tokens,
        sketch=sketch,
        rollout_logprob_diff_max=mismatch.logprob_diff_max,
        rollout_logprob_diff_mean=mismatch.logprob_diff_mean,
        rollout_log_ratio_mean=mismatch.log_ratio_mean,
        rollout_kl_mean=mismatch.kl_mean,
        rollout_kl_max=mismatch.kl_max,
        rollout_mismatch_frac=mismatch.mismatch_frac,
        tis_weight_mean=mismatch.tis_weight_mean,
        tis_capped_frac=mismatch.tis_capped_frac,
        time_backward=t_backward + t_old,
        time_sketch=t_sketch,
        time_optimizer=t_opt,
    )


@dataclass
class RolloutMismatch:
    """How far the sampler's distribution was from the trainer's, on the tokens the update trains.

    Per sampled completion token y_t (drawn from the sampler), with
    log r_t = log p_trainer(y_t) - log p_sampler(y_t) (the trainer's recomputed old log-prob
    minus the rollout's recorded one, both at the run temperature):

        logprob_diff_max / _mean   max / mean of |log r_t|
        log_ratio_mean             mean of log r_t (its negative is the k1 estimate of
                                   KL(sampler || trainer): unbiased, but of either sign per token)
        kl_mean / kl_max           mean / max of k3_t = r_t - 1 - log r_t: on tokens drawn from the
                                   sampler E[r - 1] = 0, so the mean is an unbiased estimate of
                                   KL(sampler || trainer) per token, and every k3_t >= 0
        mismatch_frac              share of tokens with |log r_t| > log(mismatch_ratio): the
                                   trainer finds the token over mismatch_ratio times more (or less)
                                   likely than the sampler did
        tis_weight_mean            mean TIS weight over the tokens (`truncated_is_weights`, a
                                   sequence's weight counted on each of its tokens)
        tis_capped_frac            share of tokens whose weight is the cap

    Over every process's trained units. Everything None when no token was trained; the tis_*
    values also without --rollout-correction tis. Float32 sampling by the trainer's own weights
    gives values around 1e-6 (engine rounding); an int8 / bf16 / 4-bit sampler does not.
    """

    logprob_diff_max: float | None = None
    logprob_diff_mean: float | None = None
    log_ratio_mean: float | None = None
    kl_mean: float | None = None
    kl_max: float | None = None
    mismatch_frac: float | None = None
    tis_weight_mean: float | None = None
    tis_capped_frac: float | None = None


def recompute_old_logprobs(ctx: UpdateContext, units: list[TrainingUnit]) -> tuple[list[TrainingUnit], RolloutMismatch]:
    """The units with their old log-probs recomputed by a no-grad teacher-forced pass on the
    current weights (the weights that sampled them, up to the sampling engine's precision), the
    sampler's own log-probs kept beside them (`TrainingUnit.sampler_logprobs`), and how far the
    two were apart (`RolloutMismatch`).

    Only the units the loss will forward are recomputed; the others keep the rollout's numbers,
    which nothing reads. Same micro-batches as the loss, in eval mode (no dropout); the order of
    the units is kept."""
    mismatch = MismatchSums(ctx.config)
    recomputed: dict[int, list[float]] = {}
    ctx.model.eval()
    shared = ctx.shares
    with torch.no_grad():
        for mb in micro_batches(ctx.active(units), ctx.config.micro_batch, ctx.packs, shared):
            batch = padded_batch(mb, ctx.pad_id, ctx.device, ctx.packs)
            logprobs = ctx.logprobs(batch, shared)
            mismatch.add(logprobs, batch)
            for u, row in zip(mb, batch["unit_rows"].tolist()):
                p, c = len(u.prompt_ids), len(u.completion_ids)
                recomputed[id(u)] = logprobs[row, p : p + c].tolist()
    fresh = [
        dataclasses.replace(u, old_logprobs=recomputed[id(u)], sampler_logprobs=u.sampled_logprobs())
        if id(u) in recomputed
        else u
        for u in units
    ]
    return fresh, mismatch.result(ctx.dist)


class MismatchSums:
    """RolloutMismatch summed over micro-batches: `add` each micro-batch's trainer log-probs (the
    old ones: the weights that sampled it) beside its batch, then `result` over every process."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.tis = cfg.rollout_correction == "tis"
        self.log_threshold = math.log(cfg.mismatch_ratio)
        # tokens, then sums (|log r|, log r, k3, tokens over the threshold, TIS weight, capped
        # tokens) and maxima (|log r|, k3)
        self.tokens, self.sums, self.maxima = 0, [0.0] * 6, [0.0, 0.0]

    def add(self, logprobs: torch.Tensor, batch: dict[str, torch.Tensor]) -> None:
        mask = batch["completion_mask"] > 0
        # float64, and expm1 for r - 1: k3 of a ~1e-7 log-ratio is ~1e-14, not float32 noise
        log_r = (logprobs.detach().double() - batch["sampler_logprobs"].double())[mask]
        k3 = (torch.expm1(log_r) - log_r).clamp(min=0.0)
        self.tokens += int(mask.sum())
        self.sums[0] += float(log_r.abs().sum())
        self.sums[1] += float(log_r.sum())
        self.sums[2] += float(k3.sum())
        self.sums[3] += float((log_r.abs() > self.log_threshold).sum())
        self.maxima[0] = max(self.maxima[0], float(log_r.abs().max()))
        self.maxima[1] = max(self.maxima[1], float(k3.max()))
        if self.tis:
            weights, capped = truncated_is_weights(
                logprobs.detach(),
                batch["sampler_logprobs"],
                batch["completion_mask"],
                self.cfg.tis_cap,
                _tis_level(self.cfg),
            )
            self.sums[4] += float(weights[mask].double().sum())
            self.sums[5] += float(capped.sum())

    def result(self, dist: Any) -> RolloutMismatch:
        """The mismatch over every process's added tokens (a collective call with several)."""
        tokens, sums, maxima = self.tokens, self.sums, self.maxima
        if dist.enabled:
            parts = dist.all_gather_object((tokens, sums, maxima))
            tokens = sum(part[0] for part in parts)
            sums = [sum(part[1][i] for part in parts) for i in range(len(sums))]
            maxima = [max(part[2][i] for part in parts) for i in range(len(maxima))]
        if not tokens:
            return RolloutMismatch()
        return RolloutMismatch(
            logprob_diff_max=maxima[0],
            logprob_diff_mean=sums[0] / tokens,
            log_ratio_mean=sums[1] / tokens,
            kl_mean=sums[2] / tokens,
            kl_max=maxima[1],
            mismatch_frac=sums[3] / tokens,
            tis_weight_mean=sums[4] / tokens if self.tis else None,
            tis_capped_frac=sums[5] / tokens if self.tis else None,
        )


def accumulate_gradient(
    ctx: UpdateContext,
    units: list[TrainingUnit],
    step: int = 0,
    totals: tuple[int, int, int] | None = None,
    mismatch: MismatchSums | None = None,
    times: dict[str, float] | None = None,
) -> tuple[dict[str, float], int, int, int]:
    """Backward of the GRPO loss of `units` (one mini-batch), one micro-batch at a time.

    The micro-batch loss is weighted by its share of `units` (completion tokens for token-mean,
    sequences for seq-mean), so the accumulated gradient is that of the loss of all of `units`.
    The model stays in eval mode (no dropout). Returns the stats (loss; clip_fraction, ratio_mean,
    kl over the forwarded tokens), the number of units forwarded, their completion tokens and the
    padded tokens. `step` (0-based) only names the step in a divergence message.

    `totals`: (completion tokens, units, trained completion tokens) of the whole mini-batch when
    `units` are only this process's part of it (`global_totals`): the shares are then of the
    whole, and the processes' sums add up to the whole mini-batch's gradient and stats.

    `mismatch`: the batch's only optimizer step (one pass, one mini-batch), taken on the weights
    that sampled it: the old log-probs are this forward's own, detached (what
    `recompute_old_logprobs` would have computed in a pass of its own), and each micro-batch's
    sampler-against-trainer gap is added to `mismatch`.

    `times`: where given, the seconds of the forwards (log-probs, the reference's included) and
    of the backward passes are added under "forward" and "backward".
    """
    cfg = ctx.config
    active = ctx.active(units)
    if totals is None:
        total_tokens = sum(len(u.completion_ids) for u in units)
        total_units = len(units)
        active_tokens = sum(len(u.completion_ids) for u in active)
    else:
        total_tokens, total_units, active_tokens = totals
    sums = {"loss": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "kl": 0.0}
    padded = 0
    ctx.model.eval()  # whatever mode something left it in: no dropout in these log-probs
    shared = ctx.shares
    clock = {"forward": 0.0, "backward": 0.0}
    for mb in micro_batches(active, cfg.micro_batch, ctx.packs, shared):
        batch = padded_batch(mb, ctx.pad_id, ctx.device, ctx.packs)
        padded += ctx.forwarded(batch, shared)
        t0 = time.perf_counter()
        logprobs = ctx.logprobs(batch, shared)
        if mismatch is not None:
            batch["old_logprobs"] = logprobs.detach() * batch["completion_mask"]
            mismatch.add(logprobs, batch)
        ref = None
        if cfg.kl_coef > 0:
            with torch.no_grad(), ctx.model.disable_adapter():
                ref = ctx.logprobs(batch, shared)
        clock["forward"] += time.perf_counter() - t0
        pg_weights = None
        if cfg.rollout_correction == "tis":  # the sampler is not the trainer: reweight its tokens
            pg_weights, _ = truncated_is_weights(
                batch["old_logprobs"], batch["sampler_logprobs"], batch["completion_mask"], cfg.tis_cap, _tis_level(cfg)
            )
        loss, stats = grpo_loss(
            logprobs,
            batch["old_logprobs"].float(),
            batch["advantages"].float(),
            batch["completion_mask"].float(),
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            aggregation=_aggregation(cfg),
            ref_logprobs=ref,
            kl_coef=cfg.kl_coef,
            pg_weights=pg_weights,
        )
        # (with several processes the others wait for this gradient: a non-finite loss goes into
        # the summed loss instead, and every process stops there, in `all_reduce_gradient`)
        if not torch.isfinite(loss) and totals is None:
            ctx.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(f"step {step + 1}: the loss is {float(loss.detach())}")
        mb_tokens = sum(len(u.completion_ids) for u in mb)
        weight = mb_tokens / total_tokens if cfg.aggregation == "token-mean" else len(mb) / total_units
        t0 = time.perf_counter()
        (loss * weight).backward()
        clock["backward"] += time.perf_counter() - t0
        sums["loss"] += float(loss.detach()) * weight
        share = mb_tokens / active_tokens  # the per-token stats, over the trained tokens
        for key in ("clip_fraction", "ratio_mean", "kl"):
            sums[key] += stats[key] * share
    if times is not None:
        for key, seconds in clock.items():
            times[key] = times.get(key, 0.0) + seconds
    return sums, len(active), active_tokens, padded


def global_totals(ctx: UpdateContext, units: list[TrainingUnit]) -> tuple[int, int, int]:
    """(completion tokens, units, trained completion tokens) of a mini-batch over every process."""
    active = ctx.active(units)
    counts = [sum(len(u.completion_ids) for u in units), len(units), sum(len(u.completion_ids) for u in active)]
    totals = ctx.dist.all_reduce_(torch.tensor(counts, dtype=torch.int64))
    return int(totals[0]), int(totals[1]), int(totals[2])


def all_reduce_gradient(
    ctx: UpdateContext, stats: dict[str, float], n_active: int, padded: int, step: int
) -> tuple[dict, int, int]:
    """Sum the LoRA gradient, the stats, the forwarded units and the padded tokens of one
    mini-batch over the processes (one flat buffer for the gradient). Every process gets the same
    sums, so the sketch, the clip and the optimizer step that follow are the same everywhere. A
    non-finite summed loss stops every process here."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in ctx.trainable]
    flat = ctx.dist.all_reduce_(torch.cat([g.reshape(-1) for g in grads]))
    start = 0
    for p in ctx.trainable:
        p.grad = flat[start : start + p.numel()].view_as(p)
        start += p.numel()
    keys = ("loss", "clip_fraction", "ratio_mean", "kl")
    sums = ctx.dist.all_reduce_(torch.tensor([*(stats[k] for k in keys), n_active, padded], dtype=torch.float64))
    stats = dict(zip(keys, sums[:4].tolist()))
    if not math.isfinite(stats["loss"]):
        ctx.optimizer.zero_grad(set_to_none=True)
        raise TrainingDiverged(f"step {step + 1}: the loss is {stats['loss']}")
    return stats, int(sums[4]), int(sums[5])
