"""A run whose folder is removed under it writes nothing more there: not at a step's log
(tests/cli/test_run_folders.py), an evaluation's log (which may come minutes later) or a
checkpoint, where it wrote a traceback or into another run's folder."""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import datasets
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from expert_cli.train.folder_guard import FolderGuard, FolderLost, claim
from expert_cli.train.trainer import build_trainer

DEMO_MODEL = Path(__file__).parents[2] / "experts" / "demo" / "model"


def test_a_log_or_a_checkpoint_after_the_folder_went_is_not_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hold = claim(out)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(DEMO_MODEL))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    args = TrainingArguments(
        output_dir=str(out / "checkpoints"),
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    rows = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7], "position_ids": [0, 1, 2]}] * 2
    data = types.SimpleNamespace(train=datasets.Dataset.from_list(rows), eval=None, stats={})
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL)
    trainer, _ = build_trainer(model, args, data, tokenizer, "sdpa")
    trainer.callback_handler.callbacks.insert(0, FolderGuard(hold, out))
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    trainer.state.global_step = 1
    trainer._save_checkpoint(trainer.model, None)  # the folder its own: saved
    assert (out / "checkpoints" / "checkpoint-1" / "adapter_model.safetensors").is_file()
    shutil.rmtree(out)  # `rm -rf`, then a second train's claim
    out.mkdir()
    (out / ".train.lock").write_text("")  # another lock file at the path: not the one held
    trainer.state.global_step = 2
    with pytest.raises(FolderLost, match="was removed while this run trained in it"):
        trainer._save_checkpoint(trainer.model, None)
    with pytest.raises(FolderLost):
        trainer.callback_handler.on_log(args, trainer.state, trainer.control, {"eval_loss": 1.0})
    assert sorted(p.name for p in out.iterdir()) == [".train.lock"]  # nothing of this run's
    hold.release()
