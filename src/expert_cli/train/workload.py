"""The fixed benchmark workload (`expert-cli benchmark --workload NAME`) on the training fast
path: the attention kernel, fused loss, Liger layers and compute-dtype adapters that
`expert-cli train` would choose on this machine, on random packed rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen3Config

from expert_cli.config.choices import FUSED_KERNELS, kernels
from expert_cli.config.environment import hardware_bf16, probe_environment
from expert_cli.config.kernels import BOUNDARY_KERNELS, TORCH_VARLEN
from expert_cli.config.training_config import TrainingConfig
from expert_cli.data.collate import sequence_boundaries
from expert_cli.errors import UserError
from expert_cli.telemetry.workload import LORA_TARGETS, SEED, WorkloadSpec
from expert_cli.train.attention import register_torch_varlen
from expert_cli.train.fused_dora import fuse_adapter_linears
from expert_cli.train.loss import install_fused_loss
from expert_cli.train.speed import adapters_in_compute_dtype, apply_liger_kernels


def build_model(spec: WorkloadSpec, device: str, dtype: torch.dtype, attn: str = "sdpa") -> Any:
    """Random-init model of the workload's architecture with LoRA on every projection."""
    if attn == TORCH_VARLEN:
        register_torch_varlen()
    torch.manual_seed(SEED)
    config = Qwen3Config(**spec.model, use_cache=False)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)


def _lora(model: Any, spec: WorkloadSpec) -> tuple[Any, dict[str, int]]:
    lora = LoraConfig(
        r=spec.lora_r,
        lora_alpha=2 * spec.lora_r,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    trainable = [p for p in model.parameters() if p.requires_grad]
    counts = {
        "total_params": sum(p.numel() for p in model.parameters()),
        "trainable_params": sum(p.numel() for p in trainable),
    }
    return model, counts


def build_lora_model(
    spec: WorkloadSpec, device: str, dtype: torch.dtype
) -> tuple[Any, dict[str, int]]:
    """The plain workload model (no fast path), e.g. on the meta device to count parameters."""
    return _lora(build_model(spec, device, dtype), spec)


def _batch(spec: WorkloadSpec, device: str, boundaries: bool) -> dict[str, Any]:
    """Random token ids, position ids restarting every `segment_len` tokens, and the
    sequence boundaries for the varlen kernels."""
    gen = torch.Generator().manual_seed(SEED)
    shape = (spec.batch_size, spec.seq_len)
    ids = torch.randint(0, spec.model["vocab_size"], shape, generator=gen)
    pos = (torch.arange(spec.seq_len) % spec.segment_len).expand(shape).contiguous()
    batch: dict[str, Any] = {
        "input_ids": ids.to(device),
        "labels": ids.to(device),
        "position_ids": pos.to(device),
    }
    if boundaries:
        cu, longest = sequence_boundaries(pos.reshape(-1).numpy())
        cu_t = torch.from_numpy(cu).to(device)
        batch.update(
            cu_seq_lens_q=cu_t, cu_seq_lens_k=cu_t, max_length_q=longest, max_length_k=longest
        )
    return batch


def build_fast_step(spec: WorkloadSpec) -> tuple[Callable[[], torch.Tensor], dict[str, Any]]:
    """One training step of the workload on the fast path, and what was chosen."""
    cuda = torch.cuda.is_available()
    if spec.needs_cuda and not cuda:
        raise UserError(
            f"--workload: {spec.name} needs a CUDA GPU and torch sees none; use --workload "
            "tiny on a CPU"
        )
    device = "cuda" if cuda else "cpu"
    half = cuda  # bf16, or fp16 on a GPU without it (a T4, a V100), as `train` takes
    dtype = (torch.bfloat16 if hardware_bf16() else torch.float16) if cuda else torch.float32
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)
    env = probe_environment()
    notes: list[str] = []
    # the kernels `train` takes on this machine for a manifest that leaves them unset
    chosen = kernels(TrainingConfig(), env, half, notes)
    attn = chosen["attn_implementation"]
    model = build_model(spec, device, dtype, attn)
    liger = chosen["liger_kernels"] and apply_liger_kernels(model) is None
    loss = chosen["fused_loss"]
    if loss != "off":
        install_fused_loss(model, loss)
    model, counts = _lora(model, spec)
    if half:
        adapters_in_compute_dtype(model)
    kernel = chosen["adapter_kernel"]
    fused = fuse_adapter_linears(model) if kernel in FUSED_KERNELS else 0
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=cuda)
    batch = _batch(spec, device, attn in BOUNDARY_KERNELS)

    def step() -> torch.Tensor:
        with torch.autocast(device, dtype=dtype, enabled=half):
            out = model(**batch, use_cache=False).loss
        scaler.scale(out).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return out.detach()

    info = {
        **counts,
        "attention": attn,
        "fused_loss": loss,
        "liger_kernels": bool(liger),
        "adapter_kernel": kernel if fused else "peft",
        "adapter_layers_fused": fused,
        "adapter_precision": ("bf16" if dtype == torch.bfloat16 else "fp16") if half else "fp32",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
    }
    return step, info
