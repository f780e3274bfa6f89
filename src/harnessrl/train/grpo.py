"""GRPO: group-relative advantages and the clipped policy-gradient loss.

One optimizer step, read top to bottom:

    rewards [G, n]  --group_advantages-->  one advantage per episode
    trajectories    --units_from_trajectories-->  one TrainingUnit per model call
    units           --pad_units-->  input_ids, attention_mask, completion_mask, old_logprobs,
                                    sampler_logprobs, advantages
    model, batch    --token_logprobs-->  log pi(token) for every completion token
    old, sampler    --truncated_is_weights-->  optional per-token weights (rollout-trainer mismatch)
    everything      --grpo_loss-->  scalar loss (and a few numbers to log)

Training units are per model call, not per episode: each call's (prompt ids, completion ids,
logprobs) is exactly what the policy saw and sampled, so a harness whose history window drops
old turns (the next prompt is not an extension of this one) is trained on what really happened,
and tool output never needs masking because it only ever appears inside prompts. Every call of
an episode carries that episode's advantage. Token ids come from the rollout as they were
sampled: nothing here re-tokenizes text.

Tensor layout. A row is prompt + completion, right-padded to the longest row (the update may
also put several calls of one episode in one row: `harnessrl.train.packing`). Per-token tensors
([B, T]) are aligned with input positions: column t of `logprobs` / `old_logprobs` holds
log pi(input_ids[t] | input_ids[:t]) when t is a completion position (completion_mask[t] == 1)
and 0 elsewhere.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
from torch import Tensor

from harnessrl.types import Trajectory

T = TypeVar("T")

Aggregation = Literal["token-mean", "seq-mean"]  # TrainConfig.aggregation
TISLevel = Literal["token", "sequence"]  # TrainConfig.tis_level


def group_advantages(rewards: Tensor, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """Advantage of each episode relative to the other episodes of its group (same task).

        A[g, i] = (r[g, i] - mean_g) / (std_g + eps)     scale=True (GRPO)
        A[g, i] =  r[g, i] - mean_g                      scale=False (Dr. GRPO: no std division)

    rewards: [G groups, n episodes per group]. std_g is the population standard deviation
    (unbiased=False, divide by n): the group is the whole population being compared, and a
    group of one then has std 0 rather than NaN. A group whose rewards are all equal carries no
    signal; its advantages are exactly 0 (set explicitly, so float round-off in the mean can
    never turn into a huge advantage after dividing by eps). Groups of different sizes (after
    infra errors are dropped): call once per group with a [1, n] tensor.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, n], got shape {tuple(rewards.shape)}")
    rewards = rewards.float()
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if scale:
        centered = centered / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)
    flat = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centered), centered)


@dataclass
class TrainingUnit:
    """One model call to train on: the exact tokens seen and sampled, and its episode's advantage."""

    prompt_ids: list[int]
    completion_ids: list[int]
    # log-prob of each completion token under the policy the ratio is taken against: the sampler's
    # as recorded by the rollout, replaced by the trainer's own recomputation before the update
    # (`harnessrl.train.update.recompute_old_logprobs`)
    old_logprobs: list[float]
    advantage: float
    harness: str
    episode_id: str
    # The sampler's own log-probs, kept when old_logprobs are replaced by the trainer's: the engine
    # that sampled (bf16 vLLM, int8, a 4-bit llama.cpp) is never exactly the float32 trainer, and
    # the gap is measured and optionally corrected (truncated importance sampling). Where the
    # sampling shaped the distribution (penalties, min_p, top_k, top_p) they are the log-probs of
    # the distribution each token was drawn from (ModelCall.sampled_logprobs), not the tempered
    # ones. None: the old_logprobs are still the sampler's (and are that distribution's).
    sampler_logprobs: list[float] | None = None

    def sampled_logprobs(self) -> list[float]:
        """The sampler's log-prob of each completion token, whether or not old_logprobs were recomputed."""
        return self.old_logprobs if self.sampler_logprobs is None else self.sampler_logprobs


def units_from_trajectories(
    trajectories: Iterable[Trajectory], advantages_by_episode: Mapping[str, float]
) -> list[TrainingUnit]:
    """One TrainingUnit per model call, each with its episode's advantage.

    Skipped: infrastructure-error episodes (they say nothing about the policy) and calls with no
    completion ids (nothing was sampled, e.g. a backend error or a text-only API). A valid
    episode missing from `advantages_by_episode` is a bug in the caller: KeyError.
    """
    units = []
    for traj in trajectories:
        if traj.is_infra_error:
            continue
        if traj.episode_id not in advantages_by_episode:
            raise KeyError(f"no advantage for episode {traj.episode_id!r} (task {traj.task_id!r})")
        advantage = float(advantages_by_episode[traj.episode_id])
        for step in traj.steps:
            call = step.model_call
            if not call.completion_ids:
                continue
            if len(call.logprobs) != len(call.completion_ids):
                raise ValueError(
                    f"episode {traj.episode_id!r} step {step.index}: {len(call.completion_ids)} completion ids "
                    f"but {len(call.logprobs)} logprobs"
                )
            sampled = call.sampled_logprobs
            if sampled is not None and len(sampled) != len(call.completion_ids):
                raise ValueError(
                    f"episode {traj.episode_id!r} step {step.index}: {len(call.completion_ids)} completion ids "
                    f"but {len(sampled)} sampled_logprobs"
                )
            units.append(
                TrainingUnit(
                    prompt_ids=list(call.prompt_ids),
                    completion_ids=list(call.completion_ids),
                    old_logprobs=list(call.logprobs),
                    advantage=advantage,
                    harness=traj.harness,
                    episode_id=traj.episode_id,
                    # the distribution the tokens were drawn from, where shaping made it another
                    sampler_logprobs=list(sampled) if sampled is not None else None,
                )
            )
    return units


def check_units(units: list[TrainingUnit]) -> None:
    """ValueError unless every unit can be padded into a batch: a non-empty prompt, at least one
    completion token, and one old and one sampler log-prob per completion token."""
    if not units:
        raise ValueError("no training units to pad")
    for u in units:
        if not u.prompt_ids:  # the first completion token needs at least one token of context
            raise ValueError(f"episode {u.episode_id!r}: a training unit needs a non-empty prompt")
        if not u.completion_ids or len(u.old_logprobs) != len(u.completion_ids):
            raise ValueError(f"episode {u.episode_id!r}: need one old logprob per completion token (and >= 1 token)")
        if len(u.sampled_logprobs()) != len(u.completion_ids):
            raise ValueError(f"episode {u.episode_id!r}: need one sampler logprob per completion token")


def pad_units(units: list[TrainingUnit], pad_id: int) -> dict[str, Tensor]:
    """Right-pad prompt + completion of each unit into one batch, a row per unit.

    Returns input_ids [B, T] (long), attention_mask [B, T] (1 on real tokens), completion_mask
    [B, T] (1 on completion tokens only), old_logprobs and sampler_logprobs [B, T] (at the
    completion positions, 0 elsewhere; sampler_logprobs equal old_logprobs for a unit whose
    old_logprobs were never recomputed, `TrainingUnit.sampled_logprobs`), advantages [B] and
    unit_rows [B] (the row of each unit: here its own; `harnessrl.train.packing` puts several
    units in one row, through `pad_rows`).
    Right padding keeps every real token at position = its index, which is what the model saw
    during generation (HF derives positions from the attention mask under the left padding it
    uses there).
    """
    return pad_rows(units, [[i] for i in range(len(units))], pad_id)


def pad_rows(units: list[TrainingUnit], rows: list[list[int]], pad_id: int) -> dict[str, Tensor]:
    """`pad_units` with the units (by index) in the given rows: each row holds the tokens of its
    first unit, and every unit of the row must be a prefix of them (its completion is read at its
    own positions, prompt length onwards); advantages [R] are the first units'."""
    check_units(units)
    leads = [units[members[0]] for members in rows]
    T = max(len(u.prompt_ids) + len(u.completion_ids) for u in leads)
    R = len(rows)
    input_ids = torch.full((R, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((R, T), dtype=torch.long)
    completion_mask = torch.zeros((R, T), dtype=torch.float)
    old_logprobs = torch.zeros((R, T), dtype=torch.float)
    sampler_logprobs = torch.zeros((R, T), dtype=torch.float)
    unit_rows = torch.zeros(len(units), dtype=torch.long)
    for row, (lead, members) in enumerate(zip(leads, rows)):
        n = len(lead.prompt_ids) + len(lead.completion_ids)
        input_ids[row, :n] = torch.tensor(lead.prompt_ids + lead.completion_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        for i in members:
            u = units[i]
            p, c = len(u.prompt_ids), len(u.completion_ids)
            completion_mask[row, p : p + c] = 1.0
            old_logprobs[row, p : p + c] = torch.tensor(u.old_logprobs, dtype=torch.float)
            sampler_logprobs[row, p : p + c] = torch.tensor(u.sampled_logprobs(), dtype=torch.float)
            unit_rows[i] = row
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "old_logprobs": old_logprobs,
        "sampler_logprobs": sampler_logprobs,
        "advantages": torch.tensor([u.advantage for u in leads], dtype=torch.float),
        "unit_rows": unit_rows,
    }


def token_logprobs(model, batch: Mapping[str, Tensor], temperature: float = 1.0) -> Tensor:
    """Teacher-forced log pi(token) of every completion token: [B, T], aligned with completion_mask.

        logp[b, t] = log_softmax(logits[b, t - 1] / temperature)[input_ids[b, t]]   (completion t)
        logp[b, t] = 0                                                             (elsewhere)

    The logits at position t - 1 predict the token at t. Dividing by the sampling temperature
    makes these comparable with the rollout's logprobs (which the policy records as
    log softmax(z / T); see models/hf.py). Computed as gathered logit minus logsumexp, so no
    [B, T, V] log-softmax tensor is kept beside the logits. Gradients flow (call under
    torch.no_grad() for reference / old log-probs).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (use 1.0 for greedy rollouts), got {temperature}")
    input_ids = batch["input_ids"].to(next(model.parameters()).device)
    attention_mask = batch["attention_mask"].to(input_ids.device)
    completion_mask = batch["completion_mask"].to(input_ids.device)
    B, T = input_ids.shape
    # Logits are needed only where a completion token is predicted: run the decoder, then the
    # output head on those positions alone. Prompts are most of each sequence, and [B, T, V]
    # logits over a 49k vocabulary would be most of the memory and time of a backward pass.
    rows, cols = completion_mask[:, 1:].nonzero(as_tuple=True)  # hidden state at cols predicts cols + 1
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps the model
    # (no key/value cache: nothing reads it, and a checkpointed layer would write it twice)
    with checkpointing_forward(base):
        if plain_output_head(base):
            hidden = base.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
            logits = base.get_output_embeddings()(hidden[rows, cols]).float() / temperature
        else:  # a model that post-processes its logits (soft-capping, scaling): use its own forward
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
            logits = out.logits[rows, cols].float() / temperature
    targets = input_ids[rows, cols + 1]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    logp = torch.zeros((B, T), dtype=picked.dtype, device=input_ids.device).index_put((rows, cols + 1), picked)
    return logp * completion_mask


@contextlib.contextmanager
def checkpointing_forward(model):
    """While gradients are recorded, the modules with gradient checkpointing on
    (`harnessrl.train.lora.enable_gradient_checkpointing`) in training mode, each alone (not
    their children): transformers checkpoints only a module in training mode, and the trainers
    keep the model in eval mode so that no dropout ever acts. The backward's recompute needs no
    flag. Nothing happens for a model without checkpointing, or under no_grad."""
    flagged = []
    if torch.is_grad_enabled():
        flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True and not m.training]
    for module in flagged:
        module.training = True
    try:
        yield
    finally:
        for module in flagged:
            module.training = False


def plain_output_head(model) -> bool:
    """True when logits = output_embeddings(decoder(x)) with nothing applied after (Llama, Qwen,
    SmolLM2, Mistral...); False for models that soft-cap or scale their logits."""
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return False
    return hasattr(model, "get_decoder") and model.get_output_embeddings() is not None


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: Aggregation = "token-mean",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    pg_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss of GRPO, with DAPO's asymmetric clip and token-mean by default.

    Per completion token t of sequence b (A_b = the sequence's advantage):

        ratio  = exp(logp - old_logp)
        loss_t = -w_t * min(ratio * A_b, clip(ratio, 1 - clip_low, 1 + clip_high) * A_b)
               + kl_coef * (exp(ref - logp) - (ref - logp) - 1)        [only with ref_logprobs]

    w_t = pg_weights[b, t], a per-token weight of the policy-gradient term only (not of the KL
    term), treated as a constant (detached: no gradient flows through it). The trainer passes the
    truncated importance-sampling weights of `truncated_is_weights` there, which correct for the
    sampler not being the trainer; None (the default) is w_t = 1: the loss exactly as without it.

    The KL term is the k3 estimator of KL(pi || ref) (Schulman): non-negative, unbiased, zero
    when logp == ref. Off by default (kl_coef = 0), as in DAPO and Dr. GRPO.

    Aggregation over the batch (M = completion_mask):
        "token-mean": sum_{b,t} M * loss / sum_{b,t} M        every token weighs the same (DAPO);
                      long completions are not down-weighted
        "seq-mean":   mean_b [ sum_t M * loss / sum_t M ]      every sequence weighs the same
                      (original GRPO); a sequence with no completion tokens contributes 0

    The clip makes the gradient zero once the ratio has moved past 1 + clip_high in the
    direction the advantage pushes (A > 0) or past 1 - clip_low (A < 0): the step can't go
    further from the sampling policy on that token. The higher upper clip (0.28 vs 0.2) leaves
    room to raise unlikely tokens (DAPO's "clip-higher", against entropy collapse).
    All-zero advantages (every group flat) give loss 0 and zero gradient (KL off).

    Stats (python floats, over completion tokens): clip_fraction (tokens in the clipped, zero
    gradient region), ratio_mean, adv_abs_mean (mean |A| over sequences), kl (mean k3; 0 without ref).
    """
    if aggregation not in ("token-mean", "seq-mean"):
        raise ValueError(f"aggregation must be 'token-mean' or 'seq-mean', got {aggregation!r}")
    if clip_low < 0 or clip_low >= 1 or clip_high < 0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    mask = completion_mask.to(logprobs.dtype)
    is_token = mask > 0
    A = advantages.to(logprobs.dtype).unsqueeze(1)  # [B, 1], broadcast over tokens
    # Padding positions are zeroed before exp so junk there can never overflow into inf * 0 = NaN.
    log_ratio = torch.where(is_token, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    unclipped = ratio * A
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * A
    per_token = -torch.minimum(unclipped, clipped)
    if pg_weights is not None:
        per_token = per_token * pg_weights.detach().to(per_token.dtype)

    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        delta = torch.where(is_token, ref_logprobs - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl

    n_tokens = mask.sum().clamp(min=1.0)
    if aggregation == "token-mean":
        loss = (per_token * mask).sum() / n_tokens
    else:
        loss = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()

    with torch.no_grad():
        in_clip_region = ((ratio > 1.0 + clip_high) & (A > 0)) | ((ratio < 1.0 - clip_low) & (A < 0))
        stats = {
            "clip_fraction": float((in_clip_region.to(mask.dtype) * mask).sum() / n_tokens),
            "ratio_mean": float((ratio * mask).sum() / n_tokens),
            "adv_abs_mean": float(advantages.abs().mean()) if advantages.numel() else 0.0,
            "kl": float((kl * mask).sum() / n_tokens),
        }
    return loss, stats


def truncated_is_weights(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    completion_mask: Tensor,
    cap: float = 2.0,
    level: TISLevel = "token",
) -> tuple[Tensor, Tensor]:
    """Truncated importance-sampling (TIS) weights of the policy-gradient term: the tokens were
    drawn from the sampler (a bf16 / int8 / 4-bit engine), the loss is of the trainer's policy.

    With log r_t = old_logp_t - sampler_logp_t (the trainer's log-prob of the sampled token,
    recomputed before the update, minus the sampler's: of the distribution the token was drawn
    from, a call's sampled_logprobs where its sampling was shaped; M = completion_mask):

        "token":     w_t = min(r_t, cap)                                   one weight per token
        "sequence":  w_b = min(prod_t r_t, cap) = exp(min(sum_t M * log r_t, log cap))
                     on every token of the sequence

    Returns (weights [B, T], capped [B, T] bool): weights are 0 off the completion tokens, capped
    marks the completion tokens whose weight is the cap (their ratio reached it). The sequence
    weight is computed in log space so a long completion's product can't overflow. The cap bounds
    the variance the few tokens the sampler under-rates would add (Yao et al. 2025 use 2); the
    token level is biased but low-variance, the sequence level is the exact sequence ratio below
    the cap. No gradient: the weights are constants of the loss.
    """
    if cap < 1:
        raise ValueError(f"the TIS cap must be >= 1 (a cap below 1 scales down even on-policy tokens), got {cap}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    with torch.no_grad():
        is_token = completion_mask > 0
        # padding zeroed before exp, as in grpo_loss: junk there never overflows into inf * 0 = NaN
        log_r = torch.where(is_token, old_logprobs.float() - sampler_logprobs.float(), torch.zeros_like(old_logprobs))
        if level == "sequence":
            log_r = log_r.sum(dim=1, keepdim=True).expand_as(log_r)
        log_cap = math.log(cap)
        capped = (log_r >= log_cap) & is_token
        weights = torch.where(is_token, torch.exp(torch.clamp(log_r, max=log_cap)), torch.zeros_like(log_r))
    return weights, capped


def split_mini_batches(units: list[T], n: int, seed: str) -> list[list[T]]:
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
    batches: list[list[T]] = []
    start = 0
    for i in range(n):
        end = start + size + (i < extra)
        batches.append(order[start:end])
        start = end
    return batches
