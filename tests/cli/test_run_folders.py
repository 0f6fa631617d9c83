"""A run folder is never written over silently: a second train refuses, --overwrite replaces,
--resume continues the same configuration from its last complete checkpoint, and a finished
run resumed is reported complete without training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_helpers import read_metrics, run_cli, run_main, window_losses, write_expert

from expert_cli.train.run_folder import COMPLETE


def _train(manifest: Path, out: Path, *extra: str):
    return run_cli("train", "--manifest", str(manifest), "--output", str(out), *extra)


def _here(capsys, monkeypatch, manifest: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    """`train` in this process, for runs refused or finished at once (no subprocess needed)."""
    return run_main(
        capsys, monkeypatch, "train", "--manifest", str(manifest), "--output", str(out), *extra
    )


@pytest.fixture(scope="module")
def trained_once(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("finished")
    manifest = write_expert(folder / "e", tiny_model_dir, rows=16, config={"save_steps": 3})
    out = folder / "out"
    first = _train(manifest, out, "--max-steps", "6")
    assert first.returncode == 0, first.stdout + first.stderr
    return manifest, out


@pytest.fixture
def finished(trained_once: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A finished 6-step run (checkpoints at 3 and 6), a fresh copy for each test."""
    manifest, out = trained_once
    copy = tmp_path / "out"
    shutil.copytree(out, copy, symlinks=True)
    return manifest, copy


@pytest.mark.slow
def test_a_second_train_into_a_finished_folder_is_refused(capsys, monkeypatch, finished) -> None:
    manifest, out = finished
    adapter = (out / "adapter_model.safetensors").read_bytes()
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--max-steps", "6")
    assert code == 2
    assert f"--output {out}: holds a finished run (6 steps); continue it with --resume" in " ".join(
        err.split()
    )
    assert (out / "adapter_model.safetensors").read_bytes() == adapter  # untouched
    (out / "notes.txt").write_text("mine")
    code, stdout, err = _here(capsys, monkeypatch, manifest, out, "--max-steps", "4", "--overwrite")
    assert code == 0, err
    assert "--overwrite: removed" in stdout
    assert read_metrics(out)["summary"]["steps"] == 4
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "checkpoint-3",
        "checkpoint-4",
    ]
    assert (out / "notes.txt").read_text() == "mine"  # not a run output: left alone


@pytest.mark.slow
def test_resuming_a_finished_run_trains_nothing(capsys, monkeypatch, finished) -> None:
    manifest, out = finished
    metrics = (out / "metrics.json").read_text()
    code, stdout, err = _here(capsys, monkeypatch, manifest, out, "--resume")
    assert code == 0, err
    assert "holds a finished run of 6 steps; nothing to resume" in " ".join(stdout.split())
    assert (out / "metrics.json").read_text() == metrics


@pytest.mark.slow
def test_resume_skips_a_half_written_checkpoint_and_honours_max_steps(finished) -> None:
    manifest, out = finished
    before = window_losses(out)
    (out / "checkpoints" / "checkpoint-6" / COMPLETE).unlink()  # as if killed mid-write
    more = _train(manifest, out, "--resume", "--max-steps", "8")
    assert more.returncode == 0, more.stdout + more.stderr
    assert "resuming from checkpoint-3 (step 3 of 8)" in more.stdout
    assert "5 steps this run (step 8 reached)" in more.stdout
    assert read_metrics(out)["summary"]["steps_this_run"] == 5
    after = window_losses(out)
    assert max(after) == 8 and {s: after[s] for s in (1, 2, 3)} == {s: before[s] for s in (1, 2, 3)}


@pytest.mark.slow
def test_resume_with_another_configuration_is_refused(capsys, monkeypatch, finished) -> None:
    manifest, out = finished
    args = ("--resume", "--set", "learning_rate=0.01")
    code, _, err = _here(capsys, monkeypatch, manifest, out, *args)
    assert code == 2
    assert "was trained with another configuration (changed: learning_rate 0.002 -> 0.01)" in (
        " ".join(err.split())
    )


@pytest.mark.slow
def test_a_moved_run_folder_still_merges(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8, base={"init": "random"})
    out = tmp_path / "out"
    assert _here(capsys, monkeypatch, manifest, out, "--max-steps", "2")[0] == 0
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(str(out), str(moved))
    config = json.loads((moved / "adapter_config.json").read_text())
    assert not Path(config["base_model_name_or_path"]).is_absolute()
    merged = run_cli("merge", "--adapter", str(moved), "--output", str(tmp_path / "merged"))
    assert merged.returncode == 0, merged.stderr
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def test_a_folder_of_someone_elses_files_is_refused(capsys, monkeypatch, tmp_path, tiny_model_dir):
    """A repository, a model's folder or a user's notes: no earlier run, but files a run would
    write. Refused with and without --overwrite, every file as it was; a file given as the
    folder (or inside its path) is refused by name too."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    (mine / "tokenizer_config.json").write_text('{"mine": 1}')
    for extra in ((), ("--overwrite",)):
        code, _, err = _here(capsys, monkeypatch, manifest, mine, "--max-steps", "1", *extra)
        assert code == 2, err
        assert (
            f"--output {mine}: holds README.md, tokenizer_config.json, which a run would write"
            in (" ".join(err.split()))
        )
    assert sorted(p.name for p in mine.iterdir()) == ["README.md", "tokenizer_config.json"]
    assert (mine / "README.md").read_text() == "my notes"
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        code, _, err = _here(capsys, monkeypatch, manifest, out, "--max-steps", "1")
        assert code == 2, err
        assert f"{afile} is a file, not a folder" in " ".join(err.split())
    assert afile.read_text() == "x"
