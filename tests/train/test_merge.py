"""`expert-cli merge`: the merged model loads with AutoModelForCausalLM and matches the adapter."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from train_helpers import load_adapter, run_here, write_expert


@pytest.mark.slow
def test_merged_model_matches_adapter_logits(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from expert_cli.errors import UserError
    from expert_cli.train.merge import merge_adapter
    from expert_cli.train.run import TrainOptions, train

    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"learning_rate": 2e-2})
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["path"] = "data"  # a data folder
    manifest.write_text(json.dumps(data))
    out = tmp_path / "out"
    train(TrainOptions(manifest=manifest, output=out, max_steps=3))
    inside = manifest.parent / "data" / "merged"  # train refuses such an output; merge did not
    with pytest.raises(UserError, match=r"is inside the run's data folder .*/e/data; the merged"):
        merge_adapter(out, inside)
    assert not inside.exists()
    from expert_cli.train.package import build_package  # package did not either (round 11)

    shipped = manifest.parent / "data" / "x.expert"
    with pytest.raises(UserError, match=r"data folder .*/e/data; the package and its .sha256"):
        build_package(out, shipped)
    assert not list((manifest.parent / "data").glob("x.expert*"))
    # nor under the run's own folders, which --overwrite sets aside whole (a merged model in
    # checkpoints/ went with them)
    for name in ("checkpoints", "base_model", "runs"):
        with pytest.raises(UserError, match=f"is inside the run's {name}/, which the run keeps"):
            merge_adapter(out, out / name / "merged")
        with pytest.raises(UserError, match=f"is inside the run's {name}/"):
            build_package(out, out / name / "x.expert")
    assert not (out / "checkpoints" / "merged").exists()
    assert not list(out.glob("*/x.expert*"))
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # as in a fresh process (train, above, turned them off)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as stderr:
            merged_dir, notes = merge_adapter(out, tmp_path / "merged")
    finally:
        hf_logging.disable_progress_bar()  # as train left them for the tests after this one
    assert stderr.getvalue() == ""  # transformers' loading and writing bars said nothing
    # the base stops at <|endoftext|> alone; the merged model at ChatML's end of turn too, and
    # at the next turn's opening, as generate does for the run's chatml prompt template
    assert notes == [
        "generation_config.json: the merged model stops at <|im_start|>, <|im_end|> too, as "
        "generate does"
    ]
    assert (merged_dir / "model.safetensors").is_file()
    assert (merged_dir / "tokenizer.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    ends = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert (
        json.loads((tiny_model_dir / "generation_config.json").read_text())["eos_token_id"]
        == ends[0]
    )
    assert json.loads((merged_dir / "generation_config.json").read_text())["eos_token_id"] == ends

    ids = torch.randint(5, 3900, (2, 24), generator=torch.Generator().manual_seed(0))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    adapter = load_adapter(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        want = adapter(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        untouched = base(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.allclose(untouched, want, atol=1e-4)  # the adapter did change something

    # a folder the user makes at --output while merge runs was deleted when it ended
    raced = tmp_path / "raced"
    load = AutoTokenizer.from_pretrained

    def made_meanwhile(*args, **kwargs):
        (raced / "mine").mkdir(parents=True)
        (raced / "mine" / "notes.txt").write_text("mine")
        return load(*args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", made_meanwhile)
    with pytest.raises(UserError, match="something was put there while merge ran; it is left"):
        merge_adapter(out, raced)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
    assert (raced / "mine" / "notes.txt").read_text() == "mine"
    assert [p.name for p in raced.iterdir()] == ["mine"]


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_an_adapter_on_tied_embeddings_merges_to_the_adapted_model(
    tmp_path: Path, tiny_model_dir: Path, target: str
) -> None:
    """The tiny model ties its input and output embeddings, as Qwen3-0.6B does. An adapter on
    one of them was merged into the shared matrix, which changed the other too."""
    import torch
    from transformers import AutoModelForCausalLM

    from expert_cli.train.merge import merge_adapter
    from expert_cli.train.run import TrainOptions, train

    config = {"learning_rate": 5e-2, "target_modules": ["q_proj", target]}
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=16, config=config)
    out = tmp_path / "out"
    train(TrainOptions(manifest=manifest, output=out, max_steps=3))
    merged_dir, _ = merge_adapter(out, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    ids = torch.randint(5, 3900, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = load_adapter(out)(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    assert merged.config.tie_word_embeddings is False
    # the adapter alone: peft's "auto" saved the base's whole matrix beside it (622 MB for
    # Qwen3-0.6B in fp32), and the FSDP save gathered frozen tensors for it
    from safetensors.torch import load_file

    saved = load_file(out / "adapter_model.safetensors")
    assert saved and all("lora_" in name for name in saved), sorted(saved)


@pytest.mark.slow
def test_merge_errors_are_clean(tmp_path: Path) -> None:
    proc = run_here("merge", "--adapter", str(tmp_path), "--output", str(tmp_path / "m"))
    assert proc.returncode == 2 and "adapter_config.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_adapter_without_weights_is_a_user_error(tmp_path: Path) -> None:
    from expert_cli.errors import UserError
    from expert_cli.train.merge import merge_adapter

    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "x"}')
    with pytest.raises(UserError, match="no adapter weights"):
        merge_adapter(tmp_path, tmp_path / "merged")


@pytest.mark.parametrize(
    ("recorded", "gone"),
    [
        ("/nowhere/models/qwen3-base", True),  # a local folder, since moved or deleted
        ("base_model", True),  # the run's own random-init base, deleted
        ("../models/base", True),
        ("~no_such_user_qq/base", True),  # was a traceback (no such home folder)
        ("Qwen/Qwen3-0.6B", False),  # a hub id: loaded from the cache or the hub
        ("gpt2", False),
    ],
)
def test_a_base_model_that_is_gone_is_named(tmp_path: Path, recorded: str, gone: bool) -> None:
    """Without this, a deleted local base was looked up on the hub under its path."""
    import json

    from expert_cli.errors import UserError
    from expert_cli.train.outputs import adapter_base

    config = {"base_model_name_or_path": recorded, "peft_type": "LORA", "r": 8, "lora_alpha": 16}
    config["target_modules"] = ["q_proj"]
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    empty = (2).to_bytes(8, "little") + b"{}"  # a whole safetensors file of no tensors
    (tmp_path / "adapter_model.safetensors").write_bytes(empty)
    if not gone:
        assert adapter_base(tmp_path) == recorded
        return
    with pytest.raises(UserError) as caught:
        adapter_base(tmp_path)
    message = " ".join(caught.value.lines)
    assert f"the base model it was trained on, {recorded}, is not there any more" in message
    assert "set base_model_name_or_path to where it is now" in message


def test_an_adapter_folder_that_is_not_there_is_named(tmp_path: Path) -> None:
    from expert_cli.errors import UserError
    from expert_cli.train.outputs import adapter_base

    with pytest.raises(UserError, match="nope: does not exist; expected the output folder"):
        adapter_base(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="file: is not a folder; expected the output folder"):
        adapter_base(tmp_path / "file")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(UserError, match=r"a: is a link loop \(a link that leads back to itself"):
        adapter_base(tmp_path / "a")
    (tmp_path / "gone").symlink_to("nowhere")
    with pytest.raises(UserError, match="gone: is a link to a path that does not exist;"):
        adapter_base(tmp_path / "gone")


def test_how_the_run_loaded_its_base_is_how_merge_and_generate_load_it(tmp_path: Path) -> None:
    """A pinned hub revision (main may be another model by now) and trust_remote_code were
    left out when merge and generate loaded the base; a quantized run's base was merged in
    float32 (twice the base's bf16 size), its dtype being no torch name."""
    import torch

    from expert_cli.train.merge import _base_options, _run_facts

    runtime = {"model": {"dtype": "nf4 + double quantization, bf16 compute"}}
    resolved = {
        "base_model": "Qwen/Qwen3-0.6B",
        "base_model_kind": "hub",
        "revision": "c1899de",
        "trust_remote_code": True,
        "quantization": "int4",
        "runtime": runtime,
    }
    (tmp_path / "manifest.resolved.json").write_text(json.dumps(resolved))
    (tmp_path / "adapter_config.json").write_text("{}")
    assert _base_options(tmp_path, "Qwen/Qwen3-0.6B") == {
        "trust_remote_code": True,
        "revision": "c1899de",
    }
    assert _base_options(tmp_path, "/elsewhere") == {"trust_remote_code": True}
    assert _run_facts(tmp_path) == ("int4", "auto")
    resolved.update(quantization=None, runtime={"model": {"dtype": "bfloat16"}})
    (tmp_path / "manifest.resolved.json").write_text(json.dumps(resolved))
    assert _run_facts(tmp_path) == (None, torch.bfloat16)


@pytest.mark.slow
def test_a_signal_during_merge_says_what_it_left(
    monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """SIGTERM while the merged model was being written ended merge with exit 143 and not a
    word (nothing was left, but the user could not know); now, as Ctrl-C does for package,
    one line saying nothing was written, and the folder is not there."""
    import signal

    from transformers import PreTrainedModel

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    run = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "completed 1 step in " in " ".join(done.stdout.split())  # it said "1 steps"
    save = PreTrainedModel.save_pretrained

    def stopped_halfway(self, folder, *args, **kwargs):  # the signal comes mid-write
        save(self, folder, *args, **kwargs)
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", stopped_halfway)
    merged = tmp_path / "merged"
    out = run_here("merge", "--adapter", str(run), "--output", str(merged))
    said = " ".join(out.stderr.split())
    assert out.returncode == 143, out.stdout + out.stderr
    assert f"before the merged model was in place: nothing written to {merged}" in said
    assert "Traceback" not in out.stderr
    assert not merged.exists() and not list(tmp_path.glob(".tmp-*"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after the command


def test_merge_saves_in_the_dtype_asked_merged_in_fp32(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A CPU run trains fp32 weights, which merge kept (twice bf16's size); `--dtype bf16`
    saves the fp32 merge cast once, and config.json says so; another value is exit 2."""
    import torch
    from safetensors.torch import load_file

    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"learning_rate": 2e-2})
    out = tmp_path / "out"
    assert run_here("train", "--manifest", str(manifest), "--output", str(out),
                    "--max-steps", "2").returncode == 0  # fmt: skip
    for name, extra in (("as_trained", []), ("half", ["--dtype", "bf16"])):
        proc = run_here("merge", "--adapter", str(out), "--output", str(tmp_path / name), *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    full = load_file(str(tmp_path / "as_trained" / "model.safetensors"))
    half = load_file(str(tmp_path / "half" / "model.safetensors"))
    assert {t.dtype for t in full.values()} == {torch.float32}
    assert {t.dtype for t in half.values()} == {torch.bfloat16}
    assert all(torch.equal(half[k], full[k].to(torch.bfloat16)) for k in full)
    assert json.loads((tmp_path / "half" / "config.json").read_text())["dtype"] == "bfloat16"
    bad = run_here("merge", "--adapter", str(out), "--output", str(tmp_path / "x"), "--dtype", "q4")
    assert bad.returncode == 2 and not (tmp_path / "x").exists()


def test_merge_to_fp16_refuses_weights_beyond_its_range(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A base weight of 99,840 (bf16 holds it, fp16's largest is 65,504) was saved as
    infinity by `--dtype fp16`, exit 0: now exit 2 naming the option, nothing written."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (weights,) = model.glob("*.safetensors")
    tensors = load_file(str(weights))
    tensors["model.layers.0.mlp.down_proj.weight"][0, 0] = 99840.0
    save_file(tensors, str(weights), metadata={"format": "pt"})
    manifest = write_expert(tmp_path / "e", model)
    out = tmp_path / "out"
    assert run_here("train", "--manifest", str(manifest), "--output", str(out),
                    "--max-steps", "1").returncode == 0  # fmt: skip
    proc = run_here(
        "merge", "--adapter", str(out), "--output", str(tmp_path / "m"), "--dtype", "fp16"
    )
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, said
    assert "--dtype fp16: 1 merged weight outside fp16's range would be saved as infinity" in said
    assert not (tmp_path / "m").exists()
    fine = run_here(
        "merge", "--adapter", str(out), "--output", str(tmp_path / "b"), "--dtype", "bf16"
    )
    assert fine.returncode == 0
