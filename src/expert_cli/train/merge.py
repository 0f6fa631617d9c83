"""`expert-cli merge`: fold a trained adapter into its base model, save a standalone model.

The base model is the one named in the adapter's `adapter_config.json` (for a random-init
base, the `base_model/` folder the training run wrote beside the adapter). The merged model
is saved as safetensors with the adapter's tokenizer, written to a temporary folder first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer

from expert_cli.atomic import atomic_folder
from expert_cli.errors import UserError
from expert_cli.paths import resolved_path

ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # what peft loads
LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, SafetensorError)


def adapter_base(adapter: Path) -> str:
    """The base model path or hub id recorded in the adapter's configuration."""
    config_path = adapter / "adapter_config.json"
    if not config_path.is_file():
        raise UserError(
            f"--adapter {adapter}: no adapter_config.json (expected the output "
            "folder of `expert-cli train`)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise UserError(f"{config_path}: not a readable JSON adapter configuration") from None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        raise UserError(f"{config_path}: base_model_name_or_path is not set")
    if not any((adapter / name).is_file() for name in ADAPTER_WEIGHTS):
        raise UserError(
            f"--adapter {adapter}: no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})"
            " beside adapter_config.json"
        )
    local = adapter / base  # a random-init base saved inside the run folder: a relative path
    return str(local) if not Path(base).is_absolute() and local.is_dir() else base


def load_adapted(adapter: Path, base_name: str, dtype: Any) -> PeftModel:
    """The base model with the run's adapter on it; a base or adapter that cannot be loaded is
    a UserError naming it (and the kind of failure, never the file's bytes)."""
    try:
        base = AutoModelForCausalLM.from_pretrained(base_name, dtype=dtype)
    except LOAD_ERRORS as exc:
        raise UserError(
            f"{adapter / 'adapter_config.json'}: base model {base_name} cannot be loaded "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    try:
        return PeftModel.from_pretrained(base, str(adapter))
    except LOAD_ERRORS as exc:
        raise UserError(
            f"--adapter {adapter}: cannot load the adapter on {base_name} ({type(exc).__name__})"
        ) from None


def _merge_dtype(adapter: Path) -> Any:
    """Save in the dtype the run trained its base weights in (from manifest.resolved.json)."""

    resolved = adapter / "manifest.resolved.json"
    if resolved.is_file():
        runtime = json.loads(resolved.read_text(encoding="utf-8")).get("runtime", {})
        name = runtime.get("model", {}).get("dtype")
        if name in ("bfloat16", "float16", "float32"):
            return getattr(torch, name)
    return torch.float32


def merge_adapter(adapter: Path, output: Path) -> Path:
    """Load base + adapter (full precision weights, even if trained quantized), merge, save."""

    adapter = resolved_path(adapter, "--adapter")
    output = resolved_path(output, "--output")
    base_name = adapter_base(adapter)
    if output.exists() and any(output.iterdir()):
        raise UserError(f"--output {output}: exists and is not empty; choose a new folder")
    model = load_adapted(adapter, base_name, _merge_dtype(adapter)).merge_and_unload()
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(output) as tmp:  # an existing `output` is empty, checked above
        model.save_pretrained(tmp, safe_serialization=True)
        AutoTokenizer.from_pretrained(adapter).save_pretrained(tmp)
    return output
