"""rsLoRA's scale folded into the shipped weights. A rank-stabilised adapter (peft's
`use_rslora`) scales its output by alpha / sqrt(r); HiveLLM's runtime reads r and lora_alpha
and applies alpha / r x B A, so it would apply the adapter sqrt(r) times too weakly (4 times
at r 16). Each lora_B (and an embedding's lora_embedding_B) times sqrt(r) makes it a plain
LoRA of the same r and alpha that gives the same update: B' A x alpha / r = B A x alpha /
sqrt(r). DoRA's magnitudes are left as they are: its norm is of the same W + scale x B A.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.weights import tensors_of

B_WEIGHTS = ("lora_B", "lora_embedding_B")  # the factor each module's update is scaled after


def is_rslora(config: dict[str, Any]) -> bool:
    """Whether an adapter_config.json scales by alpha / sqrt(r) (peft's LoRA or DoRA)."""
    return config.get("peft_type") == "LORA" and config.get("use_rslora") is True


def folded(weights: Path, config: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The adapter's weights with sqrt(r) folded into each B, and its configuration with
    `use_rslora` false; a configuration of per-module ranks or alphas (rank_pattern,
    alpha_pattern: no expert-cli run writes them) is refused, since HiveLLM's runtime reads
    one r and one alpha."""
    patterned = [k for k in ("rank_pattern", "alpha_pattern") if config.get(k)]
    rank = config.get("r")
    if patterned or not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        why = f"{' and '.join(patterned)} set" if patterned else "no whole r"
        raise UserError(
            f"--adapter {shown_path(weights.parent)}: adapter_config.json: an rsLoRA adapter "
            f"with {why} cannot be folded into the plain LoRA HiveLLM's runtime applies"
        )
    factor = math.sqrt(rank)
    tensors, metadata = tensors_of(weights)
    for name, tensor in tensors.items():
        if any(f".{b}." in name or name.endswith(f".{b}") for b in B_WEIGHTS):
            tensors[name] = (tensor.to(torch.float32) * factor).to(tensor.dtype)
    return save(tensors, metadata=metadata), {**config, "use_rslora": False}


def folded_note(config: dict[str, Any]) -> str:
    """What a package says of an rsLoRA adapter it folded."""
    rank = config.get("r")
    return (
        f"adapter_config.json: rsLoRA's scale alpha / sqrt(r) is folded into lora_B (x"
        f"{math.sqrt(rank):.3g} at r {rank}): the package's adapter is a plain LoRA at alpha / r, "
        "as HiveLLM's runtime applies it (use_rslora false there; the run keeps its own)"
    )
