"""Suite `workspace`: file-system tasks graded on the final state of a sandboxed workspace.

In the style of ClawGym: each task fills a fresh temporary workspace with a few small files,
tells the agent exactly what to do and which paths to use, and a grader inspects the files left
behind when the agent submits. Families range from a single write to multi-step edits; a
multi-step family returns several named sub-scores so that partial work earns partial credit
(the task score is their mean and a task passes only at 1.0).

Every family is a function `rng -> TaskParts` (see `harnessrl.tasks.base.Family`): the ones
that move files around in `files.py`, the ones that compute or answer from file contents in
`content.py`, their checks in `checks.py`, the text they write in `text.py`. All names and
values come from the rng, so instances differ and a (suite, split, index) always rebuilds the same
instance. Graders never raise: a missing, garbled or misplaced file scores 0 on the checks that
need it (see `checks.run_checks`), and trailing whitespace / newlines are ignored.
"""

from __future__ import annotations

from harnessrl.tasks.base import Family, Suite, Tool
from harnessrl.tasks.suites.workspace.content import (
    answer_from_file,
    count_text,
    csv_report,
    extract_lines,
    find_file,
    fix_config,
    json_update,
    merge_lists,
)
from harnessrl.tasks.suites.workspace.files import (
    append_line,
    copy_content,
    create_file,
    delete_matching,
    rename_by_rule,
    rename_file,
    scaffold_project,
    sort_by_extension,
)
from harnessrl.tasks.workspace import WORKSPACE_TOOLS

FAMILIES: dict[str, Family] = {
    "create_file": create_file,
    "append_line": append_line,
    "rename_file": rename_file,
    "delete_matching": delete_matching,
    "sort_by_extension": sort_by_extension,
    "copy_content": copy_content,
    "csv_report": csv_report,
    "fix_config": fix_config,
    "rename_by_rule": rename_by_rule,
    "merge_lists": merge_lists,
    "extract_lines": extract_lines,
    "count_text": count_text,
    "answer_from_file": answer_from_file,
    "find_file": find_file,
    "json_update": json_update,
    "scaffold_project": scaffold_project,
}


class WorkspaceSuite(Suite):
    """File-system tasks (ClawGym style), graded on the final workspace state."""

    name = "workspace"
    description = "File-system tasks in a sandboxed workspace, graded on the files left behind."
    split_sizes = {"train": 2000, "dev": 48, "test": 72}
    pass_threshold = 1.0
    needs_workspace = True

    def families(self) -> dict[str, Family]:
        return dict(FAMILIES)

    def base_tools(self) -> list[Tool]:
        return list(WORKSPACE_TOOLS)
