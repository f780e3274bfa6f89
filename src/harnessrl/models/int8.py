"""int8 linear layers for generation on a CPU: `load_policy(spec, dtype="int8")`.

`quantize_int8(model, calibration)` replaces every nn.Linear of a causal LM (the attention and
MLP projections and the output head; the embeddings stay float32) by an `Int8Linear`:

- weights: int8, symmetric, one scale per output channel;
- activations: int8, symmetric, one scale per row (per token), computed on the fly at every call;
- the product: an exact integer matrix multiply (int8 x int8 -> int32, `torch._int_mm`), then
  rescaled to float32. Everything else (norms, attention, softmax, the key/value cache) stays
  float32.

Outlier channels. Small LLMs carry a few input channels whose activations are hundreds of times
larger than the rest (in SmolLM2-135M, up to ~480 against a median of ~0.3 at the last MLP's
down projection). One int8 scale per row then rounds every ordinary channel of that row to a
handful of levels. So each layer keeps the ~2% of its input channels with the largest
activations on a short built-in calibration text (`CALIBRATION`, a few chat turns rendered with
the model's own chat template) in float32: those columns go through a small float matmul, the
others through int8 (the mixed decomposition of LLM.int8(), with the outlier set fixed once at
load time rather than chosen per batch). Which channels carry outliers is mostly a property of
the trained weights, not of the text: for SmolLM2-135M, three quarters of the 2% chosen on this
text were also chosen on an unrelated 100-token one, the others being near the cut.

Per-row activation scales and integer accumulation make a row's result independent of the other
rows in the batch: what depends on the batch is only the float32 rounding elsewhere, as in
float32. But int8 rounding is not smooth: a 1e-7 difference in an activation can move it to
the next level, so the float32 rounding differences between a batched decode and a
teacher-forced pass are amplified, and recorded log-probabilities match a teacher-forced pass of
the same int8 model only approximately (docs/models.md, "Precision").

Why not torch.ao.quantization.quantize_dynamic: it quantizes activations with one scale per
whole input tensor (every row of the batch together, 7 bits on x86), which the outlier channels
above make useless (SmolLM2-135M: mean |logprob difference| to float32 of 1.8 nats per token,
against 0.06 here), makes every row depend on the others in its batch, and the
torch.ao.quantization namespace is deprecated upstream.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

OUTLIER_FRACTION = 0.02  # of each layer's input channels kept in float32
_LEVELS = 127  # symmetric int8: -127..127

# A few chat turns in the shape agent episodes have (instructions, a JSON tool call, a tool
# result, code, numbers, prose): their activations pick each layer's outlier channels.
CALIBRATION: tuple[tuple[tuple[str, str], ...], ...] = (
    (
        (
            "system",
            "You are an agent that solves tasks with tools. Reply with exactly one JSON object per turn: "
            '{"tool": NAME, "args": {...}} to call a tool, or {"answer": TEXT} when you are done.',
        ),
        ("user", "Task: compute (12 + 7) * 3, write the result to result.txt, then report it."),
        ("assistant", '{"tool": "calc", "args": {"expression": "(12 + 7) * 3"}}'),
        ("user", "Tool result (calc):\n57"),
        ("assistant", '{"tool": "write_file", "args": {"path": "result.txt", "content": "57"}}'),
        ("user", "Tool result (write_file):\nwrote 2 bytes to result.txt"),
    ),
    (
        ("user", "def mean(xs):\n    return sum(xs) / len(xs)\n\nWhat does mean([]) do? Fix it in one line."),
        ("assistant", "It raises ZeroDivisionError. Use: return sum(xs) / len(xs) if xs else 0.0"),
        ("user", "The capital of France is Paris. Name three other capitals in Europe, one per line."),
    ),
)


class Int8Unavailable(RuntimeError):
    """This torch build or this model cannot run int8 linear layers."""


def check_available() -> None:
    """Raise Int8Unavailable unless torch can multiply int8 matrices here (a private torch op:
    a build without it fails here, at load time, with a message naming the dtype)."""
    op = getattr(torch, "_int_mm", None)
    if op is None:
        raise Int8Unavailable(
            f"--dtype int8 needs torch._int_mm (int8 matrix multiply), which torch {torch.__version__} lacks; "
            "use --dtype float32 or bfloat16"
        )
    try:
        out = op(torch.ones((1, 8), dtype=torch.int8), torch.ones((8, 8), dtype=torch.int8))
    except Exception as exc:  # noqa: BLE001 - any failure means the op cannot serve us
        raise Int8Unavailable(
            f"--dtype int8: torch._int_mm fails in torch {torch.__version__} ({type(exc).__name__}: {exc}); "
            "use --dtype float32 or bfloat16"
        ) from exc
    if out.dtype != torch.int32 or int(out[0, 0]) != 8:
        raise Int8Unavailable(f"--dtype int8: torch._int_mm of torch {torch.__version__} gives wrong results")


class Int8Linear(nn.Module):
    """y = x W^T + b with W in int8 (per output channel) and x quantized per row at each call;
    the input channels in `outliers` stay float32 (see the module docstring). Inference only:
    the weights are buffers, not parameters."""

    # the buffers registered in __init__, declared for the type checker (nn.Module types them loosely)
    qweight: torch.Tensor
    weight_scale: torch.Tensor
    keep: torch.Tensor
    outliers: torch.Tensor
    outlier_weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear, outliers: torch.Tensor):
        super().__init__()
        weight = linear.weight.detach().to(torch.float32)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        outliers = torch.as_tensor(outliers, dtype=torch.long).flatten().unique()
        keep = torch.ones(self.in_features, dtype=torch.float32)
        keep[outliers] = 0.0
        inliers = weight * keep  # the outlier columns are zero in the int8 weight
        scale = inliers.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / _LEVELS
        qweight = torch.round(inliers / scale[:, None]).clamp_(-_LEVELS, _LEVELS).to(torch.int8)
        self.register_buffer("qweight", qweight.t().contiguous())  # (in, out), as _int_mm wants
        self.register_buffer("weight_scale", scale)
        self.register_buffer("keep", keep)
        self.register_buffer("outliers", outliers)
        self.register_buffer("outlier_weight", weight[:, outliers].t().contiguous())  # (k, out) float32
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).clone()
        self.register_buffer("bias", bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"float32_channels={self.outliers.numel()}, bias={self.bias is not None}"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(torch.float32)
        if rows.shape[0] == 0:
            return rows.new_zeros((*shape[:-1], self.out_features))
        inliers = rows * self.keep if self.outliers.numel() else rows
        scale = inliers.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny) / _LEVELS
        q = torch.round(inliers / scale).clamp_(-_LEVELS, _LEVELS).to(torch.int8)
        y = torch._int_mm(q, self.qweight).to(torch.float32).mul_(scale).mul_(self.weight_scale)
        if self.outliers.numel():
            y.addmm_(rows.index_select(1, self.outliers), self.outlier_weight)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features)


def input_absmax(model: nn.Module, calibration: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """The largest |activation| of every input channel of every nn.Linear over the calibration
    prompts (each run through the model on its own)."""
    found: dict[str, torch.Tensor] = {}

    def record(name: str):
        def hook(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0).to(torch.float32).cpu()
            found[name] = x if name not in found else torch.maximum(found[name], x)

        return hook

    handles = [
        module.register_forward_pre_hook(record(name))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for ids in calibration:
                model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=_device(model)))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return found


def quantize_int8(
    model: nn.Module, calibration: Sequence[Sequence[int]], *, outlier_fraction: float = OUTLIER_FRACTION
) -> dict:
    """Replace every nn.Linear of `model` (on the CPU, float32) by an Int8Linear, in place;
    `calibration`: token id lists whose activations choose each layer's float32 channels.
    Returns what was done (recorded in the policy's description)."""
    check_available()
    if _device(model).type != "cpu":
        raise Int8Unavailable(f"--dtype int8 runs on the CPU; this model is on {_device(model)}")
    if not 0 <= outlier_fraction < 1:
        raise ValueError(f"outlier_fraction must be in [0, 1), got {outlier_fraction}")
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise Int8Unavailable("--dtype int8: the model has no nn.Linear layers to quantize")
    if not calibration:
        raise ValueError("quantize_int8 needs at least one calibration prompt")
    if any(module.weight.dtype != torch.float32 for _, module in linears):
        raise Int8Unavailable("--dtype int8 quantizes a float32 model; this one has other weights")
    absmax = input_absmax(model, calibration)
    channels = 0
    for name, module in linears:
        k = int(outlier_fraction * module.in_features)
        seen = absmax.get(name)
        outliers = seen.topk(k).indices if k and seen is not None else torch.zeros(0, dtype=torch.long)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, Int8Linear(module, outliers))
        channels += outliers.numel()
    try:  # a model whose code reads a linear layer's .weight itself cannot run this way: say so now
        input_absmax(model, [min(calibration, key=len)])
    except Exception as exc:  # noqa: BLE001
        raise Int8Unavailable(
            f"--dtype int8: the model does not run with int8 linear layers ({type(exc).__name__}: {exc})"
        ) from exc
    return {
        "kind": "int8",
        "weights": "int8, one scale per output channel",
        "activations": "int8, one scale per token",
        "layers": len(linears),
        "float32_input_channels": channels,
        "outlier_fraction": outlier_fraction,
    }


def _device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")
