"""Tasks, tools, the workspace sandbox, graders and suites."""

from harnessrl.tasks.base import (
    Environment,
    Suite,
    Task,
    Tool,
    ToolBlocked,
    ToolFailed,
    validate_arguments,
)
from harnessrl.tasks.registry import get_suite, list_suites
from harnessrl.tasks.workspace import Workspace

__all__ = [
    "Environment",
    "Suite",
    "Task",
    "Tool",
    "ToolBlocked",
    "ToolFailed",
    "Workspace",
    "get_suite",
    "list_suites",
    "validate_arguments",
]
