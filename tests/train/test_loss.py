"""The loss without full-vocabulary logits equals the standard loss, and so do its gradients.

`chunked` (plain torch) runs on the CPU; `liger` drives Liger-Kernel's Triton cross-entropy
kernel, which runs on the CPU in Triton's interpreter where triton and liger-kernel are
installed (the `[dev]` extra installs them, so CI runs it; the `[gpu]` extra too), and is
compared the same way on a GPU (tests/train/test_fast_path_gpu.py,
scripts/check_fast_path_gpu.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from expert_cli.train import loss as fused
from expert_cli.train import loss_fit as fit

IGNORE = -100


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.9])
def test_chunked_matches_cross_entropy_over_several_chunks(monkeypatch, smoothing) -> None:
    """The summed loss and both gradients, with label smoothing as torch's cross-entropy
    takes it (the target 1 - f on the token, f / V on each of the V)."""
    monkeypatch.setattr(fused, "CHUNK_ELEMENTS", 7 * 50)  # 7 tokens a chunk: 4 chunks
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, 16, generator=gen, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (23,), generator=gen)
    targets[[0, 5, 9, 22]] = IGNORE
    got = fused.summed_linear_cross_entropy("chunked", hidden, weight, targets, None, smoothing)
    got_grads = torch.autograd.grad(got * 1.7, (hidden, weight))
    ref = torch.nn.functional.cross_entropy(
        hidden @ weight.t(), targets, reduction="sum", label_smoothing=smoothing
    )
    ref_grads = torch.autograd.grad(ref * 1.7, (hidden, weight))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    for a, b in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_ignored_tokens_get_no_gradient() -> None:
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(20, 8)
    targets = torch.tensor([3, IGNORE, 4, IGNORE, IGNORE, 7])
    fused.summed_linear_cross_entropy("chunked", hidden, weight, targets).backward()
    assert hidden.grad[[1, 3, 4]].abs().max() == 0
    assert hidden.grad[[0, 2, 5]].abs().min() > 0


def test_causal_lm_loss_shifts_and_normalises_like_transformers() -> None:
    from transformers.loss.loss_utils import ForCausalLMLoss

    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 9, 16, generator=gen)
    weight = torch.randn(40, 16, generator=gen)
    labels = torch.randint(0, 40, (2, 9), generator=gen)
    labels[0, :3] = IGNORE
    logits = hidden @ weight.t()
    for items in (None, torch.tensor(11)):
        got = fused.causal_lm_loss("chunked", hidden, weight, labels, items)
        ref = ForCausalLMLoss(logits, labels, vocab_size=40, num_items_in_batch=items)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def _lora_model(model_dir, backend: str | None):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if backend:
        fused.install_fused_loss(model, backend)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, config)


def test_fused_forward_equals_standard_loss_and_gradients(tiny_model_dir) -> None:
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(10, 3000, (2, 24), generator=gen)
    labels = ids.clone()
    labels[:, :5] = IGNORE
    pos = torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1)
    results = []
    for backend in (None, "chunked"):
        model = _lora_model(tiny_model_dir, backend)
        out = model(
            input_ids=ids,
            labels=labels,
            position_ids=pos,
            use_cache=False,
            num_items_in_batch=torch.tensor(30),
        )
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((out, grads))
    (std, std_grads), (got, got_grads) = results
    assert std.logits is not None and got.logits is None  # no full-vocabulary logits
    torch.testing.assert_close(got.loss, std.loss, rtol=1e-5, atol=1e-5)
    assert len(got_grads) == len(std_grads) > 0
    for name, grad in std_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_label_smoothing_is_in_training_and_not_in_an_evaluation(tiny_model_dir) -> None:
    """The fused forward smooths the labels where gradients are taken (a training step) and
    gives the plain cross-entropy without them (an evaluation, `evaluate`): the loss the
    standard forward gives, and the one transformers' Trainer would smooth."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(10, 3000, (2, 20), generator=gen)
    labels = ids.clone()
    labels[:, :4] = IGNORE
    model = _lora_model(tiny_model_dir, None)
    with torch.no_grad():
        plain = model(input_ids=ids, labels=labels, use_cache=False)
    logits = plain.logits[:, :-1].reshape(-1, plain.logits.shape[-1])
    wanted = torch.nn.functional.cross_entropy(
        logits, labels[:, 1:].reshape(-1), label_smoothing=0.2
    )
    fused.install_fused_loss(model.get_base_model(), "chunked", smoothing=0.2)
    trained = model(input_ids=ids, labels=labels, use_cache=False)
    with torch.no_grad():
        evaluated = model(input_ids=ids, labels=labels, use_cache=False)
    torch.testing.assert_close(trained.loss, wanted, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(evaluated.loss, plain.loss, rtol=1e-5, atol=1e-5)
    assert abs(float(trained.loss - evaluated.loss)) > 1e-3  # the two are told apart


def test_the_head_on_the_trained_positions_alone_gives_the_same_loss_and_gradients(
    tiny_model_dir,
) -> None:
    """The collator's loss positions (most of each row a prompt) change neither the loss nor
    any gradient, with and without the Trainer's token count, over several loss chunks."""
    from expert_cli.data.collate import PackedCollator

    gen = torch.Generator().manual_seed(3)
    rows = []
    for length in (24, 17):
        ids = torch.randint(10, 3000, (length,), generator=gen).tolist()
        labels = [IGNORE] * (length - 4) + ids[-4:]  # four answer tokens after a prompt
        rows.append({"input_ids": ids, "labels": labels, "position_ids": list(range(length))})
    batch = PackedCollator(0, loss_positions=True)(rows)
    positions = batch.pop("loss_positions")
    # each row's last prompt token and first three answer tokens predict an answer token
    assert positions.tolist() == [19, 20, 21, 22, 24 + 12, 24 + 13, 24 + 14, 24 + 15]
    model = _lora_model(tiny_model_dir, "chunked")
    for items in (torch.tensor(8), None):
        results = []
        for given in (None, positions):
            model.zero_grad()
            extra = {} if given is None else {"loss_positions": given}
            out = model(**batch, use_cache=False, num_items_in_batch=items, **extra)
            out.loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
            results.append((out.loss.detach(), grads))
        (every, every_grads), (only, only_grads) = results
        torch.testing.assert_close(only, every, rtol=1e-6, atol=1e-6)
        assert all(g.abs().max() > 0 for g in every_grads.values())
        for name, grad in every_grads.items():
            torch.testing.assert_close(only_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_loss_positions_leave_a_forward_without_labels_alone(tiny_model_dir) -> None:
    model = _lora_model(tiny_model_dir, "chunked").eval()
    ids = torch.tensor([[11, 12, 13, 14]])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, loss_positions=torch.tensor([1, 2]))
        want = model(input_ids=ids, use_cache=False)
    assert torch.equal(out.logits, want.logits)
    assert fused.takes_loss_positions(model)
    assert not fused.takes_loss_positions(_lora_model(tiny_model_dir, None))


def test_fused_forward_uses_no_deprecated_output_field(tiny_model_dir, monkeypatch) -> None:
    """transformers 5.25 renamed the outputs' `past_key_values` to `cache` and warns, once a
    process, on the console of every run that reads or writes the old name."""
    import logging

    said: list[str] = []
    monkeypatch.setattr(
        logging.Logger, "warning_once", lambda _self, msg, *a, **k: said.append(msg)
    )
    model = _lora_model(tiny_model_dir, "chunked")
    ids = torch.tensor([[11, 12, 13, 14]])
    out = model(input_ids=ids, labels=ids, use_cache=False)
    assert out.loss > 0
    assert not [m for m in said if "deprecated" in str(m)], said


def test_fused_forward_without_labels_is_the_models_own(tiny_model_dir) -> None:
    """Without labels the fused forward gives the model's own logits, equal to those of the
    same model without the fused loss installed."""
    model = _lora_model(tiny_model_dir, "chunked").eval()
    plain = _lora_model(tiny_model_dir, None).eval()  # the same seed: the same adapter
    ids = torch.tensor([[11, 12, 13, 14]])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
        want = plain(input_ids=ids, use_cache=False)
    assert out.logits.shape == (1, 4, model.config.vocab_size)
    assert torch.equal(out.logits, want.logits)


def test_models_that_scale_logits_keep_the_standard_loss(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert fit.fused_loss_unsupported(model) is None
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in fit.fused_loss_unsupported(model)
    assert "lm_head" in fit.fused_loss_unsupported(torch.nn.Linear(2, 2))
    model.config.final_logit_softcapping = None
    # an adapter on the head: the fused loss reads the head's weight, the adapter's term unseen
    assert fit.fused_loss_unsupported(model, ["q_proj", "lm_head"]) == (
        "target_modules adapts lm_head, whose adapter it would leave out"
    )
    assert fit.fused_loss_unsupported(model, "all-linear") is None  # peft leaves the head


@pytest.mark.parametrize(("multiplier", "fits"), [(0.078125, False), (1.0, True)])
def test_a_head_scaled_in_the_forward_keeps_the_standard_loss(multiplier, fits) -> None:
    """Falcon-H1 multiplies its head's output by lm_head_multiplier in its forward, a field no
    list of names covered: the fused loss computed the loss of unscaled logits (5.60 where the
    model's own was 5.55 at random init), and no note said so. The logits are now compared
    with the head's product on the loaded model."""
    from transformers import AutoModelForCausalLM, FalconH1Config

    config = FalconH1Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_chunk_size=16,
        lm_head_multiplier=multiplier,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    why = fit.fused_loss_unsupported(model, ["q_proj"])
    assert why == (
        None
        if fits
        else "the model's logits are not its LM head's product with the last hidden state"
    )
    assert model.training  # the check's eval mode is put back


def test_the_head_check_runs_under_a_varlen_kernel(tiny_model_dir) -> None:
    """torch_varlen (the GPU default without flash-attn) needs the collator's boundaries: run
    with it, the check failed and turned the fused loss off on every such run. It runs with
    sdpa, and the run's kernel is put back."""
    from transformers import AutoModelForCausalLM

    from expert_cli.train import attention

    attention.register_torch_varlen()
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation=attention.TORCH_VARLEN
    )
    assert fit.fused_loss_unsupported(model) is None
    assert model.config._attn_implementation == attention.TORCH_VARLEN


def test_a_head_without_a_weight_matrix_keeps_the_standard_loss(tiny_model_dir) -> None:
    """A head module with no `.weight` (ModernBERT's decoder) stopped the run with an
    AttributeError; the fused loss reads that matrix, so the standard loss runs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.lm_head = torch.nn.Sequential(model.lm_head)
    assert fit.fused_loss_unsupported(model) == (
        "the LM head is no linear layer with a weight matrix"
    )


def test_a_moe_router_loss_keeps_the_standard_loss(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.output_router_logits = True  # a MoE's config.json may turn it on
    assert "output_router_logits" in fit.fused_loss_unsupported(model)


def test_zero3_keeps_the_standard_loss(monkeypatch, tiny_model_dir) -> None:
    """ZeRO-3 gathers a partitioned weight in its module's forward; the fused loss reads the
    head's weight without calling the head (DeepSpeed is not installed here: its switch is
    set as transformers' integration reports it)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    monkeypatch.setattr(fit, "is_deepspeed_zero3_enabled", lambda: True)
    assert "ZeRO-3" in fit.fused_loss_unsupported(model)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        fused.summed_linear_cross_entropy(
            "nope", torch.zeros(1, 2), torch.zeros(3, 2), torch.zeros(1, dtype=torch.long)
        )


LIGER_IN_INTERPRETER = """
import torch
from expert_cli.train import loss as fused

assert fused.liger_kernel_fits()
fused.CHUNK_ELEMENTS = 7 * 50  # 7 tokens a chunk: 4 chunks
gen = torch.Generator().manual_seed(0)
for dtype, tol, smooth in ((torch.float32, 1e-4, 0.0), (torch.bfloat16, 5e-2, 0.0),
                          (torch.float32, 1e-4, 0.1)):
    hidden = torch.randn(23, 16, generator=gen).to(dtype).requires_grad_()
    weight = torch.randn(50, 16, generator=gen).to(dtype)
    targets = torch.randint(0, 50, (23,), generator=gen)
    targets[[0, 5, 9, 22]] = -100
    got = fused.summed_linear_cross_entropy("liger", hidden, weight, targets, None, smooth)
    assert got.grad_fn.name() == "LinearCrossEntropyBackward", got.grad_fn.name()
    (grad,) = torch.autograd.grad(got * 1.7, (hidden,))
    logits = hidden.detach().float() @ weight.float().t()
    ref = torch.nn.functional.cross_entropy(
        logits.requires_grad_(), targets, reduction="sum", label_smoothing=smooth
    )
    (ref_logits,) = torch.autograd.grad(ref * 1.7, (logits,))
    torch.testing.assert_close(got.float(), ref, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(grad.float(), ref_logits @ weight.float(), rtol=tol, atol=tol)
    assert grad[[0, 5, 9, 22]].abs().max() == 0
    # an evaluation's count of predicted tokens, from each chunk's logits before the kernel
    # writes its gradient over them
    hits = torch.zeros((), dtype=torch.long)
    with torch.no_grad():
        fused.summed_linear_cross_entropy("liger", hidden.detach(), weight, targets, hits)
    want = ((logits.argmax(-1) == targets) & (targets != -100)).sum()
    assert int(hits) == int(fused.correct_tokens(hidden.detach(), weight, targets)), hits
    assert dtype != torch.float32 or int(hits) == int(want), (hits, want)
print("ok")
"""


@pytest.mark.skipif(
    not (importlib.util.find_spec("triton") and importlib.util.find_spec("liger_kernel")),
    reason="triton and liger-kernel are not installed (the [dev] and [gpu] extras install them)",
)
def test_liger_kernel_loop_matches_cross_entropy_in_tritons_interpreter() -> None:
    """Our loop over Liger's Triton cross-entropy kernel (its arguments as we pass them, the
    summed loss, the gradient it writes over the logits, the ignored rows) against torch's
    cross-entropy, run by Triton's CPU interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", LIGER_IN_INTERPRETER],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_under_autocast_the_head_runs_in_the_autocast_dtype(monkeypatch) -> None:
    """fp32 hidden states under bf16 autocast (fp32 weights, mixed precision): each slice's
    logits are bf16, as the standard head's would be (fp32 took twice the logits' memory)."""
    seen = []
    real = fused._torch_rows

    def rows(logits, targets, out):
        seen.append(logits.dtype)
        return real(logits, targets, out)

    monkeypatch.setattr(fused, "_torch_rows", rows)
    hidden = torch.randn(4, 8, requires_grad=True)
    weight = torch.randn(16, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused.LinearCrossEntropy.apply(hidden, weight, torch.tensor([1, 2, 3, 4]), rows)
    assert seen == [torch.bfloat16]
