"""Sampling for the engine: one token from one row's raw logits, and its log-probability.

The recorded log-probability of a sampled token is log softmax(z / T)[token] of the raw logits z
(T = 0: log softmax(z)); top_p shapes only the distribution that is sampled from, afterwards. So
it is what a teacher-forced forward pass of prompt + completion gives at that temperature. Every
request samples from its own torch.Generator seeded with its own seed (`generator`): what else
is in flight changes its logits only by float rounding of the batched products, never its random
draws. Greedy (T = 0) takes the arg max, as model.generate does.
"""

from __future__ import annotations

import torch


def generator(seed: int, temperature: float) -> torch.Generator | None:
    """The request's own random stream (None for greedy, which draws nothing)."""
    return torch.Generator().manual_seed(seed) if temperature > 0 else None


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The ids of the most probable tokens until their mass reaches top_p (the first always).

    Looks at the top 64 first and widens only when the nucleus does not end inside them, so the
    usual case costs a top-k instead of sorting the whole vocabulary.
    """
    k = min(64, probs.numel())
    while True:
        top, ids = torch.topk(probs, k)
        before = torch.cumsum(top, dim=0) - top
        if k == probs.numel() or bool(before[-1] >= top_p):
            return ids[before < top_p]
        k = min(probs.numel(), 8 * k)


def sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> tuple[int, float]:
    """One token from one row's raw logits (vocab,), float32, and its log-probability."""
    if temperature == 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logp = torch.log_softmax(logits / temperature, dim=-1)
    candidates, ids = logp, None
    if top_p < 1.0:
        ids = nucleus(logp.exp(), top_p)
        candidates = logp[ids]
    # Exponential race (the Gumbel-max trick): the arg max of log p_i - log E_i, with one
    # E_i ~ Exp(1) per candidate from the request's own generator, is a draw from p. Rounding
    # noise in the logits (another batch size, another prefill split) flips it only where two
    # candidates' scores tie within that noise. An inverse CDF over the vocabulary instead
    # flips whenever the rounding of every probability before the pick, summed, crosses the
    # uniform draw: on a flat distribution that happened about once per thousand tokens.
    uniform = torch.rand(candidates.shape, generator=gen, dtype=candidates.dtype)
    pick = int(torch.argmax(candidates - torch.log(-torch.log(uniform))))
    token = int(ids[pick]) if ids is not None else pick
    return token, float(logp[token])
