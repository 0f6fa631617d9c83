"""On a GPU: packed rows give each example the logits it gets alone (sdpa, flash-attn 2)."""

from __future__ import annotations

import importlib.util
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
def test_packed_equals_alone_on_gpu() -> None:
    proc = subprocess.run([sys.executable, "scripts/check_packed_attention_gpu.py", "--json"],
                          capture_output=True, text=True, env=cli_env(), cwd=ROOT,
                          timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    results = json.loads(proc.stdout)["results"]
    kernels = {r["attn"] for r in results}
    assert "sdpa" in kernels
    if importlib.util.find_spec("flash_attn") is not None:
        assert "flash_attention_2" in kernels
    for r in results:
        assert r["ok"], r
