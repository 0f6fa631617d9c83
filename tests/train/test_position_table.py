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


def test_rows_past_a_rotary_models_positions_are_noted(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A rotary model runs past its max_position_embeddings, untrained there, and `generate`
    refuses such prompts: check notes a max_seq_length over it, train the data's longest
    example over it; rows within it get neither."""
    import json

    model = tmp_path / "short"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40}))
    manifest = write_expert(tmp_path / "e", model, rows=8, config={"max_steps": 1})
    code, out, _ = run_main(capsys, monkeypatch, "check", "--manifest", str(manifest), "--json")
    notes = json.loads(out)["notes"]
    assert code == 0 and [n for n in notes if "max_position_embeddings" in n] == [
        f"training.config.max_seq_length: 128 is over the 40 positions base model {model} is "
        "configured for (max_position_embeddings): an example longer than that trains "
        "positions it was not pretrained on, and `generate` refuses prompts of 40 tokens or more"
    ]
    code, out, err = run_main(capsys, monkeypatch, "train", "--manifest", str(manifest))
    assert code == 0, out + err
    resolved = json.loads((tmp_path / "e" / "output" / "manifest.resolved.json").read_text())
    said = [n for n in resolved["runtime"]["model"]["notes"] if "max_position_embeddings" in n]
    assert len(said) == 1 and said[0].startswith(f"base model {model}: the data's longest ")
    longest = int(said[0].split("longest example is ")[1].split(" ")[0])
    assert 40 < longest <= 128
    assert "over the 40 positions" in " ".join(out.split())  # on the console too

    wide = write_expert(tmp_path / "w", tiny_model_dir, rows=8, config={"max_steps": 1})
    code, out, _ = run_main(capsys, monkeypatch, "check", "--manifest", str(wide), "--json")
    assert code == 0 and not [n for n in json.loads(out)["notes"] if "positions" in n]
