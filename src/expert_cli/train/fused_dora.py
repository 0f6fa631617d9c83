"""DoRA linear layers as one autograd function: the magnitude applied to the weights, not to
the activations.

peft's DoRA layer computes, with m the trained magnitude (one per output), n = ||W + s B A|| of
each output row (detached from the gradient, as the DoRA paper's section 4.3 advises),
c = m / n and d the dropped input:

    y = x W^T + b + (c - 1) * (d W^T) + c * s * (d A^T) B^T

Each term is an activation-sized tensor scaled and added in a pass of its own, forward and
backward, and under bf16 autocast they come out in fp32 (the magnitude is fp32: the products
are promoted), so what follows reads fp32 activations; B A is built every forward by passing
an identity matrix of the input's width through both adapter weights. HiveLLM's experts are
DoRA. Here, with z = d W^T + s xa B^T (xa = d A^T) accumulated by its GEMMs, and c applied to
weights (W_c = c W, B_c = c B: weight-sized, computed in fp32, written in the compute dtype):

    no dropout (d = x):  y = c * z + b                               (one pass over z)
    with dropout:        y = x W^T + b;  y += s xa B^T;  y += (c - 1) * z

    g  = dy B_c                       dA = s g^T d;    dB = s c * (dy^T xa)
    dx = dy W_c;  dx += s g A         (no dropout)
    dx = dy W;    dx += k M * (dy W_{c-1} + s g A)    (dropout: mask M, keep-scale k)
    dm = colsum(dy * z) / n

z is kept for the magnitude's gradient. The output y, from which z could be had, is not: the
next layer may write over what it keeps (Liger's SwiGLU backward writes the gate's and the
up projection's gradients into their outputs). With dropout the base weight meets both x and
d, in the forward and in the backward, as in peft's layer. The dropout mask is drawn as the
fused LoRA linear draws it, and drawn again in the backward rather than kept.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora.variants import DoraLinearVariant

from expert_cli.train.fused_lora import (
    _as,
    _dense,
    _dropped,
    active_adapter,
    compute_operands,
    draw_mask,
    fusable,
    fuse_lora_linears,
    fused_layer_forward,
    kept_mask,
    layer_output,
    outside_autocast,
    saved_mask,
    scale_dropout,
    switch_forwards,
)


def _scaled(t: torch.Tensor, c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row of `t` times c, computed in fp32 (c is), written in `dtype`: one kernel."""
    return torch.mul(t, c[:, None], out=torch.empty(t.shape, dtype=dtype, device=t.device))


def _row_norms(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """||W + s B A|| of each output row, summed in fp32 over W + s B A in the compute dtype
    (as peft's layer computes it; no gradient: DoRA detaches it). Written to `out`: CUDA's
    autocast casts the norm's input to fp32 first (a weight-sized copy a layer), and has no
    rule for the `out=` form; the sums are the same."""
    m = torch.addmm(w, b, a, alpha=scaling)
    out = torch.empty(m.shape[0], dtype=torch.float32, device=m.device)
    return torch.linalg.vector_norm(m, dim=1, dtype=torch.float32, out=out)


class DoraLinearFunction(torch.autograd.Function):
    """y = x W^T + b + (c - 1) (d W^T) + c s (d A^T) B^T with c = m / ||W + s B A|| per
    output, d = dropout_p(x) (y = c x (W + s B A)^T + b without dropout)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        magnitude: torch.Tensor,
        layer: tuple[torch.nn.Module, float, float],
    ) -> torch.Tensor:
        """`layer`: the frozen base layer, the adapter's scale and its input's dropout
        probability (0 when the layer is not training)."""
        base, scaling, dropout = layer
        x2, w, (a, b), quant_state = compute_operands(x, base, (lora_a, lora_b))
        dtype = x2.dtype
        bias = None if base.bias is None else _as(base.bias, dtype)
        norms = _row_norms(w, a, b, scaling)  # fp32
        c = magnitude.detach().float() / norms
        b_c = _scaled(b, c, dtype)
        mask, ctx.mask_state, keep, d = None, None, 1.0, x2
        if dropout > 0:
            keep = 1.0 / (1.0 - dropout)
            mask, ctx.mask_state = draw_mask(x2, dropout)
            d = _dropped(x2, mask, keep)
        xa = F.linear(d, a)
        z = F.linear(d, w)
        z.addmm_(xa, b.t(), alpha=scaling)
        if mask is None:  # y = c z + b
            y = torch.empty_like(z)
            torch.mul(z, c, out=y) if bias is None else torch.addcmul(bias, z, c, out=y)
        else:  # y = x W^T + b + s xa B^T + (c - 1) z
            y = F.linear(x2, w, bias)
            y.addmm_(xa, b.t(), alpha=scaling)
            y.addcmul_(z, c - 1.0)
        ctx.save_for_backward(
            x2, xa, base.weight, a, b_c, c, norms, kept_mask(mask, ctx.mask_state), z
        )
        ctx.dropout = dropout
        return layer_output(ctx, x, y, quant_state, (scaling, keep))

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return outside_autocast(dy.device.type, _backward, ctx, dy)


def _backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """DoraLinearFunction's backward."""
    x2, xa, weight, a, b_c, c, norms, kept, z = ctx.saved_tensors
    mask = saved_mask(kept, x2, ctx.dropout, ctx.mask_state)
    s = ctx.scaling
    dtype = x2.dtype
    dy2 = _as(dy.reshape(-1, dy.shape[-1]), dtype)
    g = dy2 @ b_c
    dx = None
    if ctx.needs_input_grad[0]:
        w = _dense(weight, ctx.quant_state, dtype)  # dequantized only where it is used
        if mask is None:
            dx = dy2 @ _scaled(w, c, dtype)
            dx.addmm_(g, a, alpha=s)
        else:
            through = dy2 @ _scaled(w, c - 1.0, dtype)
            through.addmm_(g, a, alpha=s)
            dx = dy2 @ w
            dx.addcmul_(through, mask, value=ctx.keep_scale)
        dx = _as(dx.view(ctx.x_shape), ctx.x_dtype)
    d_a = d_b = d_m = None
    if ctx.needs_input_grad[1]:
        d = x2 if mask is None else _dropped(x2, mask, ctx.keep_scale)
        d_a = torch.addmm(a, g.t(), d, beta=0, alpha=s)
    if ctx.needs_input_grad[2]:  # fp32: c is
        d_b = torch.mul(torch.addmm(b_c, dy2.t(), xa, beta=0, alpha=s), c[:, None])
    if ctx.needs_input_grad[3]:  # colsum(dy z) / n, in fp32
        d_m = (dy2 * z).sum(0, dtype=torch.float32) / norms
    return dx, d_a, d_b, d_m, None


def fusable_dora(module: torch.nn.Module) -> bool:
    """DoRA with one adapter (dropout or none) on a frozen nn.Linear or a bitsandbytes 4-bit
    linear, its magnitude in a layer of peft's."""
    if not fusable(module, DoraLinearVariant) or getattr(module, "ephemeral_gpu_offload", False):
        return False
    layer = module.lora_magnitude_vector[next(iter(module.lora_A.keys()))]
    return isinstance(getattr(layer, "weight", None), torch.Tensor)


def dora_call(self: torch.nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    """DoraLinearFunction's arguments after the input for a call of layer `self`, or None where
    the call is not DoRA of one adapter (disabled, merged, ...) and peft's forward runs."""
    name = active_adapter(self, args, kwargs, DoraLinearVariant)
    if name is None:
        return None
    weights = self.lora_A[name].weight, self.lora_B[name].weight
    magnitude = self.lora_magnitude_vector[name].weight
    return *weights, magnitude, (self.base_layer, *scale_dropout(self, name))


# the fused DoRA function, or peft's forward where the call is not DoRA of one adapter
_dora_forward = fused_layer_forward(dora_call, DoraLinearFunction)


def fuse_adapter_linears(model: torch.nn.Module) -> int:
    """Give every fusable LoRA linear layer of `model` the fused forward, and every fusable
    DoRA one the fused DoRA forward (in place); returns how many were switched."""
    return fuse_lora_linears(model) + switch_forwards(model, fusable_dora, _dora_forward)
