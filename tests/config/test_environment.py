"""What `probe_environment` reads from a GPU: bf16 only where the hardware has it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from train_helpers import ROOT

from expert_cli.config.environment import probe_environment


@pytest.mark.parametrize(
    ("name", "capability", "bf16"),
    [("Tesla T4", (7, 5), False), ("Tesla V100", (7, 0), False), ("NVIDIA A10G", (8, 6), True)],
)
def test_bf16_only_in_hardware(
    monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int], bf16: bool
) -> None:
    """A T4 or V100 emulates bf16 (torch.cuda.is_bf16_supported() says True there, at a
    fraction of fp16's speed): the environment says no bf16, so a manifest's `bf16: true`
    runs fp16 with a note."""
    props = SimpleNamespace(major=capability[0], minor=capability[1], name=name, total_memory=2**34)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # emulation
    env = probe_environment()
    assert env.gpu_name == name and env.gpu_capability == capability
    assert env.bf16 is bf16
    assert env.tf32 is bf16


def test_hardware_bf16_without_a_gpu_and_by_capability() -> None:
    from expert_cli.config.environment import hardware_bf16

    if not torch.cuda.is_available():
        assert hardware_bf16() is False
    assert hardware_bf16((7, 5)) is False and hardware_bf16((9, 0)) is True


@pytest.mark.parametrize(
    ("capability", "want"), [((7, 5), torch.float16), ((8, 0), torch.bfloat16)]
)
def test_bf16_weights_on_a_gpu_without_bf16_are_fp16(
    monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], want: torch.dtype
) -> None:
    """`quantization: bf16` (HiveLLM's experts say it) on a T4, where the run is fp16: the
    frozen weights are stored fp16 (bf16 weights were cast at every fp16-autocast matmul)."""
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.loading import load_manifest
    from expert_cli.config.resolve import resolve
    from expert_cli.train.model import weight_dtype

    demo = resolve(load_manifest(ROOT / "experts" / "demo" / "manifest.json"), cpu_environment())
    resolved = demo.model_copy(update={"quantization": "bf16", "fp16": True, "bf16": False})
    props = SimpleNamespace(major=capability[0], minor=capability[1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)
    assert weight_dtype(resolved, on_gpu=True) == want
    assert weight_dtype(resolved, on_gpu=False) == torch.bfloat16
    fp32 = resolved.model_copy(update={"fp16": False})  # no autocast: bf16 weights kept
    assert weight_dtype(fp32, on_gpu=True) == torch.bfloat16


def test_more_processes_than_the_gpus_they_see_is_refused() -> None:
    from expert_cli.config.environment import Environment, crowded_gpus

    four = Environment(gpu_count=4, local_processes=8)
    assert crowded_gpus(four) == (
        "8 training processes on this machine, and 4 GPUs: start at most 4 (torchrun "
        "--nproc_per_node 4, accelerate launch --num_processes 4); each process takes a GPU"
    )
    assert crowded_gpus(Environment(gpu_count=4, local_processes=4)) is None
    assert crowded_gpus(Environment(gpu_count=1, local_processes=4)) is None  # one GPU each
    assert crowded_gpus(Environment(gpu_count=0, local_processes=2)) is None  # CPU, gloo
