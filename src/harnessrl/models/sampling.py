"""Sampling for the engine: one token from one row's raw logits, and its log-probabilities.

Two log-probabilities per token (docs/engine.md, "Sampling fields"):

- the *tempered* one, log softmax(z / T)[token] of the raw logits z (T = 0: log softmax(z)): what
  a teacher-forced forward pass of prompt + completion gives at that temperature, whatever shaped
  the draw. The engine records it for every token (`EngineCompletion.logprobs`).
- the *sampled* one, the token's log-probability under the distribution it was actually drawn
  from, after the penalties, min_p, top_k and top_p, renormalised over the tokens they keep. Only
  a request that shapes its distribution has it (`RowSampler.shapes`); for the others it is the
  tempered one.

The fields and their order are vLLM's (v1 sampler):

1. penalties on the raw logits: repetition_penalty on every token present in the prompt or the
   completion so far (a logit > 0 is divided by it, any other multiplied), then
   frequency_penalty x the count of each token in the completion, then presence_penalty once for
   each token present in the completion;
2. T = 0: the arg max of the penalised logits (nothing below applies to greedy);
3. temperature: the penalised logits / T;
4. min_p: drop the tokens whose probability is below min_p x the most probable one's;
5. top_k: keep the tokens whose logit is at least the k-th largest (ties at the k-th kept);
6. top_p: keep the most probable tokens, in order, while the mass before each is below top_p
   (the first always), over the distribution renormalised after steps 4-5;
7. draw from the renormalised rest.

Every request samples from its own torch.Generator seeded with its own seed (`generator`): what
else is in flight changes its logits only by float rounding of the batched products, never its
random draws. A draw is an exponential race (`race`). A request with only neutral fields takes
`sample` as it always did, so its draws stay bit-identical whatever was added here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def generator(seed: int, temperature: float) -> torch.Generator | None:
    """The request's own random stream (None for greedy, which draws nothing)."""
    return torch.Generator().manual_seed(seed) if temperature > 0 else None


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The ids of the most probable tokens until their mass reaches top_p (the first always):
    a token is kept when the mass of the more probable ones before it is below top_p.

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


def race(candidates: torch.Tensor, gen: torch.Generator | None) -> int:
    """The index of the candidate drawn from softmax(candidates): an exponential race (the
    Gumbel-max trick), the arg max of log p_i - log E_i with one E_i ~ Exp(1) per candidate from
    the request's own generator.

    Rounding noise in the logits (another batch size, another prefill split) flips it only where
    two candidates' scores tie within that noise. An inverse CDF over the vocabulary instead flips
    whenever the rounding of every probability before the pick, summed, crosses the uniform draw:
    on a flat distribution that happened about once per thousand tokens."""
    uniform = torch.rand(candidates.shape, generator=gen, dtype=candidates.dtype)
    return int(torch.argmax(candidates - torch.log(-torch.log(uniform))))


def sample(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> tuple[int, float]:
    """One token from one row's raw logits (vocab,), float32, and its tempered log-probability,
    with no field but the temperature and top_p."""
    if temperature == 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logp = torch.log_softmax(logits / temperature, dim=-1)
    candidates, ids = logp, None
    if top_p < 1.0:
        ids = nucleus(logp.exp(), top_p)
        candidates = logp[ids]
    pick = race(candidates, gen)
    token = int(ids[pick]) if ids is not None else pick
    return token, float(logp[token])


class Penalties:
    """One request's penalty state: which tokens its prompt holds and how often each token came up
    in its completion so far (dense over the vocabulary, made at the first token: a few vector
    operations per token, nothing for a request without penalties, which has no Penalties)."""

    __slots__ = ("counts", "frequency", "presence", "prompt", "repetition", "seen")

    def __init__(self, prompt: Sequence[int], repetition: float, frequency: float, presence: float):
        self.prompt = prompt
        self.repetition = float(repetition)
        self.frequency = float(frequency)
        self.presence = float(presence)
        self.counts: torch.Tensor | None = None  # (vocab,) float32: each token's count in the completion
        self.seen: torch.Tensor | None = None  # (vocab,) bool: in the prompt or the completion

    def _state(self, vocab: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.counts is None or self.seen is None:
            self.counts = torch.zeros(vocab, dtype=dtype)
            self.seen = torch.zeros(vocab, dtype=torch.bool)
            self.seen[torch.tensor(list(self.prompt), dtype=torch.long)] = True
        return self.counts, self.seen

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The penalised logits (`logits` itself is left as it is)."""
        counts, seen = self._state(logits.numel(), logits.dtype)
        z = logits
        if self.repetition != 1.0:
            # a logit > 0 divided by the penalty, any other multiplied: as vLLM computes it, times
            # the penalty's reciprocal in the logits' precision
            penalty = torch.tensor(self.repetition, dtype=z.dtype)
            z = torch.where(seen, z * torch.where(z > 0, 1.0 / penalty, penalty), z)
        if self.frequency != 0.0:
            z = z - self.frequency * counts
        if self.presence != 0.0:
            z = z - self.presence * (counts > 0).to(z.dtype)
        return z

    def add(self, token: int) -> None:
        """The completion grew by `token`."""
        if self.counts is None or self.seen is None:
            raise RuntimeError("Penalties.add before any apply: the vocabulary size is not known yet")
        self.counts[token] += 1
        self.seen[token] = True


class RowSampler:
    """One request's sampling: its temperature and shaping fields (vLLM's meaning, module
    docstring), its own generator and its penalty state. `draw` gives (token, tempered
    log-prob, sampled log-prob or None when the request does not shape)."""

    __slots__ = ("generator", "min_p", "penalties", "shapes", "temperature", "top_k", "top_p")

    def __init__(
        self,
        seed: int,
        temperature: float,
        top_p: float = 1.0,
        *,
        top_k: int = 0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        prompt: Sequence[int] = (),
    ):
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k) if top_k > 0 else 0  # 0 and -1: off
        self.min_p = float(min_p)
        self.generator = generator(seed, self.temperature)
        penalised = repetition_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0
        self.penalties = (
            Penalties(prompt, repetition_penalty, frequency_penalty, presence_penalty) if penalised else None
        )
        self.shapes = penalised or self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    def draw(self, logits: torch.Tensor) -> tuple[int, float, float | None]:
        """One token from one row's raw logits (vocab,), float32: (token, log softmax(z / T)[token]
        of the raw logits, its log-prob under the distribution it was drawn from or None)."""
        if not self.shapes:  # neutral: exactly the draws of before
            token, logprob = sample(logits, self.temperature, 1.0, self.generator)
            return token, logprob, None
        token, logprob, sampled = shaped_sample(
            logits, self.temperature, self.top_p, self.top_k, self.min_p, self.penalties, self.generator
        )
        if self.penalties is not None:
            self.penalties.add(token)
        return token, logprob, sampled


def for_request(request, prompt: Sequence[int]) -> RowSampler:
    """The RowSampler of an EngineRequest (checked already: batch_planner.check_request) whose
    prompt ids are `prompt`."""
    return RowSampler(
        request.seed,
        request.temperature,
        request.top_p,
        top_k=request.top_k,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        frequency_penalty=request.frequency_penalty,
        presence_penalty=request.presence_penalty,
        prompt=prompt,
    )


def shape(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int, min_p: float, penalties: Penalties | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The steps of the module docstring on one row's raw logits (vocab,), for T > 0: (the tempered
    log-probs of the raw logits, the log-probs after penalties, temperature, min_p and top_k,
    renormalised, -inf where dropped, and the ids top_p keeps, most probable first, or None when
    the request does not truncate). `penalties` is read, not updated."""
    z = penalties.apply(logits) if penalties is not None else logits
    raw = torch.log_softmax(logits / temperature, dim=-1)
    x = z / temperature
    if min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < probs.max() * min_p, -math.inf)
    if 0 < top_k < x.numel():
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, -math.inf)
    logq = torch.log_softmax(x, dim=-1)  # renormalised over what min_p and top_k kept
    if top_p < 1.0:
        return raw, logq, nucleus(logq.exp(), top_p)
    if min_p > 0.0 or top_k > 0:
        return raw, logq, torch.nonzero(logq > -math.inf).squeeze(1)
    return raw, logq, None


def shaped_sample(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    top_k: int,
    min_p: float,
    penalties: Penalties | None,
    gen: torch.Generator | None,
) -> tuple[int, float, float]:
    """(token, tempered log-prob of the raw logits, log-prob under the shaped distribution), the
    steps of the module docstring in vLLM's order. `penalties` is read, not updated."""
    if temperature == 0:  # greedy: penalties only, then the arg max
        z = penalties.apply(logits) if penalties is not None else logits
        token = int(torch.argmax(z))
        raw = torch.log_softmax(logits, dim=-1)
        shaped = raw if z is logits else torch.log_softmax(z, dim=-1)
        return token, float(raw[token]), float(shaped[token])
    raw, logq, ids = shape(logits, temperature, top_p, top_k, min_p, penalties)
    if ids is None:  # penalties only: the whole vocabulary
        pick = race(logq, gen)
        return pick, float(raw[pick]), float(logq[pick])
    candidates = logq[ids]
    pick = race(candidates, gen)
    token = int(ids[pick])
    return token, float(raw[token]), float(candidates[pick] - torch.logsumexp(candidates, dim=0))


def shaped_logprobs(
    logits: torch.Tensor,
    prompt: Sequence[int],
    completion: Sequence[int],
    temperature: float,
    *,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> list[float]:
    """Teacher-forced: the log-prob of each token of `completion` under the distribution the
    engine would have drawn it from with these fields (what it records as sampled_logprobs), from
    the raw logits (len(completion), vocab) of the positions that predicted them. -inf for a token
    the shaping drops."""
    sampler = RowSampler(
        0,
        temperature,
        top_p,
        top_k=top_k,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        prompt=prompt,
    )
    out = []
    for row, token in zip(logits, completion):
        if temperature == 0:
            z = sampler.penalties.apply(row) if sampler.penalties is not None else row
            out.append(float(torch.log_softmax(z, dim=-1)[token]))
        else:
            _, logq, ids = shape(row, temperature, sampler.top_p, sampler.top_k, sampler.min_p, sampler.penalties)
            if ids is None:
                out.append(float(logq[token]))
            else:
                candidates = logq[ids]
                where = (ids == token).nonzero()
                total = torch.logsumexp(candidates, dim=0)
                out.append(float(candidates[int(where[0, 0])] - total) if len(where) else -math.inf)
        if sampler.penalties is not None:
            if sampler.penalties.counts is None:
                sampler.penalties.apply(row)  # (makes its state: the vocabulary's size)
            sampler.penalties.add(int(token))
    return out
