"""The engine's own decode forward for Llama-family models on a CPU.

A decode step of one or a few rows reads every weight once and does little arithmetic with it,
so on a CPU it should take about as long as reading the weights. Through the model's own
`forward` it takes about twice that: transformers' modules, masks, cache adapter and attention
dispatch cost ~16 ms of Python per step on a 30-layer model, which is as long as the weights
take to read. `LlamaDecode` runs the same computation without them:

- per layer: torch's fused `rms_norm`, the q/k/v projections as one product (their weights
  concatenated once, refreshed when a weight changes), one rotary operation on the queries and
  keys together, the new key and value written into the batch cache with one indexed copy, the
  engine's decode attention (harnessrl.models.attention, with the step's plan), the output
  projection added to the residual in the same product (`addmm`), and gate/up as one product;
- each linear layer is called through its `forward` (no module dispatch or hooks): a float32
  `nn.Linear` takes its prepacked weights when the engine's `packed_decode` is on, an
  `Int8Linear` (harnessrl.models.int8) its int8 product.

The floats equal the model's own forward up to float rounding (the tests compare greedy tokens
with `model.generate` and log-probabilities with a teacher-forced pass). `supports(model)` says
where it applies: a transformers `LlamaForCausalLM` (model_type "llama") with SiLU MLPs, default
or scaled rotary embeddings, on the CPU, without hooks on the model. Anything else, and any
device other than the CPU, runs the model's own forward as before.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from harnessrl.models import attention, decode_kernel


def supports(model) -> bool:
    """Whether `LlamaDecode` can run this model's decode steps."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) != "llama":
        return False
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "pretraining_tp", 1) > 1:
        return False
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or first.dtype != torch.float32:
        return False
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(inner, name) for name in needed) or not hasattr(model, "lm_head"):
        return False
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return False
        if not all(hasattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return False
        if not all(hasattr(mlp, p) for p in ("gate_proj", "up_proj", "down_proj")):
            return False
    return True


def _has_hooks(model) -> bool:
    return bool(model._forward_hooks or model._forward_pre_hooks)


class _Fused:
    """One product standing for several linear layers that read the same input: their weights
    (and biases) concatenated along the outputs, rebuilt when any of them changed (each output
    is the same dot product as in its own layer's product, so the floats are the same).
    `pack_rows`:
    lay the concatenation out for oneDNN's prepacked product (harnessrl.models.packed) at that
    many rows; None: a plain matrix."""

    def __init__(self, modules: list[nn.Linear], pack_rows: int | None):
        self.modules = modules
        self.pack_rows = pack_rows
        self.key: tuple | None = None
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def refresh(self) -> None:
        key = tuple((id(m.weight), m.weight._version) for m in self.modules)
        if key == self.key:
            return
        with torch.no_grad():
            weight = torch.cat([m.weight.detach() for m in self.modules]).contiguous()
            if self.pack_rows is not None:
                weight = torch.ops.mkldnn._reorder_linear_weight(weight, self.pack_rows)
            self.weight = weight
            biases = [m.bias for m in self.modules]
            if all(b is None for b in biases):
                self.bias = None
            else:
                zeros = [m.weight.new_zeros(m.out_features) for m in self.modules]
                self.bias = torch.cat([z if b is None else b.detach() for z, b in zip(zeros, biases)])
        self.key = key

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.pack_rows is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        assert self.weight is not None  # (refreshed before every step)
        return F.linear(x, self.weight, self.bias)

    def drop(self) -> None:
        self.key = self.weight = self.bias = None


def _fusable(modules: list[nn.Module]) -> bool:
    return all(type(m) is nn.Linear and m.weight.dtype == torch.float32 for m in modules)


class LlamaDecode:
    """Decode steps of a Llama model (see the module docstring). `fuse`: concatenate q/k/v and
    gate/up weights (float32 `nn.Linear` only; another copy of those weights), prepacked for
    `pack_rows` rows when given."""

    def __init__(self, model, *, fuse: bool = True, packed=None, attention_function=None):
        self.model = model
        self.attend = attention_function  # the model's own, for steps without a decode plan
        self.packed = packed  # harnessrl.models.packed.PackedLinears, or None
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self.scale = self.head_dim**-0.5
        self.fuse = fuse
        self.layers: list[tuple] = []
        self.fused: list[_Fused] = []
        self.wraps_linears = False
        self._stale = True

    def _build(self) -> None:
        """Read the model's modules (again: a module may have been replaced, as quantize_int8 or
        an adapter does), keeping the fused copies of groups whose modules are the same."""
        inner = self.model.model
        self.embed, self.norm, self.rotary, self.lm_head = (
            inner.embed_tokens,
            inner.norm,
            inner.rotary_emb,
            self.model.lm_head,
        )
        pack_rows = self.packed.rows if self.packed is not None else None
        before = {tuple(map(id, f.modules)): f for f in self.fused}

        def group(modules: list[nn.Module]):
            if not (self.fuse and _fusable(modules)):
                return modules
            linears = cast("list[nn.Linear]", modules)
            return before.get(tuple(map(id, modules))) or _Fused(linears, pack_rows)

        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    layer.input_layernorm,
                    group([attn.q_proj, attn.k_proj, attn.v_proj]),
                    attn,
                    layer.post_attention_layernorm,
                    group([mlp.gate_proj, mlp.up_proj]),
                    mlp.down_proj,
                )
            )
        self.fused = [part for layer in self.layers for part in layer if isinstance(part, _Fused)]
        for fused in self.fused:
            fused.refresh()
        called = [self.lm_head]
        for _, qkv, attn, _, gate_up, down in self.layers:
            called += [attn.o_proj, down]
            for group_ in (qkv, gate_up):
                if not isinstance(group_, _Fused):
                    called += group_
        # a wrapper (a LoRA layer, ...) runs an nn.Linear inside its forward: that one takes the
        # packed product only where the packed forwards are installed (PackedLinears.swapped_in)
        self.wraps_linears = any(type(m) is not nn.Linear for m in called)

    def prepare(self) -> bool:
        """Ready the next step (reading the modules again after `weights_changed`); whether its
        layers call linear layers inside wrappers (see `wraps_linears`)."""
        if self._stale:
            self._build()
            self._stale = False
        return self.wraps_linears

    def usable(self) -> bool:
        """False while something (a hook) must see the model's own forward."""
        return not _has_hooks(self.model)

    def weights_changed(self) -> None:
        """Some weight or module may have changed: the next step reads the modules again and
        rebuilds the fused copies of the weights that changed."""
        self._stale = True

    def clear(self) -> None:
        """Forget the fused copies (a `.data` assignment keeps a weight's identity and version)."""
        for fused in self.fused:
            fused.drop()
        self._stale = True

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv: torch.Tensor,
        kv_len: int,
        plan: attention.DecodePlan | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Last-token logits (rows, vocab), float32. `input_ids`, `positions`: (rows,) long, the
        fed token of each row and its slot; `kv`: the batch cache (layers, 2, rows, kv_heads,
        capacity, head_dim), the new keys and values are written at `positions`; `plan`: the
        engine's decode attention plan, or None for plain attention with `mask` (rows, 1, 1,
        kv_len) bool."""
        self.prepare()
        packs = self.packed.packed_weights() if self.packed is not None else {}

        def linear(module, x):
            pack = packs.get(id(module))
            if pack is None:
                return module.forward(x)
            return torch.ops.mkldnn._linear_pointwise(x, pack[1], module.bias, "none", [], "")

        n = input_ids.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        q_width, k_width = heads * dim, kv_heads * dim
        h = self.embed.forward(input_ids)  # (n, hidden)
        cos, sin = self.rotary(h, positions.unsqueeze(0))  # (1, n, dim)
        half = dim // 2
        cos = cos.view(n, 1, dim)
        # rotate_half(x) * sin == x with its halves swapped, times sin with its first half negated
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).view(n, 1, dim)
        rows = torch.arange(n, device=input_ids.device)
        slot = int(positions[0]) if n == 1 else None  # one row: a plain copy into its slot
        kernel = None
        if plan is not None and plan.own is not None and plan.shared == 0:
            # the rows' whole context in the compiled kernel, called here without its checks
            # (the plan's counts come from the rows' lengths): numpy views made once per step
            kernel = decode_kernel.raw_kernel()
            kv_np = kv.numpy()
            counts = plan.own
            group = heads // kv_heads
            out = torch.empty((n, kv_heads, group, dim), dtype=torch.float32)
            lse = torch.empty((n, kv_heads, group), dtype=torch.float32)
            out_np, lse_np, scale = out.numpy(), lse.numpy(), np.float32(self.scale)
        for li, (norm1, qkv_proj, attn, norm2, gate_up_proj, down_proj) in enumerate(self.layers):
            x = _rms_norm(h, norm1)
            qkv = qkv_proj(x) if isinstance(qkv_proj, _Fused) else torch.cat([linear(p, x) for p in qkv_proj], dim=-1)
            qk = qkv[:, : q_width + k_width].view(n, heads + kv_heads, dim)
            swapped = qk.view(n, heads + kv_heads, 2, half).flip(2).view(n, heads + kv_heads, dim)
            qk = qk * cos + swapped * sin  # (the model's q * cos + rotate_half(q) * sin, as it rounds)
            new_kv = torch.stack((qk[:, heads:], qkv[:, q_width + k_width :].view(n, kv_heads, dim)))
            layer_kv = kv[li]  # (2, rows, kv_heads, capacity, dim)
            if slot is not None:
                layer_kv[:, 0, :, slot].copy_(new_kv[:, 0])
            else:
                layer_kv[:, rows, :, positions] = new_kv.transpose(0, 1)
            if kernel is not None:
                q = qk[:, :heads].reshape(n, kv_heads, group, dim).contiguous().numpy()
                kernel(q, kv_np[li, 0, :n], kv_np[li, 1, :n], counts, 0, scale, out_np, lse_np)
                attended = out.view(n, q_width)
            else:
                query = qk[:, :heads].unsqueeze(2)
                key, value = layer_kv[0, :n, :, :kv_len], layer_kv[1, :n, :, :kv_len]
                if plan is not None:
                    attended = attention.decode_attention(query, key, value, plan, self.scale)
                else:  # the model's own attention function, as its forward would call it
                    attended = self.attend(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling)[0]
                attended = attended.reshape(n, q_width)
            h = h + linear(attn.o_proj, attended)
            x = _rms_norm(h, norm2)
            if isinstance(gate_up_proj, _Fused):
                gate, up = gate_up_proj(x).chunk(2, dim=-1)
            else:
                gate, up = linear(gate_up_proj[0], x), linear(gate_up_proj[1], x)
            h = h + linear(down_proj, F.silu(gate) * up)
        return linear(self.lm_head, _rms_norm(h, self.norm)).float()


def _rms_norm(h: torch.Tensor, norm) -> torch.Tensor:
    """transformers' LlamaRMSNorm of float32 rows, the same operations in the same order (so the
    same floats); torch's fused rms_norm rounds differently and was no faster here."""
    return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
