"""The routes that change what a rollout server samples are locked by an admin key (wire/auth.py).

`harnessrl serve` answers POST /v1/load_lora_adapter and /v1/unload_lora_adapter only with
`Authorization: Bearer KEY`: 401 without a key, 403 with another, each refusal logged with the
route and the client, the served adapters unchanged; the sampling routes stay open; with no key
given it draws one, so the routes are never open. The trainer sends $HARNESSRL_ADMIN_KEY with
every request to its rollout servers (vLLM's API key included) and stops with one message naming
the variable when a server refuses it. An agent program that calls the adapter routes during a
GRPO run is refused, and the run is the run it would have been without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import ADMIN_KEY, grpo_trainer, keyed_server
from test_rollout_vllm import VLLMLike, write_adapter
from test_serve import _local_only, make_adapter  # noqa: F401 - _local_only: the autouse fixture, no proxy
from test_trainer import BASE, SPECS, TextScore, lines
from typer.testing import CliRunner

from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.models.embedded import tiny_random_model
from harnessrl.models.hf import HFPolicy
from harnessrl.serve import ServedModels, serving
from harnessrl.store import RunStore
from harnessrl.train.rollout_server import (
    ADAPTERS_DIR,
    PROBE_MESSAGES,
    RolloutServerError,
    RolloutServers,
    adapter_name,
    teacher_forced,
)
from harnessrl.train.trainer import TrainError
from harnessrl.wire.auth import ADMIN_KEY_ENV, presented_key

try:  # the HTTP client the openai package is built on (httpx2 from openai 3 on)
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai
    import httpx

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
SWAP = ROOT / "tests" / "fixtures" / "agents" / "swap_adapter.py"
WIRE = [{"role": "user", "content": "Name a prime."}]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return make_adapter(tmp_path_factory.mktemp("adapter") / "one", 1)


@pytest.fixture(scope="module")
def locked(tokenizer):
    """(base URL, ServedModels): a server whose adapter routes need ADMIN_KEY."""
    models = ServedModels(HFPolicy(tiny_random_model(), tokenizer, name="tiny-random"), max_loras=2)
    with serving(models, admin_key=ADMIN_KEY) as url:
        yield url, models
    models.close()
    models.base.policy.close()


def post(url: str, route: str, body: dict, authorization: str | None = None) -> httpx.Response:
    headers = {} if authorization is None else {"authorization": authorization}
    return httpx.post(url + route, json=body, headers=headers, timeout=120)


# ------------------------------------------------------------------------------- the server


def test_presented_key_reads_bearer_headers_only():
    assert presented_key("Bearer abc") == presented_key("bearer  abc ") == "abc"
    for header in (None, "", "Bearer", "Bearer  ", "Basic abc", "abc"):
        assert presented_key(header) is None


def test_the_adapter_routes_refuse_requests_without_the_key(locked, adapter, caplog):
    url, models = locked
    load = {"lora_name": "swap", "lora_path": str(adapter)}
    with caplog.at_level(logging.WARNING, logger="harnessrl.serve.app"):
        for route, body in (("/load_lora_adapter", load), ("/unload_lora_adapter", {"lora_name": "swap"})):
            for authorization, status in ((None, 401), ("Basic " + ADMIN_KEY, 401), ("Bearer guess", 403)):
                refused = post(url, route, body, authorization)
                assert refused.status_code == status, refused.text
                error = refused.json()["error"]  # OpenAI's shape, as every other error of the server
                assert error["code"] == status and error["type"] == "invalid_request_error"
                assert f"/v1{route}" in error["message"]
                if status == 401:
                    assert refused.headers["www-authenticate"] == "Bearer"
                    assert "Authorization: Bearer KEY" in error["message"] and ADMIN_KEY_ENV in error["message"]
    assert models.adapter_names() == []  # nothing was loaded
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused POST")]
    assert len(refusals) == 6
    assert all(" from 127.0.0.1:" in m for m in refusals)
    assert sum(m.endswith("no admin key") for m in refusals) == 4
    assert sum(m.endswith("wrong admin key") for m in refusals) == 2
    assert not any(ADMIN_KEY in m or "guess" in m for m in refusals)  # no key is ever logged


def test_with_the_key_they_load_and_unload_and_refused_calls_change_nothing(locked, adapter):
    url, models = locked
    key = f"Bearer {ADMIN_KEY}"
    assert post(url, "/load_lora_adapter", {"lora_name": "mine", "lora_path": str(adapter)}, key).status_code == 200
    assert models.adapter_names() == ["mine"]
    body = {"model": "mine", "messages": WIRE, "max_tokens": 4, "seed": 5, "logprobs": True}
    before = post(url, "/chat/completions", body).json()["choices"][0]  # sampling stays open
    # an attacker's in-place reload from another folder and an unload, without the key
    swap = {"lora_name": "mine", "lora_path": str(adapter.parent), "load_inplace": True}
    assert post(url, "/load_lora_adapter", swap).status_code == 401
    assert post(url, "/unload_lora_adapter", {"lora_name": "mine"}, "Bearer guess").status_code == 403
    assert models.adapter_names() == ["mine"]
    after = post(url, "/chat/completions", body).json()["choices"][0]
    assert after["message"] == before["message"] and after["logprobs"] == before["logprobs"]
    assert post(url, "/unload_lora_adapter", {"lora_name": "mine"}, key).status_code == 200
    assert models.adapter_names() == []


def test_the_sampling_routes_stay_open(locked):
    url, _ = locked
    assert httpx.get(url + "/models").status_code == 200
    assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200
    chat = {"model": "tiny-random", "messages": WIRE, "max_tokens": 2}
    assert post(url, "/chat/completions", chat).status_code == 200
    assert post(url, "/responses", {"model": "tiny-random", "input": "Hi", "max_output_tokens": 2}).status_code == 200
    assert post(url, "/messages", {**chat, "max_tokens": 2}).status_code == 200


def test_a_server_started_without_a_key_is_locked(tiny_policy, adapter):
    """serving() with no admin_key draws one nobody is told: the adapter routes refuse everyone
    (adapters are loaded with lora_modules or on the ServedModels instead)."""
    with serving(tiny_policy, lora_modules={"one": str(adapter)}) as url:
        assert post(url, "/unload_lora_adapter", {"lora_name": "one"}).status_code == 401
        assert post(url, "/unload_lora_adapter", {"lora_name": "one"}, "Bearer EMPTY").status_code == 403
        assert [m["id"] for m in httpx.get(url + "/models").json()["data"]] == ["tiny-random", "one"]


# ---------------------------------------------------------------------------------- the CLI


def serve_cli(monkeypatch, args: list[str], env_key: str | None) -> tuple[str, str]:
    """(the key `harnessrl serve ARGS` gives the server, what it printed), run_server replaced."""
    import harnessrl.serve as serve_module
    from harnessrl.cli import app

    seen = {}

    def capture(models, **kwargs):
        seen["key"] = kwargs["admin_key"]
        kwargs["announce"]("http://127.0.0.1:1/v1")

    monkeypatch.setattr(serve_module, "run_server", capture)
    if env_key is None:
        monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(ADMIN_KEY_ENV, env_key)
    result = CliRunner().invoke(app, ["serve", "--model", "tiny-random", *args])
    assert result.exit_code == 0, result.output
    return seen["key"], result.output


def test_the_cli_takes_the_key_from_the_option_then_the_variable_else_draws_one(monkeypatch):
    assert "--admin-key" in CliRunner().invoke(__import__("harnessrl.cli").cli.app, ["serve", "--help"]).output
    key, printed = serve_cli(monkeypatch, ["--admin-key", "from-option"], "from-env")
    assert key == "from-option" and "KEY being --admin-key" in printed and "from-option" not in printed
    key, printed = serve_cli(monkeypatch, [], "from-env")
    assert key == "from-env" and f"KEY being ${ADMIN_KEY_ENV}" in printed and "from-env" not in printed
    drawn, printed = serve_cli(monkeypatch, [], None)
    again, _ = serve_cli(monkeypatch, [], None)
    assert len(drawn) >= 40 and drawn != again
    assert "/v1/load_lora_adapter and /v1/unload_lora_adapter need 'Authorization: Bearer KEY'" in printed
    # a drawn key is never printed (the output may go to a log others read): the file holding it is named
    assert drawn not in printed
    assert "written to " in printed and f"export {ADMIN_KEY_ENV}=$(cat " in printed.replace("\n", "")


# ------------------------------------------------------------------------------- the trainer


def test_the_rollout_client_sends_the_key_to_a_vllm_with_an_api_key(tiny_policy, tmp_path):
    """vLLM started with the key as its API key refuses every /v1 request without it: the check,
    the loads and unloads, the probe and the rollouts all carry it; a missing or wrong key stops
    at the check with one message naming the variable, and is not retried."""
    server = VLLMLike(tiny_policy, api_key=ADMIN_KEY)
    try:
        servers = RolloutServers([server.url], run_id="k1", admin_key=ADMIN_KEY)
        servers.check()
        servers.publish(write_adapter, tmp_path, 0)
        servers.probe(teacher_forced(tiny_policy.model), temperature=0.7)
        request = GenerationRequest(messages=list(PROBE_MESSAGES), max_new_tokens=2, seed=1)
        servers.complete([request], SamplingParams(temperature=0.7))
        servers.publish(write_adapter, tmp_path, 1)  # unloads version 0
        sent = list(server.authorizations)
        for key, words in ((None, f"{ADMIN_KEY_ENV} is not set"), ("guess", f"the key in ${ADMIN_KEY_ENV} is not")):
            with pytest.raises(RolloutServerError, match="HTTP 401") as e:
                RolloutServers([server.url], admin_key=key).check()
            assert words in str(e.value) and "vLLM's --api-key" in str(e.value)
        assert len(server.authorizations) == len(sent) + 2  # one request each: no retry
    finally:
        server.close()
    routes = {path.rsplit("/", 1)[-1] for path, _ in sent}
    assert routes == {"models", "load_lora_adapter", "unload_lora_adapter", "completions"}
    assert {header for _, header in sent} == {f"Bearer {ADMIN_KEY}"}
    assert "admin" not in str(servers.describe()) and ADMIN_KEY not in str(servers.describe())


def test_a_trainer_without_the_key_stops_at_its_first_load_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    config = BASE.replace(eval_every=0)
    with serving("tiny-random", admin_key=ADMIN_KEY) as url:
        with pytest.raises(TrainError, match=f"{ADMIN_KEY_ENV} is not set") as e:
            grpo_trainer(
                config.replace(rollout_servers=[url]),
                tmp_path / "o",
                suite=TextScore(),
                specs=SPECS,
                progress=False,
            ).run()
        assert "HTTP 401" in str(e.value) and "/v1/load_lora_adapter" in str(e.value)
        assert [m["id"] for m in httpx.get(url + "/models").json()["data"]] == ["tiny-random"]
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


# ------------------------------------------------------------------ an agent during GRPO


def swap_agent(root: str | None):
    """The external harness running swap_adapter.py: it tries the adapter routes of the rollout
    server at `root` (None: it does not) before its model call."""
    from harnessrl.harness.spec import ExternalHarnessSpec, parse_spec

    data = {
        "name": "swap",
        "kind": "external",
        "command": ["{python}", str(SWAP)],
        "env": {"ROLLOUT_SERVER": root} if root else {},
        "limits": {"wall_s": 60, "max_model_calls": 2},
        # the server is on the host's loopback, which an agent's own network namespace (the
        # default under bubblewrap) does not reach: the key is what guards an agent given it
        "network": "host",
    }
    spec = parse_spec(data)
    assert isinstance(spec, ExternalHarnessSpec)
    return spec


def agent_run(out: Path, url: str, attack: bool) -> list[dict]:
    root = url.removesuffix("/v1")
    config = BASE.replace(steps=2, eval_every=0, scheduler="single:swap", rollout_servers=[url])
    specs = [swap_agent(root if attack else None)]  # network: host, consented to as a user would
    grpo_trainer(config, out, suite=TextScore(), specs=specs, progress=False, allow_host_network=True).run()
    return lines(out / "metrics.jsonl")


def test_an_agent_that_calls_the_adapter_routes_during_grpo_is_refused(tmp_path, caplog):
    """Every episode's agent lists the rollout server's adapters (the version its own calls are
    sampled from among them) and tries to unload each and to reload it in place from its own
    folder, without a key and with a guessed one: 401 and 403 each time, each refusal logged;
    the run samples, scores and trains exactly as the same run whose agents try nothing, and
    the server holds the trainer's last version alone at the end."""
    with keyed_server("tiny-random") as url:
        quiet = agent_run(tmp_path / "quiet", url, attack=False)
        with caplog.at_level(logging.WARNING, logger="harnessrl.serve.app"):
            attacked = agent_run(tmp_path / "attacked", url, attack=True)
        served = [m["id"] for m in httpx.get(url + "/models").json()["data"]]
    assert sum(r["optimizer_step"] for r in attacked) >= 1  # a second version was published
    with RunStore(tmp_path / "attacked" / "rollouts") as store:
        trajs = list(store.trajectories())
    attempts = []
    for t in trajs:
        assert not t.is_infra_error and t.meta["agent"]["exit_code"] == 0, t.meta["agent"]["stderr"][-2000:]
        attempts += [line.split() for line in t.meta["agent"]["stdout"].splitlines()]
    assert len(trajs) == 8 and attempts
    assert {a[0] for a in attempts} == {"load_lora_adapter", "unload_lora_adapter"}
    assert all(a[1].startswith("harnessrl-policy-") for a in attempts)
    assert {(key, status) for _, _, key, status in attempts} == {("none", "401"), ("guess", "403")}
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused POST")]
    assert len(refusals) == len(attempts)
    # the run is the run without the attempts: same rewards, losses and policy versions
    keys = ("harness", "reward_mean", "optimizer_step", "policy_version", "policy_lag_max")
    assert [{k: r.get(k) for k in keys} for r in attacked] == [{k: r.get(k) for k in keys} for r in quiet]
    for a, b in zip(attacked, quiet):
        assert (a["loss"] is None) == (b["loss"] is None)
        if a["loss"] is not None:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    # on the server: each run's last version (the last stays loaded), and nothing else
    assert served == ["tiny-random", *(last_version(tmp_path / run) for run in ("quiet", "attacked"))]


def last_version(out: Path) -> str:
    """The adapter name of the last version a run published (its one folder left)."""
    [folder] = (out / ADAPTERS_DIR).iterdir()
    version, run_id = folder.name.removeprefix("v").split("-", 1)
    return adapter_name(run_id, int(version))
