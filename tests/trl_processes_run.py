"""Run by tests/test_trl_processes.py in two processes (torchrun, ACCELERATE_USE_CPU=true): the
synchronous integration's reference setup (tests/test_trl.py) in each process, which writes what
it played and what its scheduler chose to OUTPUT_DIR/rank<N>.json.

    ACCELERATE_USE_CPU=true python -m torch.distributed.run --nproc_per_node 2 \
        tests/trl_processes_run.py OUT STEPS [RESUME]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # helpers, test_trainer, test_trl

from test_trl import make_rollout, train  # noqa: E402


def main() -> None:
    out, steps = Path(sys.argv[1]), int(sys.argv[2])
    resume = sys.argv[3] if len(sys.argv) > 3 else None
    torch.set_num_threads(1)
    rollout = make_rollout(eval_harnesses=[], eval_every=0)
    trainer, recording = train(out, rollout, resume=resume, steps=steps, per_device_train_batch_size=2)
    rank = trainer.accelerator.process_index
    record = {
        "rank": rank,
        "processes": trainer.accelerator.num_processes,
        "harnesses": [p.harness for p in rollout.history],
        "batches": [p.batch for p in rollout.history],
        "rows": [[rollout.task(p).id for p in prompts] for prompts in recording.prompts],
        "episodes": [out_["harnessrl_episode"] for out_ in recording.outputs],
        "observed": rollout.schedule.scheduler.state_dict()["total"],
    }
    (out / f"rank{rank}{'.resumed' if resume else ''}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
