"""The red team against the built-in suites: `workspace` through `harnessrl audit --redteam` (every
attack, and the command's output naming each), its families with an `exists` check (the attacks on
the files an instruction names), and `toolcalc` (the answer file's attacks: its grader reads only
the answer). Every attack HOLDS."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harnessrl.audit import named_files
from harnessrl.cli import app
from harnessrl.redteam import ATTACKS, HOLDS, RedTeamReport, run_battery
from harnessrl.tasks.suites.workspace import WorkspaceSuite

from .battery import ANSWER_ATTACKS, check_holds, needs_bwrap

# many_files makes 200,000 files in a workspace: minutes of a slow disk's time under load
pytestmark = [needs_bwrap, pytest.mark.slow, pytest.mark.timeout(600)]

# the attacks that act on the files an instruction names
NAMED_FILE_ATTACKS = ("answer_proc", "answer_fifo", "hardlink", "snapshot_link", "exists_link")


class ExistsFamilies(WorkspaceSuite):
    """`workspace` restricted to its families whose grade has an `exists` sub-score."""

    name = "workspace-exists"

    def families(self):
        every = super().families()
        return {name: every[name] for name in ("create_file", "csv_report")}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("redteam-workspace")
    result = CliRunner().invoke(app, ["audit", "--redteam", "--suite", "workspace", "--tasks", "1", "--out", str(out)])
    return result, out


@pytest.fixture(scope="module")
def workspace(cli_run) -> RedTeamReport:
    _, out = cli_run
    return RedTeamReport.model_validate_json((out / "redteam.json").read_text())


@pytest.fixture(scope="module")
def exists_families(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-workspace-exists")
    return run_battery(ExistsFamilies(), attacks=NAMED_FILE_ATTACKS, tasks=2, out=out)


@pytest.fixture(scope="module")
def toolcalc(tmp_path_factory) -> RedTeamReport:
    out = tmp_path_factory.mktemp("redteam-toolcalc")
    return run_battery("toolcalc", attacks=(*ANSWER_ATTACKS, "oversize_request"), tasks=1, out=out)


def test_the_command_names_every_attack_and_exits_0(cli_run):
    result, out = cli_run
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for attack in ATTACKS:
        assert any(line.split()[:2] == [attack, HOLDS] for line in lines if line.strip()), (attack, result.output)
    assert "every attack HOLDS (14 attacks)" in result.output
    assert (out / "redteam.md").is_file() and (out / "run" / "run.db").is_file() and (out / "episodes.jsonl").is_file()


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_workspace(workspace, attack):
    check_holds(workspace, attack)


@pytest.mark.parametrize("attack", NAMED_FILE_ATTACKS)
def test_workspace_exists_checks(exists_families, attack):
    check_holds(exists_families, attack)


def test_the_exists_families_have_an_exists_check_that_a_real_file_passes():
    for task in ExistsFamilies().tasks("test", 2):
        env = task.make_env()
        try:
            made = set(env.require_workspace().files())
            [path] = [p for p in named_files(task.instruction) if p not in made]
            env.require_workspace().write(path, "something\n")
            assert task.grade(env).subscores["exists"] == 1.0
        finally:
            env.close()


@pytest.mark.parametrize("attack", (*ANSWER_ATTACKS, "oversize_request"))
def test_toolcalc(toolcalc, attack):
    check_holds(toolcalc, attack)
