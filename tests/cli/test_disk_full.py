"""A full disk is exit 1 naming the folder, with nothing half-written and the last good state
intact. Needs a small tmpfs (root on Linux); skipped where one cannot be mounted."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_helpers import run_here, write_expert


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """256 KiB: too small for the tiny model's first checkpoint or the data cache."""
    yield from _tmpfs(tmp_path / "small", "256k")


@pytest.fixture
def disk_for_one_checkpoint(tmp_path: Path) -> Iterator[Path]:
    """600 KiB: the tiny model's first checkpoint (~530 KiB) fits, the second does not."""
    yield from _tmpfs(tmp_path / "small", "600k")


def _tmpfs(mount: Path, size: str) -> Iterator[Path]:
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (needs root on Linux)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_while_building_the_cache(
    small_disk: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=3000)
    data = json.loads(manifest.read_text())
    data["training"]["config"]["pretokenized_cache"] = str(small_disk / "cache")
    manifest.write_text(json.dumps(data))
    out = run_here("pretokenize", "--manifest", str(manifest))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no space left on {small_disk / 'cache'}" in " ".join(out.stderr.split())
    assert "Traceback" not in out.stderr
    left = [p.name for p in (small_disk / "cache").iterdir()]
    assert not [n for n in left if n.startswith(".tmp-")]  # nothing half-written
    assert not [n for n in left if n.startswith("expert-")]  # no cache that looks finished


@pytest.mark.slow
def test_a_full_disk_while_saving_a_checkpoint(
    disk_for_one_checkpoint: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"save_steps": 2})
    out = disk_for_one_checkpoint / "run"
    done = run_here("train", "--manifest", str(manifest), "--output", str(out), "--max-steps", "8")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no space left on {out}" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    # the checkpoint the full disk cut short is removed, which makes room to record the end
    assert json.loads((out / "metrics.json").read_text())["summary"]["status"] == "failed"
    assert not list(out.rglob(".tmp-*")) and not list(out.glob(".final-*"))
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2"]
    assert "its last complete checkpoint, checkpoint-2, is intact: free space, then --resume" in (
        " ".join(done.stderr.split())
    )
    assert (out / "checkpoints" / "checkpoint-2" / "_COMPLETE").is_file()
    # --resume on the disk still full: TensorBoard's writer thread printed its traceback, the
    # line said a random-init base is saved and to choose another --output, an empty events
    # file was left
    events = sorted((out / "runs").iterdir())
    _fill(disk_for_one_checkpoint, 0)
    args = ("--output", str(out), "--max-steps", "8", "--resume")
    full = run_here("train", "--manifest", str(manifest), *args)
    said = " ".join(full.stderr.split())
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stdout + full.stderr
    assert said.endswith(
        f"no space left on {out} (the run's records and TensorBoard's events are written there "
        "before training); free space, then train again with --resume (the checkpoint is as it "
        "was)"
    ), said
    assert sorted((out / "runs").iterdir()) == events
    (disk_for_one_checkpoint / "filler").unlink()
    # space freed (the disk grown), --resume goes on from the last good checkpoint to the end
    grown = subprocess.run(
        ["mount", "-o", "remount,size=8m", str(disk_for_one_checkpoint)], capture_output=True
    )
    assert grown.returncode == 0, grown.stderr
    again = run_here("train", "--manifest", str(manifest), *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from checkpoint-2 (step 2 of 8)" in again.stdout + again.stderr
    summary = json.loads((out / "metrics.json").read_text())["summary"]
    assert (summary["status"], summary["steps"]) == ("completed", 8)
    assert (out / "adapter_model.safetensors").stat().st_size > 0


@pytest.mark.slow
def test_a_full_disk_while_saving_the_random_init_base(
    small_disk: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The random-init base is saved into the run folder before training: a disk too small
    for it is exit 1 naming the folder, and the folder this run created is gone again."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8, base={"init": "random"})
    out = run_here("train", "--manifest", str(manifest), "--output", str(small_disk / "run"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no space left on {small_disk / 'run'}" in " ".join(out.stderr.split())
    assert "Traceback" not in out.stderr
    assert list(small_disk.iterdir()) == []  # no run folder, no temporary base


@pytest.mark.slow
def test_a_full_disk_before_the_first_checkpoint_says_to_start_again(
    small_disk: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The first checkpoint does not fit: the line said "the last complete checkpoint is
    intact: free space, then --resume", and --resume then found none. It says to start
    again, and that works once there is room."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"save_steps": 2})
    args = ("--manifest", str(manifest), "--output", str(small_disk / "run"), "--max-steps", "4")
    done = run_here("train", *args)
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert "no checkpoint was written yet: free space, then train again with --overwrite" in said
    assert "--resume" not in said
    grown = subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], capture_output=True)
    assert grown.returncode == 0, grown.stderr
    again = run_here("train", *args, "--overwrite")
    assert again.returncode == 0, again.stdout + again.stderr


def _fill(mount: Path, leave: int) -> None:
    """Fill the tmpfs at `mount` until `leave` bytes are free."""
    stat = os.statvfs(mount)
    (mount / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - leave))


@pytest.mark.slow
def test_a_full_disk_while_packaging(
    disk_for_one_checkpoint: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Too little room for the package, or for its .sha256 once the package fits: exit 1
    naming --output, and neither file (nor a temporary one) is left; an earlier package
    given with --force is still the one there, with its own checksum."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    run = tmp_path / "e" / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    reference = tmp_path / "ref.expert"
    assert run_here("package", "--adapter", str(run), "--output", str(reference)).returncode == 0
    pages = -(-reference.stat().st_size // 4096) * 4096
    disk = disk_for_one_checkpoint
    assert pages < 400 << 10
    earlier = disk / "x.expert"
    earlier.write_bytes(b"an earlier package")
    earlier.with_name("x.expert.sha256").write_text("0" * 64 + "  x.expert\n")
    for leave in (pages // 2, pages):  # the package does not fit; only it fits
        _fill(disk, leave)
        out = run_here("package", "--adapter", str(run), "--output", str(earlier), "--force")
        assert out.returncode == 1, (leave, out.stdout + out.stderr)
        assert f"--output {earlier}: cannot be written" in " ".join(out.stderr.split())
        assert "Traceback" not in out.stderr
        assert sorted(p.name for p in disk.iterdir()) == [
            "filler",
            "x.expert",
            "x.expert.sha256",
        ]
        assert earlier.read_bytes() == b"an earlier package"
        (disk / "filler").unlink()


@pytest.mark.slow
def test_a_full_disk_under_merge_report_and_benchmark(
    small_disk: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Each was a traceback (SafetensorError, PIL's OSError, json's); now exit 1 saying the
    disk is full, and nothing is left where the output went."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    run = tmp_path / "e" / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    full = "no space left on the device; free space and run it again"
    merged = small_disk / "merged"
    bench = ("benchmark", "--duration", "1", "--interval", "0.5")
    for leave, command, expected in (
        (0, ("report", str(run), "--output", str(small_disk / "t.png")), full),
        (0, (*bench, "--output", str(small_disk / "b.json")), full),
        # room for the folder, not for the weights: safetensors' own error
        (
            64 << 10,
            ("merge", "--adapter", str(run), "--output", str(merged)),
            f"--output {merged}: cannot be written (No space left on device)",
        ),
    ):
        _fill(small_disk, leave)
        out = run_here(*command)
        assert out.returncode == 1, (command[0], out.stdout + out.stderr)
        assert expected in " ".join(out.stderr.split()), (command[0], out.stderr)
        assert "Traceback" not in out.stderr
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler"], command[0]
        (small_disk / "filler").unlink()


@pytest.mark.slow
def test_a_full_disk_leaves_no_folder_an_export_made(
    small_disk: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """--output under folders that are not there yet: each export makes them, and when the
    disk fills they are removed again; a folder that was there before stays, empty."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    run = tmp_path / "e" / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    (small_disk / "there").mkdir()
    for command, output in (
        ("package", small_disk / "there" / "new" / "deeper" / "x.expert"),
        ("merge", small_disk / "there" / "new" / "deeper" / "merged"),
        ("export-hub", small_disk / "there" / "new" / "deeper" / "hub"),
        ("export-gguf", small_disk / "there" / "new" / "deeper" / "x.gguf"),
    ):
        _fill(small_disk, 16 << 10)  # room for folders, not for the weights
        out = run_here(command, "--adapter", str(run), "--output", str(output))
        assert out.returncode == 1, (command, out.stdout + out.stderr)
        assert f"--output {output}: cannot be written" in " ".join(out.stderr.split()), command
        assert "Traceback" not in out.stderr
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "there"], command
        assert not any((small_disk / "there").iterdir()), command
        (small_disk / "filler").unlink()
