"""A full disk is exit 1 naming the folder, with nothing half-written and the last good state
intact. Needs a small tmpfs (root on Linux); skipped where one cannot be mounted."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_helpers import run_cli, write_expert


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
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
    out = run_cli("pretokenize", "--manifest", str(manifest))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no space left on {small_disk / 'cache'}" in " ".join(out.stderr.split())
    assert "Traceback" not in out.stderr
    left = [p.name for p in (small_disk / "cache").iterdir()]
    assert not [n for n in left if n.startswith(".tmp-")]  # nothing half-written
    assert not [n for n in left if n.startswith("expert-")]  # no cache that looks finished


@pytest.mark.slow
def test_a_full_disk_while_saving_a_checkpoint(
    small_disk: Path, tmp_path: Path, tiny_model_dir: Path
) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"save_steps": 2})
    out = small_disk / "run"
    done = run_cli("train", "--manifest", str(manifest), "--output", str(out), "--max-steps", "8")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no space left on {out}" in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
    # metrics.json keeps its last whole state (it cannot be rewritten on a full disk)
    assert json.loads((out / "metrics.json").read_text())["summary"]["status"] == "running"
    assert not list(out.rglob(".tmp-*")) and not list(out.glob(".final-*"))
    checkpoints = list((out / "checkpoints").glob("checkpoint-*"))
    marked = [p for p in checkpoints if (p / "_COMPLETE").exists()]
    unmarked = [p for p in checkpoints if not (p / "_COMPLETE").exists()]
    assert checkpoints
    assert len(unmarked) <= 1  # at most the one that was being written when the disk filled
    assert all((p / "adapter_model.safetensors").stat().st_size > 0 for p in marked)
