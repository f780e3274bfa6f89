"""Runs that stop cleanly: SIGTERM stops a job as Ctrl-C does (agents and services stopped,
finished episodes kept, exit 143); an agent killed by its wall clock while the model still
generates its reply is a timeout, and neither holds the run's end nor aborts the process; a
run of nothing but infrastructure errors exits 3.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import typer
from helpers import shrunk_file
from typer.testing import CliRunner

from harnessrl.cli import app
from harnessrl.cli.common import TERMINATED, job_errors
from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec
from harnessrl.models.base import Policy, SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.store import RunStore
from harnessrl.tasks import get_suite
from harnessrl.types import Termination

ROOT = Path(__file__).resolve().parents[1]
BEHAVE = ROOT / "tests" / "fixtures" / "agents" / "behave.py"
CLAWEVAL = ROOT / "tests" / "fixtures" / "claweval"


def agent_yaml(folder: Path, mode: str, wall_s: float, env: dict | None = None) -> Path:
    lines = [
        f"name: {mode}",
        "kind: external",
        f'command: ["{{python}}", "{BEHAVE}", "{mode}"]',
        f"limits: {{wall_s: {wall_s}, max_model_calls: 4}}",
    ]
    if env:
        lines.append("env: {" + ", ".join(f'{k}: "{v}"' for k, v in env.items()) + "}")
    path = folder / f"{mode}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def descendants(pid: int) -> dict[int, bytes]:
    """pid -> command line of every process below `pid` now."""
    parents: dict[int, int] = {}
    lines: dict[int, bytes] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            lines[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, bytes] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                found[child] = lines.get(child, b"")
                frontier.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its parent does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stored(folder: Path, harness: str = "%") -> int:
    """Episodes of `harness` (a LIKE pattern) stored so far that are not infrastructure errors."""
    try:
        with sqlite3.connect(folder / "run.db") as db:
            return db.execute(
                "SELECT count(*) FROM episodes WHERE infra = 0 AND harness LIKE ?", (harness,)
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


# ------------------------------------------------------------------------------------- SIGTERM


def test_sigterm_inside_a_job_is_ctrl_c_with_its_own_exit_status(capsys):
    with pytest.raises(typer.Exit) as stopped:
        with job_errors("runs/x", "finished episodes are saved"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
    assert stopped.value.exit_code == TERMINATED == 143
    assert "terminated (SIGTERM): finished episodes are saved; continue with --resume --out runs/x" in (
        capsys.readouterr().err
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after the job


def test_sigterm_stops_an_eval_with_its_agents_and_services_and_keeps_its_episodes(tmp_path):
    """`harnessrl eval` of the Claw-Eval fixture (a task with a mock service) through an agent
    that answers and one that hangs: SIGTERM while the hanging agents and their services run
    stops the run within seconds with exit 143, the finished episodes stored, and every process
    it started (agents, services, their sandboxes and relays) gone."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "harnessrl.cli", "eval", "--suite", f"claweval:{CLAWEVAL}", "--model", "tiny-random"]
    args += ["--harness", str(agent_yaml(tmp_path, "ask", 60)), "--harness", str(agent_yaml(tmp_path, "hang", 120))]
    args += ["--retries", "0", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            below = descendants(proc.pid)
            lines = list(below.values())
            hanging = any(b"behave.py\x00hang" in c for c in lines)
            serving = any(b"mock_services" in c for c in lines)
            if hanging and serving and stored(out, "ask") >= 2 and proc.poll() is None:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.3)
        else:
            pytest.fail("the hanging agents and their services never ran side by side")
        time.sleep(1.0)
        below = descendants(proc.pid)
        before = stored(out)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stderr.decode()[-3000:]
    assert took < 10, took
    assert b"terminated (SIGTERM): finished episodes are saved; continue with --resume" in stderr
    assert b"Traceback" not in stderr, stderr.decode()[-3000:]
    deadline = time.monotonic() + 5  # (a killed sandbox's last processes are reaped by their own init)
    while [p for p in below if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {p: below[p][:120] for p in below if alive(p)}
    assert not left, left
    assert stored(out) >= before >= 2
    assert stored(out, "hang") == 0  # an episode stopped by the signal is not recorded


# --------------------------------------------------------------------- an agent killed mid-call


class SlowPolicy(ScriptedPolicy):
    """Replies after `delay_s`: a model still generating when the agent's wall clock runs out.
    Served by the default background thread (Policy.submit), which cannot stop a request it
    started: the hardest case for whoever waits on it."""

    def __init__(self, delay_s: float, tokenizer):
        super().__init__(["a late reply"], tokenizer=tokenizer, name="slow")
        self.delay_s = delay_s

    def submit(self, request, sampling=None):
        return Policy.submit(self, request, sampling or SamplingParams())

    def complete(self, requests, sampling=None):
        time.sleep(self.delay_s)
        return super().complete(requests, sampling)


def test_an_agent_killed_while_the_model_generates_is_a_timeout_and_the_run_ends_at_once(tokenizer, caplog):
    """The agent asks once; the reply would take 30 s and its wall clock is 3 s: the episode is a
    timeout (not an infrastructure error, no step: the reply never came), and the run ends right
    after it, without the recording endpoint waiting for the handler (GRACEFUL_SHUTDOWN_S) or
    cancelling it with a traceback."""
    spec = parse_spec(
        {
            "name": "ask",
            "kind": "external",
            "command": ["{python}", str(BEHAVE), "ask"],
            "limits": {"wall_s": 3, "max_model_calls": 4},
        }
    )
    assert isinstance(spec, ExternalHarnessSpec)
    task = get_suite("workspace").tasks("dev", 1)[0]
    runner = Runner(SlowPolicy(30.0, tokenizer), SamplingParams(), progress=False, max_retries=0)
    caplog.set_level(logging.INFO)
    t0 = time.monotonic()
    [traj] = runner.run(make_jobs([task], [spec], 1))
    took = time.monotonic() - t0
    assert traj.termination == Termination.timeout and not traj.is_infra_error, (
        traj.termination_detail,
        traj.infra_error,
    )
    assert "limits.wall_s" in traj.termination_detail and traj.steps == []
    assert took < 3 + 4, took
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in problems if "ASGI" in m or "graceful" in m], problems


DRIVER = """
import atexit, sys, threading

def engines_left():  # registered first, so it runs after harnessrl's own exit handlers
    left = [t.name for t in threading.enumerate() if t.name == "harnessrl-engine" and t.is_alive()]
    print(f"engine threads at exit: {len(left)}", file=sys.stderr, flush=True)

atexit.register(engines_left)

import torch
import harnessrl.models as models
from harnessrl.cli import app
from harnessrl.models.embedded import load_tokenizer, tiny_random_model
from harnessrl.models.engine_config import EngineConfig
from harnessrl.models.hf import HFPolicy

def slow_tiny(spec, sampling=None, **kw):
    # the tiny model, each of its linear layers made slow in torch itself (a token takes about a
    # second), decoded through its modules (not the engine's own decode forward)
    model = tiny_random_model()
    weight = torch.randn(700, 700)
    def busy(module, args):
        for _ in range(20):
            weight @ weight
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(busy)
    engine = EngineConfig.from_env(fast_decode=False, packed_decode=False)
    return HFPolicy(model, load_tokenizer(), name="tiny-random", engine=engine)

models.load_policy = slow_tiny
app(sys.argv[1:])
"""


def test_eval_whose_agent_is_killed_mid_call_exits_0_with_a_timeout_and_no_engine_left(tmp_path):
    """`harnessrl eval` in a process of its own, the local model's engine slow in torch: the agent
    is killed at its wall clock while the engine generates its reply. The process exits 0 (no
    abort of a torch thread at exit, no traceback), the episode is recorded as a timeout, and no
    engine thread is left running when the interpreter exits."""
    out = tmp_path / "run"
    harness = agent_yaml(tmp_path, "ask", 4, env={"AGENT_MAX_TOKENS": "400"})
    args = ["eval", "--harness", str(harness), "--suite", "workspace", "--tasks", "1", "--model", "tiny-random"]
    args += ["--retries", "0", "--no-progress", "--out", str(out)]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DRIVER), *args], capture_output=True, timeout=300, cwd=ROOT
    )
    took = time.monotonic() - t0
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr[-3000:]
    assert "terminate called" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert "engine threads at exit: 0" in stderr, stderr[-3000:]
    with RunStore(out) as store:
        [traj] = list(store.trajectories(with_tokens=False))
    assert traj.termination == Termination.timeout and not traj.is_infra_error, traj.termination_detail
    assert took < 120, took  # 400 tokens at about a second each were not waited for


# ------------------------------------------------------------------- nothing but infrastructure


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_eval_of_nothing_but_infrastructure_errors_exits_3_with_the_first_error(tmp_path):
    model = f"openai:m@http://127.0.0.1:{closed_port()}/v1"  # a server that is not there
    args = ["eval", "--harness", "json-tools", "--suite", "workspace", "--tasks", "2", "--model", model]
    r = CliRunner().invoke(app, [*args, "--retries", "0", "--no-progress", "--out", str(tmp_path / "run")])
    assert r.exit_code == 3, r.output
    assert "every episode of the run (2) was an infrastructure error, so nothing was measured" in r.output
    assert "the first: model backend failed" in r.output and "Connection refused" in r.output


def test_a_harness_of_only_infrastructure_errors_beside_one_that_measured_is_a_warning(tmp_path, monkeypatch):
    from harnessrl.harness import agent_view, external

    def no_python():
        raise agent_view.NoAgentPython("no Python for the agent here")

    monkeypatch.setattr(external, "agent_python", no_python)
    measured = shrunk_file(tmp_path, "json-tools", max_steps=2, max_new_tokens=32)  # json-tools, short episodes
    args = ["eval", "--harness", str(measured), "--harness", str(agent_yaml(tmp_path, "ask", 30))]
    args += ["--suite", "workspace", "--tasks", "2", "--model", "tiny-random", "--retries", "0", "--no-progress"]
    # the preflight would refuse the agent (it makes no first request) before any episode
    r = CliRunner().invoke(app, [*args, "--no-preflight", "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert "warning: every episode of harness ask (2) was an infrastructure error; the first: no Python" in r.output


def test_closing_an_engine_cuts_the_step_in_progress_short_and_leaves_the_model_as_it_was(tokenizer):
    """A prefill that takes seconds (every linear layer of the tiny model sleeps 0.3 s first):
    `close` while it runs returns at the next layer, not at the end of the forward; the request
    fails with EngineClosed; the model keeps only its own hooks."""
    import torch

    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.engine import Engine, EngineClosed

    model = tiny_random_model()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    entered = []

    def slow(module, args):
        entered.append(module)
        time.sleep(0.3)

    for m in linears:
        m.register_forward_pre_hook(slow)
    engine = Engine(model, tokenizer, fast_decode=False, packed_decode=False, overlap_prefill=False).start()
    future = engine.submit(list(range(10, 60)), 20)
    while not entered:
        time.sleep(0.01)
    t0 = time.monotonic()
    engine.close()
    took = time.monotonic() - t0
    assert took < 1.0, took  # a forward here takes len(linears) x 0.3 s = 4.2 s
    assert len(entered) < len(linears)
    with pytest.raises(EngineClosed):
        future.result(timeout=5)
    assert all(len(m._forward_pre_hooks) == 1 for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert not any(m._forward_pre_hooks for m in model.modules() if not isinstance(m, torch.nn.Linear))
