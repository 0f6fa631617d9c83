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

from expert_cli.train.model_card import CardFacts, hub_id, model_card


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
    assert f"train loss at step 4: {metrics['summary']['final_loss']:.4g}" in body
    assert f"eval loss of the adapter here, final (step 4): {last['eval_loss']:.4g}" in body
    assert f"token accuracy: {last['token_accuracy']:.1%}" in body
    projections = "down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
    assert f"| adapter (as shipped) | LoRA r 8, alpha 16 on {projections} |" in body
    assert "| the run's optimizer steps | 4 |" in body and "| length | max_steps 4 |" in body
    assert "| data | 64 training examples" in body and "8 held out for evaluation |" in body
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


def _facts(**given) -> CardFacts:
    manifest = {
        "name": "x",
        "version": "1.0.0",
        "base_models": [{"name": "Qwen/Qwen3-0.6B", "adapters": [{"type": "lora"}]}],
        "tags": ["a", "lora", "a"],
    }
    config = {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}
    resolved = {"base_model_kind": "hub", "adapter_type": "lora", "rank": 16, "alpha": 32.0}
    metrics = {
        "summary": {"final_loss": 1.0, "steps": 9},
        "windows": [{"step": 4, "loss": 1.23456}, {"step": 9, "loss": 1.0}],
        "evals": [
            {"step": 4, "eval_loss": 2.5, "token_accuracy": 0.5,
             "tasks": {"sql": {"eval_loss": 2.25, "token_accuracy": 0.25}}},
            {"step": 9, "eval_loss": 2.0},
        ],
    }  # fmt: skip
    facts = {"manifest": manifest, "config": config, "resolved": resolved, "metrics": metrics}
    return CardFacts(**{**facts, "step": 4, **given})


def _meta(text: str) -> dict:
    return yaml.safe_load(text.split("---\n")[1])


def test_the_card_names_a_hub_base_its_datasets_and_the_adapters_own_step() -> None:
    resolved = _facts().resolved | {
        "train_sources": [
            {"kind": "hub", "location": "org/data"},
            {"kind": "local", "location": "/data/x.jsonl"},
            {"kind": "hub", "location": "org/data"},
        ],
    }
    text, notes = model_card(_facts(resolved=resolved))
    meta = _meta(text)
    assert meta["base_model"] == "Qwen/Qwen3-0.6B" and notes == []
    assert meta["tags"][-2:] == ["base_model:adapter:Qwen/Qwen3-0.6B", "a"]  # said once
    assert meta["datasets"] == ["org/data"]
    assert "[Qwen/Qwen3-0.6B](https://huggingface.co/Qwen/Qwen3-0.6B)" in text
    # the adapter holds step 4: its train loss and evaluation, not the run's last
    assert "train loss at step 4: 1.235" in text
    assert "eval loss of the adapter here, final (step 4): 2.5" in text
    assert "- task `sql`: eval loss 2.25, token accuracy 25.0%" in text
    assert "step 9" not in text
    text, _ = model_card(_facts(step=7))
    assert "(step 7) was not evaluated at its step" in text and "eval loss of" not in text
    # a hub-looking name the run loaded as a local folder is no hub base
    local = _facts(resolved=_facts().resolved | {"base_model_kind": "local"})
    assert "base_model" not in _meta(model_card(local)[0])


def test_the_card_describes_the_adapter_as_shipped() -> None:
    """A PiSSA run ships a LoRA of twice its rank and alpha; rsLoRA ships folded."""
    resolved = _facts().resolved | {"init_lora_weights": "pissa"}
    config = _facts().config | {"r": 32, "lora_alpha": 64}
    text, _ = model_card(_facts(resolved=resolved, config=config))
    assert "| adapter (as shipped) | LoRA r 32, alpha 64 on q_proj |" in text
    assert "| trained as | pissa at r 16: shipped as the same update" in text
    text, _ = model_card(_facts(resolved=_facts().resolved | {"use_rslora": True}))
    assert "| trained as | rsLoRA (alpha / sqrt(r)): sqrt(r) is folded into lora_B" in text
    text, _ = model_card(_facts(config={"peft_type": "IA3", "target_modules": ["k_proj"]}))
    assert "An IA3 adapter" in text and "| adapter (as shipped) | IA3 on k_proj |" in text
    assert "convert_lora_to_gguf" not in text  # llama.cpp applies LoRA only
    assert _meta(text)["tags"][:3] == ["expert-cli", "hivellm", "peft"]  # no lora of ours


def test_the_cards_license_and_metadata_read_as_the_hub_reads_them() -> None:
    for given, want in (
        ("Apache 2.0", "apache-2.0"),
        ("Apache License, Version 2.0", "apache-2.0"),
        ("MIT", "mit"),
        ("GPL-3.0-only", "gpl-3.0"),
        ("CC-BY-NC-ND-4.0", "cc-by-nc-nd-4.0"),
    ):
        manifest = _facts().manifest | {"license": given}
        text, notes = model_card(_facts(manifest=manifest))
        assert _meta(text)["license"] == want and notes == []
    manifest = _facts().manifest | {"license": "Our Own Terms v2", "tags": ["bad\x7f", "ok"]}
    text, notes = model_card(_facts(manifest=manifest, files={"LICENSE"}))
    meta = _meta(text)  # a DEL in a tag made the block unreadable: such a tag is left out
    assert meta["license"] == "other" and meta["license_name"] == "our-own-terms-v2"
    assert meta["license_link"] == "LICENSE" and meta["tags"][-2:] == [
        "base_model:adapter:Qwen/Qwen3-0.6B",
        "ok",
    ]
    assert "license: not one of the Hub's license ids" in notes[0]
    for readme in ("\ufeff---\nlicense: mit\n---\nBody.\n", "---\n---\nBody.\n"):
        text, notes = model_card(_facts(readme=readme))
        assert "\nBody.\n" in text and "license: mit" not in text.split("---\n", 2)[2]
    assert len(model_card(_facts(readme="\ufeff---\nlicense: mit\n---\nBody.\n"))[1]) == 1


def test_a_damaged_record_leaves_its_lines_out() -> None:
    text, _ = model_card(_facts(metrics={"windows": 5, "evals": True, "summary": {}}))
    assert "was not evaluated" in text
    metrics = {"summary": [], "windows": "x", "evals": [{"step": 4, "tasks": [], "eval_loss": "1"}]}
    resolved = {"learning_rate": "0.002", "train_sources": 5, "runtime": [], "batch_size": True}
    text, _ = model_card(_facts(metrics=metrics, resolved=resolved, config={"r": "x"}))
    assert "## Results" in text and "learning rate" not in text and "eval loss" not in text


def test_hub_ids() -> None:
    for name, want in (
        ("Qwen/Qwen3-0.6B", True),
        ("me/expert_sql.v2", True),
        ("./model", False),
        ("/abs/path", False),
        ("model", False),
        ("a/b/c", False),
        ("~/x", False),
        ("a/..", False),
        ("a--b/c", False),
        ("org/-x", False),
        ("Qwén/x", False),
        ("me/x.", False),  # the Hub's rules: a name ends with a letter, digit or _
        ("me/x-", False),
        ("me/x.git", False),
        ("me/_x", True),
        ("me/" + "a" * 96, True),
        ("me/" + "a" * 97, False),
    ):
        assert (hub_id(name) is not None) is want, name


@pytest.mark.slow
def test_the_final_adapter_is_described_at_the_step_it_holds(run: Path, tmp_path: Path) -> None:
    """With load_best_model_at_end (or a stop after the last evaluation) the final adapter is
    not the last evaluation's: the card goes by the step the run recorded."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    resolved = json.loads((copy / "manifest.resolved.json").read_text())
    resolved["runtime"]["final_step"] = 2
    (copy / "manifest.resolved.json").write_text(json.dumps(resolved))
    done = run_here("export-hub", "--adapter", str(copy), "--output", str(tmp_path / "h"))
    assert done.returncode == 0, done.stdout + done.stderr
    evals = {e["step"]: e for e in json.loads((copy / "metrics.json").read_text())["evals"]}
    _, body = _card(tmp_path / "h")
    assert f"final (step 2): {evals[2]['eval_loss']:.4g}" in body


@pytest.mark.slow
def test_not_inside_the_runs_checkpoints(run: Path) -> None:
    target = run / "checkpoints" / "checkpoint-99"
    done = run_here("export-hub", "--adapter", str(run), "--output", str(target))
    assert done.returncode == 2 and "inside the run's checkpoints/" in done.stderr
    assert not target.exists()


@pytest.mark.slow
def test_the_folder_can_carry_the_gguf_adapter(run: Path, tmp_path: Path) -> None:
    """--gguf puts export-gguf's file in the folder, byte for byte, and the card names it."""
    alone = tmp_path / "alone.gguf"
    done = run_here("export-gguf", "--adapter", str(run), "--output", str(alone))
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / "hub"
    done = run_here("export-hub", "--adapter", str(run), "--output", str(out), "--gguf", "f16")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "adapter-f16.gguf").read_bytes() == alone.read_bytes()
    _, body = _card(out)
    assert "`adapter-f16.gguf` here is the adapter as a GGUF file" in body
    assert "convert_lora_to_gguf" not in body


@pytest.mark.slow
def test_a_link_out_of_the_experts_folder_is_not_shipped(run: Path, tmp_path: Path) -> None:
    """A README or LICENSE that links outside the expert's folder (a planted link in a cloned
    expert) would publish what it points at: refused, by package too."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=abc\n")
    expert = run.parent
    (expert / "LICENSE").rename(tmp_path / "LICENSE.kept")
    (expert / "LICENSE").symlink_to(secret)
    try:
        for args in (
            ("export-hub", "--adapter", str(run), "--output", str(tmp_path / "h")),
            ("package", "--adapter", str(run), "--output", str(tmp_path / "p.expert")),
        ):
            done = run_here(*args)
            assert done.returncode == 2 and "outside the expert's folder" in done.stderr
            assert "TOKEN" not in done.stdout + done.stderr
        assert not (tmp_path / "h").exists() and not (tmp_path / "p.expert").exists()
    finally:
        (expert / "LICENSE").unlink()
        (tmp_path / "LICENSE.kept").rename(expert / "LICENSE")
