"""The attention probe: a base model that lets a position see later tokens (an encoder), or
lets packed examples see each other (OPT, Bloom, Falcon, MPT), is refused before it trains;
every decoder the tests can build is verified, and the probe leaves the model as it found it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as T
from packaging.version import Version
from train_helpers import run_here, write_expert

from expert_cli.train.architecture import encoder_problem, meta_model
from expert_cli.train.causality import (
    ISOLATED,
    PACKED_LEAK,
    SEES_FUTURE,
    attention_isolation,
    copy_isolation,
    isolation_problem,
)

VOCAB = 4096  # the tiny tokenizer's 4003 ids fit
# transformers 5.24 builds Falcon's mask from the position ids too: packed examples are kept
# apart (5.23 let them attend to each other). The probe reports what the installed one does.
FALCON_PACKED = ISOLATED if Version(T.__version__).release >= (5, 24) else PACKED_LEAK
SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def configs() -> dict[str, Any]:
    return {
        "qwen3": T.Qwen3Config(**SMALL, head_dim=16),
        "llama": T.LlamaConfig(**SMALL),
        "gemma3": T.Gemma3TextConfig(**SMALL, head_dim=16),
        "gpt2": T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4),
        "opt": T.OPTConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=64,
        ),
        "bloom": T.BloomConfig(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4),
        "mpt": T.MptConfig(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4),
        "falcon": T.FalconConfig(
            vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4
        ),
        "bert": T.BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
        ),
    }


def build(name: str, attn: str = "eager", dtype: torch.dtype = torch.float32) -> Any:
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(configs()[name], attn_implementation=attn)
    return model.to(dtype).train()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("name", "attn", "packed", "alone"),
    [
        ("qwen3", "sdpa", ISOLATED, ISOLATED),
        ("qwen3", "eager", ISOLATED, ISOLATED),
        ("llama", "sdpa", ISOLATED, ISOLATED),
        ("gemma3", "eager", ISOLATED, ISOLATED),
        ("gpt2", "sdpa", ISOLATED, ISOLATED),
        ("opt", "sdpa", PACKED_LEAK, ISOLATED),
        ("falcon", "eager", FALCON_PACKED, ISOLATED),
        ("mpt", "eager", PACKED_LEAK, ISOLATED),
        ("bert", "eager", SEES_FUTURE, SEES_FUTURE),
    ],
)
def test_verdicts(name: str, attn: str, packed: str, alone: str, dtype: torch.dtype) -> None:
    """Each verdict in fp32 and in bf16 (a GPU run's weights; the half-precision margin), and
    the model as it was after: weights, every module's mode, kernel, the global RNG."""
    model = build(name, attn, dtype)
    model.get_output_embeddings().eval()  # a module in another mode than the root stays so
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert attention_isolation(model, attn, packing=True) == packed
    assert attention_isolation(model, attn, packing=False) == alone
    assert model.training and not model.get_output_embeddings().training
    assert model.config._attn_implementation == attn
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(
    ("name", "attn", "verdict"),
    [
        ("qwen3", "sdpa", ISOLATED),
        ("gpt2", "flex_attention", ISOLATED),
        ("opt", "sdpa", PACKED_LEAK),
        ("bloom", "sdpa", PACKED_LEAK),  # takes no sdpa: eager, as a run falls back
        ("mpt", "eager", PACKED_LEAK),
        ("falcon", "sdpa", FALCON_PACKED),
        ("bert", "eager", SEES_FUTURE),
    ],
)
def test_a_one_layer_copy_gives_the_loaded_models_verdict(
    name: str, attn: str, verdict: str
) -> None:
    """What `check` and `train` say before any weight is read; the config and the global
    random state are left as they were."""
    config = configs()[name]
    before, rng = config.to_dict(), torch.get_rng_state()
    assert copy_isolation(config, attn, packing=True) == verdict
    assert config.to_dict() == before and torch.equal(torch.get_rng_state(), rng)


def test_a_copy_is_not_built_where_it_cannot_tell() -> None:
    big = T.LlamaConfig(
        vocab_size=128_256,
        hidden_size=8192,
        intermediate_size=28_672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
    )  # one layer: 150M parameters
    assert copy_isolation(big, "sdpa", packing=True).endswith("too large to build here")
    gpu = copy_isolation(configs()["opt"], "flash_attention_2", packing=True)
    assert gpu == "not probed: flash_attention_2 runs on a GPU only"


def test_int8_weights_are_not_probed() -> None:
    """LLM.int8 mixes tokens in each matmul (outlier columns over all of them), so its own
    effect would read as a leak: such a model is said to be not probed, not refused."""
    model = build("qwen3")
    model.is_loaded_in_8bit = True  # what transformers sets on a model loaded in 8 bits
    assert attention_isolation(model, "sdpa", packing=True).startswith("not probed: int8")


def test_flex_is_probed_through_sdpa_masks_and_put_back() -> None:
    """flex compiles for every new shape (45 s on this CPU): the probe reads the sdpa mask
    that the same positions build, and leaves the model on flex."""
    model = build("qwen3", "flex_attention")
    assert attention_isolation(model, "flex_attention", packing=True) == ISOLATED
    assert model.config._attn_implementation == "flex_attention"
    leaky = build("opt", "sdpa")
    assert attention_isolation(leaky, "flex_attention", packing=True) == PACKED_LEAK
    assert leaky.config._attn_implementation == "flex_attention"


def test_a_small_leak_is_found_in_fp32_and_not_below_rounding_in_bf16() -> None:
    """Bloom's random init leaks little (ALiBi, nearly uniform attention): 0.5% of what the
    probe's own tokens move, found with fp32's 1e-4 margin; in bf16 it is under the 1e-2 margin
    kept for kernels that round differently, and passes. A pretrained Bloom attends far more
    sharply (docs/training.md says so)."""
    assert attention_isolation(build("bloom"), "eager", packing=True) == PACKED_LEAK
    half = build("bloom", dtype=torch.bfloat16)
    assert attention_isolation(half, "eager", packing=True) == ISOLATED


def test_weights_not_here_are_not_probed() -> None:
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(configs()["opt"])
    assert attention_isolation(model, "sdpa", packing=True).startswith("not probed: weights")


def test_messages_name_the_model_and_what_to_change() -> None:
    leak = isolation_problem(PACKED_LEAK, build("opt"), "/m/opt", "sdpa")
    assert leak is not None
    assert "/m/opt (model type opt)" in leak and "training.config.packing to false" in leak
    encoder = isolation_problem(SEES_FUTURE, build("bert"), "/m/bert", "eager")
    assert encoder is not None and "(model type bert)" in encoder and "decoder-only" in encoder
    assert isolation_problem(ISOLATED, build("qwen3"), "/m/q", "sdpa") is None
    assert isolation_problem("not probed: x", build("qwen3"), "/m/q", "sdpa") is None


@pytest.mark.parametrize(("name", "encoder"), [("bert", True), ("qwen3", False), ("gpt2", False)])
def test_encoders_are_found_without_weights(name: str, encoder: bool) -> None:
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(configs()[name])
    problem = encoder_problem(model, "/m/x")
    assert (problem is not None) == encoder
    if encoder:
        assert problem is not None and "every position attends to the tokens after it" in problem


def test_a_bert_switched_to_decoder_is_not_an_encoder() -> None:
    config = configs()["bert"]
    config.is_decoder = True
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(config)
    assert encoder_problem(model, "/m/x") is None
    assert attention_isolation(
        T.AutoModelForCausalLM.from_config(config), "eager", packing=False
    ) == (ISOLATED)


def save_model(folder: Path, model: Any, tokenizer_dir: Path) -> Path:
    model.save_pretrained(folder)
    T.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    return folder


def test_t5_is_named_as_an_encoder_decoder(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    config = T.T5Config(vocab_size=VOCAB, d_model=64, d_ff=128, num_layers=2, num_heads=4)
    folder = tmp_path / "t5"
    config.save_pretrained(folder)
    manifest = write_expert(tmp_path / "expert", folder)
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import probe_environment
    from expert_cli.config.resolve import resolve

    resolved = resolve(load_manifest(manifest), probe_environment())
    model, problem = meta_model(resolved, str(folder))
    assert model is None and problem is not None
    assert "(model type t5): an encoder-decoder model" in problem and "sizes" not in problem


def test_train_refuses_an_encoder_before_tokenizing(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    folder = save_model(tmp_path / "bert", build("bert"), tiny_tokenizer_dir)
    manifest = write_expert(tmp_path / "expert", folder)
    check = run_here("check", "--manifest", str(manifest))
    assert "(model type bert): every position attends" in check.stdout
    assert "manifest is not usable" in check.stdout
    proc = run_here("train", "--manifest", str(manifest))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "(model type bert): every position attends" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in manifest.parent.iterdir()) == ["data", "manifest.json"]


def test_train_refuses_packing_where_examples_would_see_each_other(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """OPT is refused by check and by train before its data is tokenized (the probe on a
    one-layer copy), naming the field; with packing off the same model trains, and the run
    records the probe of the loaded model."""
    folder = save_model(tmp_path / "opt", build("opt"), tiny_tokenizer_dir)
    manifest = write_expert(tmp_path / "expert", folder, rows=16)
    check = run_here("check", "--manifest", str(manifest))
    assert check.returncode == 2, check.stdout + check.stderr
    assert "(model type opt): with packing on" in " ".join(check.stdout.split())
    assert "manifest is not usable" in check.stdout
    proc = run_here("train", "--manifest", str(manifest), "--max-steps", "1")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert "(model type opt): with packing on" in text
    assert "training.config.packing to false" in text and "Traceback" not in text
    assert "tokenizing" not in text  # refused before the data was read
    assert not (manifest.parent / "output").exists()
    assert not (manifest.parent / ".cache").exists()

    data = json.loads(manifest.read_text())
    data["training"]["config"]["packing"] = False
    manifest.write_text(json.dumps(data))
    proc = run_here("train", "--manifest", str(manifest), "--max-steps", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "attention sdpa (causal: checked)" in proc.stdout
    resolved = json.loads((manifest.parent / "output" / "manifest.resolved.json").read_text())
    assert resolved["runtime"]["model"]["attention_isolation"] == ISOLATED


def test_one_process_keeps_its_own_verdict() -> None:
    from expert_cli.train.causality import agreed

    for verdict in (ISOLATED, PACKED_LEAK, SEES_FUTURE, "not probed: x"):
        assert agreed(verdict) == verdict


AGREE = """
import sys
import torch.distributed as dist
dist.init_process_group("gloo")
from expert_cli.train.causality import agreed
print(agreed(sys.argv[1]), flush=True)
dist.barrier()  # both past the collective before either tears gloo down (a peer gone first
dist.destroy_process_group()  # aborted the other now and then: "terminate called ...")
"""


@pytest.mark.slow
def test_every_process_stops_where_one_would(tmp_path: Path) -> None:
    """Two gloo processes: the one that could not probe (its weights on the meta device)
    takes the leak the other found, so neither waits for the other at the next collective."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank, verdict in enumerate(("not probed: weights not loaded on this rank", PACKED_LEAK)):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "2",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", AGREE, verdict], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [PACKED_LEAK, PACKED_LEAK]
