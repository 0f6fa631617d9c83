"""scripts/profile_step.py's timeline: busy time with overlaps merged, and the gaps between
kernels in which the GPU waited (a launch-bound step's signature)."""

from __future__ import annotations

import pytest
from train_helpers import load_script


def _load():
    return load_script("profile_step")


def test_gaps_merges_overlaps_and_measures_the_holes() -> None:
    gaps = _load().gaps
    # two streams overlap in 0-10 and 5-12; a hole of 3, then 15-20; a hole of 10, then 30-31
    got = gaps([(15.0, 20.0), (0.0, 10.0), (5.0, 12.0), (30.0, 31.0), (16.0, 18.0)], top=1)
    assert got["span"] == 31.0
    assert got["busy"] == 12.0 + 5.0 + 1.0
    assert got["idle"] == 13.0 and got["gaps"] == 2 and got["longest"] == [10.0]
    assert got["idle_share"] == pytest.approx(13.0 / 31.0)


def test_gaps_of_nothing_or_back_to_back_kernels() -> None:
    gaps = _load().gaps
    assert gaps([])["span"] == 0.0 and gaps([])["idle_share"] == 0.0
    touching = gaps([(0.0, 1.0), (1.0, 2.0), (2.0, 5.0)])
    assert touching["idle"] == 0.0 and touching["gaps"] == 0 and touching["busy"] == 5.0


def test_kernels_are_summed_by_kind() -> None:
    """Kernel names as an H100 profile showed them (2026-11-23): each counted once, in its
    kind, shares of the whole; FA4's CUTLASS kernels are attention and CUTLASS's RoPE copy is
    RoPE, not matmuls."""
    kinds = _load().kinds
    got = kinds(
        [
            ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 19.0, 392),
            ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", 1.0, 28),
            (
                "kernel_cutlass_kernel_flash_attncuteflash_bwd_sm90FlashAttentionBackwardSm90",
                16.0,
                28,
            ),
            ("kernel_cutlass__rope_tma_qk_kernel_CopyAtom_ThrID10", 4.0, 56),
            ("_block_rms_norm_backward_kernel", 7.0, 57),
            ("_swiglu_backward_kernel", 5.0, 28),
            ("liger_cross_entropy_kernel", 4.0, 10),
            (
                "void at::native::vectorized_elementwise_kernel<8, CUDAFunctor_add<BFloat16>>",
                27.0,
                582,
            ),
            (
                "void at::native::(anonymous)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
                2.0,
                4,
            ),
            ("void at::native::bernoulli_tensor_cuda_kernel<bool>", 3.0, 196),
            ("kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>", 6.0, 392),
            ("something_new", 5.0, 1),
        ]
    )
    assert list(got) == [
        "elementwise",
        "matmul",
        "attention",
        "swiglu_rope",
        "norm",
        "dequantize",
        "other",
        "cross_entropy",
        "dropout",
        "optimizer",
    ]
    assert got["matmul"]["time"] == 20.0 and got["matmul"]["calls"] == 420
    assert got["swiglu_rope"]["time"] == 9.0 and got["attention"]["time"] == 16.0
    assert sum(v["share"] for v in got.values()) == pytest.approx(1.0)
    assert got["elementwise"]["share"] == pytest.approx(27.0 / 99.0)
    assert kinds([]) == {}
