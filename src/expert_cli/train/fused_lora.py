"""LoRA linear layers as one autograd function: the adapter's scale-and-add folded into a GEMM.

peft computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`: three GEMMs, then a scale and
an add over the whole output, each a pass over an activation-sized tensor, in the forward and
again in the backward. Here the update is accumulated into the base projection's output by
the GEMM itself (`addmm_` with `alpha=scaling`, beta 1), and the backward does the same for the
input gradient (d = dropout(x) with its mask m and keep-scale k = 1 / (1 - p); d = x without
dropout):

    xa = d A^T                      y  = x W^T + b;   y += s * xa B^T   (one GEMM, accumulating)
    g  = dy B                       dx = dy W;        dx += s * k * m * (g A)
    dA = s * g^T d                  dB = s * dy^T xa

(without dropout `dx += s * g A` is one accumulating GEMM as well; with it `dx += s k m (g A)` is
one element-wise pass). The dropout mask is drawn with `bernoulli_` from the global generator,
so a checkpointed layer's recomputed forward draws the same mask again (the checkpoint
restores the generator's state); it is not the mask peft's layer would have drawn. Only the
input x is kept for the backward, neither the dropped input d nor the mask: the backward
draws the mask again from the generator state the forward drew it from (bit for bit: the
same kernel from the same state; the global generators are left as they were) and computes
d again with the same kernel the forward used, so A's gradient sees the same d (under
torch.compile's tracing, which cannot read a generator's state, the mask is kept). peft's
layers keep d and the mask for each adapted projection (three bytes an element in bf16 on a
GPU); here the projections that read one input (q, k and v; gate and up) keep that x once,
and dropout keeps nothing more.

Only plain LoRA on a frozen `nn.Linear` base, or on a bitsandbytes 4-bit one (QLoRA), is fused
here (one active adapter, not merged; DoRA has a function of its own, train/fused_dora.py, and
other variants none); any other layer, or a call with adapters disabled or merged, runs peft's
own forward. A 4-bit base's weight W is dequantized
where it is used, in the forward and again in the backward (nothing of its size is kept
between them: the point of a 4-bit base is its memory), as bitsandbytes' own matmul does for
a training-sized batch; peft's 4-bit layer adds a copy of the base output besides. The
matmuls run in the autocast dtype when autocast is on (adapter weights and their gradients
stay fp32), else in the inputs' dtype (without mixed precision a 4-bit weight is dequantized
to it: the adapters keep fp32 as peft's do). A 4-bit layer's output is in its input's dtype,
as bitsandbytes' is; an unquantized one's in the autocast dtype, as nn.Linear's is.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from bitsandbytes.functional import dequantize_4bit
from bitsandbytes.nn import Linear4bit
from bitsandbytes.nn.modules import fix_4bit_weight_quant_state_from_module
from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit
from peft.tuners.lora.layer import Linear as LoraLinear

from expert_cli.train.dequant import dequantize_4bit as one_kernel_dequantize


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in `dtype`: itself when it already is (no call into torch)."""
    return t if t.dtype == dtype else t.to(dtype)


# True: a 4-bit weight is dequantized by train/dequant.py's one Triton kernel instead of
# bitsandbytes' (three kernels for a double-quantized weight); the same weight bit for bit.
# Off until timed on a GPU: scripts/bench_train.py's q_int4_one_kernel sets it
ONE_KERNEL_DEQUANT = False


def _dense(weight: torch.Tensor, quant_state: Any, dtype: torch.dtype) -> torch.Tensor:
    """The base weight [out, in] in `dtype`: a 4-bit one (with its `quant_state`)
    dequantized straight to it (one allocation)."""
    if quant_state is None:
        return _as(weight, dtype)
    if ONE_KERNEL_DEQUANT:
        return one_kernel_dequantize(weight, quant_state, dtype)
    if quant_state.dtype != dtype:
        quant_state = copy.copy(quant_state)
        quant_state.dtype = dtype
    return dequantize_4bit(weight, quant_state)


def draw_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A dropout mask for `x` (True where kept, with probability 1 - p), drawn with
    `bernoulli_` from the device's global generator, and that generator's state before the
    draw (a small CPU tensor: read on the host, no wait for the device), from which
    `mask_again` draws the same mask in the backward instead of keeping it. Under
    torch.compile's tracing (which cannot read a generator's state) the state is None: the
    mask is to be kept."""
    state = None if torch.compiler.is_compiling() else _generator_state(x.device)
    return torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p), state


def kept_mask(mask: torch.Tensor | None, state: torch.Tensor | None) -> torch.Tensor | None:
    """What a forward keeps of its dropout mask: nothing where the backward can draw it
    again from `state`."""
    return mask if state is None else None


def saved_mask(
    kept: torch.Tensor | None, x: torch.Tensor, p: float, state: torch.Tensor | None
) -> torch.Tensor | None:
    """The backward's dropout mask: the one kept, or drawn again from `state` (None without
    dropout)."""
    return kept if state is None else mask_again(x, p, state)


# a generator of expert-cli's own per device, set to a forward's state to draw its mask again
_REDRAW: dict[torch.device, torch.Generator] = {}


def mask_again(x: torch.Tensor, p: float, state: torch.Tensor) -> torch.Tensor:
    """The mask `draw_mask(x, p)` drew from generator state `state`, bit for bit (the same
    kernel from the same state), drawn from a generator of our own: the global generators
    stay where they were."""
    generator = _REDRAW.get(x.device)
    if generator is None:
        generator = _REDRAW[x.device] = torch.Generator(x.device)
    generator.set_state(state)
    return torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p, generator=generator)


def _generator_state(device: torch.device) -> torch.Tensor:
    """The state of the global generator `bernoulli_` draws from on `device` (for CUDA the
    Philox seed and offset, kept on the host: the state torch.utils.checkpoint reads)."""
    if device.type == "cpu":
        return torch.get_rng_state()
    return torch.get_device_module(device.type).get_rng_state(device)


def _dropped(x: torch.Tensor, mask: torch.Tensor, keep: float) -> torch.Tensor:
    """x m / (1 - p): the dropped input, the same bits in the forward and when the backward
    computes it again (one kernel for both: torch's own dropout kernel rounds differently
    from its backward's on some devices)."""
    return torch.ops.aten.native_dropout_backward(x, mask, keep)


class LoraLinearFunction(torch.autograd.Function):
    """y = x W^T + b + s (dropout_p(x) A^T) B^T with the scaled update accumulated by the
    GEMM."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        base: torch.nn.Linear,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scale_dropout: tuple[float, float],
    ) -> torch.Tensor:
        """`base` is frozen: its weight and bias get no gradient. `scale_dropout`: the
        adapter's scale and its input's dropout probability (0 when the layer is not
        training)."""
        scaling, dropout = scale_dropout
        weight, bias = base.weight, base.bias
        x2, w, (a, b), quant_state = compute_operands(x, base, (lora_a, lora_b))
        dtype = x2.dtype
        d, mask, ctx.mask_state, keep = x2, None, None, 1.0
        if dropout > 0:
            keep = 1.0 / (1.0 - dropout)
            mask, ctx.mask_state = draw_mask(x2, dropout)
            d = _dropped(x2, mask, keep)
        xa = F.linear(d, a)
        y = F.linear(x2, w, None if bias is None else _as(bias, dtype))
        y.addmm_(xa, b.t(), alpha=scaling)
        # the adapter weights in the compute dtype are kept for the backward (r x features:
        # small), so that it casts nothing but the two gradients back; with dropout the
        # input, not the dropped input, and not the mask either: the backward draws it again
        # from the generator's state (a 4-bit weight is kept packed, with its quantization
        # state)
        ctx.save_for_backward(x2, xa, weight, a, b, kept_mask(mask, ctx.mask_state))
        ctx.dropout = dropout
        return layer_output(ctx, x, y, quant_state, (scaling, keep))

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return outside_autocast(dy.device.type, _backward, ctx, dy)


def compute_operands(x: torch.Tensor, base: torch.nn.Module, adapters: tuple) -> tuple:
    """(x as [tokens, in], the base weight dense, the `adapters` weights), all in the compute
    dtype, and the base weight's 4-bit quantization state (None unless 4-bit). Every operand
    is cast to the compute dtype here, which is autocast's own when it is on: its casts find
    nothing to do, so it is left on (entering a context to turn it off costs host time at
    each of 196 layers, forward and backward). A cast is asked for only where the dtype
    differs: on a launch-bound GPU step the host's time per call counts, and a cast to the
    same dtype still costs a call."""
    weight = base.weight
    quant_state = weight.quant_state if isinstance(base, Linear4bit) else None
    dtype = _compute_dtype(x)
    x2 = _as(x.reshape(-1, x.shape[-1]), dtype)
    return (
        x2,
        _dense(weight, quant_state, dtype),
        tuple(_as(t, dtype) for t in adapters),
        quant_state,
    )


def layer_output(
    ctx: Any, x: torch.Tensor, y: torch.Tensor, quant_state: Any, scale_keep: tuple
) -> torch.Tensor:
    """`y` ([tokens, out]) as the layer's output for input `x`, with what the backward reads
    of the call kept on `ctx`: the adapter's scale, the dropout's keep-scale, x's shape and
    dtype and the 4-bit weight's quantization state. A 4-bit layer's output is in the
    input's dtype, as bitsandbytes' layer gives it."""
    ctx.scaling, ctx.keep_scale = scale_keep
    ctx.x_shape, ctx.x_dtype, ctx.quant_state = x.shape, x.dtype, quant_state
    if quant_state is not None:
        y = _as(y, x.dtype)
    return y.view(*x.shape[:-1], y.shape[-1])


def outside_autocast(device: str, backward: Any, *args: Any) -> Any:
    """`backward(*args)`, with autocast off where the backward was called under it (the
    forward chose each dtype; autocast would cast again)."""
    if torch.is_autocast_enabled(device):
        with torch.autocast(device, enabled=False):
            return backward(*args)
    return backward(*args)


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """LoraLinearFunction's backward (a function of its own: torch.compile traces a Function's
    backward and refuses a call of the Function's own method inside it)."""
    x2, xa, weight, a, b, kept = ctx.saved_tensors
    mask = saved_mask(kept, x2, ctx.dropout, ctx.mask_state)
    s = ctx.scaling
    dy2 = _as(dy.reshape(-1, dy.shape[-1]), x2.dtype)
    g = dy2 @ b
    dx = None
    if ctx.needs_input_grad[0]:
        dx = dy2 @ _dense(weight, ctx.quant_state, x2.dtype)
        if mask is None:
            dx.addmm_(g, a, alpha=s)
        else:  # through the dropout: kept entries scaled by s / (1 - p), dropped ones 0
            dx.addcmul_(g @ a, mask, value=s * ctx.keep_scale)
        dx = _as(dx.view(ctx.x_shape), ctx.x_dtype)
    # s * (g^T d) and s * (dy^T xa) as one GEMM each: with beta 0 the first argument
    # (a tensor of the result's shape) only gives the shape and is not read. They are
    # returned in the compute dtype: autograd casts a gradient to its parameter's dtype (the
    # fp32 master weights) itself, without a Python call
    d_a = None
    if ctx.needs_input_grad[2]:
        d = x2 if mask is None else _dropped(x2, mask, ctx.keep_scale)
        d_a = torch.addmm(a, g.t(), d, beta=0, alpha=s)
    d_b = torch.addmm(b, dy2.t(), xa, beta=0, alpha=s) if ctx.needs_input_grad[3] else None
    return dx, None, d_a, d_b, None


def _fusable_base(module: torch.nn.Module) -> bool:
    """peft's LoRA linear on a frozen nn.Linear, or its 4-bit layer on a bitsandbytes 4-bit
    linear whose weight is quantized as [out, in] (and not repacked for the CPU's inference
    kernel)."""
    base = getattr(module, "base_layer", None)
    if base is None or (base.bias is not None and base.bias.requires_grad):
        return False  # a trained base bias: its gradient is not computed here
    if isinstance(module, LoraLinear) and type(base) is torch.nn.Linear:
        return not module.fan_in_fan_out and not base.weight.requires_grad
    if not isinstance(module, LoraLinear4bit):
        return False
    state = getattr(getattr(base, "weight", None), "quant_state", None)
    return (
        isinstance(base, Linear4bit)
        and state is not None
        and list(state.shape) == [base.out_features, base.in_features]
        and not getattr(state, "packing_format_for_cpu", False)
    )


def _plain(module: torch.nn.Module, name: str, variant: type | None = None) -> bool:
    """Whether adapter `name` of `module` is plain LoRA (or, with `variant`, LoRA with that
    peft variant exactly: DoRA's): no other variant, no bias on B, dropout or none."""
    variants = getattr(module, "lora_variant", {})
    if type(variants.get(name)) is not (variant or type(None)):
        return False
    if getattr(module, "lora_bias", {}).get(name):
        return False
    return type(module.lora_dropout[name]) in (torch.nn.Identity, torch.nn.Dropout)


def fusable(module: torch.nn.Module, variant: type | None = None) -> bool:
    """Plain LoRA (or LoRA with `variant`) with one adapter (dropout or none) on a frozen
    nn.Linear or a bitsandbytes 4-bit linear."""
    if not _fusable_base(module):
        return False
    names = list(module.lora_A.keys())
    return len(names) == 1 and _plain(module, names[0], variant)


def active_adapter(self: LoraLinear, args: tuple, kwargs: dict, variant: type | None) -> str | None:
    """The one adapter a call of layer `self` runs, where it is plain LoRA (or LoRA with
    `variant`); None where it is not (disabled, merged, an adapter added since, extra
    arguments, a 4-bit weight repacked for the CPU's inference kernel) and peft's forward
    runs."""
    active = self.active_adapters
    base = self.base_layer
    if isinstance(base, Linear4bit):  # its quant state, where FSDP re-wrapped the weight
        fix_4bit_weight_quant_state_from_module(base)
    if (
        self.disable_adapters
        or self.merged
        or args
        or kwargs
        or len(active) != 1
        or active[0] not in self.lora_A
        or not _plain(self, active[0], variant)
        or getattr(getattr(base.weight, "quant_state", None), "packing_format_for_cpu", False)
    ):
        return None
    return active[0]


def scale_dropout(self: LoraLinear, name: str) -> tuple[float, float]:
    """Adapter `name`'s scale, and its input's dropout probability (0 when not training)."""
    dropout = self.lora_dropout[name]
    p = float(dropout.p) if isinstance(dropout, torch.nn.Dropout) and dropout.training else 0.0
    return float(self.scaling[name]), p


def fused_call(self: LoraLinear, args: tuple, kwargs: dict) -> tuple | None:
    """The fused function's arguments after the input for a call of layer `self` (its base, A, B
    and (scale, dropout)), or None where the call is not plain LoRA of one adapter and peft's
    forward runs."""
    name = active_adapter(self, args, kwargs, None)
    if name is None:
        return None
    weights = self.lora_A[name].weight, self.lora_B[name].weight
    return self.base_layer, *weights, scale_dropout(self, name)


def fused_layer_forward(call: Callable[..., tuple | None], function: type) -> Callable[..., Any]:
    """A layer's forward that runs the autograd `function` on the input and what `call`
    gives for the call, or the layer's own (peft's) forward where `call` gives None."""

    def forward(self: torch.nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        arguments = call(self, args, kwargs)
        if arguments is None:
            return type(self).forward(self, x, *args, **kwargs)
        return function.apply(x, *arguments)

    forward.fused_lora = True  # type: ignore[attr-defined]
    return forward


# the fused function, or peft's forward where the call is not plain LoRA of one adapter
_fused_forward = fused_layer_forward(fused_call, LoraLinearFunction)


def is_fused(module: torch.nn.Module) -> bool:
    """Whether `module` runs a fused forward (plain LoRA's, grouped or not, or DoRA's)."""
    forward = module.__dict__.get("forward")
    return getattr(getattr(forward, "__func__", None), "fused_lora", False)


def runs_plain_fused(module: torch.nn.Module) -> bool:
    """Whether `module` runs the plain LoRA layers' fused forward (not grouped, not DoRA)."""
    forward = module.__dict__.get("forward")
    return getattr(forward, "__func__", None) is _fused_forward


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Give every fusable LoRA linear layer of `model` the fused forward (in place); returns
    how many were switched."""
    return switch_forwards(model, fusable, _fused_forward)


def switch_forwards(
    model: torch.nn.Module, fits: Callable[[torch.nn.Module], bool], forward: Callable
) -> int:
    """Give every module of `model` that `fits` the `forward` (in place); how many."""
    switched = 0
    for module in model.modules():
        if fits(module):
            module.forward = types.MethodType(forward, module)
            switched += 1
    return switched


def unfused_bases(model: torch.nn.Module) -> str:
    """The type names, joined, of the base layers of `model`'s LoRA layers that do not run
    the fused forward, with how many of each ("12 Conv1D"); empty when every one does."""
    left: dict[str, int] = {}
    for module in model.modules():
        if hasattr(module, "lora_A") and hasattr(module, "get_base_layer") and not is_fused(module):
            name = type(module.get_base_layer()).__name__
            left[name] = left.get(name, 0) + 1
    return " and ".join(f"{n} {name}" for name, n in sorted(left.items()))
