"""Resolution of the fast path: which attention kernel, loss, layer kernels, adapter precision,
batch plan and compilation a run gets on a given machine, and the notes that say so."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from train_helpers import h100_environment

from expert_cli.config import load_manifest
from expert_cli.config.environment import Environment, cpu_environment
from expert_cli.config.kernels import KERNEL_ORDER, choose_kernel, kernel_unusable
from expert_cli.config.resolve import resolve
from expert_cli.errors import UserError
from expert_cli.train.batch import BatchPlan, largest_fitting_divisor
from expert_cli.train.speed import compile_decision

BARE_H100 = h100_environment()
H100 = replace(BARE_H100, torch_varlen=True, flex_attention=True, liger_kernel="0.8.5")
FULL_H100 = replace(H100, flash_attn_4="4.0.0b36", flash_attn="2.8.3")
T4 = Environment(
    gpu_count=1,
    gpu_name="Tesla T4",
    gpu_capability=(7, 5),
    bf16=False,
    tf32=False,
    cpu_count=4,
    torch_varlen=True,
    flex_attention=True,
)


def _resolved(tmp_path: Path, env: Environment, distributed: dict | None = None, **config):
    (tmp_path / "train.jsonl").write_text('{"text": "x"}\n')
    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": "org/model"}],
        "training": {
            "dataset": {"path": "train.jsonl"},
            "config": {"evaluation_strategy": "no", **config},
            **({"distributed": distributed} if distributed else {}),
        },
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return resolve(load_manifest(path), env)


@pytest.mark.parametrize(
    ("env", "kernel"),
    [
        (FULL_H100, "flash_attention_4"),
        (replace(FULL_H100, flash_attn_4=None), "flash_attention_2"),
        (H100, "torch_varlen"),
        (replace(H100, torch_varlen=False), "flex_attention"),
        (BARE_H100, "sdpa"),
        (cpu_environment(), "sdpa"),
    ],
)
def test_auto_takes_the_fastest_usable_kernel(tmp_path: Path, env, kernel: str) -> None:
    assert _resolved(tmp_path, env).attn_implementation == kernel


def test_half_precision_kernels_are_not_chosen_for_fp32_runs(tmp_path: Path) -> None:
    cfg = _resolved(tmp_path, FULL_H100, bf16=False, fp16=False)
    assert cfg.attn_implementation == "flex_attention"
    assert cfg.adapter_precision == "fp32"


def test_flash_attention_4_needs_hopper_or_blackwell() -> None:
    a100 = replace(FULL_H100, gpu_name="NVIDIA A100", gpu_capability=(8, 0))
    assert (
        kernel_unusable("flash_attention_4", a100, half=True)
        == "runs on Hopper and Blackwell GPUs only"
    )
    assert kernel_unusable("torch_varlen", T4, half=True).startswith("needs compute capability")


def test_below_ampere_auto_takes_sdpa_not_flex(tmp_path: Path) -> None:
    """flex attention's Triton kernels ask for more shared memory than a T4 has: auto took
    it there (the only usable kernel before sdpa); an explicit ask says why not."""
    assert kernel_unusable("flex_attention", T4, half=True) == (
        "needs compute capability 8.0 or newer (this GPU has 7.5)"
    )
    assert _resolved(tmp_path, T4).attn_implementation == "sdpa"
    asked = _resolved(tmp_path, T4, attention="flex_attention")
    assert asked.attn_implementation == "sdpa"
    assert any(
        n.startswith("attention: flex_attention needs compute capability") for n in asked.notes
    )
    assert kernel_unusable("sdpa", cpu_environment(), half=False) is None


def test_a_request_that_cannot_run_is_noted_and_replaced(tmp_path: Path) -> None:
    cfg = _resolved(tmp_path, H100, attention="flash_attention_4")
    assert cfg.attn_implementation == "torch_varlen"
    assert (
        "attention: flash_attention_4 flash-attn-4 is not installed; choosing automatically"
        in cfg.notes
    )
    assert _resolved(tmp_path, H100, attention="sdpa").attn_implementation == "sdpa"


def test_the_formats_attention_flags(tmp_path: Path) -> None:
    assert (
        _resolved(tmp_path, FULL_H100, flash_attention_2=True).attn_implementation
        == "flash_attention_2"
    )
    assert (
        _resolved(tmp_path, FULL_H100, flash_attention_2=False).attn_implementation
        == "flash_attention_4"
    )
    no_fa4 = replace(FULL_H100, flash_attn_4=None)
    assert (
        _resolved(tmp_path, no_fa4, flash_attention_2=False).attn_implementation == "torch_varlen"
    )
    eager = _resolved(tmp_path, FULL_H100, use_sdpa=False)
    assert eager.attn_implementation == "eager"
    assert "use_sdpa: false; using eager attention (slowest)" in eager.notes
    # use_sdpa: true asks for a fast kernel, not for the dense-mask path
    assert _resolved(tmp_path, H100, use_sdpa=True).attn_implementation == "torch_varlen"


def test_every_kernel_name_is_a_manifest_value(tmp_path: Path) -> None:
    """Each kernel is a value the manifest takes; on a CPU the GPU-only ones are replaced by
    sdpa with a note naming them, the portable ones kept."""
    for kernel in KERNEL_ORDER:
        cfg = _resolved(tmp_path, cpu_environment(), attention=kernel)
        if kernel in ("sdpa", "eager"):
            assert cfg.attn_implementation == kernel
        else:
            assert cfg.attn_implementation == "sdpa"
            assert any(n.startswith(f"attention: {kernel} needs a CUDA GPU") for n in cfg.notes)
    with pytest.raises(UserError, match="training.config.attention"):
        _resolved(tmp_path, H100, attention="flash_attention_3")


def test_choose_kernel_never_returns_an_unusable_one() -> None:
    for env in (FULL_H100, H100, BARE_H100, T4, cpu_environment()):
        for half in (True, False):
            for requested in ("auto", *KERNEL_ORDER):
                notes: list[str] = []
                kernel = choose_kernel(requested, env, half, notes)
                assert kernel_unusable(kernel, env, half) is None
                assert (kernel == requested) or requested == "auto" or notes


def test_loss_kernels_and_precision_on_a_gpu(tmp_path: Path) -> None:
    cfg = _resolved(tmp_path, H100)
    assert (cfg.fused_loss, cfg.liger_kernels, cfg.adapter_precision) == ("liger", True, "compute")
    bare = _resolved(tmp_path, BARE_H100)
    assert (bare.fused_loss, bare.liger_kernels) == ("chunked", False)
    asked = _resolved(tmp_path, BARE_H100, fused_loss="liger", liger_kernels=True)
    assert asked.fused_loss == "chunked" and not asked.liger_kernels
    assert "fused_loss: liger liger-kernel is not installed; choosing automatically" in asked.notes
    assert (
        "liger_kernels: liger-kernel is not installed; using the model's own layers" in asked.notes
    )
    off = _resolved(tmp_path, H100, fused_loss="off", liger_kernels=False, adapter_precision="fp32")
    assert (off.fused_loss, off.liger_kernels, off.adapter_precision) == ("off", False, "fp32")


def test_a_cpu_run_keeps_the_standard_path(tmp_path: Path) -> None:
    cfg = _resolved(tmp_path, cpu_environment())
    assert (cfg.fused_loss, cfg.liger_kernels, cfg.adapter_precision) == ("off", False, "fp32")
    assert _resolved(tmp_path, cpu_environment(), fused_loss="chunked").fused_loss == "chunked"


def test_label_smoothing_takes_a_fused_loss(tmp_path: Path) -> None:
    """Only the fused losses smooth the labels: a CPU run asking for it takes the chunked
    one (the standard loss otherwise), fused_loss off beside it is refused, naming both."""
    cpu = _resolved(tmp_path, cpu_environment(), label_smoothing_factor=0.1)
    assert (cpu.fused_loss, cpu.label_smoothing_factor) == ("chunked", 0.1)
    assert _resolved(tmp_path, H100, label_smoothing_factor=0.1).fused_loss == "liger"
    assert _resolved(tmp_path, cpu_environment()).label_smoothing_factor == 0.0
    with pytest.raises(UserError, match="label_smoothing_factor is applied in the fused loss"):
        _resolved(tmp_path, H100, label_smoothing_factor=0.1, fused_loss="off")
    assert _resolved(tmp_path, H100, label_smoothing_factor=0, fused_loss="off").fused_loss == "off"
    for bad in (1, 1.5, -0.1, "x", float("nan")):
        with pytest.raises(UserError, match="label_smoothing_factor"):
            _resolved(tmp_path, H100, label_smoothing_factor=bad)


def test_compile_is_opt_in(tmp_path: Path) -> None:
    assert _resolved(tmp_path, H100).torch_compile is False
    assert _resolved(tmp_path, H100, torch_compile=True).torch_compile is True
    assert compile_decision(False, on_gpu=True)[0] is False
    assert compile_decision(False, on_gpu=False) == (False, "off")
    assert compile_decision(True, on_gpu=False) == (True, "on as the manifest asks")


def test_batch_auto_is_the_gpu_default(tmp_path: Path) -> None:
    cfg = _resolved(tmp_path, H100)  # max_seq_length 2048, 32768 tokens per step
    assert (cfg.batch_auto, cfg.rows_per_step, cfg.batch_size, cfg.gradient_accumulation_steps) == (
        True,
        16,
        16,
        1,
    )
    longer = _resolved(tmp_path, H100, tokens_per_step=65536, max_seq_length=4096)
    assert longer.rows_per_step == 16
    short = _resolved(tmp_path, H100, tokens_per_step=1000, max_seq_length=2048)
    assert short.rows_per_step == 1


def test_a_numeric_batch_size_x_accumulation_is_the_step_its_rows_probed(tmp_path: Path) -> None:
    """HiveLLM's manifests give 8 rows x 4 accumulation: 32 rows make the step. On a GPU the
    rows of a micro-step are probed from its memory (16 rows a micro-step ran 1.32x the
    tokens/s of 8 on an H100), unless micro_batch is fixed; one micro-batch a step, or a
    CPU, keeps them."""
    given = {"batch_size": 8, "gradient_accumulation_steps": 4}
    cfg = _resolved(tmp_path, H100, tokens_per_step=4096, **given)
    fields = ("batch_auto", "micro_batch", "batch_size", "gradient_accumulation_steps")
    assert tuple(getattr(cfg, f) for f in fields) == (True, "auto", 8, 4)
    assert cfg.rows_per_step == 32
    assert any(n.startswith("tokens_per_step: not applicable") for n in cfg.notes)
    assert (
        "batch_size: 8 x gradient_accumulation_steps 4 = 32 rows per optimizer step; the rows "
        "each micro-step takes are probed from the GPU's memory at start (micro_batch fixed "
        "keeps 8 x 4)"
    ) in cfg.notes
    fixed = _resolved(tmp_path, H100, micro_batch="fixed", **given)
    assert tuple(getattr(fixed, f) for f in fields) == (False, "fixed", 8, 4)
    assert not any(n.startswith("batch_size:") for n in fixed.notes)
    one = _resolved(tmp_path, H100, batch_size=8, gradient_accumulation_steps=1)
    assert (one.batch_auto, one.micro_batch, one.rows_per_step) == (False, "fixed", 8)
    cpu = _resolved(tmp_path, cpu_environment(), **given)
    assert tuple(getattr(cpu, f) for f in fields) == (False, "fixed", 8, 4)
    auto = _resolved(tmp_path, H100, micro_batch="fixed")
    assert "micro_batch: not applicable; batch_size auto probes the micro-batch" in auto.notes
    # FSDP or DeepSpeed: the probe would run the model whole before it is sharded, and
    # DeepSpeed reads its sizes from the arguments first: kept, and micro_batch auto said so
    for strategy in ("fsdp", "deepspeed"):
        sharded = _resolved(tmp_path, H100, {"strategy": strategy, "deepspeed": {}}, **given)
        assert tuple(getattr(sharded, f) for f in fields) == (False, "fixed", 8, 4)
    asked = _resolved(tmp_path, H100, {"strategy": "fsdp"}, micro_batch="auto", **given)
    assert any(n.startswith("micro_batch: auto applies to a batch_size") for n in asked.notes)


@pytest.mark.parametrize("batch", ["auto", None])
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_batch_auto_under_fsdp_or_deepspeed_is_a_fixed_split(
    tmp_path: Path, batch: str | None, strategy: str
) -> None:
    """The probe cannot run before the model is sharded (it ran the unsharded model and
    ended in a device-mismatch traceback): auto takes a fixed split of the step, said."""
    given = {"batch_size": batch} if batch else {}
    cfg = _resolved(tmp_path, H100, {"strategy": strategy, "deepspeed": {}}, **given)
    assert (cfg.batch_auto, cfg.micro_batch) == (False, "fixed")
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.rows_per_step) == (4, 4, 16)
    assert (
        "batch_size: auto under FSDP or DeepSpeed (no memory probe): 4 rows x 4 accumulation; "
        "give batch_size to choose"
    ) in cfg.notes


def test_batch_auto_on_a_cpu_splits_the_step(tmp_path: Path) -> None:
    cfg = _resolved(tmp_path, cpu_environment(), batch_size="auto", max_seq_length=4096)
    assert (cfg.batch_auto, cfg.batch_size, cfg.gradient_accumulation_steps) == (False, 2, 4)
    assert "batch_size: auto on a CPU: 2 rows x 4 accumulation" in cfg.notes
    assert _resolved(tmp_path, cpu_environment()).batch_size == 2  # unset on a CPU: 2 rows


@pytest.mark.parametrize("bad", [0, -1, 4097, "two", 2.5, True])
def test_batch_size_bounds(tmp_path: Path, bad) -> None:
    with pytest.raises(UserError, match="batch_size: expected a whole number of rows"):
        _resolved(tmp_path, H100, batch_size=bad)


def test_the_micro_batch_is_the_largest_divisor_that_fits() -> None:
    # the H100 probe of Qwen3-0.6B: ~2.45 GB a row of 2048 tokens, ~1.4 GB fixed, 80 GB card
    assert largest_fitting_divisor(16, 1.4, 2.45, 0.85 * 79.2) == 16
    assert largest_fitting_divisor(32, 1.4, 2.45, 0.85 * 79.2) == 16
    assert largest_fitting_divisor(24, 1.4, 2.45, 0.85 * 79.2) == 24
    assert largest_fitting_divisor(24, 1.4, 2.45, 0.85 * 40.0) == 12
    assert largest_fitting_divisor(7, 1.4, 2.45, 10.0) == 1  # a prime: 7 does not fit, 1 does
    assert largest_fitting_divisor(8, 50.0, 2.45, 40.0) == 1  # nothing fits: still one row
    plan = BatchPlan(16, 2, 32, fixed_gb=1.4, per_row_gb=2.45, budget_gb=67.3)
    assert plan.describe() == (
        "16 rows x 2 accumulation = 32 rows per optimizer step (probe: "
        "2.45 GB a row + 1.4 GB fixed, budget 67 GB)"
    )
    # what it was made from: HiveLLM's 8 x 4, or rows per step from tokens_per_step
    assert plan.describe((8, 4)).startswith("8 x 4 run as 16 rows x 2 accumulation = 32 rows")
    assert plan.describe((32, 1)).startswith("auto: 16 rows x 2 accumulation")


@pytest.mark.parametrize(
    ("env", "config", "kernel"),
    [
        (H100, {}, "fused"),  # measured 1.22x peft's tokens/s on an H100 (docs/PERFORMANCE.md)
        (H100, {"adapter_kernel": "peft"}, "peft"),
        (H100, {"adapter_precision": "fp32"}, "peft"),  # fused computes in bf16
        (H100, {"adapter_precision": "fp32", "bf16": False}, "fused"),  # all fp32 anyway
        (cpu_environment(), {}, "peft"),
        (cpu_environment(), {"adapter_kernel": "fused"}, "fused"),
        (H100, {"adapter_kernel": "grouped"}, "grouped"),  # not measured yet: asked for
    ],
)
def test_the_fused_lora_linear_is_the_gpus_default(
    tmp_path: Path, env: Environment, config: dict, kernel: str
) -> None:
    assert _resolved(tmp_path, env, **config).adapter_kernel == kernel


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_sharded_runs_keep_peft_layers_unless_asked(tmp_path: Path, strategy: str) -> None:
    """Not measured under FSDP or DeepSpeed: peft's layers there by default."""
    sharded = {"strategy": strategy}
    assert _resolved(tmp_path, H100, sharded).adapter_kernel == "peft"
    assert _resolved(tmp_path, H100, sharded, adapter_kernel="fused").adapter_kernel == "fused"


def test_accelerates_own_fsdp_or_deepspeed_config_counts_as_sharded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from expert_cli.config.choices import sharded

    assert not sharded(None) and not sharded({"strategy": "ddp"})
    assert sharded({"strategy": "fsdp"}) and sharded({"strategy": "deepspeed"})
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert sharded(None)
    assert _resolved(tmp_path, H100).adapter_kernel == "peft"


def test_weights_load_onto_the_runs_gpu_unless_sharded(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the model is on it from the load on, so the attention probe and the
    batch_size auto probe run there (they ran beside a model still on the CPU: the probe said
    "not probed" and auto stopped with a device mismatch on an H100)."""
    from expert_cli.train.placement import load_placement

    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert load_placement("cuda:1", None) == {"": "cuda:1"}
    assert load_placement("cuda:0", {"strategy": "ddp"}) == {"": "cuda:0"}
    assert load_placement("cpu", None) is None
    assert load_placement("cuda:0", {"strategy": "fsdp"}) is None
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "1")
    assert load_placement("cuda:0", None) is None


def test_the_memory_probe_runs_the_model_in_training_mode() -> None:
    """transformers checkpoints activations only in training mode; the loaded model is in
    evaluation mode, so the probe measured every activation kept. Each module's mode is back
    after it."""
    import torch

    from expert_cli.train.batch import training_mode

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)).eval()
    model[1].train()  # one module apart from the rest
    seen = []
    with training_mode(model):
        seen = [m.training for m in model.modules()]
    assert seen == [True, True, True]
    assert [m.training for m in model.modules()] == [False, False, True]


@pytest.mark.parametrize("kernel", ["fused", "grouped"])
def test_fused_asked_with_fp32_adapters_says_which_layers_are_fp32(
    tmp_path: Path, kernel: str
) -> None:
    cfg = _resolved(tmp_path, H100, adapter_kernel=kernel, adapter_precision="fp32")
    assert cfg.adapter_kernel == kernel
    want = f"adapter_kernel: {kernel} computes the adapters in"
    assert any(n.startswith(want) for n in cfg.notes)


def test_each_process_gets_the_gpu_accelerate_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights are read straight onto the run's GPU: a rank that sees one GPU (a launcher
    setting CUDA_VISIBLE_DEVICES per process) is given cuda:0, as accelerate places it."""
    import torch

    from expert_cli.train.model import training_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert training_device(1) == "cuda:0"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert training_device(1) == "cuda:1" and training_device(5) == "cuda:1"
    assert training_device(-1) == "cuda:0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_device(3) == "cpu"


def test_workers_share_the_machine_among_its_training_processes(tmp_path: Path) -> None:
    """8 processes under torchrun on a 16-CPU machine: each takes 1 worker (it took 4 each,
    32 workers beside 8 trainers); a count given past each process's share is said."""
    from expert_cli.config.environment import local_processes

    assert local_processes({"LOCAL_WORLD_SIZE": "8"}) == 8
    assert local_processes({}) == local_processes({"LOCAL_WORLD_SIZE": "x"}) == 1
    assert local_processes({"LOCAL_WORLD_SIZE": "0"}) == 1
    assert local_processes({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 4  # mpirun
    assert local_processes({"SLURM_NTASKS_PER_NODE": "2"}) == 2  # srun
    assert _resolved(tmp_path, H100).dataloader_num_workers == 4
    eight = replace(H100, local_processes=8)
    assert _resolved(tmp_path, eight).dataloader_num_workers == 1
    assert _resolved(tmp_path, replace(H100, local_processes=2)).dataloader_num_workers == 4
    given = _resolved(tmp_path, eight, dataloader_num_workers=4)
    assert given.dataloader_num_workers == 4
    assert (
        "dataloader_num_workers: 4 processes on 16 CPUs shared by 8 training processes; "
        "more than one per CPU only adds memory and switching"
    ) in given.notes
