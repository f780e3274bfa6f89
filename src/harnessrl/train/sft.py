"""Supervised LoRA fine-tuning on stored episodes, re-rendered into one target harness.

    plan_sampling + run_samples          (sft_sample.py, --sample) N attempts per task with the
                                         model; each task's best passing one joins the selection
    select_episodes + build_examples     (sft_data.py) one example per model call of each replayed
                                         episode: the prompt the target harness shows, the reply
    per optimizer step                   batch_size examples, in a seeded order per epoch;
        micro-batches by tokens -> token_logprobs -> mean negative log-likelihood of the
        completion tokens (every completion token of the batch weighs the same) -> backward
        clip, AdamW step

An example is the same unit GRPO trains on (grpo.TrainingUnit: prompt ids, completion ids, per
model call), padded and scored by the same functions, so the loss falls on the completion tokens
only (the reply and its end-of-turn token) and never on the prompt, the tool results or the
earlier turns. The model stays in eval mode (no dropout) and the example order is a function of
(seed, epoch) alone: a resumed run computes exactly what the uninterrupted run would have.

Files in the run folder OUT:
    samples/         --sample: the attempts, an evaluation run folder (sft_sample.py); written
                     first, and kept for the next start when the run stops before training
    config.json      every option, the target harness's spec and what the data came to (episodes
                     selected, replayed, dropped and why; with --sample, per task the attempt
                     kept or why none was; examples; a fingerprint of their tokens).
                     A resume with different options is refused, except --epochs and
                     --checkpoint-every; with different examples (other episodes in --from) too
    metrics.jsonl    one line per optimizer step: step, epoch, loss, tokens, padded_tokens,
                     examples, lr, grad_norm, seconds
    checkpoint/      adapter/, optimizer.pt, state.json (step, data fingerprint)
    adapter/         the final peft adapter + harnessrl.json naming the base model
                     (`--model hf:OUT/adapter`)
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harnessrl.results import SFTData, SFTResult, SFTTrained
from harnessrl.rundir import RunFolder, append_jsonl, truncate_jsonl
from harnessrl.train import lora
from harnessrl.train.grpo import TrainingUnit, pad_units, token_logprobs
from harnessrl.train.packing import pad_packed
from harnessrl.train.progress import SFT_VIEW, StepProgress
from harnessrl.train.sft_data import (
    OWN,
    ChatRenderer,
    EpisodeSelection,
    ExampleSet,
    SFTError,
    SourceEpisode,
    build_examples,
    build_examples_own,
    check_hf_export,
    own_specs,
    select_episodes,
    write_hf_dataset,
    write_jsonl,
)
from harnessrl.train.sft_sample import (
    SamplingPlan,
    best_attempts,
    plan_sampling,
    run_samples,
)
from harnessrl.train.update import TrainingDiverged, micro_batches

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext
    from harnessrl.models.hf import HFPolicy

# Keys that may change when a run is resumed: --epochs and --checkpoint-every change nothing the
# next steps compute; "data" (what the examples came to) is recorded again, and the checkpoint's
# fingerprint of the examples is what a resume is checked against.
# device and gradient checkpointing change float rounding only (docs/training.md, "Devices and
# precision"); the dtype is compared, as it resolves here (harnessrl.kernel.job_record)
SFT_RESUMABLE_CHANGES = ("epochs", "checkpoint_every", "data", "device", "gradient_checkpointing")


def units_of(examples: ExampleSet) -> list[TrainingUnit]:
    """The examples as GRPO's training units (advantage and old log-probs unused here)."""
    return [
        TrainingUnit(
            prompt_ids=list(ex.prompt_ids),
            completion_ids=list(ex.completion_ids),
            old_logprobs=[0.0] * len(ex.completion_ids),
            advantage=1.0,
            harness=ex.harness,
            episode_id=ex.source_episode,
        )
        for ex in examples.examples
    ]


def epoch_order(n: int, seed: int, epoch: int, episodes: list[str] | None = None) -> list[int]:
    """The example order of one epoch: a shuffle seeded by (seed, epoch) only. With `episodes`
    (each example's source episode: --pack) the episodes are shuffled, each one's examples kept
    together in their order, so that the calls of an episode fall into the same batch."""
    rng = random.Random(f"harnessrl-sft-order:{seed}:{epoch}")
    if episodes is None:
        order = list(range(n))
        rng.shuffle(order)
        return order
    groups: dict[str, list[int]] = {}
    for i, episode in enumerate(episodes):
        groups.setdefault(episode, []).append(i)
    keys = list(groups)
    rng.shuffle(keys)
    return [i for key in keys for i in groups[key]]


def sft_loss(
    model, units: list[TrainingUnit], pad_id: int, micro_batch: int, pack: bool = False
) -> tuple[float, int, int]:
    """Backward of the mean negative log-likelihood of every completion token of `units`, one
    micro-batch at a time (each weighted by its share of the tokens, so the gradient is that of
    the whole batch). With `pack`, the calls of one episode that extend one another share a row
    (train/packing.py): each completion token is read at its own position in a row, so the loss
    and the gradient are those without packing, up to float rounding. Returns the loss, the
    completion tokens and the padded tokens."""
    total = sum(len(u.completion_ids) for u in units)
    loss_sum, padded = 0.0, 0
    for mb in micro_batches(units, micro_batch, pack=pack):
        batch = pad_packed(mb, pad_id) if pack else pad_units(mb, pad_id)
        padded += batch["input_ids"].numel()
        logp = token_logprobs(model, batch)
        nll = -(logp * batch["completion_mask"].to(logp.device)).sum()
        if not torch.isfinite(nll):
            raise TrainingDiverged(f"the loss is {float(nll.detach())}")
        (nll / total).backward()
        loss_sum += float(nll.detach())
    return loss_sum / total, total, padded


class SFTRun(lora.WritesAdapter):
    """`SFTRun(ctx)` (its context from the job kernel) checks what is left (the harness, the run
    folders) and raises SFTError; `prepare()` loads the model, samples (--sample: into
    `ctx.out`/samples) and builds the examples (SFTError on bad data; nothing written but the
    resumable samples); `train()` writes the run folder and trains.

    `export_only`: no run folder (an export only). `spec`: the harness to train for, given as an
    object. `sample_policy`: the policy that makes the --sample attempts instead of the model
    being trained (tests: a scripted one)."""

    trained_by = "harnessrl train sft"

    def __init__(self, ctx: JobContext, *, export_only: bool = False, spec=None, sample_policy=None):
        from rich.console import Console

        from harnessrl.kernel import job_harness

        self.config = config = ctx.config
        sampling = config.sample is not None
        self.model_choice = lora.trained_model(config, SFTError, ctx.model())  # chosen once (harnessrl.kernel)
        self.selection: EpisodeSelection | None = None
        if config.from_runs:
            self.selection = select_episodes(config.from_runs, config.min_score, allow_empty=sampling)
        self.specs: dict[str, Any] | None = None  # --as-harness own: harness name -> spec
        if spec is None and config.as_harness == OWN:
            assert self.selection is not None  # not sampling (SFTConfig.refusal): --from was given
            self.specs = own_specs(self.selection)
        elif spec is None:
            name, option = config.as_harness, "--as-harness"
            if name is None:
                # the selected episodes' harness; when sampling is to find them all, the --from runs'
                sources = sorted({e.trajectory.harness for e in self.selection.episodes}) if self.selection else []
                if not sources and self.selection is not None:
                    sources = self.selection.harnesses
                if not sources and config.sample_harness is not None:
                    name, option = config.sample_harness, "--sample-harness"
                elif not sources:
                    raise SFTError("no episode to take the harness from: name the one to train for with --as-harness")
                elif len(sources) > 1:
                    raise SFTError(
                        f"the selected episodes come from several harnesses ({', '.join(sources)}): "
                        "name the one to train for with --as-harness, or keep each in its own with --as-harness own"
                    )
                else:
                    name = sources[0]
            spec = job_harness(name, option, SFTError, loop_for="training for a harness (re-rendering conversations)")
        self.spec = spec
        self.harness_name = spec.name if spec is not None else OWN
        self.suite = self.selection.suite if self.selection is not None else config.sample_suite
        self.out, self.resume, self.progress = None if export_only else ctx.out, ctx.resume, ctx.progress
        self.console = ctx.console if ctx.console is not None else Console(stderr=True)
        self.folder: RunFolder | None = None
        if self.out is not None:
            if spec is not None:
                harness_spec = spec.to_dict()
            else:
                assert self.specs is not None  # --as-harness own
                harness_spec = {n: x.to_dict() for n, x in self.specs.items()}
            self.folder = lora.open_run_folder(
                self.out, "fine-tuning", config, self.model_choice, resume=self.resume,
                may_differ=SFT_RESUMABLE_CHANGES,
                recorded_when_on={"pack": False},  # runs from before --pack resume as they were
                as_harness=self.harness_name, harness_spec=harness_spec, suite=self.suite,
            )  # fmt: skip
        self.plan: SamplingPlan | None = None
        if sampling:
            self.plan = plan_sampling(config, self.selection, spec, ctx.out)
        self.sample_policy = sample_policy
        self.policy: HFPolicy | None = None
        self.examples: ExampleSet | None = None
        self.step = 0

    # -- data -------------------------------------------------------------------------------------------
    def prepare(self) -> ExampleSet:
        """Load the model's tokenizer (with the model) and replay the episodes into examples."""
        cfg = self.config
        policy = self.policy = lora.load_local_policy(self.model_choice, SFTError, training=cfg)
        self.renderer = ChatRenderer(policy.tokenizer, policy.tool_role)
        if self.plan is not None:
            self.selection = self.sample()
        assert self.selection is not None
        options: dict[str, Any] = {"min_score": cfg.min_score, "placebo": cfg.placebo, "seed": cfg.seed}
        if self.specs is not None:
            self.examples = build_examples_own(self.selection, self.specs, self.renderer, **options)
        else:
            self.examples = build_examples(self.selection, self.spec, self.renderer, **options)
        return self.examples

    def sample(self) -> EpisodeSelection:
        """--sample: the attempts (those OUT/samples lacks), then the selection with each task's
        kept attempt added; per task, what was kept or why nothing was, in the stats."""
        plan, cfg = self.plan, self.config
        assert plan is not None
        trajectories = run_samples(plan, self.sample_policy or self.policy, self.progress, self._say)
        kept, per_task = best_attempts(trajectories, plan.tasks, cfg.min_score)
        base = self.selection or EpisodeSelection(
            [], plan.tasks[0].suite, {"episodes": 0, "infra_errors": 0, "not_selected": 0, "selected": 0}
        )
        episodes = base.episodes + [SourceEpisode(t, str(plan.path), plan.spec.protocol.format) for t in kept]
        if not episodes:
            what = "passes" if cfg.min_score is None else f"scores >= {cfg.min_score:g}"
            raise SFTError(
                f"no episode to learn from: no attempt {what} among the {plan.attempts} per task of the "
                f"{len(plan.tasks)} tasks sampled in {plan.spec.name}"
                + (", nor any episode of --from" if self.selection is not None else "")
                + f"; the attempts stay in {plan.path} (a start with the same options reuses them)"
            )
        stats = {
            **base.stats,
            "selected": len(episodes),
            "sampling": {
                "run": str(plan.path),
                "harness": plan.spec.name,
                "attempts": plan.attempts,
                "tasks": len(plan.tasks),
                "kept": len(kept),
                "per_task": per_task,
            },
        }
        return EpisodeSelection(episodes, base.suite, stats, base.task_ids)

    def export(self, path: str | os.PathLike) -> Path:
        """The examples as JSONL in the chat `messages` format (one model call per line)."""
        assert self.examples is not None, "prepare() first"
        r = self.renderer
        return write_jsonl(path, self.examples.examples, r.tool_role, r.wrapped_by_template)

    def export_hf(self, path: str | os.PathLike) -> Path:
        """The examples as a Hugging Face dataset saved to disk: the same `messages` as the JSONL
        export, and where each example comes from (sft_data.example_row)."""
        assert self.examples is not None, "prepare() first"
        r = self.renderer
        return write_hf_dataset(path, self.examples.examples, r.tool_role, self.examples.suite, r.wrapped_by_template)

    # -- model ------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        # eval mode throughout: a resumed run computes what the uninterrupted one would
        self.peft_model, self.trainable, self.optimizer = lora.attach(self.policy, self.config, SFTError)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based): linear warm-up, then constant."""
        cfg = self.config
        return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr

    # -- the loop ---------------------------------------------------------------------------------------
    def train(self) -> SFTTrained:
        """Train for --epochs over the examples; returns a short summary."""
        assert self.examples is not None and self.folder is not None and self.out is not None
        cfg = self.config
        units = units_of(self.examples)
        fingerprint = self.examples.fingerprint()
        per_epoch = math.ceil(len(units) / cfg.batch_size)
        total = per_epoch * cfg.epochs
        self._setup()
        metrics_path = self.out / "metrics.jsonl"
        if self.resume and self.load_checkpoint(fingerprint):
            self._say(f"resuming {self.out} from step {self.step}")
        elif self.resume:
            self._say(f"{self.out} has no checkpoint yet: starting from step 0")
        if self.step > total:
            raise SFTError(
                f"--epochs {cfg.epochs} ({total} steps) is below the checkpoint's step {self.step}; give more --epochs"
            )
        self.folder.start()
        self.folder.record(data={**self.examples.stats, "fingerprint": fingerprint, "steps_per_epoch": per_epoch})
        if self.resume:
            truncate_jsonl(metrics_path, self.step)
        assert self.policy is not None  # prepare() loaded it
        pad_id = self.policy.pad_id
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        last: dict[str, Any] = {}
        with StepProgress(SFT_VIEW, self.console, total, self.step, self.progress) as bar:
            while self.step < total:
                t0 = time.perf_counter()
                epoch, k = divmod(self.step, per_epoch)
                order = epoch_order(len(units), cfg.seed, epoch, [u.episode_id for u in units] if cfg.pack else None)
                batch = [units[i] for i in order[k * cfg.batch_size : (k + 1) * cfg.batch_size]]
                lr = self.lr_at(self.step)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.zero_grad(set_to_none=True)
                self.peft_model.eval()
                try:
                    loss, tokens, padded = sft_loss(self.peft_model, batch, pad_id, cfg.micro_batch, cfg.pack)
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, max_norm))
                    if not math.isfinite(grad_norm):
                        raise TrainingDiverged(f"the gradient norm is {grad_norm}")
                except TrainingDiverged as e:
                    self.optimizer.zero_grad(set_to_none=True)
                    append_jsonl(metrics_path, {"step": self.step + 1, "stopped": str(e)})
                    raise TrainingDiverged(
                        f"step {self.step + 1}: {e}: training stopped; the last checkpoint in {self.out} is intact "
                        "(continue with --resume, or start again with a lower --lr)"
                    ) from None
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step += 1
                last = {
                    "step": self.step,
                    "epoch": epoch + 1,
                    "loss": loss,
                    "tokens": tokens,
                    "padded_tokens": padded,
                    "examples": len(batch),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "seconds": time.perf_counter() - t0,
                }
                append_jsonl(metrics_path, last)
                bar.update(last)
                if self.step % cfg.checkpoint_every == 0 or self.step == total:
                    self.save_checkpoint(fingerprint)
        if not (self.out / "checkpoint").exists():
            self.save_checkpoint(fingerprint)
        adapter = self.save_adapter()
        return SFTTrained(steps=self.step, adapter=str(adapter), examples=len(units), last=last)

    # -- checkpoints ------------------------------------------------------------------------------------
    def save_checkpoint(self, fingerprint: str) -> Path:
        """OUT/checkpoint, written in a temporary folder then renamed into place."""
        assert self.out is not None  # a run that trains has a folder
        state = {"step": self.step, "data_fingerprint": fingerprint}
        return lora.write_checkpoint(self.out, self.peft_model, self.optimizer, state)

    def load_checkpoint(self, fingerprint: str) -> bool:
        """Restore adapter, optimizer and step; False when there is none yet. The examples must be
        the ones the checkpoint was trained on."""
        import json

        assert self.out is not None  # a run that trains has a folder
        folder = lora.checkpoint_folder(self.out)
        if folder is None:
            return False
        state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
        if state.get("data_fingerprint") != fingerprint:
            raise SFTError(
                f"{self.out}: the examples differ from the ones its checkpoint was trained on (the episodes in --from "
                "changed?); start a new --out"
            )
        lora.load_adapter_weights(self.peft_model, lora.read_adapter_weights(folder), folder, SFTError)
        # read onto the CPU (a run may resume on another device); load_state_dict moves each
        # state tensor to its parameter's device
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, map_location="cpu"))
        self.step = int(state["step"])
        return True

    def adapter_facts(self) -> dict[str, Any]:
        """harnessrl.json of OUT/adapter also names the harness, the placebo and the examples."""
        assert self.examples is not None  # a run that trains, prepared
        return {
            "suite": self.examples.suite,
            "harness": self.harness_name,
            "placebo": self.config.placebo,
            "examples": len(self.examples.examples),
        }

    def _say(self, text: str) -> None:
        if self.progress:
            self.console.print(text, highlight=False, markup=False)


def run_sft(
    ctx: JobContext,
    *,
    export_jsonl: str | os.PathLike | None = None,
    export_hf: str | os.PathLike | None = None,
    export_only: bool = False,
    spec=None,
    sample_policy=None,
) -> SFTResult:
    """`harnessrl train sft` over its job context (harnessrl.kernel.enter): (sample,) select,
    replay, (export), train.

    Every bad input raises SFTError before anything is written (--sample: but its attempts,
    kept in `ctx.out`/samples for the next start). `export_only`: write the exports (`export_jsonl`
    or `export_hf` is then required) and train nothing; no run folder is opened. `spec`,
    `sample_policy`: see SFTRun.
    """
    if export_only and export_jsonl is None and export_hf is None:
        raise SFTError("--export-only needs --export-jsonl PATH or --export-hf DIR")
    if export_hf is not None:
        check_hf_export(export_hf)
    run = SFTRun(ctx, export_only=export_only, spec=spec, sample_policy=sample_policy)
    examples = run.prepare()
    summary = SFTResult(
        data=SFTData.model_validate(examples.stats),
        harness=run.harness_name,
        suite=examples.suite,
        exported=None if export_jsonl is None else str(run.export(export_jsonl)),
        exported_hf=None if export_hf is None else str(run.export_hf(export_hf)),
    )
    if export_only:
        return summary
    return summary.model_copy(update=run.train().model_dump())
