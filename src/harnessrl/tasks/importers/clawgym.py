"""ClawGym task folders (`--suite clawgym:PATH`).

Layout: PATH holds one folder per task (or PATH is one task folder):

    task_0000/
      data_entry.json     {"task_id", "user_query", "input_mount_dir"?, "metadata"}
      input_files/        optional; copied to input_mount_dir when that key is set
      reward/reward.sh    run after the episode; its last stdout line is the score in [0, 1]

As ClawGym's rollout does: the agent's workspace is `/root/.openclaw/workspace`; `input_mount_dir`
must lie under it; after the episode `reward/` is copied to `<workspace>/reward/` (replacing
whatever the agent left there, links removed, never followed), a payload `{task_id, user_query,
metadata, final_message, transcript}` is written to `<workspace>/.openclaw_reward_payload.json` and
named by `OPENCLAW_REWARD_PAYLOAD`, and `bash /root/.openclaw/workspace/reward/reward.sh` runs with
HOME=/root, LC_ALL=C.UTF-8 and a 120 s limit, in the folder `reward/` (not the workspace) and with
Python kept from importing what the agent left (`isolated_python`: the working folder is not put on
its path; `reward/` is). The sandboxed shell (and the grader) see the live workspace at that path.
Unlike ClawGym, which scores a failing reward script 0.0, a non-zero exit, a timeout or a last line
that is not a number in [0, 1] is an infrastructure error with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from harnessrl.tasks import untrusted
from harnessrl.tasks.base import Environment
from harnessrl.tasks.importers.common import (
    GraderError,
    ImportedSuite,
    TaskEntry,
    TaskLoadError,
    broken,
    copy_tree_into,
    grader_failed,
    isolated_python,
    openclaw_transcript,
    parse_unit_float,
    read_text,
    run_grader,
    working_directory_note,
)
from harnessrl.types import Grade

WORKSPACE = "/root/.openclaw/workspace"
REWARD_TIMEOUT_S = 120.0
PAYLOAD_NAME = ".openclaw_reward_payload.json"


def _load_entry(folder: Path) -> dict[str, Any]:
    text = read_text(folder / "data_entry.json", "data_entry.json")
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskLoadError(f"malformed data_entry.json in {folder}: {e}") from None
    if not isinstance(entry, dict):
        raise TaskLoadError(f"data_entry.json in {folder} must hold an object, not {type(entry).__name__}")
    for key, kind in (("task_id", str), ("user_query", str), ("metadata", dict)):
        if not isinstance(entry.get(key), kind):
            raise TaskLoadError(f"data_entry.json in {folder}: '{key}' must be a {kind.__name__}")
    mount = entry.get("input_mount_dir")
    if mount is not None:
        if not isinstance(mount, str):
            raise TaskLoadError(f"data_entry.json in {folder}: 'input_mount_dir' must be a string")
        if not (folder / "input_files").is_dir():
            raise TaskLoadError(f"input_mount_dir is set but {folder / 'input_files'} is missing")
        _mount_inside_workspace(mount)
    if not (folder / "reward" / "reward.sh").is_file():
        raise TaskLoadError(f"missing reward/reward.sh in {folder}")
    return entry


def _mount_inside_workspace(mount: str) -> PurePosixPath:
    """input_mount_dir relative to the workspace (ClawGym refuses a directory outside it)."""
    p, root = PurePosixPath(mount), PurePosixPath(WORKSPACE)
    if p != root and root not in p.parents or ".." in p.parts:
        raise TaskLoadError(f"input_mount_dir '{mount}' is outside {WORKSPACE}")
    return p.relative_to(root)


class ClawGymSuite(ImportedSuite):
    kind = "clawgym"
    layout = "PATH/<task>/data_entry.json, optional <task>/input_files/, <task>/reward/reward.sh"

    def load_entries(self) -> list[TaskEntry]:
        folders = (
            [self.path]
            if (self.path / "data_entry.json").exists()
            else sorted(p for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))
        )
        entries = []
        for folder in folders:
            try:
                entry = _load_entry(folder)
            except TaskLoadError as e:
                entries.append(broken(folder.name, "clawgym", str(e)))
                continue
            entries.append(self._entry(folder, entry))
        return entries

    def _entry(self, folder: Path, entry: dict[str, Any]) -> TaskEntry:
        mount = entry.get("input_mount_dir")
        family = str(entry["metadata"].get("category") or "clawgym")

        def setup(env: Environment) -> None:
            if mount is not None:  # as ClawGym: input_files/ is used only when a mount dir is named
                ws = env.require_workspace().root
                copy_tree_into(folder / "input_files", ws, _mount_inside_workspace(mount))

        def grader(env: Environment) -> Grade:
            return self._grade(folder, entry, env)

        return TaskEntry(
            native_id=folder.name,
            family=family,
            instruction=entry["user_query"] + working_directory_note(WORKSPACE),
            setup=setup,
            grader=grader,
            data={"task_id": entry["task_id"], "metadata": entry["metadata"]},
            workspace_mount=WORKSPACE,
        )

    def _grade(self, folder: Path, entry: dict[str, Any], env: Environment) -> Grade:
        ws: Path = env.require_workspace().root
        payload = {
            "task_id": entry["task_id"],
            "user_query": entry["user_query"],
            "metadata": entry["metadata"],
            "final_message": env.answer or "",
            "transcript": openclaw_transcript(env, entry["user_query"], WORKSPACE),
        }
        try:  # whatever the agent left at reward/ or at the payload's name is replaced, never followed
            untrusted.remove(ws, "reward", tree=True)
            untrusted.copy_in(folder / "reward", ws, "reward")
            untrusted.remove(ws, PAYLOAD_NAME, tree=True)
            untrusted.write_text(ws, PAYLOAD_NAME, json.dumps(payload))
        except untrusted.Refused as e:
            raise GraderError(f"cannot lay out the grader's files in the workspace: {e}") from None
        result = run_grader(
            ["bash", f"{WORKSPACE}/reward/reward.sh"],
            workdir=ws,
            mounts={WORKSPACE: ws},
            # not the workspace: an interpreter the script starts must not import what the agent
            # planted there (`python3 -` puts its working folder first on its path)
            cwd=f"{WORKSPACE}/reward",
            env={
                "OPENCLAW_REWARD_PAYLOAD": f"{WORKSPACE}/{PAYLOAD_NAME}",
                "HOME": "/root",
                "LC_ALL": "C.UTF-8",
                "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                **isolated_python(f"{WORKSPACE}/reward"),
            },
            limits=self.limits_for(REWARD_TIMEOUT_S),
        )
        if result.returncode != 0:
            raise grader_failed("reward/reward.sh failed", result)
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        score = parse_unit_float(lines[-1] if lines else "", "last line of reward/reward.sh output")
        return Grade(
            score=score,
            subscores={"reward": score},
            passed=score >= 1.0 - 1e-9,
            threshold=1.0,
            details={"grader": "reward/reward.sh"},
        )
