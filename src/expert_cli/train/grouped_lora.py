"""Fused LoRA layers that read one input (q, k and v; gate and up) computed as one function.

A decoder layer hands one tensor to q_proj, k_proj and v_proj, and one to gate_proj and
up_proj. Layer by layer (train/fused_lora.py) each adapter reads that input for its own
rank-r GEMM, forward and for A's gradient, and each layer returns an input gradient of its
own that autograd then adds up. Computed together, with s the adapters' scale:

    xa = x [A_1; A_2; A_3]^T                       one GEMM for the adapters without dropout
    y_i = x W_i^T + b_i;   y_i += s xa_i B_i^T
    g_i = dy_i B_i
    dx = dy_1 W_1;  dx += dy_2 W_2;  dx += dy_3 W_3;  dx += s [g_1 g_2 g_3] [A_1; A_2; A_3]
    [dA_1; dA_2; dA_3] = s [g_1 g_2 g_3]^T x;       dB_i = s dy_i^T xa_i

so the input is read once for the adapters' forward and once for their weight gradients, and
the input gradients accumulate in the GEMMs' output instead of in autograd's additions. An
adapter with dropout reads its own dropped input, with its own mask, so its A GEMMs stay its
own: with dropout on every layer (HiveLLM's 0.05) only the additions are saved.

The layers run one by one (as fused) until a forward of the model has shown the order its
module calls them in, all with one tensor; from the next forward on, the first of them runs
the function, drawing the dropout masks in that order (the masks the layers called one by one
draw), and the others' outputs wait on the group until each is called with that same tensor.
A layer called with another tensor (or with that one changed in place since) runs alone, and
from the next forward on its group runs no more; adapters disabled or merged, torch.compile's
tracing and inference mode run the layers alone. Nothing changes within a forward and its
backward, so a checkpointed layer's recompute computes what its forward did.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from expert_cli.train.fused_lora import (
    _as,
    _compute_dtype,
    _dense,
    _dropped,
    _fused_forward,
    draw_mask,
    fused_call,
    kept_mask,
    outside_autocast,
    runs_plain_fused,
    saved_mask,
)

# sibling layers that a decoder layer calls with one input (Llama, Qwen, Mistral, Gemma)
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
COMPILED_UNGROUPED = (
    "adapter_kernel: grouped: torch.compile traces each decoder layer, where the layers run one "
    "by one as fused"
)
NOTHING_GROUPED = (
    "adapter_kernel: grouped found no two fused LoRA layers of one module named as layers that "
    "read one input (q_proj, k_proj, v_proj; gate_proj, up_proj): each runs on its own, as fused"
)


class GroupedLoraFunction(torch.autograd.Function):
    """The outputs y_i = x W_i^T + b_i + s_i (dropout_i(x) A_i^T) B_i^T of layers that read
    one input x, as one node."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, members: tuple, *weights: torch.Tensor) -> Any:
        """`members`: each layer's (frozen base layer, (scale, dropout)); `weights`: A_1,
        B_1, A_2, B_2, ... (fp32 master weights)."""
        dtype = _compute_dtype(x)
        x2 = _as(x.reshape(-1, x.shape[-1]), dtype)
        plain = [i for i, (_, (_, p)) in enumerate(members) if p == 0]
        # the adapters without dropout: one GEMM over their stacked A (cast once)
        a_cat = _as(torch.cat([weights[2 * i] for i in plain]), dtype) if plain else None
        xa_cat = F.linear(x2, a_cat) if plain else None
        saved: list[torch.Tensor | None] = [x2, xa_cat, a_cat]
        outputs, offset, states = [], 0, []
        for i, (base, (scaling, dropout)) in enumerate(members):
            weight, bias = base.weight, base.bias
            quant_state = getattr(weight, "quant_state", None)
            b = _as(weights[2 * i + 1], dtype)
            a = mask = xa = state = None
            if dropout > 0:
                a = _as(weights[2 * i], dtype)
                mask, state = draw_mask(x2, dropout)
                xa = F.linear(_dropped(x2, mask, 1.0 / (1.0 - dropout)), a)
                part = xa
            else:
                part = xa_cat[:, offset : offset + b.shape[1]]
                offset += b.shape[1]
            w = _dense(weight, quant_state, dtype)
            y = F.linear(x2, w, None if bias is None else _as(bias, dtype))
            y.addmm_(part, b.t(), alpha=scaling)
            if quant_state is not None:  # in the input's dtype, as bitsandbytes' layer gives it
                y = _as(y, x.dtype)
            outputs.append(y.view(*x.shape[:-1], w.shape[0]))
            saved += [weight, b, a, xa, kept_mask(mask, state)]
            states.append(state)
        ctx.save_for_backward(*saved)
        ctx.mask_states = states
        ctx.members, ctx.plain, ctx.x_shape, ctx.x_dtype = members, plain, x.shape, x.dtype
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *dys: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return outside_autocast(dys[0].device.type, _backward, ctx, dys)


def _backward(ctx: Any, dys: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
    """GroupedLoraFunction's backward: the input gradient accumulated by the GEMMs, the
    stacked A's gradient as one GEMM."""
    saved = ctx.saved_tensors
    x2, xa_cat, a_cat = saved[:3]
    members, plain, need = ctx.members, ctx.plain, ctx.needs_input_grad
    dtype = x2.dtype
    # the plain adapters' scales differ only where layers were given alphas of their own:
    # then each g carries its scale and the shared GEMMs take none
    one_scale = len({members[i][1][0] for i in plain}) == 1
    grads: list[torch.Tensor | None] = [None] * (2 * len(members))
    gs, dx, offset = [], None, 0
    for i, ((_, (s, dropout)), dy) in enumerate(zip(members, dys, strict=True)):
        weight, b, a, xa, kept = saved[3 + 5 * i : 8 + 5 * i]
        mask = saved_mask(kept, x2, dropout, ctx.mask_states[i]) if dropout > 0 else None
        dy2 = _as(dy.reshape(-1, dy.shape[-1]), dtype)
        g = dy2 @ b
        if need[0]:
            w = _dense(weight, getattr(weight, "quant_state", None), dtype)
            dx = dy2 @ w if dx is None else dx.addmm_(dy2, w)
        if dropout > 0:
            keep = 1.0 / (1.0 - dropout)
            if need[0]:
                dx.addcmul_(g @ a, mask, value=s * keep)
            if need[2 + 2 * i]:
                grads[2 * i] = torch.addmm(a, g.t(), _dropped(x2, mask, keep), beta=0, alpha=s)
        else:
            xa = xa_cat[:, offset : offset + b.shape[1]]
            offset += b.shape[1]
            gs.append(g if one_scale else g.mul_(s))
        if need[3 + 2 * i]:
            grads[2 * i + 1] = torch.addmm(b, dy2.t(), xa, beta=0, alpha=s)
    if plain:
        g_cat = gs[0] if len(gs) == 1 else torch.cat(gs, dim=1)
        s = members[plain[0]][1][0] if one_scale else 1.0
        if need[0]:
            dx.addmm_(g_cat, a_cat, alpha=s)
        if any(need[2 + 2 * i] for i in plain):
            d_cat = torch.addmm(a_cat, g_cat.t(), x2, beta=0, alpha=s)
            rows = 0
            for i in plain:  # row blocks of one gradient, each its adapter's A
                r = saved[4 + 5 * i].shape[1]
                grads[2 * i] = d_cat[rows : rows + r] if need[2 + 2 * i] else None
                rows += r
    if dx is not None:
        dx = _as(dx.view(ctx.x_shape), ctx.x_dtype)
    return dx, None, *grads


class LoraGroup:
    """Fused LoRA layers a module calls with one input. They run one by one until a forward
    has shown the order they are called in, all with one tensor; from the model's next
    forward on the first of them computes the group (its dropout masks drawn in that order)
    and the others' outputs are held until each is called with that same tensor. A member
    called with another tensor runs alone, and from the next forward on the group runs no
    more (a module that does not hand its layers one input). What a call does changes only
    between forwards of the model, so that a checkpointed layer's recompute, within the
    backward, computes what its forward computed."""

    def __init__(self, members: list[torch.nn.Module]) -> None:
        self.members = tuple(members)
        self.order: tuple[int, ...] | None = None  # the call order, in use
        self.off = False
        self._next: tuple[tuple[int, ...] | None, bool] = (None, False)  # at the next forward
        self._seen: list[int] = []  # calls with one input so far, while the order is not known
        self._seen_input: weakref.ref | None = None
        self._alone: weakref.ref | None = None  # the first member's input, run alone
        self._input: torch.Tensor | None = None
        self._version = -1
        self._waiting: dict[int, torch.Tensor] = {}

    def call(self, member: torch.nn.Module, x: torch.Tensor, args: tuple, kwargs: dict) -> Any:
        index = next((i for i, m in enumerate(self.members) if m is member), None)
        if index is None or self.off or args or kwargs:
            return _fused_forward(member, x, *args, **kwargs)
        if index in self._waiting and self._input is x and x._version == self._version:
            out = self._waiting.pop(index)  # x is the group's, not changed in place since
            if not self._waiting:
                self._input = None
            return out
        self.clear()  # outputs nobody collected are let go
        if self.order is None:
            self._learn(index, x)
        elif index == self.order[0]:
            calls = self._calls(x)
            if calls is not None:
                return self._run(x, calls)
            self._alone = weakref.ref(x)  # this call's siblings run alone too
        elif self._alone is None or self._alone() is not x:
            self._next = (self._next[0], True)  # not handed the first member's input
        return _fused_forward(member, x, *args, **kwargs)

    def _run(self, x: torch.Tensor, calls: list) -> torch.Tensor:
        """The group's outputs of x: the first member's returned, the others' held."""
        weights = [t for call in calls for t in call[1:3]]
        members = tuple((call[0], call[3]) for call in calls)
        outputs = GroupedLoraFunction.apply(x, members, *weights)
        self._waiting = {i: y for i, y in zip(self.order[1:], outputs[1:], strict=True)}
        self._input, self._version, self._alone = x, x._version, None
        return outputs[0]

    def clear(self) -> None:
        """Let go of outputs not collected (a forward stopped part-way: an error, or a
        checkpointed layer's recompute, which stops once it has what the backward needs)."""
        self._waiting, self._input = {}, None

    def next_forward(self) -> None:
        """A forward of the model begins: what the last one learned takes effect."""
        order, off = self._next
        self.order = self.order or order
        self.off = self.off or off
        self._alone = None
        self.clear()

    def _learn(self, index: int, x: torch.Tensor) -> None:
        """The members called one after the other with one tensor, each once, give the order
        (in effect from the model's next forward)."""
        same = self._seen_input is not None and self._seen_input() is x
        self._seen = [*self._seen, index] if same else [index]
        self._seen_input = weakref.ref(x)
        if len(self._seen) != len(set(self._seen)):
            self._next = (None, True)  # one member called twice with one tensor
        elif len(self._seen) == len(self.members):
            self._next = (tuple(self._seen), self._next[1])
            self._seen, self._seen_input = [], None

    def _calls(self, x: torch.Tensor) -> list | None:
        """Each member's fused-call arguments in call order, or None where this call runs
        alone (inference mode, traced by torch.compile, adapters disabled or merged)."""
        if x.is_inference() or torch.compiler.is_compiling():
            return None
        calls = [fused_call(self.members[i], (), {}) for i in self.order]
        return None if any(call is None for call in calls) else calls


def _grouped_forward(self: torch.nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """A grouped layer's forward: its output from its group."""
    return self._lora_group.call(self, x, args, kwargs)


_grouped_forward.fused_lora = True  # type: ignore[attr-defined]


def is_grouped(module: torch.nn.Module) -> bool:
    """Whether `module` runs in a group (the grouped forward)."""
    forward = module.__dict__.get("forward")
    return getattr(forward, "__func__", None) is _grouped_forward


def clear_groups(model: torch.nn.Module, *_: Any) -> None:
    """A forward of `model` begins: every output its groups hold is let go, and what the last
    forward learned takes effect (a forward pre-hook: returns None, so the forward's
    arguments stay as given)."""
    for group in model.__dict__.get("_lora_groups", ()):
        group.next_forward()


def group_lora_linears(model: torch.nn.Module) -> int:
    """Group `model`'s fused LoRA layers that its modules call with one input (SHARED_INPUT
    names, two or more fused siblings of one input width); returns how many layers were
    grouped. Each forward of `model` starts with every group's uncollected outputs let go."""
    groups: list[LoraGroup] = []
    for module in model.modules():
        for names in SHARED_INPUT:
            members = [getattr(module, n, None) for n in names]
            members = [m for m in members if m is not None and runs_plain_fused(m)]
            if len(members) < 2 or len({m.in_features for m in members}) != 1:
                continue
            group = LoraGroup(members)
            for member in members:
                member._lora_group = group
                member.forward = types.MethodType(_grouped_forward, member)
            groups.append(group)
    if groups:
        model._lora_groups = groups  # read by the hook from its module: a copy clears its own
        model.register_forward_pre_hook(clear_groups)
    return sum(len(group.members) for group in groups)
