"""HarnessRollout: TRL's `rollout_func` that plays every prompt as a whole harnessrl episode.

    rollout = HarnessRollout("toolcalc", ["json-tools", "react", "plan-execute"], scheduler="harness-bandit")
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=rollout.dataset("train"),
                          reward_funcs=rollout.reward, rollout_func=rollout, callbacks=[rollout.callback],
                          peft_config=LoraConfig(...))
    trainer.train()

One call of the rollout function is one generation batch of TRL (`per_device_train_batch_size *
steps_per_generation` rows per process, `num_generations` consecutive rows per prompt). For it:

1. the schedule plans the batch (`HarnessSchedule.plan`): the scheduler selects ONE harness for
   every group of the batch (or shares of them for `mixed` / `ratio:`), the same on every process
   (same seeded state, same observations);
2. each row becomes an episode of the row's task (the prompt's `task_id`) under its group's harness,
   attempt `(batch * groups + group) * num_generations + row within the group`, sampled by the
   model TRL is training (its unwrapped model, LoRA included, through harnessrl's engine: token in,
   token out) at TRL's temperature, top_p, top_k, min_p and repetition_penalty, with the seed
   `sampling_seed(seed, batch, "train")`;
3. each episode becomes one completion (`harnessrl.train.episode_sequence`): its first prompt, then
   every model turn with the harness's and tools' tokens between them under `env_mask = 0`;
4. its grade is the reward (the `harnessrl_score` field, returned by `rollout.reward`); an
   infrastructure error is `None`, which TRL leaves out of the group baseline and gives advantage 0
   (its completion is one masked token), as our own trainer leaves it out;
5. the batch's scores become its observation (advantages per harness), which the callback completes
   with the gradient sketch of the batch's optimizer steps and reports to the scheduler.

Everything a run decides is a function of the seed and the batch index (TRL's `global_step` at
generation), so a run resumed from a TRL checkpoint (whose trainer_state.json holds the schedule's
state: `stateful_callbacks["HarnessRollout"]`) plays the same harnesses on the same seeds.

Rank 0 writes `OUTPUT_DIR/harnessrl/`: `steps.jsonl` (one line per batch, at its observation) and
`rollouts/run.db` (every episode, for `harnessrl triage` / `report`).

With `eval_every`, the trained and the held-out harnesses (`eval_harnesses`) are evaluated at
step 0 (the first batch, before its episodes) and every N steps (the callback), every time with
the base's sampling seed: `OUTPUT_DIR/harnessrl/eval.jsonl` (harnessrl.train.held_out) and
`harnessrl/eval/...` on TRL's log.

Before the first episode (`preflight=True`, the default: at the first batch, before its episodes
and the base evaluation at step 0) every harness's first request, the held-out ones included, of
that batch's first task is measured against the model TRL trains, as `harnessrl train
grpo` does (harnessrl.preflight.check_before_run): a request that cannot fit its context, or an
agent program that cannot make its first request (not found, crashed, refused, a sandbox limit
or a hang before it), is refused with the reason and the fix before any episode runs.

Not served: TRL's vLLM generation (`use_vllm=True`), its evaluation loop (`eval_strategy`),
`generation_kwargs`, gradients sharded by FSDP or DeepSpeed ZeRO (the sketch needs
every process to hold the whole gradient), mixed precision and non-float32 weights, reward
functions beside `rollout.reward`, `reward_weights`, TRL's `tools`. Each is refused with an error
saying so, TRL's arguments' at the callback's on_train_begin, the trainer's at the first batch,
both before the step-0 evaluation. Served in harnessrl's terms: max_completion_length (each model
call's token cap) and mask_truncated_completions (an episode a budget or a token cap cut).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.harness.spec import AnyHarnessSpec, HarnessSpec
from harnessrl.integrations.trl.setup import (
    HarnessRolloutError,
    RolloutInputError,
    TrainerFacts,
    generating_module,
    max_completion_length,
    text_tokenizer,
)
from harnessrl.models.base import SamplingParams
from harnessrl.results import TrainEval
from harnessrl.rollout import Job
from harnessrl.tasks.base import Suite, Task
from harnessrl.train.episode_sequence import EpisodeSequence, OnBreak, episode_sequence
from harnessrl.train.harness_schedule import BatchObservation, GenerationPlan, HarnessSchedule
from harnessrl.train.held_out import check_held_out, evaluation_seed, first_evaluation, run_evaluation
from harnessrl.train.schedulers import make_scheduler
from harnessrl.train.sketch import GradientSketch
from harnessrl.train.step import sampling_seed
from harnessrl.types import Termination, Trajectory

if TYPE_CHECKING:
    from harnessrl.integrations.trl.callback import HarnessSchedulerCallback
    from harnessrl.models.hf import HFPolicy
    from harnessrl.rollout import Runner
    from harnessrl.store import RunStore

TASK_KEY = "task_id"  # the key of a prompt message that names its task (see `HarnessRollout.dataset`)
RECORD_FOLDER = "harnessrl"  # under TRL's output_dir


class EpisodeReward:
    """TRL's reward function for HarnessRollout: each row's episode score (the `harnessrl_score`
    field the rollout returned; None for an infrastructure error). It also hands the batch's
    metrics to TRL's log (`log_metric`): reward per harness, learnability, the scheduler's
    probabilities, the share of turns left out at prefix breaks."""

    __name__ = "harnessrl"

    def __init__(self, rollout: HarnessRollout):
        self.rollout = rollout

    def __call__(self, prompts=None, completions=None, harnessrl_score=None, log_metric=None, **kwargs):
        if harnessrl_score is None:
            raise HarnessRolloutError(
                "the harnessrl reward needs the harnessrl_score field: pass rollout_func=the same HarnessRollout"
            )
        if log_metric is not None:
            for name, value in self.rollout.batch_metrics.items():
                log_metric(name, value)
        return [None if s is None else float(s) for s in harnessrl_score]


class HarnessRollout:
    """TRL's rollout_func, reward and callback for training through harnessrl harnesses (module docstring).

    suite: a suite name or object. harnesses: built-in names, spec files or specs (unique names).
    scheduler / scheduler_options / seed: as `harnessrl train grpo` (`make_scheduler`). sketch_dim /
    sketch_kind: the GradientSketch. sampled_history: each call's prompt continues the tokens the
    model sampled (HFPolicy.sampled_history), so an episode's calls extend one another; False
    renders the history from its text, as `harnessrl eval` does. on_prefix_break: "truncate"
    (train the turns before a prefix break, count the rest) or "error"
    (harnessrl.train.episode_sequence). max_in_flight / retries:
    the runner's. executor: where environments and graders run (default in process). preflight:
    measure every harness's first request before the first batch and refuse one that cannot be
    served (module docstring); False skips it.
    """

    def __init__(
        self,
        suite: str | Suite,
        harnesses: Sequence[str | AnyHarnessSpec],
        *,
        scheduler: str = "harness-bandit",
        scheduler_options: dict[str, Any] | None = None,
        seed: int = 0,
        sketch_dim: int = 512,
        sketch_kind: str = "countsketch",
        on_prefix_break: OnBreak = "truncate",
        sampled_history: bool = True,
        max_in_flight: int = 16,
        retries: int = 2,
        executor=None,
        eval_harnesses: Sequence[str | AnyHarnessSpec] = (),
        eval_every: int = 0,
        eval_tasks: int = 8,
        eval_attempts: int = 1,
        eval_temperature: float | None = None,
        preflight: bool = True,
    ):
        from harnessrl.integrations.trl.callback import HarnessSchedulerCallback

        self.suite, self.specs, self.eval_specs, self.eval_task_list = read_rollout_inputs(
            suite, harnesses, eval_harnesses, eval_every, eval_tasks, eval_attempts, eval_temperature
        )
        names = [s.name for s in self.specs]
        self.eval_every, self.eval_tasks, self.eval_attempts = eval_every, eval_tasks, eval_attempts
        self.eval_temperature = eval_temperature
        self._base_eval: TrainEval | None = None
        for spec in self.specs:
            check_prefix_chain(spec)
        if on_prefix_break not in ("truncate", "error"):
            raise HarnessRolloutError(f"on_prefix_break must be 'truncate' or 'error', got {on_prefix_break!r}")
        try:
            chosen = make_scheduler(scheduler, names, seed=seed, **(scheduler_options or {}))
            sketcher = GradientSketch(dim=sketch_dim, seed=seed, kind=sketch_kind)
        except (ValueError, TypeError) as e:
            raise HarnessRolloutError(str(e)) from None
        self.schedule = HarnessSchedule(chosen, sketcher)
        self.seed = seed
        self.on_prefix_break: OnBreak = on_prefix_break
        self.sampled_history = sampled_history
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.preflight = preflight  # set False once the check ran (the first batch or evaluation)
        self.executor = executor
        self.spec_by_name = {s.name: s for s in self.specs}
        self.reward = EpisodeReward(self)
        self.callback: HarnessSchedulerCallback = HarnessSchedulerCallback(self)
        self.batch_metrics: dict[str, float] = {}  # the last batch's, for TRL's log (EpisodeReward)
        self.history: list[GenerationPlan] = []  # every batch planned by this object, in order
        self._tasks: dict[str, Task] = {}
        self._policy: HFPolicy | None = None
        self._runner: Runner | None = None
        self._store: RunStore | None = None
        self._facts: TrainerFacts | None = None
        self.token_cap: int | None = None  # TRL's max_completion_length: each model call's cap (configure)
        self._own_specs: tuple[list[AnyHarnessSpec], list[AnyHarnessSpec]] | None = None
        self.mask_truncated = False  # TRL's mask_truncated_completions, served here (`_rows`)

    def configure(self, args) -> None:
        """What TRL's arguments set (the callback's on_train_begin, and the first batch): each
        model call's token cap is max_completion_length where it is below the harness's own
        max_new_tokens (TRL's meaning: the tokens one generation may add), for the trained and the
        held-out harnesses alike."""
        if self._own_specs is None:
            self._own_specs = (list(self.specs), list(self.eval_specs))  # as given, before any cap
        self.token_cap = cap = max_completion_length(args)
        self.specs = [capped(s, cap) for s in self._own_specs[0]]
        self.eval_specs = [capped(s, cap) for s in self._own_specs[1]]
        self.spec_by_name = {s.name: s for s in self.specs}

    # ------------------------------------------------------------------------------- the dataset
    def dataset(self, split: str = "train", n: int | None = None):
        """The split's first n tasks (all by default) as a `datasets.Dataset` with a conversational
        `prompt` (the task's instruction, its message carrying the task id under "task_id": TRL
        hands the rollout function the prompts alone) and a `task_id` column."""
        from datasets import Dataset

        try:
            tasks = self.suite.tasks(split, n)
        except ValueError as e:
            raise HarnessRolloutError(str(e)) from None
        for task in tasks:
            self._tasks[task.id] = task
        return Dataset.from_list(
            [{"prompt": [{"role": "user", "content": t.instruction, TASK_KEY: t.id}], TASK_KEY: t.id} for t in tasks]
        )

    def task(self, prompt: Any) -> Task:
        """The task a TRL prompt names (a message list whose first message has "task_id", or the id itself)."""
        task_id = prompt if isinstance(prompt, str) else None
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            task_id = prompt[0].get(TASK_KEY)
        if not task_id:
            raise HarnessRolloutError(
                f"a prompt without a task id ({str(prompt)[:120]!r}): build the dataset with HarnessRollout.dataset(), "
                f"or give each prompt's first message a {TASK_KEY!r} key"
            )
        if task_id not in self._tasks:
            try:
                self._tasks[task_id] = self.suite.task(task_id)
            except (ValueError, IndexError, KeyError) as e:
                raise HarnessRolloutError(f"task {task_id!r} is not in suite {self.suite.name!r}: {e}") from None
        return self._tasks[task_id]

    # ----------------------------------------------------------------------- the rollout function
    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        """TRL's rollout_func: one episode per prompt row (module docstring)."""
        facts = TrainerFacts.of(trainer)
        if not facts.training:
            raise HarnessRolloutError(
                "TRL's evaluation loop (eval_strategy) is not served by HarnessRollout: set eval_strategy='no' and "
                "evaluate with HarnessRollout(eval_every=N, eval_harnesses=[...]) (docs/trl.md)"
            )
        self._bind(trainer, facts, prompts)
        if self.eval_every and self._base_eval is None and facts.global_step == 0 and facts.is_main:
            # the base weights (LoRA starts as the identity), what later evaluations pair with: here,
            # once the trainer is checked, so that every refusal comes before it
            record = self.evaluate(trainer.model, trainer.processing_class, 0, facts.output_dir, facts.temperature)
            facts.log(evaluation_metrics(record))
        started = time.perf_counter()
        G = facts.num_generations
        batch = facts.batch_index()
        every_task = facts.gather([self.task(p).id for p in prompts])
        if len(every_task) % G:
            raise HarnessRolloutError(f"{len(every_task)} rows do not make groups of num_generations={G}")
        groups = len(every_task) // G
        for g in range(groups):
            if len(set(every_task[g * G : (g + 1) * G])) != 1:
                raise HarnessRolloutError(
                    f"group {g} of batch {batch} mixes tasks {sorted(set(every_task[g * G : (g + 1) * G]))}: "
                    "TRL's RepeatSampler gives num_generations consecutive rows per prompt (do not replace its sampler)"
                )
        plan = self.schedule.plan(batch, groups)
        self.history.append(plan)
        offset = facts.process_index * len(prompts)
        jobs = [
            Job(
                self.task(p),
                self.spec_by_name[plan.group_harness[(offset + i) // G]],
                attempt=(batch * groups + (offset + i) // G) * G + (offset + i) % G,
            )
            for i, p in enumerate(prompts)
        ]
        assert self._runner is not None and self._policy is not None
        # TRL's default optimizer (adamw_torch_fused) updates the weights without bumping their
        # version counters, which is how the engine notices a change by itself (WeightsWatch): every
        # batch starts from a clean cache and freshly packed weights
        self._policy.clear_cache()
        self._runner.sampling = SamplingParams(
            temperature=facts.temperature,
            top_p=facts.top_p,
            seed=sampling_seed(self.seed, batch, "train"),
            **facts.shaping,
        )
        trajectories = self._runner.run(jobs)
        sequences = [self._sequence(t) for t in trajectories]
        truncated = [self.mask_truncated and is_truncated(t) for t in trajectories]
        scores = [None if t.is_infra_error or t.grade is None else float(t.grade.score) for t in trajectories]
        every_score = facts.gather(scores)
        observation = self.schedule.record(plan, every_score, G, facts.scale)
        kept = facts.gather(
            [(s.turns, s.turns_kept, s.model_tokens, s.model_tokens_kept) if s else None for s in sequences]
        )
        every_episode = facts.gather(trajectories)
        observation.extra = _batch_facts(observation, len(every_score), kept, time.perf_counter() - started, self.seed)
        self.batch_metrics = _log_metrics(self.schedule, observation)
        if self._store is not None:
            for traj in every_episode:
                self._store.add(traj)
        self.batch_metrics["harnessrl/truncated"] = float(sum(is_truncated(t) for t in every_episode))
        return self._rows(trajectories, sequences, scores, truncated)

    def _sequence(self, trajectory: Trajectory) -> EpisodeSequence | None:
        if trajectory.is_infra_error:
            return None
        return episode_sequence(trajectory, self.on_prefix_break)

    def _rows(
        self,
        trajectories: list[Trajectory],
        sequences: list[EpisodeSequence | None],
        scores: list[float | None],
        truncated: list[bool] | None = None,
    ) -> dict[str, list]:
        """TRL's rows: one per episode; `truncated` episodes (mask_truncated_completions) all under
        env_mask 0."""
        assert self._policy is not None
        filler = self._policy.stop_ids[0] if self._policy.stop_ids else self._policy.pad_id
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        for seq, cut in zip(sequences, truncated or [False] * len(sequences)):
            if seq is None:  # no token sampled (an infrastructure error): one masked token
                out["prompt_ids"].append([filler])
                out["completion_ids"].append([filler])
                out["logprobs"].append([0.0])
                out["env_mask"].append([0])
                continue
            out["prompt_ids"].append(seq.prompt_ids)
            out["completion_ids"].append(seq.completion_ids)
            out["logprobs"].append(seq.logprobs)
            out["env_mask"].append([0] * len(seq.env_mask) if cut else seq.env_mask)  # out of the loss
        out["harnessrl_score"] = scores
        out["harnessrl_harness"] = [t.harness for t in trajectories]
        out["harnessrl_episode"] = [t.episode_id for t in trajectories]
        return out

    def _bind(self, trainer, facts, prompts: list) -> None:
        """On the first batch: the preflight on its first task, the policy over TRL's model, the
        runner, the run's record folder."""
        if self._runner is not None:
            if self._policy is not None and self._policy.model is not facts.generation_model():
                raise HarnessRolloutError(
                    "the trainer's model changed between batches: use one HarnessRollout per trainer"
                )
            return
        from harnessrl.executors import LocalExecutor
        from harnessrl.rollout import Runner

        facts.check(self.reward)
        self.configure(facts.args)
        self.mask_truncated = facts.take_truncation_masking()
        self._facts = facts
        policy = self._ensure_policy(facts.generation_model(), facts.tokenizer())
        if prompts:
            self._preflight(policy, self.task(prompts[0]), facts.is_main)
        self._runner = Runner(
            policy,
            max_in_flight=self.max_in_flight,
            max_retries=self.retries,
            progress=False,
            executor=self.executor if self.executor is not None else LocalExecutor(),
        )
        if facts.is_main:
            from harnessrl.rundir import truncate_jsonl
            from harnessrl.store import RunStore

            folder = Path(facts.output_dir) / RECORD_FOLDER
            self._store = RunStore(folder / "rollouts")
            # a resumed run plays the batches after its checkpoint again: their records go
            self._store.delete_attempts_from(facts.batch_index() * facts.groups_per_batch() * facts.num_generations)
            truncate_jsonl(folder / "steps.jsonl", facts.global_step)

    def _preflight(self, policy: HFPolicy, task: Task, speak: bool) -> None:
        """Once, before the first episode (the first batch's, or an evaluation's without a batch): every
        harness's first request of `task`, the held-out ones included, measured against the model
        TRL trains (its tokenizer and context): HarnessRolloutError with the reason and the fix where
        one cannot fit or an agent program made none (harnessrl.preflight.check_before_run)."""
        if not self.preflight:
            return
        from harnessrl.models.prompt_model import PromptModel
        from harnessrl.preflight import PreflightRefused, check_before_run

        context = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
        model = PromptModel("trl-model", policy.tokenizer, int(context) if context else None)

        def log(line: str) -> None:
            if speak:
                print(f"[harnessrl] {line}", file=sys.stderr, flush=True)

        try:
            check_before_run(model, [*self.specs, *self.eval_specs], task, log, skip="HarnessRollout(preflight=False)")
        except PreflightRefused as e:
            raise HarnessRolloutError(str(e)) from None
        self.preflight = False  # checked: not again

    def _ensure_policy(self, model, tokenizer) -> HFPolicy:
        """harnessrl's engine over the model TRL trains (built once; the rollouts and evaluations share it)."""
        if self._policy is not None:
            return self._policy
        from harnessrl.models.engine_config import EngineConfig
        from harnessrl.models.hf import HFPolicy

        try:
            self._policy = HFPolicy(
                model, tokenizer, name="trl-model", max_batch=self.max_in_flight, engine=EngineConfig.from_env()
            )
        except ValueError as e:
            raise HarnessRolloutError(f"harnessrl's engine cannot generate with this model: {e}") from None
        self._policy.sampled_history = self.sampled_history
        return self._policy

    # ------------------------------------------------------------------------------ the callback's
    def evaluate(self, model, tokenizer, step: int, output_dir: str, temperature: float) -> TrainEval:
        """The trained and the held-out harnesses on the first eval_tasks dev tasks,
        eval_attempts attempts each, with the weights as they are (harnessrl.train.held_out); the
        record is appended to OUTPUT_DIR/harnessrl/eval.jsonl. The first evaluation of a run (step
        0: the base weights) is the base the later ones pair with."""
        from harnessrl.executors import LocalExecutor
        from harnessrl.rollout import Runner
        from harnessrl.rundir import append_jsonl

        policy = self._ensure_policy(generating_module(model), text_tokenizer(tokenizer))
        policy.clear_cache()
        tasks = self.eval_task_list
        if tasks:
            self._preflight(policy, tasks[0], speak=True)  # rank 0 alone evaluates
        seed = evaluation_seed(self.seed)  # every evaluation the base's: the pairing compares weights
        temperature = self.eval_temperature if self.eval_temperature is not None else temperature
        runner = Runner(
            policy.with_sampling(SamplingParams(temperature=temperature, top_p=1.0, seed=seed), name="trl-model"),
            SamplingParams(temperature=temperature, top_p=1.0, seed=seed),
            max_in_flight=self.max_in_flight,
            max_retries=self.retries,
            progress=False,
            executor=self.executor if self.executor is not None else LocalExecutor(),
        )
        record = run_evaluation(
            runner, tasks, self.specs, self.eval_specs, step=step, attempts=self.eval_attempts, base=self._base_eval
        )
        if self._base_eval is None:
            self._base_eval = record
        scores = "  ".join(
            f"{h}{' (held out)' if v.held_out else ''} {v.mean_score:.3f}"
            for h, v in record.harnesses.items()
            if v.mean_score is not None
        )
        print(f"[harnessrl] eval at step {step} ({record.seconds:.0f} s): {scores}", file=sys.stderr, flush=True)
        folder = Path(output_dir) / RECORD_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        append_jsonl(folder / "eval.jsonl", record.model_dump())
        return record

    def resume_evaluations(self, output_dir: str, global_step: int) -> None:
        """A resumed run: evaluations after the checkpoint go from eval.jsonl (they are made again); the
        base comes from the checkpoint's state (load_state)."""
        from harnessrl.rundir import truncate_jsonl

        path = Path(output_dir) / RECORD_FOLDER / "eval.jsonl"
        truncate_jsonl(path, global_step)
        if self._base_eval is None:  # a checkpoint from before the state held it
            self._base_eval = first_evaluation(path)

    def observe_batch(self, output_dir: str, is_main: bool, global_step: int) -> None:
        """The callback, at the last optimizer step of a batch: the scheduler observes it; rank 0
        appends its line to steps.jsonl."""
        observation, transfer = self.schedule.observe()
        if not is_main:
            return
        record = {
            "step": global_step + 1,  # optimizer steps taken, this batch's last included (TRL's global_step)
            **observation.extra,
            "optimizer_steps": observation.optimizer_steps,
            "sketch_norm": None if observation.sketch is None else float(observation.sketch.norm()),
            "transfer": transfer,
            "probabilities_after": self.schedule.scheduler.probabilities(),
        }
        folder = Path(output_dir) / RECORD_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "steps.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def log_evaluation(self, record: TrainEval) -> None:
        """An evaluation's figures onto TRL's log line of its step (evaluation_metrics)."""
        if self._facts is not None:
            self._facts.add_metrics(evaluation_metrics(record))

    def state(self) -> dict[str, Any]:
        """What a TRL checkpoint keeps of this object (in its TrainerState, the callback's
        on_step_end): the schedule's state and the base evaluation later ones pair with."""
        return {
            "schedule": self.schedule.state_dict(),
            "base_eval": None if self._base_eval is None else self._base_eval.model_dump(mode="json"),
        }

    def load_state(self, state: dict[str, Any] | None, where: str) -> None:
        """The state of `state()` back, from the TrainerState of the checkpoint TRL resumes (the
        callback's on_train_begin); `where` names it in errors."""
        if not isinstance(state, dict) or "schedule" not in state:
            raise HarnessRolloutError(
                f"{where} holds no HarnessRollout state: the checkpoint was not written with HarnessRollout's "
                "callback, so the scheduler's state cannot be restored (a resumed run would choose other harnesses)"
            )
        try:
            self.schedule.load_state_dict(state["schedule"])
            base = state.get("base_eval")
            self._base_eval = None if base is None else TrainEval.model_validate(base)
        except (ValueError, KeyError, TypeError) as e:
            raise HarnessRolloutError(f"{where}: {e}") from None


def read_rollout_inputs(
    suite: str | Suite,
    harnesses: Sequence[str | AnyHarnessSpec],
    eval_harnesses: Sequence[str | AnyHarnessSpec],
    eval_every: int,
    eval_tasks: int,
    eval_attempts: int,
    eval_temperature: float | None,
) -> tuple[Suite, list[AnyHarnessSpec], list[AnyHarnessSpec], list[Task]]:
    """The suite, the trained and held-out harnesses and the evaluation's dev tasks, read as `harnessrl
    train grpo` reads its own (harnessrl.kernel.read_inputs over a TrainConfig naming them: its
    checks, each refusal naming the argument), then the held-out rule (check_held_out). Objects
    (a Suite, HarnessSpecs) stand in for names as they do for a library caller of the kernel."""
    from harnessrl.kernel import job_harnesses, job_tasks, read_inputs
    from harnessrl.train.config import TrainConfig

    def listed(values: Sequence[str | AnyHarnessSpec], option: str) -> list[AnyHarnessSpec] | None:
        if all(isinstance(v, str) for v in values):
            return None  # names: the kernel reads them
        return [
            s for v in values for s in (job_harnesses([v], option, RolloutInputError) if isinstance(v, str) else [v])
        ]

    given: dict[str, Any] = {}
    if not isinstance(suite, str):
        given["suite"] = suite
    for field, values in (("harnesses", harnesses), ("eval_harnesses", eval_harnesses)):
        specs = listed(values, field)
        if specs is not None:
            given[field] = specs
    names = {
        f: [v if isinstance(v, str) else v.name for v in vals]
        for f, vals in (("harnesses", harnesses), ("eval_harnesses", eval_harnesses))
    }
    try:
        config = TrainConfig(
            suite=suite if isinstance(suite, str) else suite.name,
            harnesses=names["harnesses"] if "harnesses" not in given else [s.name for s in given["harnesses"]],
            eval_harnesses=names["eval_harnesses"]
            if "eval_harnesses" not in given
            else [s.name for s in given["eval_harnesses"]],
            tasks_per_step=1,  # the train split must hold a task; TRL's dataset draws the rest
            eval_every=eval_every,
            eval_tasks=eval_tasks,
            eval_attempts=eval_attempts,
            **({} if eval_temperature is None else {"eval_temperature": eval_temperature}),
        ).check(RolloutInputError)
    except ValueError as e:
        if isinstance(e, RolloutInputError):
            raise
        raise RolloutInputError(str(e)) from None
    inputs = read_inputs(config, RolloutInputError, given)
    specs, held_out = list(inputs.harnesses["harnesses"]), list(inputs.harnesses.get("eval_harnesses", []))
    try:
        check_held_out([s.name for s in specs], [s.name for s in held_out])
    except ValueError as e:
        raise RolloutInputError(f"eval_harnesses: {e}") from None
    tasks = job_tasks(inputs.suite, "dev", eval_tasks, "--eval-tasks", RolloutInputError) if eval_every else []
    return inputs.suite, specs, held_out, tasks


def check_prefix_chain(spec: AnyHarnessSpec) -> None:
    """Refuse a harness whose calls are not prefixes of one another by design: a history window
    (or an observation window) shorter than its step budget drops (or elides) old turns from later
    prompts, so one TRL completion cannot hold its episodes. A window no shorter than max_steps
    never acts and is accepted."""
    if not isinstance(spec, HarnessSpec):
        return
    rules = spec.rules
    for name, window in (("history_window", rules.history_window), ("observation_window", rules.observation_window)):
        if window is not None and window < rules.max_steps:
            raise HarnessRolloutError(
                f"harness {spec.name!r} has rules.{name} = {window} below its max_steps ({rules.max_steps}), so its "
                "later prompts drop or elide earlier turns and an episode is not one token sequence the model saw; "
                "TRL's rollout_func takes one completion per episode. Train this harness with `harnessrl train "
                f"grpo` (one training unit per model call), or set rules.{name} to null (or max_steps to {window} or "
                "fewer) in its spec"
            )


def _batch_facts(observation: BatchObservation, episodes: int, kept: list, seconds: float, seed: int) -> dict[str, Any]:
    """What steps.jsonl records of a batch (before its observation): `kept` holds each episode's
    (turns, turns kept, model tokens, model tokens kept), None for one without a sequence."""
    plan = observation.plan
    valid = [r for v in observation.rewards.values() for r in v]
    turns = [k for k in kept if k is not None]
    return {
        "batch": plan.batch,
        "harness": plan.harness,
        "shares": dict(plan.selection.shares),
        "probabilities": plan.probabilities,
        "sampling_seed": sampling_seed(seed, plan.batch, "train"),
        "episodes": episodes,
        "infra_errors": observation.infra_errors,
        "reward_mean": sum(valid) / len(valid) if valid else None,
        "reward_by_harness": {h: (sum(v) / len(v) if v else None) for h, v in observation.rewards.items()},
        "turns": sum(t[0] for t in turns),
        "turns_kept": sum(t[1] for t in turns),
        "model_tokens": sum(t[2] for t in turns),
        "model_tokens_kept": sum(t[3] for t in turns),
        "prefix_breaks": sum(t[1] < t[0] for t in turns),
        "rollout_s": round(seconds, 3),
    }


def _log_metrics(schedule: HarnessSchedule, observation) -> dict[str, float]:
    """The batch's numbers for TRL's log, under harnessrl/ (averaged by TRL over its logging steps)."""
    extra = observation.extra
    out: dict[str, float] = {}
    for h in schedule.harnesses:
        out[f"harnessrl/selected/{h}"] = float(observation.plan.selection.shares.get(h, 0.0))
        out[f"harnessrl/probability/{h}"] = float(observation.plan.probabilities.get(h, 0.0))
    for h, r in extra["reward_by_harness"].items():
        if r is not None:
            out[f"harnessrl/reward/{h}"] = float(r)
    if observation.learnability is not None:
        out["harnessrl/learnability"] = observation.learnability
    out["harnessrl/infra_errors"] = float(extra["infra_errors"])
    if extra["model_tokens"]:
        out["harnessrl/untrained_token_frac"] = 1 - extra["model_tokens_kept"] / extra["model_tokens"]
    out["harnessrl/prefix_breaks"] = float(extra["prefix_breaks"])
    return out


def capped(spec: AnyHarnessSpec, cap: int | None) -> AnyHarnessSpec:
    """`spec` with each model call's max_new_tokens at most `cap` (None: as it is)."""
    if cap is None:
        return spec
    if isinstance(spec, HarnessSpec):
        if spec.rules.max_new_tokens <= cap:
            return spec
        return spec.model_copy(update={"rules": spec.rules.model_copy(update={"max_new_tokens": cap})})
    own = getattr(spec, "max_new_tokens", None)
    return spec if own is None or own <= cap else spec.model_copy(update={"max_new_tokens": cap})


TRUNCATING = (Termination.max_steps, Termination.max_tokens, Termination.timeout)


def is_truncated(trajectory: Trajectory) -> bool:
    """An episode cut before it ended on its own, TRL's `mask_truncated_completions` for an
    episode: a budget stopped it (max_steps, max_tokens, timeout), or its last model call hit its
    token cap (finish_reason "length"). An infrastructure error is not (it has no completion)."""
    if trajectory.is_infra_error:
        return False
    last = trajectory.steps[-1].model_call if trajectory.steps else None
    return trajectory.termination in TRUNCATING or (last is not None and last.finish_reason == "length")


def evaluation_metrics(record: TrainEval) -> dict[str, float]:
    """An evaluation's figures for TRL's log: harnessrl/eval/H/mean (each harness's mean score),
    harnessrl/eval/H/vs_base (its paired difference to step 0, from the first later evaluation),
    harnessrl/eval/average and harnessrl/eval/held_out_average."""
    out: dict[str, float] = {}
    for h, v in record.harnesses.items():
        if v.mean_score is not None:
            out[f"harnessrl/eval/{h}/mean"] = float(v.mean_score)
        if v.vs_base is not None and v.vs_base.mean_difference is not None:
            out[f"harnessrl/eval/{h}/vs_base"] = float(v.vs_base.mean_difference)
    if record.average is not None:
        out["harnessrl/eval/average"] = float(record.average)
    if record.held_out_average is not None:
        out["harnessrl/eval/held_out_average"] = float(record.held_out_average)
    return out
