"""`expert-cli export-hub`: a run as a folder to upload to the Hugging Face Hub. The folder
must load with peft as the run's adapter does (same logits), hold nothing of the run's
checkpoints or logs, and carry a model card whose metadata the Hub reads and whose figures are
the run's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from train_helpers import load_adapter, run_here, write_expert

from expert_cli.train.model_card import hub_id, model_card


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A LoRA run of four steps with an evaluation at steps 2 and 4 and a checkpoint at each,
    an expert README and LICENSE beside its manifest."""
    folder = tmp_path_factory.mktemp("hub") / "expert"
    config = {"save_steps": 2, "evaluation_strategy": "steps", "eval_steps": 2}
    manifest = write_expert(folder, tiny_model_dir, config=config, valid_rows=8)
    data = json.loads(manifest.read_text())
    data.update(description="Answers | with SQL.", license="apache-2.0", tags=["sql", "lora"])
    manifest.write_text(json.dumps(data))
    (folder / "README.md").write_text(
        "---\nfoo: bar\n---\n## Notes by the author\nKeep it short.\n"
    )
    (folder / "LICENSE").write_text("Apache-2.0\n")
    out = folder / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _card(folder: Path) -> tuple[dict, str]:
    text = (folder / "README.md").read_text()
    _, meta, body = text.split("---\n", 2)
    return yaml.safe_load(meta), body


@pytest.mark.slow
def test_the_folder_loads_as_the_run_and_says_what_it_is(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hub"
    done = run_here("export-hub", "--adapter", str(run), "--output", str(out), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert sorted(report["files"]) == sorted(p.name for p in out.iterdir())
    assert sorted(report["files"]) == [
        "LICENSE",
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "chat_template.jinja",
        "manifest.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    # the folder's adapter is the run's: the same logits on the same base
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        want = load_adapter(run)(input_ids=ids).logits
        got = load_adapter(out)(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-6)
    meta, body = _card(out)
    assert meta["library_name"] == "peft" and meta["pipeline_tag"] == "text-generation"
    assert meta["license"] == "apache-2.0"
    assert meta["tags"] == ["expert-cli", "hivellm", "lora", "peft", "sql"]
    assert "base_model" not in meta  # a local folder is no hub id
    assert "local folder" in " ".join(report["notes"])
    metrics = json.loads((run / "metrics.json").read_text())
    last = metrics["evals"][-1]
    assert last["step"] == 4
    assert f"final train loss: {metrics['summary']['final_loss']:.4g}" in body
    assert f"eval loss of the adapter here, final (step 4): {last['eval_loss']:.4g}" in body
    assert f"token accuracy: {last['token_accuracy']:.1%}" in body
    assert "| adapter | LoRA, r 8, alpha 16 on all-linear |" in body
    assert "| optimizer steps | 4 |" in body
    assert "## Notes by the author\nKeep it short." in body and "foo: bar" not in body
    assert "Answers | with SQL." in body  # the description as written


@pytest.mark.slow
def test_a_checkpoint_is_described_at_its_step(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "hub2"
    args = ("--adapter", str(run), "--output", str(out), "--checkpoint", "checkpoint-2")
    done = run_here("export-hub", *args, "--repo-id", "me/expert-test")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hf upload me/expert-test" in done.stdout
    evals = {e["step"]: e for e in json.loads((run / "metrics.json").read_text())["evals"]}
    _, body = _card(out)
    assert f"checkpoint-2 (step 2): {evals[2]['eval_loss']:.4g}" in body
    assert 'from_pretrained("me/expert-test")' in body
    saved = run / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"
    assert (out / "adapter_model.safetensors").read_bytes() == saved.read_bytes()


@pytest.mark.slow
def test_refusals(run: Path, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    for args, words in (
        (("--output", str(busy)), "not empty"),
        (("--output", str(busy / "keep.txt")), "not a folder"),
        (("--output", str(tmp_path / "x"), "--repo-id", "../etc"), "OWNER/NAME"),
        (("--output", str(tmp_path / "y"), "--checkpoint", "checkpoint-7"), "checkpoint-7"),
    ):
        done = run_here("export-hub", "--adapter", str(run), *args)
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert (busy / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    done = run_here("export-hub", "--adapter", str(copy), "--output", str(tmp_path / "z"))
    assert done.returncode == 2 and "adapter_model.safetensors" in done.stderr
    assert not (tmp_path / "z").exists()


def test_the_card_names_a_hub_base_and_its_datasets() -> None:
    manifest = {
        "name": "x",
        "version": "1.0.0",
        "base_models": [{"name": "Qwen/Qwen3-0.6B", "adapters": [{"type": "lora"}]}],
        "tags": ["a", "lora"],
    }
    resolved = {
        "train_sources": [
            {"kind": "hub", "location": "org/data"},
            {"kind": "local", "location": "/data/x.jsonl"},
            {"kind": "hub", "location": "org/data"},
        ],
        "adapter_type": "lora",
        "rank": 16,
        "alpha": 32.0,
        "use_rslora": True,
    }
    metrics = {"summary": {"final_loss": 1.23456}, "evals": []}
    text = model_card(manifest, resolved, metrics)
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["base_model"] == "Qwen/Qwen3-0.6B"
    assert meta["tags"][-2:] == ["base_model:adapter:Qwen/Qwen3-0.6B", "a"]
    assert meta["datasets"] == ["org/data"]
    assert "[Qwen/Qwen3-0.6B](https://huggingface.co/Qwen/Qwen3-0.6B)" in text
    assert "| adapter | LoRA, r 16, alpha 32, rsLoRA |" in text
    assert "final train loss: 1.235" in text and "eval loss" not in text
    for name, want in (
        ("Qwen/Qwen3-0.6B", True),
        ("./model", False),
        ("/abs/path", False),
        ("model", False),
        ("a/b/c", False),
        ("~/x/y", False),
    ):
        assert (hub_id(name) is not None) is want, name


@pytest.mark.slow
def test_not_inside_the_runs_checkpoints(run: Path) -> None:
    target = run / "checkpoints" / "checkpoint-99"
    done = run_here("export-hub", "--adapter", str(run), "--output", str(target))
    assert done.returncode == 2 and "inside the run's checkpoints/" in done.stderr
    assert not target.exists()
