"""A real-world HiveLLM schema 2.0 manifest trains unchanged (only --max-steps added)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import read_metrics, run_here, text_rows


def _hivellm_manifest(folder: Path, model_dir: Path) -> Path:
    from conftest import write_jsonl

    write_jsonl(folder / "datasets" / "train.jsonl", text_rows(48))
    manifest = {
        "_comment": "Expert manifest in the HiveLLM format",
        "name": "expert-sql",
        "version": "0.3.0",
        "schema_version": "2.0",
        "description": "Text-to-SQL expert",
        "author": "hivellm",
        "license": "apache-2.0",
        "tags": ["sql"],
        "base_models": [
            {
                "name": str(model_dir),
                "sha256": "",
                "quantization": "int4",
                "rope_scaling": {"type": "yarn", "factor": 4.0},
                "prompt_template": "qwen3",
                "adapters": [
                    {
                        "type": "lora",
                        "target_modules": [
                            "q_proj",
                            "k_proj",
                            "v_proj",
                            "o_proj",
                            "gate_proj",
                            "up_proj",
                            "down_proj",
                        ],
                        "r": 14,
                        "alpha": 28,
                        "scaling": "standard",
                        "dropout": 0.05,
                        "use_dora": True,
                        "size_bytes": 0,
                        "sha256": "",
                    }
                ],
            }
        ],
        "capabilities": ["database:sql"],
        "routing": {"keywords": ["sql"], "priority": 0.8},
        "constraints": {"load_order": 5},
        "perf": {"latency_ms_overhead": 4.2},
        "training": {
            "dataset": {
                "path": "datasets/train.jsonl",
                "format": "jsonl",
                "field_mapping": {"text": "text"},
                "_comment": "preprocessed ChatML",
                "source": "synthetic",
            },
            "config": {
                "_comment": "tuned on an RTX 4090",
                "method": "sft",
                "adapter_type": "lora",
                "rank": 14,
                "alpha": 28,
                "dropout": 0.05,
                "target_modules": [
                    "q_proj",
                    "k_proj",
                    "v_proj",
                    "o_proj",
                    "gate_proj",
                    "up_proj",
                    "down_proj",
                ],
                "epochs": 1.5,
                "learning_rate": 5e-5,
                "batch_size": 2,
                "gradient_accumulation_steps": 45,
                "warmup_ratio": 0.1,
                "lr_scheduler": "cosine",
                "max_seq_length": 256,
                "bf16": True,
                "use_tf32": True,
                "use_sdpa": True,
                "packing": True,
                "optim": "adamw_torch_fused",
                "gradient_checkpointing": True,
                "dataloader_num_workers": 2,
                "dataloader_pin_memory": True,
                "logging_steps": 1,
                "save_strategy": "steps",
                "save_steps": 100,
                "evaluation_strategy": "no",
                "use_unsloth": True,
                "activation_checkpointing": "attention",
                "memory_clear_every": 50,
            },
            "decoding": {"temperature": 0.2, "top_p": 0.9},
        },
    }
    path = folder / "manifest.json"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2))
    return path


@pytest.mark.slow
def test_hivellm_manifest_trains_unchanged(tmp_path: Path, tiny_model_dir: Path) -> None:
    manifest = _hivellm_manifest(tmp_path / "expert-sql", tiny_model_dir)
    out = tmp_path / "out"
    proc = run_here("train", "--manifest", str(manifest), "--output", str(out), "--max-steps", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "use_unsloth: not applicable" in proc.stdout
    assert "r=14 alpha=28" in proc.stdout and "dora" in proc.stdout
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], adapter["use_dora"]) == (14, 28, True)
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    assert resolved["gradient_accumulation_steps"] == 45 and resolved["bf16"] is True
    assert read_metrics(out)["summary"]["steps"] == 1


@pytest.mark.slow
def test_hivellm_tools_manifest_trains_with_its_schedule(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The fields of HiveLLM's newer manifests act in a real run: `lr_scheduler_kwargs`
    restarts the cosine 3 times (the learning rate climbs back to its peak), `"full"`
    checkpointing recomputes, `validation_split` gives way to `validation_path`."""
    from conftest import write_jsonl

    folder = tmp_path / "expert-tools"
    manifest = json.loads(
        (Path(__file__).parents[1] / "fixtures" / "hivellm_tools.json").read_text()
    )
    manifest["base_models"][0]["name"] = str(tiny_model_dir)
    write_jsonl(folder / "datasets" / "train.jsonl", text_rows(48))
    write_jsonl(folder / "datasets" / "validation.jsonl", text_rows(6))
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest))
    out = tmp_path / "out"
    proc = run_here(
        "train", "--manifest", str(path), "--output", str(out), "--max-steps", "9",
        "--set", "max_seq_length=128", "--set", "batch_size=2",
        "--set", "gradient_accumulation_steps=1",
        "--set", "warmup_ratio=0", "--set", "warmup_steps=0",
        "--set", "logging_steps=1", "--set", "evaluation_strategy=no",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cosine_with_restarts" in proc.stdout
    assert "validation_split/eval_fraction: not applied" in proc.stdout
    rates = [w["learning_rate"] for w in read_metrics(out)["windows"]]
    assert len(rates) == 9
    peak = max(rates)
    # three cycles of three steps: the peak comes back at the start of each
    assert [i for i, r in enumerate(rates) if r == pytest.approx(peak)] == [0, 3, 6], rates
    resolved = json.loads((out / "manifest.resolved.json").read_text())
    assert resolved["lr_scheduler_kwargs"] == {"num_cycles": 3}
    assert resolved["gradient_checkpointing"] is True
