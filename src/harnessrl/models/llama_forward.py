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
  `Int8Linear` (harnessrl.models.int8) its int8 product;
- a peft LoRA layer (`merge_lora`, on by default) takes one product with a copy of its base weight
  plus its active adapters' `scaling * B @ A`, fused with its neighbours like a plain layer and
  rebuilt when the base or an adapter weight changes, an adapter is switched off or on, or the
  engine's cache is cleared: through the adapter's own forward a decode step of `smollm2-135m`
  with LoRA on q/k/v/o took 1.55x as long (bench/lora_decode.py). Only plain LoRA is merged (no
  dropout in effect, no bias on B, no DoRA or other variant, a float32 `nn.Linear` base); any other
  wrapper runs its own forward.

The floats equal the model's own forward up to float rounding (the tests compare greedy tokens
with `model.generate` and log-probabilities with a teacher-forced pass); a merged LoRA product
rounds differently from the adapter's two small products added to the base one (log-probabilities
within 1e-4 of them in the tests). `supports(model)` says
where it applies: a transformers `LlamaForCausalLM` (model_type "llama") with SiLU MLPs, default
or scaled rotary embeddings, on the CPU, without hooks on the model. Anything else, and any
device other than the CPU, runs the model's own forward as before.
"""

from __future__ import annotations

from typing import Any, cast

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


def _lora_adapters(module: Any) -> list[tuple[nn.Linear, nn.Linear, float]] | None:
    """The (lora_A, lora_B, scaling) of each adapter a peft LoRA linear layer adds to its base
    layer's product now ([] while its adapters are off, or merged into the base weight by peft), or
    None where its product is not that sum or not one the engine merges: a module that is no peft
    LoRA layer, a base that is not a float32 `nn.Linear`, dropout in effect, a bias on lora_B, a
    DoRA or other variant, adapters switched off after peft merged them."""
    base = getattr(module, "base_layer", None)
    lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
    if not isinstance(lora_a, nn.ModuleDict) or not isinstance(lora_b, nn.ModuleDict):
        return None
    if type(base) is not nn.Linear or base.weight.dtype != torch.float32 or getattr(module, "fan_in_fan_out", False):
        return None
    merged = bool(getattr(module, "merged", False))
    if getattr(module, "disable_adapters", False):
        return None if merged else []  # (peft's forward unmerges a merged one: left to it)
    if merged:
        return []
    adapters: list[tuple[nn.Linear, nn.Linear, float]] = []
    for name in module.active_adapters:
        if name not in lora_a:
            continue
        if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name):
            return None
        a, b, dropout = lora_a[name], lora_b[name], module.lora_dropout[name]
        if type(a) is not nn.Linear or type(b) is not nn.Linear or a.bias is not None or b.bias is not None:
            return None
        if a.weight.dtype != torch.float32 or b.weight.dtype != torch.float32:
            return None
        if not (isinstance(dropout, nn.Identity) or (isinstance(dropout, nn.Dropout) and not dropout.training)):
            if not (isinstance(dropout, nn.Dropout) and dropout.p == 0):
                return None
        adapters.append((a, b, float(module.scaling[name])))
    return adapters


def _adapter_state(modules: list[Any]) -> tuple:
    """What decides which adapters a peft LoRA layer adds, for each of `modules` (read every step:
    switching an adapter off changes no parameter, so the weights watch does not see it)."""
    return tuple(
        (m.disable_adapters, m.merged, tuple(m.active_adapters), tuple(m.scaling.values()), m.training) for m in modules
    )


class _Fused:
    """One product standing for several linear layers that read the same input: their weights
    (and biases) concatenated along the outputs, rebuilt when any of them changed (each output
    is the same dot product as in its own layer's product, so the floats are the same). A peft
    LoRA layer (`_lora_adapters`) stands in with its base weight plus its adapters' products merged.
    `pack_rows`:
    lay the concatenation out for oneDNN's prepacked product (harnessrl.models.packed) at that
    many rows; None: a plain matrix."""

    def __init__(self, modules: list[nn.Module], pack_rows: int | None):
        self.modules = modules
        self.pack_rows = pack_rows
        self.key: tuple | None = None
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    @staticmethod
    def _parts(module: nn.Module) -> tuple[nn.Linear, list[tuple[nn.Linear, nn.Linear, float]]]:
        if type(module) is nn.Linear:
            return module, []
        adapters = _lora_adapters(module)
        assert adapters is not None  # (`_fusable` said so; the state is read again every step)
        return cast("nn.Linear", module.base_layer), adapters

    def refresh(self) -> None:
        parts = [self._parts(m) for m in self.modules]
        key = tuple(
            (id(base.weight), base.weight._version)
            + tuple((id(a.weight), a.weight._version, id(b.weight), b.weight._version, s) for a, b, s in adapters)
            for base, adapters in parts
        )
        if key == self.key:
            return
        with torch.no_grad():
            weights = []
            for base, adapters in parts:
                weight = base.weight.detach()
                for a, b, scaling in adapters:  # W + scaling * B @ A, as peft merges it
                    weight = torch.addmm(weight, b.weight.detach(), a.weight.detach(), alpha=scaling)
                weights.append(weight)
            weight = torch.cat(weights).contiguous() if len(weights) > 1 else weights[0].contiguous()
            if self.pack_rows is not None:
                weight = torch.ops.mkldnn._reorder_linear_weight(weight, self.pack_rows)
            self.weight = weight
            biases = [base.bias for base, _ in parts]
            if all(b is None for b in biases):
                self.bias = None
            else:
                zeros = [base.weight.new_zeros(base.out_features) for base, _ in parts]
                self.bias = torch.cat([z if b is None else b.detach() for z, b in zip(zeros, biases)])
        self.key = key

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.pack_rows is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        assert self.weight is not None  # (refreshed before every step)
        return F.linear(x, self.weight, self.bias)

    def drop(self) -> None:
        self.key = self.weight = self.bias = None


def _fusable(modules: list[nn.Module], merge_lora: bool) -> bool:
    return all(
        (type(m) is nn.Linear and m.weight.dtype == torch.float32) or (merge_lora and _lora_adapters(m) is not None)
        for m in modules
    )


class LlamaDecode:
    """Decode steps of a Llama model (see the module docstring). `fuse`: concatenate q/k/v and
    gate/up weights (float32 `nn.Linear` only; another copy of those weights), prepacked for
    `pack_rows` rows when given. `merge_lora` (with `fuse`): a peft LoRA layer's product with its
    adapters merged into a copy of its base weight (another copy of the adapted weights)."""

    def __init__(self, model, *, fuse: bool = True, merge_lora: bool = True, packed=None, attention_function=None):
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
        self.merge_lora = merge_lora
        self.layers: list[tuple] = []
        self.fused: list[_Fused] = []
        self.wraps_linears = False
        self._stale = True
        self._lora: list[nn.Module] = []  # the LoRA layers merged into fused products
        self._lora_state: tuple = ()

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
            if not (self.fuse and _fusable(modules, self.merge_lora)):
                return modules
            return before.get(tuple(map(id, modules))) or _Fused(modules, pack_rows)

        def single(module: nn.Module):
            """A plain layer as it is (its own, or packed, product); a LoRA layer merged."""
            if type(module) is nn.Linear or not (self.fuse and _fusable([module], self.merge_lora)):
                return module
            return before.get((id(module),)) or _Fused([module], pack_rows)

        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    layer.input_layernorm,
                    group([attn.q_proj, attn.k_proj, attn.v_proj]),
                    attn,
                    single(attn.o_proj),
                    layer.post_attention_layernorm,
                    group([mlp.gate_proj, mlp.up_proj]),
                    single(mlp.down_proj),
                )
            )
        self.fused = [part for layer in self.layers for part in layer if isinstance(part, _Fused)]
        for fused in self.fused:
            fused.refresh()
        # every peft LoRA layer, merged or not (one that could not be merged may be at the next step)
        self._lora = []
        if self.fuse and self.merge_lora:
            for layer in inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                for m in (
                    attn.q_proj,
                    attn.k_proj,
                    attn.v_proj,
                    attn.o_proj,
                    mlp.gate_proj,
                    mlp.up_proj,
                    mlp.down_proj,
                ):
                    if isinstance(getattr(m, "lora_A", None), nn.ModuleDict):
                        self._lora.append(m)
        self._lora_state = _adapter_state(self._lora)
        called = [self.lm_head]
        for _, qkv, _, o_proj, _, gate_up, down in self.layers:
            called += [part for part in (o_proj, down) if not isinstance(part, _Fused)]
            for group_ in (qkv, gate_up):
                if not isinstance(group_, _Fused):
                    called += group_
        # a wrapper (a LoRA layer, ...) runs an nn.Linear inside its forward: that one takes the
        # packed product only where the packed forwards are installed (PackedLinears.swapped_in)
        self.wraps_linears = any(type(m) is not nn.Linear for m in called)

    def prepare(self) -> bool:
        """Ready the next step (reading the modules again after `weights_changed`); whether its
        layers call linear layers inside wrappers (see `wraps_linears`)."""
        if self._lora and _adapter_state(self._lora) != self._lora_state:
            self._stale = True  # an adapter switched off or on: merged again (or not at all)
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
        for li, (norm1, qkv_proj, attn, o_proj, norm2, gate_up_proj, down_proj) in enumerate(self.layers):
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
            h = h + (o_proj(attended) if isinstance(o_proj, _Fused) else linear(o_proj, attended))
            x = _rms_norm(h, norm2)
            if isinstance(gate_up_proj, _Fused):
                gate, up = gate_up_proj(x).chunk(2, dim=-1)
            else:
                gate, up = linear(gate_up_proj[0], x), linear(gate_up_proj[1], x)
            down_in = F.silu(gate) * up
            h = h + (down_proj(down_in) if isinstance(down_proj, _Fused) else linear(down_proj, down_in))
        return linear(self.lm_head, _rms_norm(h, self.norm)).float()


def _rms_norm(h: torch.Tensor, norm) -> torch.Tensor:
    """transformers' LlamaRMSNorm of float32 rows, the same operations in the same order (so the
    same floats); torch's fused rms_norm rounds differently and was no faster here."""
    return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
