"""On a GPU: every attention kernel the machine has keeps packed examples apart (logits equal
to each example alone), and every fused loss backend matches the standard loss and gradients."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from train_helpers import ROOT, cli_env


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_fast_path_matches_plain_path_on_gpu() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/check_fast_path_gpu.py", "--json"],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    checked = {r.get("attn") for r in report["results"]}
    assert {"sdpa", "eager"} <= checked
    for r in report["results"]:
        assert r["ok"], r


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_the_probes_run_on_the_gpu_with_the_model(tmp_path, tiny_model_dir) -> None:
    """The model is on the GPU from its load: the attention probe checks the kernel there
    and `batch_size: auto` measures a micro-step (on an H100 the probe said "not probed" and
    auto stopped with a device mismatch while the model was still on the CPU)."""
    from train_helpers import write_expert

    from expert_cli.train.run import Silent, TrainOptions, train

    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=32, config={"batch_size": "auto", "bf16": True}
    )
    result = train(TrainOptions(manifest=manifest, output=tmp_path / "run", max_steps=2), Silent())
    assert result.status == "completed"
    resolved = json.loads((tmp_path / "run" / "manifest.resolved.json").read_text())
    assert resolved["runtime"]["batch"]["per_row_gb"] > 0
    assert not any("not probed" in n for n in resolved["runtime"]["model"]["notes"])
    assert resolved["runtime"]["model"]["fused_lora_layers"] > 0  # the GPU default
