"""What `pip install harnessrl` does to a user's environment: torch is a range the package works
with, never an exact pin (a GPU machine keeps its own CUDA build; vLLM lives in its own
environment with its own torch), while this repository's Makefile installs the CPU wheel first."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r for r in reqs}


def test_torch_is_a_range_that_takes_the_gpu_machines_and_vllms_torch():
    torch = _requirements()["torch"]
    assert not any(s.operator in ("==", "===") for s in torch.specifier), str(torch)
    # the CPU wheel of this repository, a GPU image's build (2.11 + CUDA) and vLLM 0.33's pin
    for version in ("2.13.0", "2.11.0", "2.14.0"):
        assert torch.specifier.contains(Version(version)), (version, str(torch))


def test_the_makefile_installs_the_cpu_wheel_before_the_package():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    pin = makefile.index("pip install --quiet torch==2.13.0")
    assert pin < makefile.index('pip install --quiet -e ".[test]"')


def test_no_dependency_is_pinned_exactly():
    pinned = [str(r) for r in _requirements().values() if re.search(r"===?", str(r.specifier))]
    assert pinned == []


def test_the_package_ships_its_type_marker():
    """pyproject.toml lists py.typed in the package data: the file must exist (PEP 561), else type
    checkers of the users' code ignore harnessrl's annotations."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["harnessrl"]
    assert (ROOT / "src" / "harnessrl" / "py.typed").is_file()
