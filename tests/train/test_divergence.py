"""A run whose loss stops being a number stops at that logging window, writes no adapter and
says what to change; base weights that hold NaN are refused at load. Both used to train to
the end, say "completed" and write a NaN adapter (and `NaN` into metrics.json, which is not
JSON)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from train_helpers import run_here, write_expert

from expert_cli.atomic import write_json_atomic
from expert_cli.train.divergence import non_finite_weights


def strict_json(path: Path) -> dict:
    """The file parsed as JSON proper: NaN and Infinity are refused."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in {path.name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_metrics_files_are_json_without_nan(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    write_json_atomic(path, {"a": [1.5, math.nan, {"b": -math.inf}], "c": (math.inf, 2)})
    assert strict_json(path) == {"a": [1.5, None, {"b": None}], "c": [None, 2]}


def test_non_finite_weights_are_named_and_large_finite_ones_are_not() -> None:
    """The scan sums each tensor first: a sum that overflows (fp16 weights of 60000) must not
    count as NaN; a NaN or an infinity anywhere must."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)).half()
    with torch.no_grad():
        model[0].weight.fill_(60000.0)
    assert non_finite_weights(model) == []
    with torch.no_grad():
        model[1].bias[2] = -math.inf
        model[0].weight[5, 7] = math.nan
    assert non_finite_weights(model) == ["0.weight", "1.bias"]
    model[0].weight.requires_grad_(False)
    assert non_finite_weights(model, trainable_only=True) == ["1.bias"]


def test_a_loss_that_turns_nan_stops_the_run(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The optimizer's third step leaves NaN weights (what a learning rate too high does, in
    one step): step 4's loss is NaN. The run stops there, saves no checkpoint of the NaN
    weights at step 4, writes no adapter, and names checkpoint-2 as the last finite weights:
    checkpoint-3 was saved after the third step, from weights already NaN."""
    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=48, config={"save_steps": 1, "batch_size": 1}
    )
    output = manifest.parent / "output"
    step = torch.optim.AdamW.step
    calls = []

    def poisons_the_third_step(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                for group in self.param_groups:
                    for param in group["params"]:
                        param.fill_(math.nan)
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", poisons_the_third_step)
    proc = run_here("train", "--manifest", str(manifest), "--max-steps", "8")
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert (
        "training diverged: the loss is nan in step 4 (finite up to step 3), so the run stopped "
        "and wrote no adapter. checkpoint-2 (step 2) holds the last finite adapter weights."
    ) in text
    assert "a lower training.config.learning_rate (now 0.002)" in text and "Traceback" not in text
    assert len(calls) == 4  # no step after the window that showed it
    assert not (output / "adapter_model.safetensors").exists()
    checkpoints = sorted(p.name for p in (output / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    metrics = strict_json(output / "metrics.json")
    assert metrics["summary"]["status"] == "diverged"
    losses = [w["loss"] for w in metrics["windows"]]
    assert all(math.isfinite(x) for x in losses[:3]) and losses[3:] == [None]
    finite = load_file(str(output / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"))
    assert all(t.isfinite().all() for t in finite.values())
    again = run_here("train", "--manifest", str(manifest))
    assert again.returncode == 2
    assert "holds a run that diverged (4 steps)" in " ".join((again.stdout + again.stderr).split())


def test_base_weights_holding_nan_are_refused_at_load(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (weights,) = model.glob("*.safetensors")
    tensors = load_file(str(weights))
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = math.inf
    save_file(tensors, str(weights), metadata={"format": "pt"})
    manifest = write_expert(tmp_path / "e", model, rows=8)
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert (
        f"base model {model}: its weights hold NaN or infinity "
        "(model.layers.1.mlp.down_proj.weight), so every loss would be NaN"
    ) in text
    assert not (manifest.parent / "output").exists()


@pytest.mark.parametrize(
    ("poisoned", "config", "expected"),
    [
        # the last step's update: every logged loss was finite
        (3, {}, "the adapter's weights hold NaN or infinity after step 3"),
        # no window is ever logged (logging_steps above the run's steps): the Trainer's
        # closing log has the run's mean loss
        (1, {"logging_steps": 50}, "the loss is nan in the window of steps 1-3 (from the start)"),
    ],
)
def test_nan_weights_the_windows_did_not_show_are_not_saved(
    poisoned: int,
    config: dict,
    expected: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=24, config={"batch_size": 1, **config}
    )
    step = torch.optim.AdamW.step
    calls = []

    def poisons(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == poisoned:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(math.nan)
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", poisons)
    proc = run_here("train", "--manifest", str(manifest), "--max-steps", "3")
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert f"training diverged: {expected}, so the run stopped and wrote no adapter." in text
    output = manifest.parent / "output"
    assert not (output / "adapter_model.safetensors").exists()
    assert strict_json(output / "metrics.json")["summary"]["status"] == "diverged"
