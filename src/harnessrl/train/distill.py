"""On-policy distillation of a harness into LoRA weights: `harnessrl train distill`.

The student is the model with a LoRA adapter; it samples its own episodes in the student harness
H. The teacher is the SAME base model with the adapter disabled (peft's `disable_adapter()`: no
second copy of the weights), reading each of those episodes through the teacher harness E (the
evolved harness). Every token the student sampled is trained toward the teacher's distribution
at that position by the per-token reverse KL, KL(student || teacher).

One step, read top to bottom in `DistillRun.train_step`:

    step_tasks              tasks_per_step distinct train tasks, drawn from (seed, step) alone
    runner.run(jobs)        `attempts` episodes per task in H, generated with the CURRENT adapter,
                            sampled with the step's own seed (train.step.sampling_seed)
    distill_units           one DistillUnit per model call of each episode: the student's prompt
                            ids and sampled completion ids, and the teacher's prompt ids
                            (`TeacherContext`, below)
    per micro-batch:
        teacher             no grad, adapter disabled: log-softmax over the whole vocabulary at
                            every completion position, under the teacher's prompt
        student             with grad, adapter on: the same under the student's own prompt
        reverse_kl_loss     sum of the per-token reverse KL / the step's completion tokens -> backward
    clip, AdamW step        one optimizer step per step

The teacher's context (`TeacherContext`). A model call of the student's episode saw the messages
[H's system prompt, H's demonstrations, the task's instruction, the conversation so far]. The
teacher sees the same conversation re-rendered through E: E's own opening (its system prompt with
its rules, tool descriptions and capability sections, and its demonstrations, as E shows them at
the start of an episode of this task), followed by every message the student's prompt holds after
H's opening, unchanged (the student's replies, the tool results as H rendered them, H's
interventions and history window), rendered with the model's chat template (with E's tool schemas
for a template that takes native tools). The student's sampled completion tokens are then scored
under that prompt: the teacher's next-token distribution at each of them, given the same earlier
reply tokens. The two harnesses must share their protocol format (and native_tools): the tokens
the student wrote are replies in H's format, which the teacher must read as replies in its own.
With E equal to H the teacher's prompt is exactly the student's, token for token, and the KL of
the untrained adapter (LoRA starts at zero) is 0.

The loss (`reverse_kl_loss`): the full-vocabulary reverse KL at the student's sampled positions,

    KL_t = sum_v p_s(v | x_s, y_<t) * (log p_s(v | x_s, y_<t) - log p_t(v | x_t, y_<t))

averaged over every completion token of the step (x_s, x_t: the student's and the teacher's
prompts; y: the student's sampled reply; both distributions at the sampling temperature). The
gradient is exact for each position (the whole vocabulary, not one sampled token); the prefixes
y_<t are the student's own samples, which is what makes it on-policy, and, as in per-token
on-policy distillation, no gradient is taken through the choice of those prefixes. The
sampled-token estimate log p_s(y_t) - log p_t(y_t) of the same KL is logged beside it
(`kl_sampled`). Memory: two [tokens, vocabulary] float tensors per micro-batch.

Rollout servers (--rollout-server) are not supported: the student samples with the in-process
engine on the very weights it trains (every step is on-policy), and the run refuses the option.

Files in the run folder OUT (the `train grpo` layout):
    config.json        every option and both harness specs (a resume with different options is
                       refused, except --steps, --checkpoint-every, --device, --gradient-checkpointing)
    metrics.jsonl      one line per step (`DistillRun._record`)
    checkpoint/        adapter/, optimizer.pt, rng.pt, state.json (the step); written into a
                       temporary folder and renamed into place
    adapter/           the final peft adapter (+ harnessrl.json naming the base model, both
                       harnesses), loadable with `--model hf:OUT/adapter`
    rollouts/run.db    every student episode (triage and reports read it); a resumed run first
                       deletes the episodes of the steps after its checkpoint
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from harnessrl.errors import JobError
from harnessrl.results import TrainResult
from harnessrl.rundir import append_jsonl, truncate_jsonl
from harnessrl.train import checkpoint, lora
from harnessrl.train.config import DistillConfig
from harnessrl.train.grpo import TrainingUnit, checkpointing_forward, plain_output_head
from harnessrl.train.progress import DISTILL_VIEW, StepProgress, mean
from harnessrl.train.step import sampling_seed
from harnessrl.train.update import TrainingDiverged, micro_batches, padded_batch

if TYPE_CHECKING:
    from harnessrl.kernel import JobContext
    from harnessrl.models.chat import ToolRole
    from harnessrl.models.hf import HFPolicy
    from harnessrl.store import RunStore

__all__ = [
    "DISTILL_RESUMABLE_CHANGES",
    "DistillConfig",
    "DistillError",
    "DistillRun",
    "DistillUnit",
    "TeacherContext",
    "TrainingDiverged",
    "check_protocols",
    "completion_logprobs",
    "distill_units",
    "distill_update",
    "reverse_kl_loss",
    "run_distill",
    "step_tasks",
]

# Options that may change on resume: none changes what the next steps compute (float rounding only).
DISTILL_RESUMABLE_CHANGES = ("steps", "checkpoint_every", "device", "gradient_checkpointing")


class DistillError(JobError):
    """Bad options, harnesses or run folder: reported before any training (the CLI exits 2)."""


# ------------------------------------------------------------------------------------------ the loss


def reverse_kl_loss(
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    normalizer: float | None = None,
    targets: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The per-token reverse KL, KL(student || teacher), summed over the positions given.

    student_logprobs, teacher_logprobs: [N, V], the log-softmax over the vocabulary at N completion
    positions (the student's sampled tokens), in the same order. Per position t:

        KL_t = sum_v exp(s[t, v]) * (s[t, v] - q[t, v])        s = student, q = teacher log-probs
        loss = sum_t KL_t / normalizer                         normalizer: N when None

    The teacher is a constant (detached): the gradient flows through the student's log-probs
    only, both through p_s = exp(s) and through s. The normalizer lets micro-batches accumulate
    the gradient of the mean over a whole step's tokens. KL_t >= 0, with equality exactly when the
    two distributions agree at t; N = 0 gives loss 0.

    Stats (python floats): kl (mean KL_t over these positions), kl_max, and with `targets` [N] (the
    sampled token ids) kl_sampled, the mean of the one-sample estimate s[t, y_t] - q[t, y_t].
    """
    if student_logprobs.shape != teacher_logprobs.shape or student_logprobs.dim() != 2:
        raise ValueError(
            f"student and teacher log-probs must both be [positions, vocabulary], got "
            f"{tuple(student_logprobs.shape)} and {tuple(teacher_logprobs.shape)}"
        )
    teacher = teacher_logprobs.detach().to(student_logprobs.dtype)
    per_token = (student_logprobs.exp() * (student_logprobs - teacher)).sum(dim=-1)
    n = student_logprobs.shape[0]
    denominator = float(normalizer) if normalizer is not None else float(max(n, 1))
    loss = per_token.sum() / denominator
    with torch.no_grad():
        stats = {
            "kl": float(per_token.mean()) if n else 0.0,
            "kl_max": float(per_token.max()) if n else 0.0,
        }
        if targets is not None:
            picked = targets.to(student_logprobs.device).unsqueeze(-1)
            sampled = student_logprobs.gather(-1, picked) - teacher.gather(-1, picked)
            stats["kl_sampled"] = float(sampled.mean()) if n else 0.0
    return loss, stats


def completion_logprobs(model, batch: dict[str, Tensor], temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """Teacher-forced log-softmax over the vocabulary at every completion position of a padded
    batch (`harnessrl.train.grpo.pad_units`): ([N, V], the N target token ids), N = the batch's
    completion tokens in row-major order (row by row, each row's completion left to right), so
    two batches of the same completions under different prompts line up position by position.

        out[n] = log_softmax(logits[b, t - 1] / temperature)     (b, t) = the n-th completion position

    As `harnessrl.train.grpo.token_logprobs`, but every token's log-prob instead of the sampled
    one's. Gradients flow (call under torch.no_grad() for the teacher)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    input_ids = batch["input_ids"].to(next(model.parameters()).device)
    attention_mask = batch["attention_mask"].to(input_ids.device)
    completion_mask = batch["completion_mask"].to(input_ids.device)
    rows, cols = completion_mask[:, 1:].nonzero(as_tuple=True)  # hidden state at cols predicts cols + 1
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with checkpointing_forward(base):
        if plain_output_head(base):
            hidden = base.get_decoder()(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
            logits = base.get_output_embeddings()(hidden[rows, cols]).float()
        else:
            logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[rows, cols]
    return torch.log_softmax(logits.float() / temperature, dim=-1), input_ids[rows, cols + 1]


# ------------------------------------------------------------------------------- the teacher's view


def check_protocols(student, teacher) -> None:
    """DistillError unless the two harness specs share their protocol format and native_tools:
    the teacher scores the student's replies, written in the student's format."""

    def shown(spec) -> str:
        return f"{spec.protocol.format}{', native tools' if spec.protocol.native_tools else ''}"

    if shown(student) != shown(teacher):
        raise DistillError(
            f"the teacher harness {teacher.name!r} (protocol {shown(teacher)}) and the student harness "
            f"{student.name!r} (protocol {shown(student)}) must share their protocol: the teacher scores the "
            "student's replies, written in the student's format"
        )


class TeacherContext:
    """The teacher's prompt of each model call of a student episode (see the module docstring).

    `student`, `teacher`: loop harness specs of one protocol format; `tokenizer` and `tool_role`:
    the policy's, so that a prompt renders exactly as the engine renders it."""

    def __init__(self, student, teacher, tokenizer, tool_role: ToolRole):
        check_protocols(student, teacher)
        self.student, self.teacher = student, teacher
        self.tokenizer, self.tool_role = tokenizer, tool_role
        self._openings: dict[tuple[str, str], tuple[list, list]] = {}

    def opening(self, task, which: str) -> tuple[list, list]:
        """(messages, tool schemas) a fresh episode of `task` in the student or teacher harness
        starts with: the system prompt, the demonstrations and the instruction (a plan-execute
        loop's plan request is not part of it)."""
        from harnessrl.harness.loops import Episode, InfraError

        key = (which, task.id)
        if key not in self._openings:
            spec = self.student if which == "student" else self.teacher
            try:
                episode = Episode(task, spec, 0)
            except InfraError as e:
                raise DistillError(f"task {task.id}: the {which} harness cannot set it up ({e})") from None
            try:
                messages = episode.messages()
                if episode.needs_plan:
                    messages = messages[:-1]
                self._openings[key] = (messages, list(episode.schemas))
            finally:
                episode.env.close()
        return self._openings[key]

    def prompt_ids(self, task, messages: list) -> list[int]:
        """The teacher's prompt ids of a model call whose prompt held `messages` (student's)."""
        from harnessrl.models import chat

        student, _ = self.opening(task, "student")
        teacher, tools = self.opening(task, "teacher")
        n = len(student)
        if len(messages) < n or messages[0].role != "system" or list(messages[1:n]) != list(student[1:]):
            raise DistillError(
                f"task {task.id}: a model call's prompt does not start with the student harness's opening "
                f"({self.student.name}: system prompt, demonstrations, instruction); cannot re-render it"
            )
        return chat.render_prompt_ids(self.tokenizer, [*teacher, *messages[n:]], self.tool_role, tools)


@dataclass
class DistillUnit:
    """One model call of a student episode: the student's unit (its prompt ids and the completion
    ids it sampled) and the teacher's prompt ids for the same completion."""

    student: TrainingUnit
    teacher_prompt_ids: list[int]

    def teacher(self) -> TrainingUnit:
        return dataclasses.replace(self.student, prompt_ids=list(self.teacher_prompt_ids))

    @property
    def tokens(self) -> int:
        return len(self.student.completion_ids)


def distill_units(trajectories, context: TeacherContext, tasks_by_id: dict[str, Any]) -> list[DistillUnit]:
    """One DistillUnit per model call with sampled tokens of every episode that is not an
    infrastructure error, in episode then call order."""
    units = []
    for traj in trajectories:
        if traj.is_infra_error:
            continue
        task = tasks_by_id[traj.task_id]
        for step in traj.steps:
            call = step.model_call
            if not call.completion_ids:
                continue
            if not call.messages:
                raise DistillError(
                    f"episode {traj.episode_id}: its model calls do not record their messages; the teacher's "
                    "prompt is built from them"
                )
            unit = TrainingUnit(
                prompt_ids=list(call.prompt_ids),
                completion_ids=list(call.completion_ids),
                old_logprobs=[0.0] * len(call.completion_ids),  # unused: no ratio here
                advantage=0.0,
                harness=traj.harness,
                episode_id=traj.episode_id,
            )
            units.append(DistillUnit(unit, context.prompt_ids(task, call.messages)))
    return units


# ------------------------------------------------------------------------------------ the update


@dataclass
class DistillUpdate:
    """What one optimizer step on a batch of DistillUnits came to (KL measured before the step)."""

    kl: float
    kl_max: float
    kl_sampled: float
    tokens: int
    padded_tokens: int
    grad_norm: float


def _micro_batches(units: list[DistillUnit], max_tokens: int) -> list[list[DistillUnit]]:
    """`micro_batches` by the longer of each unit's two rows (student's, teacher's)."""
    by_row = {}
    rows = []
    for u in units:
        row = u.student if len(u.student.prompt_ids) >= len(u.teacher_prompt_ids) else u.teacher()
        by_row[id(row)] = u
        rows.append(row)
    return [[by_row[id(r)] for r in mb] for mb in micro_batches(rows, max_tokens)]


def distill_update(
    peft_model,
    trainable: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    units: list[DistillUnit],
    *,
    pad_id: int,
    micro_batch: int,
    temperature: float,
    max_grad_norm: float,
) -> DistillUpdate:
    """One optimizer step of the mean reverse KL over every completion token of `units`
    (gradient accumulated over micro-batches, each normalised by the whole batch's tokens).
    Raises TrainingDiverged on a non-finite loss or gradient norm (no step is taken then)."""
    if not units:
        raise ValueError("no units to distil")
    total = sum(u.tokens for u in units)
    device = next(peft_model.parameters()).device
    peft_model.eval()
    optimizer.zero_grad(set_to_none=True)
    kl_sum = sampled_sum = 0.0
    kl_max, padded = 0.0, 0
    try:
        for mb in _micro_batches(units, micro_batch):
            student_batch = padded_batch([u.student for u in mb], pad_id, device)
            teacher_batch = padded_batch([u.teacher() for u in mb], pad_id, device)
            padded += student_batch["input_ids"].numel() + teacher_batch["input_ids"].numel()
            with torch.no_grad(), peft_model.disable_adapter():
                teacher, _ = completion_logprobs(peft_model, teacher_batch, temperature)
            student, targets = completion_logprobs(peft_model, student_batch, temperature)
            loss, stats = reverse_kl_loss(student, teacher, normalizer=total, targets=targets)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"the loss is {float(loss.detach())}")
            loss.backward()
            n = student.shape[0]
            kl_sum += stats["kl"] * n
            sampled_sum += stats["kl_sampled"] * n
            kl_max = max(kl_max, stats["kl_max"])
            del teacher, student, loss
        max_norm = max_grad_norm if max_grad_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, max_norm))
        if not math.isfinite(grad_norm):
            raise TrainingDiverged(f"the gradient norm is {grad_norm}")
    except TrainingDiverged:
        optimizer.zero_grad(set_to_none=True)
        raise
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return DistillUpdate(kl_sum / total, kl_max, sampled_sum / total, total, padded, grad_norm)


def step_tasks(train_tasks: list, n: int, seed: int, step: int) -> list:
    """The step's n distinct train tasks: a function of (seed, step) alone (a resumed step draws
    exactly what the uninterrupted run drew)."""
    picked = random.Random(f"harnessrl-distill-tasks:{seed}:{step}").sample(range(len(train_tasks)), n)
    return [train_tasks[i] for i in picked]


# ------------------------------------------------------------------------------------------ the run


class DistillRun(lora.WritesAdapter):
    """`DistillRun(ctx)` (its context from the job kernel, which read the suite and both harnesses
    its options name) checks what is left (the harnesses' protocols, the model, the run folder) and
    raises DistillError; `run()` loads the model and trains. Objects given to the kernel in place of
    names (tests shrink harness rules this way) are recorded by name and their specs' content."""

    trained_by = "harnessrl train distill"

    def __init__(self, ctx: JobContext):
        from rich.console import Console

        self.suite = ctx.inputs.suite
        self.teacher, self.student = ctx.inputs.harness["teacher_harness"], ctx.inputs.harness["student_harness"]
        check_protocols(self.student, self.teacher)
        # recorded by name (a spec file's content is recorded beside it)
        self.config = config = ctx.config.replace(teacher_harness=self.teacher.name, student_harness=self.student.name)
        self.model_choice = lora.trained_model(config, DistillError, ctx.model())  # chosen once (harnessrl.kernel)
        self.out, self.resume, self.progress, self.executor = ctx.out, ctx.resume, ctx.progress, ctx.executor
        self.folder = lora.open_run_folder(
            self.out, "distillation", config, self.model_choice, resume=self.resume,
            may_differ=DISTILL_RESUMABLE_CHANGES,
            teacher_spec=self.teacher.to_dict(), student_spec=self.student.to_dict(),
        )  # fmt: skip
        lora.record_start(self.folder, [self.student], self.suite.offers_shell, self.executor)
        self.console = ctx.console if ctx.console is not None else Console(stderr=True)
        self.step = 0
        self.store: RunStore | None = None
        self.policy: HFPolicy | None = None  # the model, loaded by run()

    # -- setup (slow: the model) ----------------------------------------------------------------------
    def _setup(self) -> None:
        from harnessrl.models.base import SamplingParams
        from harnessrl.rollout import Runner

        cfg = self.config
        self.policy = policy = lora.load_local_policy(self.model_choice, DistillError, training=cfg)
        # LoRA in policy.model itself: the student generates with the adapter; the teacher is the
        # same model with the adapter disabled
        self.peft_model, self.trainable, self.optimizer = lora.attach(policy, cfg, DistillError)
        self.context = TeacherContext(self.student, self.teacher, policy.tokenizer, policy.tool_role)
        sampling = SamplingParams(temperature=cfg.temperature, top_p=1.0, seed=sampling_seed(cfg.seed, 0, "distill"))
        self.runner = Runner(
            policy,
            sampling,
            max_in_flight=cfg.max_in_flight,
            max_retries=cfg.retries,
            progress=False,
            executor=self.executor,
        )
        self.train_tasks = self.suite.tasks("train")
        self.tasks_by_id = {t.id: t for t in self.train_tasks}

    def _open_store(self) -> None:
        cfg = self.config
        if not cfg.save_rollouts:
            return
        from harnessrl.store import RunStore

        self.store = store = RunStore(self.out / "rollouts")
        store.set_meta(
            "config",
            {
                "kind": "distill-rollouts",
                "suite": cfg.suite,
                "split": "train",
                "model": cfg.model,
                "seed": cfg.seed,
                "attempts": cfg.attempts,
                "harnesses": {self.student.name: self.student.to_dict()},
            },
        )
        # episodes of steps after the checkpoint are from a killed attempt: they are run again
        store.delete_attempts_from(self.step * cfg.attempts)
        self.runner.on_episode = store.add

    # -- checkpoints ---------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        return checkpoint.save(self.out, self.peft_model, self.optimizer, {"step": self.step})

    def load_checkpoint(self) -> bool:
        saved = checkpoint.read(self.out)
        if saved is None:
            return False
        state = checkpoint.restore(saved, self.peft_model, self.optimizer, DistillError)
        self.step = int(state["step"])
        return True

    def adapter_facts(self) -> dict[str, Any]:
        """harnessrl.json of OUT/adapter also names the suite, the student and the teacher harness."""
        return {"suite": self.config.suite, "harness": self.student.name, "teacher_harness": self.teacher.name}

    # -- one step --------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """Sample the step's student episodes, then one optimizer step toward the teacher."""
        from harnessrl.rollout import Job

        cfg, step, policy = self.config, self.step, self.policy
        if policy is None:
            raise DistillError("train_step() needs the model: run() loads it first")
        t0 = time.perf_counter()
        tasks = step_tasks(self.train_tasks, cfg.tasks_per_step, cfg.seed, step)
        seed = sampling_seed(cfg.seed, step, "distill")
        self.runner.sampling = self.runner.sampling.model_copy(update={"seed": seed})
        policy.generate_calls = 0  # the step's noise: a function of (seed, step) alone
        jobs = [Job(task, self.student, step * cfg.attempts + i) for task in tasks for i in range(cfg.attempts)]
        trajectories = self.runner.run(jobs)
        t_rollout = time.perf_counter() - t0
        units = distill_units(trajectories, self.context, self.tasks_by_id)
        scores = [t.grade.score for t in trajectories if not t.is_infra_error and t.grade is not None]
        passed = [t.grade.passed for t in trajectories if not t.is_infra_error and t.grade is not None]
        update = None
        t1 = time.perf_counter()
        if units:
            with policy.paused():
                policy.clear_cache()  # stale after the optimizer step
                update = distill_update(
                    self.peft_model,
                    self.trainable,
                    self.optimizer,
                    units,
                    pad_id=policy.pad_id,
                    micro_batch=cfg.micro_batch,
                    temperature=cfg.temperature,
                    max_grad_norm=cfg.max_grad_norm,
                )
        self.step += 1
        n_teacher = sum(len(u.teacher_prompt_ids) for u in units)
        n_student = sum(len(u.student.prompt_ids) for u in units)
        return {
            "step": self.step,
            "tasks": [t.id for t in tasks],
            "sampling_seed": seed,
            "episodes": len(trajectories),
            "infra_errors": sum(t.is_infra_error for t in trajectories),
            "reward_mean": mean(scores),
            "pass_rate": mean([float(p) for p in passed]),
            "units": len(units),
            "completion_tokens": update.tokens if update else 0,
            "padded_tokens": update.padded_tokens if update else 0,
            "teacher_prompt_tokens_mean": n_teacher / len(units) if units else None,
            "student_prompt_tokens_mean": n_student / len(units) if units else None,
            "loss": update.kl if update else None,
            "kl": update.kl if update else None,
            "kl_max": update.kl_max if update else None,
            "kl_sampled": update.kl_sampled if update else None,
            "grad_norm": update.grad_norm if update else None,
            "optimizer_step": update is not None,
            "skipped": None if update else "no model call sampled a token",
            "lr": cfg.lr,
            "time": {"rollout": t_rollout, "update": time.perf_counter() - t1, "total": time.perf_counter() - t0},
        }

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> TrainResult:
        """Train until --steps; returns a short summary. Raises TrainingDiverged on NaN."""
        try:
            self._setup()
            return self._loop()
        finally:
            if self.policy is not None:
                self.policy.close()  # the engine thread
            if self.store is not None:
                self.store.close()

    def _loop(self) -> TrainResult:
        cfg = self.config
        if self.resume and self.load_checkpoint():
            self._say(f"resuming {self.out} from step {self.step}")
        elif self.resume:
            self._say(f"{self.out} has no checkpoint yet: starting from step 0")
        if self.step > cfg.steps:
            raise DistillError(
                f"--steps {cfg.steps} is below the checkpoint's step {self.step}; give --steps {self.step} or more"
            )
        metrics_path = self.out / "metrics.jsonl"
        self.folder.start()
        if self.resume:
            truncate_jsonl(metrics_path, self.step)
        self._open_store()
        last: dict[str, Any] = {}
        with StepProgress(DISTILL_VIEW, self.console, cfg.steps, self.step, self.progress) as bar:
            while self.step < cfg.steps:
                try:
                    record = self.train_step()
                except TrainingDiverged as e:
                    at = checkpoint.step_of(self.out)
                    append_jsonl(metrics_path, {"step": self.step + 1, "stopped": str(e)})
                    where = f"the checkpoint of step {at} is intact" if at is not None else "no checkpoint yet"
                    raise TrainingDiverged(
                        f"step {self.step + 1}: {e}: training stopped; {where} (continue with --resume, "
                        "or start again with a lower --lr)"
                    ) from None
                append_jsonl(metrics_path, record)
                bar.update(record)
                last = record
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    self.save_checkpoint()
        if not (self.out / "checkpoint").exists():
            self.save_checkpoint()
        adapter = self.save_adapter()
        return TrainResult(steps=self.step, adapter=str(adapter), last=last)

    def _say(self, text: str) -> None:
        if self.progress:
            self.console.print(text, highlight=False, markup=False)


def run_distill(ctx: JobContext) -> TrainResult:
    """`harnessrl train distill` over its job context (harnessrl.kernel.enter)."""
    return DistillRun(ctx).run()
