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
