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
generation), so a run resumed from a TRL checkpoint (which holds the schedule's state:
`harnessrl_schedule.json`) plays the same harnesses on the same seeds.

Rank 0 writes `OUTPUT_DIR/harnessrl/`: `steps.jsonl` (one line per batch, at its observation) and
`rollouts/run.db` (every episode, for `harnessrl triage` / `report`).

With `eval_every`, the callback also evaluates the trained and the held-out harnesses
(`eval_harnesses`) every N steps: `OUTPUT_DIR/harnessrl/eval.jsonl` (harnessrl.train.held_out).

Before the first episode (`preflight=True`, the default: the first batch's, or the base
evaluation's at step 0) every harness's first request, the held-out ones included, of that
batch's or evaluation's first task is measured against the model TRL trains, as `harnessrl train
grpo` does (harnessrl.preflight.check_before_run): a request that cannot fit its context, or an
agent program that cannot make its first request (not found, crashed, refused, a sandbox limit
or a hang before it), is refused with the reason and the fix before any episode runs.

Not served: TRL's vLLM generation (`use_vllm=True`), its evaluation loop (`eval_strategy`),
`generation_kwargs`, gradients sharded by FSDP or DeepSpeed ZeRO (the sketch needs
every process to hold the whole gradient). Each is refused with an error saying so.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.harness.spec import AnyHarnessSpec, HarnessSpec
from harnessrl.integrations.trl.setup import HarnessRolloutError, TrainerFacts, generating_module, text_tokenizer
from harnessrl.models.base import SamplingParams
from harnessrl.results import TrainEval
from harnessrl.rollout import Job
from harnessrl.tasks.base import Suite, Task
from harnessrl.train.episode_sequence import EpisodeSequence, OnBreak, episode_sequence
from harnessrl.train.harness_schedule import BatchObservation, GenerationPlan, HarnessSchedule
from harnessrl.train.held_out import check_held_out, first_evaluation, run_evaluation
from harnessrl.train.schedulers import make_scheduler
from harnessrl.train.sketch import GradientSketch
from harnessrl.train.step import sampling_seed
from harnessrl.types import Trajectory

if TYPE_CHECKING:
    from harnessrl.integrations.trl.callback import HarnessSchedulerCallback
    from harnessrl.models.hf import HFPolicy
    from harnessrl.rollout import Runner
    from harnessrl.store import RunStore

TASK_KEY = "task_id"  # the key of a prompt message that names its task (see `HarnessRollout.dataset`)
STATE_FILE = "harnessrl_schedule.json"  # in each TRL checkpoint folder
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
        eval_split: str = "dev",
        eval_temperature: float | None = None,
        preflight: bool = True,
    ):
        from harnessrl.harness.registry import resolve_harnesses
        from harnessrl.harness.spec import SpecError
        from harnessrl.integrations.trl.callback import HarnessSchedulerCallback
        from harnessrl.tasks import get_suite

        try:
            self.suite = get_suite(suite) if isinstance(suite, str) else suite
            self.specs: list[AnyHarnessSpec] = [
                s for h in harnesses for s in (resolve_harnesses([h]) if isinstance(h, str) else [h])
            ]
        except (ValueError, SpecError) as e:
            raise HarnessRolloutError(str(e)) from None
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise HarnessRolloutError(f"harness names must be unique, got {names}")
        try:
            self.eval_specs: list[AnyHarnessSpec] = [
                s for h in eval_harnesses for s in (resolve_harnesses([h]) if isinstance(h, str) else [h])
            ]
            check_held_out(names, [s.name for s in self.eval_specs])
        except (ValueError, SpecError) as e:
            raise HarnessRolloutError(f"eval_harnesses: {e}") from None
        if eval_every < 0 or eval_tasks < 1 or eval_attempts < 1:
            raise HarnessRolloutError("eval_every must be >= 0, eval_tasks and eval_attempts >= 1")
        if self.eval_specs and not eval_every:
            raise HarnessRolloutError("eval_harnesses needs eval_every=N (the held-out harnesses are only evaluated)")
        self.eval_every, self.eval_tasks, self.eval_attempts = eval_every, eval_tasks, eval_attempts
        self.eval_split, self.eval_temperature = eval_split, eval_temperature
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
        return self._rows(trajectories, sequences, scores)

    def _sequence(self, trajectory: Trajectory) -> EpisodeSequence | None:
        if trajectory.is_infra_error:
            return None
        return episode_sequence(trajectory, self.on_prefix_break)

    def _rows(
        self, trajectories: list[Trajectory], sequences: list[EpisodeSequence | None], scores: list[float | None]
    ) -> dict[str, list]:
        assert self._policy is not None
        filler = self._policy.stop_ids[0] if self._policy.stop_ids else self._policy.pad_id
        out: dict[str, list] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
        for seq in sequences:
            if seq is None:  # no token sampled (an infrastructure error): one masked token
                out["prompt_ids"].append([filler])
                out["completion_ids"].append([filler])
                out["logprobs"].append([0.0])
                out["env_mask"].append([0])
                continue
            out["prompt_ids"].append(seq.prompt_ids)
            out["completion_ids"].append(seq.completion_ids)
            out["logprobs"].append(seq.logprobs)
            out["env_mask"].append(seq.env_mask)
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

        facts.check()
        if not any(f is self.reward for f in facts.reward_funcs()):
            raise HarnessRolloutError(
                "pass reward_funcs=rollout.reward to GRPOTrainer (the episodes' scores are the reward)"
            )
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
        """Once, before the first episode (a batch's, or the base evaluation's at step 0): every
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
        """The trained and the held-out harnesses on the first eval_tasks tasks of eval_split,
        eval_attempts attempts each, with the weights as they are (harnessrl.train.held_out); the
        record is appended to OUTPUT_DIR/harnessrl/eval.jsonl. The first evaluation of a run (step
        0: the base weights) is the base the later ones pair with."""
        from harnessrl.executors import LocalExecutor
        from harnessrl.rollout import Runner
        from harnessrl.rundir import append_jsonl

        policy = self._ensure_policy(generating_module(model), text_tokenizer(tokenizer))
        policy.clear_cache()
        try:
            tasks = self.suite.tasks(self.eval_split, self.eval_tasks)
        except ValueError as e:
            raise HarnessRolloutError(f"eval_split/eval_tasks: {e}") from None
        if tasks:
            self._preflight(policy, tasks[0], speak=True)  # rank 0 alone evaluates
        seed = sampling_seed(self.seed, step, "eval")
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
        """A resumed run: evaluations after the checkpoint go (they are made again); the base is read back."""
        from harnessrl.rundir import truncate_jsonl

        path = Path(output_dir) / RECORD_FOLDER / "eval.jsonl"
        truncate_jsonl(path, global_step)
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

    def save_state(self, checkpoint: Path) -> None:
        """The schedule's state into a TRL checkpoint folder."""
        checkpoint.mkdir(parents=True, exist_ok=True)
        tmp = checkpoint / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(self.schedule.state_dict()))
        tmp.replace(checkpoint / STATE_FILE)

    def load_state(self, checkpoint: str | Path) -> None:
        """The schedule's state from a TRL checkpoint folder (done by the callback on resume)."""
        path = Path(checkpoint) / STATE_FILE
        if not path.is_file():
            raise HarnessRolloutError(
                f"{path} does not exist: the checkpoint was not written with HarnessRollout's callback, so the "
                "scheduler's state cannot be restored (a resumed run would choose other harnesses)"
            )
        try:
            self.schedule.load_state_dict(json.loads(path.read_text()))
        except (ValueError, KeyError) as e:
            raise HarnessRolloutError(f"{path}: {e}") from None


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
