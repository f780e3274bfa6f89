"""TRL's vLLM generation (use_vllm=True): the refusal of harnessrl's integration, and the tools that
try TRL's own vLLM path on a machine (examples/trl/vllm_generation.py and the TRL + vLLM parts of
bench/gpu_check.py). Neither vLLM mode of TRL 1.16 trains on vLLM's CPU build (docs/trl.md, "vLLM
generation"), so what runs here is everything up to TRL and vLLM themselves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "trl"))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402
import vllm_generation  # noqa: E402


def test_the_refusal_says_why_and_what_to_use_instead():
    from harnessrl.integrations.trl.setup import USE_VLLM, TRLSetupError, check_args

    assert "push the weights into it before every batch" in USE_VLLM
    assert "--rollout-server" in USE_VLLM and "docs/trl.md, 'vLLM generation'" in USE_VLLM
    args = type("Args", (), {"use_vllm": True})()
    with pytest.raises(TRLSetupError, match="use_vllm=True is not served"):
        check_args(args)


def test_the_started_server_gets_trls_own_flags_as_vllms_api_server():
    pytest.importorskip("trl")
    cmd = vllm_generation.server_command("/models/m", 8123, 0.4, 1024, "float32")
    assert cmd[0] == sys.executable
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
    flags = cmd[5:]
    pairs = dict(zip(flags, flags[1:]))
    assert json.loads(pairs["--weight-transfer-config"]) == {"backend": "nccl"}
    assert pairs["--logprobs-mode"] == "processed_logprobs"
    assert (pairs["--port"], pairs["--max-model-len"], pairs["--dtype"]) == ("8123", "1024", "float32")
    assert pairs["--gpu-memory-utilization"] == "0.4"
    assert "/models/m" not in flags and "serve" not in cmd


def test_a_failure_is_attributed_to_the_library_lines_that_raised_it():
    """Frames inside an installed trl or vllm package count, outermost first; a file under a
    folder that only happens to be named trl (this repository's examples/trl) does not."""
    site = "/env/lib/python3.11/site-packages"
    namespace: dict = {}
    exec(compile("def inner():\n    x = 1\n    raise AttributeError('no weight_loader')\n",
                 f"{site}/vllm/model_executor/layers/linear.py", "exec"), namespace)  # fmt: skip
    exec(compile("def middle():\n    inner()\n", f"{site}/trl/generation/vllm_generation.py", "exec"), namespace)
    exec(compile("def outer():\n    middle()\n", str(ROOT / "examples" / "trl" / "x.py"), "exec"), namespace)
    with pytest.raises(AttributeError) as info:
        namespace["outer"]()
    frames = vllm_generation.library_frames(info.value)
    assert frames == ["trl/generation/vllm_generation.py:2", "vllm/model_executor/layers/linear.py:3"]


def test_the_gpu_check_skips_the_trl_vllm_parts_with_the_reason(tmp_path, monkeypatch):
    args = gpu_check.parse_args(["run", "--device", "cpu"])
    assert args.part_list == list(gpu_check.DEFAULT_PARTS)
    assert not set(gpu_check.TRL_VLLM_MODES) & set(args.part_list)
    reason = gpu_check.trl_vllm_skip(args, "colocate")
    assert reason is not None and "needs a CUDA device" in reason and "docs/trl.md" in reason

    # asked to try on the CPU, where vLLM is not importable: the part is skipped naming it
    monkeypatch.setattr(gpu_check, "package_versions", lambda: {"trl": "1.16.0", "vllm": "missing", "datasets": "5"})
    result = tmp_path / "part.json"
    part_args = gpu_check.parse_args(
        ["part", "trl_vllm_server", "--device", "cpu", "--trl-vllm-on-cpu", "--result-file", str(result)]
    )
    assert gpu_check.part(part_args) == 0
    recorded = json.loads(result.read_text())
    assert recorded["mode"] == "server"
    assert recorded["skipped"].startswith("vllm not importable") and "error" not in recorded


def test_the_on_cpu_flag_reaches_the_parts_process():
    args = gpu_check.parse_args(["run", "--device", "cpu", "--trl-vllm-on-cpu"])
    options = gpu_check.child_options(args)
    assert "--trl-vllm-on-cpu" in options
    child = gpu_check.parse_args(["part", "trl_vllm_colocate", *options])
    assert child.trl_vllm_on_cpu and child.trl_vllm_steps == args.trl_vllm_steps == 1
    assert "--trl-vllm-on-cpu" not in gpu_check.child_options(gpu_check.parse_args(["run", "--device", "cpu"]))
