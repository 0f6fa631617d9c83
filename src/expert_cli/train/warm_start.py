"""A run's adapter started from one trained before (`training.config.init_adapter`; its
configuration was checked as the manifest resolved: config/warm_start.py): every tensor the
run's adapter has, of the same shape, read from the folder's weights and nothing else there
(an adapter of other layers would start part of the model from nothing, or drop what was
trained), then loaded by peft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors import SafetensorError

from expert_cli.config.warm_start import FIELD, WEIGHTS
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.weights import (
    non_finite_line,
    shape_text,
    shown_tensor,
    tensor_is_finite,
    tensors_of,
)


def start_from(peft_model: Any, folder: Path) -> str:
    """Load the adapter in `folder` into `peft_model`'s adapter; the note saying so.
    UserError naming the first tensor that is missing, extra or of another shape."""
    label = f"{FIELD} {shown_path(folder)}"
    try:
        saved, _ = tensors_of(folder / WEIGHTS)
    except (SafetensorError, OSError):
        raise UserError(f"{label}: {WEIGHTS} cannot be read (damaged or cut short)") from None
    wanted = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(peft_model).items()}
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    if missing or extra:
        which, name = (
            ("holds no", missing[0])
            if missing
            else ("holds a layer this run does not adapt,", extra[0])
        )
        count = len(missing or extra)
        raise UserError(
            f"{label}: {which} {_short(name)} ({count} tensor{'s' if count > 1 else ''} in "
            "all): it was trained on other layers; give this run its target_modules"
        )
    for name, shape in wanted.items():
        if tuple(saved[name].shape) != shape:
            raise UserError(
                f"{label}: {_short(name)} is {shape_text(saved[name].shape)} there, "
                f"{shape_text(shape)} here (another base model?)"
            )
    if bad := [name for name, tensor in saved.items() if not tensor_is_finite(tensor)]:
        raise UserError(f"{label}: {WEIGHTS}: {non_finite_line(bad)}; give a sound adapter")
    set_peft_model_state_dict(peft_model, saved)
    return f"init_adapter: the adapter starts from {shown_path(folder)} ({len(saved)} tensors)"


def _short(name: str) -> str:
    """A tensor's name without peft's prefix, as a message may show it (a name in the
    folder's file is its content: shown only where it looks like a name)."""
    return shown_tensor(name.removeprefix("base_model.model."))
