"""Suite lookup by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harnessrl.tasks.base import Suite

if TYPE_CHECKING:
    from harnessrl.tasks.importers.pinchbench import Judge


def _builtin() -> dict[str, type[Suite]]:
    from harnessrl.tasks.suites.browse import BrowseSuite
    from harnessrl.tasks.suites.planning import PlanningSuite
    from harnessrl.tasks.suites.toolcalc import ToolcalcSuite
    from harnessrl.tasks.suites.workspace import WorkspaceSuite

    return {"workspace": WorkspaceSuite, "toolcalc": ToolcalcSuite, "browse": BrowseSuite, "planning": PlanningSuite}


_instances: dict[str, Suite] = {}


def list_suites() -> list[str]:
    return sorted(_builtin())


def get_suite(name: str, judge: "Judge | None" = None) -> Suite:
    """A suite by name, or a task folder as `clawgym:PATH`, `pinchbench:PATH`, `harbor:PATH`,
    `claweval:PATH` (read afresh at every call); a ValueError that lists the known names for an
    unknown one. `judge` (prompt -> reply text) grades the LLM-judge parts of formats that have
    them (PinchBench, Claw-Eval); every other suite ignores it."""
    from harnessrl.tasks.importers import IMPORTERS, load_imported_suite

    if name.partition(":")[0] in IMPORTERS:
        return load_imported_suite(name, judge=judge)
    suites = _builtin()
    if name not in suites:
        forms = ", ".join(f"{k}:PATH" for k in IMPORTERS)
        raise ValueError(f"unknown suite '{name}' (known: {', '.join(sorted(suites))}; task folders: {forms})")
    if name not in _instances:
        _instances[name] = suites[name]()
    return _instances[name]
