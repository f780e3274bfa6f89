"""mypy over src/, with pyproject.toml's [tool.mypy] settings, as `make check` and `make typecheck`
run it. It is a test so that `make test` runs it on one worker beside the rest of the suite (about a
minute of one core from a clean clone, with no cache) rather than before all of it; its cache is the
repository's .mypy_cache, as the command line's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mypy_finds_no_type_error_in_src():
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "src"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert done.returncode == 0, f"mypy src exited {done.returncode}:\n{done.stdout[-20000:]}"
    assert "Success: no issues found" in done.stdout, done.stdout[-5000:]
