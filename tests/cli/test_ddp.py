"""The same command under torchrun: 2 CPU processes (gloo), one adapter, rank 0 prints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import ROOT, cli_env, read_metrics, write_expert


@pytest.mark.slow
def test_two_process_ddp_on_cpu(tmp_path: Path, tiny_model_dir: Path) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "expert_cli.cli",
        "train",
        "--manifest",
        str(manifest),
        "--output",
        str(out),
        "--max-steps",
        "3",
    ]
    popen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        stdout, stderr = popen.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)  # torchrun and its workers
        raise
    proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("completed") == 1  # only rank 0 prints
    assert proc.stdout.count("trainable of") == 1
    assert (out / "adapter_model.safetensors").is_file()
    assert not list(out.glob(".final-*"))
    metrics = read_metrics(out)
    assert metrics["summary"]["steps"] == 3 and metrics["summary"]["status"] == "completed"
    import json

    resolved = json.loads((out / "manifest.resolved.json").read_text())
    assert resolved["runtime"]["world_size"] == 2
