"""Limits that hold: what an agent program (or whoever reaches a server) can make us hold is bounded.

- under bubblewrap a sandboxed command's /tmp and /dev/shm are two sized tmpfs that together
  hold at most `disk_mb`, and /dev itself is read-only: 360 MB written to each place under
  `disk_mb: 8` leave at most 8 MB, while Python's multiprocessing (semaphores and shared memory
  in /dev/shm) and its devices still work;
- a request body past wire.http.MAX_BODY_BYTES is answered 413 before it is read, whether its
  Content-Length says so or it comes chunked, by the recording endpoint (recorded as a refused
  request of the episode, in the route's error shape) and by `harnessrl serve`;
- an episode's token counts (Anthropic's count_tokens, Gemini's countTokens) share one budget,
  COUNT_TOKENS_PER_MODEL_CALL per model call of limits.max_model_calls: past it each is refused
  with 429 and recorded, and model calls are still answered;
- the admin key `harnessrl serve` draws is in no output or log: it is in a file of mode 0600
  (in a folder of mode 0700) that the printed line names, removed when the server stops.
"""

from __future__ import annotations

import logging
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from typer.testing import CliRunner

from harnessrl.harness.external import ExternalEpisode
from harnessrl.harness.recording import COUNT_TOKENS_PER_MODEL_CALL
from harnessrl.harness.spec import parse_spec
from harnessrl.models import SamplingParams
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Job
from harnessrl.serve import serving
from harnessrl.tasks import get_suite
from harnessrl.tasks.sandbox_exec import ExecLimits, isolation_available, run_sandboxed, scratch_sizes
from harnessrl.wire.auth import ADMIN_KEY_ENV
from harnessrl.wire.http import MAX_BODY_BYTES

try:  # the HTTP client the openai package is built on (httpx2 from openai 3 on)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai
    import httpx

MB = 1024 * 1024
needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap is missing or does not work here")


@pytest.fixture(autouse=True)
def _local_only(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


# ------------------------------------------------------------------------ the sandbox's disk


@pytest.fixture
def workdir():
    # not pytest's tmp_path: that lives under a 0700 folder the unprivileged sandbox uid cannot reach
    path = Path(tempfile.mkdtemp(prefix="harnessrl-test-limits-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_tmp_and_dev_shm_together_hold_disk_mb():
    for disk_mb in (1, 5, 8, 64, 1024, 4096):
        tmp, shm = scratch_sizes(disk_mb)
        assert tmp + shm == disk_mb * MB and shm > 0 and tmp >= 3 * shm and shm % 4096 == 0
    assert scratch_sizes(4096)[1] == 64 * MB


@needs_bwrap
def test_writes_to_tmp_dev_shm_and_dev_stop_at_disk_mb(workdir):
    """360 MB to each writable place of the sandbox but its folders (45 files of 8 MB each, under
    file_size_mb): /tmp and /dev/shm fill up to 8 MB together, /dev takes nothing."""
    fill = "for i in $(seq 1 45); do head -c 8388608 /dev/zero > {}/f$i 2>/dev/null || echo full; done"
    command = "; ".join(
        [
            fill.format("/tmp"),
            fill.format("/dev/shm"),
            fill.format("/dev") + " | sort -u",
            "echo used $(df -k --output=used /tmp /dev/shm | awk 'NR > 1 {s += $1} END {print s}')",
            "echo dev $(ls /dev | grep -c '^f[0-9]')",
        ]
    )
    limits = ExecLimits(wall_s=60, disk_mb=8, file_size_mb=16)
    result = run_sandboxed(["bash", "-c", command], workdir=workdir, limits=limits)
    assert result.returncode == 0, result.stderr
    used_kb = int(re.search(r"^used (\d+)$", result.stdout, re.M).group(1))
    assert 6 * 1024 <= used_kb <= 8 * 1024, result.stdout  # filled, and no more than disk_mb
    assert "\ndev 0\n" in result.stdout + "\n", result.stdout  # not a file in /dev
    # each 8 MB file fails in /tmp (6 MB) and in /dev/shm (2 MB), and in /dev (read-only): one line of them
    assert result.stdout.count("full") == 45 + 45 + 1, result.stdout


@needs_bwrap
def test_multiprocessing_and_devices_still_work_in_the_sandbox(workdir):
    (workdir / "mp.py").write_text(
        "import multiprocessing as mp\n"
        "from multiprocessing import shared_memory\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(2) as pool:\n"
        "        print(pool.map(abs, [-1, -2, -3]))\n"
        "    block = shared_memory.SharedMemory(create=True, size=65536)\n"
        "    block.close(); block.unlink()\n"
        "    open('/dev/null', 'w').write('x')\n"
        "    print('ok')\n"
    )
    limits = ExecLimits(wall_s=60, disk_mb=8)
    result = run_sandboxed(["python3", "mp.py"], workdir=workdir, limits=limits)
    assert result.returncode == 0 and result.stdout == "[1, 2, 3]\nok\n", result.stderr


# ------------------------------------------------------------------ episodes on the endpoint


def agent_spec(max_model_calls: int):
    data = {
        "name": "limits-agent",
        "kind": "external",
        "command": ["true"],
        "limits": {"wall_s": 60, "max_model_calls": max_model_calls},
        "tool_protocol": "hermes",
    }
    return parse_spec(data)


def episode_for(endpoint, policy, max_model_calls: int = 4) -> ExternalEpisode:
    task = get_suite("workspace").tasks("dev", 1)[0]
    episode = ExternalEpisode(Job(task, agent_spec(max_model_calls), 0), policy, SamplingParams(), lambda *a: None)
    endpoint.register(episode)
    return episode


def oversize_bodies() -> Iterator[tuple[str, bytes | Iterator[bytes]]]:
    """(how it is sent, the body): a JSON body one byte past the cap with its Content-Length,
    and 50 MB of one sent chunked (no Content-Length)."""
    pad = MAX_BODY_BYTES - len(b'{"model":"m","messages":[{"role":"user","content":""}]}') + 1
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * pad + b'"}]}'
    assert len(body) == MAX_BODY_BYTES + 1
    yield "content-length", body

    def chunks() -> Iterator[bytes]:
        yield b'{"model":"m","messages":[{"role":"user","content":"'
        for _ in range(50 * 16):
            yield b"x" * 65536

    yield "chunked", chunks()


def post(url: str, content) -> httpx.Response:
    return httpx.post(url, content=content, headers={"content-type": "application/json"}, timeout=60)


def test_an_oversize_body_is_a_413_recorded_in_the_episode(endpoint, tokenizer):
    episode = episode_for(endpoint, ScriptedPolicy(["fine"], tokenizer=tokenizer, name="replies"))
    base = endpoint.url(episode)
    for route, shape in (("/chat/completions", "openai"), ("/messages", "anthropic")):
        for how, content in oversize_bodies():
            answer = post(base + route, content)
            assert answer.status_code == 413, (route, how, answer.text)
            error = answer.json()["error"]
            assert "MAX_BODY_BYTES" in error["message"] and str(MAX_BODY_BYTES) in error["message"]
            if shape == "anthropic":
                assert answer.json()["type"] == "error" and error["type"] == "request_too_large"
            if how == "content-length":
                assert f"is {MAX_BODY_BYTES + 1} bytes" in error["message"]
    refused = episode.refusals
    assert [(r.route, r.status) for r in refused] == [("/v1/chat/completions", 413)] * 2 + [("/v1/messages", 413)] * 2
    assert not episode.steps()
    # a body within the cap is served as before
    answer = httpx.post(
        base + "/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "fine"


def test_harnessrl_serve_refuses_an_oversize_body_with_a_413(tiny_policy):
    with serving(tiny_policy) as url:
        for how, content in oversize_bodies():
            answer = post(url + "/chat/completions", content)
            assert answer.status_code == 413, (how, answer.text)
            assert "MAX_BODY_BYTES" in answer.json()["error"]["message"]
        assert httpx.get(url + "/models").status_code == 200  # the server goes on


def test_token_counts_share_a_budget_derived_from_max_model_calls(endpoint, tiny_policy):
    episode = episode_for(endpoint, tiny_policy, max_model_calls=2)
    cap = COUNT_TOKENS_PER_MODEL_CALL * 2
    base = endpoint.url(episode)
    client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="EMPTY", max_retries=0)
    gemini_count = base.removesuffix("/v1") + "/v1beta/models/m:countTokens"
    contents = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    for k in range(cap):  # Anthropic's and Gemini's routes draw on the same budget
        if k % 2:
            assert httpx.post(gemini_count, json=contents).json()["totalTokens"] > 0
        else:
            assert client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}]).input_tokens
    with pytest.raises(anthropic.RateLimitError, match=f"more than {cap} token counts") as raised:
        client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raised.value.response.headers["x-should-retry"] == "false"
    refused = httpx.post(gemini_count, json=contents)
    assert refused.status_code == 429 and refused.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert [(r.route, r.status) for r in episode.refusals] == [
        ("/v1/messages/count_tokens", 429),
        ("/v1beta/models/m:countTokens", 429),
    ]
    # model calls are still answered, and counting was none of them
    reply = client.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "go"}])
    assert reply.usage.output_tokens > 0 and len(episode.steps()) == 1


# -------------------------------------------------------------------------- the admin key


def test_a_drawn_admin_key_is_in_no_output_only_in_a_private_file(monkeypatch, caplog):
    import harnessrl.serve as serve_module
    from harnessrl.cli import app

    temp = Path(tempfile.gettempdir())
    before = set(temp.glob("harnessrl-serve-*"))
    seen: dict = {}

    def run_server(models, **kwargs):
        kwargs["announce"]("http://127.0.0.1:1/v1")
        seen["key"] = kwargs["admin_key"]
        [folder] = set(temp.glob("harnessrl-serve-*")) - before
        path = seen["file"] = folder / "admin-key"
        seen["modes"] = stat.S_IMODE(path.stat().st_mode), stat.S_IMODE(folder.stat().st_mode)
        seen["text"] = path.read_text()

    monkeypatch.setattr(serve_module, "run_server", run_server)
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    with caplog.at_level(logging.DEBUG):
        result = CliRunner().invoke(app, ["serve", "--model", "tiny-random"])
    assert result.exit_code == 0, result.output
    key, path = seen["key"], seen["file"]
    assert len(key) >= 40 and seen["text"].strip() == key
    assert key not in result.output and key not in caplog.text  # neither printed nor logged
    assert seen["modes"] == (0o600, 0o700)
    printed = result.output.replace("\n", "")
    assert f"written to {path}" in printed and f"export {ADMIN_KEY_ENV}=$(cat {path})" in printed
    assert not path.exists() and not path.parent.exists()  # removed when the server stopped
