"""What `probe_environment` reads from a GPU: bf16 only where the hardware has it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

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
