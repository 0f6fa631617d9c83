"""A base model's files judged before anything loads (data/model_files.py), in a local folder
and in a hub cache snapshot: each case below passed `check` ("usable") and then stopped
`train` with a traceback, or only after the data was tokenized, or trained on weights that
started random (a shard the index misplaces)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import TINY_SIZES, run_main, write_expert

from expert_cli.data.hub import HubRef, cached
from expert_cli.data.model_files import base_file_problems

LFS = "version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 1234567\n"
SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny base saved in three safetensors shards with their index."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("sharded")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.save_pretrained(out, max_shard_size="200KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    assert sorted(p.name for p in out.glob("model-*"))[:2] == SHARDS
    return out


def _copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, symlinks=True)
    return dest


def _index(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def _problems(folder: Path) -> list[str]:
    prefix = f"base model {folder}: "
    lines = base_file_problems(str(folder), "local")
    assert all(line.startswith(prefix) for line in lines), lines
    return [line.removeprefix(prefix) for line in lines]


def test_a_sharded_checkpoint_is_judged_by_its_index(sharded: Path, tmp_path: Path) -> None:
    assert _problems(sharded) == []
    missing = _copy(sharded, tmp_path / "missing")
    (missing / SHARDS[1]).unlink()
    assert _problems(missing) == [
        f"model.safetensors.index.json: names 1 file that is not there ({SHARDS[1]})"
    ]
    no_index = _copy(sharded, tmp_path / "no-index")
    (no_index / "model.safetensors.index.json").unlink()
    assert _problems(no_index) == [
        f"has shards ({SHARDS[0]}, {SHARDS[1]}, ...) but not model.safetensors.index.json, "
        "the index they are loaded by: download it too"
    ]
    # an entry naming another shard, or one no shard holds: transformers reads the names
    # from the shards themselves and loads the model all the same, so nothing is said
    stale = _copy(sharded, tmp_path / "stale")
    index = _index(stale)
    name = "model.embed_tokens.weight"
    held = index["weight_map"][name]
    index["weight_map"][name] = next(s for s in SHARDS if s != held)
    index["weight_map"]["model.mtp.0.weight"] = SHARDS[0]
    (stale / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _problems(stale) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"weight_map": {', "not JSON at line 1; download or copy it again"),
        (
            '{"weight_map": [1, 2]}',
            "not a weights index (a weight_map of tensor names to file names)",
        ),
        (
            '{"weight_map": {"a": "../../elsewhere/model.safetensors"}}',
            "names a file outside the model's folder (<a 33-character name>)",
        ),
    ],
)
def test_an_index_that_is_not_one_is_named(
    sharded: Path, tmp_path: Path, text: str, expected: str
) -> None:
    folder = _copy(sharded, tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text(text)
    assert _problems(folder) == [f"model.safetensors.index.json: {expected}"]


def test_files_in_place_of_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An LFS pointer (a clone without git-lfs), GGUF alone, a .bin cut short or holding
    other objects than tensors (weights_only refuses it: the loader's message quoted the
    pickle's globals), a refused generation_config.json."""
    from safetensors.torch import load_file

    lfs = _copy(tiny_model_dir, tmp_path / "lfs")
    (lfs / "model.safetensors").write_text(LFS)
    (lfs / "tokenizer.json").write_text(LFS)
    pointer = "is a Git LFS pointer, not the file: fetch the files with `git lfs pull`"
    assert [line.split(" in the model")[0] for line in _problems(lfs)] == [
        f"model.safetensors {pointer}",
        f"tokenizer.json {pointer}",
    ]
    gguf = _copy(tiny_model_dir, tmp_path / "gguf")
    (gguf / "model.safetensors").rename(gguf / "model-q4.gguf")
    assert _problems(gguf) == [
        "holds GGUF weights only (model-q4.gguf), which expert-cli does not train on: use the "
        "model's safetensors release (model.safetensors)"
    ]
    tensors = load_file(tiny_model_dir / "model.safetensors")
    cut = _copy(tiny_model_dir, tmp_path / "cut")
    (cut / "model.safetensors").unlink()
    torch.save(tensors, cut / "pytorch_model.bin")
    assert _problems(cut) == []  # a whole .bin loads
    data = (cut / "pytorch_model.bin").read_bytes()
    (cut / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    assert _problems(cut) == [
        "pytorch_model.bin is damaged (cut short or broken); download or copy it again"
    ]
    pickled = _copy(cut, tmp_path / "pickled")
    torch.save({"note": Path("x"), **tensors}, pickled / "pytorch_model.bin")
    assert _problems(pickled) == [
        "pytorch_model.bin holds objects other than tensors, which torch does not load "
        "(weights_only); use the model's safetensors weights"
    ]
    unused = _copy(tiny_model_dir, tmp_path / "unused")  # another framework's weights as
    (unused / "tf_model.h5").write_text(LFS)  # pointers (git lfs pull -I model.safetensors)
    (unused / "flax_model.msgpack").write_text(LFS)
    assert _problems(unused) == []
    generation = _copy(tiny_model_dir, tmp_path / "generation")
    (generation / "generation_config.json").write_text('{"max_new_tokens": 0}')
    assert _problems(generation) == [
        "generation_config.json is refused by transformers (ValueError: a value out of its "
        "bounds or of the wrong type); fix or remove the file"
    ]
    not_json = (  # transformers passes it over: the base's stops were lost in silence
        "generation_config.json is not JSON: transformers would pass it over, and the expert "
        "would decode without the base's sampling values and stops; fix or remove the file"
    )
    (generation / "generation_config.json").write_text('{"eos_token_id": [1, SECRET')
    assert _problems(generation) == [not_json]
    (generation / "model.safetensors").unlink()  # a random init reads it too, weights or not
    assert base_file_problems(str(generation), "local", init="random") == [
        f"base model {generation}: {not_json}"
    ]


def _snapshot_cache(hub: Path, repo: str, source: Path, ref: str | None = "a" * 40) -> Path:
    """`source` laid out as the hub library caches it: blobs, links in a snapshot, refs."""
    root = hub / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (root / "blobs").mkdir()
    for i, path in enumerate(sorted(source.iterdir())):
        shutil.copy(path, root / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / path.name)
    if ref is not None:
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text(ref)
    return snap


def test_a_hub_snapshot_is_judged_as_the_loader_finds_it(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """A weights or tokenizer blob deleted (a link to nothing) is named; a refs/main naming
    a snapshot that is not there, or no refs at all, is not in the cache (it was "in the
    local cache" to check, and train said it could not connect)."""
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing will be downloaded: judged whole
    snap = _snapshot_cache(hub, "org/good", tiny_model_dir)
    assert base_file_problems("org/good", "hub") == []
    (snap / "model.safetensors").resolve().unlink()
    (snap / "tokenizer.json").resolve().unlink()
    assert base_file_problems("org/good", "hub") == [
        "base model org/good: model.safetensors is a link to a file that is not there (a "
        "download not finished?)",
        "base model org/good: tokenizer.json is a link to a file that is not there",
    ]
    # with the hub on, what is not there yet is downloaded as the model loads: a snapshot
    # holding config and tokenizer alone (the tokenizer's download) is not refused
    for name in ("OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    assert base_file_problems("org/good", "hub") == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _snapshot_cache(hub, "org/badref", tiny_model_dir, ref="b" * 40)
    _snapshot_cache(hub, "org/noref", tiny_model_dir, ref=None)
    roots = {"hub": hub, "datasets": tmp_path / "datasets"}
    for repo in ("org/badref", "org/noref"):
        assert cached(HubRef("model", repo, None, "base_models[0].name"), roots) is None
        assert base_file_problems(repo, "hub") == []  # said by the hub checks
    assert cached(HubRef("model", "org/good", None, "base_models[0].name"), roots) is not None


def test_check_and_train_stop_before_tokenizing(
    capsys, monkeypatch, sharded: Path, tmp_path: Path
) -> None:
    base = _copy(sharded, tmp_path / "base")
    (base / SHARDS[1]).unlink()
    manifest = write_expert(tmp_path / "e", base, config={"max_steps": 1})
    want = f"base model {base}: model.safetensors.index.json: names 1 file that is not there"
    for command in ("check", "train"):
        code, out, err = run_main(capsys, monkeypatch, command, "-m", str(manifest))
        assert code == 2 and want in " ".join((out + err).split()), out + err
    assert not (tmp_path / "e" / ".cache").exists() and not (tmp_path / "e" / "output").exists()


def test_a_model_the_default_kernel_does_not_serve_falls_back(
    capsys, monkeypatch, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    """Gemma 2 takes no sdpa: transformers' ValueError is how the loader says so, and the
    run goes on with the next kernel (eager). The loader's errors read as damaged files
    ("download the model again") took that away."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma2Config

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = Gemma2Config(vocab_size=4032, **TINY_SIZES, **ids)
    base = tmp_path / "gemma2"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(base)
    tokenizer.save_pretrained(base)
    manifest = write_expert(tmp_path / "e", base, config={"max_steps": 1})
    code, out, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest))
    said = " ".join((out + err).split())
    assert code == 0, out + err
    assert "attention: sdpa not supported by this model" in said
    assert "attention eager" in said
