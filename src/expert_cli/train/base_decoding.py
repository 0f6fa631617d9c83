"""What a base model's generation_config.json does to `generate`'s answers where the run's
`training.decoding` leaves a value unset: transformers applies it unseen."""

from __future__ import annotations

from typing import Any

from transformers import GenerationConfig

# what transformers does with each sampling value a base model's generation_config.json leaves
# unset; a value set there is applied wherever generate's own settings do not set it
UNSET_MEANS = {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
}
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p")


def inherited_settings(model: Any, settings: dict[str, Any]) -> dict[str, Any]:
    """Values of the base model's generation_config.json that transformers applies because
    `settings` leave them unset (the sampling ones only when sampling): Qwen3 ships top_k 20
    and top_p 0.95, which changed answers without being shown."""
    config = getattr(model, "generation_config", None)
    found = {}
    for key, unset in UNSET_MEANS.items():
        if key in settings or (key in SAMPLING_ONLY and not settings.get("do_sample")):
            continue
        value = getattr(config, key, None)
        if value is not None and value != unset:
            found[key] = value
    return found


def sampled_base_note(model: Any, decoding: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """A note where generate decodes greedily only because training.decoding names no
    temperature while the base's generation_config.json samples (Qwen3's: 0.6, top_p 0.95,
    top_k 20; its authors warn that greedy decoding can repeat itself without end)."""
    config = getattr(model, "generation_config", None)
    if (
        settings.get("do_sample")
        or decoding.get("temperature") is not None  # 0 is greedy by choice; null is unset
        or not getattr(config, "do_sample", False)
    ):
        return None
    shown = ", ".join(
        f"{key} {getattr(config, key)}"
        for key in ("temperature", "top_p", "top_k")
        if getattr(config, key, None) is not None
    )
    return (
        f"decoding greedily: training.decoding sets no temperature, while the base model's "
        f"generation_config.json samples ({shown}); set training.decoding.temperature to sample"
    )


def own_generation_config(model: Any, resolved: Any) -> None:
    """Give a random-init `model` the generation_config.json of the folder (or hub model) its
    config.json came from, where there is one: `from_config` makes one from config.json alone,
    so the base's sampling values and stops were not saved in the run's base_model/ and
    generate decoded without them. One that is not JSON was refused before (train's data
    step, data.model_files); one that cannot be read leaves the model's own."""
    on_hub = resolved.base_model_kind == "hub"
    try:
        model.generation_config = GenerationConfig.from_pretrained(
            resolved.base_model,
            revision=resolved.revision if on_hub else None,
            local_files_only=not on_hub,
        )
    except (OSError, ValueError, TypeError):  # none there, a damaged file, bad values
        return
