"""The fused DoRA linear gives peft's DoRA outputs and gradients (the magnitude applied to the
weights, not to the activations), with and without dropout, bias, checkpointing, a 4-bit
base and bf16 autocast; falls back to peft where it does not apply; trains the tiny model to
peft's losses."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from train_helpers import assert_bf16_close, lora_model

from expert_cli.train.fused_dora import fusable_dora, fuse_adapter_linears
from expert_cli.train.fused_lora import is_fused, unfused_bases


class _Proj(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 24, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class _FixedMask(torch.nn.Module):
    """Dropout with a given mask (peft's layer then takes its dropout path)."""

    def __init__(self, mask: torch.Tensor, p: float) -> None:
        super().__init__()
        self.mask, self.keep = mask, 1.0 / (1.0 - p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask.view(x.shape) * self.keep


def _dora_layer(bias: bool, dropout: float = 0.0) -> torch.nn.Module:
    """One DoRA layer whose B and magnitude are off their initial values (c is not 1)."""
    torch.manual_seed(0)
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["proj"],
        use_dora=True,
        init_lora_weights=False,
        lora_dropout=dropout,
    )
    model = get_peft_model(_Proj(bias), config)
    with torch.no_grad():
        magnitude = model.base_model.model.proj.lora_magnitude_vector["default"].weight
        magnitude.mul_(torch.linspace(0.5, 1.5, magnitude.numel()))
    return model


def _run(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return y.detach(), x.grad, grads


def _assert_same(want: tuple, got: tuple, rtol: float = 1e-5) -> None:
    (y1, dx1, g1), (y2, dx2, g2) = want, got
    torch.testing.assert_close(y2, y1, rtol=rtol, atol=1e-6)
    torch.testing.assert_close(dx2, dx1, rtol=rtol, atol=1e-6)
    assert g1.keys() == g2.keys() and len(g1) == 3  # A, B and the magnitude
    for name, grad in g1.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(g2[name], grad, rtol=rtol, atol=1e-6, msg=name)


@pytest.mark.parametrize("bias", [False, True])
def test_the_function_is_peft_dora_without_dropout(bias: bool) -> None:
    plain = _dora_layer(bias)
    fused = copy.deepcopy(plain)
    assert fuse_adapter_linears(fused) == 1
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    _assert_same(_run(plain, x), _run(fused, x))


@pytest.mark.parametrize("bias", [False, True])
def test_the_function_is_peft_dora_with_the_same_dropout_mask(bias: bool) -> None:
    """peft's dropout path: the base weight meets both x and the dropped input."""
    fused = _dora_layer(bias, dropout=0.3)
    plain = copy.deepcopy(fused)
    assert fuse_adapter_linears(fused) == 1
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(7)
    mask = torch.empty(15, 16, dtype=torch.bool).bernoulli_(0.7)  # as the function draws it
    assert 0 < mask.sum() < mask.numel()
    plain.base_model.model.proj.lora_dropout["default"] = _FixedMask(mask, 0.3)
    want = _run(plain, x)
    torch.manual_seed(7)
    got = _run(fused, x)
    _assert_same(want, got)
    fused.eval()  # no dropout: peft's layer without it
    plain.base_model.model.proj.lora_dropout["default"] = torch.nn.Identity()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-6)


def test_bf16_autocast_with_dropout_stays_close_to_peft_given_the_mask() -> None:
    fused = _dora_layer(bias=True, dropout=0.3)
    plain = copy.deepcopy(fused)
    fuse_adapter_linears(fused)
    x = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(9)
    mask = torch.empty(32, 16, dtype=torch.bool).bernoulli_(0.7)
    plain.base_model.model.proj.lora_dropout["default"] = _FixedMask(mask, 0.3)
    results = []
    for model in (plain, fused):
        torch.manual_seed(9)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(_run(model, x))
    (y1, dx1, want), (y2, dx2, got) = results
    assert y2.dtype == torch.bfloat16  # peft's comes out in fp32, promoted by the magnitude
    torch.testing.assert_close(y2.float(), y1.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dx2.float(), dx1.float(), rtol=2e-2, atol=2e-2)
    assert all(g.dtype == torch.float32 for g in got.values())
    assert_bf16_close(want, got)


def _same_model_loss_and_gradients(plain: torch.nn.Module, fused: torch.nn.Module) -> float:
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
    results = []
    for model in (plain, fused):
        model.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((loss.item(), grads))
    (want_loss, want), (got_loss, got) = results
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    assert got.keys() == want.keys() and len(got) == 3 * 14
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-7, msg=name)
    return got_loss


def test_a_dora_model_is_fused_to_peft_loss_and_gradients(tiny_model_dir: Path) -> None:
    from expert_cli.train.model import enable_checkpointing

    plain = lora_model(tiny_model_dir, use_dora=True)
    fused = copy.deepcopy(plain)
    assert fuse_adapter_linears(fused) == 14  # 2 layers x (q, k, v, o, gate, up, down)
    assert unfused_bases(fused) == ""
    loss = _same_model_loss_and_gradients(plain, fused)
    enable_checkpointing(fused.base_model.model, {"use_reentrant": False})
    assert _same_model_loss_and_gradients(plain, fused) == loss
    with fused.disable_adapter():  # peft's own forward: the base model alone
        ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
        assert fused(input_ids=ids, labels=ids).loss.item() != pytest.approx(loss)


def test_bf16_autocast_stays_close_to_peft_with_fp32_gradients(tiny_model_dir: Path) -> None:
    """Under bf16 autocast peft's DoRA terms come out in fp32 (the magnitude promotes them);
    the fused layer computes in bf16 with the magnitude applied in fp32 to the weights."""
    plain = lora_model(tiny_model_dir, use_dora=True)
    fused = copy.deepcopy(plain)
    fuse_adapter_linears(fused)
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(4))
    results = []
    for model in (plain, fused):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append(
            (loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad})
        )
    (want_loss, want), (got_loss, got) = results
    assert got_loss == pytest.approx(want_loss, rel=1e-2)
    assert all(g.dtype == torch.float32 for g in got.values())
    assert_bf16_close(want, got)


def test_4bit_dora_layers_are_fused_to_peft_loss_and_gradients(tiny_model_dir: Path) -> None:
    from transformers import BitsAndBytesConfig

    nf4 = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float32,
    )
    plain = lora_model(tiny_model_dir, nf4, use_dora=True)
    fused = lora_model(tiny_model_dir, nf4, use_dora=True)
    assert fuse_adapter_linears(fused) == 14
    _same_model_loss_and_gradients(plain, fused)


def test_what_is_not_fused_runs_peft(tiny_model_dir: Path) -> None:
    """A layer with a second adapter keeps peft's forward."""
    two = lora_model(tiny_model_dir, use_dora=True)
    two.add_adapter("other", LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert fuse_adapter_linears(two) == 12  # the q_proj layers hold two adapters
    layer = two.base_model.model.model.layers[0].self_attn.q_proj
    assert not fusable_dora(layer) and not is_fused(layer)


def test_a_zero_magnitude_gets_peft_gradient() -> None:
    """A magnitude at 0 (its output the bias alone) still gets colsum(dy z) / n."""
    plain = _dora_layer(bias=True)
    with torch.no_grad():
        plain.base_model.model.proj.lora_magnitude_vector["default"].weight[5] = 0.0
    fused = copy.deepcopy(plain)
    fuse_adapter_linears(fused)
    x = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(8))
    want, got = _run(plain, x), _run(fused, x)
    _assert_same(want, got)
    magnitude = next(g for n, g in got[2].items() if "magnitude" in n)
    assert magnitude[5] != 0


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_an_output_written_over_after_the_forward_changes_no_gradient(dropout: float) -> None:
    """The next layer may write over what it keeps, the layer's output among it: Liger's
    SwiGLU backward stores the gate's and up projection's gradients in their outputs (a
    Triton write: no version bump, as `.data` here). The gradients stay peft's."""
    fused = _dora_layer(bias=False, dropout=dropout)
    plain = copy.deepcopy(fused)
    fuse_adapter_linears(fused)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(6))
    results = []
    for model in (plain, fused):
        torch.manual_seed(4)
        if model is plain and dropout:
            mask = torch.empty(15, 16, dtype=torch.bool).bernoulli_(1 - dropout)
            plain.base_model.model.proj.lora_dropout["default"] = _FixedMask(mask, dropout)
        xx = x.clone().requires_grad_(True)
        y = model(xx)
        dy = torch.linspace(-1, 1, y.shape[-1]).expand_as(y)
        squared = y * y  # keeps y, as SwiGLU keeps its inputs
        y.data.copy_(torch.full_like(y, 7.0))  # written over, unseen by autograd
        torch.autograd.backward([squared], [dy])
        results.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    want, got = results
    for name, grad in want.items():  # y * y's gradient reads the written y: equal for both
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_the_manifest_trains_dora_fused_to_peft_losses(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """`adapter_type: dora` with the fused kernel on the CPU: the run fuses its layers and
    logs peft's losses (fp32; dropout 0, where the two would draw other masks)."""
    import json

    from train_helpers import window_losses, write_expert

    from expert_cli.train.run import Silent, TrainOptions, train

    losses, records = {}, {}
    for kernel in ("peft", "fused"):
        manifest = write_expert(
            tmp_path / kernel,
            tiny_model_dir,
            rows=16,
            config={"adapter_type": "dora", "adapter_kernel": kernel, "dropout": 0.0},
        )
        out = tmp_path / f"run-{kernel}"
        assert train(TrainOptions(manifest=manifest, output=out, max_steps=3), Silent()).status
        losses[kernel] = window_losses(out)
        records[kernel] = json.loads((out / "manifest.resolved.json").read_text())["runtime"]
    assert records["fused"]["model"]["fused_lora_layers"] == 14
    assert records["peft"]["model"]["fused_lora_layers"] == 0
    assert list(losses["fused"]) == [1, 2, 3]
    assert losses["fused"] == pytest.approx(losses["peft"], rel=1e-5)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_compiled_under_autocast(dropout: float) -> None:
    """torch.compile (regional, `torch_compile: true`) traces the function whole, forward and
    backward, with eager's gradients; with dropout the mask eager draws from the same seed."""
    from expert_cli.train.fused_dora import DoraLinearFunction

    torch.manual_seed(3)
    base = torch.nn.Linear(32, 24).requires_grad_(False)
    a = torch.nn.Parameter(torch.randn(8, 32) * 0.1)
    b = torch.nn.Parameter(torch.randn(24, 8) * 0.1)
    m = torch.nn.Parameter(base.weight.norm(dim=1).detach() * 1.1)

    def f(x: torch.Tensor) -> torch.Tensor:
        return DoraLinearFunction.apply(x, a, b, m, (base, 2.0, dropout))

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    x = torch.randn(16, 32)
    grads = []
    for fn in (f, compiled):
        a.grad = b.grad = m.grad = None
        torch.manual_seed(11)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fn(x).float().pow(2).sum().backward()
        grads.append((a.grad.clone(), b.grad.clone(), m.grad.clone()))
    for eager, traced in zip(*grads, strict=True):
        assert traced.dtype == torch.float32 and torch.allclose(eager, traced, atol=1e-2)


def test_dropout_keeps_no_more_than_none(tiny_model_dir: Path) -> None:
    """DoRA with lora dropout (every HiveLLM expert's adapter) keeps what it keeps without
    dropout: the mask is drawn again in the backward, the dropped input computed again (the
    gradients given the forward's mask: test_the_function_is_peft_dora_with_the_same_dropout_
    mask)."""
    from expert_cli.telemetry.ops import SavedForBackward

    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
    held, grads = {}, {}
    for p in (0.0, 0.2):
        model = lora_model(tiny_model_dir, lora_dropout=p, use_dora=True)
        assert fuse_adapter_linears(model) == 14
        torch.manual_seed(5)
        with SavedForBackward(model.parameters()) as saved:
            loss = model(input_ids=ids, labels=ids).loss
        held[p] = saved.nbytes
        loss.backward()
        grads[p] = {n: q.grad.clone() for n, q in model.named_parameters() if q.requires_grad}
    assert held[0.2] == held[0.0]
    assert any(not torch.equal(grads[0.2][n], g) for n, g in grads[0.0].items())  # it drops
