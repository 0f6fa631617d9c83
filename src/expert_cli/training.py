"""`expert-cli train`, top to bottom: resolve, data, model, Trainer, train, save.

The same code runs alone, under `torchrun --nproc_per_node N` and under `accelerate launch`
(DDP; FSDP/DeepSpeed from the manifest's `distributed` block). Only the main process prints
and writes outputs. torch, transformers and peft are imported inside the functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from expert_cli.resolve import ResolvedConfig


@dataclass
class TrainOptions:
    """The `train` command's arguments."""

    manifest: Path
    output: Path | None = None
    resume: bool = False
    max_steps: int | None = None
    overrides: list[str] = field(default_factory=list)


@dataclass
class TrainResult:
    """How the run ended: `exit_code` 0, or 130/143 after SIGINT/SIGTERM."""

    output_dir: Path
    status: str
    exit_code: int
    summary: dict[str, Any]
    resumed_from: Path | None = None


@dataclass
class Run:
    """What the steps of one run share."""

    resolved: ResolvedConfig
    output: Path
    console: Console
    is_main: bool
    world_size: int
    runtime: dict[str, Any] = field(default_factory=dict)


def _sum_over_ranks(values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return values
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _any_rank(flag: bool) -> bool:
    return _sum_over_ranks([1.0 if flag else 0.0])[0] > 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def quiet_transformers() -> None:
    """Our console reports progress; transformers' own bars and info logs would interleave."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    hf_logging.disable_progress_bar()


def _setup(opts: TrainOptions, console: Console) -> tuple[Run, Any, Path | None]:
    """Manifest -> resolved config, output folder, TrainingArguments (starts distributed)."""
    from transformers import TrainingArguments

    from expert_cli.config import load_manifest
    from expert_cli.environment import probe_environment
    from expert_cli.outputs import output_dir, resume_checkpoint
    from expert_cli.resolve import resolve
    from expert_cli.trainer_setup import training_args_kwargs

    quiet_transformers()
    loaded = load_manifest(opts.manifest, opts.overrides)
    env = probe_environment()
    resolved = resolve(loaded, env)
    output = output_dir(loaded.path, opts.output)
    resume = resume_checkpoint(output / "checkpoints") if opts.resume else None
    kwargs = training_args_kwargs(
        resolved,
        output / "checkpoints",
        max_steps=opts.max_steps,
        on_gpu=env.has_gpu,
        has_eval=True,
    )
    has_eval = resolved.evaluation_strategy != "no"
    args = TrainingArguments(**kwargs)
    run = Run(
        resolved=resolved,
        output=output,
        console=console,
        is_main=args.process_index == 0,
        world_size=args.world_size,
    )
    run.runtime.update(
        environment=env.to_dict(),
        world_size=args.world_size,
        has_eval=has_eval,
        resumed_from=str(resume) if resume else None,
    )
    return run, args, resume


def _data(run: Run, args: Any) -> tuple[Any, Any]:
    """Tokenizer, then the token cache (validates the data before any model is loaded)."""
    from expert_cli.data import prepare_data
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.training_console import print_data

    tokenizer = load_tokenizer(run.resolved)
    with args.main_process_first(desc="token cache"):
        data = prepare_data(run.resolved, tokenizer, show_progress=run.is_main)
    if run.is_main:
        print_data(run.console, data.stats, data.built, data.reason, data.cache_dir)
    if args.eval_strategy != "no" and data.eval is None:
        from expert_cli.errors import UserError

        raise UserError(
            "training.config.evaluation_strategy: evaluation is on but the data "
            "has no validation rows (set validation_path or eval_fraction)"
        )
    run.runtime["data"] = {
        "stats": data.stats,
        "cache_dir": str(data.cache_dir),
        "built": data.built,
        "reason": data.reason,
    }
    return tokenizer, data


def _model(run: Run, args: Any, tokenizer: Any, data: Any, resume: Path | None) -> Any:
    """Base model (a random init is materialised to OUTPUT/base_model first) + adapter."""
    from expert_cli.modeling import (
        adapter_compute_dtype,
        attach_adapter,
        build_random_model,
        load_base_model,
        parameter_counts,
        training_device,
        weight_dtype,
    )
    from expert_cli.outputs import materialize_random_base
    from expert_cli.train.speed import compile_decision, compile_layers
    from expert_cli.trainer_setup import planned_steps
    from expert_cli.training_console import print_decisions

    resolved = run.resolved
    device = training_device(args.local_process_index)
    source = None
    if resolved.init == "random":
        source = run.output / "base_model"
        if run.is_main and not (resume and (source / "config.json").is_file()):
            dtype = weight_dtype(resolved, device.startswith("cuda"))
            random_model = build_random_model(resolved, dtype, "eager", device)
            materialize_random_base(random_model, tokenizer, source)
            del random_model
        _barrier()
    model, choices = load_base_model(resolved, device, str(source) if source else None)
    steps = planned_steps(resolved, len(data.train), run.world_size, args.max_steps)
    peft_model = attach_adapter(model, resolved, steps)
    choices.adapter_precision = adapter_compute_dtype(resolved)
    if resolved.batch_auto and device.startswith("cuda"):
        _plan_batch(run, args, peft_model, tokenizer, data, choices)
    compile_on, why = compile_decision(resolved.torch_compile, device.startswith("cuda"))
    if compile_on:
        choices.compiled_layers = compile_layers(
            peft_model, resolved.torch_compile_backend, resolved.torch_compile_mode
        )
    choices.notes.append(f"torch_compile: {why}")
    trainable, total = parameter_counts(peft_model)
    if run.is_main:
        print_decisions(run.console, run.resolved, choices, trainable, total)
    run.runtime["model"] = {
        **choices.__dict__,
        "trainable_params": trainable,
        "total_params": total,
        "base_weights": str(source or resolved.base_model),
    }
    return peft_model


def _plan_batch(
    run: Run, args: Any, peft_model: Any, tokenizer: Any, data: Any, choices: Any
) -> None:
    """batch_size auto: probe the memory of a micro-step, choose the micro-batch (the same on
    every rank: the smallest any rank can hold) and keep the rows per optimizer step."""
    import torch

    from expert_cli.data.collate import PackedCollator
    from expert_cli.train.attention import BOUNDARY_KERNELS
    from expert_cli.train.batch import plan_batch

    resolved = run.resolved
    collate = PackedCollator(
        tokenizer.pad_token_id,
        boundaries=choices.attn_implementation in BOUNDARY_KERNELS,
        pad_to_multiple_of=resolved.max_seq_length,
    )
    rows = [data.train[i] for i in range(min(2, len(data.train)))] * 2
    dtype = torch.bfloat16 if resolved.bf16 else torch.float16 if resolved.fp16 else None
    if resolved.gradient_checkpointing:  # the Trainer turns it on too; the probe must see it
        peft_model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    plan = plan_batch(peft_model, rows, collate, choices.device, resolved.rows_per_step, dtype)
    micro = _min_over_ranks(plan.micro_batch)
    accumulation = resolved.rows_per_step // micro
    args.per_device_train_batch_size = args.per_device_eval_batch_size = micro
    args.gradient_accumulation_steps = accumulation
    run.resolved = resolved.model_copy(
        update={"batch_size": micro, "gradient_accumulation_steps": accumulation}
    )
    run.runtime["batch"] = {**plan.to_dict(), "micro_batch": micro, "accumulation": accumulation}
    choices.notes.append(f"batch_size: auto: {plan.describe()}")


def _min_over_ranks(value: int) -> int:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def flops_model(peft_model: Any) -> Any:
    """What MFU needs to know of the model, and this GPU's peak (None on CPU/unknown GPUs)."""
    import torch

    from expert_cli.modeling import matmul_parameters, parameter_counts
    from expert_cli.telemetry.flops import peak_bf16_flops
    from expert_cli.telemetry.throughput import FlopsModel

    cfg = peft_model.get_base_model().config
    trainable, total = parameter_counts(peft_model)
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    peak = peak_bf16_flops(torch.cuda.get_device_name()) if torch.cuda.is_available() else None
    return FlopsModel(
        matmul_params=matmul_parameters(peft_model, total),
        trainable_params=trainable,
        n_layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        attn_dim=heads * head_dim,
        peak_flops_per_device=peak,
    )


def _trainer(
    run: Run, args: Any, peft_model: Any, tokenizer: Any, data: Any, interrupt: Any
) -> tuple[Any, Any, Any]:
    """The Trainer with the packed collator, telemetry, progress, Ctrl-C and TensorBoard."""
    from transformers import PrinterCallback

    from expert_cli.data.collate import PackedCollator
    from expert_cli.telemetry.throughput import ThroughputMeter, make_throughput_callback
    from expert_cli.train.attention import BOUNDARY_KERNELS
    from expert_cli.trainer_setup import (
        CountingCollator,
        expert_trainer_class,
        make_adalora_callback,
        make_interrupt_callback,
    )
    from expert_cli.training_console import make_progress_callback

    kernel = run.runtime["model"]["attn_implementation"]
    collator = CountingCollator(
        PackedCollator(tokenizer.pad_token_id, boundaries=kernel in BOUNDARY_KERNELS)
    )
    meter = ThroughputMeter(flops_model(peft_model), run.world_size, reduce=_sum_over_ranks)
    progress = make_progress_callback(run.console) if run.is_main else None
    metrics = run.output / "metrics.json"
    throughput = make_throughput_callback(
        meter,
        metrics if run.is_main else None,
        progress.print_window if progress else None,
        _earlier_windows(metrics, run.runtime.get("resumed_from")),
    )
    trainer = expert_trainer_class()(
        model=peft_model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval if args.eval_strategy != "no" else None,
        data_collator=collator,
        processing_class=tokenizer,
    )
    trainer.meter = meter
    trainer.remove_callback(PrinterCallback)  # the rich progress callback prints instead
    trainer.callback_handler.callbacks.insert(0, throughput)  # first: its logs reach TB
    stop = make_interrupt_callback(interrupt, _any_rank)
    for callback in (progress, stop, _tensorboard(run)):
        if callback is not None:
            trainer.add_callback(callback)
    if run.resolved.adapter_type == "adalora":
        trainer.add_callback(make_adalora_callback(peft_model))
    return trainer, throughput, stop


def _earlier_windows(path: Path, resumed_from: str | None) -> list[dict[str, Any]]:
    """The windows of metrics.json up to the checkpoint a resumed run starts from."""
    import json

    if resumed_from is None or not path.is_file():
        return []
    step = int(Path(resumed_from).name.rsplit("-", 1)[-1])
    try:
        windows = json.loads(path.read_text()).get("windows", [])
    except (OSError, ValueError):  # a half-written file from a killed run: start a new list
        return []
    return [w for w in windows if isinstance(w, dict) and w.get("step", 0) <= step]


def _tensorboard(run: Run) -> Any:
    """TensorBoard events under OUTPUT/runs when tensorboard is installed (main process)."""
    import importlib.util

    if not run.is_main:
        return None
    if importlib.util.find_spec("tensorboard") is None:
        run.console.print(
            "note      tensorboard is not installed; no TensorBoard events "
            "(metrics.json has the same numbers)",
            highlight=False,
        )
        return None
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    return TensorBoardCallback(tb_writer=SummaryWriter(log_dir=str(run.output / "runs")))


def _save(run: Run, trainer: Any) -> None:
    """Adapter, adapter_config.json and tokenizer into OUTPUT (all ranks call, main writes)."""
    from expert_cli.outputs import move_final_files, write_resolved

    staging = run.output / f".final-{os.getpid()}"
    trainer.save_model(str(staging))
    if run.is_main:
        move_final_files(staging, run.output)
        write_resolved(run.output, run.resolved, run.runtime)


def train(opts: TrainOptions, console: Console) -> TrainResult:
    """Train the manifest's adapter; on SIGINT/SIGTERM save a checkpoint and stop."""
    from expert_cli.outputs import write_resolved
    from expert_cli.trainer_setup import Interrupt

    run, args, resume = _setup(opts, console)
    tokenizer, data = _data(run, args)
    peft_model = _model(run, args, tokenizer, data, resume)
    if run.is_main:
        run.output.mkdir(parents=True, exist_ok=True)
        write_resolved(run.output, run.resolved, run.runtime)
    with Interrupt() as interrupt:
        trainer, throughput, stop = _trainer(run, args, peft_model, tokenizer, data, interrupt)
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except KeyboardInterrupt:
            throughput.finish(trainer.state.global_step, "interrupted")
            raise
    status = "interrupted" if stop.stopped else "completed"
    summary = throughput.finish(trainer.state.global_step, status)
    if status == "completed":
        _save(run, trainer)
    _barrier()
    code = interrupt.exit_code if stop.stopped else 0
    if run.is_main:
        _print_end(run, summary, status, opts)
    return TrainResult(run.output, status, code, summary, resume)


def _print_end(run: Run, summary: dict[str, Any], status: str, opts: TrainOptions) -> None:
    c = run.console
    c.print(
        f"[bold]{status}[/bold]  {summary['steps']} steps in "
        f"{summary['train_runtime_s']:.1f} s, {summary['tokens_per_s']:,.0f} tok/s, "
        f"data-wait {100 * summary['data_wait_fraction']:.1f}%, final loss "
        f"{summary['final_loss'] if summary['final_loss'] is not None else '-'}",
        highlight=False,
    )
    if status == "interrupted":
        c.print(
            f"checkpoint saved under {run.output / 'checkpoints'}; continue with:\n"
            f"  expert-cli train --manifest {opts.manifest} --output {run.output} --resume",
            highlight=False,
            markup=False,
        )
    else:
        c.print(f"wrote {run.output}", highlight=False, markup=False)
