"""After a few steps every trainable parameter has changed and no frozen one has."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import write_expert

ADAPTERS = {
    "lora": {}, "dora": {"adapter_type": "dora"}, "ia3": {"adapter_type": "ia3"},
    "lokr": {"adapter_type": "lokr"},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(ADAPTERS))
def test_every_trainable_parameter_changes(kind: str, tmp_path: Path,
                                           tiny_model_dir: Path) -> None:
    import torch
    from transformers import TrainingArguments

    from expert_cli.config import load_manifest
    from expert_cli.data import prepare_data
    from expert_cli.data.collate import PackedCollator
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.environment import cpu_environment
    from expert_cli.modeling import attach_adapter, load_base_model
    from expert_cli.resolve import resolve
    from expert_cli.trainer_setup import (
        CountingCollator,
        expert_trainer_class,
        training_args_kwargs,
    )

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=32,
                            config={"learning_rate": 1e-2, **ADAPTERS[kind]})
    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    data = prepare_data(resolved, tokenizer, show_progress=False)
    model, _ = load_base_model(resolved, "cpu")
    model = attach_adapter(model, resolved, total_steps=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TrainingArguments(**training_args_kwargs(resolved, tmp_path / "ckpt", max_steps=3,
                                                    has_eval=False))
    trainer = expert_trainer_class()(
        model=model, args=args, train_dataset=data.train,
        data_collator=CountingCollator(PackedCollator(tokenizer.pad_token_id)))
    trainer.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable, "no trainable parameters"
    for name, param in model.named_parameters():
        changed = not torch.equal(before[name], param.detach())
        assert changed == (name in trainable), f"{name}: changed={changed}"
