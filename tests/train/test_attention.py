"""Packed rows are contamination-free: each example's logits equal those of the example alone,
for every attention kernel that runs on a CPU.

sdpa, eager and flex get the block-diagonal mask that transformers builds from restarting
`position_ids`; torch_varlen reads the collator's explicit sequence boundaries. torch's varlen
kernel itself runs only on CUDA, so here a per-example SDPA stands in for it (same signature);
the real kernel is checked on a GPU by scripts/check_packed_attention_gpu.py.
"""

from __future__ import annotations

import functools

import pytest
import torch

from expert_cli.data.collate import PackedCollator
from expert_cli.train import attention

LENGTHS = [7, 12, 5, 9, 3]
ROWS = [[0, 1], [2, 3, 4]]  # examples per packed row; row 0 is shorter (gets padding)


def packed_rows(examples: list[list[int]]) -> list[dict]:
    rows = []
    for members in ROWS:
        ids = [t for i in members for t in examples[i]]
        pos = [p for i in members for p in range(len(examples[i]))]
        rows.append({"input_ids": ids, "labels": ids, "position_ids": pos})
    return rows


def reference_varlen(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    return_aux=None,
):
    """torch.nn.attention.varlen.varlen_attn's contract, one example at a time with SDPA."""
    assert window_size == (-1, 0) and max_q == max_k
    assert cu_seq_q.dtype == torch.int32 and cu_seq_q is cu_seq_k
    out = torch.empty_like(query)
    bounds = cu_seq_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == query.shape[0]
    for start, end in zip(bounds, bounds[1:], strict=False):
        assert end - start <= max_q
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa
        ).transpose(0, 1)
    return out


def _logits(model, batch) -> torch.Tensor:
    extra = {
        k: batch[k]
        for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
        if k in batch
    }
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            use_cache=False,
            **extra,
        ).logits


def check_packed_equals_alone(model_dir, attn: str) -> int:
    from transformers import AutoModelForCausalLM

    if attn == attention.TORCH_VARLEN:
        attention.register_torch_varlen()
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation=attn, dtype=torch.float32
    ).eval()
    gen = torch.Generator().manual_seed(0)
    examples = [torch.randint(10, 3000, (n,), generator=gen).tolist() for n in LENGTHS]
    collate = PackedCollator(pad_token_id=0, boundaries=attn in attention.BOUNDARY_KERNELS)
    logits = _logits(model, collate(packed_rows(examples)))
    sdpa = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        alone = [sdpa(input_ids=torch.tensor([ex]), use_cache=False).logits[0] for ex in examples]
    checked = 0
    for r, members in enumerate(ROWS):
        offset = 0
        for i in members:
            got = logits[r, offset : offset + LENGTHS[i]]
            torch.testing.assert_close(got, alone[i], atol=1e-4, rtol=1e-4)
            offset += LENGTHS[i]
            checked += 1
    return checked


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_unpacked(tiny_model_dir, attn: str) -> None:
    assert check_packed_equals_alone(tiny_model_dir, attn) == len(LENGTHS)


def test_torch_varlen_reads_the_collators_boundaries(tiny_model_dir, monkeypatch) -> None:
    import torch.nn.attention.varlen as varlen

    calls = []

    @functools.wraps(reference_varlen)  # inspect.signature sees the reference's keywords
    def spy(*args, **kwargs):
        calls.append(args[3].tolist())
        return reference_varlen(*args, **kwargs)

    monkeypatch.setattr(varlen, "varlen_attn", spy)
    attention._varlen_fn.cache_clear()
    try:
        assert check_packed_equals_alone(tiny_model_dir, attention.TORCH_VARLEN) == len(LENGTHS)
    finally:
        attention._varlen_fn.cache_clear()
    # two layers, each called with every example's start laid over both rows: row 0 holds
    # 7 + 12 = 19 tokens, row 1 holds 5 + 9 + 3 = 17 then 2 padding tokens (own segment)
    assert calls == [[0, 7, 19, 24, 33, 36, 38]] * 2


def test_torch_varlen_without_boundaries_is_an_error(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    attention.register_torch_varlen()
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation=attention.TORCH_VARLEN
    )
    with pytest.raises(RuntimeError, match="sequence boundaries"):
        model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=False)


@pytest.mark.slow
def test_flex_attention_packed_logits_equal_unpacked(tiny_model_dir) -> None:
    """Flex attention compiles its block mask (about 30 s on a CPU)."""
    assert check_packed_equals_alone(tiny_model_dir, "flex_attention") == len(LENGTHS)


def test_without_restarting_positions_examples_do_mix(tiny_model_dir) -> None:
    """The check above can fail: the same packed row with plain positions differs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    first, second = [11, 12, 13, 14], [21, 22, 23]
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([first + second]), use_cache=False).logits[0]
        alone = model(input_ids=torch.tensor([second]), use_cache=False).logits[0]
    assert not torch.allclose(packed[4:], alone, atol=1e-4)


def test_boundary_kernels_skip_transformers_packed_row_check(tiny_model_dir, monkeypatch) -> None:
    """flash-attention 2/4 have a mask function in transformers, so before every forward it
    asks whether the positions restart (a host sync). torch_varlen, registered here the same
    way, shows it: with the mask-free mapping the trainer adds, the question is never asked
    and the logits are the same."""
    from transformers import AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    from expert_cli.telemetry.ops import OpCounter

    monkeypatch.setattr(varlen_module(), "varlen_attn", reference_varlen)
    monkeypatch.setitem(
        AttentionMaskInterface._global_mapping, attention.TORCH_VARLEN, flash_attention_mask
    )
    attention._varlen_fn.cache_clear()
    attention.register_torch_varlen()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            tiny_model_dir, attn_implementation=attention.TORCH_VARLEN, dtype=torch.float32
        ).eval()
        mapping = attention.mask_free_mapping(model, attention.TORCH_VARLEN)
        assert mapping == {"full_attention": None}
        assert attention.mask_free_mapping(model, "sdpa") is None  # sdpa needs its mask
        gen = torch.Generator().manual_seed(0)
        examples = [torch.randint(10, 3000, (n,), generator=gen).tolist() for n in LENGTHS]
        batch = PackedCollator(pad_token_id=0, boundaries=True)(packed_rows(examples))
        with OpCounter() as default:
            built = _logits(model, batch)
        with_mapping = attention.skip_mask_building(dict(batch), mapping)
        assert with_mapping["attention_mask"] == {"full_attention": None}
        with OpCounter() as skipped, torch.no_grad():
            given = model(use_cache=False, **with_mapping).logits
    finally:
        attention._varlen_fn.cache_clear()
    asked = default.syncs_from("transformers")
    assert any("find_packed_sequence_indices" in k for k in asked), default.syncs
    assert skipped.syncs_from("transformers") == {}, skipped.syncs
    torch.testing.assert_close(given, built, atol=0, rtol=0)


def test_the_mask_mapping_is_found_under_a_peft_adapter(tiny_model_dir) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    for kernel in sorted(attention.BOUNDARY_KERNELS):
        assert attention.mask_free_mapping(peft_model, kernel) == {"full_attention": None}
    for kernel in ("sdpa", "eager", "flex_attention"):
        assert attention.mask_free_mapping(peft_model, kernel) is None
    model.config.sliding_window = 4
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    assert attention.mask_free_mapping(peft_model, "flash_attention_2") is None


def test_the_mask_mapping_is_only_added_to_a_batch_with_boundaries_and_no_mask() -> None:
    mapping = {"full_attention": None}
    plain = {"input_ids": torch.ones(1, 3)}
    assert "attention_mask" not in attention.skip_mask_building(dict(plain), mapping)
    own = {"cu_seq_lens_q": torch.tensor([0, 3]), "attention_mask": torch.ones(1, 3)}
    assert torch.is_tensor(attention.skip_mask_building(dict(own), mapping)["attention_mask"])
    bounded = {"cu_seq_lens_q": torch.tensor([0, 3])}
    assert "attention_mask" not in attention.skip_mask_building(dict(bounded), None)


def varlen_module():
    import torch.nn.attention.varlen as varlen

    return varlen


def test_torch_varlen_is_refused_where_its_kernel_would_attend_otherwise() -> None:
    """Mistral and Gemma 2/3 configs have no `use_sliding_window` switch: the sliding window
    went unseen (a traceback at the first step), and Gemma 2's attention soft-capping was
    dropped by torch's varlen kernel (logits 0.43 off on a scale of 0.63, silently)."""
    from transformers import (
        Gemma2Config,
        Gemma3Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
    )

    refused = {
        "window": [
            Gemma3Config(),
            MistralConfig(),
            Gemma3TextConfig(),
            Qwen2Config(use_sliding_window=True, sliding_window=64),
        ],
        "soft-caps": [Gemma2Config(layer_types=["full_attention"] * 26, sliding_window=None)],
    }
    for why, configs in refused.items():
        for config in configs:
            with pytest.raises(ValueError, match="sliding-window" if why == "window" else why):
                attention.check_model_config(attention.TORCH_VARLEN, config)
    every_layer_full = Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=99)
    for config in (
        LlamaConfig(),
        Qwen3Config(),
        Qwen2Config(),
        MistralConfig(sliding_window=None),
        every_layer_full,  # its layer types say no layer slides
    ):
        attention.check_model_config(attention.TORCH_VARLEN, config)  # nothing to refuse
        assert not attention.uses_sliding_window(config)
    attention.check_model_config("sdpa", MistralConfig())  # sdpa reads the window's mask
