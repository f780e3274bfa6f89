"""Suite lookup by name."""

from __future__ import annotations

from harnessrl.tasks.base import Suite


def _builtin() -> dict[str, type[Suite]]:
    from harnessrl.tasks.suites.toolcalc import ToolcalcSuite
    from harnessrl.tasks.suites.workspace import WorkspaceSuite

    return {"workspace": WorkspaceSuite, "toolcalc": ToolcalcSuite}


_instances: dict[str, Suite] = {}


def list_suites() -> list[str]:
    return sorted(_builtin())


def get_suite(name: str) -> Suite:
    """A suite by name; a ValueError that lists the known names for an unknown one."""
    suites = _builtin()
    if name not in suites:
        raise ValueError(f"unknown suite '{name}' (known: {', '.join(sorted(suites))})")
    if name not in _instances:
        _instances[name] = suites[name]()
    return _instances[name]
