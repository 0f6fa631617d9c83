"""A package's manifest.json as HiveLLM's own loader reads it (hivellm/expert @ 9cd24b1,
cli/src/manifest.rs): what it refuses, what `package` completes from the run, what only the
author can give, and `check --package` on packages laid out as HiveLLM's packager writes them."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from train_helpers import (
    HIVE_METADATA,
    hand_built_manifest,
    hand_built_run,
    run_main,
    write_tar_gz,
)

from expert_cli.errors import UserError
from expert_cli.train.hive_loader import for_hive_loader, loader_problems, refuse_unloadable
from expert_cli.train.package import build_package
from expert_cli.train.package_check import verify_package
from expert_cli.train.package_manifest import author_notes

EXPERTS = Path(__file__).parents[2] / "experts"
RESOLVED = {  # the demo's run, with batch_size auto resolved to 8 rows x 2
    "adapter_type": "lora",
    "rank": 16,
    "alpha": 32.0,
    "epochs": 2.0,
    "learning_rate": 0.002,
    "batch_size": 8,
    "gradient_accumulation_steps": 2,
    "warmup_steps": 0,
    "warmup_ratio": 0.05,
    "lr_scheduler": "cosine",
}
ADAPTER = {"peft_type": "LORA", "r": 16, "lora_alpha": 32.0, "target_modules": ["v", "q"]}


def test_what_the_loader_refuses_is_named_by_its_path() -> None:
    manifest = json.loads((EXPERTS / "expert-sql" / "manifest.json").read_text())
    # HiveLLM's published expert-sql writes warmup_steps 0 beside its ratio; this copy does not
    assert loader_problems(manifest) == [
        "training.config.warmup_steps: missing; expected a whole number from 0 to 4,294,967,295"
    ]
    manifest["training"]["config"]["warmup_steps"] = 0
    assert loader_problems(manifest) == []
    broken = copy.deepcopy(manifest)
    del broken["description"]
    broken["training"]["config"]["alpha"] = 24.0  # serde reads no float as a whole number
    broken["repository"] = "https://example.org/x"
    broken["soft_prompts"] = [{"name": "s", "path": "s.bin"}]
    broken["base_models"][0]["adapters"][0]["target_modules"] = "all-linear"
    assert loader_problems(broken) == [
        "description: missing; expected a string",
        "training.config.alpha: a decimal number; expected a whole number from 0 to 4,294,967,295",
        "repository: a string of 21 characters; expected an object",
        "base_models[0].adapters[0].target_modules: a string of 10 characters; expected a "
        "list of strings",
        "soft_prompts[0].tokens: missing; expected a whole number from 0 to 4,294,967,295",
    ]
    rules = copy.deepcopy(manifest)
    rules["training"]["config"].update(epochs=0, rank=None)
    rules["base_models"][0]["adapters"] = []
    assert loader_problems(rules) == [
        "base_models[0].adapters: empty; expected the adapter it ships",
        "training.config.epochs: expected a number above 0",
        "training.config.rank: expected a whole number above 0 (all but ia3 have one)",
    ]
    assert loader_problems({**manifest, "tags": None, "integrity": None}) == []  # null: unset
    # serde's `default` fields may be left out, never null; validate's own rules
    assert loader_problems({**manifest, "soft_prompts": None, "schema_version": None}) == [
        "schema_version: null; expected a string",
        "soft_prompts: null; expected a list of objects",
    ]
    nameless = copy.deepcopy(manifest)
    nameless["base_models"][0]["name"] = ""
    nameless["training"]["dataset"] = {"format": "jsonl"}
    assert loader_problems(nameless) == [
        "base_models[0].name: empty",
        "training.dataset: expected a path, generation or tasks",
    ]


def test_the_run_completes_what_it_trained_and_nothing_else() -> None:
    manifest = json.loads((EXPERTS / "demo" / "manifest.json").read_text())
    manifest["integrity"] = {"publisher": "x", "signature_algorithm": "ed25519", "files": {}}
    entries = manifest["base_models"][0]["adapters"]
    entries[0]["path"] = "weights/adapter"
    config = manifest["training"]["config"]
    config.update(batch_size="auto", alpha=32.0)
    notes = for_hive_loader(manifest, entries, RESOLVED, ADAPTER)
    assert loader_problems(manifest) == []
    assert entries[0]["target_modules"] == config["target_modules"] == ["q", "v"]
    assert "path" not in entries[0] and "integrity" not in manifest
    # what the run used: the probe's rows and accumulation, the ratio beside 0 steps
    assert (config["batch_size"], config["gradient_accumulation_steps"]) == (8, 2)
    assert (config["warmup_steps"], config["warmup_ratio"]) == (0, 0.05)
    assert config["alpha"] == 32 and isinstance(config["alpha"], int)  # whole
    assert config["rank"] == 16 and config["learning_rate"] == 0.002  # given as trained: kept
    said = " | ".join(notes)
    assert "target_modules: all-linear written as the 2 module names" in said
    assert "adapter path: the adapter ships at the package's root" in said
    assert "integrity: the manifest's section describes other files; left out" in said
    assert (
        "training.config: target_modules, batch_size, gradient_accumulation_steps, "
        "warmup_steps written as the run trained them" in said
    )
    constant = json.loads((EXPERTS / "demo" / "manifest.json").read_text())
    constant["training"]["config"].update(lr_scheduler="constant", warmup_ratio=0.1)
    trained = {**RESOLVED, "lr_scheduler": "constant_with_warmup", "warmup_ratio": 0.1}
    for_hive_loader(constant, constant["base_models"][0]["adapters"], trained, ADAPTER)
    assert constant["training"]["config"]["lr_scheduler"] == "constant_with_warmup"
    default = json.loads((EXPERTS / "demo" / "manifest.json").read_text())
    del default["training"]["config"]["warmup_ratio"]  # the run warmed up 3% by default
    for_hive_loader(default, default["base_models"][0]["adapters"], RESOLVED, ADAPTER)
    assert default["training"]["config"]["warmup_ratio"] == 0.05


def test_what_only_the_author_gives_is_asked_for(tmp_path: Path) -> None:
    source = hand_built_manifest(soft_prompts=[{"name": "s", "path": "s.bin"}])
    for key in HIVE_METADATA:
        del source[key]
    with pytest.raises(UserError) as caught:
        refuse_unloadable(source)
    lines = caught.value.lines
    assert lines[0] == "the package's manifest.json would not load in HiveLLM's loader:"
    assert "  description: missing; expected a string" in lines
    assert "  constraints: missing; expected an object" in lines
    assert lines[-1].startswith("give these in the manifest file (package takes what describes")
    run = hand_built_run(tmp_path, {k: v for k, v in source.items() if k != "soft_prompts"})
    target = tmp_path / "dist" / "x.expert"
    with pytest.raises(UserError):
        build_package(run, target)
    assert not (tmp_path / "dist").exists()  # nothing written, not even the folder
    (run / "manifest.source.json").write_text(json.dumps(hand_built_manifest()))
    report = build_package(run, target)  # given in the run's copy, as the message says
    assert report.ok and target.is_file()


def _hive_package(path: Path, run: Path, manifest: dict, adapter_folder: str = "") -> Path:
    """A package laid out as HiveLLM's packager writes it: flat, its unset fields as null."""
    members = {"manifest.json": json.dumps(manifest).encode()}
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        members[adapter_folder + name] = (run / name).read_bytes()
    members["tokenizer.json"] = b'{"model": {"type": "BPE", "vocab": {}, "merges": []}}'
    return write_tar_gz(path, members)


def test_check_and_train_name_what_only_the_author_gives_before_training(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """`package` asked for description, capabilities and constraints only after training;
    what it writes from the run (all-linear, warmup_steps, 32.0, a missing training.config or
    adapter entry, a second base model it drops) is not asked for."""
    demo = json.loads((EXPERTS / "demo" / "manifest.json").read_text())
    plan = {**RESOLVED, "target_modules": "all-linear", "dropout": 0.05}
    assert loader_problems(demo) and author_notes(demo, plan) == []  # the run writes the rest
    for change in (
        lambda m: m["training"].pop("config"),
        lambda m: m["base_models"][0].pop("adapters"),
        lambda m: m["base_models"][0]["adapters"][0].pop("type"),
        lambda m: m["base_models"].append({"name": "x", "adapters": [{"type": 5}]}),
    ):
        changed = copy.deepcopy(demo)
        change(changed)
        assert author_notes(changed, plan) == []
    del demo["description"], demo["capabilities"]
    demo["base_models"][0]["adapters"][0]["alpha"] = 32.0
    demo["soft_prompts"] = [{"name": "s", "path": "s.bin"}]
    demo["training"]["config"]["activation_checkpointing"] = True  # valid here, not there
    assert author_notes(demo, plan) == [
        "package: HiveLLM's loader would refuse description, capabilities, "
        "training.config.activation_checkpointing and soft_prompts[0].tokens (missing, or not "
        "of its form), which the run cannot write: give them in the manifest before "
        "`expert-cli package`, which stops on them"
    ]
    del demo["soft_prompts"], demo["training"]["config"]["activation_checkpointing"]
    folder = tmp_path / "demo"
    shutil.copytree(EXPERTS / "demo", folder, ignore=shutil.ignore_patterns(".cache", "output"))
    (folder / "manifest.json").write_text(json.dumps(demo))
    code, out, _ = run_main(capsys, monkeypatch, "check", "-m", str(folder / "manifest.json"))
    said = " ".join(out.split())
    assert code == 0, said
    assert "HiveLLM's loader would refuse description and capabilities (missing," in said
    # a --set is the package's too: said with it (check read the file alone)
    demo["description"], demo["capabilities"] = "d", ["a"]
    (folder / "manifest.json").write_text(json.dumps(demo))
    code, out, _ = run_main(
        capsys, monkeypatch, "check", "-m", str(folder / "manifest.json"), "--set", "capabilities=1"
    )
    assert code == 0 and "HiveLLM's loader would refuse capabilities (" in " ".join(out.split())


def test_check_package_reads_hivellms_packages_as_its_loader_does(tmp_path: Path) -> None:
    run = hand_built_run(tmp_path)
    manifest = hand_built_manifest(tags=None)
    manifest["training"]["config"] = {**RESOLVED, "method": "sft", "target_modules": ["q_proj"]}
    manifest["training"]["dataset"]["type"] = None  # serde writes an unset Option as null
    manifest["base_models"][0]["adapters"][0]["target_modules"] = ["q_proj"]
    manifest["training"]["config"]["alpha"] = 24
    theirs = verify_package(_hive_package(tmp_path / "theirs.expert", run, manifest))
    assert theirs.problems == [], theirs.problems  # it refused the nulls
    nested = verify_package(_hive_package(tmp_path / "n.expert", run, manifest, "weights/"))
    assert (
        "adapter_model.safetensors: missing at the package's root (where HiveLLM's loader "
        "looks for it)" in nested.problems
    )
    manifest["training"]["config"]["alpha"] = 24.0
    floats = verify_package(_hive_package(tmp_path / "f.expert", run, manifest))
    assert floats.problems == [
        "manifest.json: training.config.alpha: a decimal number; expected a whole number from "
        "0 to 4,294,967,295 (HiveLLM's loader refuses it)"
    ]


def test_a_damaged_weights_header_is_said_without_copying_the_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 MiB of zeros as adapter_model.safetensors packs into 64 KB; check --package copied
    all of it to a temporary file before saying its header is damaged (2 GiB: 40 s)."""
    import expert_cli.train.package_check as package_check

    copied: list[int] = []
    real = package_check.non_finite_tensors

    def spy(path: Path):
        copied.append(path.stat().st_size)
        return real(path)

    monkeypatch.setattr(package_check, "non_finite_tensors", spy)
    run = hand_built_run(tmp_path)
    (run / "adapter_model.safetensors").write_bytes(bytes(64 << 20))
    report = verify_package(_hive_package(tmp_path / "z.expert", run, hand_built_manifest()))
    assert any("adapter_model.safetensors is damaged" in p for p in report.problems)
    assert copied == [0]
