"""Rows longer than a learned position table: refused before anything runs (GPT-2's 1,024
positions against the default max_seq_length of 2,048 was an IndexError mid-step, after a run
folder was made)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from train_helpers import run_main, write_expert
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from expert_cli.train.architecture import positions_problem


def _on_meta(config):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_only_learned_position_tables_bound_the_rows() -> None:
    gpt2 = _on_meta(GPT2Config(n_positions=128, n_embd=32, n_layer=1, n_head=2))
    assert positions_problem(gpt2, 128, "gpt2") is None
    said = positions_problem(gpt2, 256, "gpt2")
    assert said == (
        "training.config.max_seq_length: 256 is over the 128 positions base model gpt2 has "
        "learned (its position table ends there: a longer example would index past it); use "
        "128 or less"
    )
    rotary = LlamaConfig(
        max_position_embeddings=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
    )
    assert positions_problem(_on_meta(rotary), 4096, "llama") is None  # rotary: runs past it


def test_check_refuses_rows_past_the_table(
    capsys, monkeypatch, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    model = tmp_path / "gpt2"
    shutil.copytree(tiny_tokenizer_dir, model)
    config = GPT2Config(n_positions=128, n_embd=32, n_layer=1, n_head=2, vocab_size=4096)
    config.save_pretrained(model)
    manifest = write_expert(
        tmp_path / "e", model, config={"max_seq_length": 256}, base={"init": "random"}
    )
    for command in ("check", "train"):
        code, out, err = run_main(capsys, monkeypatch, command, "--manifest", str(manifest))
        assert code == 2, out + err
        assert "max_seq_length: 256 is over the 128 positions" in " ".join((out + err).split())
    assert not (tmp_path / "e" / "output").exists()
