"""Shared test kit: the tiny tokenizer, a tiny random Qwen3 model, the demo expert, JSONL files.

Everything here works offline; nothing is downloaded from the Hugging Face hub.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from train_helpers import TINY_SIZES, run_main

from expert_cli.cli.app import QUIET_LOGGERS

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
TINY_TOKENIZER_DIR = TESTS_DIR / "assets" / "tiny-tokenizer"
# DeepSeek-R1 distills' shape: the generation prompt opens a reasoning block; answers are
# written after the header without it, their reasoning (up to </think>) cut away
R1_TEMPLATE = (
    "{{ bos_token }}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{{ '<｜User｜>' + m.content }}{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content.split('</think>')[-1] %}"
    "{{ '<｜Assistant｜>' + content + eos_token }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{%- endif %}"
)
DEMO_EXPERT_DIR = REPO_DIR / "experts" / "demo"
VOCAB_MULTIPLE = 64
SESSION_FOLDERS: list[Path] = []  # made for this test session, removed at its end


def pytest_configure(config: pytest.Config) -> None:
    """Make any accidental hub access fail fast instead of downloading."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _own_datasets_cache()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # one thread per worker: the workers already fill the cores, and torch's default of a
        # thread per core each made them contend (tests/train: 195 s against 146 s on 2 cores)
        import torch

        torch.set_num_threads(1)
    # as the CLI does (cli/app.py QUIET_LOGGERS): bitsandbytes' CPU backend logs on import that it
    # could not fetch an optional kernel from the hub, and falls back to its own
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _own_datasets_cache() -> None:
    """The datasets library's cache in a folder of this session's (removed at its end), here
    and in the interpreters tests start: tests that read a hub snapshot through the library
    left its Arrow copies in the user's ~/.cache/huggingface/datasets (170 of them), which
    find-datasets then listed."""
    import datasets.config

    cache = Path(tempfile.mkdtemp(prefix="expert-cli-tests-datasets-"))
    SESSION_FOLDERS.append(cache)
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    datasets.config.HF_DATASETS_CACHE = cache
    datasets.config.DOWNLOADED_DATASETS_PATH = cache / datasets.config.DOWNLOADED_DATASETS_DIR
    datasets.config.EXTRACTED_DATASETS_PATH = (
        datasets.config.DOWNLOADED_DATASETS_PATH / datasets.config.EXTRACTED_DATASETS_DIR
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """The training stack imported once, and every object alive then frozen out of the garbage
    collector's view: each full collection (the Trainer runs one per run, Python's own run as
    objects pile up) walked the millions torch and transformers make on import, 0.3 s each
    (a tiny 4-step run in a test: 1.6 s to 1.3 s). Thawed at the session's end."""
    import gc

    import expert_cli.train.run  # noqa: F401

    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    import gc

    gc.unfreeze()
    for folder in SESSION_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """Write one JSON object per line (creating parent folders) and return `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(name="write_jsonl", scope="session")
def write_jsonl_fixture() -> Callable[[Path, Iterable[dict[str, Any]]], Path]:
    """The `write_jsonl(path, rows)` helper, as a fixture."""
    return write_jsonl


@pytest.fixture(scope="session")
def tiny_tokenizer_dir() -> Path:
    """The committed tiny Qwen-style tokenizer (4003 tokens, ChatML template)."""
    return TINY_TOKENIZER_DIR


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path):
    """The tiny tokenizer, loaded with AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A random-init 2-layer Qwen3 saved as safetensors, with the tiny tokenizer beside it.

    Built once per session; loadable offline with AutoModelForCausalLM and AutoTokenizer.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=-(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
        **TINY_SIZES,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=eos,  # Qwen has no BOS token; its configs name <|endoftext|>
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    out = tmp_path_factory.mktemp("tiny-qwen3")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def demo_expert_dir(tmp_path: Path) -> Path:
    """A private copy of experts/demo (manifest, data, model config, tokenizer) under tmp_path.

    Tests may write caches and outputs into it without touching the repository.
    """
    dest = tmp_path / "demo"
    shutil.copytree(DEMO_EXPERT_DIR, dest, ignore=shutil.ignore_patterns(".cache", "output"))
    return dest


@pytest.fixture
def cli(capsys, monkeypatch):
    """`expert-cli ARGS` in this process (no interpreter start-up and imports per call), with
    what it returned as `run_cli` gives it."""

    def call(*args: str) -> subprocess.CompletedProcess[str]:
        code, stdout, stderr = run_main(capsys, monkeypatch, *args)
        return subprocess.CompletedProcess(list(args), code, stdout, stderr)

    return call
