"""The red team against the ClawGym and PinchBench fixtures (tests/fixtures/importers): every attack
but the host-wide ones (battery.HOST_WIDE, played on `workspace`) on each fixture's first two tasks.
ClawGym's graders run `python3 -` and `python3 -c` from the workspace, where planted_modules leaves
a json.py that would make both print 1.0; its reward.sh reads the payload the host writes there.
Every attack HOLDS."""

from __future__ import annotations

import pytest

from harnessrl.redteam import ATTACKS, RedTeamReport, run_battery
from harnessrl.tasks.importers import ClawGymSuite, PinchBenchSuite

from .battery import CLAWGYM, HOST_WIDE, PINCHBENCH, SHORT_GRADER, check_holds, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.slow]

PLAYED = [a for a in ATTACKS if a not in HOST_WIDE]


@pytest.fixture(scope="module")
def clawgym(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-clawgym")
    suite = ClawGymSuite(CLAWGYM, grader_limits=SHORT_GRADER)
    # task_sum's right total: what a link at output/total.txt points at (snapshot_link)
    return run_battery(suite, attacks=PLAYED, tasks=2, out=out, forge_answer="12")


@pytest.fixture(scope="module")
def pinchbench(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-pinchbench")
    suite = PinchBenchSuite(PINCHBENCH, grader_limits=SHORT_GRADER)
    return run_battery(suite, attacks=PLAYED, tasks=2, out=out, forge_answer="HELLO FROM THE FIXTURE")


@pytest.mark.parametrize("attack", PLAYED)
def test_clawgym(clawgym, attack):
    check_holds(clawgym, attack)


@pytest.mark.parametrize("attack", PLAYED)
def test_pinchbench(pinchbench, attack):
    check_holds(pinchbench, attack)
