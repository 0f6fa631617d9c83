"""The base model and its adapter: weights dtype, TF32, attention kernel, QLoRA, peft.

Everything here is decided from a `ResolvedConfig`; every choice that differs from what the
configuration asked for is returned as a note for the console, never taken silently.
torch, transformers and peft are imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from peft import get_peft_model, prepare_model_for_kbit_training
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig, set_seed

from expert_cli.config.adapters import decomposing
from expert_cli.config.choices import FUSED_KERNELS
from expert_cli.config.environment import hardware_bf16
from expert_cli.errors import RunError, UserError
from expert_cli.paths import shown_path
from expert_cli.train import distributed
from expert_cli.train.adapter import (
    adapter_config,
    adapter_error,
    adapter_notes,
    saved_loadable,
    target_problem,
)
from expert_cli.train.attention import TORCH_VARLEN, check_model_config, register_torch_varlen
from expert_cli.train.base_load import four_bit_compute, four_bit_kind, load_pretrained
from expert_cli.train.checkpoints import recorded_feedforward, unfit_problem
from expert_cli.train.divergence import non_finite_weights
from expert_cli.train.fused_dora import fuse_adapter_linears
from expert_cli.train.grouped_lora import group_lora_linears
from expert_cli.train.lora_init import INIT_WEIGHTS, kept_start, save_initial
from expert_cli.train.loss import install_fused_loss
from expert_cli.train.loss_fit import fused_loss_unsupported, unfused_note
from expert_cli.train.placement import load_placement
from expert_cli.train.speed import adapters_in_compute_dtype, apply_liger_kernels
from expert_cli.train.warm_start import start_from
from expert_cli.weights import non_finite_line

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

    from expert_cli.config.resolve import ResolvedConfig


@dataclass
class ModelChoices:
    """What the loader decided, for the console and `manifest.resolved.json`."""

    dtype: str
    attn_implementation: str
    tf32: bool
    quantization: str
    device: str
    fused_loss: str = "off"
    liger_kernels: bool = False
    adapter_precision: str = "fp32"
    fused_lora_layers: int = 0
    grouped_lora_layers: int = 0
    compiled_layers: int = 0
    attention_isolation: str = "not probed"
    notes: list[str] = field(default_factory=list)


def training_device(local_rank: int) -> str:
    """The GPU accelerate gives this process (`cuda:<local rank modulo the GPUs it sees>`:
    a launcher that shows each process one GPU gives every rank cuda:0) when CUDA is
    available, else `cpu`."""
    if not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{max(local_rank, 0) % max(torch.cuda.device_count(), 1)}"


def weight_dtype(resolved: ResolvedConfig, on_gpu: bool) -> torch.dtype:
    """dtype of the frozen weights: the manifest's bf16/fp16 quantization, else the mixed
    precision on a GPU (bf16, fp16), else fp32 (CPU). `quantization: bf16` in an fp16 run on a
    GPU without bf16 (a T4, a V100) stores fp16: bf16 weights under fp16 autocast were cast at
    every matmul, forward and backward, and the other layers ran emulated bf16 (an fp32 run
    there keeps bf16 weights: fp16 ones without autocast or loss scaling could overflow)."""

    if resolved.quantization == "bf16":
        fp16_run = on_gpu and resolved.fp16 and not hardware_bf16()
        return torch.float16 if fp16_run else torch.bfloat16
    if resolved.quantization == "fp16":
        return torch.float16
    if on_gpu and resolved.bf16:
        return torch.bfloat16
    if on_gpu and resolved.fp16:
        return torch.float16
    return torch.float32


def autocast_dtype(resolved: ResolvedConfig) -> torch.dtype | None:
    """The mixed-precision dtype the Trainer autocasts to (bf16, fp16), or None for fp32."""
    return torch.bfloat16 if resolved.bf16 else torch.float16 if resolved.fp16 else None


def apply_tf32(enabled: bool) -> bool:
    """Turn TF32 matmuls/convolutions on or off on CUDA; returns whether it is on."""

    if not torch.cuda.is_available():
        return False
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return enabled


def quantization_config(resolved: ResolvedConfig, on_gpu: bool) -> Any:
    """bitsandbytes settings for int4 (NF4, double quantization, bf16 compute; fp16 in an fp16
    GPU run) or int8."""
    if resolved.quantization not in ("int4", "int8"):
        return None

    if resolved.quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    compute = torch.float16 if on_gpu and resolved.fp16 and not resolved.bf16 else torch.bfloat16
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute,
    )


def build_random_model(
    resolved: ResolvedConfig, dtype: torch.dtype, attn: str, device: str = "cpu"
) -> PreTrainedModel:
    """The architecture of the base model's config.json (a local folder's, or a hub model's: no
    weights are downloaded) with seeded random weights, initialised directly on `device` (a
    0.6B model takes most of a minute to initialise on a CPU)."""

    on_hub = resolved.base_model_kind == "hub"
    if not on_hub and not (Path(resolved.base_model) / "config.json").is_file():
        raise UserError(f"{resolved.base_model}: init 'random' needs a config.json in this folder")
    config = AutoConfig.from_pretrained(
        resolved.base_model,
        revision=resolved.revision if on_hub else None,
        trust_remote_code=resolved.trust_remote_code,
    )
    torch.manual_seed(resolved.seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(
            config,
            dtype=dtype,
            attn_implementation=attn,
            trust_remote_code=resolved.trust_remote_code,
        )


def _from_pretrained(
    resolved: ResolvedConfig,
    source: str,
    dtype: torch.dtype,
    attn: str,
    device: str,
    notes: list[str],
) -> PreTrainedModel:
    """The pretrained base, its weights checked against its config (train/base_load.py)."""
    quant = quantization_config(resolved, device.startswith("cuda"))
    kwargs: dict[str, Any] = dict(
        dtype=dtype,
        attn_implementation=attn,
        trust_remote_code=resolved.trust_remote_code,
    )
    if resolved.base_model_kind == "hub" and source == resolved.base_model:
        kwargs["revision"] = resolved.revision
    if quant is not None:
        kwargs.update(quantization_config=quant, device_map={"": device})
    elif placed := load_placement(device, resolved.distributed):
        kwargs.update(device_map=placed)
    return load_pretrained(source, kwargs, notes)


def _with_attention_fallback(load: Any, chosen: str, notes: list[str]) -> tuple[Any, str]:
    """Call `load(attn)` with the chosen kernel; if the model rejects it, fall back to sdpa,
    then eager, and say so."""
    order = list(dict.fromkeys([chosen, "sdpa", "eager"]))
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


def _checked(load: Any) -> Any:
    """`load(attn)` that first registers torch's varlen kernel and refuses it for a model
    configuration it cannot serve (a ValueError naming the attention)."""

    def run(attn: str) -> Any:
        if attn == TORCH_VARLEN:
            register_torch_varlen()
        model = load(attn)
        check_model_config(attn, model.config)
        return model

    return run


def _freeze_for_kbit(model: PreTrainedModel, resolved: ResolvedConfig, half: str) -> None:
    """What QLoRA needs of a quantized base: frozen weights and, for gradient checkpointing,
    inputs that require grad. With bf16 compute the unquantized weights (norms, embeddings)
    stay in the run's dtype; peft's prepare_model_for_kbit_training would upcast them to fp32,
    making every residual add and the LM head run in fp32 on a GPU."""
    four_bit_compute(model, torch.float16 if half == "fp16" else torch.bfloat16)
    if half != "bf16":
        prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=resolved.gradient_checkpointing,
            gradient_checkpointing_kwargs=resolved.gradient_checkpointing_kwargs,
        )
        return
    for param in model.parameters():
        param.requires_grad_(False)
    if resolved.gradient_checkpointing:
        enable_checkpointing(model, resolved.gradient_checkpointing_kwargs)
        model.enable_input_require_grads()


def no_cpu_repack(model: torch.nn.Module) -> None:
    """bitsandbytes (0.50) repacks a CPU 4-bit layer's weights for its inference kernel at the
    first evaluation-mode forward (the causality probe, each evaluation); training forwards
    then took that kernel, which passes no gradient to the layer's input (every adapter before
    it trained on a wrong gradient, the loss looking right) and cannot add a bias under
    autograd (a traceback). Off for the run: its forwards stay on the training kernel."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def _speedups(
    model: PreTrainedModel, resolved: ResolvedConfig, on_gpu: bool, choices: ModelChoices
) -> None:
    """Liger's layer kernels and the fused loss, on the base model before peft wraps it."""

    if resolved.liger_kernels and on_gpu:
        why = apply_liger_kernels(model)
        choices.liger_kernels = why is None
        if why:
            choices.notes.append(f"liger_kernels: {why}; using the model's own layers")
    if resolved.fused_loss != "off":
        why = fused_loss_unsupported(model, resolved.target_modules)
        if distributed.any_rank(why is not None):  # a process holding no weights cannot tell
            why = why or "another process found the model's head unfit for it"
        if why is None:
            install_fused_loss(model, resolved.fused_loss, resolved.label_smoothing_factor)
            choices.fused_loss = resolved.fused_loss
        else:  # refused where the run smooths its labels: only the fused loss does
            choices.notes.append(unfused_note(why, resolved.label_smoothing_factor))


def load_base_model(
    resolved: ResolvedConfig, device: str, source: str | None = None
) -> tuple[PreTrainedModel, ModelChoices]:
    """Load (or, for init 'random', build) the base model ready for adapter training.

    `source` replaces `resolved.base_model` as the folder to read weights from (used for a
    random-init model that was materialised to disk so it can be quantized).
    """
    on_gpu = device.startswith("cuda")
    dtype = weight_dtype(resolved, on_gpu)
    notes: list[str] = []
    if resolved.quantization == "bf16" and dtype == torch.float16:
        notes.append("quantization: bf16 weights stored as fp16, as this GPU has no bf16")
    if resolved.quantization in ("int4", "int8") and resolved.init == "random" and source is None:
        raise RunError("a random-init model must be saved before it can be quantized")
    if resolved.init == "random" and source is None:
        model, attn = _with_attention_fallback(
            _checked(lambda a: build_random_model(resolved, dtype, a, device)),
            resolved.attn_implementation,
            notes,
        )
    else:
        path = source or resolved.base_model
        model, attn = _with_attention_fallback(
            _checked(lambda a: _from_pretrained(resolved, path, dtype, a, device, notes)),
            resolved.attn_implementation,
            notes,
        )
    model.config.use_cache = False
    bad = non_finite_weights(model) if resolved.init == "pretrained" else []
    if distributed.any_rank(bool(bad)):  # one verdict: a process may hold no weights yet
        raise UserError(
            f"base model {shown_path(source or resolved.base_model)}: "
            f"{non_finite_line(bad) if bad else 'its weights hold NaN or infinity'}, so every "
            "loss would be NaN. The files are damaged, or were saved from a run that diverged: "
            "use intact weights"
        )
    compute = "fp16" if on_gpu and resolved.fp16 and not resolved.bf16 else "bf16"
    if resolved.quantization in ("int4", "int8"):
        _freeze_for_kbit(model, resolved, compute)
        if not on_gpu:
            no_cpu_repack(model)
    shown = {"int4": f"{four_bit_kind(model)}, {compute} compute", "int8": "int8"}
    choices = ModelChoices(
        dtype=shown.get(resolved.quantization, str(dtype).removeprefix("torch.")),
        attn_implementation=attn,
        tf32=apply_tf32(resolved.use_tf32),
        quantization=resolved.quantization,
        device=device,
        notes=notes,
    )
    _speedups(model, resolved, on_gpu, choices)
    return model, choices


def attach_adapter(
    model: PreTrainedModel,
    resolved: ResolvedConfig,
    total_steps: int,
    kept: list[str] | None = None,
) -> PeftModel:
    """Wrap `model` with the manifest's adapter (seeded init). Adapter weights are fp32; they
    compute in the mixed-precision dtype unless `adapter_precision` is fp32. `kept`: IA3's
    feed-forward modules as a resumed checkpoint recorded them."""

    set_seed(resolved.seed)
    if missing := target_problem(model, resolved):
        raise UserError(missing)
    try:
        peft_model = get_peft_model(
            model,
            adapter_config(resolved, total_steps, getattr(model.config, "model_type", None), kept),
            autocast_adapter_dtype=True,
        )
    except ValueError as exc:
        raise UserError(adapter_error(resolved, exc)) from None
    saved_loadable(peft_model)
    if resolved.gradient_checkpointing and resolved.quantization not in ("int4", "int8"):
        peft_model.enable_input_require_grads()
    if adapter_compute_dtype(resolved) != "fp32":
        adapters_in_compute_dtype(peft_model)
    if resolved.adapter_kernel in FUSED_KERNELS:
        fuse_adapter_linears(peft_model)
    if resolved.adapter_kernel == "grouped":
        group_lora_linears(peft_model)
    return peft_model


def attach_run_adapter(
    model: PreTrainedModel,
    resolved: ResolvedConfig,
    total_steps: int,
    resume: Path | None,
    initial: Path | None = None,
) -> tuple[PeftModel, list[str]]:
    """The run's adapter and the notes on it; on --resume, built as its checkpoint was
    trained (IA3's feed-forward layers as recorded) and refused where the checkpoint's
    weights do not fit it. An initialisation that decomposed the base (PiSSA, OLoRA) writes
    its A0 and B0 to `initial` (the main process's; a resumed run's are kept)."""
    kept = recorded_feedforward(resume, resolved)
    peft_model = attach_adapter(model, resolved, total_steps, kept)
    if problem := unfit_problem(peft_model, resume):
        raise UserError(problem)
    notes = adapter_notes(peft_model, resolved, kept)
    if resume is None and resolved.init_adapter:  # a resume's weights are its checkpoint's
        notes.append(start_from(peft_model, Path(resolved.init_adapter)))
    if initial is None or not decomposing(resolved.init_lora_weights):
        return peft_model, notes
    found = kept_start(initial, peft_model) if resume is not None else "unusable"
    if found != "same":  # a resume's damaged one: the same start, again
        save_initial(peft_model, initial)
    if found == "other":
        notes.append(
            f"{INIT_WEIGHTS}: held another start than this run's decomposition of its base "
            "(another run's, or a randomised SVD drawn otherwise on this device): written "
            "again; the resumed steps train on this one's residual"
        )
    return peft_model, notes


def adapter_compute_dtype(resolved: ResolvedConfig) -> str:
    """The dtype adapters compute in: the mixed-precision dtype when `adapter_precision` is
    compute and bf16/fp16 autocast is on, else fp32 (weights are fp32 in both cases)."""
    if resolved.adapter_precision != "compute":
        return "fp32"
    return "bf16" if resolved.bf16 else "fp16" if resolved.fp16 else "fp32"


def enable_checkpointing(model: Any, kwargs: dict[str, Any]) -> None:
    """Activation checkpointing with `kwargs` (the resolved options: non-reentrant always;
    transformers 5.x renamed the method from gradient_checkpointing_enable, which now warns;
    older versions have only that one)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(kwargs))
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(kwargs))
