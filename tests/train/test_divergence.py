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
from expert_cli.train.divergence import Diverged, DivergenceWatch, non_finite_weights
from expert_cli.weights import non_finite_line, non_finite_tensors, tensor_is_finite


def strict_json(path: Path) -> dict:
    """The file parsed as JSON proper: NaN and Infinity are refused."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in {path.name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def poison_optimizer(
    monkeypatch: pytest.MonkeyPatch, at: int, every_param: bool = False
) -> list[int]:
    """After the optimizer's `at`-th step, fill its first parameter (or every one) with NaN, as
    a learning rate too high does in one step; the list that counts the steps taken."""
    step = torch.optim.AdamW.step
    calls: list[int] = []

    def poisons(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == at:
            params = [p for g in self.param_groups for p in g["params"]]
            with torch.no_grad():
                for param in params if every_param else params[:1]:
                    param.fill_(math.nan)
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", poisons)
    return calls


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
    calls = poison_optimizer(monkeypatch, 3, every_param=True)
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
    said = " ".join((again.stdout + again.stderr).split())
    assert "holds a run that diverged (4 steps); start again there with --overwrite" in said
    assert "--resume" not in said  # it would keep the learning rate that diverged
    monkeypatch.undo()  # the optimizer steps as it should again
    resumed = run_here("train", "--manifest", str(manifest), "--max-steps", "8", "--resume")
    said = " ".join((resumed.stdout + resumed.stderr).split())
    assert resumed.returncode == 0, said
    assert (
        "--resume: passing over checkpoint-3: adapter_model.safetensors: 28 tensors hold NaN or "
        "infinity"
    ) in said
    assert "resuming from checkpoint-2 (step 2 of 8)" in said
    assert strict_json(output / "metrics.json")["summary"]["status"] == "completed"


@pytest.mark.parametrize("quantization", ["none", "int4", "int8"])
def test_base_weights_holding_nan_are_refused_at_load(
    tmp_path: Path, tiny_model_dir: Path, quantization: str
) -> None:
    """Quantized, the packed integers hold no NaN: int4 and int8 runs passed the check, and
    one infinity made a whole 4-bit layer NaN; the run "diverged" at step 1 and advised a
    lower learning rate. A 4-bit weight is judged dequantized, an 8-bit one by its scales."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (weights,) = model.glob("*.safetensors")
    tensors = load_file(str(weights))
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = math.inf
    save_file(tensors, str(weights), metadata={"format": "pt"})
    manifest = write_expert(tmp_path / "e", model, rows=8, base={"quantization": quantization})
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert (
        f"base model {model}: 1 tensor holds NaN or infinity "
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
    poison_optimizer(monkeypatch, poisoned)
    proc = run_here("train", "--manifest", str(manifest), "--max-steps", "3")
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert f"training diverged: {expected}, so the run stopped and wrote no adapter." in text
    output = manifest.parent / "output"
    assert not (output / "adapter_model.safetensors").exists()
    assert strict_json(output / "metrics.json")["summary"]["status"] == "diverged"


def test_an_epoch_strategy_saves_and_evaluates_nothing_after_the_nan(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the loop stops the Trainer asks again at the epoch's end: an epoch save_strategy
    or eval_strategy would save and evaluate the NaN weights there."""
    config = {
        "batch_size": 1,
        "save_strategy": "epoch",
        "evaluation_strategy": "epoch",
        "logging_steps": 1,
    }
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=24, valid_rows=4, config=config)
    poison_optimizer(monkeypatch, 1)
    proc = run_here("train", "--manifest", str(manifest))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1, text
    assert "training diverged: the loss is nan in step 2 (finite up to step 1)" in text
    output = manifest.parent / "output"
    assert not list((output / "checkpoints").glob("checkpoint-*"))
    assert strict_json(output / "metrics.json")["evals"] == []


def test_the_closing_check_is_one_collective_on_every_process() -> None:
    """Each process's closing loss is its own: the verdict is one sum over every process,
    called on every process (a process that decided alone would wait in another collective)."""
    model = torch.nn.Linear(4, 4)
    calls: list[list[float]] = []

    def one_rank_of_two(flags: list[float]) -> list[float]:
        calls.append(flags)
        return [flags[0] + 1.0, flags[1]]  # the other process saw a NaN closing loss

    watch = DivergenceWatch()
    watch.check_weights(model, 7, one_rank_of_two)
    assert calls == [[0.0, 0.0]]
    assert watch.diverged is not None and not watch.diverged.weights_only

    quiet = DivergenceWatch()
    quiet.check_weights(model, 7, lambda flags: flags)
    assert quiet.diverged is None
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    quiet.check_weights(model, 7, lambda flags: flags)
    assert quiet.diverged is not None and quiet.diverged.weights_only

    stopped, calls = DivergenceWatch(), []
    stopped.diverged = Diverged(3, 2, math.nan)  # a window's loss: every process has it
    stopped.check_weights(model, 3, one_rank_of_two)
    assert calls == []


def test_each_process_judges_the_shard_it_holds() -> None:
    """FSDP2 parameters are DTensors: the scan reads the local shard (it skipped them all)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        layer = torch.nn.Linear(8, 8)
        fully_shard(layer, mesh=init_device_mesh("cpu", (1,)))
        assert type(layer.weight.data).__name__ == "DTensor"
        assert non_finite_weights(layer) == []
        with torch.no_grad():
            layer.weight.to_local()[1, 2] = math.nan
        assert non_finite_weights(layer) == ["weight"]
    finally:
        dist.destroy_process_group()


class ZeroThreeParam:
    """What DeepSpeed ZeRO-3 makes of a parameter of 10 elements over 4 processes: this
    process's partition (`ds_tensor`, 3 elements, padded to the same size on every process
    with memory never written) and the full size (`ds_numel`)."""

    def __init__(self, partition: torch.Tensor, numel: int) -> None:
        self.ds_tensor = partition
        self.ds_tensor.ds_numel = partition.numel()
        self.ds_numel = numel
        self.ds_process_group = None


def test_zero3_padding_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last process's partition holds 1 real element and 2 of padding, which may read as
    NaN: only the real ones are judged."""
    import torch.distributed as dist

    from expert_cli.train.divergence import local_data

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    last = ZeroThreeParam(torch.tensor([1.0, math.nan, math.nan]), 10)
    assert local_data(last).tolist() == [1.0]
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    middle = ZeroThreeParam(torch.tensor([1.0, math.nan, 2.0]), 10)
    assert not tensor_is_finite(local_data(middle))  # a real NaN is found


def test_float8_and_odd_names(tmp_path: Path) -> None:
    """torch can neither sum nor test float8; a name in a file's header is the file's text."""
    from safetensors.torch import save_file

    good = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
    bad = torch.tensor([1.0, math.nan]).to(torch.float8_e4m3fn)
    assert tensor_is_finite(good) and not tensor_is_finite(bad)
    # e8m0 reaches 2^127: finite values over float16's range are not infinities
    assert tensor_is_finite(torch.tensor([2.0**20, 2.0**100]).to(torch.float8_e8m0fnu))
    assert tensor_is_finite(torch.zeros(4, dtype=torch.float4_e2m1fn_x2))  # packed: not read
    path = tmp_path / "w.safetensors"
    odd = "x" * 300
    save_file({"fine": good, "broken": bad, odd: bad.clone()}, str(path))
    found = non_finite_tensors(path)
    assert found == sorted(["broken", odd])
    assert non_finite_line(found) == (
        "2 tensors hold NaN or infinity (broken, <a 300-character name>)"
    )


def test_a_loss_not_finite_at_the_first_step_blames_the_base_not_the_rate(
    demo_expert_dir: Path, tmp_path: Path
) -> None:
    """A base whose forward overflows gave NaN at step 1, before any update, and the advice
    was a lower learning rate and clipping: the base's forward is named instead."""
    import math

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.divergence import Diverged, diverged_error

    resolved = resolve(load_manifest(demo_expert_dir / "manifest.json"), cpu_environment())
    said = str(diverged_error(resolved, Diverged(1, 0, math.nan), tmp_path))
    assert said.startswith("training stopped: the loss is nan in step 1 (from the start), a")
    assert "neither the learning rate nor clipping is the cause" in said
    assert "learning_rate (now" not in said and "No adapter was written." in said
    later = str(diverged_error(resolved, Diverged(2, 1, math.nan), tmp_path))
    assert "a lower training.config.learning_rate (now 0.002)" in later
