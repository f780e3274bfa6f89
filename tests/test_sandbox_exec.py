"""The sandboxed command runner: escapes fail, limits hold, output is capped, calls always return.

Every limit here is small (processes=16, wall_s=3) so a containment bug cannot hurt the machine.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from harnessrl.tasks import sandbox_exec
from harnessrl.tasks.sandbox_exec import ExecLimits, isolation_available, run_sandboxed

SMALL = ExecLimits(wall_s=3.0, cpu_s=3, memory_mb=256, file_size_mb=1, processes=16, output_bytes=10_000)
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is missing or does not work here")


@pytest.fixture(params=["bwrap", "rlimits-only"])
def isolation(request, monkeypatch):
    """Runs a test under bubblewrap (where it works here) and under the rlimits-only fallback."""
    if request.param == "bwrap" and isolation_available() != "bwrap":
        pytest.skip("bubblewrap is missing or does not work here")
    if request.param == "rlimits-only":
        monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    return request.param


@pytest.fixture
def workdir():
    # Not pytest's tmp_path: that lives under a 0700 folder the unprivileged sandbox uid cannot reach.
    path = Path(tempfile.mkdtemp(prefix="harnessrl-test-sbx-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sh(command: str, workdir: Path, limits: ExecLimits = SMALL, **kwargs):
    return run_sandboxed(["bash", "-c", command], workdir=workdir, limits=limits, **kwargs)


def test_clean_command_returns_output_and_exit_code(workdir, isolation):
    result = sh("echo out; echo err >&2; pwd; exit 3", workdir)
    assert result.returncode == 3
    assert result.stdout.splitlines() == ["out", str(workdir.resolve())]
    assert result.stderr == "err\n"
    assert not result.timed_out and not result.output_truncated and result.reason == ""
    assert result.isolation == isolation


def test_stdin_is_passed(workdir):
    assert sh("tr a-z A-Z", workdir, stdin="hello").stdout == "HELLO"


def test_workspace_is_writable_and_writes_land_on_the_host(workdir):
    result = sh("echo data > made.txt && mkdir sub && echo x > sub/y", workdir)
    assert result.returncode == 0, result.stderr
    assert (workdir / "made.txt").read_text() == "data\n"
    assert (workdir / "sub" / "y").read_text() == "x\n"


@needs_bwrap
def test_writing_outside_the_workspace_fails(workdir):
    repo_file = Path(__file__).resolve().parents[1] / "sandbox-escape-probe"
    result = sh(f"touch /etc/harnessrl-escape; touch {repo_file}; touch /harnessrl-escape; echo done", workdir)
    assert result.stdout == "done\n"
    # Each write is refused: read-only, or (for a checkout under /tmp, hidden by the sandbox's
    # fresh /tmp) not even there to write to.
    assert result.stderr.count("cannot touch") == 3, result.stderr
    assert result.stderr.count("Read-only file system") >= 2, result.stderr
    assert not os.path.exists("/etc/harnessrl-escape")
    assert not repo_file.exists()
    assert not os.path.exists("/harnessrl-escape")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the workspace over to the sandbox uid")
def test_workspace_is_handed_over_but_hard_links_out_of_it_are_not(workdir, isolation):
    outside = Path(tempfile.mkdtemp(prefix="harnessrl-test-outside-"))
    try:
        (outside / "secret").write_text("root only\n")
        os.link(outside / "secret", workdir / "link")  # as a command could have, in the fallback mode
        (workdir / "own.txt").write_text("x\n")
        result = sh("echo more >> own.txt; id -u", workdir)
        assert result.returncode == 0, result.stderr
        assert (workdir / "own.txt").stat().st_uid == int(result.stdout) != 0
        assert (outside / "secret").stat().st_uid == 0
    finally:
        shutil.rmtree(outside)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the workspace over to the sandbox uid")
def test_files_an_earlier_call_made_stay_writable(workdir, isolation):
    # In the fallback each call runs as a uid of its own: what one call made, hard links
    # included, must be handed to the next call's uid.
    made = sh("echo 1 > a && ln a b && mkdir d && echo 1 > d/c && chmod 700 d", workdir)
    assert made.returncode == 0, made.stderr
    again = sh("echo 2 >> a && echo 2 >> d/c && cat b d/c", workdir)
    assert again.returncode == 0, again.stderr
    assert again.stdout == "1\n2\n1\n2\n"


@needs_bwrap
def test_tmp_is_fresh_and_private(workdir):
    marker = Path(tempfile.mkdtemp(prefix="harnessrl-test-host-tmp-"))
    try:
        result = sh(f"test -e {marker} && echo visible; echo x > /tmp/inside && cat /tmp/inside", workdir)
        assert result.stdout == "x\n"
        assert not Path("/tmp/inside").exists()
    finally:
        shutil.rmtree(marker)


@needs_bwrap
def test_read_only_paths_under_tmp_are_shown_but_not_writable(workdir):
    """A checkout and its virtual environment under /tmp stay visible to a program that needs
    them (an external agent), read-only, while the rest of the host's /tmp stays hidden."""
    shown = Path(tempfile.mkdtemp(prefix="harnessrl-test-shown-"))
    hidden = Path(tempfile.mkdtemp(prefix="harnessrl-test-hidden-"))
    try:
        (shown / "tool.txt").write_text("ok\n")
        os.chmod(shown, 0o755)
        os.chmod(shown / "tool.txt", 0o644)
        script = f"cat {shown}/tool.txt; test -e {hidden} || echo hidden; echo x > {shown}/new || echo read-only"
        result = run_sandboxed(["/bin/sh", "-c", script], workdir=workdir, read_only=[shown])
        assert result.stdout == "ok\nhidden\nread-only\n", result.stderr
        assert not (shown / "new").exists()
        without = sh(f"cat {shown}/tool.txt || echo missing", workdir)
        assert without.stdout.strip().endswith("missing")
    finally:
        shutil.rmtree(shown)
        shutil.rmtree(hidden)


@pytest.fixture
def listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.sendall(b"hello\n")
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@needs_bwrap
def test_network_is_unreachable_unless_asked_for(workdir, listening_port):
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{listening_port} && head -n1 <&3"
    cut_off = sh(probe, workdir)
    assert cut_off.returncode != 0 and "hello" not in cut_off.stdout
    connected = sh(probe, workdir, network=True)
    assert connected.returncode == 0 and connected.stdout == "hello\n", connected.stderr


BOMB = "bomb() { bomb & bomb & sleep 5.4321; }; bomb"
CHATTY = "head -c 50000000 /dev/zero | tr '\\0' a; echo tail >&2"


def test_fork_bomb_is_contained_and_returns_within_the_wall_limit(workdir, isolation):
    # Each bomb process sleeps, so without a process limit they would pile up by the thousand.
    _assert_bomb_contained(sh(BOMB, workdir))


def _assert_bomb_contained(result) -> None:
    assert result.timed_out and result.duration_s < SMALL.wall_s + 2
    assert "fork" in result.stderr and "Resource temporarily unavailable" in result.stderr
    # SIGKILL is delivered at once, but on a loaded machine a killed process can take a moment to
    # be scheduled and exit; anything still alive after that grace (the sleeps last 5.4 s) escaped.
    deadline = time.monotonic() + 2.0
    while _processes_running("sleep 5.4321") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_running("sleep 5.4321") == []


def _processes_running(command_line: str) -> list[int]:
    """Pids whose command line is exactly `command_line` (none may outlive a sandbox)."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read().replace(b"\0", b" ").strip() == command_line.encode():
                    alive.append(int(pid))
        except OSError:
            continue
    return alive


def test_sleep_forever_is_killed_at_the_wall_limit(workdir):
    result = sh("echo started; sleep 1000", workdir, limits=ExecLimits(wall_s=1.0, processes=16))
    assert result.timed_out and result.returncode is None
    assert 1.0 <= result.duration_s < 3.0
    assert result.stdout == "started\n"
    assert "wall-clock limit of 1 s" in result.reason


def test_background_processes_do_not_outlive_the_call(workdir, isolation):
    result = sh("sleep 1000 & echo left", workdir)
    assert result.returncode == 0 and result.stdout == "left\n"
    assert result.duration_s < 2.0


def test_huge_output_is_truncated_without_hanging(workdir, isolation):
    _assert_chatty_output_cut(sh(CHATTY, workdir))


def _assert_chatty_output_cut(result) -> None:
    assert result.returncode == 0, result.stderr
    assert result.output_truncated
    assert result.stdout == "a" * SMALL.output_bytes
    assert result.stderr == "tail\n"
    assert "stdout cut at 10000 bytes of 50000000" in result.reason


@pytest.fixture
def crowded_uid():
    """20 long-lived processes (more than SMALL.processes) of the uid a fallback command used to
    share: the unprivileged sandbox uid 65534 when we are root, else our own."""
    uid = sandbox_exec.SANDBOX_UID if os.geteuid() == 0 else os.getuid()
    drop = {"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 else {}
    sleepers = [subprocess.Popen(["sleep", "60.123"], **drop) for _ in range(20)]
    deadline = time.monotonic() + 5
    while len(_processes_running("sleep 60.123")) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(os.stat(f"/proc/{p.pid}").st_uid == uid for p in sleepers)
    yield uid
    for sleeper in sleepers:
        sleeper.kill()
        sleeper.wait()


def test_other_processes_of_the_sandbox_uid_do_not_count(workdir, isolation, crowded_uid):
    result = sh(CHATTY, workdir)
    assert result.isolation == isolation
    _assert_chatty_output_cut(result)
    _assert_bomb_contained(sh(BOMB, workdir))


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user every command shares that user's process count")
def test_fallback_sandboxes_side_by_side_do_not_share_a_process_limit(workdir, monkeypatch):
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    other = Path(tempfile.mkdtemp(prefix="harnessrl-test-sbx-"))
    results = {}
    # The clean command starts first and forks after the bomb has filled its own limit. (Its
    # wall limit is long, so only a refused fork, not a busy machine, can make it fail.)
    patient = dataclasses.replace(SMALL, wall_s=20.0)
    clean = threading.Thread(target=lambda: results.update(clean=sh(f"sleep 1; {CHATTY}", workdir, limits=patient)))
    try:
        clean.start()
        time.sleep(0.3)
        _assert_bomb_contained(sh(BOMB, other))
        clean.join()
    finally:
        shutil.rmtree(other)
    _assert_chatty_output_cut(results["clean"])


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs commands as other uids")
def test_fallback_without_private_uids_counts_the_limit_from_the_uids_processes(workdir, monkeypatch, crowded_uid):
    # as in a user namespace that maps no uid of the private pool: the command runs as uid 65534
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    monkeypatch.setattr(sandbox_exec, "_pool_is_mapped", lambda: False)
    assert sh("id -u", workdir).stdout == f"{sandbox_exec.SANDBOX_UID}\n"
    _assert_chatty_output_cut(sh(CHATTY, workdir))
    _assert_bomb_contained(sh(BOMB, workdir))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs commands as other uids")
def test_fallback_runs_each_command_as_a_uid_no_process_has(workdir, monkeypatch):
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    taken = 1_900_123_456
    monkeypatch.setattr(sandbox_exec, "PRIVATE_UID_POOL", range(taken, taken + 2))
    holder = subprocess.Popen(["sleep", "60"], user=taken)
    try:
        for _ in range(3):
            result = sh("id -u; id -g; id -G", workdir)
            assert result.stdout.split() == [str(taken + 1)] * 3, result.stderr
        monkeypatch.setattr(sandbox_exec, "PRIVATE_UID_POOL", range(taken, taken + 1))
        with pytest.raises(OSError, match="no free uid"):
            sh("true", workdir)
    finally:
        holder.kill()
        holder.wait()


def test_memory_hog_fails(workdir):
    # Copying 256 MB through a pipe takes seconds on a busy machine: the wall clock must not win.
    result = sh(
        "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}",
        workdir,
        limits=dataclasses.replace(SMALL, wall_s=20.0, cpu_s=20),
    )
    assert result.returncode != 0
    assert "400000000" not in result.stdout
    assert "allocate" in result.stderr


def test_file_size_hog_fails(workdir):
    result = sh("head -c 5000000 /dev/zero > big.bin", workdir)
    assert result.returncode != 0
    assert "file size limit of 1 MB exceeded" in result.reason
    assert (workdir / "big.bin").stat().st_size <= 1024 * 1024


def test_cpu_hog_is_stopped(workdir):
    result = sh("while :; do :; done", workdir, limits=ExecLimits(wall_s=6.0, cpu_s=1, processes=16))
    assert not result.timed_out, "the CPU limit, not the wall clock, should stop a busy loop"
    assert "CPU time limit of 1 s exceeded" in result.reason


def test_environment_is_clean(workdir, monkeypatch):
    monkeypatch.setenv("HARNESSRL_SECRET_TOKEN", "leak-me")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leak")
    result = sh("env", workdir, env={"EXTRA": "1"})
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
    assert "leak" not in result.stdout
    assert names <= {"PATH", "HOME", "LANG", "EXTRA", "PWD", "SHLVL", "_"}
    assert f"HOME={workdir.resolve()}" in result.stdout and "EXTRA=1" in result.stdout


@needs_bwrap
def test_mounts_map_a_host_folder_to_a_chosen_path(workdir):
    (workdir / "task.txt").write_text("given\n")
    result = sh(
        "pwd; cat task.txt; echo made > /workspace/out.txt; echo $HOME", workdir, mounts={"/workspace": workdir}
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "/workspace\ngiven\n/workspace\n"
    assert (workdir / "out.txt").read_text() == "made\n"
    other = Path(tempfile.mkdtemp(prefix="harnessrl-test-sbx-"))
    try:
        both = sh(
            "ls /data/in; touch /workspace/a /data/in/b",
            workdir,
            mounts={"/workspace": workdir, "/data/in": other},
            cwd_in_sandbox="/data/in",
        )
        assert both.returncode == 0, both.stderr
        assert (workdir / "a").exists() and (other / "b").exists()
    finally:
        shutil.rmtree(other)


@needs_bwrap
def test_a_mount_inside_a_home_folder_shows_only_the_mount_and_writes_land(workdir):
    (workdir / "task.txt").write_text("given\n")
    result = sh(
        "pwd; cat task.txt; ls -A /root; echo made > /root/.openclaw/workspace/out.txt; "
        "echo scratch > /root/harnessrl-shadow-probe; ls -A /home; ls -A /",
        workdir,
        mounts={"/root/.openclaw/workspace": workdir, "/home/agent/app": workdir},
    )
    # /root and /home hold only the mounts: the machine's own are not there at all, and the rest
    # of the sandbox's root is read-only
    assert result.stdout.splitlines()[:5] == ["/root/.openclaw/workspace", "given", ".openclaw", "agent", "bin"]
    assert "Read-only file system" in result.stderr
    top = set(result.stdout.splitlines()[4:])
    assert top <= {*sandbox_exec.SYSTEM_VIEW, "dev", "proc", "tmp", "root", "home"}, top
    assert (workdir / "out.txt").read_text() == "made\n"
    assert not Path("/root/harnessrl-shadow-probe").exists()


@needs_bwrap
def test_a_mount_inside_another_mount_is_made_after_it(workdir):
    inner = Path(tempfile.mkdtemp(prefix="harnessrl-test-sbx-"))
    try:
        # the inner mount point is listed first: it must not be covered by the outer one
        result = sh(
            "echo in > /srv/app/data/x; ls /srv/app",
            workdir,
            mounts={"/srv/app/data": inner, "/srv/app": workdir},
            cwd_in_sandbox="/srv/app",
        )
        assert result.returncode == 0, result.stderr
        assert (inner / "x").read_text() == "in\n" and "data" in result.stdout
    finally:
        shutil.rmtree(inner)


def test_impossible_mounts_are_refused_clearly(workdir):
    with pytest.raises(ValueError, match="absolute path"):
        sh("true", workdir, mounts={"workspace": workdir})
    for system in ("/", "/etc/harnessrl-nowhere", "/usr/src/app", "/usr", "/proc/x", "/dev/shm/x", "/bin/x"):
        with pytest.raises(ValueError, match="system files|whole file system"):
            sh("true", workdir, mounts={system: workdir})
    with pytest.raises(ValueError, match="not a folder"):
        sh("true", workdir, mounts={"/workspace": workdir / "missing"})
    with pytest.raises(ValueError, match="non-empty list"):
        run_sandboxed([], workdir=workdir)


def test_fallback_without_bubblewrap_says_so_and_still_limits(workdir, monkeypatch):
    monkeypatch.setattr(sandbox_exec, "isolation_available", lambda: "rlimits-only")
    result = sh("echo hi; sleep 1000", workdir, limits=ExecLimits(wall_s=1.0, processes=16))
    assert result.isolation == "rlimits-only"
    assert result.timed_out and result.stdout == "hi\n"
    with pytest.raises(ValueError, match="need bubblewrap"):
        sh("true", workdir, mounts={"/workspace": workdir})
    said = sandbox_exec.isolation_description("rlimits-only")
    assert said.startswith("rlimits-only: bubblewrap is missing") and "see the host's whole file system" in said
    assert sandbox_exec.isolation_description("bwrap") == "bwrap"


def test_the_stop_event_kills_the_whole_tree_at_once(workdir, isolation):
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    limits = dataclasses.replace(SMALL, wall_s=30.0)
    result = sh("sleep 100 & sleep 100; echo never", workdir, limits=limits, stop=stop)
    assert result.stopped and not result.timed_out and result.returncode is None
    assert result.duration_s < 5 and "never" not in result.stdout
    assert result.reason.startswith("stopped by the caller")


@needs_bwrap
def test_only_the_system_and_the_given_paths_are_visible_and_hidden_ones_are_empty(workdir):
    """Isolation by construction: the host's other folders do not exist in the sandbox; a
    read_only path is there read-only; a hidden folder inside it is an empty read-only folder."""
    shown = Path(tempfile.mkdtemp(prefix="harnessrl-test-shown-"))
    try:
        shown.chmod(0o755)
        (shown / "tool.txt").write_text("mine\n")
        (shown / "secret").mkdir()
        (shown / "secret" / "answer.txt").write_text("42\n")
        for path in (shown / "tool.txt", shown / "secret", shown / "secret" / "answer.txt"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        here = Path(__file__).resolve()
        result = sh(
            f"cat {shown}/tool.txt; ls -A {shown}/secret | wc -l; ls {here} 2>&1; "
            f"echo x > {shown}/new 2>&1; echo y > {shown}/secret/new 2>&1; ls /",
            workdir,
            read_only=[shown],
            hidden=[shown / "secret"],
        )
    finally:
        shutil.rmtree(shown)
    lines = result.stdout.splitlines()
    assert lines[:2] == ["mine", "0"], result.stdout
    assert "No such file or directory" in lines[2]  # this checkout is not there
    assert result.stderr.count("Read-only file system") == 2, result.stderr
    assert set(lines[3:]) <= {*sandbox_exec.SYSTEM_VIEW, "dev", "proc", "tmp"} | {shown.parts[1], workdir.parts[1]}


def test_a_read_only_path_the_sandbox_user_cannot_read_is_refused_with_the_fix(workdir):
    if os.geteuid() != 0:
        pytest.skip("the sandbox changes the uid only when we are root")
    private = Path(tempfile.mkdtemp(prefix="harnessrl-test-private-"))  # 0700, as `mktemp -d` makes
    try:
        (private / "agent.sh").write_text("echo hi\n")
        with pytest.raises(
            ValueError, match=rf"cannot show {private}/agent.sh in the sandbox: it is inside {private} \(mode 700"
        ):
            sh("true", workdir, read_only=[private / "agent.sh"])
        private.chmod(0o755)
        (private / "agent.sh").chmod(0o600)
        with pytest.raises(ValueError, match=r"it is mode 600, and .*`chmod o\+r [^`]*agent.sh`"):  # the file alone
            sh("true", workdir, read_only=[private / "agent.sh"])
    finally:
        shutil.rmtree(private)


def test_a_command_filling_the_disk_is_killed_at_the_disk_limit(workdir, isolation):
    limits = dataclasses.replace(SMALL, wall_s=30.0, cpu_s=30, file_size_mb=2, disk_mb=5)
    fill_tmp = (
        "for j in 1 2 3 4 5 6 7 8; do head -c 1000000 /dev/zero > /tmp/f$j || echo tmp-full; done; rm -f /tmp/f*; "
    )
    result = sh(
        (fill_tmp if isolation == "bwrap" else "")
        + "i=0; while true; do i=$((i+1)); head -c 1000000 /dev/zero > f$i; sleep 0.01; done",
        workdir,
        limits=limits,
    )
    assert not result.timed_out and result.duration_s < 20
    # measured twice a second: what it wrote meanwhile is over the limit too
    assert result.reason.startswith("disk limit of 5 MB exceeded"), result.reason
    if isolation == "bwrap":  # its /tmp is a tmpfs of disk_mb
        assert "tmp-full" in result.stdout and "No space left on device" in result.stdout + result.stderr
