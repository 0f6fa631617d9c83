"""A run folder that a hand edit, a crash or another tool left other than `train` wrote it,
given to the commands that read one afterwards (`report`, `package`, `generate`, `merge`):
each says what is wrong with which file, exit 2 where the command cannot go on, and never
reads what it needs from somewhere the run did not record (the current directory).

Run folders are built by hand (an adapter of no tensors), so no test here trains."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from train_helpers import hand_built_run, run_main

SECRET = "QQsecretQQ"


def _said(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    code, out, err = run_main(capsys, monkeypatch, *args)
    text = " ".join((out + err).split())
    assert "Traceback" not in text and SECRET not in text
    return code, text


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_number_no_float_holds_is_left_out(capsys, monkeypatch, tmp_path: Path) -> None:
    """An integer of 400 digits where metrics.json has a step or a loss was an OverflowError
    traceback in `report` and `package`; it is left out, as text or NaN there is."""
    run = hand_built_run(tmp_path)
    big = "1" + "0" * 400
    summary = f'{{"status": "completed", "steps": {big}, "final_loss": {big}}}'
    evals = f'[{{"step": {big}, "eval_loss": 0.5}}, {{"step": 3, "eval_loss": {big}}}]'
    metrics = f'{{"summary": {summary}, "evals": {evals}, "windows": [{{"step": {big}}}]}}'
    (run / "metrics.json").write_text(metrics)
    code, text = _said(capsys, monkeypatch, "report", str(run))
    assert code == 0, text
    assert "completed: 0 steps, - tok/s, final loss -, best eval loss -" in text
    assert "final step - eval loss - package ships it" in text
    out = tmp_path / "x.expert"
    code, text = _said(capsys, monkeypatch, "package", "--adapter", str(run), "--output", str(out))
    assert code == 0 and out.is_file(), text
    code, text = _said(
        capsys, monkeypatch, "package", "--adapter", str(run), "--checkpoint", "best"
    )
    assert code == 2 and "--checkpoint best: the run evaluated at no step it kept" in text


def test_a_package_of_a_random_init_run_says_its_base_is_not_in_it(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """The demo's base is built with random weights, kept in RUN/base_model/: a package names
    the config folder, so whoever loads it gets other random weights. Said as a note."""
    run = hand_built_run(tmp_path)
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    out = tmp_path / "x.expert"
    args = ("package", "--adapter", str(run), "--output", str(out))
    code, text = _said(capsys, monkeypatch, *args)
    assert code == 0 and "random weights" not in text, text
    (run / "manifest.resolved.json").write_text(json.dumps({**resolved, "init": "random"}))
    code, text = _said(capsys, monkeypatch, *args, "--force")
    assert code == 0, text
    assert "the base was built with random weights (init: random)" in text


@pytest.mark.parametrize(
    "resolved",
    [None, "{}", '{"manifest_path": ""}', '{"manifest_path": 7}', "not json"]
    + ['{"manifest_path": "manifest.json"}'],  # relative: the current directory's again
)
def test_package_of_a_folder_train_did_not_write(
    capsys, monkeypatch, tmp_path: Path, resolved: str | None
) -> None:
    """Without the record of the manifest it was trained from, `package` took README, LICENSE
    and a grammar from the current directory (the folder of the path ""). It is refused."""
    run = hand_built_run(tmp_path)
    if resolved is None:
        (run / "manifest.resolved.json").unlink()
    else:
        (run / "manifest.resolved.json").write_text(resolved)
    here = tmp_path / "somewhere"
    here.mkdir()
    (here / "README.md").write_text(SECRET)
    (here / "LICENSE").write_text(SECRET)
    monkeypatch.chdir(here)
    before = _files(tmp_path)
    code, text = _said(capsys, monkeypatch, "package", "--adapter", str(run))
    assert code == 2, text
    assert (
        f"--adapter {run}: its manifest.resolved.json is missing, unreadable or names no "
        "absolute manifest_path; give a folder `expert-cli train` wrote" in text
    )
    assert _files(tmp_path) == before


def test_a_peft_adapter_of_its_own_is_not_taken_for_a_damaged_run(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """A peft adapter trained elsewhere (adapter_config.json and weights alone) was told its
    manifest.resolved.json is "missing, unreadable or names no absolute manifest_path"."""
    run = hand_built_run(tmp_path)
    bare = tmp_path / "peft"
    bare.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (bare / name).write_bytes((run / name).read_bytes())
    for command in ("package", "export-gguf", "export-hub"):
        args = [command, "--adapter", str(bare)]
        args += ["--output", str(tmp_path / "out")] if command == "export-hub" else []
        code, text = _said(capsys, monkeypatch, *args)
        assert code == 2, (command, text)
        assert (
            f"--adapter {bare}: holds a peft adapter but no record of an expert-cli run (its "
            "manifest.resolved.json, the base and settings it was trained with); give a folder "
            "`expert-cli train` wrote" in text
        ), (command, text)
    assert sorted(p.name for p in bare.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (b'{"name": ', "manifest.source.json:1:10: invalid JSON"),
        (b"\xff\xfe{}", "manifest.source.json: byte 0: not UTF-8 text"),
        (b"[1, 2]", "manifest.source.json: expected a JSON object at the top level"),
    ],
)
def test_a_damaged_copy_of_the_manifest_is_named_not_called_gone(
    capsys, monkeypatch, tmp_path: Path, damage: bytes, expected: str
) -> None:
    run = hand_built_run(tmp_path)
    (run / "manifest.source.json").write_bytes(damage)
    before = _files(tmp_path)
    code, text = _said(capsys, monkeypatch, "package", "--adapter", str(run))
    assert code == 2 and expected in text and "is gone" not in text, text
    assert _files(tmp_path) == before


def test_the_packaged_manifest_holds_the_set_values_train_was_given(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """A run trained with `--set base_models.0.prompt_template=alpaca` was shipped with the
    manifest's chatml template: a consumer prompted it in a layout it never saw. The recorded
    --set values are applied, but those naming places on the training machine."""
    run = hand_built_run(tmp_path)
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved["learning_rate"] = 0.0005  # as train resolved the --set value
    resolved["runtime"] = {
        "overrides": [
            "base_models.0.prompt_template=alpaca",
            "learning_rate=0.0005",
            "base_models.0.name=/home/me/models/qwen",
            "training.dataset.path=/home/me/data.jsonl",
            "pretokenized_cache=/scratch/cache",
            "training.dataset.response_template=### Answer:",  # how it must be prompted
            'training.distributed={"strategy": "deepspeed", "deepspeed": "/home/me/ds.json"}',
            # read by package from the manifest file as it is then: said, not held
            "training.packaging_checkpoint=checkpoint-9",
        ]
    }
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    out = tmp_path / "x.expert"
    code, text = _said(capsys, monkeypatch, "package", "--adapter", str(run), "--output", str(out))
    assert code == 0, text
    assert (
        "the packaged manifest holds the --set values train was given: "
        "base_models.0.prompt_template, training.config.learning_rate, "
        "training.dataset.response_template, training.distributed" in text
    )
    assert "/home/me" not in text and "/scratch" not in text
    assert (
        "training.packaging_checkpoint: given to train with --set, which package does not "
        "read: it ships what the manifest file names, else final; --checkpoint NAME chooses"
    ) in text
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    base = manifest["base_models"][0]
    assert base["prompt_template"] == "alpaca" and base["name"] == "org/model"
    assert manifest["training"]["config"]["learning_rate"] == 0.0005  # the rest as the run trained
    assert manifest["training"]["dataset"] == {
        "path": "org/data",
        "response_template": "### Answer:",
    }
    assert manifest["training"]["decoding"] == {"temperature": 0.2}
    assert manifest["training"]["distributed"] == {"strategy": "deepspeed"}  # no local file
    assert manifest["training"]["packaging_checkpoint"] == "final"  # what shipped


@pytest.mark.parametrize(
    "recorded",
    [["notablock.x=1"], ["base_models.7.name=/x"], [3], "training.config.rank=4"],
)
def test_recorded_set_values_that_no_longer_apply(
    capsys, monkeypatch, tmp_path: Path, recorded
) -> None:
    """runtime.overrides edited by hand, or a manifest.source.json edited so they no longer
    apply: exit 2 naming the record, never quoting a value."""
    run = hand_built_run(tmp_path)
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved["runtime"] = {"overrides": recorded}
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    code, text = _said(capsys, monkeypatch, "package", "--adapter", str(run))
    assert code == 2, text
    assert "manifest.resolved.json: runtime.overrides: the --set values train recorded no" in text
    assert "/x" not in text and "notablock" not in text
