"""An episode as ONE token sequence: its first prompt, then every model turn with the tokens the
harness and the tools put between them, and a mask of the tokens the model sampled.

Trainers that take one completion per attempt (TRL's `rollout_func`, verl's agent loop, prime-rl)
want an episode this way: `prompt_ids` once, `completion_ids` holding every later token, and an
`env_mask` that is 1 on the model's own tokens (trained) and 0 on the rest (the harness's
feedback, tool results, the next turn's chat markup: in the forward pass, never in the loss).

    prompt_ids      = call 0's prompt
    completion_ids  = call 0's completion, env tokens 1, call 1's completion, env tokens 2, ...
    env_mask        = 1 on each call's completion, 0 on the env tokens between them
    logprobs        = the sampler's log-prob of each model token, 0.0 on env tokens: the
                      distribution it was drawn from (a call's `sampled_logprobs` where its
                      sampling shaped it, else its `logprobs`), what a trainer's importance
                      correction divides by

Call k+1's env tokens are its prompt after call k's prompt and completion. That is only a true
record of what the model saw when call k+1's prompt BEGINS with call k's prompt and completion,
token for token (a "prefix chain"). It often does (the chat template renders the history as it
was sampled), but not always: a harness with a history window drops old turns, and a reply the
harness re-renders from its text (a completion cut at a stop string, a token sequence that the
tokenizer would have split differently) changes the history's tokens. A sequence that glued such
turns together would train the model on a context it never saw. So the chain is followed only
while each prompt extends the one before; at the first call that does not (a *prefix break*),
`episode_sequence` either stops there (on_break="truncate": the turns before the break are
trained, the rest are left out and counted) or raises PrefixBreak (on_break="error").

Our own trainer (`harnessrl train grpo`) trains per model call instead (a training unit per call,
`harnessrl.train.grpo`), which needs none of this and trains every turn of every harness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harnessrl.types import ModelCall, Trajectory

OnBreak = Literal["truncate", "error"]


class PrefixBreak(ValueError):
    """A model call's prompt does not extend the previous call's prompt and completion."""


@dataclass(frozen=True)
class EpisodeSequence:
    """One episode as one sequence (see the module docstring)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]  # 1: sampled by the model (trained); 0: put there by the harness or a tool
    logprobs: list[float]  # the sampler's (sampled_logprobs where shaped), on model tokens; 0.0 on env tokens
    turns: int  # model calls of the episode that sampled tokens
    turns_kept: int  # of those, the calls in the sequence (the chain up to the first prefix break)
    model_tokens: int  # completion tokens of every call
    model_tokens_kept: int  # completion tokens in the sequence (env_mask = 1)

    @property
    def broken(self) -> bool:
        """Whether a prefix break left turns out."""
        return self.turns_kept < self.turns


def sampled_calls(trajectory: Trajectory) -> list[ModelCall]:
    """The episode's model calls that sampled tokens, in order (a refused or failed request has none)."""
    return [s.model_call for s in trajectory.steps if s.model_call.completion_ids]


def sampler_logprobs(call: ModelCall) -> list[float]:
    """The log-prob of each completion token under the distribution it was drawn from: the
    call's `sampled_logprobs` where its sampling shaped the distribution, else its `logprobs`."""
    values = call.logprobs if call.sampled_logprobs is None else call.sampled_logprobs
    return [float(x) for x in values]


def first_difference(a: list[int], b: list[int]) -> int:
    """The first index where a and b differ (len of the shorter when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def episode_sequence(trajectory: Trajectory, on_break: OnBreak = "truncate") -> EpisodeSequence | None:
    """The episode's prefix chain as one sequence; None when no call sampled a token."""
    if on_break not in ("truncate", "error"):
        raise ValueError(f"on_break must be 'truncate' or 'error', got {on_break!r}")
    calls = sampled_calls(trajectory)
    if not calls:
        return None
    for k, call in enumerate(calls):
        for name, values in (("logprobs", call.logprobs), ("sampled_logprobs", call.sampled_logprobs)):
            if values is not None and len(values) != len(call.completion_ids):
                raise ValueError(
                    f"episode {trajectory.episode_id!r} call {k}: {len(call.completion_ids)} completion ids "
                    f"but {len(values)} {name}"
                )
    first = calls[0]
    tokens = list(first.prompt_ids) + list(first.completion_ids)
    completion = list(first.completion_ids)
    mask = [1] * len(first.completion_ids)
    logprobs = sampler_logprobs(first)
    kept = 1
    for k, call in enumerate(calls[1:], start=1):
        prompt = list(call.prompt_ids)
        if len(prompt) < len(tokens) or prompt[: len(tokens)] != tokens:
            if on_break == "error":
                raise PrefixBreak(
                    f"episode {trajectory.episode_id!r} (harness {trajectory.harness!r}): model call {k}'s prompt "
                    f"does not begin with call {k - 1}'s prompt and completion (they differ at token "
                    f"{first_difference(prompt, tokens)} of {len(tokens)}), so one sequence cannot hold both turns "
                    "as the model saw them. The harness re-rendered the history (a history window, or a reply "
                    "re-tokenized from its text). Keep the turns before the break (on_prefix_break='truncate'), "
                    "or train per model call with `harnessrl train grpo`."
                )
            break
        env = prompt[len(tokens) :]
        tokens = prompt + list(call.completion_ids)
        completion += env + list(call.completion_ids)
        mask += [0] * len(env) + [1] * len(call.completion_ids)
        logprobs += [0.0] * len(env) + sampler_logprobs(call)
        kept += 1
    return EpisodeSequence(
        prompt_ids=list(first.prompt_ids),
        completion_ids=completion,
        env_mask=mask,
        logprobs=logprobs,
        turns=len(calls),
        turns_kept=kept,
        model_tokens=sum(len(c.completion_ids) for c in calls),
        model_tokens_kept=sum(mask),
    )
