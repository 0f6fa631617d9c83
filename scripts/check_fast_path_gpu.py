"""On a GPU: the fast path computes what the plain path computes.

1. Attention: for every kernel this machine has, each example's logits inside packed rows equal
   its logits alone (two rows, several examples each, a padding tail; the boundary kernels get
   the collator's explicit sequence boundaries).
2. Loss: each fused linear cross-entropy backend (liger, chunked) gives the standard loss
   and the same adapter gradients on a small Qwen3 in bf16.
3. Adapters: the fused LoRA linear (`adapter_kernel: fused`), alone and grouped by input
   (`grouped`), gives peft's loss and adapter gradients on the same model in bf16, and on
   its NF4 quantization (QLoRA); with dropout 0.05 it is its math in fp32 given the same mask
   (peft draws another), and so is the fused DoRA linear with dropout on a base with a bias.
4. The attention probe `train` runs on the loaded model (train/causality.py) says "verified"
   for every kernel and precision here: no false refusal from a kernel that rounds.
5. QLoRA: one NF4 projection's dequantization (bitsandbytes', and expert-cli's one kernel)
   and the GEMM it feeds, timed, and the bitsandbytes library that ran (int4 through peft's
   layers trained at 0.72x of bf16 through peft's layers on an H100).
6. The loss at Qwen3-0.6B's size (16,384 tokens, 151,936-token vocabulary): Liger's own fused
   function against expert-cli's loop over Liger's kernel: GPU time of a forward and backward,
   the same loss and input gradient, and the host syncs each makes (CUDA's sync debug mode).
7. An evaluation's token accuracy through each fused loss (counted in its forward) equals the
   standard loss's count from its logits, to bf16's ties.

    python scripts/check_fast_path_gpu.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05}


def _config(layers: int = 2):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=32768,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
    )


DEVICE = "cuda"


def _model(attn: str, dtype):
    import torch
    from transformers import AutoModelForCausalLM

    from expert_cli.train.attention import TORCH_VARLEN, register_torch_varlen

    if attn == TORCH_VARLEN:
        register_torch_varlen()
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(_config(), dtype=dtype, attn_implementation=attn)
    return model.eval()


def packed_vs_alone(attn: str, dtype_name: str) -> float:
    """Largest |packed - alone| logit over every token of every example."""
    import torch

    from expert_cli.data.collate import PackedCollator
    from expert_cli.train.attention import BOUNDARY_KERNELS

    dtype = getattr(torch, dtype_name)
    model = _model(attn, dtype)
    reference = _model("sdpa", dtype)
    gen = torch.Generator().manual_seed(1)
    rows_of = [[40, 300, 7, 200], [513, 90]]  # example lengths per row; row 1 is shorter
    examples = [[torch.randint(0, 32768, (n,), generator=gen) for n in row] for row in rows_of]
    rows = [
        {
            "input_ids": torch.cat(row).tolist(),
            "labels": torch.cat(row).tolist(),
            "position_ids": torch.cat([torch.arange(len(e)) for e in row]).tolist(),
        }
        for row in examples
    ]
    batch = PackedCollator(0, boundaries=attn in BOUNDARY_KERNELS)(rows)
    inputs = {
        k: (v.to(DEVICE) if torch.is_tensor(v) else v) for k, v in batch.items() if k != "labels"
    }
    worst = 0.0
    with torch.no_grad():
        packed = model(**inputs, use_cache=False).logits.float()
        for r, row in enumerate(examples):
            start = 0
            for seq in row:
                alone = (
                    reference(input_ids=seq.unsqueeze(0).to(DEVICE), use_cache=False)
                    .logits[0]
                    .float()
                )
                part = packed[r, start : start + len(seq)]
                worst = max(worst, (part - alone).abs().max().item())
                start += len(seq)
    return worst


def isolation(attn: str, dtype_name: str) -> str:
    """The verdict of the probe `train` runs, with the run's autocast for half precision."""
    import torch

    from expert_cli.train.causality import attention_isolation

    dtype = getattr(torch, dtype_name)
    model = _model(attn, dtype).train()
    half = dtype if dtype != torch.float32 else None
    return attention_isolation(model, attn, packing=True, dtype=half)


def loss_parity(backend: str) -> dict[str, float]:
    """Relative difference of the loss and of the adapter gradients, fused vs standard."""
    import torch
    from peft import LoraConfig, get_peft_model

    from expert_cli.train.loss import install_fused_loss

    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 32768, (4, 1024), generator=gen).to(DEVICE)
    labels = ids.clone()
    labels[:, :100] = -100
    out = {}
    for name in ("standard", backend):
        model = _model("sdpa", torch.bfloat16).train()
        if name != "standard":
            install_fused_loss(model, backend)
        torch.manual_seed(3)
        model = get_peft_model(
            model, LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)
        )
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.requires_grad])
        out[name] = (loss.float().item(), grads)
    (ref_loss, ref_grad), (loss, grad) = out["standard"], out[backend]
    return {
        "loss": loss,
        "standard_loss": ref_loss,
        "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
        "grad_rel_diff": ((grad - ref_grad).norm() / ref_grad.norm()).item(),
    }


def accuracy_parity(backend: str) -> dict[str, float]:
    """An evaluation's token accuracy through the fused loss (counted in its forward, no
    logits kept) against the standard loss's logits, on a model whose head reads back the
    embedding (it predicts the token it reads) and rows of tokens written three times."""
    import torch

    from expert_cli.train.loss import HITS, install_fused_loss
    from expert_cli.train.token_accuracy import batch_hits

    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 32768, (4, 342), generator=gen).repeat_interleave(3, dim=1)
    ids = ids.to(DEVICE)
    labels = ids.clone()
    labels[:, :100] = -100
    counted = {}
    for name in ("standard", backend):
        torch.manual_seed(3)
        model = _model("sdpa", torch.bfloat16).eval()
        with torch.no_grad():
            model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight * 8)
        if name != "standard":
            install_fused_loss(model, backend)
        with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
            outputs = model(input_ids=ids, labels=labels, use_cache=False)
        assert (name == "standard") != (HITS in outputs)
        hits, trained = batch_hits(outputs, labels)
        counted[name] = (int(hits), int(trained))
    (standard, trained), (fused, _) = counted["standard"], counted[backend]
    return {"standard_hits": standard, "fused_hits": fused, "trained": trained}


def _loss_round(x, w, targets, items):
    """One forward and backward of the summed loss over `items` trained tokens."""
    from expert_cli.train import loss as fused

    x.grad = None
    loss = fused.summed_linear_cross_entropy("liger", x, w, targets) / items
    loss.backward()
    return loss


def _timed_rounds(args: tuple, rounds: int = 5) -> float:
    """Best GPU ms of `rounds` loss rounds, after two to warm up."""
    import torch

    for _ in range(2):
        _loss_round(*args)
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _loss_round(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return round(min(times), 3)


def _synced_round(args: tuple) -> tuple:
    """One loss round under CUDA's sync debug mode: (loss, the syncs it warned of)."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            loss = _loss_round(*args)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return loss, [str(c.message)[:120] for c in caught if "synchroniz" in str(c.message)]


def loss_timing(tokens: int = 16_384, vocab: int = 151_936, hidden: int = 1024) -> dict:
    """Liger's own fused linear cross-entropy against expert-cli's loop over Liger's kernel
    (`LIGER_LOOP`), on a frozen head: ms per forward and backward (best of 5 after 2 warm-up
    rounds, CUDA events), host syncs of one round (sync debug mode), and how far apart the
    two losses and input gradients are."""
    import torch

    from expert_cli.train import loss as fused

    gen = torch.Generator(device=DEVICE).manual_seed(4)
    h = torch.randn(tokens, hidden, device=DEVICE, generator=gen, dtype=torch.bfloat16)
    w = torch.randn(vocab, hidden, device=DEVICE, generator=gen, dtype=torch.bfloat16) * 0.02
    targets = torch.randint(0, vocab, (tokens,), device=DEVICE, generator=gen)
    targets[::10] = -100
    items = (targets != -100).sum()
    out: dict = {"tokens": tokens, "vocab": vocab}
    out["chunk_tokens"] = fused._chunks(tokens, vocab)[0][1]
    results = {}
    for name, loop in (("library", False), ("loop", True)):
        fused.LIGER_LOOP = loop
        args = (h.clone().requires_grad_(), w, targets, items)
        ms = _timed_rounds(args)
        loss, syncs = _synced_round(args)
        results[name] = (loss.float().item(), args[0].grad.float())
        out[name] = {"ms": ms, "host_syncs": len(syncs), "sync_examples": syncs[:3]}
    fused.LIGER_LOOP = True
    (lib_loss, lib_grad), (loop_loss, loop_grad) = results["library"], results["loop"]
    out["loss_rel_diff"] = abs(loop_loss - lib_loss) / abs(lib_loss)
    out["grad_rel_diff"] = ((loop_grad - lib_grad).norm() / lib_grad.norm()).item()
    out["speed_ratio"] = round(out["library"]["ms"] / out["loop"]["ms"], 3)
    return out


def _lora_pair(int4: bool, dora: bool = False) -> tuple:
    """The same LoRA (or DoRA) model twice (r16, all linear layers, B not zero), on bf16
    weights or on their NF4 quantization (double quantization, bf16 compute, as
    `quantization: int4`)."""
    import copy
    import tempfile

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = LoraConfig(
        r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False, use_dora=dora
    )
    base = _model("sdpa", torch.bfloat16).train()
    if not int4:
        torch.manual_seed(3)
        plain = get_peft_model(base, config)
        return plain, copy.deepcopy(plain)
    nf4 = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    pair = []
    with tempfile.TemporaryDirectory() as folder:
        base.save_pretrained(folder)
        for _ in range(2):
            model = AutoModelForCausalLM.from_pretrained(
                folder, quantization_config=nf4, device_map={"": DEVICE}, attn_implementation="sdpa"
            ).requires_grad_(False)
            torch.manual_seed(3)
            pair.append(get_peft_model(model, config).train())
    return tuple(pair)


def fused_lora_parity(int4: bool = False, grouped: bool = False, dora: bool = False) -> dict:
    """Relative difference of the loss and of the adapter gradients, fused LoRA vs peft, on
    bf16 base layers or (`int4`) on bitsandbytes' NF4 ones; `grouped`: the fused layers that
    read one input computed as one function (`adapter_kernel: grouped`); `dora`: DoRA layers,
    fused against peft's."""
    import torch

    from expert_cli.train.fused_dora import fuse_adapter_linears
    from expert_cli.train.grouped_lora import group_lora_linears

    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 32768, (4, 1024), generator=gen).to(DEVICE)
    plain, fused = _lora_pair(int4, dora)
    switched = fuse_adapter_linears(fused)
    in_groups = group_lora_linears(fused) if grouped else 0
    if grouped:  # a first forward shows the groups their order: they group from the next
        with torch.no_grad():
            fused(input_ids=ids[:1, :8], use_cache=False)
    out = {}
    for name, model in (("peft", plain), ("fused", fused)):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        grads = [p.grad.float().flatten() for p in model.parameters() if p.requires_grad]
        out[name] = (loss.float().item(), grads)
    (ref_loss, ref_grads), (loss, grads) = out["peft"], out["fused"]
    # each adapter tensor's own difference (round 18 on the CPU's bf16: the worst 4.7%, the
    # median 0.69%; rounding, not a bias, where the two agree in the median)
    each = sorted(((g - r).norm() / r.norm()).item() for g, r in zip(grads, ref_grads, strict=True))
    grad, ref_grad = torch.cat(grads), torch.cat(ref_grads)
    groups = fused.__dict__.get("_lora_groups", [])
    return {
        "layers_fused": switched,
        "layers_grouped": in_groups,
        # groups that computed their layers together in the measured forward
        "groups_in_use": sum(g.order is not None and not g.off for g in groups),
        "loss": loss,
        "peft_loss": ref_loss,
        "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
        "grad_rel_diff": ((grad - ref_grad).norm() / ref_grad.norm()).item(),
        "grad_rel_diff_worst_tensor": each[-1],
        "grad_rel_diff_median_tensor": each[len(each) // 2],
    }


def fused_lora_dropout(tokens: int = 4096, dora: bool = False) -> dict[str, float]:
    """The fused LoRA linear (`dora`: the fused DoRA linear, on a base with a bias) with
    dropout 0.05 against its math in fp32 given the same mask (drawn again from the same
    seed): output, input and adapter gradients, relative; and the share of entries kept.
    peft draws its mask differently, so it is not the reference here."""
    import torch

    from expert_cli.train.fused_dora import DoraLinearFunction
    from expert_cli.train.fused_lora import LoraLinearFunction

    torch.manual_seed(1)
    dev, bf16, s, p = DEVICE, torch.bfloat16, 2.0, 0.05
    x = torch.randn(tokens, 1024, device=dev, dtype=bf16, requires_grad=True)
    base = torch.nn.Linear(1024, 2048, bias=dora, device=dev, dtype=bf16).requires_grad_(False)
    a = (torch.randn(16, 1024, device=dev) * 0.02).requires_grad_()
    b = (torch.randn(2048, 16, device=dev) * 0.02).requires_grad_()
    w = base.weight.float()
    # DoRA's magnitude: the norms of W + s B A, off by up to 10% (a trained one)
    m = torch.linalg.vector_norm(w + s * b.detach() @ a.detach(), dim=1)
    m = (m * (0.9 + 0.2 * torch.rand(m.shape, device=dev))).requires_grad_()
    torch.manual_seed(7)
    with torch.autocast(dev, dtype=bf16):
        if dora:
            y = DoraLinearFunction.apply(x, a, b, m, (base, s, p))
        else:
            y = LoraLinearFunction.apply(x, base, a, b, (s, p))
    dy = torch.randn(y.shape, device=dev)
    (y.float() * dy).sum().backward()
    torch.manual_seed(7)
    mask = torch.empty(tokens, 1024, dtype=torch.bool, device=dev).bernoulli_(1 - p)
    x2, a2, b2, m2 = (t.detach().float().requires_grad_() for t in (x, a, b, m))
    d = x2 * mask / (1 - p)
    ref = x2 @ w.t() + s * (d @ a2.t()) @ b2.t()
    if dora:  # peft's DoRA: the norm detached, c = m / ||W + s B A||
        c = m2 / torch.linalg.vector_norm(w + s * b2 @ a2, dim=1).detach()
        lora = (d @ a2.t()) @ b2.t()
        ref = x2 @ w.t() + base.bias.float() + (c - 1) * (d @ w.t()) + c * s * lora
    (ref * dy).sum().backward()

    def rel(mine: torch.Tensor, theirs: torch.Tensor) -> float:
        return ((mine.float() - theirs).norm() / theirs.norm()).item()

    out = {
        "y_rel_diff": rel(y, ref.detach()),
        "x_grad_rel_diff": rel(x.grad, x2.grad),
        "a_grad_rel_diff": rel(a.grad, a2.grad),
        "b_grad_rel_diff": rel(b.grad, b2.grad),
        "kept": mask.float().mean().item(),
    }
    if dora:
        out["m_grad_rel_diff"] = rel(m.grad, m2.grad)
    # the backward draws the mask again from the forward's generator state: the same bits
    from expert_cli.train.fused_lora import draw_mask, mask_again

    drawn, state = draw_mask(x.detach(), p)
    out["mask_drawn_again_same"] = bool(torch.equal(mask_again(x.detach(), p, state), drawn))
    return out


def _per_call(fn, calls: int = 100, rounds: int = 5) -> dict[str, float]:
    """`fn()` called `calls` times back to back: the median over `rounds` of the GPU time per
    call (device events around the whole run: launch gaps hidden, as in a training step) and
    of the host's time per call to launch it (what a launch-bound step pays)."""
    import time

    import torch

    for _ in range(3):  # compiles, allocator, library handles
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - began) / calls * 1e6)
        end.record()
        torch.cuda.synchronize()
        gpu.append(start.elapsed_time(end) / calls * 1e3)
    return {
        "gpu_us": round(sorted(gpu)[rounds // 2], 2),
        "host_us": round(sorted(host)[rounds // 2], 2),
    }


def int4_timing(tokens: int = 16_384) -> dict:
    """Where QLoRA's time goes, on one of Qwen3-0.6B's gate projections (3,072 x 1,024, NF4
    with double quantization, as `quantization: int4`): GPU and host microseconds a call of
    dequantizing it to bf16 as the fused layer does, the same with its block scales
    dequantized beforehand (what keeping them would leave), expert-cli's one-kernel
    dequantization (train/dequant.py: the same weight?), and the bf16 GEMM it feeds at
    `tokens` tokens; the bitsandbytes library that ran (a fallback that is not the CUDA one
    would explain a slow QLoRA)."""
    import bitsandbytes.cextension as ext
    import torch
    from bitsandbytes.functional import (
        QuantState,
        dequantize_4bit,
        dequantize_blockwise,
        quantize_4bit,
    )

    from expert_cli.train import dequant

    torch.manual_seed(0)
    w = torch.randn(3072, 1024, device=DEVICE, dtype=torch.bfloat16) * 0.02
    packed, state = quantize_4bit(w, quant_type="nf4", compress_statistics=True)
    scales = dequantize_blockwise(state.absmax, state.state2) + state.offset
    flat = QuantState(
        absmax=scales.float(),
        shape=state.shape,
        code=state.code,
        blocksize=state.blocksize,
        quant_type=state.quant_type,
        dtype=torch.bfloat16,
    )
    x = torch.randn(tokens, 1024, device=DEVICE, dtype=torch.bfloat16)
    dense = dequantize_4bit(packed, state)
    lib = getattr(getattr(ext.lib, "_lib", None), "_name", None)
    out = {
        "dequantize": _per_call(lambda: dequantize_4bit(packed, state)),
        "dequantize_scales_kept": _per_call(lambda: dequantize_4bit(packed, flat)),
        "gemm": _per_call(lambda: x @ dense.t(), calls=10),
        "same_weight": bool(torch.equal(dequantize_4bit(packed, flat), dense)),
        "weight_rel_err": ((dense.float() - w.float()).norm() / w.float().norm()).item(),
        "library": type(ext.lib).__name__ + (f" {lib}" if lib else ""),
        "bnb_backend": getattr(ext, "BNB_BACKEND", None),
    }
    try:  # its own: a Triton error here keeps bitsandbytes' figures
        one = dequant.dequantize_4bit(packed, state, torch.bfloat16)
        out["one_kernel_same"] = bool(torch.equal(one, dense))
        out["one_kernel"] = _per_call(
            lambda: dequant.dequantize_4bit(packed, state, torch.bfloat16)
        )
    except Exception as exc:
        out["one_kernel_same"], out["one_kernel_error"] = (
            False,
            f"{type(exc).__name__}: {exc}"[:400],
        )
    return out


class Results(list):
    """The checks' results; each also written to stderr as one JSON line when it is added, so
    that a run stopped by its time limit still leaves the ones it finished."""

    def append(self, result: dict) -> None:
        line = json.dumps(result)
        super().append(result)
        print(line, file=sys.stderr, flush=True)


def _failed(check: str, backend: str, exc: Exception) -> dict:
    """A check of a loss backend that raised, as the results record it."""
    error = f"{type(exc).__name__}: {exc}"[:800]
    return {"check": check, "backend": backend, "ok": False, "error": error}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    parser.add_argument("--kernels", default=None, help="only these kernels (comma-separated)")
    parser.add_argument("--no-loss", action="store_true", help="skip the fused-loss checks")
    parser.add_argument(
        "--dora-only",
        action="store_true",
        help="only the fused DoRA checks (bf16, NF4, dropout with a bias): gpu_suite.sh hive",
    )
    args = parser.parse_args()
    args.no_loss = args.no_loss or args.dora_only
    import torch

    global DEVICE
    DEVICE = args.device

    from expert_cli.config.environment import cpu_environment, probe_environment
    from expert_cli.config.kernels import KERNEL_ORDER, kernel_unusable

    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check", file=sys.stderr)
        return 2
    env = probe_environment()
    if DEVICE == "cpu":
        env = cpu_environment()
    results, skipped = Results(), {}
    wanted = args.kernels.split(",") if args.kernels else KERNEL_ORDER
    wanted = [] if args.dora_only else wanted
    for attn in wanted:
        why = kernel_unusable(attn, env, half=True)
        if why:
            skipped[attn] = why
            continue
        dtypes = (
            ["bfloat16"]
            if attn not in ("sdpa", "eager", "flex_attention")
            else ["float32", "bfloat16"]
        )
        for dtype in dtypes:
            try:
                diff = packed_vs_alone(attn, dtype)
                results.append(
                    {
                        "check": "packed_vs_alone",
                        "attn": attn,
                        "dtype": dtype,
                        "max_abs_diff": diff,
                        "tolerance": TOLERANCE[dtype],
                        "ok": diff <= TOLERANCE[dtype],
                    }
                )
            except Exception as exc:  # a kernel that fails here is reported, not fatal
                results.append(
                    {
                        "check": "packed_vs_alone",
                        "attn": attn,
                        "dtype": dtype,
                        "ok": False,
                        "error": f"{type(exc).__name__}: {exc}"[:800],
                    }
                )
            try:
                verdict = isolation(attn, dtype)
            except Exception as exc:  # the model does not build with this kernel: said above
                verdict = f"error: {type(exc).__name__}"
            results.append(
                {
                    "check": "attention_probe",
                    "attn": attn,
                    "dtype": dtype,
                    "verdict": verdict,
                    "ok": verdict == "verified",
                }
            )
    backends = ("liger", "chunked") if DEVICE == "cuda" else ("chunked",)
    for backend in () if args.no_loss else backends:
        try:
            parity = loss_parity(backend)
            ok = parity["loss_rel_diff"] < 2e-3 and parity["grad_rel_diff"] < 5e-2
            results.append({"check": "loss_parity", "backend": backend, **parity, "ok": ok})
        except Exception as exc:
            results.append(_failed("loss_parity", backend, exc))
        try:  # the same count of predicted tokens, to bf16's ties
            counts = accuracy_parity(backend)
            ok = abs(counts["fused_hits"] - counts["standard_hits"]) <= 0.005 * counts["trained"]
            ok = ok and counts["standard_hits"] > 0.3 * counts["trained"]
            results.append({"check": "accuracy_parity", "backend": backend, **counts, "ok": ok})
        except Exception as exc:
            results.append(_failed("accuracy_parity", backend, exc))
    if DEVICE == "cuda" and not args.no_loss:
        try:
            timing = loss_timing()
            ok = (
                timing["loss_rel_diff"] < 1e-3
                and timing["grad_rel_diff"] < 2e-2
                and timing["loop"]["host_syncs"] == 0
            )
            results.append({"check": "loss_timing", "backend": "liger", **timing, "ok": ok})
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:800]
            results.append(
                {"check": "loss_timing", "backend": "liger", "ok": False, "error": error}
            )
    if DEVICE == "cuda" and not args.dora_only:
        try:
            timing = int4_timing()
            ok = timing["same_weight"] and timing["one_kernel_same"]
            results.append({"check": "int4_timing", **timing, "ok": ok})
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:800]
            results.append({"check": "int4_timing", "ok": False, "error": error})
    pairs = [(i, g, False) for g in (False, True) for i in (False, True)]
    pairs = [] if args.dora_only else pairs
    for int4, grouped, dora in [*pairs, (False, False, True), (True, False, True)]:
        kind = "fused_dora" if dora else "grouped_lora" if grouped else "fused_lora"
        check = kind + ("_int4" if int4 else "")
        try:
            parity = fused_lora_parity(int4, grouped, dora)
            ok = parity["loss_rel_diff"] < 2e-3 and parity["grad_rel_diff"] < 5e-2
            ok = ok and parity["layers_fused"] > 0 and (parity["groups_in_use"] > 0) == grouped
            results.append({"check": check, **parity, "ok": ok})
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:800]
            results.append({"check": check, "ok": False, "error": error})
    for dora in (True,) if args.dora_only else (False, True):  # DoRA with dropout: HiveLLM's
        check = "fused_dora_dropout" if dora else "fused_lora_dropout"
        try:
            dropped = fused_lora_dropout(dora=dora)
            ok = max(v for k, v in dropped.items() if k.endswith("diff")) < 2e-2
            ok = ok and abs(dropped["kept"] - 0.95) < 0.01 and dropped["mask_drawn_again_same"]
            results.append({"check": check, **dropped, "ok": ok})
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:800]
            results.append({"check": check, "ok": False, "error": error})
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else None
    report = {"gpu": gpu, "results": results, "skipped": skipped}
    if args.json:
        print(json.dumps(report))
    else:
        for r in results:
            what = r.get("attn", r.get("backend", "peft"))
            detail = r.get("error") or {
                k: v for k, v in r.items() if k.endswith("diff") or k in ("dtype", "verdict")
            }
            print(f"{r['check']:16s} {what:18s} {'ok' if r['ok'] else 'FAIL'} {detail}")
        for attn, why in skipped.items():
            print(f"skipped          {attn:18s} {why}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
