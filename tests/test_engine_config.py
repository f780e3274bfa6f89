"""EngineConfig: the engine's switches, their environment overrides (read in from_env only), and
the share of the machine the multi-process launcher hands each process through it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harnessrl.models.engine_config import ENV_OVERRIDES, PREFILL_CHUNK_TOKENS, EngineConfig


def test_the_defaults_leave_every_machine_dependent_choice_to_the_engine():
    config = EngineConfig.from_env({})
    assert config == EngineConfig()
    assert config.to_dict() == {
        "shared_prefix_attention": None,
        "overlap_prefill": None,
        "packed_decode": None,
        "packed_any_size": False,
        "fast_decode": None,
        "merge_lora": True,
        "prefill_chunk_tokens": 0,
        "threads": None,
    }


def test_each_variable_overrides_its_field():
    env = {
        "HARNESSRL_PREFILL_THREAD": "1",
        "HARNESSRL_PACKED_DECODE": "0",
        "HARNESSRL_FAST_DECODE": "0",
        "HARNESSRL_MERGE_LORA": "0",
        "HARNESSRL_PREFILL_CHUNK": "64",
        "HARNESSRL_THREADS": "3",
    }
    config = EngineConfig.from_env(env)
    assert config == EngineConfig(
        overlap_prefill=True,
        packed_decode=False,
        fast_decode=False,
        merge_lora=False,
        prefill_chunk_tokens=64,
        threads=3,
    )
    assert set(ENV_OVERRIDES.values()) == set(env)
    # 1 for packed weights: on wherever the model can be packed, whatever its size; 1 for the fast
    # decode forward: where it applies, as when unset
    on = EngineConfig.from_env({"HARNESSRL_PACKED_DECODE": "1", "HARNESSRL_FAST_DECODE": "1"})
    assert on == EngineConfig(packed_any_size=True)
    assert EngineConfig.from_env({"HARNESSRL_PREFILL_CHUNK": "on"}).prefill_chunk_tokens == PREFILL_CHUNK_TOKENS
    assert EngineConfig.from_env({"HARNESSRL_PREFILL_THREAD": " "}) == EngineConfig()  # blank: unset


def test_arguments_win_over_the_environment():
    config = EngineConfig.from_env({"HARNESSRL_PREFILL_CHUNK": "64"}, prefill_chunk_tokens=0, threads=1)
    assert config.prefill_chunk_tokens == 0 and config.threads == 1
    # a field given as an argument is not read from the environment, even a malformed value
    assert EngineConfig.from_env({"HARNESSRL_PREFILL_THREAD": "yes"}, overlap_prefill=False).overlap_prefill is False
    with pytest.raises(TypeError):
        EngineConfig().with_(no_such_switch=True)
    with pytest.raises(TypeError):
        EngineConfig.from_env({}, no_such_switch=True)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HARNESSRL_PREFILL_THREAD", "yes"),
        ("HARNESSRL_PACKED_DECODE", "on"),
        ("HARNESSRL_FAST_DECODE", "2"),
        ("HARNESSRL_PREFILL_CHUNK", "-3"),
        ("HARNESSRL_PREFILL_CHUNK", "many"),
        ("HARNESSRL_THREADS", "all"),
    ],
)
def test_a_malformed_variable_is_an_error_naming_it(name, value):
    with pytest.raises(ValueError, match=name):
        EngineConfig.from_env({name: value})


def test_a_negative_chunk_is_refused():
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        EngineConfig(prefill_chunk_tokens=-1)


def test_several_processes_on_one_machine_share_its_cpus_where_the_config_leaves_it_open():
    from harnessrl.train.distributed import Distributed

    alone = Distributed()
    assert alone.engine_config(EngineConfig()) == EngineConfig()
    four = Distributed(rank=0, world_size=2, cpus_per_process=4)
    assert four.engine_config(EngineConfig()) == EngineConfig(threads=3, overlap_prefill=True)
    one = Distributed(rank=1, world_size=2, cpus_per_process=1)
    assert one.engine_config(EngineConfig()) == EngineConfig(threads=1, overlap_prefill=False)
    # what the environment (or the caller) set stays
    asked = EngineConfig(threads=2, overlap_prefill=False)
    assert four.engine_config(asked) == asked


def test_the_config_module_needs_no_torch():
    code = "import sys; import harnessrl.models.engine_config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
