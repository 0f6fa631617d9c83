"""Training throughput: padded per-example batches (the usual baseline) vs expert-cli's path.

(a) baseline: raw text rows, tokenized on the fly in the collator, padded to the batch's
    longest example (attention mask, DataCollatorForLanguageModeling-style labels), 0 workers;
(b) expert-cli: pretokenized packed cache (prepare_data), PackedCollator, tuned DataLoader.
Same model (seeded random init), LoRA r=16 on all linear layers, same steps. Reports non-pad
tokens/s, samples/s, data-wait fraction and (on a GPU with a known peak) MFU, as JSON.

    python scripts/bench_train.py --quick                        # CPU, demo model, seconds
    python scripts/bench_train.py --model-config qwen3-0.6b      # GPU, Qwen3-0.6B architecture
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "experts" / "demo"


def _expert(workdir: Path, model_config: str, seq: int, batch: int, steps: int,
            source: Path = DEMO) -> Path:
    """A copy of an expert (the demo by default) whose base model holds the benchmark
    architecture and whose config runs `steps` steps of `batch` rows of `seq` tokens."""
    expert = workdir / "expert"
    shutil.copytree(source, expert, ignore=shutil.ignore_patterns(".cache", "output"))
    if model_config == "qwen3-0.6b":
        from transformers import Qwen3Config

        from expert_cli.telemetry.workload import QWEN3_0_6B

        cfg = Qwen3Config(**QWEN3_0_6B)
        cfg.save_pretrained(expert / "model")
    manifest = json.loads((expert / "manifest.json").read_text())
    manifest["training"]["config"].update(
        max_seq_length=seq, batch_size=batch, max_steps=steps, evaluation_strategy="no",
        logging_steps=steps, save_strategy="no", warmup_ratio=0.0, warmup_steps=0,
        rank=16, alpha=32, target_modules="all-linear")
    (expert / "manifest.json").write_text(json.dumps(manifest))
    return expert / "manifest.json"


class PaddingCollator:
    """Baseline: tokenize the batch's texts now, pad to the longest, mask only padding."""

    def __init__(self, tokenizer, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, max_len

    def __call__(self, rows: list[dict]) -> dict:
        from expert_cli.trainer_setup import COUNTS_KEY

        enc = self.tokenizer([r["text"] for r in rows], truncation=True,
                             max_length=self.max_len, padding="longest", return_tensors="pt")
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        lengths = enc["attention_mask"].sum(dim=1)
        real, attended = int(lengths.sum()), int((lengths * lengths).sum())
        return {**enc, "labels": labels, COUNTS_KEY: (real, len(rows), real, attended)}


def _run(name: str, resolved, tokenizer, train_ds, collator, loader: dict, steps: int,
         out: Path) -> dict:
    from transformers import PrinterCallback, TrainingArguments

    from expert_cli.modeling import attach_adapter, load_base_model, training_device
    from expert_cli.telemetry.throughput import ThroughputMeter, make_throughput_callback
    from expert_cli.trainer_setup import expert_trainer_class, training_args_kwargs
    from expert_cli.training import _flops_model

    model, _ = load_base_model(resolved, training_device(0))
    model = attach_adapter(model, resolved, steps)
    kwargs = training_args_kwargs(resolved, out / name, max_steps=steps,
                                  on_gpu=training_device(0).startswith("cuda"), has_eval=False)
    kwargs.update(loader, save_strategy="no", logging_steps=max(1, steps // 4))
    meter = ThroughputMeter(_flops_model(model))
    trainer = expert_trainer_class()(model=model, args=TrainingArguments(**kwargs),
                                     train_dataset=train_ds, data_collator=collator)
    trainer.meter = meter
    trainer.remove_callback(PrinterCallback)
    trainer.callback_handler.callbacks.insert(0, make_throughput_callback(meter, None))
    trainer.train()
    windows = meter.windows[1:] or meter.windows  # the first window holds warm-up
    tokens = sum(w["tokens_per_s"] for w in windows) / len(windows)
    return {"variant": name, "tokens_per_s": tokens,
            "samples_per_s": sum(w["samples_per_s"] for w in windows) / len(windows),
            "data_wait_fraction": sum(w["data_wait_fraction"] for w in windows) / len(windows),
            "mfu": windows[-1]["mfu"], "windows": meter.windows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CPU-sized: demo model, few steps")
    p.add_argument("--model-config", choices=["demo", "qwen3-0.6b"], default="demo")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seq", type=int, default=None, help="max_seq_length")
    p.add_argument("--batch", type=int, default=None, help="rows (packed) / examples per step")
    p.add_argument("--output", type=Path, default=ROOT / "bench_results")
    p.add_argument("--expert", type=Path, default=DEMO,
                   help="expert folder whose data (training.dataset.path, a `text` jsonl) "
                   "and model to use, e.g. one made by scripts/make_bench_expert.py")
    a = p.parse_args()
    import datasets
    import torch

    from expert_cli.config import load_manifest
    from expert_cli.data import prepare_data
    from expert_cli.data.collate import PackedCollator
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.environment import probe_environment
    from expert_cli.resolve import resolve
    from expert_cli.trainer_setup import CountingCollator

    gpu = torch.cuda.is_available()
    steps = a.steps or (8 if a.quick else 60)
    seq = a.seq or (512 if a.quick or not gpu else 2048)
    batch = a.batch or (4 if a.quick or not gpu else 8)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = _expert(Path(tmp), a.model_config, seq, batch, steps, a.expert)
        resolved = resolve(load_manifest(manifest), probe_environment())
        tokenizer = load_tokenizer(resolved)
        data = prepare_data(resolved, tokenizer, show_progress=False)
        raw = datasets.load_dataset("json", data_files=str(resolved.train_sources[0].location),
                                    split="train").shuffle(seed=resolved.seed)
        base = _run("padded_baseline", resolved, tokenizer, raw,
                    PaddingCollator(tokenizer, seq),
                    dict(dataloader_num_workers=0, dataloader_pin_memory=False,
                         dataloader_prefetch_factor=None,
                         dataloader_persistent_workers=False), steps, Path(tmp))
        flatten = resolved.attn_implementation == "flash_attention_2"
        fast = _run("expert_cli_packed", resolved, tokenizer, data.train,
                    CountingCollator(PackedCollator(tokenizer.pad_token_id, flatten=flatten)),
                    {}, steps, Path(tmp))
    device = torch.cuda.get_device_name() if gpu else "cpu"
    report = {"model": a.model_config, "expert": a.expert.name, "device": device,
              "data": {k: data.stats.get("train", data.stats).get(k) for k in
                       ("examples", "rows", "tokens", "packing_efficiency")},
              "steps": steps, "max_seq_length": seq, "batch": batch,
              "attn_implementation": resolved.attn_implementation,
              "results": [base, fast],
              "speedup_tokens_per_s": fast["tokens_per_s"] / max(base["tokens_per_s"], 1e-9)}
    a.output.mkdir(parents=True, exist_ok=True)
    where = "gpu" if gpu else "cpu"
    path = a.output / f"bench_train-{a.model_config}-{a.expert.name}-{where}.json"
    path.write_text(json.dumps(report, indent=2))
    for r in (base, fast):
        mfu = f"  MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else ""
        print(f"{r['variant']:18s} {r['tokens_per_s']:10,.0f} tok/s  "
              f"{r['samples_per_s']:8.1f} samples/s  data-wait "
              f"{100 * r['data_wait_fraction']:.1f}%{mfu}")
    print(f"speedup {report['speedup_tokens_per_s']:.2f}x; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
