"""Rollout servers that sample what the trainer learns from, on the points where vLLM 0.33 differs
from a naive server: each policy version under a name and a path never loaded before (vLLM keys
prefix-cache blocks by both), every sampling field sent (vLLM fills unsent ones from the model's
generation_config.json), and a start-up probe that refuses raw logprobs, truncating or
penalising defaults and refused native tools, naming the server flag to add.

`harnessrl serve` stands in for vLLM here; where it does not behave as vLLM, the test says so:
- serve drops an adapter's cached prefixes on every reload, where vLLM keeps the blocks of a
  same-path reload (the GRPO test checks the client never reloads a path, which is what keeps
  vLLM honest, rather than observing stale KV);
- serve's engine has no top_k or penalties, so the probe's truncation and penalty cases use
  `VLLMLike`, a small test server that samples the tiny model as vLLM's sampler does.

"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from helpers import ADMIN_KEY, grpo_trainer

from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.train.rollout_server import (
    ADAPTERS_DIR,
    PROBE_MAX_TOKENS,
    PROBE_MESSAGES,
    RolloutServerError,
    RolloutServers,
    adapter_name,
    diagnose,
    teacher_forced,
)
from harnessrl.types import Message
from harnessrl.wire.auth import ADMIN_KEY_ENV

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NEUTRAL = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


# ------------------------------------------------------------------------------- a vLLM-like server


@dataclasses.dataclass
class VLLMLike:
    """Samples the tiny model token by token as vLLM's sampler does: penalties on the raw
    logits, then temperature, then top_k; the defaults (`top_k`, `repetition_penalty`) apply to
    fields a request does not send (vLLM's --generation-config auto); logprobs are raw
    (log softmax of the unprocessed logits) or processed (of what was sampled from). Tool
    requests are refused as by vLLM without --enable-auto-tool-choice unless `tools`. With an
    `api_key` (vLLM's --api-key) every request without `Authorization: Bearer KEY` gets vLLM's
    401; `authorizations` keeps each request's header."""

    policy: object
    logprobs_mode: str = "processed_logprobs"
    top_k: int = 0
    repetition_penalty: float = 1.0
    tools: bool = False
    hold: threading.Event | None = None  # completion requests wait for it (requests in flight)
    api_key: str | None = None

    def __post_init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.authorizations: list[tuple[str, str | None]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self):
        self._server.shutdown()
        self._server.server_close()

    def complete(self, body: dict) -> dict:
        messages = [Message(role=m["role"], content=m["content"]) for m in body["messages"]]
        prompt = self.policy.prompt_ids(GenerationRequest(messages=messages))
        T = body.get("temperature", 1.0)
        top_k = body["top_k"] if body.get("top_k") is not None else self.top_k
        penalty = body["repetition_penalty"] if body.get("repetition_penalty") is not None else self.repetition_penalty
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        ids, out, logprobs = list(prompt), [], []
        model = self.policy.model
        for _ in range(body.get("max_tokens", 16)):
            with torch.no_grad():
                z = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            raw = torch.log_softmax(z, -1)
            x = z.clone()
            if penalty != 1.0:  # vLLM's repetition penalty: over the prompt's and the output's tokens
                seen = torch.tensor(sorted(set(ids)))
                x[seen] = torch.where(x[seen] > 0, x[seen] / penalty, x[seen] * penalty)
            x = x / T if T > 0 else x  # greedy: no temperature (vLLM's processed logprobs then)
            if top_k > 0:
                kth = torch.topk(x, top_k).values[-1]
                x = torch.where(x < kth, torch.full_like(x, -float("inf")), x)
            processed = torch.log_softmax(x, -1)
            if T > 0:
                token = int(torch.multinomial(processed.exp(), 1, generator=generator))
            else:
                token = int(processed.argmax())
            chosen = raw if self.logprobs_mode == "raw_logprobs" else processed
            logprobs.append(float(chosen[token]))
            out.append(token)
            ids.append(token)
        content = [{"token": f"token_id:{t}", "logprob": lp, "top_logprobs": []} for t, lp in zip(out, logprobs)]
        return {
            "id": "x",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x"},
                    "logprobs": {"content": content},
                    "finish_reason": "length",
                    "token_ids": out,
                }
            ],
            "prompt_token_ids": prompt,
        }

    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body):
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def refused(self) -> bool:
                """vLLM's --api-key: 401 for a request without the key."""
                outer.authorizations.append((self.path, self.headers.get("authorization")))
                if outer.api_key is None or self.headers.get("authorization") == f"Bearer {outer.api_key}":
                    return False
                self._send(401, {"error": "Unauthorized"})
                return True

            def do_GET(self):
                if not self.refused():
                    self._send(200, {"object": "list", "data": [{"id": "tiny-random", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if self.refused():
                    return
                outer.requests.append((self.path, body))
                if self.path.endswith(("load_lora_adapter", "unload_lora_adapter")):
                    return self._send(200, "Success")
                if body.get("tools") and not outer.tools:
                    message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
                    return self._send(400, {"error": {"message": message, "code": 400}})
                if outer.hold is not None:
                    outer.hold.wait(30)
                self._send(200, outer.complete(body))

        return Handler


def write_adapter(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")


@pytest.fixture
def tiny(tiny_policy):
    return tiny_policy


@pytest.fixture(scope="module")
def repeating(tokenizer):
    """The tiny model made fond of two tokens of the probe's prompt ("," and " one"), so that
    its completions repeat them, as a real model counting to twenty does: a repetition penalty
    then changes what it samples (on the plain random model it has no visible effect)."""
    from harnessrl.models.embedded import tiny_random_model
    from harnessrl.models.hf import HFPolicy

    model = tiny_random_model()
    favourite = (
        tokenizer(",", add_special_tokens=False).input_ids + tokenizer(" one", add_special_tokens=False).input_ids
    )
    with torch.no_grad():
        for token in favourite:
            model.get_output_embeddings().weight[token] *= 4
    policy = HFPolicy(model, tokenizer, name="tiny-repeating")
    yield policy
    policy.close()


def published(url: str, tmp_path: Path, run_id: str = "t1") -> RolloutServers:
    servers = RolloutServers([url], run_id=run_id)
    servers.publish(write_adapter, tmp_path, 0)
    return servers


# ------------------------------------------------------------------------------------------- probe


def test_a_faithful_server_passes_the_probe_and_reports_the_diff(tiny, tmp_path):
    server = VLLMLike(tiny, logprobs_mode="processed_logprobs")
    try:
        servers = published(server.url, tmp_path)
        report = servers.probe(teacher_forced(tiny.model), temperature=0.7)
    finally:
        server.close()
    assert report.max_abs_diff < 1e-3 and report.temperature == 0.7
    assert [c.request for c in report.servers[0].checks] == ["explicit", "defaults"]
    assert all(c.verdict == "ok" and c.tokens > 0 for c in report.servers[0].checks)
    assert report.as_dict()["max_abs_diff"] == report.max_abs_diff
    chats = [b for path, b in server.requests if path.endswith("chat/completions")]
    assert chats[0]["model"] == chats[1]["model"] == adapter_name("t1", 0)
    assert {k: chats[0].get(k) for k in NEUTRAL} == NEUTRAL and chats[0]["temperature"] == 0.7
    assert not set(NEUTRAL) & set(chats[1])  # the defaults request: only OpenAI's fields


def test_defaults_that_the_rollouts_override_are_still_refused(tiny, tmp_path):
    # the rollouts send top_k and the penalty, so they would sample right; the server's other
    # clients and any field this client does not know would not: the recipe wants neutral defaults
    server = VLLMLike(tiny, top_k=20, repetition_penalty=1.3)
    try:
        servers = published(server.url, tmp_path)
        with pytest.raises(RolloutServerError, match="--generation-config vllm") as refused:
            servers.probe(teacher_forced(tiny.model), temperature=0.7)
    finally:
        server.close()
    assert "With only OpenAI's fields sent" in str(refused.value)


@pytest.mark.parametrize(
    ("options", "flag", "evidence"),
    [
        ({"logprobs_mode": "raw_logprobs"}, "--logprobs-mode processed_logprobs", "untempered"),
        ({"top_k": 20}, "--generation-config vllm", "cut and renormalised"),
        ({"repetition_penalty": 1.3}, "--generation-config vllm", "penalised away from tokens already seen"),
    ],
)
def test_a_server_that_does_not_sample_the_trainers_distribution_is_refused(
    repeating, tmp_path, options, flag, evidence
):
    server = VLLMLike(repeating, **options)
    try:
        servers = published(server.url, tmp_path)
        with pytest.raises(RolloutServerError, match=evidence) as refused:
            servers.probe(teacher_forced(repeating.model), temperature=0.7)
    finally:
        server.close()
    assert flag in str(refused.value)
    assert f"rollout server {server.url}" in str(refused.value)


def test_a_server_that_refuses_native_tools_is_refused_when_a_harness_needs_them(tiny, tmp_path):
    server = VLLMLike(tiny)
    try:
        servers = published(server.url, tmp_path)
        servers.probe(teacher_forced(tiny.model), temperature=0.7)  # no harness with native tools: not asked
        assert not any(b.get("tools") for _, b in server.requests)
        with pytest.raises(RolloutServerError, match="--enable-auto-tool-choice --tool-call-parser"):
            servers.probe(teacher_forced(tiny.model), temperature=0.7, native_tools=True)
        server.tools = True
        report = servers.probe(teacher_forced(tiny.model), temperature=0.7, native_tools=True)
    finally:
        server.close()
    assert report.servers[0].native_tools is True


def test_harnessrl_serve_passes_the_probe_but_refuses_native_tools(tiny, tmp_path):
    from harnessrl.serve import serving

    trained = tiny_peft(tiny)
    with serving(tiny, served_model_name="tiny-random", admin_key=ADMIN_KEY) as url:
        servers = RolloutServers([url], run_id="s1", admin_key=ADMIN_KEY)
        servers.publish(lambda folder: trained.save_pretrained(str(folder)), tmp_path, 0)
        report = servers.probe(teacher_forced(trained), temperature=0.7)  # the adapter is applied
        assert report.max_abs_diff < 1e-3
        # serve has no native tool calling (vLLM has it with --enable-auto-tool-choice)
        with pytest.raises(RolloutServerError, match="--enable-auto-tool-choice"):
            servers.probe(teacher_forced(trained), temperature=0.7, native_tools=True)


def test_diagnose_tells_the_patterns_apart():
    at_1 = [-1.0, -2.0, -3.0, -0.5]
    at_t = [x / 0.5 for x in at_1]  # not a real softmax, only the arithmetic matters here
    assert diagnose(at_t, at_t, at_1, [1, 2], [3, 4, 5, 6], 0.5)[0] == "ok"
    assert diagnose(at_1, at_t, at_1, [1, 2], [3, 4, 5, 6], 0.5)[0] == "raw_logprobs"
    assert diagnose([x + 0.4 for x in at_t], at_t, at_1, [1, 2], [3, 4, 5, 6], 0.5)[0] == "truncated"
    lower_on_repeats = [at_t[0] + 0.1, at_t[1] - 0.5, at_t[2] + 0.1, at_t[3] - 0.5]
    assert diagnose(lower_on_repeats, at_t, at_1, [1, 4], [3, 4, 5, 3], 0.5)[0] == "penalised"
    assert diagnose([x - 0.5 for x in at_t], at_t, at_1, [1, 2], [3, 4, 5, 6], 0.5)[0] == "mismatch"
    # at T = 1 raw and processed are one thing: no raw verdict
    assert diagnose(at_1, at_1, at_1, [1], [2, 3, 4, 5], 1.0)[0] == "ok"


# -------------------------------------------------------------------------------- names and paths


def tiny_peft(policy, seed: int = 0, r: int = 4):
    """A peft model over a copy of the tiny model (LoRA rank r), with nonzero B: it changes the outputs."""
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        copy.deepcopy(policy.model), LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"])
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.eval()


def test_each_version_gets_a_new_name_and_path_and_old_ones_go_once_idle(tiny, tmp_path):
    hold = threading.Event()
    server = VLLMLike(tiny, hold=hold)
    try:
        servers = RolloutServers([server.url], run_id="r9")
        servers.publish(write_adapter, tmp_path, 0)
        request = GenerationRequest(messages=[Message(role="user", content="hi")], max_new_tokens=2, seed=1)
        in_flight = servers.submit(request, SamplingParams(temperature=1.0))
        time.sleep(0.2)  # the request is on the wire, under version 0
        servers.publish(write_adapter, tmp_path, 1)
        v0, v1 = servers.folder_of(tmp_path, 0), servers.folder_of(tmp_path, 1)
        assert v0.is_dir() and v1.is_dir()  # version 0 is still in use: kept
        hold.set()
        call = in_flight.result(30)
        assert call.policy_version == 0
        assert servers.release() == [0] and not v0.exists() and v1.is_dir()
        after = servers.submit(request, SamplingParams(temperature=1.0)).result(30)
        assert after.policy_version == 1
    finally:
        hold.set()
        server.close()
    loads = [b for p, b in server.requests if p.endswith("/load_lora_adapter")]
    assert [b["lora_name"] for b in loads] == ["harnessrl-policy-r9-v0", "harnessrl-policy-r9-v1"]
    assert len({b["lora_path"] for b in loads}) == 2 and not any(b.get("load_inplace") for b in loads)
    assert [b["lora_name"] for p, b in server.requests if p.endswith("/unload_lora_adapter")] == [
        "harnessrl-policy-r9-v0"
    ]
    chats = [b for p, b in server.requests if p.endswith("/chat/completions")]
    assert [b["model"] for b in chats] == ["harnessrl-policy-r9-v0", "harnessrl-policy-r9-v1"]
    # a process that does not publish requests the same name once told the version
    other = RolloutServers([server.url], run_id="r9")
    other.version = 1
    assert other.adapter_name == servers.adapter_name == adapter_name("r9", 1)


def test_a_bad_run_id_is_refused():
    with pytest.raises(ValueError, match="run_id"):
        RolloutServers(["http://127.0.0.1:9/v1"], run_id="a b/c")


# ------------------------------------------------------------------------------------ a GRPO run


class Recording:
    """ASGI middleware keeping every POST body the app received, in order."""

    def __init__(self, app):
        self.app = app
        self.posts: list[tuple[str, dict]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        self.posts.append((scope["path"], json.loads(raw or b"{}")))
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    from test_trainer import BASE, SPECS, TextScore

    from harnessrl.models.embedded import load_tokenizer, tiny_random_model
    from harnessrl.models.hf import HFPolicy
    from harnessrl.serve import ServedModels, create_app
    from harnessrl.wire.http import BackgroundServer

    out = tmp_path_factory.mktemp("vllm-like") / "run"
    models = ServedModels(HFPolicy(tiny_random_model(), load_tokenizer(), name="tiny-random"), max_loras=2)
    app = Recording(create_app(models, admin_key=ADMIN_KEY))
    server = BackgroundServer(app)
    root = server.start()
    try:
        config = BASE.replace(eval_every=0, rollout_servers=[f"{root}/v1"])
        with pytest.MonkeyPatch.context() as env:
            env.setenv(ADMIN_KEY_ENV, ADMIN_KEY)
            grpo_trainer(config, out, suite=TextScore(), specs=SPECS, progress=False).run()
    finally:
        server.stop()
        models.close()
    return out, app.posts


def test_a_grpo_run_loads_every_version_from_a_new_path(served_run):
    out, posts = served_run
    loads = [b for p, b in posts if p == "/v1/load_lora_adapter"]
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    versions = 1 + sum(1 for r in steps[:-1] if r["optimizer_step"])  # the last step's update is never sampled
    assert len(loads) == versions >= 2
    assert len({b["lora_path"] for b in loads}) == len(loads)  # no path loaded twice
    assert len({b["lora_name"] for b in loads}) == len(loads)  # nor a name
    assert not any(b.get("load_inplace") for b in loads)
    assert all(Path(b["lora_path"]).parent == (out / ADAPTERS_DIR).resolve() for b in loads)
    # every version but the last was unloaded once its rollouts were over, and its folder deleted
    unloads = [b["lora_name"] for p, b in posts if p == "/v1/unload_lora_adapter"]
    assert unloads == [b["lora_name"] for b in loads[:-1]]
    assert [p.name for p in (out / ADAPTERS_DIR).iterdir()] == [Path(loads[-1]["lora_path"]).name]


def test_every_rollout_request_sends_every_sampling_field(served_run):
    _, posts = served_run
    loaded: set[str] = set()
    chats = 0
    for path, body in posts:
        if path == "/v1/load_lora_adapter":
            loaded.add(body["lora_name"])
        if path != "/v1/chat/completions":
            continue
        if body["messages"][-1]["content"] == PROBE_MESSAGES[-1].content:
            continue  # the start-up probe (one of its two requests leaves the fields out on purpose)
        chats += 1
        assert body["model"] in loaded  # a name loaded before, never the base model
        assert {k: body.get(k) for k in NEUTRAL} == NEUTRAL, body
        assert body["temperature"] == 1.0 and isinstance(body["seed"], int) and body["return_token_ids"] is True
        assert body["logprobs"] is True
    assert chats > 0


def test_the_trainer_probes_its_servers_at_start(tiny, tmp_path):
    """The trainer probes its servers after the first publish, before any rollout: a server
    returning raw logprobs stops the run with the flag to add, and no rollout was sampled."""
    from test_trainer import BASE, SPECS, TextScore

    from harnessrl.train.trainer import TrainError

    server = VLLMLike(tiny, logprobs_mode="raw_logprobs")
    try:
        config = BASE.replace(eval_every=0, temperature=0.7, rollout_servers=[server.url])
        with pytest.raises(TrainError, match="--logprobs-mode processed_logprobs"):
            grpo_trainer(config, tmp_path / "o", suite=TextScore(), specs=SPECS, progress=False).run()
    finally:
        server.close()
    chats = [b for p, b in server.requests if p.endswith("/chat/completions")]
    assert chats and all(b["max_tokens"] == PROBE_MAX_TOKENS for b in chats)  # no rollout was sampled
