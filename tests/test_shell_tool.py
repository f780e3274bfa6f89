"""The opt-in `shell` tool through the real runner: offered only when task and harness opt in,
escapes and runaway commands are contained and recorded, the store keeps the whole output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import grpo_trainer, oracle_policy, replies_policy
from typer.testing import CliRunner

from harnessrl.harness.loops import Episode
from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec, parse_spec
from harnessrl.models.base import SamplingParams
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks.base import Suite
from harnessrl.tasks.sandbox_exec import isolation_available, isolation_description
from harnessrl.tasks.shell import head_and_tail
from harnessrl.types import Termination, ToolCall

REPO = Path(__file__).resolve().parents[1]


def _count_lines(rng) -> dict:
    n = rng.randint(3, 9)

    def setup(env) -> None:
        env.workspace.write("data.txt", "".join(f"row {i}\n" for i in range(n)))

    def check(env) -> dict[str, float]:
        return {"count": float((env.workspace.read("count.txt") or "").strip() == str(n))}

    return {
        "instruction": f"Write the number of lines of data.txt into count.txt. ({n})",
        "setup": setup,
        "check": check,
        "data": {"n": n},
        "solution": [
            {"name": "shell", "arguments": {"command": "wc -l < data.txt > count.txt"}},
            {"name": "submit", "arguments": {}},
        ],
    }


class ShellSuite(Suite):
    """A workspace suite whose tasks offer the shell (and no other tool but submit)."""

    name = "shellcheck"
    split_sizes = {"train": 2, "dev": 2, "test": 2}
    offers_shell = True

    def families(self):
        return {"count_lines": _count_lines}

    def base_tools(self):
        return []


def shell_harness(base: str = "react", rules: dict | None = None, **shell) -> HarnessSpec:
    data = load_harness(base).to_dict()
    data["name"] = f"{base}-shell"
    data["rules"].update({"max_steps": 8, **(rules or {})})
    data["rules"]["shell"] = {
        "enabled": True,
        "wall_s": 2.0,
        "processes": 16,
        "memory_mb": 256,
        "file_size_mb": 1,
        "shown_chars": 300,
        "stored_bytes": 50_000,
        **shell,
    }
    return parse_spec(data)


def script_of(spec: HarnessSpec, commands: list[str]) -> list[str]:
    proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)
    calls = [ToolCall(name="shell", arguments={"command": c}) for c in commands]
    return [proto.render_call(c) for c in calls] + [proto.render_call(ToolCall(name="submit", arguments={}))]


def test_shell_is_offered_only_when_the_task_and_the_harness_opt_in():
    task = ShellSuite().tasks("dev", 1)[0]
    assert task.offers_shell
    on, off = shell_harness(), load_harness("react")
    plain_task = ShellSuite().tasks("dev", 1)[0]
    plain_task.offers_shell = False
    assert tool_names(task, on) == {"shell", "submit"}
    assert tool_names(task, off) == {"submit"}
    assert tool_names(plain_task, on) == {"submit"}


def tool_names(task, spec: HarnessSpec) -> set[str]:
    episode = Episode(task, spec, 0)
    episode.env.close()
    return {t.name for t in episode.tools}


@pytest.mark.parametrize("base", ["react", "json-tools"])
def test_a_task_is_solved_through_the_shell(tmp_path, tokenizer, base):
    spec = shell_harness(base)
    tasks = ShellSuite().tasks("dev", 2)
    trajs = Runner(oracle_policy(tasks, spec, tokenizer), SamplingParams(), progress=False).run(
        make_jobs(tasks, [spec], 1)
    )
    for traj in trajs:
        assert traj.infra_error is None and traj.grade.passed, traj.steps[-1].tool_results
        result = traj.steps[0].tool_results[0]
        assert result.name == "shell" and result.ok and result.output == "[exit code 0]"


def test_escapes_and_runaway_commands_are_contained_and_recorded(tmp_path, tokenizer):
    spec = shell_harness()
    task = ShellSuite().tasks("dev", 1)[0]
    escape_target = REPO / "shell-escape-probe"
    commands = [
        f"touch /etc/shell-escape-probe; touch {escape_target}",
        "bomb() { bomb & bomb & sleep 6.5432; }; bomb",  # its own marker: test_sandbox_exec counts 5.4321
        "sleep 1000",
        "head -c 200000 /dev/zero | tr '\\0' y",
        "head -c 5000000 /dev/zero > big.bin",
        "echo still-alive",
    ]
    policy = replies_policy(script_of(spec, commands), tokenizer)
    with RunStore(tmp_path / "run") as store:
        Runner(policy, SamplingParams(), progress=False, on_episode=store.add).run(make_jobs([task], [spec], 1))
        (traj,) = list(store.trajectories())
    assert traj.infra_error is None and traj.termination == Termination.submitted
    results = [s.tool_results[0] for s in traj.steps]
    escape, bomb, sleeper, chatty, big_file, alive, submit = results
    assert not escape.ok
    if isolation_available() == "bwrap":
        # refused: read-only, or hidden by the sandbox's fresh /tmp when the checkout is under /tmp
        assert escape.output.count("cannot touch") == 2, escape.output
        assert "Read-only file system" in escape.output, escape.output
    assert not Path("/etc/shell-escape-probe").exists() and not escape_target.exists()
    assert not bomb.ok and "Resource temporarily unavailable" in bomb.full_output
    assert "[killed: killed at the wall-clock limit of 2 s]" in bomb.output  # the tail survives the cut
    assert not sleeper.ok and sleeper.output == "[killed: killed at the wall-clock limit of 2 s]"
    # the model saw the head and the tail; the store holds all that the sandbox kept
    assert chatty.ok and len(chatty.output) < 400 and "characters cut ...]" in chatty.output
    assert chatty.full_output.startswith("y" * 50_000) and "stdout cut at 50000 bytes of 200000" in chatty.full_output
    assert chatty.output.endswith(chatty.full_output[-100:])
    assert not big_file.ok and "file size limit of 1 MB exceeded" in big_file.output
    assert alive.ok and alive.output == "still-alive\n[exit code 0]"
    assert submit.name == "submit"


def test_head_and_tail_keeps_both_ends_and_says_how_much_was_cut():
    text = "".join(f"line {i}\n" for i in range(1000))
    shown = head_and_tail(text, 300)
    head, marker, tail = (
        shown.split("\n[... ", 1)[0],
        shown.split("\n[... ", 1)[1].split(" ...]\n")[0],
        shown.rsplit(" ...]\n", 1)[1],
    )
    assert text.startswith(head) and text.endswith(tail)
    assert marker == f"{len(text) - len(head) - len(tail)} characters cut"
    assert head_and_tail("short", 300) == "short"


def test_the_run_config_records_the_shell_isolation(tmp_path, monkeypatch):
    import harnessrl.tasks

    suite = ShellSuite()
    monkeypatch.setattr(harnessrl.tasks, "get_suite", lambda name: suite)
    quick = {"max_steps": 1, "max_new_tokens": 4}  # the tiny random model only has to take one step
    on_path, off_path = tmp_path / "on.yaml", tmp_path / "off.yaml"
    on_path.write_text(shell_harness(rules=quick).to_yaml())
    off_path.write_text(shell_harness(rules=quick, enabled=False).to_yaml())
    cli = CliRunner()
    args = ["eval", "--suite", "shellcheck", "--split", "dev", "-n", "1", "--model", "tiny-random", "--no-progress"]
    with_shell = cli.invoke(harnessrl_app(), args + ["-H", str(on_path), "--out", str(tmp_path / "on")])
    assert with_shell.exit_code == 0, with_shell.output
    without = cli.invoke(harnessrl_app(), args + ["-H", str(off_path), "--out", str(tmp_path / "off")])
    assert without.exit_code == 0, without.output
    with RunStore(tmp_path / "on") as store:
        assert store.config["shell_isolation"] == isolation_description(isolation_available())
    with RunStore(tmp_path / "off") as store:
        assert "shell_isolation" not in store.config
    assert json.loads((tmp_path / "on" / "summary.json").read_text())["suite"] == "shellcheck"


@pytest.mark.skipif(isolation_available() != "bwrap", reason="a workspace at a fixed path needs bubblewrap's mounts")
def test_a_task_with_a_workspace_mount_runs_commands_there(tmp_path, tokenizer):
    spec = shell_harness(wall_s=20.0)  # nothing here is meant to be killed: room for a loaded machine
    task = ShellSuite().tasks("dev", 1)[0]
    task.workspace_mount = "/root/harnessrl-task"
    task.solution = [
        {"name": "shell", "arguments": {"command": "pwd; ls"}},
        {
            "name": "shell",
            "arguments": {"command": "cd / && wc -l < /root/harnessrl-task/data.txt > /root/harnessrl-task/count.txt"},
        },
        {"name": "submit", "arguments": {}},
    ]
    (traj,) = Runner(oracle_policy([task], spec, tokenizer), SamplingParams(), progress=False).run(
        make_jobs([task], [spec], 1)
    )
    assert traj.infra_error is None and traj.grade.passed  # the write landed in the graded workspace
    assert traj.steps[0].tool_results[0].output == "/root/harnessrl-task\ndata.txt\n[exit code 0]"


def test_a_workspace_mount_the_sandbox_cannot_make_is_an_infra_error_with_the_reason(tokenizer, monkeypatch):
    from harnessrl.tasks import sandbox_exec

    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    spec = shell_harness()
    task = ShellSuite().tasks("dev", 1)[0]
    task.workspace_mount = "/app"
    (traj,) = Runner(
        replies_policy(script_of(spec, ["ls"]), tokenizer), SamplingParams(), max_retries=0, progress=False
    ).run(make_jobs([task], [spec], 1))
    assert traj.termination == Termination.error
    assert "the shell cannot run this task's commands" in traj.infra_error and "need bubblewrap" in traj.infra_error


def _submit_only(spec: HarnessSpec, tokenizer):
    proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)
    return replies_policy([proto.render_call(ToolCall(name="submit", arguments={}))], tokenizer)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_evolve_run_config_records_the_shell_isolation(tmp_path, tokenizer, enabled):
    from harnessrl.evolve import Evolution, EvolveConfig
    from harnessrl.evolve.proposers import RulesProposer

    spec = shell_harness(enabled=enabled)
    suite = ShellSuite()
    config = EvolveConfig(
        suite="shellcheck",
        seed_harness=spec.name,
        model="scripted",
        dev_tasks=2,
        test_tasks=1,
        rollouts=1,
        iterations=1,
        candidates=1,
        max_in_flight=2,
    )
    Evolution(
        tmp_path / "evo",
        config,
        spec,
        suite.tasks("dev", 2),
        suite.tasks("test", 1),
        _submit_only(spec, tokenizer),
        RulesProposer(),
    ).run()
    with RunStore(tmp_path / "evo") as store:
        assert store.config["evolve"]["suite"] == "shellcheck"
        if enabled:
            assert store.config["shell_isolation"] == isolation_description(isolation_available())
        else:
            assert "shell_isolation" not in store.config


def test_the_training_record_holds_the_shell_isolation(tmp_path):
    from harnessrl.train.trainer import TrainConfig

    config = TrainConfig(
        model="tiny-random", scheduler="single:react-shell", steps=1, tasks_per_step=2, group_size=2, eval_every=0
    )
    with_shell = grpo_trainer(config, tmp_path / "on", suite=ShellSuite(), specs=[shell_harness()], progress=False)
    assert with_shell.record["shell_isolation"] == isolation_description(isolation_available())
    without = grpo_trainer(
        config, tmp_path / "off", suite=ShellSuite(), specs=[shell_harness(enabled=False)], progress=False
    )
    assert "shell_isolation" not in without.record


def harnessrl_app():
    from harnessrl.cli import app

    return app


def test_shell_settings_round_trip_and_are_validated():
    spec = shell_harness(wall_s=5.0)
    assert parse_spec(json.loads(json.dumps(spec.to_dict()))) == spec
    from harnessrl.harness.spec import SpecError

    with pytest.raises(SpecError, match="rules.shell.processes"):
        shell_harness(processes=1)
