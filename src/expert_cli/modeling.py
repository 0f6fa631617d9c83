"""The base model and its adapter: weights dtype, TF32, attention kernel, QLoRA, peft.

Everything here is decided from a `ResolvedConfig`; every choice that differs from what the
configuration asked for is returned as a note for the console, never taken silently.
torch, transformers and peft are imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_cli.errors import RunError, UserError

if TYPE_CHECKING:
    import torch
    from peft import PeftConfig, PeftModel
    from transformers import PreTrainedModel

    from expert_cli.resolve import ResolvedConfig

# The order in which attention kernels are tried when a model does not support the chosen one.
ATTENTION_ORDER = ["flash_attention_2", "sdpa", "eager"]


@dataclass
class ModelChoices:
    """What the loader decided, for the console and `manifest.resolved.json`."""

    dtype: str
    attn_implementation: str
    tf32: bool
    quantization: str
    device: str
    notes: list[str] = field(default_factory=list)


def training_device(local_rank: int) -> str:
    """`cuda:<local rank>` when CUDA is available, else `cpu`."""
    import torch

    return f"cuda:{max(local_rank, 0)}" if torch.cuda.is_available() else "cpu"


def weight_dtype(resolved: ResolvedConfig, on_gpu: bool) -> torch.dtype:
    """dtype of the frozen weights: the manifest's bf16/fp16 quantization, else the mixed
    precision on a GPU (bf16, fp16), else fp32 (CPU)."""
    import torch

    if resolved.quantization == "bf16":
        return torch.bfloat16
    if resolved.quantization == "fp16":
        return torch.float16
    if on_gpu and resolved.bf16:
        return torch.bfloat16
    if on_gpu and resolved.fp16:
        return torch.float16
    return torch.float32


def apply_tf32(enabled: bool) -> bool:
    """Turn TF32 matmuls/convolutions on or off on CUDA; returns whether it is on."""
    import torch

    if not torch.cuda.is_available():
        return False
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return enabled


def quantization_config(resolved: ResolvedConfig, on_gpu: bool) -> Any:
    """bitsandbytes settings for int4 (NF4, double quantization, bf16 compute) or int8."""
    if resolved.quantization not in ("int4", "int8"):
        return None
    import torch
    from transformers import BitsAndBytesConfig

    if resolved.quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = torch.float16 if on_gpu and resolved.fp16 and not resolved.bf16 else torch.bfloat16
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )


def build_random_model(resolved: ResolvedConfig, dtype: torch.dtype,
                       attn: str) -> PreTrainedModel:
    """The architecture of `base_model/config.json` with seeded random weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(resolved.base_model)
    if not (folder / "config.json").is_file():
        raise UserError(f"{resolved.base_model}: init 'random' needs a config.json in this folder")
    config = AutoConfig.from_pretrained(folder, trust_remote_code=resolved.trust_remote_code)
    torch.manual_seed(resolved.seed)
    return AutoModelForCausalLM.from_config(
        config, dtype=dtype, attn_implementation=attn,
        trust_remote_code=resolved.trust_remote_code,
    )


def _from_pretrained(resolved: ResolvedConfig, source: str, dtype: torch.dtype, attn: str,
                     device: str) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    quant = quantization_config(resolved, device.startswith("cuda"))
    kwargs: dict[str, Any] = dict(
        dtype=dtype, attn_implementation=attn, trust_remote_code=resolved.trust_remote_code,
    )
    if resolved.base_model_kind == "hub" and source == resolved.base_model:
        kwargs["revision"] = resolved.revision
    if quant is not None:
        kwargs.update(quantization_config=quant, device_map={"": device})
    try:
        return AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as exc:
        raise UserError(f"base model {source}: cannot be loaded ({exc})") from None


def _with_attention_fallback(load: Any, chosen: str, notes: list[str]) -> tuple[Any, str]:
    """Call `load(attn)` with the chosen kernel; if the model rejects it, try the next one
    in ATTENTION_ORDER and say so."""
    order = ATTENTION_ORDER[ATTENTION_ORDER.index(chosen):]
    for attn in order:
        try:
            return load(attn), attn
        except (ValueError, ImportError) as exc:
            if "attn" not in str(exc).lower() and "attention" not in str(exc).lower():
                raise
            if attn == order[-1]:
                raise RunError(f"no attention kernel works for this model: {exc}") from exc
            notes.append(f"attention: {attn} not supported by this model ({exc}); trying next")
    raise RunError("no attention kernel to try")  # unreachable: order is never empty


def load_base_model(resolved: ResolvedConfig, device: str,
                    source: str | None = None) -> tuple[PreTrainedModel, ModelChoices]:
    """Load (or, for init 'random', build) the base model ready for adapter training.

    `source` replaces `resolved.base_model` as the folder to read weights from (used for a
    random-init model that was materialised to disk so it can be quantized).
    """
    on_gpu = device.startswith("cuda")
    dtype = weight_dtype(resolved, on_gpu)
    notes: list[str] = []
    if resolved.quantization in ("int4", "int8") and resolved.init == "random" and source is None:
        raise RunError("a random-init model must be saved before it can be quantized")
    if resolved.init == "random" and source is None:
        model, attn = _with_attention_fallback(
            lambda a: build_random_model(resolved, dtype, a), resolved.attn_implementation, notes)
    else:
        path = source or resolved.base_model
        model, attn = _with_attention_fallback(
            lambda a: _from_pretrained(resolved, path, dtype, a, device),
            resolved.attn_implementation, notes)
    model.config.use_cache = False
    if resolved.quantization in ("int4", "int8"):
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=resolved.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    compute = "fp16" if on_gpu and resolved.fp16 and not resolved.bf16 else "bf16"
    shown = {"int4": f"nf4 + double quantization, {compute} compute", "int8": "int8"}
    choices = ModelChoices(
        dtype=shown.get(resolved.quantization, str(dtype).removeprefix("torch.")),
        attn_implementation=attn,
        tf32=apply_tf32(resolved.use_tf32), quantization=resolved.quantization,
        device=device, notes=notes,
    )
    return model, choices


def adapter_config(resolved: ResolvedConfig, total_steps: int) -> PeftConfig:
    """The peft configuration for the manifest's adapter type."""
    from peft import AdaLoraConfig, IA3Config, LoKrConfig, LoraConfig

    targets = resolved.target_modules
    kind = resolved.adapter_type
    if kind in ("lora", "dora"):
        return LoraConfig(
            r=resolved.rank, lora_alpha=resolved.alpha, lora_dropout=resolved.dropout,
            target_modules=targets, use_dora=resolved.use_dora, bias="none",
            task_type="CAUSAL_LM",
        )
    if kind == "ia3":
        return IA3Config(target_modules=targets,
                         feedforward_modules=resolved.feedforward_modules or [],
                         task_type="CAUSAL_LM")
    if kind == "lokr":
        return LoKrConfig(r=resolved.rank, alpha=resolved.alpha,
                          rank_dropout=resolved.dropout, target_modules=targets,
                          task_type="CAUSAL_LM")
    if kind == "adalora":
        if total_steps <= 0:
            raise UserError("adapter_type adalora: needs a known number of training steps")
        return AdaLoraConfig(
            init_r=resolved.rank, target_r=max(1, resolved.rank // 2),
            lora_alpha=resolved.alpha, lora_dropout=resolved.dropout,
            target_modules=targets, total_step=total_steps, task_type="CAUSAL_LM",
        )
    raise UserError(f"adapter_type: {kind!r} is not supported (lora, dora, ia3, lokr, adalora)")


def attach_adapter(model: PreTrainedModel, resolved: ResolvedConfig,
                   total_steps: int) -> PeftModel:
    """Wrap `model` with the manifest's adapter (seeded init); adapter weights kept in fp32."""
    from peft import get_peft_model
    from transformers import set_seed

    set_seed(resolved.seed)

    try:
        peft_model = get_peft_model(model, adapter_config(resolved, total_steps),
                                    autocast_adapter_dtype=True)
    except ValueError as exc:
        raise UserError(f"adapter ({resolved.adapter_type}, target_modules="
                        f"{resolved.target_modules}): {exc}") from None
    if resolved.gradient_checkpointing and resolved.quantization not in ("int4", "int8"):
        peft_model.enable_input_require_grads()
    return peft_model


def parameter_counts(model: PeftModel) -> tuple[int, int]:
    """(trainable, total) parameters; 4-bit weights counted at their unpacked size."""
    trainable, total = model.get_nb_trainable_parameters()
    return int(trainable), int(total)


def matmul_parameters(model: PeftModel, total: int) -> int:
    """Parameters that take part in matmuls: all but an untied input embedding (a lookup)."""
    base = model.get_base_model()
    embed = base.get_input_embeddings()
    tied = bool(getattr(base.config, "tie_word_embeddings", False))
    return total if tied else total - embed.weight.numel()
