"""The red team against the Harbor fixtures (tests/fixtures/importers/harbor, and
tests/redteam/fixtures/harbor: a test.sh that runs the agent's own /app/solution.sh, then writes
its reward from a real check) and the Claw-Eval fixture (its env_snapshot reads report.txt, which
snapshot_link makes a link to a forged "14", the right answer). Every attack but the host-wide ones
(battery.HOST_WIDE, played on `workspace`) on each fixture's first tasks."""

from __future__ import annotations

import pytest

from harnessrl.redteam import ATTACKS, RedTeamReport, run_battery
from harnessrl.tasks import get_suite
from harnessrl.tasks.importers import ClawEvalSuite, HarborSuite

from .battery import CLAWEVAL, HARBOR, HOST_WIDE, OWN_HARBOR, SHORT_GRADER, check_holds, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.slow]

PLAYED = [a for a in ATTACKS if a not in HOST_WIDE]


@pytest.fixture(scope="module")
def harbor(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-harbor")
    suite = HarborSuite(HARBOR, grader_limits=SHORT_GRADER)
    # copy-config's right port: what a link at /app/port.txt points at (snapshot_link)
    return run_battery(suite, attacks=PLAYED, tasks=2, out=out, forge_answer="8080")


@pytest.fixture(scope="module")
def own_harbor(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-own-harbor")
    return run_battery(f"harbor:{OWN_HARBOR}", attacks=PLAYED, tasks=1, out=out, forge_answer="42")


@pytest.fixture(scope="module")
def claweval(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-claweval")
    suite = ClawEvalSuite(CLAWEVAL, grader_limits=SHORT_GRADER)
    return run_battery(suite, attacks=PLAYED, tasks=2, out=out, forge_answer="14")


@pytest.mark.parametrize("attack", PLAYED)
def test_harbor(harbor, attack):
    check_holds(harbor, attack)


@pytest.mark.parametrize("attack", PLAYED)
def test_harbor_running_the_agents_solution(own_harbor, attack):
    check_holds(own_harbor, attack)


@pytest.mark.parametrize("attack", PLAYED)
def test_claweval(claweval, attack):
    check_holds(claweval, attack)


def test_the_fixtures_grade_real_work():
    """The red team's own Harbor task passes a solution that sums the numbers, and fails one that
    does not: its check is real. The Claw-Eval tasks played are the two that run (S01, W01)."""
    [task] = get_suite(f"harbor:{OWN_HARBOR}").tasks("test")
    for script, score in (("awk '{s += $1} END {print s}' /app/numbers.txt", 1.0), ("echo 41", 0.0)):
        env = task.make_env()
        try:
            env.require_workspace().write("solution.sh", f"#!/bin/sh\n{script}\n")
            assert task.grade(env).score == score
        finally:
            env.close()
    ids = [t.id.rsplit("/", 1)[-1] for t in ClawEvalSuite(CLAWEVAL).tasks("test", 2)]
    assert ids == ["S01_notes_followup", "W01_word_count"]
