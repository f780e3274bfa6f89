"""`harnessrl improve`: harness first, then weights, then content, as one resumable job.

The rule it follows: process failures (malformed calls, refused calls, loops, budgets, no
delivery, missing evidence) are removed by editing the harness; the behaviour the edited harness
gets out of the model is then moved into the weights, so that the seed harness at inference needs
no further help; and what no harness edit fixes (content failures: delivered, wrong) is trained
with GRPO on the tasks that fail that way.

    harness   the seed harness on dev tasks, triaged (harness/seed-dev); `harnessrl evolve` from
              the seed while its accepted edits keep lowering the process-failure rate, stopped at
              the first ceiling that fires (the harness.ceiling decision: patience, process_floor,
              no_process_gain, budget, proposer_exhausted); or no evolution at all when the seed's
              process-failure rate is already below --process-floor, or --evolved names the harness
    weights   the evolved harness distilled into LoRA weights that run under the SEED harness, two
              ways at the same number of optimizer steps: imitation (`train sft` on the evolved
              harness's passing train episodes, weights/collect -> weights/sft, with its placebo
              weights/placebo: `harnessrl.jobs.stages`, as in `harnessrl study`) and on-policy
              distillation (`train distill`, weights/distill);
              each adapter evaluated under the seed harness on the dev tasks; the one with the
              higher dev mean is kept (weights.choice); skipped when the evolved harness is the seed
    content   the kept weights under the seed harness on --content-tasks train tasks, triaged
              (content/select); GRPO (`train grpo`, HarnessBandit by default, over the seed and the
              evolved harness) from those weights on the tasks with a content failure (content/grpo);
              skipped when there is none
    final     the held-out test tasks, once, in four cells: seed harness + base weights (the
              baseline) and each phase's result (harness: evolved + base; weights: seed + the kept
              adapter; content: seed + the GRPO adapter), with mean, 95% interval, pass@k, pass^k and
              triage shares, the paired difference of each against the baseline and which gains
              stayed runtime-only (improve.json, report.md); the folder is then locked

Every decision is one line of OUT/decisions.jsonl: {key, phase, choice, evidence}, in the order
taken. Every stage is a run folder of its own under OUT (an evaluation, an evolution, a training
run), resumed by its own resume; OUT/stages.json lists the stages that finished (and
OUT/weights/stages.json those of the collection and imitation, which are `harnessrl study`'s
stages, reused). `--resume` re-runs the pipeline: finished stages are read, not run again; the
stage that was interrupted resumes; every decision is computed again from the same files and must
equal the recorded one (a run reaching another decision is refused: something in a stage folder
changed). So a run stopped anywhere, and resumed, writes exactly the decisions of an uninterrupted run.

No decision reads a test task: the harness phase decides on dev tasks (the evolution's own
held-out phase runs once, as `harnessrl evolve` always does, and is reported, never used), the
weights phase on dev tasks, the content phase on train tasks.

- `config`: ImproveConfig, every option declared once (the CLI is generated from it)
- `record`: the job's state (ImproveState) and the functions every phase uses over it:
  decisions.jsonl, the evaluation stages, the evaluated cells
- `harness`, `weights`, `content`, `final`: one module per phase, each phase a function over the state
- `job`: Improve (its checks, then the phase functions in order, resumable) and run_improve, the library call
"""

from harnessrl.improve.config import CEILINGS, ImproveConfig, ImproveError
from harnessrl.improve.content import TrainSubset, content_task_ids
from harnessrl.improve.final import report_markdown
from harnessrl.improve.harness import process_rate
from harnessrl.improve.job import Improve, run_improve

__all__ = [
    "CEILINGS",
    "Improve",
    "ImproveConfig",
    "ImproveError",
    "TrainSubset",
    "content_task_ids",
    "process_rate",
    "report_markdown",
    "run_improve",
]
