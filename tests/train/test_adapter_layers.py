"""The layers an adapter meets on architectures beyond Qwen's: a target of a type the adapter
cannot adapt is named by its place (peft's error quoted the layer's repr; LoKr on GPT-2's
Conv1D was a traceback), IA3 on a model type peft lists no feed-forward layers for scales
down_proj at its input with a note, and the fused kernel says which layers it leaves to peft."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers as T
from peft import get_peft_model
from train_helpers import run_cli, run_main, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.train.adapter import adapter_config, adapter_notes, ia3_note, target_problem
from expert_cli.train.model import attach_adapter

GPT2 = {"n_positions": 128, "n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 4096}


def _resolved(tmp_path: Path, model: str, **config: object):
    manifest = write_expert(tmp_path / "e", Path(model), rows=8, config=config)
    return resolve(load_manifest(manifest), cpu_environment())


def _on_meta(config: T.PretrainedConfig):
    with torch.device("meta"):
        return T.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"target_modules": ["ln_f", "c_attn"]},
            "adapter (lora): target_modules[0] names LayerNorm layers, which lora cannot adapt "
            "(it adapts Linear, Embedding, Conv1d, Conv2d, Conv3d, Conv1D, MultiheadAttention)",
        ),
        (
            {"target_modules": ["c_attn", "mlp"], "adapter_type": "lokr"},
            "adapter (lokr): target_modules[0] names Conv1D layers, which lokr cannot adapt; "
            "target_modules[1] names GPT2MLP layers, which lokr cannot adapt (it adapts Linear, "
            "Conv1d, Conv2d)",
        ),
        (
            {"target_modules": "all-linear", "adapter_type": "lokr"},
            "adapter (lokr): target_modules all-linear picks the model's Conv1D layers, which "
            "lokr cannot adapt (it adapts Linear, Conv1d, Conv2d): use lora, dora, ia3 or "
            "adalora, or name its other layers",
        ),
        ({"target_modules": "all-linear", "adapter_type": "ia3"}, None),
        ({"target_modules": ["c_attn", "wte"]}, None),  # LoRA adapts embeddings
        ({"target_modules": ["c_fc"], "adapter_type": "dora"}, None),
    ],
)
def test_a_target_of_a_type_the_adapter_cannot_adapt_is_named(
    tmp_path: Path, config: dict, expected: str | None
) -> None:
    resolved = _resolved(tmp_path, "gpt2", **config)
    model = _on_meta(T.GPT2Config(**GPT2))
    assert target_problem(model, resolved) == expected
    if expected is None:  # what passes the check, peft attaches
        get_peft_model(model, adapter_config(resolved, 4, "gpt2"))


def test_check_and_train_refuse_lokr_on_conv1d_in_one_line(
    capsys, monkeypatch, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    model = tmp_path / "gpt2"
    shutil.copytree(tiny_tokenizer_dir, model)
    T.GPT2Config(**GPT2).save_pretrained(model)
    manifest = write_expert(
        tmp_path / "e", model, config={"adapter_type": "lokr"}, base={"init": "random"}
    )
    for command in ("check", "train"):
        code, out, err = run_main(capsys, monkeypatch, command, "--manifest", str(manifest))
        said = " ".join((out + err).split())
        assert code == 2, said
        assert "all-linear picks the model's Conv1D layers, which lokr cannot adapt" in said
        assert "Traceback" not in said
    assert not (tmp_path / "e" / "output").exists()


def _tiny(config_class: type, **extra: object) -> T.PreTrainedModel:
    config = config_class(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        **extra,
    )
    return T.AutoModelForCausalLM.from_config(config)


def test_ia3_scales_down_proj_at_its_input_where_peft_names_no_feed_forward_layers(
    tmp_path: Path,
) -> None:
    resolved = _resolved(tmp_path, "olmo", adapter_type="ia3")
    model = attach_adapter(_tiny(T.Olmo2Config), resolved, 4)
    layer = model.base_model.model.model.layers[0]
    assert layer.mlp.down_proj.is_feedforward
    assert tuple(layer.mlp.down_proj.ia3_l["default"].shape) == (1, 64)  # its input: scaled
    assert not layer.mlp.up_proj.is_feedforward
    assert adapter_notes(model, resolved) == [
        "adapter_type: ia3: peft names no feed-forward layers for this model type; its 1 "
        "down_proj layers are scaled at their input, as IA3 scales feed-forward layers "
        "(feedforward_modules names others)"
    ]
    assert ia3_note(model, resolved, "qwen3") is None  # a type peft lists


def test_ia3_with_no_feed_forward_layer_targeted_says_so(tmp_path: Path) -> None:
    resolved = _resolved(tmp_path, "olmo", adapter_type="ia3", target_modules=["q_proj"])
    model = attach_adapter(_tiny(T.Olmo2Config), resolved, 4)
    assert adapter_notes(model, resolved) == [
        "adapter_type: ia3: peft names no feed-forward layers for this model type and no "
        "target is a down_proj: every target is scaled at its output; name the feed-forward "
        "output layers in training.config.feedforward_modules"
    ]
    named = _resolved(tmp_path, "olmo", adapter_type="ia3", feedforward_modules=["down_proj"])
    assert adapter_notes(attach_adapter(_tiny(T.Olmo2Config), named, 4), named) == []


def test_the_fused_kernel_names_the_layers_it_leaves_to_peft(tmp_path: Path) -> None:
    resolved = _resolved(tmp_path, "gpt2", adapter_kernel="fused")
    model = attach_adapter(T.AutoModelForCausalLM.from_config(T.GPT2Config(**GPT2)), resolved, 4)
    said = [
        "adapter_kernel: fused runs LoRA and DoRA on nn.Linear layers; the adapters of the "
        "model's 4 Conv1D layers run peft's own"
    ]
    assert adapter_notes(model, resolved) == said
    qwen = _tiny(T.Qwen3Config, head_dim=16)
    assert adapter_notes(attach_adapter(qwen, resolved, 4), resolved) == []  # all fused
    dora = _resolved(tmp_path, "gpt2", adapter_kernel="fused", adapter_type="dora")
    gpt2 = T.AutoModelForCausalLM.from_config(T.GPT2Config(**GPT2))
    assert adapter_notes(attach_adapter(gpt2, dora, 4), dora) == said  # DoRA is fused too
    ia3 = _resolved(tmp_path, "gpt2", adapter_kernel="fused", adapter_type="ia3")
    gpt2 = T.AutoModelForCausalLM.from_config(T.GPT2Config(**GPT2))
    assert adapter_notes(attach_adapter(gpt2, ia3, 4), ia3) == []  # said in the config's note


def test_a_gpt2_run_shows_no_library_advice_on_the_console(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """peft's Conv1D layout switch, transformers' attention-mask advice and its unknown loss
    type reached the console of every GPT-2 run; none is something a user can act on."""
    model = tmp_path / "gpt2"
    shutil.copytree(tiny_tokenizer_dir, model)
    T.GPT2Config(**GPT2, bos_token_id=4000, eos_token_id=4000).save_pretrained(model)
    manifest = write_expert(
        tmp_path / "e",
        model,
        config={"max_steps": 2, "adapter_kernel": "fused"},
        base={"init": "random"},
        rows=16,
    )
    done = run_cli("train", "--manifest", str(manifest))
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, said
    assert "completed 2 steps" in said
    assert "the adapters of the model's 4 Conv1D layers run peft's own" in said
    for advice in ("fan_in_fan_out", "attention_mask", "loss_type", "Warning"):
        assert advice not in said
