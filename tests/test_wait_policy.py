"""The command line sets OpenMP's wait policy to PASSIVE before torch loads, unless the user set one."""

from __future__ import annotations

import os
import subprocess
import sys

# Fails the import of harnessrl.cli if torch loads before the policy is set.
PROBE = """
import os, sys

class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            print("torch loads with OMP_WAIT_POLICY=" + str(os.environ.get("OMP_WAIT_POLICY")), flush=True)
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, Probe())
import harnessrl.cli
import torch  # loaded by now through the commands' modules, or here
print("after: " + os.environ["OMP_WAIT_POLICY"])
"""


def _run(env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()


def test_the_command_line_makes_openmp_threads_sleep_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _run(env) == ["torch loads with OMP_WAIT_POLICY=PASSIVE", "after: PASSIVE"]


def test_a_wait_policy_the_user_set_is_kept():
    env = {**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}
    assert _run(env) == ["torch loads with OMP_WAIT_POLICY=ACTIVE", "after: ACTIVE"]
