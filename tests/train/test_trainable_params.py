"""After a few steps every trainable parameter has changed and no frozen one has."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import prepared_cpu_run, train_steps, write_expert

ADAPTERS = {
    "lora": {},
    "dora": {"adapter_type": "dora"},
    "ia3": {"adapter_type": "ia3"},
    "lokr": {"adapter_type": "lokr"},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_every_trainable_parameter_changes(kind: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    import torch

    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=32, config={"learning_rate": 1e-2, **ADAPTERS[kind]}
    )
    resolved, tokenizer, data, model = prepared_cpu_run(manifest, total_steps=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_steps(resolved, tokenizer, data, model, tmp_path / "ckpt", 3)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "no trainable parameters"
    for name, param in model.named_parameters():
        changed = not torch.equal(before[name], param.detach())
        assert changed == (name in trainable), f"{name}: changed={changed}"
