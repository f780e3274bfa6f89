"""Harbor task folders (`--suite harbor:PATH`), run without Docker.

Layout: PATH is one task folder or a folder of task folders, each with

    task.toml            [verifier] timeout_sec, env; [environment] docker_image, memory_mb, ...
    instruction.md       the instruction
    environment/         optional; a Dockerfile made only of the instructions listed below
    tests/test.sh        the verifier; it writes /logs/verifier/reward.txt (or reward.json)

As Harbor does: the agent works in the image's WORKDIR (default here: /app); after the episode
`tests/` is copied to `/tests`, `/logs/verifier/` and `/logs/agent/` exist and are writable, and
`/tests/test.sh` is executed from the working directory (its output going to
/logs/verifier/test-stdout.txt) with `[verifier].env` (`${VAR}` values taken from this process)
and the Dockerfile's ENV set, within `[verifier].timeout_sec` (default 600 s). The score is
`reward.txt` (one number), else `reward.json`: its `reward` key, or its only value. The exit
status of test.sh is not the score.

Without Docker the task runs on this machine's own tools in the sandbox, so a task whose
environment cannot exist without building or pulling an image is refused, with the reason:
- `environment.docker_image` is set (a pre-built image), or `environment/docker-compose.y[a]ml`
  exists (services);
- its Dockerfile has any instruction other than FROM (one stage), WORKDIR, COPY/ADD of
  build-context files (not archives, which ADD unpacks) to a path inside the WORKDIR, ENV, ARG,
  LABEL, USER, EXPOSE, CMD, ENTRYPOINT, MAINTAINER, SHELL, STOPSIGNAL, HEALTHCHECK, VOLUME. A RUN
  step installs or builds something only the image would have.
FROM is not honoured: the base image's tools are this machine's. COPY'd files are copied into the
workspace, which the sandboxed shell and the verifier see at the working directory (the shell's
commands start there). A working directory the sandbox refuses (`sandbox_exec.mount_point_problem`:
under /usr, /etc, a new folder in /opt, ...) is refused as well.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from harnessrl.tasks.base import Environment
from harnessrl.tasks.importers.common import (
    MAX_REASON_CHARS,
    GraderError,
    ImportedSuite,
    TaskEntry,
    TaskLoadError,
    broken,
    copy_tree_into,
    isolated_python,
    mount_point_problem,
    parse_unit_float,
    read_grader_output,
    read_text,
    run_grader,
    scratch_folder,
    working_directory_note,
)
from harnessrl.types import Grade

MAX_REWARD_BYTES = 64 * 1024  # what is read of reward.txt / reward.json

DEFAULT_WORKDIR = "/app"
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
TEST_OUTPUT = "test-stdout.txt"  # where Harbor keeps test.sh's output, in /logs/verifier/
# Dockerfile instructions that need no image build here (metadata, or files we copy ourselves).
HARMLESS = {
    "ARG",
    "LABEL",
    "USER",
    "EXPOSE",
    "CMD",
    "ENTRYPOINT",
    "MAINTAINER",
    "SHELL",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "VOLUME",
}


@dataclass
class LocalEnvironment:
    """What a Dockerfile amounts to when nothing needs building."""

    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[Path, PurePosixPath]] = field(default_factory=list)  # (context source, dest in workdir)


def dockerfile_instructions(text: str) -> list[tuple[int, str, str]]:
    """[(line number, INSTRUCTION, arguments)], with continuations joined and comments dropped."""
    out: list[tuple[int, str, str]] = []
    parts: list[str] = []
    start = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = lineno
        parts.append(stripped.removesuffix("\\").strip())
        if not stripped.endswith("\\"):
            word, _, rest = " ".join(parts).partition(" ")
            out.append((start, word.upper(), rest.strip()))
            parts = []
    if parts:
        word, _, rest = " ".join(parts).partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def _refuse(name: str, why: str) -> TaskLoadError:
    return TaskLoadError(f"harbor task {name} needs its Docker environment built, which this runner does not do: {why}")


def local_environment(task_dir: Path, name: str) -> LocalEnvironment:
    """The environment of a task as a local sandbox, or TaskLoadError saying why it needs Docker."""
    env_dir = task_dir / "environment"
    local = LocalEnvironment()
    for compose in ("docker-compose.yaml", "docker-compose.yml"):
        if (env_dir / compose).exists():
            raise _refuse(name, f"environment/{compose} defines services")
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.exists():
        return local
    froms = 0
    for lineno, word, args in dockerfile_instructions(read_text(dockerfile, "environment/Dockerfile")):
        where = f"environment/Dockerfile line {lineno}: {word} {args}"[:200]
        if word == "FROM":
            froms += 1
            if froms > 1:
                raise _refuse(name, f"{where} (a multi-stage build)")
        elif word == "WORKDIR":
            path = PurePosixPath(args.strip("'\""))
            local.workdir = str(path if path.is_absolute() else PurePosixPath(local.workdir) / path)
        elif word == "ENV":
            local.env.update(_env_pairs(args, where))
        elif word in ("COPY", "ADD"):
            local.copies.extend(_copies(env_dir, word, args, local.workdir, where, name))
        elif word not in HARMLESS:
            raise _refuse(name, where)
    return local


def _env_pairs(args: str, where: str) -> dict[str, str]:
    try:
        words = shlex.split(args)
    except ValueError as e:
        raise TaskLoadError(f"malformed {where}: {e}") from None
    if len(words) >= 2 and "=" not in words[0]:  # legacy form: ENV KEY value with spaces
        return {words[0]: " ".join(words[1:])}
    pairs = {}
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not key:
            raise TaskLoadError(f"malformed {where}")
        pairs[key] = value
    return pairs


def _copies(
    context: Path, word: str, args: str, workdir: str, where: str, name: str
) -> list[tuple[Path, PurePosixPath]]:
    try:
        words = json.loads(args) if args.startswith("[") else shlex.split(args)
    except (ValueError, json.JSONDecodeError) as e:
        raise TaskLoadError(f"malformed {where}: {e}") from None
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        raise _refuse(name, f"{where} (copies from another image)")
    paths = [w for w in words if not w.startswith("--")]
    if len(paths) < 2:
        raise TaskLoadError(f"malformed {where}")
    *sources, dest = paths
    dest_path = PurePosixPath(dest) if dest.startswith("/") else PurePosixPath(workdir) / dest
    root = PurePosixPath(workdir)
    if dest_path != root and root not in dest_path.parents or ".." in dest_path.parts:
        raise _refuse(name, f"{where} (writes outside the working directory {workdir})")
    rel = dest_path.relative_to(root)
    out = []
    for src in sources:
        if "://" in src:
            raise _refuse(name, f"{where} (downloads {src})")
        if word == "ADD" and re.search(r"\.(tar|tgz|tbz2|txz)(\.\w+)?$", src):
            raise _refuse(name, f"{where} (ADD unpacks the archive {src})")
        source = (context / src).resolve()
        if context.resolve() not in source.parents and source != context.resolve() or not source.exists():
            raise TaskLoadError(f"{where}: {src} is not a file of environment/")
        # COPY dir/ dest copies the folder's contents; COPY file dest/ keeps the file name
        target = rel / source.name if source.is_file() and (dest.endswith("/") or len(sources) > 1) else rel
        out.append((source, target))
    return out


def _table(config: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, dict):
        raise TaskLoadError(f"task.toml of {name}: [{key}] must be a table")
    return value


class HarborSuite(ImportedSuite):
    kind = "harbor"
    layout = (
        "PATH/<task>/task.toml, <task>/instruction.md, <task>/tests/test.sh, optional <task>/environment/Dockerfile"
    )

    def load_entries(self) -> list[TaskEntry]:
        if (self.path / "task.toml").exists():
            folders = [self.path]
        else:
            folders = sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))
        entries = []
        for folder in folders:
            try:
                entries.append(self._entry(folder))
            except TaskLoadError as e:
                entries.append(broken(folder.name, "harbor", str(e)))
        return entries

    def _entry(self, folder: Path) -> TaskEntry:
        name = folder.name
        try:
            config = tomllib.loads(read_text(folder / "task.toml", "task.toml"))
        except tomllib.TOMLDecodeError as e:
            raise TaskLoadError(f"malformed task.toml in {folder}: {e}") from None
        instruction = read_text(folder / "instruction.md", "instruction.md").strip()
        if not instruction:
            raise TaskLoadError(f"instruction.md of {name} is empty")
        if not (folder / "tests" / "test.sh").is_file():
            raise TaskLoadError(f"missing tests/test.sh in {folder}")
        verifier = _table(config, "verifier", name)
        environment = _table(config, "environment", name)
        metadata = _table(config, "metadata", name)
        timeout = verifier.get("timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise TaskLoadError(f"task.toml of {name}: verifier.timeout_sec must be a positive number")
        verifier_env = verifier.get("env", {})
        if not isinstance(verifier_env, dict) or not all(
            isinstance(v, (str, int, float)) for v in verifier_env.values()
        ):
            raise TaskLoadError(f"task.toml of {name}: verifier.env must be a table of strings")
        memory = environment.get("memory_mb")
        if environment.get("docker_image"):
            raise _refuse(name, f"environment.docker_image = {environment['docker_image']!r} is a pre-built image")
        local = local_environment(folder, name)
        problem = mount_point_problem(local.workdir)
        if problem:
            raise TaskLoadError(f"harbor task {name} cannot run in the sandbox: its working directory {problem}")
        family = str(metadata.get("category") or "harbor")

        def setup(env: Environment) -> None:
            for source, rel in local.copies:
                copy_tree_into(source, env.require_workspace().root, rel)

        def grader(env: Environment) -> Grade:
            run_env = {**local.env, **resolve_verifier_env(verifier_env, name)}
            return self._grade(
                folder, local.workdir, run_env, float(timeout), memory if isinstance(memory, int) else None, env
            )

        return TaskEntry(
            native_id=name,
            family=family,
            instruction=instruction + working_directory_note(local.workdir),
            setup=setup,
            grader=grader,
            data={"workdir": local.workdir, "agent_timeout_sec": _table(config, "agent", name).get("timeout_sec")},
            workspace_mount=local.workdir,
        )

    def _grade(
        self,
        folder: Path,
        workdir: str,
        run_env: dict[str, str],
        timeout: float,
        memory_mb: int | None,
        env: Environment,
    ) -> Grade:
        with scratch_folder("harnessrl-harbor-") as scratch:
            tests, logs = scratch / "tests", scratch / "logs"
            shutil.copytree(folder / "tests", tests)
            (tests / "test.sh").chmod(0o755)
            (logs / "verifier").mkdir(parents=True)
            (logs / "agent").mkdir()
            result = run_grader(
                # as Harbor runs it: executed (its shebang decides), output kept next to the reward
                ["bash", "-c", f"/tests/test.sh > /logs/verifier/{TEST_OUTPUT} 2>&1"],
                workdir=scratch,
                mounts={workdir: env.require_workspace().root, "/tests": tests, "/logs": logs},
                cwd=workdir,
                # Python started by test.sh does not put its working folder (/app, the agent's) on its
                # path: a json.py the agent left there is not what `python3 -c "import json"` gets
                env={"HOME": "/root", "LC_ALL": "C.UTF-8", **isolated_python(), **run_env},
                limits=self.limits_for(timeout, memory_mb),
            )
            try:
                score, rewards = read_reward(logs / "verifier", result.returncode)
            except GraderError as e:
                try:
                    output = read_grader_output(logs / "verifier", TEST_OUTPUT, "test.sh's output") or ""
                except GraderError as refused:
                    output = str(refused)
                raise GraderError(f"{e}; test.sh output: {output.strip()[-MAX_REASON_CHARS:] or '(none)'}") from None
        return Grade(
            score=score,
            subscores={"reward": score},
            passed=score >= 1.0 - 1e-9,
            threshold=1.0,
            details={"rewards": rewards, "test_sh_exit_status": result.returncode},
        )


def resolve_verifier_env(env: dict[str, Any], name: str) -> dict[str, str]:
    """`[verifier].env` with `${VAR}` / `${VAR:-default}` values taken from this process's
    environment, as Harbor resolves them (a task names a secret its verifier needs)."""
    out = {}
    for key, value in env.items():
        match = re.fullmatch(r"\$\{(\w+)(?::-(.*))?\}", str(value))
        if match is None:
            out[str(key)] = str(value)
        elif match.group(1) in os.environ:
            out[str(key)] = os.environ[match.group(1)]
        elif match.group(2) is not None:
            out[str(key)] = match.group(2)
        else:
            raise GraderError(f"verifier.env {key} of {name} needs ${{{match.group(1)}}}, which is not set")
    return out


def read_reward(verifier_dir: Path, returncode: int | None) -> tuple[float, dict[str, float]]:
    """(score, all reward values) from reward.txt, else reward.json, as Harbor reads them."""
    # what tests/test.sh left may have been written by the agent's own program (the tests run it):
    # a link, a FIFO or a huge file there is refused by name, never followed or read whole
    txt = read_grader_output(verifier_dir, "reward.txt", "/logs/verifier/reward.txt", MAX_REWARD_BYTES)
    if txt is not None:
        score = parse_unit_float(txt, "/logs/verifier/reward.txt")
        return score, {"reward": score}
    js = read_grader_output(verifier_dir, "reward.json", "/logs/verifier/reward.json", MAX_REWARD_BYTES)
    if js is not None:
        try:
            data = json.loads(js)
        except json.JSONDecodeError as e:
            raise GraderError(f"/logs/verifier/reward.json is not JSON: {e}") from None
        if (
            not isinstance(data, dict)
            or not data
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values())
        ):
            raise GraderError("/logs/verifier/reward.json must be an object of numbers")
        rewards = {str(k): float(v) for k, v in data.items()}
        if "reward" in rewards:
            key = "reward"
        elif len(rewards) == 1:
            (key,) = rewards
        else:
            raise GraderError(f"/logs/verifier/reward.json has several values and no 'reward' key: {sorted(rewards)}")
        return parse_unit_float(str(rewards[key]), f"reward.json '{key}'"), rewards
    raise GraderError(f"tests/test.sh (exit status {returncode}) wrote no /logs/verifier/reward.txt or reward.json")
