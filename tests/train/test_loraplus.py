"""LoRA+ (`training.config.loraplus_lr_ratio`, an extension): each adapter's B trained at a
higher learning rate than its A, by the Trainer's own optimizer with B in groups of their
own, the schedule applied to both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from train_helpers import lora_model, run_here, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.errors import UserError
from expert_cli.train.loraplus import split_b_groups


def test_b_moves_at_the_ratio_of_as_rate(tiny_model_dir: Path) -> None:
    """Adam's first step moves each weight by about its group's learning rate: B by 16 x A's,
    the weight-decay groups kept apart with their own decay."""
    model = lora_model(tiny_model_dir)
    named = {n: p for n, p in model.named_parameters() if p.requires_grad}
    decay = [p for n, p in named.items() if "lora_A" in n]
    rest = [p for n, p in named.items() if "lora_A" not in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.0}, {"params": rest, "weight_decay": 0.0}], lr=1e-3
    )
    moved = split_b_groups(optimizer, model, 16.0)
    assert moved == sum(1 for n in named if "lora_B" in n) > 0
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, pytest.approx(1.6e-2)]
    first = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert all("lora_B" not in n for n, p in named.items() if id(p) in first)
    before = {n: p.detach().clone() for n, p in named.items()}
    for p in named.values():
        p.grad = torch.ones_like(p)
    optimizer.step()
    step = {n: (p.detach() - before[n]).abs().mean().item() for n, p in named.items()}
    a = [v for n, v in step.items() if "lora_A" in n]
    b = [v for n, v in step.items() if "lora_B" in n]
    assert min(a) == pytest.approx(1e-3, rel=1e-3) and max(a) == pytest.approx(1e-3, rel=1e-3)
    assert min(b) == pytest.approx(1.6e-2, rel=1e-3) and max(b) == pytest.approx(1.6e-2, rel=1e-3)


def test_a_run_trains_b_at_the_ratio_and_resumes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Through train: the checkpoint's optimizer holds B's group at 16 x A's rate, scheduled;
    a resume with the same ratio fits its groups; another ratio is another run."""
    config = {"loraplus_lr_ratio": 16, "save_steps": 2, "learning_rate": 1e-3,
              "lr_scheduler": "constant", "warmup_steps": 0}  # fmt: skip
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config=config, rows=16)
    run = tmp_path / "run"
    first = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    state = torch.load(run / "checkpoints" / "checkpoint-2" / "optimizer.pt", weights_only=False)
    rates = sorted(round(g["lr"], 9) for g in state["param_groups"])
    assert rates[0] == 1e-3 and rates[-1] == 1.6e-2, rates
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    assert resolved["loraplus_lr_ratio"] == 16.0
    more = run_here(
        "train", "-m", str(manifest), "--output", str(run), "--resume", "--max-steps", "4"
    )
    assert more.returncode == 0, more.stdout + more.stderr
    other = run_here("train", "-m", str(manifest), "--output", str(run), "--resume",
                     "--max-steps", "6", "--set", "loraplus_lr_ratio=4")  # fmt: skip
    said = " ".join((other.stdout + other.stderr).split())
    assert other.returncode == 2 and "loraplus_lr_ratio 16.0 -> 4.0" in said, said


def test_where_it_does_not_apply(tmp_path: Path, tiny_model_dir: Path) -> None:
    ia3 = write_expert(tmp_path / "ia3", tiny_model_dir,
                       config={"loraplus_lr_ratio": 16, "adapter_type": "ia3"})  # fmt: skip
    resolved = resolve(load_manifest(ia3), cpu_environment())
    assert resolved.loraplus_lr_ratio is None
    assert (
        "loraplus_lr_ratio: LoRA+ trains LoRA's and DoRA's B; not applied to ia3" in resolved.notes
    )
    manifest = write_expert(tmp_path / "ds", tiny_model_dir, config={"loraplus_lr_ratio": 16})
    data = json.loads(manifest.read_text())
    data["training"]["distributed"] = {
        "strategy": "deepspeed",
        "deepspeed": {"zero_optimization": {}},
    }
    manifest.write_text(json.dumps(data))
    with pytest.raises(UserError, match="loraplus_lr_ratio: under DeepSpeed"):
        resolve(load_manifest(manifest), cpu_environment())
