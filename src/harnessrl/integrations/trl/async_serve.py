"""What joins TRL's AsyncGRPOTrainer to `harnessrl serve` (docs/trl-async.md).

    ServeAdapterTransfer   TRL's WeightTransferProtocol: every weight sync publishes the trainer's
                           LoRA adapter to the servers through their keyed adapter route, as a new
                           version under a new name (harnessrl.train.rollout_server.RolloutServers)
    cpu_stand_ins()        the two pieces of AsyncGRPOTrainer 1.16 that need CUDA, replaced for a
                           run on the CPU (the tests and the CPU example; never needed on a GPU)

Why the transfer saves the adapter from the model and not from the pairs it is sent. With a peft
model and an injected `weight_transfer`, TRL 1.16 syncs "merged" weights
(`AsyncGRPOTrainer._sync_weight_merged`): it merges the adapter into the base weights and hands
`send_weights` the base checkpoint's parameters (`_iter_vllm_named_params` leaves every LoRA
tensor out). `harnessrl serve` loads adapters, not base weights, and an adapter cannot be read
back from merged weights. So `send_weights` consumes the pairs it is given (under FSDP2 the other
ranks gather each parameter with rank 0 as they are iterated) and counts them, then writes the
bound peft model's adapter (`save_pretrained`, its LoRA tensors only: merging changes the base
weights, not lora_A and lora_B) into a folder of its own and has every server load it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harnessrl.integrations.trl.setup import HarnessRolloutError
from harnessrl.train.rollout_server import RolloutServerError, RolloutServers


class ServeAdapterTransfer:
    """AsyncGRPOTrainer's `weight_transfer`: the LoRA adapter to `harnessrl serve` (module docstring).

    `servers`: the RolloutServers the rollout worker samples from (the same object: versions,
    pins and the admin key are shared). `adapter_dir`: where each version's folder is written
    (`ADAPTER_DIR/rollout-adapters/v{version}-{run_id}`); the servers must read it (a shared
    filesystem). Bind the trainer's model before `train()` (HarnessRolloutWorker.attach does).

    Version k is the k-th `send_weights` of this object: TRL's cold sync at train begin is
    version 1, its `model_version` after it is 1, and so on, so the adapter of a version is loaded
    before TRL announces that version to the worker. Nothing is paused: every version has a name
    of its own, requests in flight finish on the version they were sent under, and a version is
    unloaded (and its folder deleted) once no batch uses it (RolloutServers.release, pins)."""

    def __init__(self, servers: RolloutServers, adapter_dir: str | Path):
        self.servers = servers
        self.adapter_dir = Path(adapter_dir)
        self.version = 0  # versions published by this object
        self.publish_s: list[float] = []  # seconds of each publication (save + load on every server)
        self.tensors_sent: list[int] = []  # (name, tensor) pairs TRL handed each send_weights
        self._model: Any = None
        self._adapter_name: str | None = None

    def bind(self, model: Any) -> None:
        """The trainer's peft model (TRL's `trainer.model`, or its DDP wrapper's module)."""
        from peft import PeftModel

        model = getattr(model, "module", model)
        if not isinstance(model, PeftModel):
            raise HarnessRolloutError(
                "harnessrl serve takes LoRA adapters, not base weights: train with AsyncGRPOTrainer(..., "
                f"peft_config=LoraConfig(...)) (the trainer's model is a {type(model).__name__}, not a PeftModel)"
            )
        if len(model.active_adapters) != 1:
            raise HarnessRolloutError(f"one active adapter is served, the model has {model.active_adapters}")
        self._model = model
        self._adapter_name = model.active_adapters[0]

    # -- TRL's WeightTransferProtocol ---------------------------------------------------------------
    def init_weight_transfer(self) -> None:
        """Before the first sync: a bound model and servers that answer (GET /v1/models)."""
        if self._model is None:
            raise HarnessRolloutError(
                "the weight transfer has no model: call worker.attach(trainer) before trainer.train()"
            )
        try:
            self.servers.check()
        except RolloutServerError as e:
            raise HarnessRolloutError(str(e)) from None

    def pause(self) -> None:
        """Nothing to pause: the new version gets a name of its own (class docstring)."""

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Consume TRL's (name, tensor) pairs, then publish the adapter as the next version."""
        sent = sum(1 for _ in iterator)
        if sent == 0:
            raise HarnessRolloutError("TRL sent no weights to the weight transfer: nothing was published")
        self.tensors_sent.append(sent)
        self.publish_s.append(self.servers.publish(self._save, self.adapter_dir, self.version + 1))
        self.version += 1

    def resume(self) -> None:
        """Nothing was paused."""

    def destroy(self) -> None:
        """At train end: every version this object published is unloaded and its folder deleted
        once no request uses it."""
        self.servers.version = None
        self.servers.release()

    # ---------------------------------------------------------------------------------------------
    def _save(self, folder: Path) -> None:
        model, name = self._model, self._adapter_name
        assert model is not None and name is not None
        started = time.perf_counter()
        staging = folder.with_name(folder.name + ".saving")
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(str(staging), selected_adapters=[name], safe_serialization=True)
        saved = staging if name == "default" else staging / name  # peft nests other adapters' folders
        if not (saved / "adapter_config.json").is_file():
            raise HarnessRolloutError(f"peft wrote no adapter_config.json for adapter {name!r} under {staging}")
        saved.rename(folder)
        shutil.rmtree(staging, ignore_errors=True)
        self.last_save_s = time.perf_counter() - started


# ------------------------------------------------------------------------------- the CPU stand-ins


def reference_tree_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    *,
    tree_kv_index,
    tree_cu_seqlens_q,
    tree_cu_seqlens_k,
    tree_max_seqlen_q,
    tree_max_seqlen_k,
    scaling=None,
    sliding_window=None,
    softcap=None,
    **kwargs,
):
    """TRL's tree attention (`trl/experimental/async_grpo/packing.py`, `tree_attention`) in plain
    PyTorch: each segment's queries attend, causally aligned to the end, to the keys and values
    of its root-to-segment path (`tree_kv_index[cu_k[i]:cu_k[i+1]]`), which is what TRL's call of
    the FA3 kernel's `flash_attn_varlen_func(..., causal=True)` computes. One segment at a time:
    slow, for the tiny models of tests on the CPU."""
    import torch
    import torch.nn.functional as F

    if sliding_window or softcap:
        raise NotImplementedError("the reference tree attention has no sliding window and no softcap")
    q = query.transpose(1, 2)[0]  # (tokens, heads, dim)
    k = key.transpose(1, 2)[0].index_select(0, tree_kv_index)
    v = value.transpose(1, 2)[0].index_select(0, tree_kv_index)
    groups = q.shape[1] // k.shape[1]  # grouped-query attention: each key head serves `groups` heads
    out = []
    for i in range(len(tree_cu_seqlens_q) - 1):
        qa, qb = int(tree_cu_seqlens_q[i]), int(tree_cu_seqlens_q[i + 1])
        ka, kb = int(tree_cu_seqlens_k[i]), int(tree_cu_seqlens_k[i + 1])
        qs = q[qa:qb].transpose(0, 1)
        ks = k[ka:kb].transpose(0, 1).repeat_interleave(groups, 0)
        vs = v[ka:kb].transpose(0, 1).repeat_interleave(groups, 0)
        n_q, n_k = qb - qa, kb - ka
        visible = torch.arange(n_k, device=q.device)[None, :] <= torch.arange(n_q, device=q.device)[:, None] + (
            n_k - n_q
        )
        out.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=visible, scale=scaling).transpose(0, 1))
    return torch.cat(out, 0).unsqueeze(0), None


@contextlib.contextmanager
def cpu_stand_ins() -> Iterator[None]:
    """AsyncGRPOTrainer (TRL 1.16) on the CPU, for the block: the two things it needs CUDA for,
    replaced (docs/trl-async.md, "What needs CUDA"):

    - `async_grpo_trainer.py` line 1240 calls `get_peak_flops_per_device` (trl/trainer/utils.py
      line 1824: `torch.cuda.get_device_name`), which raises without CUDA: it returns None
      here, what TRL returns for a device it does not know (the MFU metrics are left out);
    - the model is loaded with `attn_implementation="tree_fa3"`, whose `tree_attention`
      (packing.py line 187) calls the FA3 kernel that line 165 fetches from the Hub
      (`kernels-community/flash-attn3`, CUDA only): the name is registered to
      `reference_tree_attention` instead.

    Build the trainer and train inside the block; leaving it restores both."""
    from transformers import AttentionInterface
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    def register() -> None:
        from transformers.masking_utils import AttentionMaskInterface

        AttentionInterface.register(packing.TREE_ATTENTION, reference_tree_attention)
        AttentionMaskInterface.register(packing.TREE_ATTENTION, lambda **kwargs: None)

    saved = (async_grpo_trainer.get_peak_flops_per_device, async_grpo_trainer.register_tree_attention)
    async_grpo_trainer.get_peak_flops_per_device = lambda accelerator, dtype: None
    async_grpo_trainer.register_tree_attention = register
    register()
    try:
        yield
    finally:
        async_grpo_trainer.get_peak_flops_per_device, async_grpo_trainer.register_tree_attention = saved
        packing.register_tree_attention()
