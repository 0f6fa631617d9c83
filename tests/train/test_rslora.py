"""rsLoRA (`training.config.use_rslora`, an extension): peft's rank-stabilised scaling, alpha /
sqrt(r) in place of alpha / r, trained by peft's layers and by expert-cli's fused ones (both
read peft's `scaling`), kept across a resume, and folded into the package's lora_B, since
HiveLLM's runtime applies alpha / r."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, load_file
from train_helpers import run_here, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve


def _resolved(tmp_path: Path, model: Path, config: dict, adapter: dict | None = None):
    manifest = write_expert(tmp_path, model, config=config, rows=8)
    if adapter is not None:
        data = json.loads(manifest.read_text())
        data["base_models"][0]["adapters"][0].update(adapter)
        manifest.write_text(json.dumps(data))
    return resolve(load_manifest(manifest), cpu_environment())


def test_rslora_is_resolved_for_lora_and_dora_and_said_for_the_others(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    on = _resolved(tmp_path / "a", tiny_model_dir, {"use_rslora": True})
    assert on.use_rslora is True and not any("use_rslora" in n for n in on.notes)
    assert _resolved(tmp_path / "b", tiny_model_dir, {}).use_rslora is False
    dora = _resolved(tmp_path / "c", tiny_model_dir, {"use_rslora": True, "adapter_type": "dora"})
    assert dora.use_rslora is True
    ia3 = _resolved(tmp_path / "d", tiny_model_dir, {"use_rslora": True, "adapter_type": "ia3"})
    assert ia3.use_rslora is False
    assert "use_rslora: rank-stabilised scaling is LoRA's and DoRA's; not applied to ia3" in (
        ia3.notes
    )
    # the adapter entry's descriptive `scaling` names it, or is said not to be acted on
    named = _resolved(tmp_path / "e", tiny_model_dir, {"use_rslora": True}, {"scaling": "rslora"})
    assert not any(n.startswith("scaling:") for n in named.notes)
    unnamed = _resolved(tmp_path / "f", tiny_model_dir, {}, {"scaling": "rslora"})
    (note,) = [n for n in unnamed.notes if n.startswith("scaling:")]
    assert "training.config.use_rslora true scales by alpha / sqrt(r)" in note


def test_the_adapter_scales_by_alpha_over_the_root_of_its_rank(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from expert_cli.train.adapter import adapter_config

    for rslora, scale in ((True, 16 / math.sqrt(8)), (False, 16 / 8)):
        resolved = _resolved(tmp_path / str(rslora), tiny_model_dir, {"use_rslora": rslora})
        model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_config(resolved, 10)
        )
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        assert layer.scaling["default"] == pytest.approx(scale)


def test_a_resume_that_turns_rslora_on_is_another_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A run recorded before use_rslora was: its absence is false, so turning it on is a
    change, not a silent resume at another scale."""
    from expert_cli.train.same_run import changed_fields

    on = _resolved(tmp_path / "a", tiny_model_dir, {"use_rslora": True})
    before = on.model_dump(mode="json")
    assert changed_fields(before, on) == []
    del before["use_rslora"]
    assert changed_fields(before, on) == ["use_rslora false -> true"]


@pytest.mark.slow
def test_the_package_folds_the_scale_into_lora_b(tmp_path: Path, tiny_model_dir: Path) -> None:
    """HiveLLM's runtime adds alpha / r x B A to each weight: the packaged adapter gives, so
    applied, the update the run trained (alpha / sqrt(r) x B A), where the run's own files
    applied that way give sqrt(r) = 2.83 times less at r 8."""
    config = {"use_rslora": True, "learning_rate": 5e-2}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config=config, rows=16)
    run = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "adapter   lora r=8 alpha=16 dropout=0 rslora (alpha / sqrt(r)) targets=" in done.stdout
    trained_config = json.loads((run / "adapter_config.json").read_text())
    assert trained_config["use_rslora"] is True
    packaged = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "p.expert"))
    assert packaged.returncode == 0, packaged.stdout + packaged.stderr
    said = " ".join(packaged.stdout.split())
    assert "rsLoRA's scale alpha / sqrt(r) is folded into lora_B (x2.83 at r 8)" in said
    with tarfile.open(tmp_path / "p.expert", "r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    shipped_config = json.loads(files["adapter_config.json"])
    assert shipped_config["use_rslora"] is False
    assert (shipped_config["r"], shipped_config["lora_alpha"]) == (8, 16)
    shipped, trained = (
        load(files["adapter_model.safetensors"]),
        load_file(run / "adapter_model.safetensors"),
    )
    assert shipped.keys() == trained.keys()
    b_names = [n for n in trained if ".lora_B." in n]
    assert b_names and any(trained[n].abs().max() > 0 for n in b_names)
    for name, tensor in trained.items():
        as_hive = shipped[name] * (16 / 8) if ".lora_B." in name else shipped[name]
        as_run = tensor * (16 / math.sqrt(8)) if ".lora_B." in name else tensor
        torch.testing.assert_close(as_hive, as_run, rtol=1e-6, atol=1e-7)
    entry = json.loads(files["manifest.json"])["base_models"][0]["adapters"][0]
    assert entry["size_bytes"] == len(files["adapter_model.safetensors"])
    check = run_here("check", "--package", str(tmp_path / "p.expert"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "use_rslora is true" not in check.stdout  # the package's own is plain LoRA


def test_a_foreign_rslora_package_is_said_to_be_applied_weaker() -> None:
    from expert_cli.train.adapter_entry import runtime_notes

    (note,) = runtime_notes({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "use_rslora": True})
    assert "applies alpha / r, sqrt(r) times weaker than trained" in note
