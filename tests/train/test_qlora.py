"""int4 QLoRA: NF4 weights through bitsandbytes, a few training steps on the CPU."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from train_helpers import window_losses, write_expert


@pytest.mark.slow
def test_int4_loads_nf4_and_trains(tmp_path: Path, tiny_model_dir: Path) -> None:

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.generate import GenerateOptions, generate
    from expert_cli.train.merge import merge_adapter
    from expert_cli.train.model import load_base_model
    from expert_cli.train.run import TrainOptions, train

    manifest = write_expert(tmp_path / "e", tiny_model_dir, base={"quantization": "int4"})
    resolved = resolve(load_manifest(manifest), cpu_environment())
    model, choices = load_base_model(resolved, "cpu")
    linear4 = [m for m in model.modules() if type(m).__name__ == "Linear4bit"]
    assert linear4 and all(m.weight.quant_state.quant_type == "nf4" for m in linear4)
    assert linear4[0].weight.quant_state.nested  # double quantization
    assert choices.dtype.startswith("nf4")

    out = tmp_path / "out"
    result = train(TrainOptions(manifest=manifest, output=out, max_steps=3))
    assert result.status == "completed"
    losses = window_losses(out)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) for v in losses.values())
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 8 and (out / "adapter_model.safetensors").is_file()
    merged, notes = merge_adapter(out, tmp_path / "merged")
    assert notes[0] == (
        "quantization: the run trained against int4 base weights; they are merged at full "
        "precision (the adapter on the unquantized base)"
    )
    assert (merged / "model.safetensors").is_file()
    said = generate(GenerateOptions(adapter=out, prompts=["hi"], max_new_tokens=2))
    assert any(n.startswith("quantization: the run trained against int4") for n in said.notes)
    assert said.generations[0].new_tokens > 0


@pytest.mark.slow
def test_an_evaluation_forward_leaves_int4_gradients_as_they_were(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """On a CPU, bitsandbytes repacked 4-bit weights at the first evaluation-mode forward (the
    causality probe, each evaluation); later training forwards took its inference kernel,
    which gives no gradient to a layer's input: every adapter below a 4-bit layer trained on
    a wrong gradient (up to 108% off) with a loss that looked right."""
    import torch

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.model import attach_adapter, load_base_model

    manifest = write_expert(tmp_path / "e", tiny_model_dir, base={"quantization": "int4"})
    resolved = resolve(load_manifest(manifest), cpu_environment())
    ids = torch.arange(3, 35).reshape(2, 16)

    def gradients(evaluated_first: bool) -> dict[str, torch.Tensor]:
        model, _ = load_base_model(resolved, "cpu")
        peft_model = attach_adapter(model, resolved, total_steps=1)
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # B starts at 0: A's gradient would be 0 whatever the kernel
                torch.nn.init.normal_(param, std=0.02, generator=torch.Generator().manual_seed(1))
        if evaluated_first:
            peft_model.eval()
            with torch.no_grad():
                peft_model(input_ids=ids)
        peft_model.train()
        peft_model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in peft_model.named_parameters() if p.grad is not None}

    plain, evaluated = gradients(False), gradients(True)
    assert plain.keys() == evaluated.keys() and len(plain) > 8
    first_layer = [n for n in plain if ".layers.0." in n and "lora_A" in n]
    assert first_layer and all(plain[n].abs().sum() > 0 for n in first_layer)
    for name in plain:
        assert torch.allclose(plain[name], evaluated[name], rtol=1e-4, atol=1e-7), name


@pytest.mark.slow
def test_an_int8_run_shows_no_repeated_library_warning(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """bitsandbytes logs "MatMul8bitLt: inputs will be cast ... to float16" at every int8
    matmul: 196 lines for a 2-step run of the tiny model with an evaluation, tens of
    thousands for Qwen3-0.6B; the console carries none."""
    from train_helpers import run_cli

    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        config={"max_steps": 2, "evaluation_strategy": "steps", "eval_steps": 2},
        base={"quantization": "int8"},
        rows=16,
        valid_rows=4,
    )
    done = run_cli("train", "--manifest", str(manifest))
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-2000:]
    assert "completed 2 steps" in " ".join(said.split())
    assert "MatMul8bitLt" not in said
