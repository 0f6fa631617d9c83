"""Training throughput of expert-cli against the usual ways to fine-tune, in one run.

Every variant trains the same model (seeded random init of the expert's architecture), on the
same data, LoRA r=16 on all linear layers, the same tokens per step, each in a fresh process:

  a_naive        the original problem: tokenize in __getitem__, pad every example to
                 max_seq_length, no loader workers; peft and the Trainer as they come (bf16)
  b_hf           a well-configured plain Trainer + peft: pretokenized, pad to the batch's
                 longest, group_by_length, 4 workers, pinned memory, fused AdamW, bf16, SDPA
  c_trl          TRL's SFTTrainer: packing (bfd), padding-free, use_liger_kernel, its fused
                 LM head; the attention kernel of e_default (gradient checkpointing off)
  d_unsloth      Unsloth (FastLanguageModel, its LoRA and patched SFTTrainer, packing), in a
                 process whose PYTHONPATH is $UNSLOTH_PYTHONPATH when set (Unsloth pins older
                 transformers, TRL and datasets than expert-cli; scripts/make_gpu_carry.sh)
  e_default      `expert-cli train` as a user runs it, every choice automatic
  f_*            `expert-cli train` with one lever of the fast path changed (--set ...)

Per variant: non-pad tokens/s and MFU over the steps after warm-up, peak memory, data-wait,
the loss curve. MFU counts the frozen base's forward and input-gradient matmuls, the adapters'
forward and both backward matmuls, and attention over each example's real length
(expert_cli.telemetry.flops); recompute earns nothing.

    python scripts/bench_train.py --quick                       # CPU: demo expert, seconds
    python scripts/bench_train.py --expert bench_results/tmp/qwen3-expert --variants table
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "experts" / "demo"
WARMUP_STEPS = 10  # steps left out of throughput (allocator, autotuning, compilation)
C = "training.config."
PEFT = f"{C}adapter_kernel=peft"
DROPOUT = f"{C}dropout=0.05"  # HiveLLM's experts' lora dropout
DORA = f"{C}adapter_type=dora"
INT4 = "base_models.0.quantization=int4"

# name -> (kind, --set overrides for the CLI variants, what it shows)
VARIANTS: dict[str, tuple[str, list[str], str]] = {
    "a_naive": ("naive", [], "tokenize in __getitem__, pad to max, no workers"),
    "b_hf": ("hf", [], "plain Trainer + peft, well configured"),
    "c_trl": ("trl", [], "TRL SFTTrainer, packing + padding-free + Liger"),
    "d_unsloth": ("unsloth", [], "Unsloth FastLanguageModel + its SFTTrainer, packing"),
    "e_default": ("cli", [], "expert-cli, automatic choices"),
    "f_old_path": (
        "cli",
        [
            f"{C}attention=sdpa",
            f"{C}fused_loss=off",
            f"{C}adapter_precision=fp32",
            f"{C}liger_kernels=false",
            f"{C}torch_compile=false",
        ],
        "expert-cli before the fast path",
    ),
    "f_attention_sdpa": ("cli", [f"{C}attention=sdpa"], "packed rows through SDPA + mask"),
    "f_attention_torch_varlen": ("cli", [f"{C}attention=torch_varlen"], "torch varlen"),
    "f_attention_fa4": ("cli", [f"{C}attention=flash_attention_4"], "flash-attention 4"),
    "f_attention_flex": ("cli", [f"{C}attention=flex_attention"], "flex attention"),
    "f_loss_standard": ("cli", [f"{C}fused_loss=off"], "full-vocabulary logits"),
    "f_loss_liger": ("cli", [f"{C}fused_loss=liger"], "Liger fused linear CE"),
    "f_loss_chunked": ("cli", [f"{C}fused_loss=chunked"], "expert-cli chunked CE"),
    "f_loss_liger_library": (
        "cli",
        [f"{C}fused_loss=liger"],
        "Liger's own fused linear CE function (two host syncs a step, 128-token slices)",
    ),
    "f_loss_every_token": (
        "cli",
        [],
        "the LM head run on every token, prompts too (before loss positions)",
    ),
    "f_adapters_fp32": ("cli", [f"{C}adapter_precision=fp32"], "peft's fp32 adapter inputs"),
    "f_adapters_fused": ("cli", [f"{C}adapter_kernel=fused"], "fused LoRA linear layers"),
    "f_adapters_peft": ("cli", [PEFT], "peft's LoRA layers"),
    "f_adapters_grouped": (
        "cli",
        [f"{C}adapter_kernel=grouped"],
        "fused LoRA layers, those that read one input (q, k, v; gate, up) as one function",
    ),
    "f_liger_off": ("cli", [f"{C}liger_kernels=false"], "no Liger RMSNorm/SwiGLU/RoPE"),
    "f_liger_on": ("cli", [f"{C}liger_kernels=true"], "Liger RMSNorm/SwiGLU/RoPE"),
    "f_compile_on": ("cli", [f"{C}torch_compile=true"], "regional torch.compile"),
    "f_compile_off": ("cli", [f"{C}torch_compile=false"], "no torch.compile"),
    "f_batch_auto": ("cli", [f"{C}batch_size=auto"], "rows per step from the memory probe"),
    "f_fused_auto": (
        "cli",
        [f"{C}adapter_kernel=fused", f"{C}batch_size=auto"],
        "fused LoRA linear layers, rows from the memory probe",
    ),
    "f_dropout": ("cli", [DROPOUT], "lora dropout 0.05 (HiveLLM's usual), fused"),
    "f_dropout_peft": ("cli", [DROPOUT, PEFT], "lora dropout 0.05 through peft's layers"),
    "f_batch_8x4": (
        "cli",
        [f"{C}gradient_accumulation_steps=4"],
        "HiveLLM's 8 rows x 4 accumulation: 32 rows a step, the micro-batch probed",
    ),
    "f_batch_8x4_fixed": (
        "cli",
        [f"{C}gradient_accumulation_steps=4", f"{C}micro_batch=fixed"],
        "HiveLLM's 8 rows x 4 accumulation, 8 rows a micro-step as given",
    ),
    "f_batch_16": ("cli", [f"{C}batch_size=16"], "16 rows per step"),
    "f_batch_32": ("cli", [f"{C}batch_size=32"], "32 rows per step"),
    "q_int4": ("cli", [INT4], "QLoRA: NF4 base, bf16 compute"),
    "q_int4_peft": ("cli", [INT4, PEFT], "QLoRA through peft's 4-bit LoRA layers"),
    "q_int4_one_kernel": (
        "cli",
        [INT4],
        "int4 QLoRA, each 4-bit weight dequantized by expert-cli's one Triton kernel",
    ),
    "q_dora": ("cli", [DORA], "DoRA (fused on a GPU)"),
    "q_dora_peft": ("cli", [DORA, PEFT], "DoRA through peft's layers"),
    "q_dora_hive": (
        "cli",
        [DORA, DROPOUT],
        "DoRA with lora dropout 0.05, as HiveLLM's experts (fused on a GPU)",
    ),
    "q_dora_hive_peft": (
        "cli",
        [DORA, DROPOUT, PEFT],
        "DoRA with lora dropout 0.05 through peft's layers",
    ),
}
GROUPS = {
    "table": [
        "a_naive",
        "b_hf",
        "c_trl",
        "e_default",
        "f_old_path",
        "f_attention_sdpa",
        "f_loss_standard",
        "f_adapters_fp32",
        "f_adapters_peft",
        "f_liger_off",
        "f_compile_on",
    ],
    "kernels": [
        "f_attention_torch_varlen",
        "f_attention_fa4",
        "f_attention_flex",
        "f_loss_liger",
        "f_loss_chunked",
        "f_liger_on",
        "f_adapters_fused",
        "f_adapters_grouped",
    ],
    "more": ["f_batch_16", "f_batch_32", "q_int4", "q_int4_peft", "q_dora"],
    "quick": ["a_naive", "b_hf", "e_default", "f_old_path"],
}


# variants that run `expert-cli train` with a module setting changed first
PRELUDES = {
    "f_loss_liger_library": "import expert_cli.train.loss as m; m.LIGER_LOOP = False",
    "f_loss_every_token": "import expert_cli.train.loss as m; m.TRAINED_ROWS_ONLY = False",
    "q_int4_one_kernel": "import expert_cli.train.fused_lora as m; m.ONE_KERNEL_DEQUANT = True",
}

# --------------------------------------------------------------------------- CLI variants


def _steady(windows: list[dict[str, Any]], key: str) -> float | None:
    """Mean of `key` over the windows after the warm-up steps, each weighted by its training
    seconds (its `seconds`: an evaluation's or a save's time inside it is not training)."""
    total = weight = 0.0
    for w in windows:
        if w["step"] <= WARMUP_STEPS or w.get(key) is None or not w.get("seconds"):
            continue
        total += w[key] * w["seconds"]
        weight += w["seconds"]
    return total / weight if weight else None


def _child_env(name: str) -> dict[str, str]:
    """The environment of variant `name`'s process: printing unbuffered (a run stopped by its
    limit keeps what it printed), and Unsloth's own package path for d_unsloth when set."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if name == "d_unsloth" and os.environ.get("UNSLOTH_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["UNSLOTH_PYTHONPATH"]
    return env


def run_cli_variant(
    name: str, manifest: Path, steps: int, work: Path, timeout: int
) -> dict[str, Any]:
    """`expert-cli train` with the variant's overrides; numbers from its metrics.json."""
    out = work / name
    sets = [f"{C}logging_steps=5", f"{C}save_strategy=no", *VARIANTS[name][1]]
    entry = ["-m", "expert_cli.cli"]
    if name in PRELUDES:
        entry = ["-c", f"{PRELUDES[name]}; from expert_cli.cli.app import main; main()"]
    cmd = [
        sys.executable,
        *entry,
        "train",
        "--manifest",
        str(manifest),
        "--output",
        str(out),
        "--max-steps",
        str(steps),
    ]
    for item in sets:
        cmd += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_child_env(name)
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-3000:], "wall_s": wall}
    metrics = json.loads((out / "metrics.json").read_text())
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    windows = metrics["windows"]
    model = resolved["runtime"]["model"]
    return {
        "tokens_per_s": _steady(windows, "tokens_per_s"),
        "mfu": _steady(windows, "mfu"),
        "data_wait_fraction": _steady(windows, "data_wait_fraction"),
        "peak_memory_gb": max((w["peak_memory_gb"] or 0) for w in windows),
        "losses": {w["step"]: w["loss"] for w in windows if w["loss"] is not None},
        # the same step is other tokens at other rows per step (auto's 16 against 8): compare
        # variants' losses at the same tokens seen
        "losses_by_tokens": {
            w["tokens_seen"]: w["loss"]
            for w in windows
            if w["loss"] is not None and "tokens_seen" in w
        },
        "first_window_s": windows[0]["time"] if windows else None,
        "allocator_flushes": sum(w.get("allocator_flushes") or 0 for w in windows),
        "wall_s": wall,
        "choices": {
            k: model.get(k)
            for k in (
                "attn_implementation",
                "fused_loss",
                "liger_kernels",
                "adapter_precision",
                "compiled_layers",
                "dtype",
                "notes",
            )
        },
        "batch_size": resolved["batch_size"],
        "stdout_tail": proc.stdout[-1500:],
    }


# --------------------------------------------------------------------------- baselines


def _flops(model: Any) -> Any:
    from expert_cli.train.model_flops import flops_model

    return flops_model(model)


def _measuring_trainer(base: type) -> type:
    """`base` (a Trainer class) that counts non-pad tokens and attended positions per step on
    the device (no host sync) and times the steps after warm-up."""
    import torch

    class Measured(base):  # type: ignore[misc, valid-type]
        def training_step(self, model: Any, inputs: dict[str, Any], *args: Any) -> Any:
            ids = inputs["input_ids"]
            if "attention_mask" in inputs:
                mask = inputs["attention_mask"].to(ids.device)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
            else:  # padding-free / packed: every token is real, positions restart per example
                mask = torch.ones_like(ids)
                pos = inputs["position_ids"].to(ids.device)
            step = self.state.global_step
            if step == WARMUP_STEPS:
                torch.cuda.synchronize() if torch.cuda.is_available() else None
                self.t0 = time.perf_counter()
                self.tokens = torch.zeros((), dtype=torch.int64, device=ids.device)
                self.attended = torch.zeros((), dtype=torch.int64, device=ids.device)
                self.trained = torch.zeros((), dtype=torch.int64, device=ids.device)
            if step >= WARMUP_STEPS:
                self.tokens += mask.sum()
                # sum over examples of length**2 = sum over real tokens of (2 * position + 1)
                self.attended += ((2 * pos + 1) * mask).sum()
                labels = inputs.get("labels")
                # the tokens whose next token is trained (all, where no labels are given)
                self.trained += mask.sum() if labels is None else (labels[..., 1:] != -100).sum()
            return super().training_step(model, inputs, *args)

    return Measured


def _finish(trainer: Any, model: Any, steps: int) -> dict[str, Any]:
    import torch

    from expert_cli.telemetry.flops import mfu

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - trainer.t0
    tokens, attended = int(trainer.tokens), int(trainer.attended)
    tps = tokens / seconds
    try:
        flops = _flops(model)
    except ImportError as exc:  # expert-cli's trainer under another stack's versions
        return {"tokens_per_s": tps, "mfu": None, "mfu_missing": str(exc), "losses": {}}
    per_token = flops.per_token(attended / max(tokens, 1), int(trainer.trained) / max(tokens, 1))
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {
        "tokens_per_s": tps,
        "mfu": mfu(tps, per_token, flops.peak_flops_per_device),
        "peak_memory_gb": peak,
        "data_wait_fraction": None,
        "losses": {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h},
        "measured_steps": steps - WARMUP_STEPS,
    }


def _base_model(resolved: Any, attn: str) -> Any:
    import torch

    from expert_cli.train.model import build_random_model, training_device

    device = training_device(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if attn == "torch_varlen":
        from expert_cli.train.attention import register_torch_varlen

        register_torch_varlen()
    model = build_random_model(resolved, dtype, attn, device)
    model.config.use_cache = False
    return model


def _lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        ),
    )


def _args(resolved: Any, out: Path, steps: int, **extra: Any) -> dict[str, Any]:
    import torch

    gpu = torch.cuda.is_available()
    return dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=resolved.batch_size,
        learning_rate=resolved.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        bf16=gpu,
        tf32=gpu or None,
        seed=resolved.seed,
        data_seed=resolved.seed,
        disable_tqdm=True,
        use_cpu=not gpu,
        **extra,
    )


def run_baseline(name: str, manifest: Path, steps: int, work: Path) -> dict[str, Any]:
    """One of a_naive, b_hf, c_trl, in this process."""
    import datasets
    import torch
    from transformers import Trainer, TrainingArguments

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import probe_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.tokenizer import load_tokenizer

    env = probe_environment()
    resolved = resolve(load_manifest(manifest), env)
    tokenizer = load_tokenizer(resolved)
    source = resolved.train_sources[0].location
    raw = datasets.load_dataset("json", data_files=source, split="train")
    seq = resolved.max_seq_length
    gpu = torch.cuda.is_available()
    if name == "c_trl":
        return _run_trl(resolved, tokenizer, raw, steps, work, env)
    if name == "a_naive":
        model = _lora(_base_model(resolved, "sdpa"))
        train = NaiveDataset(raw, tokenizer, seq)
        extra = dict(dataloader_num_workers=0, dataloader_pin_memory=False, optim="adamw_torch")
        collator = None
    else:
        model = _lora(_base_model(resolved, "sdpa"))

        def tokenize(batch: dict[str, list]) -> dict[str, Any]:
            return tokenizer(batch["text"], truncation=True, max_length=seq)

        train = raw.map(
            tokenize,
            batched=True,
            remove_columns=raw.column_names,
            num_proc=min(8, os.cpu_count() or 1),
        )
        train = train.map(lambda b: {"length": [len(x) for x in b["input_ids"]]}, batched=True)
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
        extra = dict(
            dataloader_num_workers=4 if gpu else 0,
            dataloader_pin_memory=gpu,
            optim="adamw_torch_fused" if gpu else "adamw_torch",
            train_sampling_strategy="group_by_length",
            length_column_name="length",
        )
    args = TrainingArguments(**_args(resolved, work / name, steps, **extra))
    trainer = _measuring_trainer(Trainer)(
        model=model, args=args, train_dataset=train, data_collator=collator
    )
    trainer.train()
    return _finish(trainer, model, steps)


class NaiveDataset:
    """Tokenizes its example on every access and pads it to max_length (the slow pattern)."""

    def __init__(self, rows: Any, tokenizer: Any, max_length: int) -> None:
        self.rows, self.tokenizer, self.max_length = rows, tokenizer, max_length

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:

        enc = self.tokenizer(
            self.rows[i]["text"],
            truncation=True,
            max_length=self.max_length,
            padding="max_length",
            return_tensors="pt",
        )
        ids, mask = enc["input_ids"][0], enc["attention_mask"][0]
        labels = ids.clone()
        labels[mask == 0] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _run_trl(
    resolved: Any, tokenizer: Any, raw: Any, steps: int, work: Path, env: Any
) -> dict[str, Any]:
    import torch
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    attn = resolved.attn_implementation  # the kernel e_default picks, if TRL can drive it
    model = _base_model(resolved, attn)
    gpu = torch.cuda.is_available()
    config = SFTConfig(
        **_args(
            resolved,
            work / "c_trl",
            steps,
            packing=True,
            padding_free=True,
            max_length=resolved.max_seq_length,
            dataset_text_field="text",
            use_liger_kernel=gpu and env.liger_kernel is not None,
            gradient_checkpointing=False,
            dataloader_num_workers=4 if gpu else 0,
            dataloader_pin_memory=gpu,
            optim="adamw_torch_fused" if gpu else "adamw_torch",
        )
    )
    peft = LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    trainer = _measuring_trainer(SFTTrainer)(
        model=model, args=config, train_dataset=raw, processing_class=tokenizer, peft_config=peft
    )
    trainer.train()
    result = _finish(trainer, trainer.model, steps)
    result["choices"] = {"attn_implementation": attn}
    return result


UNSLOTH_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def run_unsloth(manifest: Path, steps: int, work: Path) -> dict[str, Any]:
    """(d), in this process: the same architecture and seed saved to a folder (Unsloth loads
    weights from one), Unsloth's LoRA r16 on the seven projections, its SFTTrainer packing
    the raw text like c_trl, no gradient checkpointing."""
    import unsloth  # first: it patches transformers, peft and trl as they are imported
    from unsloth import FastLanguageModel

    version = getattr(unsloth, "__version__", None)
    import datasets
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import probe_environment
    from expert_cli.config.resolve import resolve

    resolved = resolve(load_manifest(manifest), probe_environment())
    seq = resolved.max_seq_length
    folder = work / "d_unsloth-base"
    torch.manual_seed(resolved.seed)
    with torch.device("cuda"):
        base = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(resolved.base_model), dtype=torch.bfloat16
        )
    base.save_pretrained(folder)
    AutoTokenizer.from_pretrained(resolved.base_model).save_pretrained(folder)
    del base
    torch.cuda.empty_cache()
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=str(folder), max_seq_length=seq, dtype=torch.bfloat16, load_in_4bit=False
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=16,
        lora_alpha=32,
        lora_dropout=0,
        target_modules=UNSLOTH_TARGETS,
        bias="none",
        use_gradient_checkpointing=False,
        random_state=resolved.seed,
    )
    raw = datasets.load_dataset(
        "json", data_files=resolved.train_sources[0].location, split="train"
    )
    config = SFTConfig(
        **_args(
            resolved,
            work / "d_unsloth",
            steps,
            packing=True,
            padding_free=True,
            max_length=seq,
            dataset_text_field="text",
            gradient_checkpointing=False,
            dataloader_num_workers=4,
            dataloader_pin_memory=True,
            optim="adamw_torch_fused",
        )
    )
    trainer = _measuring_trainer(SFTTrainer)(
        model=model, args=config, train_dataset=raw, processing_class=tokenizer
    )
    trainer.train()
    result = _finish(trainer, trainer.model, steps)
    result["choices"] = {"unsloth": version}
    return result


# --------------------------------------------------------------------------- driver


def _machine() -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    versions = {}
    for pkg in (
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "datasets",
        "trl",
        "liger-kernel",
        "flash-attn-4",
        "flash-attn",
        "nvidia-cutlass-dsl",
        "bitsandbytes",
        "triton",
    ):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "gpu": gpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _row(name: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{name:26s} FAILED: {r['error'].strip().splitlines()[-1][:100]}"
    mfu = f"{100 * r['mfu']:5.1f}%" if r.get("mfu") is not None else "    -"
    mem = f"{r['peak_memory_gb']:5.1f} GB" if r.get("peak_memory_gb") else "      -"
    wait = r.get("data_wait_fraction")
    wait_s = f"{100 * wait:4.1f}%" if wait is not None else "   -"
    losses = r.get("losses") or {}
    last = f"{losses[max(losses, key=int)]:.4f}" if losses else "-"
    # no figure where the run had no window after the warm-up steps (--steps too few)
    speed = r.get("tokens_per_s")
    speed_s = f"{speed:10,.0f}" if speed is not None else f"{'-':>10s}"
    return f"{name:26s} {speed_s} tok/s  MFU {mfu}  mem {mem}  wait {wait_s}  loss {last}"


def _variant_names(spec: str) -> list[str]:
    names: list[str] = []
    for part in spec.split(","):
        for name in GROUPS.get(part, [part]):
            if name not in VARIANTS:
                raise SystemExit(
                    f"--variants: unknown variant {name!r} "
                    f"(known: {', '.join(VARIANTS)}; groups: {', '.join(GROUPS)})"
                )
            names.append(name)
    return list(dict.fromkeys(names))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU-sized: demo expert, few steps")
    p.add_argument(
        "--expert",
        type=Path,
        default=DEMO,
        help="expert folder (e.g. one made by scripts/make_bench_expert.py)",
    )
    p.add_argument("--variants", default="table", help="names or groups, comma-separated")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per variant")
    p.add_argument("--long", default="", help="variants that run --long-steps instead")
    p.add_argument("--long-steps", type=int, default=200)
    p.add_argument("--timeout", type=int, default=900, help="seconds per variant")
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        help="seconds for the whole list: a variant gets what is left (at most --timeout) and "
        "one left fewer than 30 s is not started, so a caller's own time limit need not cut "
        "the report short",
    )
    p.add_argument("--output", type=Path, default=None, help="JSON report path")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run a baseline
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    manifest = a.expert / "manifest.json"
    if a.one:
        if a.one == "d_unsloth":
            result = run_unsloth(manifest, a.steps, a.work)
        else:
            result = run_baseline(a.one, manifest, a.steps, a.work)
        a.result.write_text(json.dumps(result))
        return 0
    names = _variant_names("quick" if a.quick and a.variants == "table" else a.variants)
    steps = a.steps or (WARMUP_STEPS + 10 if a.quick else 40)
    if min(steps, a.long_steps if a.long else steps) <= WARMUP_STEPS:
        p.error(f"--steps and --long-steps: more than the {WARMUP_STEPS} warm-up steps left out")
    long = set(_variant_names(a.long)) if a.long else set()
    machine = _machine()
    where = "gpu" if machine["gpu"] else "cpu"
    output = a.output or ROOT / "bench_results" / f"bench_train-{a.expert.name}-{where}.json"
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine,
        "expert": str(a.expert),
        "steps": steps,
        "long_steps": a.long_steps,
        "warmup_steps": WARMUP_STEPS,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "results": {},
    }
    ends = time.monotonic() + a.budget if a.budget else None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in names:
            n = a.long_steps if name in long else steps
            kind = VARIANTS[name][0]
            t0 = time.perf_counter()
            limit = variant_limit(a.timeout, ends)
            if limit is None:
                result = {"error": f"not started: fewer than {MIN_VARIANT_S} s of --budget left"}
            else:
                result = _run_variant(name, kind, (manifest, a.expert), n, work, limit)
            result.update(
                steps=n, description=VARIANTS[name][2], wall_s=round(time.perf_counter() - t0, 1)
            )
            report["results"][name] = result
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(report, indent=2))  # partial results survive
            print(_row(name, result), flush=True)
    base = report["results"].get("e_default", {}).get("tokens_per_s")
    for r in report["results"].values():
        if base and r.get("tokens_per_s"):
            r["vs_e_default"] = r["tokens_per_s"] / base
    output.write_text(json.dumps(report, indent=2))
    print(f"wrote {output}")
    return 0


MIN_VARIANT_S = 30  # a variant given less cannot load a model and warm up


def variant_limit(timeout: int, ends: float | None) -> int | None:
    """Seconds the next variant may take: `timeout`, or less where the budget ending at
    `ends` (time.monotonic) leaves less; None where that is under MIN_VARIANT_S."""
    if ends is None:
        return timeout
    left = int(ends - time.monotonic())
    return min(timeout, left) if left >= MIN_VARIANT_S else None


def _run_variant(
    name: str, kind: str, where: tuple[Path, Path], steps: int, work: Path, limit: int
) -> dict[str, Any]:
    """One variant in its own process; one that runs past `limit` seconds is stopped and
    reported with the end of what it printed (where it was: loading, compiling, training)."""
    manifest, expert = where
    try:
        if kind == "cli":
            return run_cli_variant(name, manifest, steps, work, limit)
        return _baseline_subprocess(name, expert, steps, work, limit)
    except subprocess.TimeoutExpired as exc:
        printed = "".join(
            part.decode(errors="replace") if isinstance(part, bytes) else part
            for part in (exc.stdout, exc.stderr)
            if part
        )
        return {"error": f"timed out after {limit} s", "output_tail": printed[-3000:]}


def _baseline_subprocess(
    name: str, expert: Path, steps: int, work: Path, timeout: int
) -> dict[str, Any]:
    result_path = work / f"{name}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        name,
        "--expert",
        str(expert),
        "--steps",
        str(steps),
        "--result",
        str(result_path),
        "--work",
        str(work),
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_child_env(name)
    )
    if proc.returncode != 0 or not result_path.is_file():
        return {"error": (proc.stdout + proc.stderr)[-3000:]}
    return json.loads(result_path.read_text())


if __name__ == "__main__":
    sys.exit(main())
