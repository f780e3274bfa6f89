"""The synchronous TRL integration in two processes: `torchrun --nproc_per_node 2` with
ACCELERATE_USE_CPU (gloo; `accelerate launch --cpu` starts one process on one machine) runs two
steps of tests/test_trl.py's setup (tests/trl_processes_run.py), then resumes from the step-2
checkpoint for a third.

Checked: every process plays its own share of each batch (other tasks, other episodes) under the
harness the scheduler chose, and the schedulers of the two processes make the same decisions
from the same gathered observations; the schedule is written once (rank 0's steps.jsonl, one
line per batch; the checkpoint's TrainerState) and a resumed run continues from it in both.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_trainer import lines

pytest.importorskip("trl", reason="TRL is not installed (pip install 'harnessrl[trl]')")
pytest.importorskip("accelerate", reason="accelerate is not installed")

SCRIPT = Path(__file__).parent / "trl_processes_run.py"


def launch(out: Path, steps: int, resume: Path | None = None) -> list[dict]:
    with socket.socket() as probe:  # a free port for the two processes' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    argv += [str(SCRIPT), str(out), str(steps), *([str(resume)] if resume else [])]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-6000:])
    suffix = ".resumed" if resume else ""
    return [json.loads((out / f"rank{r}{suffix}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_processes_share_each_batch_decide_alike_and_resume(tmp_path):
    out = tmp_path / "run"
    first = launch(out, 2)
    assert [r["processes"] for r in first] == [2, 2]
    # the same decisions in both processes, from the same gathered observations
    assert first[0]["harnesses"] == first[1]["harnesses"] and len(first[0]["harnesses"]) == 2
    assert first[0]["observed"] == first[1]["observed"] == 2
    for batch in range(2):  # each process its own group of the batch: other tasks, other episodes
        assert not set(first[0]["rows"][batch]) & set(first[1]["rows"][batch])
        assert not set(first[0]["episodes"][batch]) & set(first[1]["episodes"][batch])
    # written once: rank 0's log, one line per batch; the schedule in the checkpoint
    assert [r["step"] for r in lines(out / "harnessrl" / "steps.jsonl")] == [1, 2]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert "HarnessRollout" in state["stateful_callbacks"]

    resumed = launch(out, 3, resume=out / "checkpoint-2")
    assert resumed[0]["batches"] == resumed[1]["batches"] == [2]
    assert resumed[0]["harnesses"] == resumed[1]["harnesses"]
    assert resumed[0]["observed"] == resumed[1]["observed"] == 3  # the two before, from the checkpoint
    assert not set(resumed[0]["rows"][0]) & set(resumed[1]["rows"][0])
    assert [r["step"] for r in lines(out / "harnessrl" / "steps.jsonl")] == [1, 2, 3]
