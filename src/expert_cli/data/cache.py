"""The token cache: its fingerprint, its folder layout, and reading a finished one.

Layout under the cache root (`training.config.pretokenized_cache`, default
`.cache/pretokenized` beside the manifest):

    <expert>-<fp16>/            a finished cache: train/, eval/ (save_to_disk), stats.json,
                                _COMPLETE (written last; readers require it)
    <expert>.latest.json        the most recent cache of the expert and its inputs
    .lock                       file lock: one build at a time in the folder, the others wait
    .build-<fp>/<split>/shard-NNNNN/   finished shards of a build in progress (resume)
    .tmp-<expert>-<fp16>-<pid>/ a cache being assembled; renamed into place when complete

The cache root must be a writable folder (`open_cache_root`; `check` reports what it can tell
without writing, `cache_root_problem`); a build removes only the names above that killed
builds left, so the folder may hold other files.

The fingerprint is sha256 over canonical JSON of everything that changes the content: source
files (path, size, and an xxh3-128 hash of the whole file up to 256 MiB, of its first and last
MiB plus its mtime above that), hub id/split/config/revision, the tokenizer (its tokenizer.json
serialisation, or, when loaded from a local folder, that file's hash plus the in-memory added
tokens, pipeline and options; special tokens; chat template), formatting (field mapping,
prompt and response templates, overlong rule), max_seq_length, packing, eval fraction, seed,
shard size, and CACHE_FORMAT_VERSION.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets

from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.rows import source_files
from expert_cli.data.source_marks import file_hash, source_inputs
from expert_cli.data.sources import load_saved
from expert_cli.errors import RunError, UserError
from expert_cli.paths import shown_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 15  # 2: the first token of every example is masked; 3: a chat
# template sees every key of a local message (it saw role and content) but null-valued ones,
# and a conversation it refuses is dropped; 4: an answer's first token is trained when only
# whitespace of it lies before the answer (llama2/vicuna put that space in the answer); 5: the
# stats record the data's kind and columns (`fields`) and each split's layouts (`styles`); 6:
# `<|user|>` turns ended by `</s>` (no `<|end|>` in the text) are a layout of their own; 7: a
# span ends after every token of its last character; a tokenizer-added EOS is trained, a
# doubled BOS/EOS dropped; conversations without an assistant turn dropped; `\r\n` after markers
# 8: an answer of an empty reasoning block alone (Qwen3's `<think></think>`) is empty
# 9: a conversation's answers as its chat template writes them (data/turns.py)
# 10: examples of the same tokens (a task weight's copies) are packed into different rows; a
# generation prompt opening a reasoning block no answer follows is read without it (R1 distills);
# past 64 answers a conversation has its first 63 and its last asked of the template
# 11: an answer of OpenAI's `"weight": 0` is context, not trained
# 12: a conversation's `tools` column (its tool definitions) is given to the chat template
# 13: a tool's null-valued keys kept as a JSON file or JSON text wrote them (`"default": null`)
# 14: a `system` column beside a conversation is its system turn; LIMA's texts are turns;
# TRL's conversational prompt/completion read (each source detected from its own columns)
# 15: calls are the assistant's tool_calls, not its text (ShareGPT's function_call turns,
# OpenAI's earlier function_call, xlam's answers); a conversation's JSON text is read
COMPLETE = "_COMPLETE"
STATS = "stats.json"
DEFAULT_SHARD_EXAMPLES = 50_000
SHARD_ENV = "EXPERT_CLI_SHARD_EXAMPLES"
PIPELINE = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
# settable options of the tokenizers models (BPE, WordPiece, Unigram, WordLevel)
MODEL_OPTIONS = (
    "dropout",
    "unk_token",
    "continuing_subword_prefix",
    "end_of_word_suffix",
    "fuse_unk",
    "byte_fallback",
    "ignore_merges",
    "max_input_chars_per_word",
)
CACHE_FIELD = "training.config.pretokenized_cache"
WRITABLE = (
    f"expected a writable folder (set {CACHE_FIELD}; the default is .cache/pretokenized "
    "beside the manifest)"
)
LOCK_NAME = ".lock"


@dataclass(frozen=True)
class CachePlan:
    """Where a cache with these inputs lives, and what it was compared with."""

    root: Path
    fingerprint: str
    inputs: dict[str, Any]
    final_dir: Path
    previous: dict[str, Any] | None  # the expert's latest pointer, if any
    # each local data file's (size, mtime) before it was hashed: a file written while the
    # build read it is found by them (the cache would carry the fingerprint of what was hashed)
    marks: dict[str, tuple[int, int]] = field(default_factory=dict)

    def changed_files(self) -> list[str]:
        """The data files whose size or modification time is not what it was when planned."""
        return [f for f, mark in self.marks.items() if _mark(Path(f)) != mark]

    @property
    def lock_path(self) -> Path:
        """One lock for the whole cache folder: one build at a time writes in it, and only
        this one file stays behind."""
        return self.root / LOCK_NAME

    @property
    def work_dir(self) -> Path:
        return self.root / f".build-{self.fingerprint}"

    @property
    def pointer(self) -> Path:
        return self.root / f"{_safe(self.inputs['expert'])}.latest.json"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "expert"


def tokenizer_inputs(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """What identifies a tokenizer's behaviour: vocab, merges, normalisation, specials."""
    template = tokenizer.chat_template or ""
    return {
        "tokenizer_json_sha256": backend_digest(tokenizer),
        "vocab_size": len(tokenizer),
        "eos": tokenizer.eos_token,
        "pad": tokenizer.pad_token,
        "bos": tokenizer.bos_token,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }


def backend_digest(tokenizer: PreTrainedTokenizerFast) -> str:
    """sha256 identifying the Rust tokenizer: vocab, merges, added tokens, pipeline.

    Serialising a 150k-token vocabulary costs ~0.2 s a build, so when the tokenizer was loaded
    from a local folder with a tokenizer.json, the vocab and merges are identified by that
    file's content hash, and everything that can change in memory after loading (added tokens,
    normalizer, pre-tokenizer, post-processor, decoder, model options, truncation, padding) is
    serialised from the object itself. Otherwise the whole serialisation is hashed.
    """
    backend = tokenizer.backend_tokenizer
    folder = Path(str(tokenizer.name_or_path or ""))
    model_file = folder / "tokenizer.json"
    if not str(tokenizer.name_or_path or "") or not model_file.is_file():
        return hashlib.sha256(backend.to_str().encode()).hexdigest()
    model = backend.model
    parts = {
        "tokenizer_json": file_hash(model_file),
        "model": [type(model).__name__] + [str(getattr(model, a, None)) for a in MODEL_OPTIONS],
        "vocab_size": backend.get_vocab_size(with_added_tokens=True),
        "added": [f"{i}:{t!r}" for i, t in sorted(backend.get_added_tokens_decoder().items())],
        "pipeline": [_component(getattr(backend, c)) for c in PIPELINE],
        "truncation": backend.truncation,
        "padding": backend.padding,
    }
    canonical = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _component(part: Any) -> str | None:
    """The JSON of one pipeline component (normalizer, pre-tokenizer, ...), or None."""
    return None if part is None else part.__getstate__().decode()


def shard_examples_default() -> int:
    """Examples per build shard: $EXPERT_CLI_SHARD_EXAMPLES, else DEFAULT_SHARD_EXAMPLES."""
    value = os.environ.get(SHARD_ENV)
    if value is None:
        return DEFAULT_SHARD_EXAMPLES
    if not value.isdigit() or int(value) < 1:
        raise RunError(f"{SHARD_ENV}={value!r}: expected a positive integer")
    return int(value)


def fingerprint_inputs(
    resolved: ResolvedConfig, tokenizer: PreTrainedTokenizerFast, shard_examples: int
) -> dict[str, Any]:
    """Every input that changes the cache's content, as JSON-ready values."""
    folder = Path(resolved.manifest_path).parent
    return {
        "format_version": CACHE_FORMAT_VERSION,
        "expert": resolved.expert,
        "sources": {
            "train": [source_inputs(r, folder) for r in resolved.train_sources],
            "validation": [source_inputs(r, folder) for r in resolved.validation_sources],
        },
        "tokenizer": tokenizer_inputs(tokenizer),
        "formatting": {
            "field_mapping": resolved.field_mapping,
            "prompt_template": resolved.prompt_template,
            "response_template": resolved.response_template,
            "overlong": resolved.overlong,
        },
        "max_seq_length": resolved.max_seq_length,
        "packing": resolved.packing,
        "eval_fraction": resolved.eval_fraction,
        "eval_seed": resolved.eval_seed,
        "seed": resolved.seed,
        "shard_examples": shard_examples,
        # a multi_task expert's evaluation split is packed task by task (build.py)
        **({"eval_by_task": True} if any(r.task for r in resolved.train_sources) else {}),
    }


def fingerprint_of(inputs: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of `inputs`."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def plan_cache(
    resolved: ResolvedConfig, tokenizer: PreTrainedTokenizerFast, shard_examples: int
) -> CachePlan:
    """Fingerprint the inputs and locate the cache (reads no data, builds nothing)."""
    marks = {str(f): _mark(f) for f in local_data_files(resolved)}
    inputs = fingerprint_inputs(resolved, tokenizer, shard_examples)
    fp = fingerprint_of(inputs)
    root = Path(resolved.pretokenized_cache)
    pointer = root / f"{_safe(resolved.expert)}.latest.json"
    previous = _read_pointer(pointer)
    return CachePlan(
        root=root,
        fingerprint=fp,
        inputs=inputs,
        final_dir=root / f"{_safe(resolved.expert)}-{fp[:16]}",
        previous=previous,
        marks=marks,
    )


def local_data_files(resolved: ResolvedConfig) -> list[Path]:
    """Every local data file the run's train and validation sources read."""
    refs = [*resolved.train_sources, *resolved.validation_sources]
    return [f for r in refs if r.kind == "local" for f in source_files(r)]


def _mark(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def _read_pointer(pointer: Path) -> dict[str, Any] | None:
    """The expert's latest-cache pointer; None when there is none, or (logged) when it is not
    a JSON object: it only explains what changed since the last build."""
    try:
        if not pointer.exists():
            return None
        value = json.loads(pointer.read_bytes())
    except (OSError, ValueError) as exc:
        log.warning("%s: not read (%s); a new pointer is written", pointer, type(exc).__name__)
        return None
    if not isinstance(value, dict):
        log.warning("%s: not a JSON object; a new pointer is written", pointer)
        return None
    return value


def cache_root_problem(root: Path, expert: str | None = None) -> str | None:
    """Why no token cache can be built under `root`, where that can be told without writing:
    it (or the nearest part of its path that exists) is not a folder, or that folder is not
    writable and holds no finished cache of `expert` (one that is there may still be read)."""
    existing = root
    try:
        while not existing.exists() and existing != existing.parent:
            if existing.is_symlink():  # a link to a path that is missing, or a loop of links
                return (
                    f"{CACHE_FIELD}: {shown_path(root)}: {shown_path(existing)} is a symbolic "
                    f"link that leads nowhere; {WRITABLE}"
                )
            existing = existing.parent
        if not existing.is_dir():
            where = "" if existing == root else f" is under {shown_path(existing)}, which"
            return f"{CACHE_FIELD}: {shown_path(root)}{where} is not a folder; {WRITABLE}"
        if os.access(existing, os.W_OK | os.X_OK):
            return None
        if expert is not None and existing == root and _has_finished(root, expert):
            return None
    except OSError as exc:  # a folder that cannot be looked into
        return f"{CACHE_FIELD}: {shown_path(root)}: cannot be used ({exc.strerror}); {WRITABLE}"
    where = "" if existing == root else f" would be created in {shown_path(existing)}, which"
    return f"{CACHE_FIELD}: {shown_path(root)}{where} is not writable; {WRITABLE}"


def _has_finished(root: Path, expert: str) -> bool:
    return any((d / COMPLETE).is_file() for d in root.glob(f"{_safe(expert)}-*"))


def open_cache_root(root: Path) -> None:
    """Create the cache folder and its lock file: a UserError naming the field for a place
    that cannot take them (a lock file that cannot be created would make the lock wait
    forever), a RunError for a full disk."""
    problem = cache_root_problem(root)
    if problem:
        raise UserError(problem)
    try:
        for attempt in range(5):  # a first build stopped by its data may remove the folder
            root.mkdir(parents=True, exist_ok=True)
            try:
                os.close(os.open(root / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o644))
                break
            except FileNotFoundError:
                if attempt == 4 or root.is_dir():  # the folder is there: not that race
                    raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise RunError(f"no space left on {root} (the token cache is written there)") from None
        reason = exc.strerror or type(exc).__name__
        raise UserError(
            f"{CACHE_FIELD}: {shown_path(root)} cannot be written ({reason}); {WRITABLE}"
        ) from None


def is_complete(cache_dir: Path) -> bool:
    """True for a finished cache folder (its `_COMPLETE` marker is written last)."""
    return (cache_dir / COMPLETE).is_file()


def load_cache(plan: CachePlan) -> tuple[datasets.Dataset, datasets.Dataset | None, dict[str, Any]]:
    """The memory-mapped train/eval datasets and stats of a finished cache.

    Rows come as numpy arrays: the collator turns them into tensors without building a Python
    int per token (about 15x less time per batch than the default list rows).
    """

    if not is_complete(plan.final_dir):
        raise RunError(f"{plan.final_dir}: the cache is not complete; it will not be read")
    rebuild = f"delete {plan.final_dir} (or run pretokenize --force) to rebuild"
    try:
        stats = json.loads((plan.final_dir / STATS).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        stats = None
    if not isinstance(stats, dict) or stats.get("fingerprint") != plan.fingerprint:
        raise RunError(
            f"{plan.final_dir}: stats.json is unreadable or its fingerprint does not match the "
            f"folder; {rebuild}"
        )
    # damaged after it was finished (a disk error, a hand edit): exit 1, as a run-time fault
    train = load_saved(plan.final_dir / "train", rebuild, RunError).with_format("numpy")
    eval_dir = plan.final_dir / "eval"
    evaluation = (
        load_saved(eval_dir, rebuild, RunError).with_format("numpy") if eval_dir.exists() else None
    )
    return train, evaluation, stats
