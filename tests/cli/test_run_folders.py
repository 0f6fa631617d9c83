"""A run folder is never written over silently: a second train refuses, --overwrite replaces,
--resume continues the same configuration from its last complete checkpoint, and a finished
run resumed is reported complete without training."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from train_helpers import NO_TENSORS, read_metrics, run_here, run_main, window_losses, write_expert

from expert_cli.train.checkpoints import COMPLETE


def _train(manifest: Path, out: Path, *extra: str):
    return run_here("train", "--manifest", str(manifest), "--output", str(out), *extra)


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
    assert "--overwrite: the earlier run's checkpoints, runs, metrics.json" in stdout
    assert "set aside" in stdout
    assert not list(out.glob(".overwritten-*"))  # removed once training began
    assert read_metrics(out)["summary"]["steps"] == 4
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "checkpoint-3",
        "checkpoint-4",
    ]
    assert (out / "notes.txt").read_text() == "mine"  # not a run output: left alone


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_an_overwrite_that_fails_before_training_puts_the_earlier_run_back(
    capsys, monkeypatch, finished
) -> None:
    """The manifest's adapter targets no layer of the model: found only once the model is
    loaded, after --overwrite has set the finished run aside. The run is back, byte for byte."""
    manifest, out = finished
    before = _files(out)
    bad = '[{"type": "lora", "target_modules": ["no_such_proj"]}]'
    code, stdout, err = _here(
        capsys, monkeypatch, manifest, out, "--overwrite", "--set", f"base_models.0.adapters={bad}"
    )
    assert code == 2, err
    assert "target_modules[0] names no layer of the model" in err and "Traceback" not in err
    assert "the earlier run is back" in stdout
    assert _files(out) == before
    assert not list(out.glob(".overwritten-*"))


@pytest.mark.slow
def test_an_earlier_run_set_aside_by_a_killed_overwrite_is_put_back(
    capsys, monkeypatch, finished
) -> None:
    """Killed (SIGKILL, power cut) after setting the run aside and writing part of a new
    random base: the next train in the folder puts the earlier run back first."""
    manifest, out = finished
    before = _files(out)
    aside = out / ".overwritten-4194000"  # a process that no longer runs
    aside.mkdir()
    for name in ("checkpoints", "runs", "metrics.json", "manifest.resolved.json"):
        if (out / name).exists():
            (out / name).rename(aside / name)
    for p in list(out.iterdir()):
        if p.is_file():
            p.rename(aside / p.name)
    (out / "base_model").mkdir()
    (out / "base_model" / "config.json").write_text("{}")  # half written
    # the commands that read a run say where it went (they said the folder was no run)
    said = (
        f"{out}: its run was set aside in .overwritten-4194000 by a `train --overwrite` that was "
        "stopped before training began; the next `expert-cli train` into this folder puts the "
        "run back (and, with neither --resume nor --overwrite, stops there: nothing is trained)"
    )
    for command in (
        ("generate", "--adapter", str(out), "-p", "hi"),
        ("package", "--adapter", str(out), "--output", str(out.parent / "x.expert")),
        ("report", str(out)),
    ):
        code, _, err = run_main(capsys, monkeypatch, *command)
        assert code == 2 and said in " ".join(err.split()), (command, err)
    assert not (out.parent / "x.expert").exists() and not (out / "training.png").exists()
    code, stdout, err = _here(capsys, monkeypatch, manifest, out, "--resume")
    assert code == 0, err
    assert ".overwritten-4194000 (an earlier run, put back)" in " ".join(stdout.split())
    assert "holds a finished run of 6 steps; nothing to resume" in " ".join(stdout.split())
    assert _files(out) == before


@pytest.mark.slow
def test_resuming_a_finished_run_trains_nothing(capsys, monkeypatch, finished) -> None:
    manifest, out = finished
    metrics = (out / "metrics.json").read_text()
    code, stdout, err = _here(capsys, monkeypatch, manifest, out, "--resume")
    assert code == 0, err
    assert "holds a finished run of 6 steps; nothing to resume" in " ".join(stdout.split())
    assert (out / "metrics.json").read_text() == metrics


def test_a_run_killed_after_its_last_checkpoint_keeps_no_more_than_its_limit(finished) -> None:
    """Killed after its last checkpoint was marked, before the older ones over the limit went:
    the resume that saves that checkpoint as the final adapter left them for good."""
    manifest, out = finished
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["summary"]["status"] = "interrupted"
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "adapter_model.safetensors").unlink()
    done = _train(manifest, out, "--resume", "--max-steps", "6", "--set", "save_total_limit=1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in (out / "checkpoints").glob("checkpoint-*")] == ["checkpoint-6"]
    assert (out / "adapter_model.safetensors").is_file()


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


DAMAGE = {
    "adapter_model.safetensors": "adapter_model.safetensors is damaged",
    "optimizer.pt": "optimizer.pt is damaged (cut short)",
    "scheduler.pt": "scheduler.pt is damaged (cut short)",
    "trainer_state.json": "trainer_state.json is missing or not the Trainer's state",
}


def _cut(file: Path) -> None:
    """Cut a file to half its size, as an interrupted copy or a failing disk would."""
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_damaged_checkpoint_files_are_found(finished) -> None:
    """A checkpoint marked complete whose files were damaged since: each file the Trainer
    reads on resume is checked (cut in half here), in milliseconds."""
    from expert_cli.train.checkpoints import checkpoint_problem, resume_point

    _, out = finished
    checkpoints = out / "checkpoints"
    assert checkpoint_problem(checkpoints / "checkpoint-6") is None
    for name, problem in DAMAGE.items():
        damaged = checkpoints / f"checkpoint-{name}"
        shutil.copytree(checkpoints / "checkpoint-6", damaged)
        _cut(damaged / name)
        assert (checkpoint_problem(damaged) or "").startswith(problem), name
        shutil.rmtree(damaged)
    _cut(checkpoints / "checkpoint-6" / "optimizer.pt")
    point = resume_point(checkpoints)
    assert point.checkpoint.name == "checkpoint-3"
    assert point.passed_over == ("checkpoint-6: optimizer.pt is damaged (cut short)",)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "state"])
def test_damage_inside_a_checkpoints_state_is_found(finished, name: str) -> None:
    """Bytes zeroed inside optimizer.pt, scheduler.pt or rng_state.pth (the archive's index
    whole), or a trainer_state.json trimmed to its step: --resume took the checkpoint and
    ended in a traceback from torch's loader (or the Trainer's batch-size check), at every
    try. It is passed over for the one before; it still ships (its adapter is sound)."""
    from expert_cli.train.checkpoints import checkpoint_problem, resume_point

    _, out = finished
    damaged = out / "checkpoints" / "checkpoint-6"
    kept = {f.name: f.read_bytes() for f in damaged.iterdir() if f.is_file()}
    try:
        if name == "state":
            (damaged / "trainer_state.json").write_text('{"global_step": 6}')
            why = "trainer_state.json holds no train_batch_size (not the Trainer's whole state)"
        else:
            data = bytearray(kept[name])
            data[len(data) // 3 : len(data) // 3 + 64] = bytes(64)
            (damaged / name).write_bytes(bytes(data))
            why = f"{name} is damaged (its bytes fail their checksum): the run cannot go on "
            why += "from its state"
        point = resume_point(out / "checkpoints")
        assert point.checkpoint.name == "checkpoint-3"
        assert point.passed_over == (f"checkpoint-6: {why}",)
        assert checkpoint_problem(damaged) is None
    finally:
        for file, data in kept.items():
            (damaged / file).write_bytes(data)


@pytest.mark.slow
def test_files_missing_from_a_checkpoint_are_found(capsys, monkeypatch, finished) -> None:
    """A checkpoint marked complete with a file removed since: without its adapter weights the
    Trainer's resume was a ValueError traceback (and metrics.json said failed); without
    optimizer.pt, scheduler.pt or rng_state.pth it went on in silence with the optimizer's
    moments, the schedule or the random draws started again. Such a checkpoint still ships
    (package and merge read only its adapter)."""
    from expert_cli.train.checkpoints import resume_point, sound_checkpoints

    manifest, out = finished
    checkpoints = out / "checkpoints"
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (checkpoints / "checkpoint-6" / name).unlink()
        point = resume_point(checkpoints)
        assert point.checkpoint.name == "checkpoint-3"
        assert point.passed_over[0].startswith(f"checkpoint-6: {name} is missing"), name
        assert [p.name for p in sound_checkpoints(checkpoints)] == ["checkpoint-3", "checkpoint-6"]
        shutil.copy2(checkpoints / "checkpoint-3" / name, checkpoints / "checkpoint-6" / name)
    # a folder named for another step (a huge one, which resume took as the step reached),
    # and a link to another run's checkpoint: neither is this run's
    shutil.copytree(checkpoints / "checkpoint-6", checkpoints / f"checkpoint-{'9' * 25}")
    (checkpoints / "checkpoint-8").symlink_to(checkpoints / "checkpoint-6")
    point = resume_point(checkpoints)
    assert point.checkpoint.name == "checkpoint-6"
    assert point.passed_over == (
        f"checkpoint-{'9' * 25}: trainer_state.json is of another step than the folder's name",
        "checkpoint-8: is a link to another folder, not a checkpoint this run wrote",
    )
    shutil.rmtree(checkpoints / f"checkpoint-{'9' * 25}")
    (checkpoints / "checkpoint-8").unlink()
    (checkpoints / "checkpoint-6" / "adapter_model.safetensors").unlink()
    (checkpoints / "checkpoint-3" / "optimizer.pt").unlink()
    assert [p.name for p in sound_checkpoints(checkpoints)] == ["checkpoint-3"]
    metrics = (out / "metrics.json").read_bytes()
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "8")
    assert code == 2 and "Traceback" not in err, err
    err = " ".join(err.split())
    assert "checkpoint-6: adapter_model.safetensors is missing (the adapter's weights)" in err
    assert "checkpoint-3: optimizer.pt is missing" in err
    assert (out / "metrics.json").read_bytes() == metrics


@pytest.mark.slow
def test_a_resume_to_fewer_steps_than_reached_is_refused(capsys, monkeypatch, finished) -> None:
    """An interrupted run at step 6 resumed with --max-steps 4: it said "step 6 of 4" and
    rebuilt the schedule for a length already passed; now exit 2 saying where it is."""
    manifest, out = finished
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["summary"]["status"] = "interrupted"
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "adapter_model.safetensors").unlink()  # an interrupted run has no final adapter
    code, said, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "4")
    assert code == 2, err
    assert (
        f"a length of 4 steps (--max-steps, or training.config.max_steps): {out} is at step 6 "
        "already (checkpoint-6); give more steps to train on, or ship it as it is: package "
        "--checkpoint checkpoint-6"
    ) in " ".join(err.split())
    assert "schedule is built again" not in said + err  # it said so, then refused


def test_the_manifests_max_steps_on_a_resume_is_its_length(tmp_path: Path, tiny_model_dir) -> None:
    """The manifest's max_steps (a --set max_steps=) was not the length a resume compared: set
    below the step reached, a run mid-schedule was shipped as finished ("step 12 of 10"); set
    above it, the schedule was rebuilt without a word; and its unused epochs were refused as
    a change. It counts as --max-steps does."""
    config = {"save_steps": 2, "max_steps": 4, "lr_scheduler": "linear"}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config=config)
    out = tmp_path / "out"
    assert _train(manifest, out).returncode == 0
    metrics = json.loads((out / "metrics.json").read_text())
    metrics["summary"]["status"] = "interrupted"
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "adapter_model.safetensors").unlink()  # an interrupted run has no final adapter
    fewer = _train(manifest, out, "--resume", "--set", "max_steps=2")
    said = " ".join((fewer.stdout + fewer.stderr).split())
    assert fewer.returncode == 2 and "a length of 2 steps" in said
    assert f"{out} is at step 4 already (checkpoint-4)" in said
    more = _train(manifest, out, "--resume", "--set", "max_steps=6", "--set", "epochs=3")
    said = " ".join((more.stdout + more.stderr).split())
    assert more.returncode == 0, said
    assert (
        "max_steps 6: the run began with 4 steps; the learning-rate schedule is built again"
    ) in said
    assert json.loads((out / "metrics.json").read_text())["summary"]["steps"] == 6
    # a plain --resume of a run begun with --max-steps keeps that length, not the manifest's
    # (the printed continue command has no --max-steps: it trained on to the manifest's)
    short = tmp_path / "short"
    assert _train(manifest, short, "--max-steps", "2").returncode == 0
    metrics = json.loads((short / "metrics.json").read_text())
    metrics["summary"]["status"] = "interrupted"
    (short / "metrics.json").write_text(json.dumps(metrics))
    (short / "adapter_model.safetensors").unlink()
    again = _train(manifest, short, "--resume")
    said = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 0 and "--resume: 2 steps, the length the run was last given" in said
    assert json.loads((short / "metrics.json").read_text())["summary"]["steps"] == 2


@pytest.mark.slow
def test_resume_passes_over_a_damaged_checkpoint(capsys, monkeypatch, finished) -> None:
    manifest, out = finished
    _cut(out / "checkpoints" / "checkpoint-6" / "adapter_model.safetensors")
    more = _train(manifest, out, "--resume", "--max-steps", "8")
    assert more.returncode == 0, more.stdout + more.stderr
    stdout = " ".join(more.stdout.split())
    assert "--resume: passing over checkpoint-6: adapter_model.safetensors is damaged" in stdout
    assert "resuming from checkpoint-3 (step 3 of 8)" in stdout
    assert read_metrics(out)["summary"]["steps"] == 8


@pytest.mark.slow
def test_resume_without_a_sound_checkpoint_or_configuration_is_refused(
    capsys, monkeypatch, finished
) -> None:
    """Nothing is trained and metrics.json keeps what the run reached."""
    manifest, out = finished
    metrics = (out / "metrics.json").read_bytes()
    for n in (3, 6):
        _cut(out / "checkpoints" / f"checkpoint-{n}" / "trainer_state.json")
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "8")
    assert code == 2, err
    err = " ".join(err.split())
    assert "--resume: no checkpoint to resume from under" in err
    assert "checkpoint-6: trainer_state.json is missing" in err
    assert "checkpoint-3: trainer_state.json is missing" in err
    (out / "manifest.resolved.json").write_text("not json")
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "8")
    assert code == 2, err
    assert "manifest.resolved.json is missing or unreadable" in err
    assert (out / "metrics.json").read_bytes() == metrics


@pytest.mark.slow
def test_resume_with_another_configuration_is_refused(capsys, monkeypatch, finished) -> None:
    manifest, out = finished
    args = ("--resume", "--set", "learning_rate=0.01")
    code, _, err = _here(capsys, monkeypatch, manifest, out, *args)
    assert code == 2
    assert "was trained with another configuration (changed: learning_rate 0.002 -> 0.01)" in (
        " ".join(err.split())
    )
    # a run begun with --set learning_rate=0.01, resumed without it: the refusal named only
    # the manifest and --overwrite (which throws the run away); now the --set keys it began with
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    resolved["learning_rate"] = 0.01
    resolved["runtime"]["overrides"] = ["learning_rate=0.01", "\x1b[2J=1"]
    (out / "manifest.resolved.json").write_text(json.dumps(resolved))
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume")
    said = " ".join(err.split())
    assert code == 2 and "(changed: learning_rate 0.01 -> 0.002)" in said, said
    assert (
        "resume with the same manifest and the --set values it began with (on "
        "training.config.learning_rate: see runtime.overrides in its manifest.resolved.json)"
    ) in said
    assert "\x1b" not in err and "0.01," not in said


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
    merged = run_here("merge", "--adapter", str(moved), "--output", str(tmp_path / "merged"))
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
    (mine / "checkpoints").mkdir()  # a folder of the user's: it read as a run of 0 steps, and
    (mine / "checkpoints" / "notes.txt").write_text("mine")  # --overwrite replaced README.md
    for extra in ((), ("--overwrite",)):
        code, _, err = _here(capsys, monkeypatch, manifest, mine, "--max-steps", "1", *extra)
        assert code == 2 and "which a run would write, and no earlier run" in " ".join(
            err.split()
        ), err
    assert (mine / "README.md").read_text() == "my notes"
    assert (mine / "checkpoints" / "notes.txt").read_text() == "mine"
    (mine / "checkpoints").joinpath("notes.txt").unlink()
    (mine / "checkpoints").rmdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "sub"):
        code, _, err = _here(capsys, monkeypatch, manifest, out, "--max-steps", "1")
        assert code == 2, err
        assert f"{afile} is a file, not a folder" in " ".join(err.split())
    assert afile.read_text() == "x"
    before = sorted(p.name for p in manifest.parent.iterdir())
    code, _, err = _here(capsys, monkeypatch, manifest, manifest.parent / ".", "--max-steps", "1")
    assert code == 2, err  # the expert's own folder: peft's README became the expert's
    assert "is the folder that holds the manifest; give the run a folder of its own" in (
        " ".join(err.split())
    )
    assert sorted(p.name for p in manifest.parent.iterdir()) == before
    data = manifest.parent / "data"  # the training file's own folder: the run among the data
    held = sorted(p.name for p in data.iterdir())
    code, _, err = _here(capsys, monkeypatch, manifest, data, "--max-steps", "1")
    assert code == 2, err
    assert f"--output {data}: holds the data file train.jsonl; the run's files" in (
        " ".join(err.split())
    )
    assert sorted(p.name for p in data.iterdir()) == held
    tests = tmp_path / "tests"  # the test file's folder too (evaluate reads it)
    tests.mkdir()
    (tests / "test.jsonl").write_text((data / "train.jsonl").read_text())
    record = json.loads(manifest.read_text())
    record["training"]["dataset"]["test_path"] = str(tests / "test.jsonl")
    manifest.write_text(json.dumps(record))
    code, _, err = _here(capsys, monkeypatch, manifest, tests, "--max-steps", "1")
    assert code == 2, err
    assert f"--output {tests}: holds the data file test.jsonl; the run's files" in (
        " ".join(err.split())
    )
    assert sorted(p.name for p in tests.iterdir()) == ["test.jsonl"]
    linked = tmp_path / "linked"  # a link to the test file: its path was the target's
    linked.mkdir()
    (linked / "eval.jsonl").symlink_to(tests / "test.jsonl")
    for named in (linked / "eval.jsonl", os.path.relpath(linked / "eval.jsonl", manifest.parent)):
        record["training"]["dataset"]["test_path"] = str(named)  # a relative one is resolved
        manifest.write_text(json.dumps(record))
        code, _, err = _here(capsys, monkeypatch, manifest, linked, "--max-steps", "1")
        assert code == 2, err
        assert f"--output {linked}: holds the data file eval.jsonl; the run's files" in (
            " ".join(err.split())
        )
        assert sorted(p.name for p in linked.iterdir()) == ["eval.jsonl"]


@pytest.mark.slow
def test_a_folder_another_train_is_writing_to_is_refused(capsys, monkeypatch, finished) -> None:
    """While one `train` holds the folder (a second terminal, or --overwrite of a run still
    going), another is refused before it moves or writes anything; once the first lets go,
    the folder is usable again."""
    manifest, out = finished
    before = _files(out)
    running = FileLock(str(out / ".train.lock"))
    running.acquire(timeout=0)  # as the live process holds it
    try:
        for extra in ((), ("--overwrite",), ("--resume", "--max-steps", "9")):
            code, _, err = _here(capsys, monkeypatch, manifest, out, *extra)
            assert code == 2, err
            assert f"--output {out}: another `expert-cli train` is writing to this folder" in (
                " ".join(err.split())
            )
            assert _files(out) == before and not list(out.glob(".overwritten-*"))
    finally:
        running.release()
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "7")
    assert code == 0, err
    fresh = out.parent / "new" / "deeper"
    code, _, err = _here(capsys, monkeypatch, manifest, fresh, "--set", 'target_modules=["x"]')
    assert code == 2 and "names no layer" in err
    assert not fresh.parent.exists()  # the folders this run created (to hold it) are gone


@pytest.mark.slow
def test_resume_on_data_edited_since_the_run_began_is_refused(
    capsys, monkeypatch, finished
) -> None:
    """The checkpoint's position in the data means nothing on other data: a resume after the
    training file was edited is exit 2 naming the file (it continued on the new data, silently),
    and the run is left as it was. The edited data is not tokenized first (a build that can
    take hours on a large file)."""
    manifest, out = finished
    data = manifest.parent / "data" / "train.jsonl"
    original = data.read_bytes()
    before = _files(out)
    cache = manifest.parent / ".cache" / "pretokenized"
    caches = sorted(p.name for p in cache.iterdir())
    try:
        data.write_bytes(
            original.replace(b"\n", b"\n" + json.dumps({"text": "new"}).encode() + b"\n", 1)
        )
        code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "7")
        assert code == 2, err
        assert (
            f"--resume: {out} was trained on other data (changed since it began: "
            "data/train.jsonl); resume with the data it began with, or start again with "
            "--overwrite" in " ".join(err.split())
        )
        assert _files(out) == before
        assert sorted(p.name for p in cache.iterdir()) == caches  # no cache of the new data
    finally:
        data.write_bytes(original)
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "7")
    assert code == 0, err  # the same data again: it goes on
    assert read_metrics(out)["summary"]["steps"] == 7


@pytest.mark.slow
def test_resume_on_examples_built_otherwise_is_refused(capsys, monkeypatch, finished) -> None:
    """The same data files built into other examples (another response template, overlong
    examples dropped, another tokenizer) went on from the checkpoint in silence, after a note
    that the cache was rebuilt; now exit 2 naming the change, before any tokenizing."""
    manifest, out = finished
    before = _files(out)
    for setting, named in (
        (
            "training.dataset.response_template=Answer:",
            "formatting.response_template None -> Answer:",
        ),
        ("training.dataset.overlong=drop", "formatting.overlong truncate -> drop"),
    ):
        args = ("--resume", "--max-steps", "7", "--set", setting)
        code, _, err = _here(capsys, monkeypatch, manifest, out, *args)
        assert code == 2 and "Traceback" not in err, err
        said = " ".join(err.split())
        assert f"--resume: {out} was trained on examples built otherwise (changed since it" in said
        assert named in said, said
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    recorded = resolved["runtime"]["data"]["stats"]["inputs"]
    recorded["tokenizer"]["tokenizer_json_sha256"] = "0" * 64  # the base's tokenizer replaced
    del recorded["tokenizer"]["chat_template_sha256"]  # a version that did not record it
    (out / "manifest.resolved.json").write_text(json.dumps(resolved))
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "7")
    assert code == 2, err
    said = " ".join(err.split())
    assert "tokenizer.tokenizer_json_sha256 000000000000… ->" in said
    assert "chat_template" not in said  # compared only where the run recorded it
    # the base's config.json edited since (rope_theta, rms_norm_eps: shapes unchanged, so the
    # checkpoint fits; a random-init base was built anew from it): the run records its hash
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    base = Path(resolved["base_model"]) / "config.json"
    digest = hashlib.sha256(base.read_bytes()).hexdigest()
    assert resolved["runtime"]["base_config_sha256"] == digest
    resolved["runtime"]["base_config_sha256"] = "0" * 64
    (out / "manifest.resolved.json").write_text(json.dumps(resolved))
    code, _, err = _here(capsys, monkeypatch, manifest, out, "--resume", "--max-steps", "7")
    assert code == 2, err
    assert "--resume: the base model's config.json" in " ".join(err.split())
    assert _files(out) == {
        **before,
        "manifest.resolved.json": _files(out)["manifest.resolved.json"],
    }


@pytest.mark.parametrize(
    ("summary", "status", "steps"),
    [
        ({"status": "completed", "steps": "abc"}, "completed", 0),
        ({"status": "interrupted", "steps": [1]}, "interrupted", 0),
        ({"status": ["completed"], "steps": 1e400}, "unknown", 0),
        ({"status": {"a": 1}, "steps": 1.5e300}, "unknown", 0),
        ({"status": "\x1b[2J", "steps": -3}, "unknown", 0),
        ({"status": "failed", "steps": 12}, "failed", 12),
        ("not an object", "unknown", 0),
    ],
)
def test_a_hand_edited_metrics_file_is_read_without_a_traceback(
    tmp_path: Path, summary: object, status: str, steps: int
) -> None:
    """`train` into a folder reads its metrics.json to say what it holds; strings, lists,
    1e400 or objects where a number or a status goes were tracebacks."""
    from expert_cli.train.run_folder import previous_run

    (tmp_path / "adapter_model.safetensors").write_bytes(NO_TENSORS)
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA"}')  # a whole adapter
    text = json.dumps({"summary": summary}).replace("Infinity", "1e400")
    (tmp_path / "metrics.json").write_text(text)
    found = previous_run(tmp_path)
    assert (found.status, found.steps) == (status, steps)


def test_outputs_inside_a_data_folder_are_refused(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A data folder is read whole: a run's files or a token cache inside it were read back as
    data by the next build (check then failed on adapter_config.json, or "cannot tell the file
    format" with the cache's Arrow files beside the JSON)."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data"  # the folder, not the file
    manifest.write_text(json.dumps(data))
    folder = manifest.parent / "data"
    for out in (folder, folder / "runs" / "a"):
        code, _, err = _here(capsys, monkeypatch, manifest, out, "--max-steps", "1")
        assert code == 2, err
        assert f"--output {out}: is inside the data folder {folder}" in " ".join(err.split())
    assert sorted(p.name for p in folder.iterdir()) == ["train.jsonl"]  # nothing written
    code, said, _ = run_main(
        capsys, monkeypatch, "check", "-m", str(manifest), "--set", "pretokenized_cache=data/c"
    )
    assert code == 2
    assert (
        f"training.config.pretokenized_cache: {folder / 'c'} is inside the data folder {folder}"
        in " ".join(said.split())
    )
    assert sorted(p.name for p in folder.iterdir()) == ["train.jsonl"]
    # a hidden folder inside it is passed over by the reader: a cache there is fine
    code, said, _ = run_main(
        capsys, monkeypatch, "check", "-m", str(manifest), "--set", "pretokenized_cache=data/.c"
    )
    assert "is inside the data folder" not in said


def test_data_is_compared_by_content_not_by_name_or_time(tmp_path: Path) -> None:
    """Files are named relative to the manifest's folder (moving the manifest renames them),
    and a file over 256 MiB is known by its edges and mtime (a plain copy changes the mtime):
    neither is a change of data. An edit, an addition and a removal are."""
    from expert_cli.train.data_record import changed_data

    def record(files: dict[str, dict]) -> dict:
        sources = {"train": [{"kind": "local", "location": "data", "files": files}]}
        return {"stats": {"inputs": {"sources": sources}}}

    a = {"size": 10, "xxh3": "aa"}
    big = {"size": 1 << 29, "xxh3_edges": "bb", "mtime_ns": 1}
    runtime = {"data": record({"data/a.jsonl": a, "data/big.jsonl": big})}
    (tmp_path / "manifest.resolved.json").write_text(json.dumps({"runtime": runtime}))
    moved = {"/elsewhere/data/a.jsonl": a, "/elsewhere/data/big.jsonl": {**big, "mtime_ns": 2}}
    assert changed_data(tmp_path, record(moved)) == []
    edited = {"data/a.jsonl": {"size": 11, "xxh3": "cc"}, "data/big.jsonl": big}
    assert changed_data(tmp_path, record(edited)) == ["data/a.jsonl"]
    added = {"data/a.jsonl": a, "data/big.jsonl": big, "data/c.jsonl": {"size": 1, "xxh3": "d"}}
    assert changed_data(tmp_path, record(added)) == ["data/c.jsonl"]
    assert changed_data(tmp_path, record({"data/a.jsonl": a})) == ["1 file(s) no longer there"]
    # a folder's files renamed into another order are read (and shuffled) otherwise
    swapped = {"data/a.jsonl": big, "data/big.jsonl": a}
    assert changed_data(tmp_path, record(swapped)) == ["data: its files named into another order"]
    renamed = {"data/a2.jsonl": a, "data/big.jsonl": big}
    assert changed_data(tmp_path, record(renamed)) == []
    # a hub source read from its cached snapshot: that snapshot's files since 2026-12-08; a
    # run that began without them recorded is compared as it recorded its source
    hub = {"kind": "hub", "location": "org/mini", "revision": "unpinned"}
    began = {"stats": {"inputs": {"sources": {"train": [hub]}}}}
    (tmp_path / "manifest.resolved.json").write_text(json.dumps({"runtime": {"data": began}}))
    files = {"data/train.jsonl": {"blob": "f00d", "size": 9}}
    now = {"train": [{**hub, "snapshot": "def", "files": files}]}
    assert changed_data(tmp_path, {"stats": {"inputs": {"sources": now}}}) == []
    began["stats"]["inputs"]["sources"] = now
    (tmp_path / "manifest.resolved.json").write_text(json.dumps({"runtime": {"data": began}}))
    other = {"data/train.jsonl": {"blob": "beef", "size": 9}}
    later = {"train": [{**hub, "snapshot": "e1", "files": other}]}
    assert changed_data(tmp_path, {"stats": {"inputs": {"sources": later}}}) == ["data/train.jsonl"]


def test_a_run_set_aside_by_an_overwrite_still_preparing_is_named(tmp_path: Path) -> None:
    """While a `train --overwrite` loads its data and model, the run it replaces is set aside
    under its pid: generate and package say so (not "no adapter_config.json")."""
    import os

    from expert_cli.errors import UserError
    from expert_cli.train.outputs import adapter_base, set_aside_line

    assert set_aside_line(tmp_path) is None
    (tmp_path / ".overwritten-12x").mkdir()  # not ours: no pid
    (tmp_path / ".overwritten-\u00b2").mkdir()  # a digit to str.isdigit, not to int()
    from expert_cli.train.run_folder import sweep_leftovers

    assert set_aside_line(tmp_path) is None and sweep_leftovers(tmp_path) == []
    assert set_aside_line(tmp_path) is None
    (tmp_path / f".overwritten-{os.getpid()}").mkdir()
    with pytest.raises(UserError) as caught:
        adapter_base(tmp_path)
    assert caught.value.lines == [
        f"{tmp_path}: a `train --overwrite` into it is preparing; the run it held is in "
        f".overwritten-{os.getpid()} until training begins (then it is removed)"
    ]


def test_a_run_recorded_before_sources_named_their_field_resumes(demo_expert_dir: Path) -> None:
    """manifest.resolved.json of runs before this version has no `field` in its sources:
    every --resume of such a run was refused as "trained with another configuration"."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.same_run import changed_fields

    resolved = resolve(load_manifest(demo_expert_dir / "manifest.json"), cpu_environment())
    old = resolved.model_dump(mode="json")
    for key in ("train_sources", "validation_sources"):
        old[key] = [{k: v for k, v in s.items() if k != "field"} for s in old[key]]
    assert changed_fields(old, resolved) == []
    old["train_sources"][0]["location"] = "/elsewhere/train.jsonl"
    assert changed_fields(old, resolved) == ["train_sources"]


def test_a_run_warmed_up_by_an_earlier_versions_reading_of_0_is_told_how_to_go_on(
    demo_expert_dir: Path, tmp_path: Path
) -> None:
    """A run begun before 2026-12-07 with warmup_ratio 0 recorded the default 0.03 (a written
    0 was read as unset); its --resume is refused as a change, and says how to continue it."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.errors import UserError
    from expert_cli.train.run_folder import Previous, check_resumable

    loaded = load_manifest(demo_expert_dir / "manifest.json", ["warmup_ratio=0"])
    resolved = resolve(loaded, cpu_environment())
    old = {**resolved.model_dump(mode="json"), "warmup_ratio": 0.03}
    with pytest.raises(UserError) as caught:
        check_resumable(tmp_path, Previous("interrupted", 10, old), resolved)
    said = str(caught.value)
    assert "changed: warmup_ratio 0.03 -> 0.0" in said
    assert "--set warmup_ratio=0.03 continues the run as it began" in said


def test_a_resume_keeps_the_schedule_and_the_optimizer(demo_expert_dir: Path) -> None:
    """--resume --set warmup_steps=25 said "the learning-rate schedule stays" and went on at
    another rate; optim sgd after adamw failed in the optimizer (KeyError 'momentum'). The
    fused and plain AdamW a GPU and a CPU choose keep the same state: no change."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.same_run import changed_fields

    resolved = resolve(load_manifest(demo_expert_dir / "manifest.json"), cpu_environment())
    old = resolved.model_dump(mode="json")
    assert resolved.optim == "adamw_torch"
    assert changed_fields({**old, "optim": "adamw_torch_fused"}, resolved) == []
    changed = {**old, "warmup_steps": 25, "weight_decay": 0.5, "max_grad_norm": 0.001}
    assert changed_fields({**changed, "optim": "sgd"}, resolved) == [
        f"warmup_steps 25 -> {resolved.warmup_steps}",
        f"weight_decay 0.5 -> {json.dumps(resolved.weight_decay)}",
        f"max_grad_norm 0.001 -> {json.dumps(resolved.max_grad_norm)}",
        "optim",
    ]
    # Adam's moments come back with the optimizer's state: another value would not apply;
    # a run recorded before they were has the Trainer's defaults, which this one keeps
    assert changed_fields({**old, "adam_beta2": 0.95}, resolved) == ["adam_beta2 0.95 -> 0.999"]
    before = {k: v for k, v in old.items() if not k.startswith("adam_")}
    assert changed_fields(before, resolved) == []


@pytest.mark.parametrize("taken", [False, True])
def test_a_run_whose_folder_is_removed_stops_and_writes_nothing_more(
    tmp_path: Path, tiny_model_dir: Path, taken: bool, monkeypatch
) -> None:
    """`rm -rf` of a live run's folder took its lock file with it: a second train then took a
    new lock there and both wrote the one folder, each saying its run was written; alone, the
    run wrote its metrics into nothing (a traceback). It stops before its next log, exit 1,
    writing nothing more there (`taken`: another train's lock file is there by then). The
    folder goes as checkpoint-2 is marked whole, in the run's own thread: from another
    thread, on a loaded machine, it went at any moment, inside a save already under way too
    (whose files no look before it can keep out)."""
    from expert_cli.train.checkpoints import CheckpointMarker

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=64, config={"save_steps": 2})
    out = tmp_path / "out"
    marked = CheckpointMarker.on_save

    def removed_once_marked(self, args, state, control, **kwargs) -> None:
        marked(self, args, state, control, **kwargs)
        if state.global_step == 2:
            shutil.rmtree(out)
            if taken:  # a second train's claim: the folder again, with its own lock file
                out.mkdir()
                (out / ".train.lock").write_text("")

    monkeypatch.setattr(CheckpointMarker, "on_save", removed_once_marked)
    done = _train(manifest, out, "--max-steps", "400")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"--output {out}: the run folder, or its .train.lock, was removed while this run "
        "trained in it"
    ) in " ".join(done.stderr.split())
    assert "Traceback" not in done.stdout + done.stderr and "completed" not in done.stdout
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert left == ([".train.lock"] if taken else [])


def test_a_resume_on_a_cache_of_another_format_is_said(
    trained_once: tuple[Path, Path], tmp_path: Path
) -> None:
    """A run begun by an earlier expert-cli (a cache format since changed) resumed on the
    cache this one builds, whose rows may be packed otherwise, in silence: it says so."""
    manifest, finished = trained_once
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    resolved_file = out / "manifest.resolved.json"
    resolved = json.loads(resolved_file.read_text())
    current = resolved["runtime"]["data"]["stats"]["inputs"]["format_version"]
    resolved["runtime"]["data"]["stats"]["inputs"]["format_version"] = current - 8
    resolved_file.write_text(json.dumps(resolved))
    done = _train(manifest, out, "--max-steps", "8", "--resume")
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert (
        f"--resume: {out} began on a token cache of format {current - 8}, and this expert-cli "
        f"builds format {current}, which may lay out or pack some examples otherwise"
    ) in said
    again = _train(manifest, tmp_path / "fresh", "--max-steps", "2")  # no word on a new run
    assert "began on a token cache of format" not in again.stdout


def test_checkpoints_without_markers_say_how_a_whole_one_is_resumed(
    trained_once: tuple[Path, Path], tmp_path: Path
) -> None:
    """The first day's versions wrote no _COMPLETE: their whole checkpoints were called "not
    written whole" with no way on. The refusal says how to mark one, and --resume then checks
    the rest of it as any other."""
    manifest, finished = trained_once
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    (out / "adapter_model.safetensors").unlink()  # stopped before its end
    for marker in (out / "checkpoints").glob(f"*/{COMPLETE}"):
        marker.unlink()
    refused = _train(manifest, out, "--resume", "--max-steps", "8")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "(checkpoint-3 not written whole; checkpoint-6 not written whole)" in said
    assert (
        f"a checkpoint without {COMPLETE} was cut short while written, or written by an "
        "expert-cli of before 2026-11-23, which marked none: where so, an empty _COMPLETE file "
        "put in it lets --resume check the rest"
    ) in said
    (out / "checkpoints" / "checkpoint-6" / COMPLETE).write_text("")
    done = _train(manifest, out, "--resume", "--max-steps", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming from checkpoint-6 (step 6 of 8)" in done.stdout
