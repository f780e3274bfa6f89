"""The lock-step rollout path as it was before the asynchronous runner, kept here ONLY as the
benchmark's baseline (bench/rollout_throughput.py): at every turn the runner gathers every
in-flight episode's request and issues one padded `model.generate` for all of them (finished
rows keep their decode slot until the longest row ends; every turn prefills the whole prompt),
then steps each episode. Same harness code (Episode), same per-request seeds and sampler as the
product had; not used by harnessrl itself."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TopPLogitsWarper,
)

from harnessrl.harness.loops import Episode, InfraError
from harnessrl.models import chat
from harnessrl.models.base import GenerationRequest, SamplingParams, request_seed
from harnessrl.models.hf import call_seed
from harnessrl.types import ModelCall, Termination, Trajectory


class _PerRowSampler(LogitsProcessor):
    """Applies temperature and top_p itself, samples each row's next token with that row's own
    generator, and records log softmax(raw / T) of the token chosen at each step.

    generate runs greedy. When sampling, the returned scores are 0 at the token sampled here and
    -inf everywhere else, so generate's argmax picks exactly that token. Greedy (T = 0): the
    scores pass through and generate's argmax is the choice.
    """

    def __init__(self, temperature: float, top_p: float, seeds: Sequence[int]):
        self.temperature = temperature
        self.top_p = TopPLogitsWarper(top_p) if (temperature > 0 and top_p < 1.0) else None
        self.seeds = list(seeds)
        self._generators: list[torch.Generator] | None = None
        self.steps: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last is not None:  # the previous step's token is now the last input id
            self.steps.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        scores = scores.float()
        if self.temperature > 0:
            scores = scores / self.temperature
        self._last = torch.log_softmax(scores, dim=-1)
        if self.temperature == 0:
            return scores
        if self.top_p is not None:
            scores = self.top_p(input_ids, scores)
        picks = self._sample(torch.softmax(scores, dim=-1))
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, picks[:, None], 0.0)

    def _sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row, drawn from that row's probabilities with that row's generator:
        argmax(p / E) with E ~ Exp(1) i.i.d. picks token i with probability p_i."""
        if self._generators is None:
            self._generators = [torch.Generator(device=probs.device).manual_seed(s) for s in self.seeds]
        race = torch.empty_like(probs)
        for row, generator in enumerate(self._generators):
            race[row].exponential_(1.0, generator=generator)
        return (probs / race).argmax(dim=-1)

    def finish(self, new_tokens: torch.LongTensor) -> torch.Tensor:
        """(batch, steps) logprobs, given the generated tokens (batch, steps)."""
        if self._last is not None:
            self.steps.append(self._last.gather(1, new_tokens[:, -1:]).squeeze(1))
            self._last = None
        if not self.steps:
            return torch.zeros(new_tokens.shape, dtype=torch.float)
        return torch.stack(self.steps, dim=1)


class _PerRowMaxTokens(StoppingCriteria):
    """Marks a row done once it has generated its own max_new_tokens."""

    def __init__(self, prompt_len: int, max_new_tokens: torch.Tensor):
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids.shape[1] - self.prompt_len) >= self.max_new_tokens


@torch.inference_mode()
def _generate(
    policy,
    prompts: list[list[int]],
    limits: list[int],
    sampling: SamplingParams,
    stops: list[int],
    seeds: list[int | None],
) -> tuple[list[list[int]], list[list[float]]]:
    device = policy.model.device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), policy.pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):  # left padding
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    call_index = policy.generate_calls
    policy.generate_calls += 1
    row_seeds = [call_seed(sampling.seed, call_index, row) if s is None else s for row, s in enumerate(seeds)]
    sampler = _PerRowSampler(sampling.temperature, sampling.top_p, row_seeds)
    # greedy over the sampler's scores: it leaves one finite token per row when sampling
    config = GenerationConfig(
        max_new_tokens=max(limits),
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        use_cache=True,
        eos_token_id=stops or None,
        pad_token_id=policy.pad_id,
        bos_token_id=getattr(policy.model.config, "bos_token_id", None),
    )
    model = policy.model
    saved_config, was_training = model.generation_config, model.training
    # generate() fills every unset field from model.generation_config: make that bare.
    model.generation_config = GenerationConfig()
    model.eval()
    try:
        sequences = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=config,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([_PerRowMaxTokens(width, torch.tensor(limits, device=device))]),
        )
    finally:
        model.generation_config = saved_config
        model.train(was_training)
    new = sequences[:, width:]
    logprobs = sampler.finish(new)
    return new.tolist(), logprobs.tolist()


def lockstep_generate_ids(
    policy, prompts: list[list[int]], limits: list[int], sampling: SamplingParams, seeds: list[int | None] | None = None
) -> list[tuple[list[int], list[float], str]]:
    """One padded generate for all prompts (HFPolicy.generate_ids as it was): per prompt its
    completion ids (cut after the first stop id, kept), logprobs and finish reason."""
    stops = set(policy.stop_ids)
    seeds = [None] * len(prompts) if seeds is None else seeds
    new_tokens, logprobs = _generate(policy, prompts, limits, sampling, sorted(stops), seeds)
    results = []
    for row, limit in enumerate(limits):
        ids, finish = new_tokens[row][:limit], "length"
        for i, token in enumerate(ids):
            if token in stops:
                ids, finish = ids[: i + 1], "stop"
                break
        results.append((ids, logprobs[row][: len(ids)], finish))
    return results


def lockstep_complete(policy, requests: list[GenerationRequest], sampling: SamplingParams) -> list[ModelCall]:
    """One padded generate for all requests (HFPolicy.complete as it was)."""
    prompts = [policy.prompt_ids(r) for r in requests]
    outputs = lockstep_generate_ids(
        policy, prompts, [r.max_new_tokens for r in requests], sampling, [r.seed for r in requests]
    )
    return [
        chat.finish_call(policy.tokenizer, request, prompt, ids, logprobs, finish)
        for request, prompt, (ids, logprobs, finish) in zip(requests, prompts, outputs)
    ]


class LockstepRunner:
    """The old runner's loop: one batched generation per turn over every episode in flight."""

    def __init__(self, policy, sampling: SamplingParams, max_in_flight: int = 16):
        self.policy, self.sampling, self.max_in_flight = policy, sampling, max_in_flight
        self.completion_tokens = 0
        self.generate_s = 0.0
        self.batches = 0

    def run(self, jobs) -> list[Trajectory]:
        pending, in_flight, results = deque(jobs), [], []
        while pending or in_flight:
            while pending and len(in_flight) < self.max_in_flight:
                job = pending.popleft()
                in_flight.append(Episode(job.task, job.harness, job.attempt))
            for ep in in_flight:
                t = ep.rules.timeout_s
                if not ep.done and t is not None and ep.elapsed() > t:
                    ep.terminate(Termination.timeout, f"own time over {t:g} s")
            active = [ep for ep in in_flight if not ep.done]
            if active:
                requests = []
                for ep in active:
                    request = ep.request()
                    request.seed = request_seed(self.sampling.seed, ep.task.id, ep.attempt, len(ep.steps))
                    requests.append(request)
                t0 = time.monotonic()
                calls = lockstep_complete(self.policy, requests, self.sampling)
                latency = time.monotonic() - t0
                self.generate_s += latency
                self.batches += 1
                for ep, call in zip(active, calls):
                    ep.add_model_time(latency)
                    self.completion_tokens += call.completion_tokens
                    try:
                        ep.consume(call)
                    except InfraError as e:
                        ep.infra_error = str(e)
                        ep.terminate(Termination.error, "infrastructure error")
            still = []
            for ep in in_flight:
                if ep.done:
                    results.append(ep.finish())
                else:
                    still.append(ep)
            in_flight = still
        return results
