"""Several training processes: the process group and the few collectives the GRPO trainer uses.

A launcher starts N copies of `harnessrl train grpo` and tells each who it is through the
environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT):

    torchrun --nproc-per-node 2 -m harnessrl.cli train grpo ...
    accelerate launch --multi_gpu --num_processes 2 -m harnessrl.cli train grpo ...

`Distributed.from_env()` reads that and joins the default process group (gloo for CPU tensors,
NCCL for CUDA tensors when CUDA is present). Without a launcher (WORLD_SIZE unset or 1) it
returns a context of one process whose collectives are the identity: the trainer calls them
unconditionally and one process computes exactly what it computed before.

What the trainer does with them (see docs/training.md, "Several processes"): every process
takes the same scheduler decision from the same seeded state and checks that it agrees
(`check_same`); the step's (task, harness) groups are dealt out in contiguous runs (`shard`);
each process runs its groups' episodes and computes their advantages; the LoRA gradient is
summed over the processes (`all_reduce_`) with the loss normalised by the step's global token
(or unit) count, so every process takes the same optimizer step; trajectories and statistics
go to every process or to rank 0 (`all_gather_object`, `gather_object`); rank 0 alone writes
the run folder.

Only plain data parallelism of a replicated LoRA adapter is done here. Sharded training (FSDP,
DeepSpeed ZeRO, Megatron) and accelerate's mixed precision / dynamo options are refused when a
launcher asks for them (`unsupported_launch`), rather than silently ignored.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Mapping, Sequence, TypeVar

import torch

from harnessrl.models.engine_config import EngineConfig

T = TypeVar("T")

# How long a process waits in a collective for the others: the slowest process's rollouts of a
# step (and rank 0's checkpoint writing) must fit in it.
TIMEOUT = timedelta(hours=1)

_TRUE = ("1", "true", "yes")


class DistributedError(ValueError):
    """The launch cannot be served (an unsupported accelerate mode, a missing variable)."""


def unsupported_launch(env: Mapping[str, str]) -> str | None:
    """Why the launcher's request cannot be honoured, or None. accelerate passes its options to
    the processes as ACCELERATE_* variables; the trainer applies none of them but the process
    count, so the ones that would change the training are refused by name."""
    for var, what in (
        ("ACCELERATE_USE_FSDP", "FSDP"),
        ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed"),
        ("ACCELERATE_USE_MEGATRON_LM", "Megatron-LM"),
    ):
        if env.get(var, "").lower() in _TRUE:
            return (
                f"{what} is not supported by harnessrl train grpo: the LoRA adapter is small and is replicated on "
                f"every process (data parallel). Launch without it, e.g. torchrun --nproc-per-node N -m harnessrl.cli "
                f"train grpo ..."
            )
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if precision not in ("no", ""):
        return (
            f"accelerate's --mixed_precision {precision} is not applied by harnessrl train grpo (the model trains in "
            f"float32); launch with --mixed_precision no"
        )
    dynamo = env.get("ACCELERATE_DYNAMO_BACKEND", "no").lower()
    if dynamo not in ("no", ""):
        return f"accelerate's --dynamo_backend {dynamo} is not applied by harnessrl train grpo; launch with it off"
    if "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env and int(env.get("WORLD_SIZE", "1") or 1) <= 1:
        # accelerate launch --num_processes N (N > 1) on a machine without GPUs starts ONE process
        # (it expects mpirun for several CPU processes); it sets MASTER_ADDR only when N > 1.
        return (
            "accelerate launch started a single process although several were asked for (without GPUs it needs "
            "--multi_gpu to start them); use accelerate launch --multi_gpu --num_processes N, or torchrun "
            "--nproc-per-node N"
        )
    return None


def process_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank as the launcher set it (0 without a launcher), before any group exists."""
    env = os.environ if env is None else env
    return int(env.get("RANK", "0") or 0)


@dataclass
class Distributed:
    """Who this process is among the training processes, and the collectives between them.

    With world_size 1 every method is the identity (`all_gather_object(x) == [x]`, ...).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this object initialised the process group (and destroys it in close())
    # the CPUs each of this machine's training processes may use (set when this object started
    # several processes' group; None: the process has the machine to itself, or a caller set it up)
    cpus_per_process: int | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes the run folder, the store, the logs and the checkpoints."""
        return self.rank == 0

    def engine_config(self, config: EngineConfig) -> EngineConfig:
        """`config` with this process's share of the machine where it leaves the choice open
        (None): the processes on one machine share its CPUs, each taking its share but one for
        its torch threads (harnessrl.models.hf.configure_threads would otherwise give every
        process every CPU but one), and the engine's prefill thread, which takes a core of its
        own, only where each process has two."""
        per_process = self.cpus_per_process
        if per_process is None:
            return config
        changes: dict[str, Any] = {}
        if config.threads is None:
            changes["threads"] = max(1, per_process - 1)
        if config.overlap_prefill is None:
            changes["overlap_prefill"] = per_process >= 2
        return replace(config, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Distributed:
        """The context the launcher described; joins the default process group when there are
        several processes (or uses one a caller set up already)."""
        env = os.environ if env is None else env
        problem = unsupported_launch(env)
        if problem:
            raise DistributedError(problem)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # set up by the caller (a notebook, accelerate)
            world = dist.get_world_size()
            rank = dist.get_rank()
            return cls(rank, world, int(env.get("LOCAL_RANK", rank) or 0), owns_group=False)
        world = int(env.get("WORLD_SIZE", "1") or 1)
        if world <= 1:
            return cls()
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
        if missing:
            raise DistributedError(
                f"WORLD_SIZE={world} but {', '.join(missing)} not set: start the processes with torchrun or "
                "accelerate launch"
            )
        if not dist.is_available():
            raise DistributedError("this torch build has no torch.distributed: several processes cannot train")
        rank = int(env["RANK"])
        local_rank = int(env.get("LOCAL_RANK", rank) or 0)
        local_world = int(env.get("LOCAL_WORLD_SIZE", world) or world)
        from harnessrl.models.engine import usable_cpus

        per_process = usable_cpus() // local_world  # their engines share the CPUs: engine_config
        backend = "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank % torch.cuda.device_count())
            backend = "cpu:gloo,cuda:nccl"  # CPU tensors and pickled objects go through gloo
        elif not dist.is_gloo_available():
            raise DistributedError("torch.distributed has no gloo backend: several CPU processes cannot train")
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=TIMEOUT)
        return cls(rank, world, local_rank, owns_group=True, cpus_per_process=per_process)

    # -- dealing out work -----------------------------------------------------------------------------
    def shard(self, n: int) -> range:
        """This process's items of n: a contiguous run, sizes differing by at most one.

        Contiguous on purpose: concatenating the processes' results in rank order gives the
        items in their original order (the trainer relies on it for mini-batch splits and
        evaluation summaries)."""
        return range(n * self.rank // self.world_size, n * (self.rank + 1) // self.world_size)

    # -- collectives ------------------------------------------------------------------------------------
    def all_gather_object(self, obj: T) -> list[T]:
        """Every process's `obj`, in rank order, on every process (pickled)."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_object(self, obj: T) -> list[T] | None:
        """Every process's `obj`, in rank order, on rank 0; None on the others."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast_object(self, obj: T) -> T:
        """Rank 0's `obj` on every process (the others' argument is ignored)."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box: list[Any] = [obj if self.is_main else None]  # rank 0's object on every process after the call
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` over the processes, in place; every process gets the same bits."""
        if self.enabled:
            import torch.distributed as dist

            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast_tensors_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite each tensor with rank 0's (in place)."""
        if self.enabled:
            import torch.distributed as dist

            with torch.no_grad():
                for t in tensors:
                    dist.broadcast(t.data, src=0)

    def check_same(self, value: Any, what: str) -> None:
        """Raise on every process when some process's `value` differs from rank 0's: the
        processes compute `what` independently and must agree, or their collectives would no
        longer match."""
        values = self.all_gather_object(value)
        differ = [r for r, v in enumerate(values) if v != values[0]]
        if differ:
            raise RuntimeError(
                f"process(es) {differ} disagree with rank 0 on {what}: {values[differ[0]]!r} vs {values[0]!r}"
            )

    def agree(self, error: str | None) -> str | None:
        """The first error (in rank order) of any process, on every process; None when none failed.
        A check that only some processes can make (rank 0's run folder) fails them all together,
        instead of leaving the others waiting in the next collective."""
        return next((e for e in self.all_gather_object(error) if e is not None), None)

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """Leave the process group this object joined (a caller's group is left alone)."""
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                store = None
                if self.world_size > 1:
                    try:  # rank 0 hosts the group's store: it must leave last
                        store = dist.distributed_c10d._get_default_store()
                    except (AttributeError, RuntimeError):
                        store = None
                dist.destroy_process_group()
                if store is not None:
                    _leave_last_on_rank_0(store, self.rank, self.world_size)
            self.owns_group = False


def _leave_last_on_rank_0(store, rank: int, world: int, timeout_s: float = 30.0) -> None:
    """After every process has left its group, count the leavers in the store; rank 0, which
    hosts the store, waits for all of them before it exits. A process that leaves while another
    one's gloo threads still talk to it made that one abort at exit ("terminate called without
    an active exception", SIGABRT) now and then."""
    import time

    try:
        store.add("harnessrl/left", 1)
        if rank == 0:
            deadline = time.monotonic() + timeout_s
            while store.add("harnessrl/left", 0) < world and time.monotonic() < deadline:
                time.sleep(0.02)
    except RuntimeError:  # a store whose host is gone: nothing left to wait for
        pass


def local_mini_batches(units: Sequence[T], offset: int, total: int, n: int, seed: str) -> list[list[T]]:
    """This process's part of each of the n mini-batches that `split_mini_batches` makes of the
    whole batch, when the whole batch is the processes' unit lists concatenated in rank order and
    this process's `units` start at position `offset` of `total`.

    The split shuffles positions only (its generator does not look at the units), so splitting
    the positions 0..total-1 and keeping this process's gives, over all processes, exactly the
    one-process mini-batches. Every process gets the same number of parts (some may be empty)."""
    from harnessrl.train.grpo import split_mini_batches

    parts = split_mini_batches(list(range(total)), n, seed)
    end = offset + len(units)
    return [[units[i - offset] for i in part if offset <= i < end] for part in parts]
