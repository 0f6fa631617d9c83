"""The fused LoRA linear gives peft's outputs and gradients (the same math, the scaled update
accumulated by the GEMM), falls back to peft wherever it does not apply, and trains the tiny
model to the same losses."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from train_helpers import assert_bf16_close, bf16_step_ops, lora_model

from expert_cli.telemetry.ops import SavedForBackward
from expert_cli.train.fused_lora import (
    LoraLinearFunction,
    _dense,
    fusable,
    fuse_lora_linears,
    is_fused,
    unfused_bases,
)


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict]:
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads


def _same_loss_and_gradients(
    plain: torch.nn.Module, fused: torch.nn.Module, ids: torch.Tensor
) -> float:
    """Asserts the fused model's loss and 28 adapter gradients are the peft model's (fp32);
    returns the loss."""
    want_loss, want = _loss_and_grads(plain, ids)
    got_loss, got = _loss_and_grads(fused, ids)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    assert got.keys() == want.keys() and len(got) == 28
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-7), name
    return got_loss


def test_function_matches_the_unfused_math_in_fp32() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 5, 8, requires_grad=True)
    base = torch.nn.Linear(8, 6).requires_grad_(False)
    w, bias = base.weight, base.bias
    a = torch.randn(3, 8, requires_grad=True)
    b = torch.randn(6, 3, requires_grad=True)
    y = LoraLinearFunction.apply(x, base, a, b, (0.5, 0.0))
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    got = (y.detach(), x.grad, a.grad, b.grad)
    x2, a2, b2 = (t.detach().clone().requires_grad_() for t in (x, a, b))
    ref = x2 @ w.t() + bias + (x2 @ a2.t()) @ b2.t() * 0.5
    (ref * dy).sum().backward()
    for mine, theirs in zip(got, (ref.detach(), x2.grad, a2.grad, b2.grad), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5), (mine - theirs).abs().max()


def test_a_backward_called_under_autocast_keeps_the_forwards_precision() -> None:
    """The forward ran in fp32; a backward called inside a bf16 autocast region (the CPU runs
    it on the calling thread, autocast on) still computes in fp32."""
    torch.manual_seed(2)
    base = torch.nn.Linear(16, 12).requires_grad_(False)
    grads = []
    for region in (False, True):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5), requires_grad=True)
        a = torch.randn(4, 16, generator=torch.Generator().manual_seed(6), requires_grad=True)
        b = torch.randn(12, 4, generator=torch.Generator().manual_seed(7), requires_grad=True)
        y = LoraLinearFunction.apply(x, base, a, b, (0.5, 0.0))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=region):
            y.pow(2).sum().backward()
        grads.append((x.grad, a.grad, b.grad))
    for outside, inside in zip(*grads, strict=True):
        assert inside.dtype == torch.float32 and torch.equal(outside, inside)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_compiled_under_autocast(dropout: float) -> None:
    """torch.compile traces the Function's backward with the forward's autocast on; a call of
    the Function's own method inside it was refused (AssertionError: Expected
    FakeBackwardCFunction). With dropout the traced mask is the one eager draws from the same
    seed, and the dropped input computed again in the traced backward gives eager's
    gradients."""
    torch.manual_seed(3)
    base = torch.nn.Linear(32, 24).requires_grad_(False)
    a = torch.nn.Parameter(torch.randn(8, 32) * 0.1)
    b = torch.nn.Parameter(torch.randn(24, 8) * 0.1)

    def f(x: torch.Tensor) -> torch.Tensor:
        return LoraLinearFunction.apply(x, base, a, b, (2.0, dropout))

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.randn(16, 32)
    grads = []
    for fn in (f, compiled):
        a.grad = b.grad = None
        torch.manual_seed(11)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fn(x).float().pow(2).sum().backward()
        grads.append((a.grad.clone(), b.grad.clone()))
    for eager, traced in zip(*grads, strict=True):
        assert traced.dtype == torch.float32 and torch.allclose(eager, traced, atol=1e-2)


def test_dropout_is_the_math_of_peft_with_the_same_mask() -> None:
    """y = x W^T + b + s (dropout(x) A^T) B^T and its gradients, the mask as `bernoulli_`
    draws it (the same generator state gives the same mask)."""
    torch.manual_seed(1)
    x = torch.randn(3, 5, 8, requires_grad=True)
    base = torch.nn.Linear(8, 6).requires_grad_(False)
    a = torch.randn(4, 8, requires_grad=True)
    b = torch.randn(6, 4, requires_grad=True)
    torch.manual_seed(7)
    y = LoraLinearFunction.apply(x, base, a, b, (0.5, 0.3))
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    got = (y.detach(), x.grad, a.grad, b.grad)
    torch.manual_seed(7)
    mask = torch.empty(15, 8, dtype=torch.bool).bernoulli_(0.7)
    assert 0 < mask.sum() < mask.numel()  # some entries dropped, some kept
    x2, a2, b2 = (t.detach().clone().requires_grad_() for t in (x, a, b))
    dropped = x2 * mask.view(3, 5, 8) / 0.7
    ref = x2 @ base.weight.t() + base.bias + (dropped @ a2.t()) @ b2.t() * 0.5
    (ref * dy).sum().backward()
    for mine, theirs in zip(got, (ref.detach(), x2.grad, a2.grad, b2.grad), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5), (mine - theirs).abs().max()


def test_dropout_layers_are_fused_and_checkpointing_redraws_the_same_mask(
    tiny_model_dir: Path,
) -> None:
    from expert_cli.train.model import enable_checkpointing

    """With lora_dropout the layers fuse: evaluation (no dropout) equals peft's; training
    drops (the loss moves); a checkpointed forward's recompute draws the mask it drew."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
    plain = lora_model(tiny_model_dir, lora_dropout=0.2)
    fused = copy.deepcopy(plain)
    assert fuse_lora_linears(fused) == 14
    plain.eval(), fused.eval()
    with torch.no_grad():
        assert torch.allclose(fused(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)
    fused.train()
    runs = []
    for checkpointed in (False, True):
        if checkpointed:
            enable_checkpointing(fused.base_model.model, {"use_reentrant": False})
        torch.manual_seed(11)
        runs.append(_loss_and_grads(fused, ids))
    (loss, grads), (loss_ckpt, grads_ckpt) = runs
    assert loss == loss_ckpt
    assert all(torch.allclose(grads[n], grads_ckpt[n], atol=1e-6) for n in grads)
    fused.eval()
    with torch.no_grad():
        evaluated = torch.nn.functional.cross_entropy(
            fused(input_ids=ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
        ).item()
    assert abs(loss - evaluated) > 1e-4  # training dropped entries: not the eval loss


def test_fused_model_equals_peft_loss_and_gradients(tiny_model_dir: Path) -> None:
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
    plain = lora_model(tiny_model_dir)
    fused = copy.deepcopy(plain)
    assert fuse_lora_linears(fused) == 14  # 2 layers x (q, k, v, o, gate, up, down)
    got_loss = _same_loss_and_gradients(plain, fused, ids)
    with fused.disable_adapter():  # peft's own forward: the base model alone
        base_loss = fused(input_ids=ids, labels=ids).loss.item()
    with plain.disable_adapter():
        assert base_loss == pytest.approx(plain(input_ids=ids, labels=ids).loss.item())
    assert base_loss != pytest.approx(got_loss)


def test_bf16_autocast_keeps_fp32_gradients_close_tolora_model(tiny_model_dir: Path) -> None:
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(4))
    plain = lora_model(tiny_model_dir)
    fused = copy.deepcopy(plain)
    fuse_lora_linears(fused)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want_loss, want = _loss_and_grads(plain, ids)
        got_loss, got = _loss_and_grads(fused, ids)
    assert got_loss == pytest.approx(want_loss, rel=1e-2)
    assert all(g.dtype == torch.float32 for g in got.values())  # fp32 master weights' gradients
    assert_bf16_close(want, got)


def test_only_plain_lora_on_a_frozen_linear_is_fused(tiny_model_dir: Path) -> None:
    assert fuse_lora_linears(lora_model(tiny_model_dir, use_dora=True)) == 0
    assert fuse_lora_linears(lora_model(tiny_model_dir, lora_bias=True)) == 0  # B has a bias
    model = lora_model(tiny_model_dir)
    assert not any(fusable(m) for m in model.modules() if not hasattr(m, "lora_A"))
    # a base weight that trains: the fused function gives it no gradient, so it would stay
    layer = next(m for m in model.modules() if hasattr(m, "lora_A") and fusable(m))
    layer.base_layer.weight.requires_grad_(True)
    assert not fusable(layer)


def test_a_merged_adapter_is_not_added_twice(tiny_model_dir: Path) -> None:
    """merge_adapter() on a fused model: the weights hold the update, the fused function
    must not add it again."""
    plain = lora_model(tiny_model_dir)
    for _, param in plain.named_parameters():  # B starts at 0: an update that shows
        if "lora_B" in _:
            torch.nn.init.normal_(param, std=0.02, generator=torch.Generator().manual_seed(1))
    fused = copy.deepcopy(plain)
    assert fuse_lora_linears(fused) > 0
    ids = torch.randint(0, 200, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = plain(input_ids=ids).logits
        for model in (plain, fused):
            model.merge_adapter()
        torch.testing.assert_close(fused(input_ids=ids).logits, plain(input_ids=ids).logits)
        torch.testing.assert_close(plain(input_ids=ids).logits, before, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("quantization", [None, "int4"])
def test_the_manifest_lever_trains_to_peft_losses(
    tmp_path: Path, tiny_model_dir: Path, quantization: str | None
) -> None:
    """`adapter_kernel: fused` and `grouped` through the recipe's own model set-up and the
    Trainer, on the tiny model's weights and on their NF4 quantization (QLoRA, bf16
    compute)."""
    from train_helpers import prepared_cpu_run, train_steps, write_expert

    from expert_cli.train.grouped_lora import is_grouped

    losses = {}
    base = {"quantization": quantization} if quantization else None
    for kernel in ("peft", "fused", "grouped"):
        manifest = write_expert(
            tmp_path / kernel,
            tiny_model_dir,
            rows=32,
            config={"adapter_kernel": kernel},
            base=base,
        )
        resolved, tokenizer, data, model = prepared_cpu_run(manifest, total_steps=6)
        assert resolved.adapter_kernel == kernel
        assert sum(is_fused(m) for m in model.modules()) == (0 if kernel == "peft" else 14)
        assert sum(is_grouped(m) for m in model.modules()) == (10 if kernel == "grouped" else 0)
        trainer = train_steps(resolved, tokenizer, data, model, tmp_path / f"ckpt-{kernel}", 6)
        losses[kernel] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses["fused"]) == 6
    assert losses["fused"] == pytest.approx(losses["peft"], rel=1e-4)
    assert losses["grouped"] == pytest.approx(losses["fused"], rel=1e-4)


def test_fused_layers_dispatch_fewer_operations_thanlora_model(tiny_model_dir: Path) -> None:
    """Forward and backward under bf16 autocast: the fused layers leave out peft's scale and
    add over each output and their backward, and reuse the forward's bf16 adapter weights."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(5))
    plain = lora_model(tiny_model_dir)
    fused = copy.deepcopy(plain)
    fuse_lora_linears(fused)
    counts = bf16_step_ops({"peft": plain, "fused": fused}, ids)
    peft_ops, fused_ops = counts["peft"].total, counts["fused"].total
    assert fused_ops <= peft_ops - 4 * 14, (fused_ops, peft_ops)
    assert counts["fused"].ops["aten::mul_"] == 0  # the scaling rides on the GEMMs


def _nf4(compute: torch.dtype) -> object:
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )


def test_4bit_layers_are_fused_to_peft_loss_and_gradients(tiny_model_dir: Path) -> None:
    """QLoRA: the NF4 base weight dequantized in the forward and again in the backward gives
    peft's 4-bit layer's loss and adapter gradients (fp32 compute: the same numbers up to
    the order of the sums)."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(6))
    plain = lora_model(tiny_model_dir, _nf4(torch.float32))
    fused = lora_model(tiny_model_dir, _nf4(torch.float32))
    layers = [m for m in fused.modules() if type(m).__name__ == "Linear4bit" and fusable(m)]
    assert len(layers) == 14
    assert fuse_lora_linears(fused) == 14
    assert unfused_bases(fused) == ""
    got_loss = _same_loss_and_gradients(plain, fused, ids)
    with fused.disable_adapter():  # the layer's own forward: the 4-bit base alone
        base_loss = fused(input_ids=ids, labels=ids).loss.item()
    assert base_loss != pytest.approx(got_loss)


def test_4bit_layers_in_bf16_compute_stay_close_to_peft(tiny_model_dir: Path) -> None:
    """bf16 compute, as a QLoRA run has it: under autocast and (the layer's compute dtype)
    without; the adapters' gradients stay fp32 and the output keeps the input's dtype."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(7))
    plain = lora_model(tiny_model_dir, _nf4(torch.bfloat16), lora_dropout=0.1)
    fused = lora_model(tiny_model_dir, _nf4(torch.bfloat16), lora_dropout=0.1)
    fuse_lora_linears(fused)
    plain.eval(), fused.eval()  # dropout off: the two draw different masks
    for region in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=region):
            want_loss, want = _loss_and_grads(plain, ids)
            got_loss, got = _loss_and_grads(fused, ids)
        assert got_loss == pytest.approx(want_loss, rel=1e-2)
        assert all(g.dtype == torch.float32 for g in got.values())
        assert_bf16_close(want, got, where=region)
    layer = next(m for m in fused.modules() if is_fused(m))
    x = torch.randn(3, layer.in_features)
    assert layer(x).dtype == torch.float32  # bf16 compute, returned in the input's dtype


def test_a_4bit_layer_repacked_for_the_cpu_runs_peft(tiny_model_dir: Path) -> None:
    """bitsandbytes' CPU inference repack changes the packed weight's layout: such a layer is
    not fused, and a fused one that was repacked afterwards runs the layer's own forward."""
    fused = lora_model(tiny_model_dir, _nf4(torch.float32))
    fuse_lora_linears(fused)
    layer = next(m for m in fused.modules() if is_fused(m))
    x = torch.randn(3, layer.in_features)
    want = layer(x)
    layer.base_layer.weight.quant_state.packing_format_for_cpu = True
    assert not fusable(layer)
    layer.base_layer.weight.quant_state.packing_format_for_cpu = False
    calls = []
    layer.base_layer.register_forward_hook(lambda *_: calls.append(1))
    assert torch.allclose(layer(x), want, atol=1e-5) and calls == []  # fused: no base call
    layer.base_layer.weight.quant_state.packing_format_for_cpu = True
    layer(x)
    assert calls == [1]  # peft's forward calls the base layer


def _layer_4bit(tiny_model_dir: Path, compute: torch.dtype, fused: bool) -> torch.nn.Module:
    """The first 4-bit q_proj LoRA layer of the tiny model (fused or peft's)."""
    model = lora_model(tiny_model_dir, _nf4(compute))
    if fused:
        fuse_lora_linears(model)
    return next(m for n, m in model.named_modules() if n.endswith("q_proj"))


def test_4bit_without_mixed_precision_trains_the_adapters_in_fp32(tiny_model_dir: Path) -> None:
    """No autocast, fp32 inputs, a bf16 compute dtype on the 4-bit layer: the adapters'
    gradients are computed in fp32 as peft's are (they do not depend on the base output),
    not in the layer's bf16 compute dtype."""
    grads = []
    for fused in (False, True):
        layer = _layer_4bit(tiny_model_dir, torch.bfloat16, fused)
        x = torch.randn(6, layer.in_features, generator=torch.Generator().manual_seed(8))
        y = layer(x)
        assert y.dtype == torch.float32
        (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        grads.append([p.grad for n, p in layer.named_parameters() if "lora_" in n])
    for peft_grad, fused_grad in zip(*grads, strict=True):
        assert torch.allclose(fused_grad, peft_grad, rtol=1e-5, atol=1e-8)


def test_4bit_output_keeps_the_input_dtype_under_autocast(tiny_model_dir: Path) -> None:
    """bitsandbytes' 4-bit layer returns its input's dtype (fp16 QLoRA keeps an fp32
    residual stream); the fused one too, unlike an unquantized layer under autocast."""
    for fused in (False, True):
        layer = _layer_4bit(tiny_model_dir, torch.bfloat16, fused)
        x = torch.randn(3, layer.in_features)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.float32, fused


def test_4bit_weight_is_dequantized_straight_to_the_compute_dtype(tiny_model_dir: Path) -> None:
    """One dequantization into the dtype asked for (not the stored dtype, then a cast), with
    the layer's own quantization state left as it was."""
    from bitsandbytes.functional import dequantize_4bit

    layer = _layer_4bit(tiny_model_dir, torch.float32, fused=True)
    weight = layer.base_layer.weight
    state = weight.quant_state
    stored = state.dtype
    asked = torch.bfloat16 if stored != torch.bfloat16 else torch.float32
    dense = _dense(weight, state, asked)
    assert dense.dtype == asked and state.dtype == stored
    want = dequantize_4bit(weight, state).to(asked)
    assert dense.shape == (layer.out_features, layer.in_features)
    assert torch.allclose(dense.float(), want.float(), rtol=1e-2, atol=1e-3)


def test_a_4bit_weight_rewrapped_without_its_state_is_recovered(tiny_model_dir: Path) -> None:
    """FSDP and ZeRO-3 re-wrap parameters as plain ones, losing `weight.quant_state`;
    bitsandbytes recovers it from the layer, and so does the fused forward."""
    layer = _layer_4bit(tiny_model_dir, torch.float32, fused=True)
    x = torch.randn(3, layer.in_features)
    want = layer(x)
    packed = layer.base_layer.weight
    layer.base_layer.weight = torch.nn.Parameter(packed.data, requires_grad=False)
    assert getattr(layer.base_layer.weight, "quant_state", None) is None
    assert torch.equal(layer(x), want)
    assert layer.base_layer.weight.quant_state is not None


def test_a_trained_base_bias_or_an_adapter_added_later_runs_peft(tiny_model_dir: Path) -> None:
    """A base bias peft trains (bias="all") gets no gradient from the fused function: such a
    layer is not fused. A DoRA adapter added after fusing and made active runs peft's own
    forward: the same logits as the unfused model's."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    toy = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model = get_peft_model(toy, LoraConfig(r=2, target_modules=["0", "2"], bias="all"))
    assert fuse_lora_linears(model) == 0

    ids = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(9))
    plain = lora_model(tiny_model_dir)
    fused = copy.deepcopy(plain)
    fuse_lora_linears(fused)
    for model in (plain, fused):
        torch.manual_seed(5)
        dora = LoraConfig(r=4, target_modules="all-linear", use_dora=True, init_lora_weights=False)
        model.add_adapter("d", dora)
        model.set_adapter("d")
    with torch.no_grad():
        want = plain(input_ids=ids).logits
        got = fused(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    with torch.no_grad():  # the first adapter again: fused
        plain.set_adapter("default"), fused.set_adapter("default")
        assert torch.allclose(fused(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)


class _NativeDropout(torch.nn.Module):
    """nn.Dropout as a GPU runs it: torch's own kernel, whose backward keeps a bool mask."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.native_dropout(x, self.p, self.training)[0]


def _held(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Bytes one training forward of `model` keeps for its backward (weights left out)."""
    torch.manual_seed(5)
    with SavedForBackward(model.parameters()) as saved:
        loss = model(input_ids=ids, labels=ids).loss
    held = saved.nbytes  # while the graph is alive
    loss.backward()
    return held


def test_dropout_keeps_neither_the_mask_nor_the_dropped_input(tiny_model_dir: Path) -> None:
    """With lora dropout the fused layers keep what they keep without it: the backward draws
    each mask again from the generator state the forward drew it from. peft's layers keep
    each dropped input and a mask (of one byte on a GPU, as with torch's own dropout kernel
    here; of the input's dtype on a CPU)."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
    held = {}
    for p in (0.0, 0.2):
        plain = lora_model(tiny_model_dir, lora_dropout=p)
        fused = copy.deepcopy(plain)
        fuse_lora_linears(fused)
        held[p] = (_held(plain, ids), _held(fused, ids))
    layers = [m for m in plain.modules() if hasattr(m, "lora_A")]
    assert len(layers) == 14
    assert held[0.0][0] == held[0.0][1]
    assert held[0.2][1] == held[0.0][1]
    elements = sum(48 * m.in_features for m in layers)  # 48 tokens
    assert held[0.2][0] - held[0.2][1] >= 5 * elements  # the dropped inputs (fp32), masks
    gpu_like = lora_model(tiny_model_dir, lora_dropout=0.2)  # peft with one-byte masks
    for module in gpu_like.modules():
        for name in getattr(module, "lora_dropout", {}):
            module.lora_dropout[name] = _NativeDropout(0.2)
    # it keeps a mask for every adapted layer, and dropped inputs (fp32 here) where the fused
    # layers keep one input for q, k and v and one for gate and up: in each decoder layer at
    # least 3 inputs of 48 tokens x 64 features fewer
    assert _held(gpu_like, ids) - held[0.2][1] >= 2 * 3 * 48 * 64 * 4 + elements


def test_the_mask_drawn_again_is_the_forwards_and_leaves_the_generator() -> None:
    """The backward's mask is the forward's bit for bit (the same kernel from the same
    generator state), and drawing it again moves no global generator: what the run draws
    next (the next layer's mask, the next batch's) is what it would have drawn."""
    from expert_cli.train.fused_lora import draw_mask, mask_again

    x = torch.randn(300, 70)
    torch.manual_seed(5)
    mask, state = draw_mask(x, 0.1)
    after = torch.rand(4)
    torch.manual_seed(5)
    draw_mask(x, 0.1)
    assert torch.equal(mask_again(x, 0.1, state), mask)
    assert torch.equal(torch.rand(4), after)
    assert 0.87 < mask.float().mean().item() < 0.93
    other, _ = draw_mask(x, 0.1)  # a later draw is another mask
    assert not torch.equal(other, mask)
