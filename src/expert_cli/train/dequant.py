"""A bitsandbytes 4-bit weight dequantized in one Triton kernel.

bitsandbytes dequantizes a double-quantized weight (`quantization: int4`: NF4 codes, their
per-64 block scales stored as 8-bit codes with per-256 scales of their own) in three kernels:
the block scales to fp32 (with an allocation), their offset added, then the weights. The
fused LoRA layers dequantize each 4-bit weight in the forward and again in the backward, 392
times a step for Qwen3-0.6B. This kernel reads the packed codes and both levels of scales
and writes the weight once: for each element, high nibble first as bitsandbytes packs them,

    w[i] = code[nibble(i)] * (code2[absmax[i // 64]] * absmax2[i // (64 * 256)] + offset)

(or `code[nibble(i)] * absmax[i // 64]` where the scales are kept in fp32), computed in fp32
and rounded once to the output dtype, as bitsandbytes' own kernels do (the scale rounded
before its offset is added: no fused multiply-add). It equals bitsandbytes' result
(`torch.equal`: FP4's zero may come out with the other sign) in Triton's CPU interpreter
(tests/train/test_dequant.py).
The fused 4-bit LoRA layers use it where `fused_lora.ONE_KERNEL_DEQUANT` is set (off until
timed on a GPU: `scripts/check_fast_path_gpu.py` times it against bitsandbytes' path, and
`scripts/bench_train.py`'s q_int4_one_kernel trains with it).
"""

from __future__ import annotations

from typing import Any

import torch

BLOCK = 1024  # output elements a program writes


def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def dequantize_4bit_kernel(
        packed,
        code,
        absmax,
        code2,
        absmax2,
        offset,
        out,
        n,
        BLOCKSIZE: tl.constexpr,
        BLOCKSIZE2: tl.constexpr,
        NESTED: tl.constexpr,
        BF16: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        byte = tl.load(packed + idx // 2, mask=inside, other=0).to(tl.int32)
        nibble = tl.where(idx % 2 == 0, byte >> 4, byte & 15)
        value = tl.load(code + nibble, mask=inside, other=0.0)
        block = idx // BLOCKSIZE
        if NESTED:
            q = tl.load(absmax + block, mask=inside, other=0).to(tl.int32)
            scale = tl.load(code2 + q, mask=inside, other=0.0)
            scale = scale * tl.load(absmax2 + block // BLOCKSIZE2, mask=inside, other=0.0)
            scale = scale + tl.load(offset)
        else:
            scale = tl.load(absmax + block, mask=inside, other=0.0)
        w = value * scale
        if BF16:  # rounded to nearest even by hand: the same bits on a GPU and in Triton's
            bits = w.to(tl.uint32, bitcast=True)  # interpreter, which truncates a cast
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            bits = tl.where(w != w, 0x7FC0, bits)  # NaN stays NaN (the carry would wrap it)
            tl.store(out + idx, bits.to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=inside)
        else:
            tl.store(out + idx, w.to(out.dtype.element_ty), mask=inside)

    return dequantize_4bit_kernel


_KERNEL: list[Any] = []  # compiled once, on first use


def dequantize_4bit(packed: torch.Tensor, state: Any, dtype: torch.dtype) -> torch.Tensor:
    """The weight of `packed` (bitsandbytes' packed 4-bit storage, any storage dtype) and its
    QuantState `state`, as a `state.shape` tensor of `dtype` on the same device."""
    import triton

    if not _KERNEL:
        _KERNEL.append(_kernel())
    out = torch.empty(tuple(state.shape), dtype=dtype, device=packed.device)
    n = out.numel()
    nested = state.state2 is not None
    codes = packed.contiguous().reshape(-1).view(torch.uint8)
    absmax = state.absmax if nested else state.absmax.float()
    code2 = state.state2.code if nested else absmax  # not read without nesting
    absmax2 = state.state2.absmax if nested else absmax
    offset = state.offset if nested else absmax
    if not torch.is_tensor(offset):  # bitsandbytes keeps a tensor; a number, made one once
        offset = state.offset = torch.tensor(float(offset), device=packed.device)
    # no fused multiply-add: bitsandbytes rounds the block scale before adding its offset
    _KERNEL[0][(triton.cdiv(n, BLOCK),)](
        codes,
        state.code.float(),
        absmax,
        code2,
        absmax2,
        offset.float(),
        out,
        n,
        BLOCKSIZE=state.blocksize,
        BLOCKSIZE2=state.state2.blocksize if nested else 1,
        NESTED=nested,
        BF16=dtype == torch.bfloat16,
        BLOCK=BLOCK,
        enable_fp_fusion=False,
    )
    return out
