"""Adapters computed in the compute dtype keep fp32 master weights and optimizer state, skip
peft's fp32 copy of every adapter input, and train to the fp32 path's losses.

Runs the real Trainer on the CPU under bf16 autocast with bf16 base weights, as a GPU run does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import prepared_cpu_run, train_steps, write_expert


def _train(tmp_path: Path, model_dir: Path, precision: str) -> dict:
    from expert_cli.train.model import adapter_compute_dtype

    manifest = write_expert(
        tmp_path / precision,
        model_dir,
        rows=48,
        config={"bf16": True, "adapter_precision": precision, "learning_rate": 5e-3},
        base={"quantization": "bf16"},
    )
    resolved, tokenizer, data, model = prepared_cpu_run(manifest, total_steps=8)
    assert resolved.bf16 and resolved.adapter_precision == precision
    seen: set[torch.dtype] = set()
    first_a = next(m for n, m in model.named_modules() if n.endswith("lora_A.default"))
    first_a.register_forward_pre_hook(lambda mod, args: seen.add(args[0].dtype))
    trainer = train_steps(resolved, tokenizer, data, model, tmp_path / "ckpt", 8)
    states = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    return {
        "computes_in": adapter_compute_dtype(resolved),
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "adapter_input_dtypes": seen,
        "weight_dtypes": {p.dtype for p in model.parameters() if p.requires_grad},
        "state_dtypes": {s["exp_avg"].dtype for s in states},
        "base_dtype": model.get_base_model().model.layers[0].mlp.up_proj.base_layer.weight.dtype,
    }


@pytest.mark.slow
def test_compute_dtype_adapters_match_fp32_adapters(tmp_path: Path, tiny_model_dir: Path) -> None:
    fp32 = _train(tmp_path, tiny_model_dir, "fp32")
    compute = _train(tmp_path, tiny_model_dir, "compute")
    assert (fp32["computes_in"], compute["computes_in"]) == ("fp32", "bf16")
    assert fp32["base_dtype"] == compute["base_dtype"] == torch.bfloat16
    # peft copies each adapter input to fp32; the compute path feeds the bf16 activations
    assert fp32["adapter_input_dtypes"] == {torch.float32}
    assert compute["adapter_input_dtypes"] == {torch.bfloat16}
    # master weights and Adam moments stay fp32 in both
    for run in (fp32, compute):
        assert run["weight_dtypes"] == {torch.float32}
        assert run["state_dtypes"] == {torch.float32}
    assert len(fp32["losses"]) == len(compute["losses"]) == 8
    assert fp32["losses"][-1] < fp32["losses"][0] - 0.05  # it learns
    # under autocast peft's fp32 copy is cast back to bf16 for the matmul, so with no dropout
    # the two paths compute the same numbers: the copy was pure overhead
    for a, b in zip(fp32["losses"], compute["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * a, (fp32["losses"], compute["losses"])
