"""The Trainer's per-step walks over every module answered from lists made once per run
(train/step_walks.py): the same modes, gradients, norms and FLOP counts, no walk in a step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import lora_model
from transformers import TrainerCallback

from expert_cli.train.step_walks import StepWalks


def _backward(model: Any) -> None:
    ids = torch.randint(0, 200, (2, 6))
    model(input_ids=ids, labels=ids).loss.backward()


def test_train_skips_the_walk_only_when_every_module_is_in_that_mode(tiny_model_dir: Path) -> None:
    model = lora_model(tiny_model_dir)
    model.train()
    walks = StepWalks(model)
    assert model.train() is model and all(m.training for m in model.modules())
    # a module set apart from the root (as an evaluation does) is put back
    dropout_free = next(m for n, m in model.named_modules() if n.endswith("q_proj"))
    dropout_free.eval()
    model.train()
    assert dropout_free.training and all(m.training for m in model.modules())
    model.eval()  # through the class's own walk: every module
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())
    walks.release()
    assert "train" not in model.__dict__ and "zero_grad" not in model.__dict__
    assert model.train.__func__ is torch.nn.Module.train


def test_dora_layers_always_get_their_own_train(tiny_model_dir: Path) -> None:
    """peft's DoRA layers clear a cache in `train`: for them the walk always runs."""
    model = lora_model(tiny_model_dir, use_dora=True)
    model.train()
    StepWalks(model)
    dora = next(m for m in model.modules() if hasattr(m, "_dora_cache"))
    dora._dora_cache["probe"] = torch.zeros(1)
    model.train()
    assert dora._dora_cache == {}


def test_zero_grad_and_clipping_as_torch_does(tiny_model_dir: Path) -> None:
    model = lora_model(tiny_model_dir)
    model.train()
    walks = StepWalks(model)
    _backward(model)
    with_grad = [p for p in model.parameters() if p.grad is not None]
    assert with_grad and all(p.requires_grad for p in with_grad)
    grads = [p.grad.clone() for p in with_grad]
    listed = torch.nn.utils.clip_grad_norm_(walks.parameters, 0.01)
    clipped = [p.grad.clone() for p in with_grad]
    for p, g in zip(with_grad, grads, strict=True):
        p.grad = g.clone()
    own = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    assert torch.equal(listed, own) and listed > 0.01
    assert all(torch.equal(a, p.grad) for a, p in zip(clipped, with_grad, strict=True))
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    _backward(model)
    model.zero_grad(set_to_none=False)  # torch's own: zeroed in place
    kept = [p.grad for p in model.parameters() if p.grad is not None]
    assert kept and not any(g.any() for g in kept)


def test_flop_parameters_is_the_models_own_count(tiny_model_dir: Path) -> None:
    model = lora_model(tiny_model_dir)
    walks = StepWalks(model)
    expected = model.num_parameters(exclude_embeddings=True)
    assert walks.flop_parameters(model) == expected
    assert expected < sum(p.numel() for p in model.parameters())  # embeddings left out


def test_the_trainers_flops_and_clipping_from_the_lists(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from train_helpers import prepared_cpu_run, write_expert
    from transformers import Trainer, TrainingArguments

    from expert_cli.train.args import training_args_kwargs
    from expert_cli.train.trainer import build_trainer

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16)
    resolved, tokenizer, data, model = prepared_cpu_run(manifest, total_steps=1)
    args = TrainingArguments(**training_args_kwargs(resolved, tmp_path / "run", max_steps=1))
    trainer, _ = build_trainer(model, args, data, tokenizer, "sdpa")
    trainer.walks = StepWalks(trainer.model)
    batch = {"input_ids": torch.zeros(3, 7, dtype=torch.long)}
    own = Trainer.floating_point_ops(trainer, batch)
    assert own > 0 and trainer.floating_point_ops(batch) == own
    _backward_ids = torch.randint(0, 100, (2, 8))
    trainer.model(input_ids=_backward_ids, labels=_backward_ids).loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    listed = trainer._clip_grad_norm(trainer.model)
    clipped = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if n in grads}
    for n, p in trainer.model.named_parameters():
        if n in grads:
            p.grad = grads[n].clone()
    reference = Trainer._clip_grad_norm(trainer, trainer.model)
    assert torch.equal(listed, reference)
    assert all(
        torch.equal(clipped[n], p.grad) for n, p in trainer.model.named_parameters() if n in grads
    )
    trainer.walks.release()


class _Walks(TrainerCallback):
    """Counts torch's module walks from optimizer step `start` on."""

    def __init__(self, start: int) -> None:
        self.start, self.walks, self.counting, self.model = start, 0, False, None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.counting = state.global_step + 1 >= self.start
        self.model = kw.get("model")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.counting = False


def test_a_training_step_walks_no_module_tree(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps after the first walk no module tree (no `named_modules`, no `children` as
    `Module.train` walks); the model's own methods are back after training."""
    from train_helpers import write_expert

    from expert_cli.train.run import Silent, TrainOptions, train

    probe = _Walks(start=2)

    def counting(name: str) -> None:  # torch's walks: parameters() and modules(), train()
        own = getattr(torch.nn.Module, name)

        def counted(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if probe.counting:
                probe.walks += 1
            return own(self, *args, **kwargs)

        monkeypatch.setattr(torch.nn.Module, name, counted)

    counting("named_modules")
    counting("children")
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=24, config={"logging_steps": 100})
    opts = TrainOptions(manifest=manifest, output=tmp_path / "run", max_steps=4)
    result = train(opts, Silent([probe]))
    assert result.status == "completed"
    assert probe.walks == 0
    model = probe.model
    assert model is not None
    assert "train" not in model.__dict__ and "zero_grad" not in model.__dict__
    # walks are counted at all when they happen (the probe can fail)
    probe.counting = True
    model.train()
    assert probe.walks > 0
    probe.walks = 0
    list(model.parameters())
    assert probe.walks > 0
