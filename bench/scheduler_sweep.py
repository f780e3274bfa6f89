"""Controlled comparison of the training schedulers at an equal step budget.

    .venv/bin/python bench/scheduler_sweep.py --seeds 5 --out runs/sweep            # defaults below
    .venv/bin/python bench/scheduler_sweep.py --schedulers mixed --curve 10,20 ...   # calibration
    .venv/bin/python bench/scheduler_sweep.py --published --jobs 16 ...              # many-core machine

Setup (everything runs through the real trainer, runner, harnesses and GRPO loss):

* Policy: a small Llama (2 layers, hidden 64) over the real SmolLM2 tokenizer, randomly
  initialised per seed, then *warm-started* by a short supervised pass on oracle replies
  (next-token loss on the completion tokens) through only SOME harnesses, with different
  amounts of data: the harnesses start at different competence, which is what the schedulers
  are meant to exploit. The warm start is shared by every scheduler of a seed (paired design).
* Suite `codeword`: "what is the code word for KEY?"; the answer is a fixed word per key.
  Scored 1 when the submitted answer is the key's word. The warm start's data asks
  `--warm-keys` keys (6), training and evaluation ask `--keys` (1): the policy knows the
  formats and the candidate words, not which word the asked key wants, and finds it by reward.
  The same fact is the answer under every harness, so what one harness learns can transfer;
  what a format learns can interfere. (The policy does not learn a mapping of 2 or more keys by
  reward within 150 steps: the calibration in docs/BENCHMARKS.md.)
* Harnesses: the built-ins, shrunk to a 2-step budget and 32 new tokens per reply, without
  demonstrations. Five train (six with --published: hermes-tools too); `json-variant` (json-tools
  with another system prompt) and `workspace-agent` are held out of training and of the warm
  start, and only evaluated: the new-harness test.
* Schedulers: harness-bandit, mixed, uniform, learnability-only, transfer-only, and the field's
  baselines: a fixed ratio (`ratio_scheduler`: twice the share for the harnesses the warm start
  covered least), dump-ucb, sec and lilo (docs/training.md, "Schedulers"); the same steps, tasks
  per step and group size for each.
* Evaluation after training (and at each --curve step): `--eval-tasks` test-split tasks x
  `--eval-attempts` attempts at T=0.7 under every harness. Reported per scheduler, over seeds:
  the mean test score under the training harnesses, the held-out harnesses' scores and the first
  one's pass@k and pass^k (k = attempts), each with a 95% t-interval over seeds, and the paired
  difference to `mixed` (same seed, same warm start) with its 95% interval.

Writes OUT/results.jsonl (one line per seed x scheduler, appended as runs finish, so a killed
sweep keeps what it measured and `--resume` skips those) and OUT/summary.md. `--jobs N` trains N
runs at once in worker processes of one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from harnessrl.harness.protocols import get_protocol
from harnessrl.harness.registry import load_harness
from harnessrl.harness.spec import HarnessSpec
from harnessrl.kernel import enter
from harnessrl.metrics import harness_summary
from harnessrl.models.base import SamplingParams
from harnessrl.models.embedded import END_OF_TURN, load_tokenizer
from harnessrl.models.hf import HFPolicy
from harnessrl.models.scripted import ScriptedPolicy
from harnessrl.rollout import Runner, make_jobs
from harnessrl.tasks.base import Environment, Suite
from harnessrl.train.grpo import pad_units, token_logprobs, units_from_trajectories
from harnessrl.train.trainer import TrainConfig, Trainer
from harnessrl.types import Message, ToolCall

TRAIN_HARNESSES = ["json-tools", "xml-tags", "react", "code-act", "plan-execute"]
# Held out of training and of the warm start, evaluated only: a new wording of the JSON protocol
# (what a user's new harness often is) and the built-in workspace-agent (new prompt, bootstrap
# files, a memory tool).
HELD_OUT_HARNESSES = ["json-variant", "workspace-agent"]
# --published adds a sixth training harness (the publication trained on six).
PUBLISHED_EXTRA = "hermes-tools"
# Keys asked during training and evaluation (--keys) and in the warm start's data (--warm-keys), of
# the 16 below. The small policy does not learn a key -> word mapping by reward: with 6 or 2 keys,
# GRPO over 100-150 steps left it at chance under every harness (docs/BENCHMARKS.md, calibration).
# With one key asked after a warm start on six, the word is one fact to find by reward, and what
# one harness finds, the others can use.
N_KEYS = 1
WARM_KEYS = 6
# Oracle examples per harness in the warm start: strong, medium, weak, none.
WARM_EXAMPLES = {"json-tools": 48, "react": 24, "plan-execute": 16, "code-act": 6, "xml-tags": 0, "hermes-tools": 6}


def ratio_scheduler(train: list[str]) -> str:
    """A hand-set static mix, the way a multi-source run fixes each source's ratio: twice the weight
    for the harnesses the warm start covered least (under 10 examples). Equal weights within a tier
    keep the per-step rounding of shares to tasks fair: over the steps of a 4- or 8-task sweep each
    harness gets within 0.05 of its share."""
    by_coverage = sorted(train, key=lambda h: -WARM_EXAMPLES[h])
    return "ratio:" + ",".join(f"{h}={2 if WARM_EXAMPLES[h] < 10 else 1}" for h in by_coverage)


def all_schedulers(train: list[str]) -> list[str]:
    return [
        "harness-bandit",
        "mixed",
        "uniform",
        "learnability-only",
        "transfer-only",
        ratio_scheduler(train),
        "dump-ucb",
        "sec",
        "lilo",
    ]


KEYS = [
    "river",
    "stone",
    "cloud",
    "apple",
    "tiger",
    "candle",
    "garden",
    "silver",
    "winter",
    "pepper",
    "rocket",
    "violin",
    "forest",
    "mirror",
    "coffee",
    "ladder",
]
WORDS = [
    "blue",
    "seven",
    "north",
    "happy",
    "green",
    "music",
    "paper",
    "light",
    "table",
    "sugar",
    "horse",
    "dance",
    "water",
    "smile",
    "train",
    "money",
]


def _words(text: str | None) -> list[str]:
    return "".join(c.lower() if c.isalnum() else " " for c in (text or "")).split()


class CodewordSuite(Suite):
    """Bench-only suite: a fixed key -> word mapping (the first `keys` keys), asked under many phrasings."""

    name = "codeword"

    def __init__(self, keys: int = N_KEYS) -> None:
        super().__init__()
        self.keys = keys

    split_sizes = {"train": 400, "dev": 16, "test": 48}
    needs_workspace = False

    def families(self):
        def codeword(rng: random.Random):
            k = rng.randrange(self.keys)
            n = rng.randrange(10_000)
            word = WORDS[k]

            def check(env: Environment) -> dict[str, float]:
                return {"answer": float(_words(env.answer)[:1] == [word])}

            return {
                "instruction": f"Request {n}: what is the code word for {KEYS[k]}? Submit only the code word.",
                "setup": lambda env: None,
                "check": check,
                "data": {"key": KEYS[k], "n": n},
                "solution": [{"name": "submit", "arguments": {"answer": word}}],
            }

        return {"codeword": codeword}

    def base_tools(self):
        return []


def shrunk_spec(name: str) -> HarnessSpec:
    if name == "json-variant":
        data = load_harness("json-tools").to_dict()
        data.update(name="json-variant", description="json-tools with a different system prompt")
        data["system_prompt"] = (
            "Answer by calling a tool.\n{tools}\nWrite exactly one JSON tool call per reply; submit ends the task.\n"
        )
    else:
        data = load_harness(name).to_dict()
    data["rules"].update(max_steps=2, max_new_tokens=32, max_total_tokens=None, demonstrations=[], timeout_s=None)
    data["rules"]["budget_notice"]["enabled"] = False
    return HarnessSpec.model_validate(data)


def small_model(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.02,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids(END_OF_TURN),
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tok


def oracle_units(suite: Suite, spec: HarnessSpec, n: int, tok) -> list:
    """Training units of an oracle (plan turn + the submit call in the harness's own format)."""
    if n == 0:
        return []
    tasks = suite.tasks("train", n)
    by_instruction = {t.instruction: t for t in tasks}
    proto = get_protocol(spec.protocol.format, lenient=spec.protocol.lenient)

    def script(messages: list[Message]) -> str:
        if messages[-1].role == "user" and messages[-1].content == spec.loop.plan_prompt:
            return "1. Submit the code word."
        task = next(by_instruction[m.content] for m in messages if m.role == "user" and m.content in by_instruction)
        call = task.solution[0]
        return proto.render_call(ToolCall(name=call["name"], arguments=call["arguments"]))

    runner = Runner(ScriptedPolicy(script, tokenizer=tok), SamplingParams(temperature=1.0), progress=False)
    trajectories = runner.run(make_jobs(tasks, [spec], 1))
    return units_from_trajectories(trajectories, {t.episode_id: 1.0 for t in trajectories})


def warm_start(
    seed: int, suite: Suite, specs: dict[str, HarnessSpec], train: list[str], folder: Path, epochs: int
) -> dict:
    """Supervised next-token pass on oracle replies through the `train` harnesses (WARM_EXAMPLES
    each); saves a transformers folder at `folder`."""
    model, tok = small_model(seed)
    units = []
    for name in train:
        units += oracle_units(suite, specs[name], WARM_EXAMPLES[name], tok)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    t0 = time.perf_counter()
    losses = []
    for _ in range(epochs):
        rng.shuffle(units)
        for i in range(0, len(units), 16):
            batch = pad_units(units[i : i + 16], tok.pad_token_id)
            logp = token_logprobs(model, batch)
            loss = -(logp.sum() / batch["completion_mask"].sum())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return {"units": len(units), "final_loss": statistics.mean(losses[-5:]), "seconds": time.perf_counter() - t0}


def evaluate(model, tok, suite: Suite, specs: list[HarnessSpec], args, seed: int) -> dict[str, dict[str, float]]:
    """Per harness, on args.eval_tasks test tasks x args.eval_attempts: mean score, pass@k and
    pass^k at k = attempts; and the record's summary fields (mean over the args.train harnesses,
    each held-out harness's score)."""
    n_tasks, attempts, train = args.eval_tasks, args.eval_attempts, args.train
    sampling = SamplingParams(temperature=0.7, top_p=1.0, seed=seed)
    policy = HFPolicy(model, tok, name="sweep-eval", default_sampling=sampling)
    runner = Runner(policy, sampling, max_in_flight=64, progress=False)
    trajectories = runner.run(make_jobs(suite.tasks("test", n_tasks), specs, attempts))
    summaries = {s.name: harness_summary([t for t in trajectories if t.harness == s.name], attempts) for s in specs}
    scores = {h: s.mean_score or 0.0 for h, s in summaries.items()}
    return {
        "scores": scores,
        "pass_at_k": {h: s.pass_at_k.get(str(attempts)) or 0.0 for h, s in summaries.items()},
        "pass_hat_k": {h: s.pass_hat_k.get(str(attempts)) or 0.0 for h, s in summaries.items()},
        "train_mean": statistics.mean(scores[h] for h in train),
        "held_out": {h: scores[h] for h in HELD_OUT_HARNESSES},
    }


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval half-width (two-sided) over seeds."""
    from statistics import mean, stdev

    T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
    m = mean(xs)
    if len(xs) < 2:
        return m, float("nan"), float("nan")
    half = T975.get(len(xs) - 1, 1.96) * stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def run_one(
    seed: int, scheduler: str, warm: Path, suite: Suite, specs: dict[str, HarnessSpec], args, out: Path
) -> dict:
    train_specs = [specs[n] for n in args.train]
    config = TrainConfig(
        model=f"hf:{warm}",
        scheduler=scheduler,
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        group_size=args.group_size,
        lr=args.lr,
        lora_r=8,
        lora_alpha=16,
        lora_targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        temperature=args.temperature,
        checkpoint_every=args.steps,
        eval_every=0,
        save_rollouts=False,
        seed=seed,
    )
    folder = out / "runs" / f"seed{seed}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', scheduler)}"
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    t0 = time.perf_counter()
    # A learning curve: train to each --curve point in turn (a resumed run computes exactly what
    # the uninterrupted one would) and evaluate there; the last point is --steps.
    points = sorted({s for s in args.curve if 0 < s < args.steps} | {args.steps})
    curve: dict[str, dict[str, float]] = {}
    eval_s = 0.0
    for i, target in enumerate(points):
        objects = {"suite": suite, "harnesses": train_specs}
        trainer = Trainer(
            enter("train grpo", config.replace(steps=target), folder, resume=i > 0, objects=objects, progress=False)
        )
        trainer.run()
        t_eval = time.perf_counter()
        curve[str(target)] = evaluate(trainer.peft_model, trainer.tokenizer, suite, list(specs.values()), args, seed)
        eval_s += time.perf_counter() - t_eval  # "train_seconds" leaves the evaluations out
    train_s = time.perf_counter() - t0 - eval_s
    steps = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    picks: dict[str, float] = {}
    for r in steps:
        for h, share in (r.get("shares") or {}).items():
            picks[h] = picks.get(h, 0.0) + share
    measured = curve[str(args.steps)]
    return {
        "seed": seed,
        "scheduler": scheduler,
        "steps": args.steps,
        "config": {k: getattr(args, k) for k in ("tasks_per_step", "group_size", "lr", "temperature")},
        "curve": {step: {"train_mean": m["train_mean"], "held_out": m["held_out"]} for step, m in curve.items()},
        "train_seconds": round(train_s, 1),
        "seconds": round(time.perf_counter() - t0, 1),
        **measured,
        "harness_steps": picks,
        "skipped_steps": sum(1 for r in steps if r.get("skipped")),
        "reward_mean": statistics.mean(r["reward_mean"] for r in steps if r.get("reward_mean") is not None),
        "zero_std_frac": statistics.mean(r["zero_std_frac"] for r in steps if r.get("zero_std_frac") is not None),
    }


def summarize(results: list[dict], schedulers: list[str], train: list[str]) -> str:
    """One row per scheduler: mean [95% CI over seeds] of each measure, and paired differences to mixed."""
    by = {(r["seed"], r["scheduler"]): r for r in results}
    seeds = sorted({r["seed"] for r in results})
    measures = {"train harnesses: mean": lambda r: r["train_mean"]}
    for h in HELD_OUT_HARNESSES:
        measures[f"held-out {h}: mean"] = lambda r, h=h: r["held_out"][h]
    # pass@k and pass^k of the first held-out harness (records of older sweeps lack them)
    h = HELD_OUT_HARNESSES[0]
    if all("pass_at_k" in r for r in results):
        measures[f"held-out {h}: pass@k"] = lambda r: r["pass_at_k"][h]
        measures[f"held-out {h}: pass^k"] = lambda r: r["pass_hat_k"][h]

    def fmt(xs: list[float], signed: bool = False) -> str:
        if not xs:
            return "-"
        m, lo, hi = t_interval(xs)
        f = "+.3f" if signed else ".3f"
        return f"{m:{f}} [{lo:{f}}, {hi:{f}}]" if not math.isnan(lo) else f"{m:{f}}"

    head = (
        ["scheduler", "seeds"]
        + list(measures)
        + [f"{k} minus mixed" for k in measures]
        + ["steps per harness (mean over seeds)"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in ["warm-start"] + schedulers:
        rows = [by[(seed, s)] for seed in seeds if (seed, s) in by]
        if not rows:
            continue
        cells = [s, str(len(rows))]
        cells += [fmt([get(r) for r in rows]) for get in measures.values()]
        for get in measures.values():
            pairs = [get(r) - get(by[(r["seed"], "mixed")]) for r in rows if (r["seed"], "mixed") in by]
            cells.append(fmt(pairs, signed=True) if s not in ("mixed", "warm-start") else "-")
        if s == "warm-start":
            cells.append("-")
        else:
            cells.append(
                ", ".join(f"{h} {statistics.mean(r['harness_steps'].get(h, 0.0) for r in rows):.1f}" for h in train)
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def split_schedulers(text: str) -> list[str]:
    """--schedulers: names separated by commas; the HARNESS=WEIGHT items of a ratio:... name
    (commas of their own) stay with it: "mixed,ratio:a=1,b=2,sec" -> mixed, ratio:a=1,b=2, sec."""
    names: list[str] = []
    for item in text.split(","):
        if names and names[-1].startswith("ratio:") and "=" in item and ":" not in item:
            names[-1] += "," + item
        else:
            names.append(item)
    return names


# --published: the publication's budget (150 steps of 8 tasks x 8 rollouts, six training harnesses)
PUBLISHED = {"steps": 150, "tasks_per_step": 8, "group_size": 8, "eval_tasks": 24}


def _run_in_worker(seed: int, scheduler: str, warm: str, args: argparse.Namespace) -> dict:
    """One (seed, scheduler) training run in a worker process of --jobs (one torch thread each)."""
    torch.set_num_threads(1)
    specs = {n: shrunk_spec(n) for n in args.train + HELD_OUT_HARNESSES}
    return run_one(seed, scheduler, Path(warm), CodewordSuite(args.keys), specs, args, Path(args.out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--tasks-per-step", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--temperature", type=float, default=0.7, help="rollout sampling temperature during training")
    p.add_argument("--warm-epochs", type=int, default=15)
    p.add_argument("--keys", type=int, default=N_KEYS, help="keys asked in training and evaluation (1-16)")
    p.add_argument("--warm-keys", type=int, default=WARM_KEYS, help="keys in the warm start's oracle data (1-16)")
    p.add_argument("--eval-tasks", type=int, default=16)
    p.add_argument("--eval-attempts", type=int, default=3, help="attempts per test task: k of pass@k and pass^k")
    p.add_argument(
        "--schedulers",
        default=None,
        help="comma-separated names (default: all nine); the HARNESS=WEIGHT items of a ratio:... name stay with it",
    )
    p.add_argument(
        "--curve",
        default="",
        help="comma-separated steps at which to evaluate too, before --steps (a learning curve; e.g. 25,50,100)",
    )
    p.add_argument(
        "--warm-from",
        default=None,
        help="a sweep folder whose warm starts (WARM/warm/seedN) to reuse instead of training new ones",
    )
    p.add_argument(
        "--published",
        action="store_true",
        help="the publication's budget: 150 steps x 8 tasks x group 8, a sixth training harness "
        f"({PUBLISHED_EXTRA}), 24 test tasks (overrides those options); hours per run on 2 cores, "
        "meant for a many-core machine with --jobs",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="training runs at once, each in its own process with one torch thread (use the machine's cores)",
    )
    p.add_argument("--out", default="runs/scheduler-sweep")
    p.add_argument("--resume", action="store_true", help="skip the (seed, scheduler) pairs already in results.jsonl")
    args = p.parse_args(argv)
    args.curve = [int(x) for x in args.curve.split(",") if x.strip()]
    if not (1 <= args.keys <= len(KEYS) and 1 <= args.warm_keys <= len(KEYS)):
        p.error(f"--keys and --warm-keys must be in 1..{len(KEYS)}")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    args.train = list(TRAIN_HARNESSES)
    if args.published:
        vars(args).update(PUBLISHED)
        args.train.append(PUBLISHED_EXTRA)
    os.environ.setdefault("HARNESSRL_THREADS", "1")
    torch.set_num_threads(int(os.environ["HARNESSRL_THREADS"]))
    schedulers = split_schedulers(args.schedulers) if args.schedulers else all_schedulers(args.train)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    results = (
        [json.loads(line) for line in results_path.read_text().splitlines()]
        if args.resume and results_path.exists()
        else []
    )
    if not args.resume:
        results_path.write_text("")
    done = {(r["seed"], r["scheduler"]) for r in results}
    suite = CodewordSuite(args.keys)
    specs = {n: shrunk_spec(n) for n in args.train + HELD_OUT_HARNESSES}
    t_start = time.perf_counter()

    def keep(record: dict) -> None:
        results.append(record)
        with results_path.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if record["scheduler"] != "warm-start":
            print(
                f"seed {record['seed']} {record['scheduler']:18s} train {record['train_mean']:.3f} "
                f"held-out {record['held_out']} ({record['seconds']:.0f} s; "
                f"elapsed {time.perf_counter() - t_start:.0f} s)",
                flush=True,
            )

    todo = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        warm = (Path(args.warm_from) if args.warm_from else out) / "warm" / f"seed{seed}"
        if not (warm / "config.json").exists():
            info = warm_start(seed, CodewordSuite(args.warm_keys), specs, args.train, warm, args.warm_epochs)
            print(f"seed {seed}: warm start {info}", flush=True)
        if (seed, "warm-start") not in done:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(warm).eval()
            measured = evaluate(model, load_tokenizer(), suite, list(specs.values()), args, seed)
            keep({"seed": seed, "scheduler": "warm-start", **measured})
        todo += [(seed, scheduler, str(warm)) for scheduler in schedulers if (seed, scheduler) not in done]
    if args.jobs == 1:
        for seed, scheduler, warm in todo:
            keep(run_one(seed, scheduler, Path(warm), suite, specs, args, out))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_run_in_worker, seed, scheduler, warm, args) for seed, scheduler, warm in todo]
            for future in as_completed(futures):
                keep(future.result())
    table = summarize(results, schedulers, args.train)
    header = (
        f"codeword with {args.keys} keys (warm start on {args.warm_keys}), "
        f"seeds {args.first_seed}..{args.first_seed + args.seeds - 1}, "
        f"{args.steps} steps x {args.tasks_per_step} tasks x "
        f"group {args.group_size}, lr {args.lr}, rollouts at T={args.temperature}, "
        f"training harnesses {', '.join(args.train)}, "
        f"eval {args.eval_tasks} test tasks x {args.eval_attempts} attempts at T=0.7; "
        f"wall {time.perf_counter() - t_start:.0f} s\n\n"
    )
    (out / "summary.md").write_text(header + table + "\n")
    print(header + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
