"""HFPolicy: a local transformers causal LM behind the Policy interface.

One `complete` call = one batched `model.generate` (left padding, attention mask, KV cache).

Logprobs. For every sampled token we record log softmax(z / T)[token], where z are the model's
raw logits at that step and T the sampling temperature (T = 0, greedy: log softmax(z)[token]).
top_p truncation is NOT applied to these numbers: they are the log-probabilities a
teacher-forced forward pass of prompt + completion gives at the same temperature, which is what
an importance ratio in training compares against. They are computed step by step inside
generate (a logits processor keeps one step of log-probabilities and gathers the sampled token
on the next step), so memory stays O(batch x vocab) instead of keeping every step's logits.

Sampling and seeds. Every row samples with its own torch.Generator, seeded from its request's
`seed` (the runner sets one per request: see `harnessrl.models.base.request_seed`), so a row's
completion depends on its own prompt and seed only: the same request gives the same sample alone
or in any batch (up to float rounding of batched arithmetic, which could flip a near-tie), and a
resumed process replays it. A request without a seed (a library caller of
`complete`) gets a hash of (sampling.seed, number of previous generate calls on this policy,
row): a fresh policy replays the same sequence of calls, successive calls draw fresh noise, and
identical requests in one batch get different samples. The sampling happens in a logits
processor (temperature, top_p, then an exponential race per row with the row's generator); it
leaves only the sampled token finite, and generate itself runs greedy, so it can only pick that
token and never touches the global RNG.

Stopping. A row stops at the first end-of-turn id (<|im_end|> if the vocabulary has it, the
tokenizer's eos and the model's configured eos ids), at its own max_new_tokens, or (in
`complete`) at the first of its stop strings. The end-of-turn token is kept in completion_ids
(training sees the stop) but not in the text.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (  # noqa: E402  # noqa: E402
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TopPLogitsWarper,
)

from harnessrl.models import chat  # noqa: E402
from harnessrl.models.base import (  # noqa: E402
    GenerationRequest,
    ModelUnavailable,
    Policy,
    PolicyError,
    SamplingParams,
)
from harnessrl.models.embedded import END_OF_TURN  # noqa: E402
from harnessrl.types import ModelCall  # noqa: E402

log = logging.getLogger(__name__)

_threads_configured = False


def configure_threads() -> int:
    """Use every CPU this process may run on (once per process), or $HARNESSRL_THREADS."""
    global _threads_configured
    if not _threads_configured:
        wanted = os.environ.get("HARNESSRL_THREADS")
        if wanted:
            n = int(wanted)
        elif hasattr(os, "process_cpu_count"):
            n = os.process_cpu_count() or 1
        elif hasattr(os, "sched_getaffinity"):
            n = len(os.sched_getaffinity(0))
        else:
            n = os.cpu_count() or 1
        torch.set_num_threads(max(1, n))
        _threads_configured = True
    return torch.get_num_threads()


def call_seed(seed: int, call_index: int, row: int | None = None) -> int:
    """The seed of a request without its own: from (sampling seed, generate call number, row)."""
    key = f"harnessrl:{seed}:{call_index}" + ("" if row is None else f":{row}")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


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


def end_of_turn_ids(model, tokenizer) -> list[int]:
    ids: set[int] = set()
    im_end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return sorted(ids)


class HFPolicy(Policy):
    """A transformers causal LM with its tokenizer and chat template.

    While generating, the model runs in eval mode and with a bare generation_config, so no
    sampling default shipped with a checkpoint (top_k, repetition penalty, ...) changes what
    SamplingParams say; both are restored afterwards (the model may be shared with a trainer).
    """

    def __init__(
        self,
        model,
        tokenizer,
        name: str = "hf",
        *,
        tool_role: chat.ToolRole | None = None,
        default_sampling: SamplingParams | None = None,
    ):
        configure_threads()
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.tool_role: chat.ToolRole = tool_role or chat.default_tool_role(tokenizer)
        self.default_sampling = default_sampling or SamplingParams()
        self.stop_ids = end_of_turn_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.stop_ids[0] if self.stop_ids else 0)
        self.generate_calls = 0

    # ----------------------------------------------------------------------------- loading

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, name: str | None = None, dtype: torch.dtype = torch.float32, device=None
    ) -> HFPolicy:
        """Any local transformers causal LM folder (config.json, weights, tokenizer), or a
        local .gguf file (dequantized on every load). Never downloads."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p = Path(path).expanduser()
        if p.is_dir() and (p / "adapter_config.json").is_file():
            return cls.from_adapter(p, name=name, device=device)
        if p.is_file() and p.suffix == ".gguf":
            folder, extra = p.parent, {"gguf_file": p.name}
        elif p.is_dir() and (p / "config.json").is_file():
            folder, extra = p, {}
        elif p.is_dir():
            raise ModelUnavailable(f"{p} is not a transformers model folder (no config.json)")
        else:
            raise ModelUnavailable(f"{p} does not exist (hf:PATH wants a local model folder or .gguf file)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **extra)
            model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, local_files_only=True, **extra)
        except Exception as exc:  # noqa: BLE001
            raise ModelUnavailable(f"cannot load a causal LM from {p}: {type(exc).__name__}: {exc}") from exc
        if not getattr(tokenizer, "chat_template", None):
            log.warning("%s has no chat template; using plain ChatML", p)
            tokenizer.chat_template = chat.CHATML_TEMPLATE
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if device is not None:
            model = model.to(device)
        return cls(model, tokenizer, name=name or f"hf:{p}")

    @classmethod
    def from_adapter(cls, folder: str | os.PathLike, *, name: str | None = None, device=None) -> HFPolicy:
        """A peft (LoRA) adapter folder: load its base model, apply the adapter, merge it.

        The base is the model spec in the folder's harnessrl.json ("base_model", written by
        `harnessrl train`: tiny-random, smollm2-135m or hf:PATH), else the adapter_config.json's
        base_model_name_or_path when that is a local folder. Never downloads.
        """
        import json

        p = Path(folder).expanduser()
        base_spec = None
        meta = p / "harnessrl.json"
        if meta.is_file():
            try:
                base_spec = json.loads(meta.read_text(encoding="utf-8")).get("base_model")
            except ValueError as exc:
                raise ModelUnavailable(f"{meta} is not valid JSON ({exc})") from exc
        if not base_spec:
            try:
                base_path = json.loads((p / "adapter_config.json").read_text(encoding="utf-8")).get(
                    "base_model_name_or_path"
                )
            except ValueError as exc:
                raise ModelUnavailable(f"{p / 'adapter_config.json'} is not valid JSON ({exc})") from exc
            if not base_path or not Path(base_path).expanduser().is_dir():
                raise ModelUnavailable(
                    f"{p} is a LoRA adapter whose base model ({base_path or 'not named'}) is not a local folder; "
                    f'write {{"base_model": "hf:PATH"}} into {meta}'
                )
            base_spec = f"hf:{base_path}"
        if base_spec.startswith("hf:") and Path(base_spec[3:]).expanduser().resolve() == p.resolve():
            raise ModelUnavailable(f"{p}: the adapter names itself as its base model")
        from peft import PeftModel

        try:
            base = load_local(base_spec)
        except ValueError as exc:
            raise ModelUnavailable(
                f"{p}: the base model {base_spec!r} is not a local transformers model ({exc})"
            ) from exc
        try:
            model = PeftModel.from_pretrained(base.model, str(p)).merge_and_unload()
        except Exception as exc:  # noqa: BLE001
            raise ModelUnavailable(f"cannot apply the adapter {p} to {base_spec}: {type(exc).__name__}: {exc}") from exc
        model.eval()
        if device is not None:
            model = model.to(device)
        return cls(model, base.tokenizer, name=name or f"hf:{p}", tool_role=base.tool_role)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "backend": "transformers",
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "dtype": str(next(self.model.parameters()).dtype),
            "tool_role": self.tool_role,
            "sampling": self.default_sampling.model_dump(),
        }

    # ---------------------------------------------------------------------------- prompts

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        return chat.render_prompt_ids(self.tokenizer, request.messages, self.tool_role, request.tools)

    def decode(self, ids: Sequence[int]) -> str:
        return chat.decode(self.tokenizer, ids)

    # ------------------------------------------------------------------------- generation

    def complete(self, requests: list[GenerationRequest], sampling: SamplingParams | None = None) -> list[ModelCall]:
        if not requests:
            return []
        sampling = sampling or self.default_sampling
        try:
            prompts = [self.prompt_ids(r) for r in requests]
        except Exception as exc:  # noqa: BLE001
            raise PolicyError(f"{self.name}: cannot render the prompt: {type(exc).__name__}: {exc}") from exc
        limits, seeds = [r.max_new_tokens for r in requests], [r.seed for r in requests]
        outputs = self.generate_ids(prompts, limits, sampling, seeds=seeds)
        calls = []
        for request, prompt, (ids, logprobs, finish) in zip(requests, prompts, outputs):
            calls.append(chat.finish_call(self.tokenizer, request, prompt, ids, logprobs, finish))
        return calls

    def generate_ids(
        self,
        prompt_ids_batch: list[list[int]],
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams | None = None,
        stop_ids: Sequence[int] | None = None,
        seeds: Sequence[int | None] | None = None,
    ) -> list[tuple[list[int], list[float], str]]:
        """Token in, token out: one (completion_ids, logprobs, finish_reason) per prompt.

        `max_new_tokens` is one limit or one per prompt. `stop_ids` defaults to the end-of-turn
        ids; a row ends at the first of them (kept, finish_reason "stop") or at its limit
        ("length"). `seeds`: one sampling seed per prompt (None: derived from sampling.seed and
        the call counter, see the module docstring). Backend failures raise PolicyError.
        """
        if not prompt_ids_batch:
            return []
        sampling = sampling or self.default_sampling
        n = len(prompt_ids_batch)
        limits = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(limits) != n or min(limits) < 1:
            raise ValueError("max_new_tokens must be >= 1, one value or one per prompt")
        row_seeds = [None] * n if seeds is None else list(seeds)
        if len(row_seeds) != n:
            raise ValueError(f"{len(row_seeds)} seeds for {n} prompts")
        if any(len(p) == 0 for p in prompt_ids_batch):
            raise ValueError("empty prompt")
        stops = set(self.stop_ids if stop_ids is None else stop_ids)
        try:
            new_tokens, logprobs = self._generate(prompt_ids_batch, limits, sampling, sorted(stops), row_seeds)
        except Exception as exc:  # noqa: BLE001
            raise PolicyError(f"{self.name}: generation failed: {type(exc).__name__}: {exc}") from exc
        results = []
        for row, limit in enumerate(limits):
            ids = new_tokens[row][:limit]
            finish = "length"
            for i, token in enumerate(ids):
                if token in stops:
                    ids, finish = ids[: i + 1], "stop"
                    break
            results.append((ids, logprobs[row][: len(ids)], finish))
        return results

    @torch.inference_mode()
    def _generate(
        self,
        prompts: list[list[int]],
        limits: list[int],
        sampling: SamplingParams,
        stops: list[int],
        seeds: list[int | None],
    ) -> tuple[list[list[int]], list[list[float]]]:
        device = self.model.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        call_index = self.generate_calls
        self.generate_calls += 1
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
            pad_token_id=self.pad_id,
            bos_token_id=getattr(self.model.config, "bos_token_id", None),
        )
        model = self.model
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


LOCAL_FORMS = "tiny-random, smollm2-135m, hf:PATH"


def load_local(spec: str, sampling: SamplingParams | None = None) -> HFPolicy:
    """A local model spec (tiny-random, smollm2-135m, hf:PATH) as an HFPolicy; ValueError for
    any other form. `sampling` becomes the policy's default SamplingParams."""
    spec = spec.strip()
    if spec == "tiny-random":
        from harnessrl.models.embedded import load_tokenizer, tiny_random_model

        return HFPolicy(tiny_random_model(), load_tokenizer(), name=spec, default_sampling=sampling)
    if spec == "smollm2-135m":
        from harnessrl.models.embedded import load_smollm2, load_tokenizer

        return HFPolicy(load_smollm2(), load_tokenizer(), name=spec, default_sampling=sampling)
    if spec.startswith("hf:"):
        if not spec[3:]:
            raise ValueError("hf:PATH needs a path, e.g. hf:./my-model")
        policy = HFPolicy.from_pretrained(spec[3:])
        if sampling is not None:
            policy.default_sampling = sampling
        return policy
    raise ValueError(f"{spec!r} is not a local model ({LOCAL_FORMS})")
