"""What each job returns: one pydantic model per job, as types.py holds the records of an episode.

A job's library call returns its model; the command line and the report read attributes. Where a
job writes its result to a file (summary.json, final.json, study.json, improve.json), the file
holds the model's `model_dump()`: the same keys, in the same order, as before these models.
Nested parts that are records of their own shape (a cell's metrics, a decision's evidence) stay
plain JSON values here; their fields are documented where they are computed.

    EvalSummary     run_eval, write_summary: summary.json
    CollectFacts, AdapterFacts, DistillFacts, GRPOFacts
                    the facts of a finished stage (stages.json) of `study` and `improve`
    TrainResult     `train grpo` (Trainer.run) and `train distill` (run_distill); TrainEval: a
                    line of `train grpo`'s eval.jsonl (HarnessEvalScores: one harness in it)
    SFTResult       `train sft` (run_sft), with SFTData and SFTSampling
    EvolveResult    run_evolve: final.json
    StudyResult     run_study: study.json (CellComparison, Recommendation: its analysis)
    ImproveResult   run_improve: improve.json (ImproveStopped when stopped after a phase; Decision:
                    a line of decisions.jsonl)
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.metrics import HarnessSummary, PairedDifference
from harnessrl.types import OmitsWhenNone


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------------------------ eval


class EvalSummary(_Result):
    """summary.json of an evaluation run: what it ran and each harness's headline numbers."""

    suite: str
    split: str
    model: str
    seed: int | None
    harnesses: dict[str, HarnessSummary]


# ---------------------------------------------------------------------------------------------- train


class TrainResult(_Result):
    """A training run that finished: `train grpo` or `train distill`."""

    steps: int  # the steps done (all of --steps)
    adapter: str  # the folder of the saved LoRA adapter (OUT/adapter)
    last: dict[str, Any]  # the last step's metrics record (a line of metrics.jsonl; {} without a step)


class HarnessEvalScores(_Result):
    """One harness in a periodic evaluation (`TrainEval.harnesses`): its numbers on the evaluation's
    tasks at `attempts` attempts each, and its paired difference against the first evaluation of
    the run (step 0: the base weights; LoRA starts as the identity), task by task."""

    held_out: bool  # evaluated, never trained on
    tasks: int  # tasks with at least one valid episode
    mean_score: float | None
    pass_at_k: dict[str, float | None]  # k = 1 .. attempts, as strings (HarnessSummary's)
    pass_hat_k: dict[str, float | None]
    vs_base: PairedDifference | None  # None at step 0 (it is the base)


class TrainEval(_Result):
    """One periodic evaluation on dev tasks (a line of `train grpo`'s eval.jsonl, and of a TRL run's
    harnessrl/eval.jsonl; keys in this order): each harness's mean score, pass@1 and delivery rate,
    then the whole record of every harness, the held-out ones (evaluated, never trained on) apart."""

    step: int
    temperature: float
    sampling_seed: int | None
    tasks: int
    mean_score: dict[str, float | None]
    pass_at_1: dict[str, float | None]
    delivery_rate: dict[str, float | None]
    average: float | None  # over the trained harnesses with a score
    seconds: float
    attempts: int = 1
    held_out: list[str] = Field(default_factory=list)  # the held-out harnesses' names
    held_out_average: float | None = None  # over the held-out harnesses with a score
    harnesses: dict[str, HarnessEvalScores] = Field(default_factory=dict)
    # harness -> task id -> the task's score (mean over its valid attempts): what later evaluations pair with
    task_scores: dict[str, dict[str, float]] = Field(default_factory=dict)


class SFTTrained(TrainResult):
    """`train sft`'s training run: a TrainResult and the number of training units."""

    examples: int


class SFTSampling(_Result):
    """`train sft --sample N`: the attempts sampled, and how many tasks kept their best one."""

    run: str  # the sampling run folder
    harness: str
    attempts: int  # per task
    tasks: int
    kept: int  # tasks that kept an attempt
    per_task: dict[str, Any]  # task -> what was kept or why nothing was


class SFTData(OmitsWhenNone):
    """Where the SFT examples came from: the episodes selected, replayed into the target harness,
    dropped (by reason) and the examples they gave."""

    model_config = ConfigDict(extra="allow")  # the per-harness and placebo counts, when they apply
    _omit_when_none: ClassVar[tuple[str, ...]] = ("sampling",)

    episodes: int
    infra_errors: int
    not_selected: int
    selected: int
    replayed: int
    dropped: dict[str, int]  # reason -> episodes
    examples: int
    sampling: SFTSampling | None = None


class SFTResult(OmitsWhenNone):
    """`train sft`: the data, the exports asked for, and (unless --export-only) the training run."""

    _omit_when_none: ClassVar[tuple[str, ...]] = ("exported", "exported_hf", "steps", "adapter", "examples", "last")

    data: SFTData
    harness: str  # the harness the examples are rendered in
    suite: str
    exported: str | None = None  # --export-jsonl's file
    exported_hf: str | None = None  # --export-hf's folder
    steps: int | None = None
    adapter: str | None = None
    examples: int | None = None  # training units
    last: dict[str, Any] | None = None  # the last logged step's record


# --------------------------------------------------------------------------------------------- evolve


class HeldOutRecord(_Result):
    """One side of an evolution's held-out comparison (the seed or the best harness)."""

    label: str
    mean_score: float | None
    mean_score_ci95: list[float] | None
    pass_at_k: dict[str, float | None]
    pass_hat_k: dict[str, float | None]
    delivery_rate: float | None
    n_tasks: int
    n_episodes: int
    n_infra_errors: int
    triage: dict[str, Any]  # n_failed, counts, rates, process_share, content_share


class EvolveResult(_Result):
    """final.json of an evolution: the search, its acceptance threshold and noise, and the
    held-out comparison of the best harness against the seed."""

    suite: str
    model: str
    seed_harness: str
    best: str  # the label of the best spec (the seed's when no edit was accepted)
    accepted_edits: list[Any]
    best_diff_vs_seed: list[dict[str, Any]]  # {path, from, to} of every changed leaf
    iterations_run: int
    proposer_exhausted: bool
    stopped_by: str | None
    threshold: float | None
    noise: dict[str, Any] | None
    invalid_proposals: int
    crashed_candidates: int
    unconfirmed_candidates: int
    seed: HeldOutRecord  # the seed's held-out record
    best_harness: HeldOutRecord  # the best spec's
    paired_difference: PairedDifference  # best - seed on the held-out tasks
    config: dict[str, Any]
    wall_time_s: float


# ---------------------------------------------------------------------------------------------- stages


class CollectFacts(_Result):
    """The collection stage (`Stages.collect`): the evolved harness's episodes on train tasks."""

    tasks: int  # --collect-tasks
    attempts: int  # --collect-attempts
    episodes: int
    passed: int
    passed_tasks: int  # tasks with a passing episode


class AdapterFacts(_Result):
    """An imitation or placebo adapter stage (`Stages.sft`)."""

    folder: str
    adapter: str  # relative to the job's folder
    steps: int | None
    examples: int
    episodes_replayed: int
    episodes_dropped: int
    final_loss: float | None


class DistillFacts(_Result):
    """`harnessrl improve`'s on-policy distillation stage."""

    steps: int
    final_kl: float | None


class GRPOFacts(_Result):
    """`harnessrl improve`'s GRPO stage on the content-failure tasks."""

    steps: int
    optimizer_steps: int  # steps that updated the weights
    harnesses: list[str]


# --------------------------------------------------------------------------------------- study, improve


class Recommendation(_Result):
    """study.json's recommendation (`recommend`): the failure classes sorted by their verdicts,
    the score verdicts, what claims nothing, and the same as sentences."""

    fix_in_harness: list[dict[str, Any]]
    train_into_weights: list[dict[str, Any]]
    distils: list[dict[str, Any]]
    runtime_only: list[dict[str, Any]]
    score: dict[str, Any]  # harness, weights, placebo: verdicts; runtime_only: bool
    no_claim: list[dict[str, Any]]
    text: list[str]


class CellComparison(_Result):
    """study.json's analysis of the cells (`compare_cells`)."""

    paired_differences: dict[str, dict[str, Any]]  # comparison -> {a, b, the paired difference, verdict}
    content_failures: dict[str, Any]  # the content-failure share before and after distillation
    class_effects: dict[str, dict[str, Any]]  # failure class -> its effects (`class_effects`)
    recommendation: Recommendation


class StudyResult(_Result):
    """study.json: the study's configuration and context, the cells and their analysis."""

    suite: str
    model: str
    config: dict[str, Any]
    seed_harness: str
    evolved_harness: str
    evolution: dict[str, Any]
    evolved_is_seed: bool
    collect: CollectFacts
    training: dict[str, AdapterFacts]  # sft (the distilled adapter), placebo
    seed_eval: dict[str, Any] | None
    cells: dict[str, dict[str, Any]]
    paired_differences: dict[str, dict[str, Any]]
    content_failures: dict[str, Any]
    class_effects: dict[str, dict[str, Any]]
    recommendation: Recommendation


class Decision(_Result):
    """One decision of `harnessrl improve` (a line of decisions.jsonl, keys in this order)."""

    key: str  # e.g. weights.choice
    phase: str  # harness, weights, content
    choice: Any
    evidence: dict[str, Any]


class ImproveResult(_Result):
    """improve.json: the held-out cells, their paired differences, what stayed runtime-only and
    every decision."""

    suite: str
    model: str
    seed_harness: str
    evolved_harness: str
    evolved_is_seed: bool
    weights: dict[str, Any]
    content: dict[str, Any]
    cells: dict[str, dict[str, Any]]
    paired_differences: dict[str, dict[str, Any]]
    runtime_only: dict[str, Any]
    decisions: list[Decision]
    config: dict[str, Any]


class ImproveStopped(_Result):
    """`harnessrl improve --stop-after PHASE`: the decisions so far."""

    stopped_after: str
    decisions: list[Decision]
    folder: str
