"""Built-in harnesses and name-or-path resolution for `--harness`."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from harnessrl.harness.spec import AnyHarnessSpec, SpecError, load_spec, parse_spec


def builtin_names() -> list[str]:
    folder = resources.files("harnessrl.harness") / "builtin"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def builtin_text(name: str) -> str:
    if name not in builtin_names():
        raise SpecError(f"unknown harness '{name}' (built-in: {', '.join(builtin_names())}; or give a .yaml path)")
    return (resources.files("harnessrl.harness") / "builtin" / f"{name}.yaml").read_text(encoding="utf-8")


def load_harness(name_or_path: str) -> AnyHarnessSpec:
    """A built-in harness by name, or a spec file by path."""
    if name_or_path in builtin_names():
        return parse_spec(yaml.safe_load(builtin_text(name_or_path)), f"builtin:{name_or_path}")
    if name_or_path.endswith((".yaml", ".yml")) or Path(name_or_path).exists():
        return load_spec(name_or_path)
    raise SpecError(
        f"unknown harness '{name_or_path}' (built-in: {', '.join(builtin_names())}, 'all', or a .yaml path)"
    )


def resolve_harnesses(args: list[str]) -> list[AnyHarnessSpec]:
    """Expand `--harness` values: names, 'all', paths, comma-separated lists. Names must be unique."""
    names: list[str] = []
    for a in args:
        names.extend(x.strip() for x in a.split(",") if x.strip())
    if not names:
        raise SpecError("no harness given")
    specs: list[AnyHarnessSpec] = []
    for n in names:
        if n == "all":
            specs.extend(load_harness(b) for b in builtin_names())
        else:
            specs.append(load_harness(n))
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise SpecError(f"harness name '{s.name}' is given twice; names must be unique within a run")
        seen.add(s.name)
    return specs
