"""`expert-cli export-gguf`: a run's adapter as a GGUF LoRA adapter. What llama.cpp applies
(alpha / r x lora_b @ lora_a to each named base weight) must be, weight by weight, what peft's
merge adds to the base: checked against peft for a plain, an rsLoRA and a PiSSA run, in each
stored type; the keys llama.cpp refuses an adapter without; and what the command refuses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from train_helpers import run_here, write_expert

from expert_cli.train.gguf_export import rotary_rows

PROJECTIONS = 7  # q, k, v, o, gate, up, down in each layer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A plain LoRA run of three steps, a checkpoint at each."""
    folder = tmp_path_factory.mktemp("gguf") / "expert"
    manifest = write_expert(folder, tiny_model_dir, config={"save_steps": 1})
    out = folder / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _export(*args: str) -> tuple[int, str, str]:
    done = run_here("export-gguf", *args)
    return done.returncode, done.stdout, done.stderr


def _merged_deltas(run_dir: Path, base_dir: Path) -> dict[str, torch.Tensor]:
    """What peft's merge adds to each base weight (fp32), by the base's weight name."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    merged = PeftModel.from_pretrained(base, str(run_dir)).merge_and_unload().state_dict()
    return {k: merged[k] - before[k] for k in before if not torch.equal(merged[k], before[k])}


def _applied(path: Path, layers: int) -> tuple[dict[str, torch.Tensor], gguf.GGUFReader]:
    """What llama.cpp adds to each base weight from the file (alpha / r x B A), named back
    by the gguf package's map."""
    reader = gguf.GGUFReader(path)
    alpha = float(reader.fields["adapter.lora.alpha"].contents())
    tensors = {
        t.name: torch.from_numpy(
            gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).copy()
        )
        for t in reader.tensors
    }
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, layers)
    back = {}
    for i in range(layers):
        for hf in (
            *(f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"),
            *(f"model.layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        ):
            name = names.get_name(hf, try_suffixes=(".weight",))
            a, b = tensors.pop(f"{name}.lora_a"), tensors.pop(f"{name}.lora_b")
            back[hf] = alpha / a.shape[0] * (b @ a)
    assert tensors == {}  # nothing else in the file
    return back, reader


def _layers(base_dir: Path) -> int:
    return json.loads((base_dir / "config.json").read_text())["num_hidden_layers"]


@pytest.mark.slow
@pytest.mark.parametrize(("outtype", "tolerance"), [("f32", 1e-6), ("f16", 2e-3), ("bf16", 2e-2)])
def test_the_file_adds_what_peft_merges(
    run: Path, tiny_model_dir: Path, tmp_path: Path, outtype: str, tolerance: float
) -> None:
    path = tmp_path / f"a-{outtype}.gguf"
    code, out, err = _export("--adapter", str(run), "--output", str(path), "--outtype", outtype)
    assert code == 0, out + err
    assert f"wrote {path}" in out and "for llama.cpp's qwen3" in out and "--lora" in out
    layers = _layers(tiny_model_dir)
    applied, reader = _applied(path, layers)
    want = _merged_deltas(run, tiny_model_dir)
    assert set(applied) == set(want) and len(want) == PROJECTIONS * layers
    for name, delta in want.items():
        scale = delta.abs().max().item()
        assert scale > 0
        assert (applied[name] - delta).abs().max().item() <= tolerance * scale, name
    fields = {k: reader.fields[k].contents() for k in reader.fields if not k.startswith("GGUF.")}
    assert fields["general.type"] == "adapter" and fields["general.architecture"] == "qwen3"
    assert fields["adapter.type"] == "lora" and fields["adapter.lora.alpha"] == 16.0
    assert fields["general.name"] == "expert-test" and fields["general.version"] == "0.0.1"
    types = {t.tensor_type.name for t in reader.tensors}
    assert types == {outtype.upper()}
    # lora_a is r x in, lora_b out x r in torch's order (ggml's shape reversed)
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight.lora_a")
    assert list(q.shape) == [64, 8]


@pytest.mark.slow
def test_rslora_and_checkpoints(run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """rsLoRA's sqrt(r) goes into lora_b (llama.cpp scales by alpha / r alone), and a
    checkpoint exports its own weights."""
    copy = tmp_path / "rs"
    shutil.copytree(run, copy)
    for folder in (copy, copy / "checkpoints" / "checkpoint-2"):
        config = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
    layers = _layers(tiny_model_dir)
    for name, folder in (("final", copy), ("checkpoint-2", copy / "checkpoints" / "checkpoint-2")):
        path = tmp_path / f"{name}.gguf"
        args = ("--adapter", str(copy), "--output", str(path), "--outtype", "f32")
        code, out, err = _export(*args, "--checkpoint", name)
        assert code == 0, out + err
        applied, _ = _applied(path, layers)
        want = _merged_deltas(folder, tiny_model_dir)
        for key, delta in want.items():
            assert torch.allclose(applied[key], delta, atol=1e-6 * delta.abs().max().item()), key
    final, _ = _applied(tmp_path / "final.gguf", layers)
    second, _ = _applied(tmp_path / "checkpoint-2.gguf", layers)
    assert not torch.equal(
        final["model.layers.0.self_attn.q_proj.weight"],
        second["model.layers.0.self_attn.q_proj.weight"],
    )


@pytest.mark.slow
def test_a_pissa_run_exports_the_lora_of_the_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A PiSSA run's adapter is of the decomposed base: the file holds its LoRA of rank 2r on
    the original base, so base + the file's update is the model the run trained."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    manifest = write_expert(tmp_path / "e", tiny_model_dir, config={"init_lora_weights": "pissa"})
    out = tmp_path / "e" / "out"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    path = tmp_path / "p.gguf"
    code, text, err = _export("--adapter", str(out), "--output", str(path), "--outtype", "f32")
    assert code == 0, text + err
    applied, reader = _applied(path, _layers(tiny_model_dir))
    assert float(reader.fields["adapter.lora.alpha"].contents()) == 32.0  # 2 alpha at 2r
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in base.state_dict().items()}
    trained = PeftModel.from_pretrained(base, str(out)).merge_and_unload().state_dict()
    for name, delta in applied.items():
        want = trained[name] - original[name]
        assert torch.allclose(delta, want, atol=1e-5 * want.abs().max().item()), name
    # export-hub --gguf says it once: the card's note and the GGUF's were both printed
    done = run_here(
        "export-hub", "--adapter", str(out), "--output", str(tmp_path / "h"), "--gguf", "f32"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("the run decomposed its base") == 1, done.stdout


def test_rotary_rows_interleave_each_heads_halves() -> None:
    """llama.cpp's Llama rotates dimensions 2i and 2i+1 of a head together, transformers'
    i and i + d/2: row 2i of a head's block is its row i, row 2i+1 its row i + d/2."""
    heads, dim = 3, 8
    rows = torch.arange(heads * dim, dtype=torch.float32)[:, None].repeat(1, 2)
    out = rotary_rows(rows, heads)
    for h in range(heads):
        for i in range(dim // 2):
            assert out[h * dim + 2 * i, 0] == h * dim + i
            assert out[h * dim + 2 * i + 1, 0] == h * dim + i + dim // 2
    assert torch.equal(out[:, 0], out[:, 1])


@pytest.mark.slow
def test_refusals_leave_nothing(run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "x.gguf"
    code, out, err = _export("--adapter", str(run), "--output", str(target))
    assert code == 0, out + err
    before = target.read_bytes()
    code, out, err = _export("--adapter", str(run), "--output", str(target))
    assert code == 2 and "exists" in err and "--force" in err
    assert target.read_bytes() == before
    code, out, err = _export("--adapter", str(run), "--output", str(target), "--force")
    assert code == 0, out + err
    for bad, words in (
        (tmp_path / "x.bin", "ends in .gguf"),
        (tmp_path, "is a folder"),
    ):
        code, out, err = _export("--adapter", str(run), "--output", str(bad))
        assert code == 2 and words in err and "Traceback" not in err, err
    code, out, err = _export("--adapter", str(run / "checkpoints" / "checkpoint-1"))
    assert code == 2 and "--checkpoint checkpoint-1" in err
    code, out, err = _export("--adapter", str(run), "--checkpoint", "checkpoint-9")
    assert code == 2 and "holds no complete checkpoint-9" in err
    code, out, err = _export("--adapter", str(run), "--outtype", "q4_0")
    assert code == 2 and "q4_0" in err
    # DoRA and IA3: no form llama.cpp applies
    for kind, words in (("dora", "is DoRA"), ("ia3", "is IA3")):
        manifest = write_expert(tmp_path / kind, tiny_model_dir, config={"adapter_type": kind})
        trained = tmp_path / kind / "out"
        done = run_here("train", "-m", str(manifest), "--output", str(trained), "--max-steps", "1")
        assert done.returncode == 0, done.stdout + done.stderr
        code, out, err = _export("--adapter", str(trained))
        assert code == 2 and words in err and "expert-cli merge" in err, err
        assert not list((tmp_path / kind).glob("*.gguf*"))
    other = tmp_path / "other-base"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(
        json.dumps({**config, "architectures": ["OtherForCausalLM"]})
    )
    copy = tmp_path / "arch"
    shutil.copytree(run, copy)
    adapter = json.loads((copy / "adapter_config.json").read_text())
    adapter["base_model_name_or_path"] = str(other)
    (copy / "adapter_config.json").write_text(json.dumps(adapter))
    code, out, err = _export("--adapter", str(copy))
    assert code == 2 and "Qwen3ForCausalLM" in err and "convert_hf_to_gguf.py" in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".gguf") == ["x.gguf"]


@pytest.mark.slow
def test_what_a_hostile_user_found(run: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """Outputs inside checkpoints/ (a resumed run's rotation took them for checkpoints), the
    default name taken, a base folder gone, a live `train --resume` of the run, an alpha f32
    reads as 0, values beyond f16's range."""
    inside = run / "checkpoints" / "checkpoint-99" / "a.gguf"
    code, out, err = _export("--adapter", str(run), "--output", str(inside))
    assert code == 2 and "inside the run's checkpoints/" in err
    assert not inside.parent.exists()
    copy = tmp_path / "c" / "run"
    shutil.copytree(run, copy)
    code, out, err = _export("--adapter", str(copy))
    assert code == 0, out + err
    code, out, err = _export("--adapter", str(copy))
    assert code == 2 and "the default file" in err and "give --output" in err
    from filelock import FileLock

    with FileLock(str(copy / ".train.lock")):  # a live train of the finished run
        code, out, err = _export("--adapter", str(copy), "--output", str(tmp_path / "l.gguf"))
    assert code == 0 and "a train is writing this run now" in out, out + err
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    config = json.loads((copy / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(base)})
    )
    shutil.rmtree(base)
    code, out, err = _export("--adapter", str(copy), "--output", str(tmp_path / "g.gguf"))
    assert code == 2 and "the folder is not there" in err and "hf download" not in err, err
    (copy / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 1e-50}))
    code, out, err = _export("--adapter", str(copy), "--output", str(tmp_path / "a.gguf"))
    assert code == 2 and "one r and one alpha" in err, err
    (copy / "adapter_config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    weights = copy / "adapter_model.safetensors"
    tensors = load_file(weights)
    save_file({k: v * (1e8 if "lora_B" in k else 1e-8) for k, v in tensors.items()}, weights)
    code, out, err = _export("--adapter", str(copy), "--output", str(tmp_path / "f.gguf"))
    assert code == 2 and "beyond f16's range" in err and "--outtype bf16" in err, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["l.gguf"]


def test_a_file_put_in_place_meanwhile_is_kept(tmp_path: Path) -> None:
    """Two exports of one name: the second to finish neither replaces the first's file nor
    says it wrote; with --force it replaces it."""
    from expert_cli.errors import UserError
    from expert_cli.train.gguf_file import _place

    dest, tmp = tmp_path / "x.gguf", tmp_path / ".tmp-x.gguf-1"
    dest.write_bytes(b"first")
    tmp.write_bytes(b"second")
    with pytest.raises(UserError, match="another process"):
        _place(tmp, dest, force=False)
    assert dest.read_bytes() == b"first"
    _place(tmp, dest, force=True)
    assert dest.read_bytes() == b"second" and not tmp.exists()
    tmp.write_bytes(b"third")
    _place(tmp, tmp_path / "new.gguf", force=False)
    assert (tmp_path / "new.gguf").read_bytes() == b"third"


def test_an_interrupt_says_what_it_left(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As export-hub's (tests/train/test_package_interrupt.py): before the write, nothing
    written there; while the result is shown, the file written in full."""
    import shutil

    from train_helpers import assert_interrupts_said

    import expert_cli.train.gguf_export as gguf_export

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    assert_interrupts_said(monkeypatch, copy, gguf_export, "export-gguf")
