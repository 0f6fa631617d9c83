"""`train --resume` builds the adapter its checkpoint was trained with, or says in one line
why it cannot: an IA3 run begun before IA3 took down_proj on model types peft names no
feed-forward layers for (OLMo-2) goes on with none; a checkpoint whose weights do not fit
the adapter built (a base replaced under its name) is exit 2, where the Trainer's load was a
size-mismatch traceback; feed-forward modules changed in the manifest are named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers as T
from train_helpers import run_main, write_expert

import expert_cli.train.adapter as adapter_module
from expert_cli.weights import tensor_shapes

ADAPTER = "adapter_model.safetensors"


def _olmo(folder: Path, tokenizer_dir: Path, intermediate: int = 128) -> Path:
    """A random 2-layer OLMo-2 (a type peft names no IA3 feed-forward layers for) with the
    tiny tokenizer beside it."""
    tokenizer = T.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = T.Olmo2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=64,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    T.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _train(capsys, monkeypatch, manifest: Path, out: Path, *more: str) -> tuple[int, str]:
    code, stdout, stderr = run_main(
        capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out), *more
    )
    assert "Traceback" not in stderr
    return code, " ".join((stdout + stderr).split())


def _down_proj_shape(folder: Path) -> tuple[int, ...]:
    shapes = tensor_shapes(folder / ADAPTER) or {}
    return next(shape for name, shape in shapes.items() if "layers.0.mlp.down_proj" in name)


@pytest.fixture
def olmo_ia3(tmp_path: Path, tiny_tokenizer_dir: Path) -> Path:
    model = _olmo(tmp_path / "model", tiny_tokenizer_dir)
    return write_expert(
        tmp_path / "e", model, rows=32, config={"adapter_type": "ia3", "save_steps": 2}
    )


def test_an_ia3_run_begun_with_no_feed_forward_layers_resumes_as_trained(
    capsys, monkeypatch, tmp_path: Path, olmo_ia3: Path
) -> None:
    out = tmp_path / "run"
    with monkeypatch.context() as before:  # IA3 as it was: no feed-forward layer on OLMo-2
        before.setattr(adapter_module, "_ia3_feedforward", lambda model_type: [])
        code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--max-steps", "2")
    assert code == 0, said
    checkpoint = out / "checkpoints" / "checkpoint-2"
    assert json.loads((checkpoint / "adapter_config.json").read_text())["feedforward_modules"] == []
    assert _down_proj_shape(checkpoint) == (64, 1)  # scaled at its output
    (out / ADAPTER).unlink()  # killed before its final save
    code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--resume", "--max-steps", "4")
    assert code == 0, said
    assert (
        "adapter_type: ia3: resumed as its checkpoint was trained, with no feed-forward layers "
        "(every target scaled at its output); a new run scales down_proj at its input"
    ) in said
    assert _down_proj_shape(out) == (64, 1)
    assert json.loads((out / "metrics.json").read_text())["windows"][-1]["step"] == 4
    # a new run takes down_proj as a feed-forward layer: scaled at its input
    code, said = _train(capsys, monkeypatch, olmo_ia3, tmp_path / "new", "--max-steps", "1")
    assert code == 0, said
    assert _down_proj_shape(tmp_path / "new") == (1, 128)


def test_a_checkpoint_that_does_not_fit_the_adapter_built_is_named(
    capsys, monkeypatch, tmp_path: Path, olmo_ia3: Path, tiny_tokenizer_dir: Path
) -> None:
    out = tmp_path / "run"
    code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--max-steps", "2")
    assert code == 0, said
    (out / ADAPTER).unlink()
    shutil.rmtree(tmp_path / "model")  # the base replaced under its name: a wider MLP
    _olmo(tmp_path / "model", tiny_tokenizer_dir, intermediate=96)
    code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--resume", "--max-steps", "4")
    assert code == 2  # the config.json the run recorded the hash of is not the one there now
    assert "--resume: the base model's config.json" in said and "changed since" in said
    # a run that recorded no hash (a hub base, an earlier version): the checkpoint's shapes
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    del resolved["runtime"]["base_config_sha256"]
    (out / "manifest.resolved.json").write_text(json.dumps(resolved))
    code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--resume", "--max-steps", "4")
    assert code == 2
    assert (
        "--resume: checkpoint-2 does not fit the adapter this run builds "
        "(base_model.model.model.layers.0.mlp.down_proj.ia3_l is 1x128 there, 1x96 here); "
        "resume with the settings and base model it was trained with, or start again with "
        "--overwrite"
    ) in said
    assert not (out / ADAPTER).exists()
    assert (out / "checkpoints" / "checkpoint-2" / ADAPTER).is_file()  # kept as it was


def test_feed_forward_modules_changed_for_a_resume_are_named(
    capsys, monkeypatch, tmp_path: Path, olmo_ia3: Path
) -> None:
    out = tmp_path / "run"
    code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--max-steps", "2")
    assert code == 0, said
    (out / ADAPTER).unlink()
    manifest = json.loads(olmo_ia3.read_text())
    manifest["training"]["config"]["feedforward_modules"] = ["up_proj"]
    olmo_ia3.write_text(json.dumps(manifest))
    code, said = _train(capsys, monkeypatch, olmo_ia3, out, "--resume", "--max-steps", "4")
    assert code == 2
    assert "was trained with another configuration (changed: feedforward_modules)" in said
