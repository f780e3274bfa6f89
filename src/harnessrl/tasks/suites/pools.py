"""The word pools the generated suites draw names and phrases from, kept as package data.

Each suite's pools are one JSON object in `harnessrl/tasks/suites/data/<suite>.json` (a key per
pool, a list of strings or a small nested structure), read once per process. The pools are part
of what makes an instance: editing one changes the tasks a (suite, split, index) rebuilds.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def load_pools(suite: str) -> dict[str, Any]:
    """The pools of `suite` (`workspace`, `browse`, `toolcalc`, `planning`); a RuntimeError when its
    data file is missing from the installation (a build without the package data)."""
    source = resources.files("harnessrl.tasks.suites").joinpath("data", f"{suite}.json")
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuntimeError(
            f"the word pools of suite '{suite}' are missing: {source} is not installed "
            "(harnessrl's package data, tasks/suites/data/*.json)"
        ) from None
    return json.loads(text)
