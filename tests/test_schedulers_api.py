"""docs/schedulers.md's worked example runs as written, and what it promises holds: every batch
is planned, recorded, sketched and observed in order; the state is plain JSON and a schedule
loaded from it continues with the choices the original makes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from harnessrl.train.harness_schedule import HarnessSchedule
from harnessrl.train.schedulers import make_scheduler

DOC = Path(__file__).resolve().parents[1] / "docs" / "schedulers.md"


def worked_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "docs/schedulers.md has its worked example"
    return blocks[0]


def test_the_worked_example_runs_and_its_state_resumes_the_same_choices(capsys):
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(worked_example(), str(DOC), "exec"), scope)
    schedule, chosen, state = scope["schedule"], scope["chosen"], scope["state"]
    assert len(chosen) == 6 and set(chosen) <= set(scope["harnesses"])
    assert schedule.batches_observed == 6 and schedule.pending is None
    assert sum(state["scheduler"]["count"].values()) == 6
    state = json.loads(json.dumps(state))  # plain JSON

    resumed = HarnessSchedule(make_scheduler("harness-bandit", scope["harnesses"], seed=0))
    resumed.load_state_dict(state)
    for batch in range(6, 10):
        mine, theirs = resumed.plan(batch, 2), schedule.plan(batch, 2)
        assert mine.group_harness == theirs.group_harness
        for s in (resumed, schedule):
            s.record(mine, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0], 4, "group")
            s.add_sketch(torch.arange(512, dtype=torch.float32) * (batch + 1))
            s.observe()
    assert resumed.state_dict() == schedule.state_dict()
