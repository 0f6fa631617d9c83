"""`training.config`'s optimizer fields and what a run's optimizer is: the Trainer's optimizer
by its name, the decay, the clipping, Adam's moments and LoRA+'s ratio."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from expert_cli.config.base import Strict, first
from expert_cli.config.environment import Environment

Optimizer = Literal[
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "adafactor",
    "sgd",
    "lion_8bit",
    "lion_32bit",
]
BITSANDBYTES = {
    "adamw_bnb_8bit",
    "adamw_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "lion_8bit",
    "lion_32bit",
}
# transformers' defaults, which a run records where the manifest leaves them unset
ADAM_DEFAULTS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8}
# what each optimizer the Trainer builds leaves unused of them (Lion takes the betas alone;
# Adafactor and SGD neither)
UNUSED_BY = {
    "adafactor": tuple(ADAM_DEFAULTS),
    "sgd": tuple(ADAM_DEFAULTS),
    "lion_8bit": ("adam_epsilon",),
    "lion_32bit": ("adam_epsilon",),
}


class OptimizerFields(Strict):
    """The optimizer's part of `training.config`."""

    optim: Optimizer | None = Field(None, description="Optimizer (Trainer's names).")
    weight_decay: float = Field(0.0, ge=0, le=10, description="Extension: AdamW weight decay.")
    max_grad_norm: float = Field(
        1.0,
        ge=0,
        le=1e6,
        description="Extension: gradient clipping norm; 0 clips nothing (the Trainer's meaning).",
    )
    adam_beta1: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Extension: decay of the gradient's running mean in AdamW and Lion.",
    )
    adam_beta2: float | None = Field(
        None,
        ge=0,
        lt=1,
        description="Extension: decay of the squared gradient's running mean in AdamW, and "
        "Lion's second beta (0.95 steadies large or spiky updates).",
    )
    adam_epsilon: float | None = Field(None, gt=0, le=1, description="Extension: AdamW's epsilon.")
    loraplus_lr_ratio: float | None = Field(
        None,
        ge=1,
        le=1024,
        description="Extension: LoRA+ (LoRA and DoRA): each lora_B trained at this many times "
        "the learning rate of its lora_A (16 is LoRA+'s usual; a lower learning_rate may suit).",
    )


def optimizer_choice(cfg: OptimizerFields, env: Environment, notes: list[str]) -> dict[str, Any]:
    """The run's optimizer and its settings, with a note for each value not applied."""
    optim = cfg.optim or ("adamw_torch_fused" if env.has_gpu else "adamw_torch")
    if optim in BITSANDBYTES:
        if not env.has_gpu:
            notes.append(f"optim: {optim} keeps its states on a GPU; using adamw_torch on CPU")
            optim = "adamw_torch"
        elif env.bitsandbytes is None:
            notes.append(
                f"optim: {optim} needs bitsandbytes, not installed; using adamw_torch_fused"
            )
            optim = "adamw_torch_fused"
    given = [key for key in UNUSED_BY.get(optim, ()) if getattr(cfg, key) is not None]
    if given:
        notes.append(f"{', '.join(given)}: not used by optim {optim}")
    if cfg.max_grad_norm == 0:
        notes.append("max_grad_norm: 0, gradients are not clipped")
    adam = {key: first(getattr(cfg, key), unset) for key, unset in ADAM_DEFAULTS.items()}
    return dict(optim=optim, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, **adam)
