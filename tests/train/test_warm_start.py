"""`training.config.init_adapter` (an extension): a run whose adapter starts from one trained
before, to go on training an expert on more or newer data. Before it there was no way to do
so but merging the adapter into the base, which then could not ship as an expert of the base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import run_here, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.config.warm_start import init_adapter_problem
from expert_cli.errors import UserError

CONFIG = {"rank": 4, "alpha": 8, "save_steps": 2, "learning_rate": 1e-2, "eval_steps": 2,
          "evaluation_strategy": "steps"}  # fmt: skip


def test_a_run_starts_from_a_trained_adapter(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The second run's evaluation before its first step is the first run's last one: the
    same weights on the same validation data; a checkpoint is a start too."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config=CONFIG, rows=32, valid_rows=4)
    first = tmp_path / "first"
    done = run_here("train", "-m", str(manifest), "--output", str(first), "--max-steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    then = json.loads((first / "metrics.json").read_text())["evals"][-1]["eval_loss"]
    for start in (first, first / "checkpoints" / "checkpoint-2"):
        out = tmp_path / f"from-{start.name}"
        sets = ["--set", f"init_adapter={start}", "--set", "eval_on_start=true"]
        again = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "2",
                         *sets)  # fmt: skip
        said = " ".join((again.stdout + again.stderr).split())
        assert again.returncode == 0, said
        assert f"init_adapter: the adapter starts from {start} (" in said
        evals = json.loads((out / "metrics.json").read_text())["evals"]
        assert evals[0]["step"] == 0 and evals[0]["eval_loss"] == pytest.approx(then, rel=1e-5)
    fresh = json.loads((tmp_path / "from-first" / "manifest.resolved.json").read_text())
    assert fresh["init_adapter"] == str(first)
    other = run_here("train", "-m", str(manifest), "--output", str(tmp_path / "from-first"),
                     "--resume", "--max-steps", "4")  # fmt: skip
    said = " ".join((other.stdout + other.stderr).split())
    assert other.returncode == 2 and "init_adapter" in said, said  # it started otherwise
    # written in the manifest, the start is a folder of the training machine: not shipped
    data = json.loads(manifest.read_text())
    data["training"]["config"]["init_adapter"] = str(first)
    written = manifest.with_name("written.json")
    written.write_text(json.dumps(data))
    done = run_here(
        "train", "-m", str(written), "--output", str(tmp_path / "w"), "--max-steps", "1"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    packed = run_here(
        "package", "--adapter", str(tmp_path / "w"), "--output", str(tmp_path / "w.expert")
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert "init_adapter: the folder the run started from is on the training machine" in " ".join(
        packed.stdout.split()
    )
    import tarfile

    with tarfile.open(tmp_path / "w.expert") as tar:
        shipped = json.loads(tar.extractfile("manifest.json").read())
    assert "init_adapter" not in shipped["training"]["config"]
    # a resume reads its checkpoint, not the start: the start moved away, it goes on
    first.rename(tmp_path / "moved")
    more = run_here("train", "-m", str(manifest), "--output", str(tmp_path / "from-first"),
                    "--resume", "--max-steps", "4", "--set", f"init_adapter={first}")  # fmt: skip
    assert more.returncode == 0, more.stdout + more.stderr


def _resolved(manifest: Path, **config: object):
    data = json.loads(manifest.read_text())
    data["training"]["config"].update(config)
    manifest.write_text(json.dumps(data))
    return resolve(load_manifest(manifest), cpu_environment())


def test_a_start_that_does_not_fit_is_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config=CONFIG, rows=16)
    start = tmp_path / "start"
    start.mkdir()
    (start / "adapter_model.safetensors").write_bytes(b"")
    base = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_dora": False}
    cases = [
        ({**base, "r": 8}, "r 8 there, 4 here"),
        ({**base, "lora_alpha": 16}, "lora_alpha 16 there, 8.0 here"),
        ({**base, "use_dora": True}, "use_dora true there, false here"),
        ({**base, "peft_type": "IA3"}, "peft_type 'IA3' there, LORA here"),
        ({**base, "init_lora_weights": "pissa"}, "it applies to a decomposed base"),
    ]
    for config, expected in cases:
        (start / "adapter_config.json").write_text(json.dumps(config))
        problem = init_adapter_problem(_resolved(manifest, init_adapter=str(start))) or ""
        assert "its adapter differs" in problem and expected in problem, problem
    (start / "adapter_config.json").write_text(json.dumps(base))
    resolved = _resolved(manifest, init_adapter=str(start))
    assert resolved.init_adapter == str(start) and init_adapter_problem(resolved) is None
    inside = init_adapter_problem(resolved, output=tmp_path)  # --overwrite set it aside
    assert "is in this run's --output folder" in (inside or ""), inside
    with pytest.raises(UserError, match="init_lora_weights pissa both choose"):
        _resolved(manifest, init_adapter=str(start), init_lora_weights="pissa")
    gone = _resolved(manifest, init_adapter=str(tmp_path / "none"), init_lora_weights="default")
    assert "expected a folder holding adapter_config.json" in (init_adapter_problem(gone) or "")
    (start / "adapter_config.json").write_text("{not json")
    problem = init_adapter_problem(_resolved(manifest, init_adapter=str(start)))
    assert "adapter_config.json is not readable JSON" in (problem or "")
    said = run_here("check", "-m", str(manifest))  # check says it, exit 2
    assert said.returncode == 2 and "not readable JSON" in said.stdout + said.stderr


def test_weights_of_other_layers_are_named(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A start trained on other layers (attention alone) would leave the rest at zero: the
    run says which tensor is missing; a cut file is named, not a traceback."""
    attention = {**CONFIG, "target_modules": ["q_proj", "v_proj"]}
    manifest = write_expert(tmp_path / "a", tiny_model_dir, config=attention, rows=16)
    start = tmp_path / "attention"
    done = run_here("train", "-m", str(manifest), "--output", str(start), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    every = write_expert(tmp_path / "b", tiny_model_dir, config=CONFIG, rows=16)
    refused = run_here("train", "-m", str(every), "--output", str(tmp_path / "b-run"),
                       "--max-steps", "1", "--set", f"init_adapter={start}")  # fmt: skip
    said = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode == 2 and "holds no model.layers.0." in said, said
    assert "it was trained on other layers; give this run its target_modules" in said
    weights = start / "adapter_model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    first = sorted(tensors)[0]
    save_file({**tensors, first: tensors[first] * float("nan")}, str(weights))
    nan = run_here("train", "-m", str(manifest), "--output", str(tmp_path / "nan-run"),
                   "--max-steps", "1", "--set", f"init_adapter={start}")  # fmt: skip
    said = " ".join((nan.stdout + nan.stderr).split())  # it trained, then "diverged" (exit 1)
    assert nan.returncode == 2 and "1 tensor holds NaN or infinity" in said, said
    assert not (tmp_path / "nan-run").exists()
    weights.write_bytes(weights.read_bytes()[:100])
    cut = run_here("train", "-m", str(manifest), "--output", str(tmp_path / "cut-run"),
                   "--max-steps", "1", "--set", f"init_adapter={start}")  # fmt: skip
    said = " ".join((cut.stdout + cut.stderr).split())
    assert cut.returncode == 2 and "adapter_model.safetensors cannot be read" in said, said
    assert "Traceback" not in said
