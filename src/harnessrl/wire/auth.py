"""The admin key of a rollout server: what locks the routes that change what a server samples
(`POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`), so that an agent program that can
reach the server cannot swap or unload the adapter every other episode samples from.

It travels as vLLM's `--api-key` does, `Authorization: Bearer KEY`, and is compared in constant
time. `harnessrl serve` takes it from `--admin-key` or $HARNESSRL_ADMIN_KEY and draws one when
neither is given (serve/app.py); the GRPO trainer sends $HARNESSRL_ADMIN_KEY to its rollout
servers (train/rollout_server.py), vLLM's included, where it is vLLM's API key.

A key is never printed or logged: a server's output often goes to a log file other users may
read. A key `harnessrl serve` draws is written to a file only its user may read
(`write_key_file`: mode 0600 in a folder of mode 0700), and what it prints names that file.
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import tempfile
from pathlib import Path

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


KEY_FILE_NAME = "admin-key"


def write_key_file(key: str) -> Path:
    """Write `key` to a new file that only this user may read (mode 0600, in a fresh folder of
    mode 0700 under the temporary folder), and return its path; `remove_key_file` removes both."""
    folder = Path(tempfile.mkdtemp(prefix="harnessrl-serve-"))  # mode 0700, a name nobody could take first
    path = folder / KEY_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, (key + "\n").encode("utf-8"))
    finally:
        os.close(fd)
    return path


def remove_key_file(path: Path) -> None:
    """Remove a file `write_key_file` wrote, with its folder."""
    shutil.rmtree(path.parent, ignore_errors=True)
