"""GRPO training over several processes (torch.distributed, gloo on the CPU): two processes take
the steps one process takes, rank 0's store holds every episode once, and a two-process run
resumes in one process.

The processes are started the way torchrun starts them: the same program, with RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the environment. The reward signal is
test_trainer's (the `textscore` suite, length parity of any text, harnesses shrunk to one step).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import grpo_trainer
from test_trainer import BASE, SPECS, TextScore, _lora, _set_up, _units, adapter_weights, lines

from harnessrl.train import update as update_module
from harnessrl.train.distributed import Distributed, local_mini_batches, unsupported_launch
from harnessrl.train.grpo import grpo_loss, split_mini_batches
from harnessrl.train.trainer import TrainError, TrainingDiverged

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gloo_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


needs_gloo = pytest.mark.skipif(
    not _gloo_available(), reason="this torch build has no torch.distributed gloo backend (CPU processes)"
)

# 3 tasks per step over 2 processes: shards of 1 and 2 groups; 2 mini-batches: the split of the
# whole batch must be reproduced across processes. Every step of seed 8 updates (checked below),
# and steps 1 and 2 pick different harnesses (a transfer signal from step 2 on).
CONFIG = BASE.replace(steps=2, tasks_per_step=3, mini_batches=2, seed=8)
SRC = Path(__file__).resolve().parents[1] / "src"

WORKER = """
import dataclasses, json, sys
import torch
torch.set_num_threads(1)
from test_trainer import SPECS, TextScore
from helpers import grpo_trainer
from harnessrl.train.trainer import Trainer, TrainConfig, TrainError
out, options, resume = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
try:
    grpo_trainer(TrainConfig(**options), out, resume=resume, suite=TextScore(), specs=SPECS, progress=False).run()
except TrainError as e:
    print(f"TrainError: {e}", flush=True)
    sys.exit(2)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, out: Path, config, resume: bool = False, timeout: float = 240) -> list[tuple[int, str]]:
    """Run the worker in `world` processes as torchrun would; (exit code, output) per rank."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    tests = str(Path(__file__).resolve().parent)
    base["PYTHONPATH"] = os.pathsep.join([str(SRC), tests, base.get("PYTHONPATH", "")])
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HARNESSRL_THREADS="1", OMP_NUM_THREADS="1")
    procs = []
    for rank in range(world):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}
        env["LOCAL_WORLD_SIZE"] = str(world)
        args = [sys.executable, "-c", WORKER, str(out), json.dumps(config.model_dump()), "1" if resume else "0"]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results = []
    try:
        for p in procs:
            output, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, output))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def snapshot(out: Path) -> dict:
    """What a run folder holds now (a later --resume replaces the checkpoint and the adapter)."""
    from harnessrl.store import RunStore

    with RunStore(out / "rollouts") as store:
        episodes = [(t.task_id, t.harness, t.attempt, t.grade and t.grade.score) for t in store.trajectories()]
    return {
        "metrics": lines(out / "metrics.jsonl"),
        "eval": lines(out / "eval.jsonl"),
        "state": json.loads((out / "checkpoint" / "state.json").read_text()),
        "adapter": adapter_weights(out / "adapter"),
        "config": json.loads((out / "config.json").read_text()),
        "episodes": episodes,
    }


def in_process(out: Path, config, resume: bool = False) -> None:
    grpo_trainer(config, out, resume=resume, suite=TextScore(), specs=SPECS, progress=False).run()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: 2 steps in one process (snapshot), then --resume to 3."""
    out = tmp_path_factory.mktemp("ddp") / "one"
    in_process(out, CONFIG)
    at_2 = snapshot(out)
    in_process(out, CONFIG.replace(steps=3), resume=True)
    return at_2, snapshot(out)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """2 steps in two processes (snapshot), then --resume to 3 in one process."""
    out = tmp_path_factory.mktemp("ddp") / "two"
    results = launch(2, out, CONFIG)
    for rank, (code, output) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}:\n{output[-4000:]}"
    at_2 = snapshot(out)
    in_process(out, CONFIG.replace(steps=3), resume=True)
    return at_2, snapshot(out)


EXACT = (
    "step",
    "harness",
    "shares",
    "sampling_seed",
    "episodes",
    "infra_errors",
    "reward_mean",
    "reward_by_harness",
    "adv_abs_mean",
    "groups",
    "groups_too_small",
    "zero_std_frac",
    "units",
    "units_trained",
    "completion_tokens",
    "optimizer_step",
    "optimizer_steps",
    "skipped",
)
CLOSE = ("loss", "grad_norm", "clip_fraction", "ratio_mean", "kl")


def _same_steps(got: list[dict], want: list[dict]) -> None:
    assert [{k: r[k] for k in EXACT} for r in got] == [{k: r[k] for k in EXACT} for r in want]
    for a, b in zip(got, want):
        for key in CLOSE:
            assert (a[key] is None) == (b[key] is None), key
            if a[key] is not None:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["probabilities"] == pytest.approx(b["probabilities"], rel=1e-5)
        # float rounding of generation: it differs with what else is in the engine's batch
        assert a["rollout_logprob_diff_max"] < 1e-4 and b["rollout_logprob_diff_max"] < 1e-4
        assert a["transfer"] == pytest.approx(b["transfer"], rel=1e-4, abs=1e-6)


def _same_scheduler(got: dict, want: dict) -> None:
    for key in ("harnesses", "rng", "count", "total"):
        assert got[key] == want[key], key
    for key in ("score",):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6)
    for key in ("l_window", "t_window"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert got["sketch_avg"].keys() == want["sketch_avg"].keys() and got["sketch_avg"]
    for h, sketch in want["sketch_avg"].items():
        assert torch.allclose(torch.tensor(got["sketch_avg"][h]), torch.tensor(sketch), rtol=1e-4, atol=1e-7), h


def _same_adapter(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    assert all(torch.allclose(got[k], want[k], rtol=1e-4, atol=1e-7) for k in want)


@needs_gloo
def test_two_processes_take_the_steps_of_one_process(one_process, two_processes):
    one, two = one_process[0], two_processes[0]
    assert [r["optimizer_steps"] for r in one["metrics"]] == [2, 2], "every step should update: pick another seed"
    assert one["metrics"][1]["transfer"], "steps 1 and 2 should pick different harnesses: pick another seed"
    _same_steps(two["metrics"], one["metrics"])
    # the same sketches (the scheduler's averages of them), scheduler state, task sampler and weights
    _same_scheduler(two["state"]["scheduler"], one["state"]["scheduler"])
    assert two["state"]["task_rng"] == one["state"]["task_rng"] and two["state"]["step"] == 2
    _same_adapter(two["adapter"], one["adapter"])
    # evaluations: each process ran a share, rank 0 logged the whole
    assert [e["mean_score"] for e in two["eval"]] == [e["mean_score"] for e in one["eval"]]
    assert [e["tasks"] for e in two["eval"]] == [e["tasks"] for e in one["eval"]]
    # the work was shared: rank 0's policy generated for its own groups only
    assert 0 < two["state"]["generate_calls"] < one["state"]["generate_calls"]
    assert two["config"]["processes"] == 2 and one["config"]["processes"] == 1


@needs_gloo
def test_rank_0_stores_every_episode_of_every_process_once(one_process, two_processes):
    one, two = one_process[0], two_processes[0]
    keys = [e[:3] for e in two["episodes"]]
    assert len(keys) == len(set(keys)) == 2 * CONFIG.tasks_per_step * CONFIG.group_size
    assert sorted(two["episodes"]) == sorted(one["episodes"])


@needs_gloo
def test_a_two_process_run_resumes_in_one_process(one_process, two_processes):
    one, two = one_process[1], two_processes[1]
    _same_steps(two["metrics"], one["metrics"])
    assert [r["step"] for r in two["metrics"]] == [1, 2, 3]
    _same_scheduler(two["state"]["scheduler"], one["state"]["scheduler"])
    _same_adapter(two["adapter"], one["adapter"])
    keys = [e[:3] for e in two["episodes"]]
    assert len(keys) == len(set(keys)) == 3 * CONFIG.tasks_per_step * CONFIG.group_size
    assert sorted(two["episodes"]) == sorted(one["episodes"])
    assert two["config"]["processes"] == 1  # the resumed run's count is recorded


@needs_gloo
def test_a_run_folder_refused_on_rank_0_stops_every_process(tmp_path):
    """Only rank 0 opens the run folder; its refusal reaches the other process, which would
    otherwise wait for rank 0 in the first collective."""
    results = launch(2, tmp_path / "nothing", CONFIG, resume=True, timeout=120)
    for code, output in results:
        assert code == 2 and "holds no training run to resume" in output, output[-2000:]
    assert not (tmp_path / "nothing").exists()


# ----------------------------------------------------------------------------- pieces, one process


class Mirror(Distributed):
    """Rank 0 of two processes that hold the same units, simulated in one: every collective sees
    this process's values twice (the other process's are the same)."""

    def __init__(self):
        super().__init__(rank=0, world_size=2)

    def all_gather_object(self, obj):
        return [obj, obj]

    def all_reduce_(self, tensor):
        return tensor.mul_(2)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_the_summed_gradient_of_two_processes_is_the_one_process_gradient(tmp_path, aggregation):
    """Two processes with the same units: the whole batch is every unit twice, whose mean loss is
    the one-process loss; each process weighs its part by the whole batch's normaliser, so the
    summed gradient, and the sketch and the step taken from it, are the one-process ones."""
    config = BASE.replace(lr=1e-2, aggregation=aggregation)
    two, one = _set_up(tmp_path / "two", config), _set_up(tmp_path / "one", config)
    two.dist = Mirror()
    got, want = two._update(_units(two), 0), one._update(_units(one), 0)
    assert got.units_trained == 2 * want.units_trained == 8  # counted over both processes
    for key in ("loss", "grad_norm", "clip_fraction", "ratio_mean"):
        assert getattr(got, key) == pytest.approx(getattr(want, key), rel=1e-5, abs=1e-7), key
    assert torch.allclose(got.sketch, want.sketch, rtol=1e-4, atol=1e-7)
    a, b = _lora(two), _lora(one)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in b)


def test_a_nan_loss_on_one_process_stops_every_process_at_the_summed_loss(tmp_path, monkeypatch):
    """A process must not stop alone (the others would wait for its gradient): the NaN goes into
    the summed loss, which every process sees, and no optimizer step is taken."""
    t = _set_up(tmp_path / "out")
    t.dist = Mirror()
    reduced: list[torch.dtype] = []

    def nan_loss(*args, **kwargs):
        loss, stats = grpo_loss(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(update_module, "grpo_loss", nan_loss)
    monkeypatch.setattr(Mirror, "all_reduce_", lambda self, x: reduced.append(x.dtype) or x.mul_(2))
    before = _lora(t)
    with pytest.raises(TrainingDiverged, match="step 1: the loss is nan"):
        t._update(_units(t), 0)
    # the counts (int64), then the gradient (float32) and the stats (float64): this process went on
    assert reduced == [torch.int64, torch.float32, torch.float64] and not t.optimizer.state
    after = _lora(t)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"ACCELERATE_USE_FSDP": "true"}, "FSDP is not supported"),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed is not supported"),
        ({"ACCELERATE_MIXED_PRECISION": "bf16"}, "--mixed_precision bf16 is not applied"),
        ({"ACCELERATE_MIXED_PRECISION": "no", "MASTER_ADDR": "127.0.0.1"}, "started a single process"),
    ],
)
def test_launch_modes_that_would_be_ignored_are_refused(monkeypatch, tmp_path, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(TrainError, match=message):
        grpo_trainer(CONFIG, tmp_path / "out", suite=TextScore(), specs=SPECS, progress=False)
    assert not (tmp_path / "out").exists()
    assert unsupported_launch({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_DYNAMO_BACKEND": "NO"}) is None


def test_without_a_launcher_there_is_one_process():
    d = Distributed.from_env({})
    assert (d.rank, d.world_size, d.enabled, d.is_main) == (0, 1, False, True)
    assert d.all_gather_object("x") == ["x"] and d.gather_object(3) == [3] and d.broadcast_object(5) == 5
    assert d.shard(7) == range(7) and d.agree(None) is None and d.agree("no") == "no"
    with pytest.raises(ValueError, match="MASTER_ADDR, MASTER_PORT not set"):
        Distributed.from_env({"WORLD_SIZE": "2", "RANK": "0"})


def test_shards_are_contiguous_whole_and_balanced():
    for n in range(0, 9):
        for world in (1, 2, 3, 4):
            parts = [Distributed(rank, world).shard(n) for rank in range(world)]
            assert [i for part in parts for i in part] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("n", [1, 2, 3, 20])
def test_local_mini_batches_put_together_are_the_one_process_mini_batches(n):
    units = [f"u{i}" for i in range(11)]
    want = split_mini_batches(units, n, "seed")
    for cuts in ([0, 11], [0, 4, 11], [0, 0, 5, 11], [0, 3, 3, 7, 11]):  # processes' unit lists (one empty)
        shares = [local_mini_batches(units[a:b], a, len(units), n, "seed") for a, b in zip(cuts, cuts[1:])]
        assert all(len(s) == len(want) for s in shares)
        together = [sorted(u for s in shares for u in s[i]) for i in range(len(want))]
        assert together == [sorted(part) for part in want]
