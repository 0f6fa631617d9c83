"""int4 QLoRA: NF4 weights through bitsandbytes, a few training steps on the CPU."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from train_helpers import run_main, window_losses, write_expert


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


def _run(capsys: Any, monkeypatch: Any, *args: str) -> tuple[int, str]:
    """`expert-cli ARGS` in this process: its exit code and all it printed, on one line."""
    code, out, err = run_main(capsys, monkeypatch, *args)
    return code, " ".join((out + err).split())


def _with_quantization_config(tiny_model_dir: Path, dest: Path, stored: dict) -> Path:
    """A copy of the tiny base whose config.json says its weights are stored quantized."""
    shutil.copytree(tiny_model_dir, dest)
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"] = stored
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _stored_4bit(tiny_model_dir: Path, dest: Path, compute: str = "bfloat16") -> Path:
    """The tiny base as a bitsandbytes 4-bit checkpoint (its config.json's
    quantization_config), as a `...-bnb-4bit` model on the hub is."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=getattr(torch, compute),
    )
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, quantization_config=quant, device_map={"": "cpu"}
    )
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(dest)
    return dest


@pytest.mark.slow
def test_a_base_stored_in_4bit_is_trained_as_int4_and_merged_dequantized(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A base stored 4-bit trained as if unquantized ("quantization none, weights float32"
    said, QLoRA's preparation skipped), and merge of its run was a NotImplementedError
    traceback from transformers' saver. The manifest must say int4; generate and merge put
    the adapter on the weights dequantized, the weights the run trained against."""
    import torch
    from safetensors import safe_open

    from expert_cli.train.merge import load_adapted

    base = _stored_4bit(tiny_model_dir, tmp_path / "bnb4")
    unset = write_expert(tmp_path / "unset", base, config={"max_steps": 2})
    for command in ("check", "train"):
        code, said = _run(capsys, monkeypatch, command, "-m", str(unset))
        assert code == 2, said
        assert (
            f"base model {base}: its weights are stored in 4-bit (bitsandbytes), but "
            'base_models[0].quantization is "none": set it to "int4"'
        ) in said
    manifest = write_expert(
        tmp_path / "e", base, config={"max_steps": 2}, base={"quantization": "int4"}
    )
    code, said = _run(capsys, monkeypatch, "train", "-m", str(manifest))
    assert code == 0, said
    run = tmp_path / "e" / "output"
    code, said = _run(
        capsys, monkeypatch, "merge", "--adapter", str(run), "--output", str(tmp_path / "m")
    )
    assert code == 0, said
    assert (
        "its weights are stored quantized; the adapter is on them dequantized to bfloat16" in said
    )
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    with safe_open(tmp_path / "m" / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    # the merged model answers as the adapter on the dequantized weights
    from transformers import AutoModelForCausalLM

    ids = torch.arange(5, 37).view(1, -1)
    adapted = load_adapted(run, str(base), torch.bfloat16).eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    with torch.no_grad():
        want, got = adapted(ids).logits.float(), merged(ids).logits.float()
    assert torch.allclose(got, want, atol=0.05, rtol=0.02), (got - want).abs().max()


def test_weights_stored_by_another_method_are_named(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    for method, named in (("gptq", "gptq"), ("fp8", "fp8"), ("secret-method", "another method")):
        stored = {"quant_method": method, "bits": 4}
        base = _with_quantization_config(tiny_model_dir, tmp_path / method, stored)
        manifest = write_expert(tmp_path / f"e-{method}", base)
        code, said = _run(capsys, monkeypatch, "check", "-m", str(manifest))
        assert code == 2, said
        assert (
            f"base model {base}: its weights are stored quantized ({named}, its config.json's "
            "quantization_config), which expert-cli does not train on"
        ) in said


@pytest.mark.slow
def test_a_4bit_config_over_full_weights_is_named(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """config.json saying bitsandbytes 4-bit over full-precision files: transformers put the
    weights in its 4-bit layers unquantized and peft failed on them (AttributeError)."""
    stored = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    base = _with_quantization_config(tiny_model_dir, tmp_path / "base", stored)
    manifest = write_expert(tmp_path / "e", base, base={"quantization": "int4"})
    code, said = _run(capsys, monkeypatch, "train", "-m", str(manifest))
    assert code == 2 and "Traceback" not in said, said
    assert (
        f"base model {base}: its config.json says its weights are stored in 4-bit "
        "(bitsandbytes), but its weights files hold full-precision weights"
    ) in said


def test_an_older_bitsandbytes_config_without_its_method_is_read_as_bitsandbytes() -> None:
    """transformers reads load_in_4bit / load_in_8bit alone as bitsandbytes: it was refused
    as "another method"."""
    from types import SimpleNamespace

    from expert_cli.train.architecture import stored_quantization_problem

    for fields, kind in (({"load_in_8bit": True}, "int8"), ({"load_in_4bit": True}, "int4")):
        config = SimpleNamespace(quantization_config=fields)
        matching = SimpleNamespace(init="pretrained", quantization=kind, base_model="b")
        assert stored_quantization_problem(matching, config) is None
        other = SimpleNamespace(init="pretrained", quantization="none", base_model="b")
        problem = stored_quantization_problem(other, config)
        assert problem is not None and f'set it to "{kind}"' in problem


def test_a_base_stored_in_4bit_computes_in_the_runs_dtype(tmp_path: Path, tiny_model_dir) -> None:
    """A base stored with float16 compute kept it: the run said "bf16 compute" while peft's
    4-bit layers computed in float16 (Qwen's large activations overflow there)."""
    import torch

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.train.model import load_base_model

    base = _stored_4bit(tiny_model_dir, tmp_path / "bnb4", compute="float16")
    manifest = write_expert(tmp_path / "e", base, base={"quantization": "int4"}, rows=8)
    model, choices = load_base_model(resolve(load_manifest(manifest), cpu_environment()), "cpu")
    layers = [m for m in model.modules() if hasattr(getattr(m, "weight", None), "quant_state")]
    assert len(layers) == 14 and choices.dtype == "nf4, bf16 compute"
    assert {m.compute_dtype for m in layers} == {torch.bfloat16}
