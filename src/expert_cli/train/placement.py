"""Where a base model's weights go when they are read."""

from __future__ import annotations

from typing import Any

from expert_cli.config.choices import sharded


def load_placement(device: str, distributed: dict[str, Any] | None) -> dict[str, str] | None:
    """Where `from_pretrained` puts the weights: straight onto the run's GPU, so that what
    runs before the Trainer moves the model (the attention probe, the `batch_size: auto`
    memory probe) runs on it too. Not under FSDP or DeepSpeed, which place (and shard) the
    weights themselves; on a CPU the default placement is the run's."""
    from transformers.integrations import is_deepspeed_zero3_enabled, is_fsdp_enabled

    if not device.startswith("cuda") or sharded(distributed):
        return None
    if is_deepspeed_zero3_enabled() or is_fsdp_enabled():
        return None
    return {"": device}
