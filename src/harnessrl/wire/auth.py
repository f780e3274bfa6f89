"""The admin key of a rollout server: what locks the routes that change what a server samples
(`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`), so that an agent program that can
reach the server cannot swap or unload the adapter every other episode samples from.

It travels as vLLM's `--api-key` does, `Authorization: Bearer KEY`, and is compared in constant
time. `harnessrl serve` takes it from `--admin-key` or $HARNESSRL_ADMIN_KEY and draws one when
neither is given (serve/app.py); the GRPO trainer sends $HARNESSRL_ADMIN_KEY to its rollout
servers (train/rollout_server.py), vLLM's included, where it is vLLM's API key.
"""

from __future__ import annotations

import hmac
import os
import secrets

ADMIN_KEY_ENV = "HARNESSRL_ADMIN_KEY"


def env_admin_key() -> str | None:
    """$HARNESSRL_ADMIN_KEY, or None where it is unset or empty."""
    return os.environ.get(ADMIN_KEY_ENV) or None


def draw_admin_key() -> str:
    """A fresh key (43 URL-safe characters, 256 random bits)."""
    return secrets.token_urlsafe(32)


def bearer_headers(key: str | None) -> dict[str, str]:
    """The header that carries `key` (none without a key)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def presented_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header value; None when there is no such header
    or it is of another scheme."""
    scheme, _, value = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def key_matches(presented: str, key: str) -> bool:
    """Whether `presented` is `key`, in time that does not depend on where they differ."""
    return hmac.compare_digest(presented.encode("utf-8"), key.encode("utf-8"))
