"""A pretrained base's weights held against its config.json (train/base_load.py): weights the
files lack started random and training went on, exit 0; weights of another shape were a
traceback from inside transformers' loader; both came with transformers' LOAD REPORT table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_helpers import run_cli, run_main, write_expert

from expert_cli.train.base_load import weights_problem


def _base(tiny_model_dir: Path, dest: Path, **edit: object) -> Path:
    """A copy of the tiny base whose config.json is edited (its weights files as saved)."""
    shutil.copytree(tiny_model_dir, dest)
    config = json.loads((dest / "config.json").read_text())
    config.update(edit)
    if "num_hidden_layers" in edit:  # transformers' strict check: one layer type a layer
        config["layer_types"] = ["full_attention"] * int(edit["num_hidden_layers"])  # type: ignore[call-overload]
    (dest / "config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            {"num_hidden_layers": 3},
            "11 weights (model.layers.2.input_layernorm.weight, "
            "model.layers.2.mlp.down_proj.weight, ...) of its config.json are not in its "
            "weights files, so they would start random",
        ),
        (
            {"intermediate_size": 96},
            "6 weights have another shape in its weights files than its config.json gives "
            "(model.layers.0.mlp.down_proj.weight: [64, 128] in the files, [64, 96] by the "
            "config)",
        ),
    ],
)
def test_train_refuses_a_base_its_files_do_not_fill(
    capsys, monkeypatch, tiny_model_dir: Path, tmp_path: Path, edit: dict, expected: str
) -> None:
    base = _base(tiny_model_dir, tmp_path / "base", **edit)
    manifest = write_expert(tmp_path / "expert", base, config={"max_steps": 2})
    code, out, err = run_main(capsys, monkeypatch, "train", "--manifest", str(manifest))
    said = " ".join(err.split())
    assert code == 2, out + err
    assert "Traceback" not in err
    assert f"base model {base}: {expected}" in said
    assert "Use the config.json" in said and "the weights were saved with" in said
    assert not (tmp_path / "expert" / "output").exists()


def test_weights_the_config_has_no_place_for_are_a_note(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A config of fewer layers than the files hold trains (a checkpoint may carry parts a
    causal LM does not use) and says what was left out, in a line: no LOAD REPORT table."""
    base = _base(tiny_model_dir, tmp_path / "base", num_hidden_layers=1)
    manifest = write_expert(tmp_path / "expert", base, config={"max_steps": 1})
    done = run_cli("train", "--manifest", str(manifest))
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert (
        f"base model {base}: 11 weights (model.layers.1.input_layernorm.weight, "
        "model.layers.1.mlp.down_proj.weight, ...) in its weights files match no layer of its "
        "config.json; not loaded"
    ) in said
    assert "LOAD REPORT" not in said and "UNEXPECTED" not in said
    assert (tmp_path / "expert" / "output" / "adapter_model.safetensors").is_file()


def test_weights_problem_reads_the_loaders_account() -> None:
    assert weights_problem("b", {"missing_keys": set(), "mismatched_keys": set()}) is None
    one = weights_problem("b", {"missing_keys": {"lm_head.weight"}})
    assert one is not None and one.startswith("base model b: 1 weight (lm_head.weight) of its")
    shape = weights_problem("b", {"mismatched_keys": {("w", (2, 3), (2, 4))}})
    assert shape is not None and "a weight has another shape" in shape
    assert "(w: [2, 3] in the files, [2, 4] by the config)" in shape


def test_names_from_the_files_are_shown_only_when_they_look_like_names() -> None:
    from expert_cli.train.base_load import _named

    assert _named(["\x1b[2J" + "A" * 300, "model.norm.weight"]) == (
        "2 weights (<a 304-character name>, model.norm.weight)"
    )


def test_generate_and_merge_say_what_the_files_held_beyond_the_config(
    capsys, monkeypatch, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """With transformers' LOAD REPORT kept off the console, generate and merge said nothing
    of weights in the base's files that its config has no place for."""
    from safetensors.torch import load_file, save_file

    base = _base(tiny_model_dir, tmp_path / "base")
    manifest = write_expert(tmp_path / "e", base, config={"max_steps": 1})
    code, out, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest))
    assert code == 0, out + err
    tensors = load_file(base / "model.safetensors")
    tensors["model.extra.weight"] = tensors["model.norm.weight"].clone()
    save_file(tensors, base / "model.safetensors", metadata={"format": "pt"})
    run = tmp_path / "e" / "output"
    note = "1 weight (model.extra.weight) in its weights files matches no layer of its config.json"
    for command in (
        ["generate", "-p", "x", "--max-new-tokens", "2"],
        ["merge", "--output", str(tmp_path / "m")],
    ):
        code, out, err = run_main(capsys, monkeypatch, *command, "--adapter", str(run))
        assert code == 0, out + err
        assert note in " ".join((out + err).split())
