"""The one-kernel 4-bit dequantization (train/dequant.py) gives bitsandbytes' weights
(`torch.equal`), run by Triton's CPU interpreter: NF4 and FP4, block scales double-quantized or not,
block sizes 64 and 128, a size that is no multiple of the block, packed in uint8 or in bf16
storage, to bf16, fp16 and fp32; a NaN block scale stays NaN in bf16."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

IN_INTERPRETER = """
import torch
from bitsandbytes.functional import dequantize_4bit as bitsandbytes_dequantize
from bitsandbytes.functional import quantize_4bit
from expert_cli.train.dequant import dequantize_4bit

gen = torch.Generator().manual_seed(0)
cases = 0
for quant_type in ("nf4", "fp4"):
    for nested in (True, False):
        for shape, blocksize, storage in (
            ((96, 130), 64, torch.uint8),
            ((64, 256), 128, torch.bfloat16),
            ((300, 512), 64, torch.uint8),
        ):
            w = torch.randn(*shape, generator=gen) * 0.05
            packed, state = quantize_4bit(
                w, quant_type=quant_type, compress_statistics=nested, blocksize=blocksize,
                quant_storage=storage,
            )
            assert (state.state2 is not None) == nested
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                state.dtype = dtype
                want = bitsandbytes_dequantize(packed, state)
                got = dequantize_4bit(packed, state, dtype)
                assert got.dtype == dtype and got.shape == want.shape, (got.dtype, got.shape)
                assert torch.equal(got, want), (quant_type, nested, shape, dtype)
                cases += 1
# a NaN block scale (the quiet NaN a GPU's multiply returns, all payload bits set) stays NaN
# in bf16: rounding its bits up would carry into the sign (-0.0)
w = torch.randn(4, 128, generator=gen)
packed, state = quantize_4bit(w, quant_type="nf4", compress_statistics=False)
state.absmax[0] = torch.tensor(0x7FFFFFFF, dtype=torch.int32).view(torch.float32)
got = dequantize_4bit(packed, state, torch.bfloat16).flatten()
assert got[:64].isnan().all() and not got[64:].isnan().any(), got[:4]
print("ok", cases)
"""


FUSED_IN_INTERPRETER = """
import sys
import torch
from transformers import BitsAndBytesConfig
sys.path.insert(0, sys.argv[2])
from train_helpers import lora_model
import expert_cli.train.fused_lora as fused_lora
from expert_cli.train import dequant

nf4 = BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16,
)
ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
runs = []
for one_kernel in (False, True):
    fused_lora.ONE_KERNEL_DEQUANT = one_kernel
    model = lora_model(sys.argv[1], nf4)
    assert fused_lora.fuse_lora_linears(model) == 14
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    runs.append((loss.detach(), grads))
    assert len(dequant._KERNEL) == int(one_kernel)  # the one kernel ran, and only when asked
(want, want_grads), (got, got_grads) = runs
assert torch.equal(got, want), (got, want)
assert len(got_grads) == 28 and all(torch.equal(got_grads[n], g) for n, g in want_grads.items())
print("ok", float(got))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (the [dev] and [gpu] extras install it)",
)
def test_one_kernel_equals_bitsandbytes_in_tritons_interpreter(tiny_model_dir) -> None:
    """Both checks in one interpreter (its imports are most of the time): first
    `fused_lora.ONE_KERNEL_DEQUANT` (scripts/bench_train.py's q_int4_one_kernel), whose fused
    4-bit layers dequantize with the one kernel and give the same loss and adapter gradients,
    bit for bit, as with bitsandbytes' dequantization (bf16 compute); then the kernel alone
    against bitsandbytes' weights over the module docstring's cases."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", FUSED_IN_INTERPRETER + IN_INTERPRETER, str(tiny_model_dir), tests],
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=300,
        check=False,
    )
    lines = [line.split() for line in done.stdout.splitlines()]
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line[0] for line in lines] == ["ok", "ok"] and lines[1] == ["ok", "36"], lines
