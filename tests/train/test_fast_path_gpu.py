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
