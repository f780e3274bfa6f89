"""What the red team's test files share: the fixtures' folders, the bubblewrap skip, and one
battery per suite run once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from harnessrl.redteam import HOLDS, RedTeamReport
from harnessrl.tasks.sandbox_exec import ExecLimits, isolation_available

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CLAWGYM = FIXTURES / "importers" / "clawgym"
PINCHBENCH = FIXTURES / "importers" / "pinchbench"
HARBOR = FIXTURES / "importers" / "harbor"
CLAWEVAL = FIXTURES / "claweval"
OWN_HARBOR = ROOT / "tests" / "redteam" / "fixtures" / "harbor"

needs_bwrap = pytest.mark.skipif(
    isolation_available() != "bwrap",
    reason="bubblewrap is missing or does not work here: without it an agent program runs with the host's "
    "file system, and the red team would only list what any agent can reach",
)

# A grader stuck on a FIFO the attacker left where it reads (answer_fifo) is killed at its wall
# clock and the episode is an infrastructure error; the fixtures' own clocks (30 to 120 s) would
# make the battery wait that long for nothing more: the graders get 15 s here, the attack is the same.
SHORT_GRADER = ExecLimits(wall_s=15.0, cpu_s=15)

# The attacks that act on the answer file alone (a suite whose grader reads nothing but the answer
# gives the workspace attacks nothing to act on).
ANSWER_ATTACKS = ("answer_link", "answer_proc", "answer_fifo", "answer_sparse", "answer_race", "hardlink")
# many_files and oversize_request test the host's side of every episode alike (the workspace walk and
# clean-up, the endpoint), whatever the suite: they run on the workspace suite (and oversize_request
# on toolcalc), not again on each importer, where they would add minutes and test nothing new.
HOST_WIDE = ("many_files", "oversize_request")


def check_holds(report: RedTeamReport, attack: str) -> None:
    """The attack HOLDS, played at least once; the evidence in the message when it LEAKS."""
    [verdict] = [a for a in report.attacks if a.attack == attack]
    assert verdict.episodes, f"{attack}: no episode recorded"
    assert verdict.verdict == HOLDS, f"{attack} LEAKS on {report.suite}: " + "; ".join(
        f"[{f.check}] {f.detail} (episode {f.episode_id}, task {f.task_id})" for f in verdict.findings
    )
    # an attacker that never reached the model did not start (or was never credited): it proved nothing
    assert not verdict.untested(), f"{attack}: an attacker made no model call: {verdict.untested()}"
