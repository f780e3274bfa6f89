"""One GRPO step of the same workload in TRL's GRPOTrainer (with harnessrl.integrations.trl) and in
`harnessrl train grpo`: seconds per phase, the update in parts, and the positions each computes.

    HARNESSRL_THREADS=1 .venv/bin/python bench/trl_step.py [--repeats 3] [--record]

The workload, the same in every run: the embedded SmolLM2-135M (float32, CPU), toolcalc's first 4
train tasks x 2 attempts (one GRPO group per task) through json-tools (at most 4 model calls),
temperature 0.7, LoRA r=16 on q/k/v/o (alpha 32), AdamW lr 1e-4, one optimizer step, no gradient
checkpointing (ours has none; TRL's default has it on: --trl-gradient-checkpointing). All play the
same episodes: the same tasks, the same sampling seed (`sampling_seed(0, 0, "train")`: TRL's
batch 0 and our step 0) and the same attempt numbers (ours number each group's attempts 0 .. G-1;
TRL's rollout numbers them on through the batch, so here its jobs are renumbered to ours before
they run), on the same base weights. The bench checks it and stops, recording nothing, when they
differ: the same episode ids and, call by call, the same sampled token ids in every run, and the
same trained tokens (TRL's model tokens kept in the loss against ours). Timing only: a group
whose episodes all scored alike (nearly all of them: the embedded model passes almost no
toolcalc task) is given advantages +-1 in every trainer, so each runs its backward pass and
optimizer step.

Three trainers, each run once per repeat, their order rotating from one repeat to the next:
- TRL's GRPOTrainer with micro-batches of 2 episodes (4 micro-batches to the optimizer step), as
  TRL lays them out: it pads the whole generation batch at once (every prompt on the left to the
  longest prompt, every completion on the right to the longest completion) and slices the
  micro-batches out of it, so each row is as wide as the widest of all 8 (the baseline);
- the same with micro-batches of 1 episode whose padding this bench cuts before TRL's loss sees
  them (`without_padding`; TRL 1.16's GRPOTrainer has no such option, no `padding_free` and no
  packing: see the doc): the padding's share of the update's time;
- `harnessrl train grpo`: an episode's model calls packed into shared rows, and the tokens a
  micro-batch's rows share (a group's task prompt) forwarded once (`--share-prefixes`, its default).

Phases: rollout (the episodes, harnessrl's engine on the model being trained, in all three) and
update (the rest of the step). TRL's update in parts, from hooks on its own code: the loss's
forward (`_get_per_token_logps_and_entropies` with grad), split into the decoder (the backbone
module's forward) and the fused LM head (the rest of it: in TRL 1.16 one pass computes the
log-prob and the entropy of every position it scores; off CUDA that is every position of every
row, prompt and padding included); the backward (`accelerator.backward`), of which the head's
(`ChunkedLogProbFunction.backward`); the AdamW step (between TRL's pre- and post-optimizer
callbacks); the rest (reward and advantage bookkeeping, padding, gradient clipping, callbacks).
Ours: forward + backward, the gradient sketch, the optimizer, the rest (its metrics.jsonl `time`).

Positions: `padded` (TRL's micro-batches, prompt and completion), `real` (its attention mask),
`head` (positions its LM head projects: every one off CUDA), `completion` (the completion's real
positions: what its head projects on CUDA, the harness's tokens under env_mask 0 included),
`tree` (unique positions when the same 8 episodes are folded into one prefix trie by TRL's own
`trl.experimental.async_grpo.packing.TreeRow`, which only AsyncGRPOTrainer uses: counted, not
run), and ours' forwarded positions (`padded_tokens`). Per trained token throughout.

The head (`--head-bench`, in each baseline run, after its step, outside its timing): TRL's own
`ChunkedLogProbFunction` forward, without grad, on the hidden states of the step's micro-batches,
at every position with and without the entropy, at the completion positions only, and at the
trained tokens only.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "trl"))
from results import add_record_argument, record_run  # noqa: E402

TASKS, GROUP, HARNESS, MAX_STEPS = 4, 2, "json-tools", 4
PADDED, UNPADDED, OURS = "trl-2", "trl-1", "ours"
ROWS = {PADDED: 2, UNPADDED: 1}  # episodes per TRL micro-batch; 8 episodes to the optimizer step either way
HEAD_SETS = (  # (label, positions, outputs)
    ("every position, log-prob + entropy (TRL off CUDA)", "head", ("log_probs", "entropy")),
    ("every position, log-prob only", "head", ("log_probs",)),
    ("completion positions, log-prob + entropy (TRL on CUDA)", "completion", ("log_probs", "entropy")),
    ("trained tokens only, log-prob only", "trained", ("log_probs",)),
)


def forced(scores: list, group: int) -> list:
    """Timing only: a group whose scores are all equal gets 1, 0, 1, 0, ... (advantages +-1), so
    every step of both trainers runs its backward pass and optimizer step (the embedded model
    passes almost no toolcalc task, and a flat batch skips our update but not TRL's)."""
    out = list(scores)
    for start in range(0, len(out), group):
        chunk = out[start : start + group]
        if None not in chunk and len(set(chunk)) == 1:
            out[start : start + group] = [float(i % 2 == 0) for i in range(len(chunk))]
    return out


@contextlib.contextmanager
def ours_numbering(group: int):
    """Runner.run plays each job with attempt `attempt % group` (our trainer's numbering of a
    step-0 group's attempts) in place of TRL's rollout's numbering."""
    import dataclasses

    from harnessrl.rollout import Runner

    run = Runner.run

    def run_ours(self, jobs, *a, **k):
        return run(self, [dataclasses.replace(j, attempt=j.attempt % group) for j in jobs], *a, **k)

    Runner.run = run_ours
    try:
        yield
    finally:
        Runner.run = run


@contextlib.contextmanager
def timed_head_backward(parts: dict):
    """TRL's fused LM head's backward (`ChunkedLogProbFunction.backward`), timed into `parts`."""
    from trl.kernels import ChunkedLogProbFunction

    backward = ChunkedLogProbFunction.backward

    def timed(ctx, *grads):
        started = time.perf_counter()
        try:
            return backward(ctx, *grads)
        finally:
            parts["head_backward_s"] += time.perf_counter() - started

    ChunkedLogProbFunction.backward = staticmethod(timed)
    try:
        yield
    finally:
        ChunkedLogProbFunction.backward = staticmethod(backward)


def trl_step(out: Path, rows: int, trim: bool, gradient_checkpointing: bool, model: str, head_bench: bool) -> dict:
    import torch
    from train_toolcalc import build_trainer, parse_args
    from transformers import TrainerCallback
    from trl.kernels.chunked_logprob import _use_triton

    args = parse_args(
        [
            "--model", model, "--harnesses", HARNESS, "--scheduler", f"single:{HARNESS}", "--steps", "1",
            "--per-device-batch", str(rows), "--gradient-accumulation", str(TASKS * GROUP // rows),
            "--num-generations", str(GROUP),
            "--temperature", "0.7", "--lr", "1e-4", "--lora-r", "16", "--out", str(out),
            "--train-tasks", str(TASKS), "--max-steps-per-episode", str(MAX_STEPS),
            "--gradient-checkpointing" if gradient_checkpointing else "--no-gradient-checkpointing",
        ]
    )  # fmt: skip
    trainer, rollout = build_trainer(args)  # exactly the 4 tasks: one batch holds them all
    reward = rollout.reward

    def forced_reward(*a, harnessrl_score=None, **k):
        return forced(reward(*a, harnessrl_score=harnessrl_score, **k), GROUP)

    forced_reward.__name__ = "harnessrl"
    trainer.reward_funcs = [forced_reward]
    rollout.reward = forced_reward  # (HarnessRollout checks that its reward is the trainer's)

    parts = dict.fromkeys(("loss_forward_s", "backbone_s", "nograd_logps_s", "backward_s", "head_backward_s"), 0.0)
    parts["optimizer_s"] = 0.0
    positions = dict.fromkeys(("padded", "real", "head", "completion"), 0)
    samples: list[dict] = []  # each episode's real tokens and trained mask, for the prefix trie
    captured: list[dict] = []  # each micro-batch's hidden states and labels, for the head bench
    state = {"in_loss": False, "mask": None}

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_pre_optimizer_step(self, *a, **k):
            self.optimizer_start = time.perf_counter()

        def on_optimizer_step(self, *a, **k):
            parts["optimizer_s"] += time.perf_counter() - self.optimizer_start

        def on_step_end(self, *a, **k):
            self.seconds = time.perf_counter() - self.start

    clock = Clock()
    trainer.add_callback(clock)
    backbone = trainer.model.get_base_model().model  # the decoder: the fused head runs after it
    backbone_started: list[float] = []

    def before_backbone(*a):
        if state["in_loss"]:
            backbone_started.append(time.perf_counter())

    def after_backbone(module, inputs, output):
        if state["in_loss"]:
            parts["backbone_s"] += time.perf_counter() - backbone_started.pop()
            if head_bench:
                captured[-1]["hidden"] = output.last_hidden_state[:, :-1].detach().clone()

    backbone.register_forward_pre_hook(before_backbone)
    backbone.register_forward_hook(after_backbone)
    logps_fn, loss_fn = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

    def timed_logps(model, input_ids, attention_mask, logits_to_keep, *a, **k):
        if not torch.is_grad_enabled():  # an old-log-prob pass (none with one iteration per batch)
            started = time.perf_counter()
            result = logps_fn(model, input_ids, attention_mask, logits_to_keep, *a, **k)
            parts["nograd_logps_s"] += time.perf_counter() - started
            return result
        labels = input_ids.masked_fill(attention_mask == 0, -100)  # TRL's labels, shifted as its head does
        labels[:, :-logits_to_keep] = -100
        labels = labels[:, 1:]
        trained = torch.zeros_like(labels, dtype=torch.bool)
        trained[:, -logits_to_keep:] = state["mask"].bool()
        positions["padded"] += input_ids.numel()
        positions["real"] += int(attention_mask.sum())
        positions["completion"] += int((labels != -100).sum())
        positions["head"] += int((labels != -100).sum()) if _use_triton(input_ids.device) else labels.numel()
        if head_bench:
            captured.append({"labels": labels.clone(), "trained": trained})
        state["in_loss"] = True
        started = time.perf_counter()
        try:
            return logps_fn(model, input_ids, attention_mask, logits_to_keep, *a, **k)
        finally:
            parts["loss_forward_s"] += time.perf_counter() - started
            state["in_loss"] = False

    def capturing_loss(model, inputs):
        if trim:
            inputs = without_padding(inputs)
        mask = inputs["completion_mask"] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))
        state["mask"] = mask
        for i in range(inputs["prompt_ids"].size(0)):
            p, c = inputs["prompt_mask"][i].bool(), inputs["completion_mask"][i].bool()
            ids = torch.cat([inputs["prompt_ids"][i][p], inputs["completion_ids"][i][c]])
            trained = torch.cat([torch.zeros(int(p.sum()), dtype=torch.long), mask[i][c].long()])
            samples.append({"input_ids": ids, "completion_mask": trained, "group_id": len(samples) // GROUP})
        return loss_fn(model, inputs)

    trainer._get_per_token_logps_and_entropies = timed_logps
    trainer._compute_loss = capturing_loss
    backward = trainer.accelerator.backward

    def timed_backward(loss, **k):
        started = time.perf_counter()
        try:
            return backward(loss, **k)
        finally:
            parts["backward_s"] += time.perf_counter() - started

    trainer.accelerator.backward = timed_backward
    with ours_numbering(GROUP), timed_head_backward(parts):
        trainer.train()
    step = json.loads((out / "harnessrl" / "steps.jsonl").read_text().splitlines()[0])
    update = clock.seconds - step["rollout_s"]
    result = {
        "total_s": clock.seconds,
        "rollout_s": step["rollout_s"],
        "update_s": update,
        "completion_tokens": step["model_tokens"],
        "trained_tokens": step["model_tokens_kept"],
        "episodes": step["episodes"],
        "reward_mean": step["reward_mean"],
        **parts,
        "head_forward_s": parts["loss_forward_s"] - parts["backbone_s"],
        "rest_s": update - parts["loss_forward_s"] - parts["backward_s"] - parts["optimizer_s"],
        **{f"{k}_positions": v for k, v in positions.items()},
        "tree_positions": tree_positions(samples),
        "samples": len(samples),
        **episodes(out / "harnessrl" / "rollouts"),
    }
    if head_bench:
        head = trainer.model.get_base_model().get_output_embeddings().weight.detach()
        result["head_bench"] = bench_head(captured, head, trainer.temperature)
    return result


def without_padding(inputs: dict) -> dict:
    """A micro-batch of TRL's without its columns of padding only: the prompt's left padding and
    the completion's right padding that no row of it uses (with one episode a micro-batch: no
    padding at all). Every per-token tensor of the completion is cut with it. Left padding only
    shifts every position of a row by the same amount, which rotary position embeddings do not
    see, so the log-probs are the padded ones up to rounding."""
    import torch

    prompt, completion = inputs["prompt_mask"], inputs["completion_mask"]
    used = torch.nonzero(prompt.any(0))
    first = int(used[0]) if used.numel() else prompt.size(1) - 1
    used = torch.nonzero(completion.any(0))
    end = int(used[-1]) + 1 if used.numel() else 1
    out = dict(inputs)
    for key, value in inputs.items():
        if key in ("prompt_ids", "prompt_mask"):
            out[key] = value[:, first:]
        elif isinstance(value, torch.Tensor) and value.dim() >= 2 and value.size(1) == completion.size(1):
            out[key] = value[:, :end]
    return out


def tree_positions(samples: list[dict]) -> int:
    """Unique positions of the episodes folded into one prefix trie by TRL's AsyncGRPOTrainer's
    packing (`TreeRow.add`: a token shared by several episodes, with the same next token, is
    forwarded once)."""
    from trl.experimental.async_grpo.packing import TreeRow

    row = TreeRow()
    for sample in samples:
        row.add(sample)
    return len(row.tokens)


def bench_head(captured: list[dict], weight, temperature: float) -> dict:
    """Seconds of TRL's fused LM head forward (no grad) over the step's micro-batches, for each of
    HEAD_SETS, and the positions each projects."""
    import torch
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    out = {}
    with torch.no_grad():
        for label, where, outputs in HEAD_SETS:
            seconds, count = 0.0, 0
            for mb in captured:
                hidden, labels = mb["hidden"], mb["labels"]
                if where == "head":
                    h, t = hidden.reshape(-1, hidden.size(-1)), labels.clamp(min=0).reshape(-1)
                else:
                    keep = labels != -100 if where == "completion" else mb["trained"]
                    h, t = hidden[keep], labels[keep]
                started = time.perf_counter()
                ChunkedLogProbFunction.apply(
                    h, weight, None, t, temperature, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs
                )
                seconds += time.perf_counter() - started
                count += h.size(0)
            out[label] = {"seconds": seconds, "positions": count}
    return out


def episodes(rollouts: Path) -> dict:
    """The episodes of a run database: their ids (naming task, harness and attempt) and, episode by
    episode, a digest of each model call's sampled token ids."""
    from harnessrl.store import RunStore

    with RunStore(rollouts) as store:
        trajectories = sorted(store.trajectories(), key=lambda t: t.episode_id)
    return {
        "episode_ids": [t.episode_id for t in trajectories],
        "call_tokens": [
            [hashlib.sha256(json.dumps(list(s.model_call.completion_ids)).encode()).hexdigest()[:12] for s in t.steps]
            for t in trajectories
        ],
    }


def ours_step(out: Path, model: str) -> dict:
    from train_toolcalc import harness_specs

    from harnessrl.kernel import enter
    from harnessrl.tasks import get_suite
    from harnessrl.train.trainer import TrainConfig, Trainer

    suite = get_suite("toolcalc")
    suite.split_sizes = {**suite.split_sizes, "train": TASKS}  # the first 4 train tasks, each step all of them
    config = TrainConfig(
        model=model,
        device="cpu",
        harnesses=[HARNESS],
        scheduler=f"single:{HARNESS}",
        steps=1,
        tasks_per_step=TASKS,
        group_size=GROUP,
        temperature=0.7,
        lr=1e-4,
        lora_r=16,
        lora_alpha=32,
    )
    objects = {"suite": suite, "harnesses": harness_specs(HARNESS, MAX_STEPS)}
    Trainer(enter("train grpo", config, out, objects=objects, progress=False)).run()
    r = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    t = r["time"]
    update = t["total"] - t["rollout"]
    return {
        "total_s": t["total"],
        "rollout_s": t["rollout"],
        "update_s": update,
        "completion_tokens": r["completion_tokens"],
        "trained_tokens": r["completion_tokens"],
        "episodes": r["episodes"],
        "reward_mean": r["reward_mean"],
        "forward_backward_s": t["backward"],
        "sketch_s": t["sketch"],
        "optimizer_s": t["optimizer"],
        "rest_s": update - t["backward"] - t["sketch"] - t["optimizer"],
        "padded_positions": r["padded_tokens"],
        **episodes(out / "rollouts"),
    }


def _med(runs: list[dict], key: str, per_token: bool = True) -> float:
    return statistics.median(r[key] / (r["trained_tokens"] if per_token else 1) for r in runs)


def trainer_names(gradient_checkpointing: bool) -> dict[str, str]:
    checkpointing = ", gradient checkpointing" if gradient_checkpointing else ""
    return {
        PADDED: f"TRL 1.16 GRPOTrainer, micro-batches of 2 episodes (padded){checkpointing}",
        UNPADDED: f"TRL 1.16 GRPOTrainer, micro-batches of 1 episode, padding cut by this bench{checkpointing}",
        OURS: "harnessrl train grpo (calls packed in shared rows, shared prefixes forwarded once)",
    }


def summarize(runs: dict[str, list[dict]], names: dict[str, str], head_bench: bool) -> tuple[dict[str, list], dict]:
    """The tables (main, parts, head) and the whole result of `runs` (trainer key -> its runs, in
    repeat order); stops when the runs did not all play the same episodes and tokens."""
    every = [r for rs in runs.values() for r in rs]
    first = every[0]
    differ = [
        f"{k} run {i}: {field}"
        for k, rs in runs.items()
        for i, r in enumerate(rs)
        for field in ("episode_ids", "call_tokens", "completion_tokens", "trained_tokens")
        if r[field] != first[field]
    ]
    if differ:
        raise SystemExit(f"the runs did not play the same episodes and tokens ({'; '.join(differ)}): nothing recorded")
    trained = first["trained_tokens"]
    base = runs[PADDED]

    def ratio(key: str, against: list[dict]) -> float:
        """The median over repeats of this trainer's update seconds over `against`'s, repeat by repeat."""
        return statistics.median(r["update_s"] / b["update_s"] for r, b in zip(runs[key], against))

    main_rows = [
        {
            "trainer": names[k],
            "step s": round(_med(rs, "total_s", False), 1),
            "rollout s": round(_med(rs, "rollout_s", False), 1),
            "update s": round(_med(rs, "update_s", False), 1),
            "update s per trained token": round(_med(rs, "update_s"), 4),
            "update / TRL padded (same repeat)": round(ratio(k, base), 2),
            "trained tokens": trained,
            "runs": len(rs),
        }
        for k, rs in runs.items()
    ]
    part_rows = []
    for k, rs in runs.items():
        row: dict = {"trainer": names[k]}
        if k == OURS:
            row["forward + backward s"] = round(_med(rs, "forward_backward_s"), 4)
            row["gradient sketch s"] = round(_med(rs, "sketch_s"), 4)
        else:
            row["decoder forward s"] = round(_med(rs, "backbone_s"), 4)
            row["LM head forward s (log-prob + entropy)"] = round(_med(rs, "head_forward_s"), 4)
            row["backward s"] = round(_med(rs, "backward_s"), 4)
            row["of which LM head backward s"] = round(_med(rs, "head_backward_s"), 4)
        row["optimizer s"] = round(_med(rs, "optimizer_s"), 4)
        row["rest s"] = round(_med(rs, "rest_s"), 4)
        row["positions forwarded"] = round(_med(rs, "padded_positions"), 2)
        if k != OURS:
            row["real positions"] = round(_med(rs, "real_positions"), 2)
            row["positions the head scores"] = round(_med(rs, "head_positions"), 2)
        part_rows.append(row)
    trl_first = base[0]
    position_row = {
        "trainer": "TRL 1.16 AsyncGRPOTrainer's prefix trie (TreeRow) of the same episodes: counted, not run",
        "positions forwarded": round(trl_first["tree_positions"] / trained, 2),
        "positions the head scores": round(trl_first["completion_positions"] / trained, 2),
    }
    head_rows = []
    if head_bench:
        full = statistics.median(r["head_bench"][HEAD_SETS[0][0]]["seconds"] for r in base)
        for label, _, _ in HEAD_SETS:
            seconds = statistics.median(r["head_bench"][label]["seconds"] for r in base)
            head_rows.append(
                {
                    "LM head forward (TRL's ChunkedLogProbFunction, no grad)": label,
                    "positions per trained token": round(base[0]["head_bench"][label]["positions"] / trained, 2),
                    "s per trained token": round(seconds / trained, 5),
                    "x every position + entropy": round(seconds / full, 3),
                }
            )
    result = {
        "runs": runs,
        "same_episodes": True,
        "trl_padded_over_ours_update": round(1 / ratio(OURS, base), 2),
        "trl_unpadded_over_padded_update": round(ratio(UNPADDED, base), 2),
    }
    tables = {"main": main_rows, "parts": [*part_rows, position_row], "head": head_rows}
    return tables, result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    add_record_argument(p)
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (the figures), or tiny-random (plumbing)")
    p.add_argument(
        "--trl-gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="TRL's default is on; ours has none, so off compares like with like",
    )
    p.add_argument("--head-bench", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    import torch
    from float_trainer import force_flat_advantages

    force_flat_advantages()
    names = trainer_names(args.trl_gradient_checkpointing)
    runs: dict[str, list[dict]] = {k: [] for k in names}
    order = list(names)
    with tempfile.TemporaryDirectory(prefix="trl-step-") as tmp:
        for i in range(args.repeats):
            for key in order[i % 3 :] + order[: i % 3]:
                folder = Path(tmp) / f"{i}-{key}"
                if key == OURS:
                    r = ours_step(folder, args.model)
                else:
                    head = args.head_bench and key == PADDED
                    r = trl_step(folder, ROWS[key], key == UNPADDED, args.trl_gradient_checkpointing, args.model, head)
                print(key, json.dumps(r), flush=True)
                runs[key].append(r)
                gc.collect()  # the trainer and its model (held in reference cycles by the hooks above)
    tables, result = summarize(runs, names, args.head_bench)
    result["torch_threads"] = torch.get_num_threads()
    for rows in tables.values():
        for row in rows:
            print(json.dumps(row))
    trained = tables["main"][0]["trained tokens"]
    print(f"same episodes and tokens in every run: {sum(map(len, runs.values()))} runs, {trained} trained tokens")
    print(f"TRL padded / harnessrl update (median over repeats): {result['trl_padded_over_ours_update']}x")
    if args.record:
        for table, rows in tables.items():
            if rows:
                record_run(
                    "trl_step", rows, table=table, results=result if table == "main" else None, replace_table=True
                )
    return result


if __name__ == "__main__":
    main()
