"""PiSSA and OLoRA (`training.config.init_lora_weights`, an extension): peft starts the adapter
from each weight's decomposition and trains on the residual it writes over the base. What
leaves a run is the same update as a standard LoRA of rank 2r on the base itself, so that peft
loads it without decomposing the base again and HiveLLM's runtime (W + alpha / r B A) applies
it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from train_helpers import run_here, write_expert
from transformers import AutoModelForCausalLM

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.errors import UserError, value_kind
from expert_cli.train.adapter import adapter_config
from expert_cli.train.lora_init import (
    INIT_WEIGHTS,
    kept_start,
    save_initial,
    standard_folder,
    standard_form,
)

IDS = torch.randint(0, 200, (2, 12), generator=torch.Generator().manual_seed(1))


def _resolved(tmp_path: Path, model: Path, config: dict, base: dict | None = None):
    manifest = write_expert(tmp_path, model, config=config, rows=8, base=base)
    return resolve(load_manifest(manifest), cpu_environment())


def _logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def _kept_starts(path: Path, model) -> None:
    """A resume keeps a start whose every layer's B0 A0 is the fresh decomposition's (an SVD's
    signs may differ), and writes it again where it holds another's."""
    from safetensors.torch import load_file, save_file

    assert kept_start(path, model) == "same"
    start = load_file(path)
    a = next(k for k in start if ".lora_A." in k)
    b = a.replace(".lora_A.", ".lora_B.")
    flipped = {**start, a: -start[a], b: -start[b]}  # the same residual
    save_file(flipped, str(path.with_name("flipped.safetensors")))
    assert kept_start(path.with_name("flipped.safetensors"), model) == "same"
    other = {**start, b: start[b] * 1.01}  # another run's of the same shapes
    save_file(other, str(path.with_name("other.safetensors")))
    assert kept_start(path.with_name("other.safetensors"), model) == "other"
    fewer = {k: v for k, v in start.items() if k != a}
    save_file(fewer, str(path.with_name("fewer.safetensors")))
    assert kept_start(path.with_name("fewer.safetensors"), model) == "unusable"
    assert kept_start(path.with_name("missing.safetensors"), model) == "unusable"
    os.mkfifo(path.with_name("fifo.safetensors"))  # opening it held the resume for ever
    assert kept_start(path.with_name("fifo.safetensors"), model) == "unusable"


@pytest.mark.parametrize(
    ("init", "extra"),
    [
        ("pissa", {}),
        ("pissa_niter_4", {}),
        ("olora", {}),
        ("pissa", {"use_rslora": True}),
        ("pissa", {"adapter_type": "dora"}),
    ],
)
def test_the_standard_form_gives_the_trained_model_on_the_base_itself(
    tmp_path: Path, tiny_model_dir: Path, init: str, extra: dict
) -> None:
    """A trained PiSSA adapter (here: its A and B moved off their start) on the residual base
    and its standard form on the original base give the same logits; applied as HiveLLM's
    runtime does (W + alpha / r B A), the standard form gives them too."""
    resolved = _resolved(tmp_path / "e", tiny_model_dir, {"init_lora_weights": init, **extra})
    assert resolved.init_lora_weights == init
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, adapter_config(resolved, 10))
    run = tmp_path / "run"
    run.mkdir()
    save_initial(model, run / INIT_WEIGHTS)
    _kept_starts(run / INIT_WEIGHTS, model)
    with torch.no_grad():  # "training": every A and B moved
        generator = torch.Generator().manual_seed(2)
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    trained = _logits(model)
    model.save_pretrained(run / "checkpoints" / "checkpoint-1")
    saved = json.loads((run / "checkpoints" / "checkpoint-1" / "adapter_config.json").read_text())
    assert saved["init_lora_weights"] == init  # the residual form, as peft saves it
    checkpoint = run / "checkpoints" / "checkpoint-1"
    broken = run / "broken.safetensors"  # cut short: was a SafetensorError traceback
    broken.write_bytes(b"\x10" + bytes(7) + b"{")
    with pytest.raises(UserError, match="broken.safetensors: cannot be read"):
        standard_form(checkpoint, broken)
    # a resume keeps the start only where it reads whole and fits (one cut short is written
    # again: it ended a whole resumed run in a SafetensorError)
    assert kept_start(broken, model) == "unusable"
    with pytest.raises(UserError, match="adapter_init.safetensors, which turns it .* is missing"):
        standard_form(checkpoint, run / "gone" / INIT_WEIGHTS)
    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in original.items())
    with standard_folder(run / "checkpoints" / "checkpoint-1", run / INIT_WEIGHTS) as folder:
        config = json.loads((folder / "adapter_config.json").read_text())
        loaded = PeftModel.from_pretrained(fresh, str(folder))
        assert (config["r"], config["lora_alpha"], config["init_lora_weights"]) == (16, 32, True)
        assert config["use_rslora"] is False
        torch.testing.assert_close(_logits(loaded), trained, rtol=1e-4, atol=1e-4)
        if resolved.use_dora:
            return  # HiveLLM's runtime applies no DoRA magnitude
        from safetensors.torch import load_file

        weights = load_file(folder / "adapter_model.safetensors")
    hive = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    state = hive.state_dict()
    with torch.no_grad():
        for key, a in weights.items():
            if ".lora_A." in key:
                layer = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                b = weights[key.replace("lora_A", "lora_B")]
                state[f"{layer}.weight"].add_(config["lora_alpha"] / config["r"] * (b @ a))
    torch.testing.assert_close(_logits(hive), trained, rtol=1e-4, atol=1e-4)


def test_an_initialisation_the_run_cannot_take_is_said_or_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    ia3 = _resolved(tmp_path / "a", tiny_model_dir, {"init_lora_weights": "pissa",
                                                   "adapter_type": "ia3"})  # fmt: skip
    assert ia3.init_lora_weights == "default"
    assert "init_lora_weights: pissa starts LoRA and DoRA; not applied to ia3" in ia3.notes
    pissa = _resolved(tmp_path / "b", tiny_model_dir, {"init_lora_weights": "pissa_niter_4"})
    assert any("pissa_niter_4 decomposes each adapted weight" in n for n in pissa.notes)
    with pytest.raises(UserError, match="int4 base does not hold"):
        _resolved(tmp_path / "c", tiny_model_dir, {"init_lora_weights": "olora"},
                  base={"quantization": "int4"})  # fmt: skip
    proc = run_here("check", "--manifest", str(tmp_path / "b" / "manifest.json"),
                    "--set", "init_lora_weights=pissa_niter_0")  # fmt: skip
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 2 and "training.config.init_lora_weights" in said, said


def test_a_resume_that_changes_the_initialisation_is_another_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from expert_cli.train.same_run import changed_fields

    pissa = _resolved(tmp_path / "a", tiny_model_dir, {"init_lora_weights": "pissa"})
    before = pissa.model_dump(mode="json")
    del before["init_lora_weights"]  # a run recorded before the field: default
    assert changed_fields(before, pissa) == ["init_lora_weights"]


def test_a_start_peft_does_not_know_is_named() -> None:
    """An adapter_config.json whose init_lora_weights was edited to 5 was an AttributeError
    traceback in generate and merge, and shipped."""
    from expert_cli.train.outputs import adapter_config_problem

    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    for good in (True, False, "pissa_niter_16", "olora", "gaussian"):
        assert adapter_config_problem({**config, "init_lora_weights": good}, None) is None
    for bad in (5, "bogus", "True", None):
        assert adapter_config_problem({**config, "init_lora_weights": bad}, None) == (
            f"init_lora_weights: not a start peft knows (got {value_kind(bad)})"
        )
    # peft reads use_rslora "yes" as true (scale alpha / sqrt(r)); the package's fold and
    # HiveLLM's runtime did not: shipped at another scale, called sound
    for key in ("use_rslora", "use_dora"):
        assert adapter_config_problem({**config, key: None}, None) is None
        for bad in ("yes", 1, "false"):
            assert adapter_config_problem({**config, key: bad}, None) == (
                f"{key}: expected true or false (got {value_kind(bad)})"
            )


def test_a_package_made_elsewhere_in_the_residual_form_is_said_to_be_misapplied() -> None:
    from expert_cli.train.adapter_entry import runtime_notes

    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "init_lora_weights": "olora"}
    (note,) = runtime_notes(config)
    assert "init_lora_weights olora: the adapter applies to the base less its decomposition" in note
    assert runtime_notes({**config, "init_lora_weights": True}) == []


def _other_start(start: bytes) -> bytes:
    """A start of the same names and shapes, other numbers."""
    from safetensors.torch import load, save

    return save({k: v * 1.5 for k, v in load(start).items()})


@pytest.mark.slow
def test_a_pissa_run_ships_a_lora_of_the_base_itself(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Trained, checkpointed, resumed, packaged and tried: the final adapter and a packaged
    checkpoint are rank 2r on the base; a checkpoint tried by generate loads without peft
    decomposing the base again."""
    config = {"init_lora_weights": "pissa", "rank": 4, "alpha": 8, "save_steps": 2,
              "learning_rate": 1e-2}  # fmt: skip
    manifest = write_expert(tmp_path / "e", tiny_model_dir, config=config, rows=16, valid_rows=4)
    run = tmp_path / "run"
    first = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "pissa decomposes each adapted weight" in " ".join(first.stdout.split())
    start = (run / INIT_WEIGHTS).read_bytes()
    final = json.loads((run / "adapter_config.json").read_text())
    assert (final["r"], final["lora_alpha"], final["init_lora_weights"]) == (8, 16, True)
    checkpoint = json.loads(
        (run / "checkpoints" / "checkpoint-2" / "adapter_config.json").read_text()
    )
    assert checkpoint["r"] == 4 and checkpoint["init_lora_weights"] == "pissa"
    (run / INIT_WEIGHTS).write_bytes(_other_start(start))  # another run's, put there by hand
    more = run_here(
        "train", "-m", str(manifest), "--output", str(run), "--resume", "--max-steps", "4"
    )
    assert more.returncode == 0, more.stdout + more.stderr
    assert "adapter_init.safetensors: held another start than this run's" in " ".join(
        more.stdout.split()
    )
    assert (run / INIT_WEIGHTS).read_bytes() == start  # the run's decomposition, written again
    (run / INIT_WEIGHTS).write_bytes(_other_start(start))  # another run's, by hand
    swapped = run_here("package", "--adapter", str(run), "--checkpoint", "checkpoint-2",
                       "--output", str(tmp_path / "s.expert"))  # fmt: skip
    assert swapped.returncode == 2 and not (tmp_path / "s.expert").exists()
    assert "adapter_init.safetensors: is not the start the run wrote" in " ".join(
        swapped.stderr.split()
    ), swapped.stderr
    (run / INIT_WEIGHTS).write_bytes(start)
    out = tmp_path / "p.expert"
    packed = run_here("package", "--adapter", str(run), "--checkpoint", "checkpoint-2",
                      "--output", str(out))  # fmt: skip
    assert packed.returncode == 0, packed.stdout + packed.stderr
    said = " ".join(packed.stdout.split())
    assert "ships as a LoRA of the base itself, rank 8 and alpha 16, twice the run's" in said
    assert "training.config.rank: 4 in manifest.json" not in said  # by design, not an edit
    assert "in the adapter it ships (its adapter_config.json" not in said
    final = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "f.expert"))
    said = " ".join(final.stdout.split())  # the final adapter, converted as it was saved
    assert final.returncode == 0 and "twice the run's" in said, said
    assert "in the adapter it ships (its adapter_config.json" not in said
    import tarfile

    with tarfile.open(out, "r:gz") as tar:
        shipped = json.loads(tar.extractfile("adapter_config.json").read())
        manifest_json = json.loads(tar.extractfile("manifest.json").read())
    assert (shipped["r"], shipped["lora_alpha"], shipped["init_lora_weights"]) == (8, 16, True)
    assert manifest_json["base_models"][0]["adapters"][0]["r"] == 8
    tried = run_here("generate", "--adapter", str(run / "checkpoints" / "checkpoint-2"),
                     "-p", "SELECT", "--max-new-tokens", "2")  # fmt: skip
    assert tried.returncode == 0, tried.stdout + tried.stderr
