"""`expert-cli evaluate`: how a trained adapter scores on held-out examples, the base beside it.

The rows are laid out as training laid out its data (train/eval_split.py, test_split.py).
Each batch of packed rows runs the model's body and then the loss a slice of tokens at a time
(train/loss.py's
chunked linear cross-entropy: no logits over the whole vocabulary kept; a model whose logits
are not its head's product, through its own forward, in smaller batches), over the tokens
training would train on. The loss is the mean per trained token over the whole split (what
training reports as eval_loss, for the validation split), the perplexity its exponential, the
token accuracy the share of trained tokens that are the model's most likely next token.
`compare_base` scores each batch again with the adapter switched off: what training changed.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from expert_cli.data import BuildProgress
from expert_cli.data.collate import LOSS_POSITIONS, PackedCollator
from expert_cli.data.formatting import IGNORE
from expert_cli.data.packing import LENGTH_COLUMN
from expert_cli.errors import RunError
from expert_cli.train.eval_split import Part, SplitChoice
from expert_cli.train.generate import base_notes, load_run
from expert_cli.train.loss import HITS, install_fused_loss
from expert_cli.train.loss_fit import fused_loss_unsupported
from expert_cli.train.merge import dequantized
from expert_cli.train.test_split import split_rows
from expert_cli.train.token_accuracy import batch_hits

BATCH_TOKENS = 16_384  # tokens a batch holds at most by default (8 rows of 2,048)
# where the model's own forward keeps the logits (fp32 over Qwen3's 151,936 ids: 1.2 GB for
# 2,048 tokens)
LOGITS_BATCH_TOKENS = 2_048
MAX_BATCH_ROWS = 1024


@dataclass
class EvaluateOptions:
    adapter: Path  # a run folder, or one of its checkpoints
    split: str | None = None  # "test" or "validation"; None: test where the manifest names it
    compare_base: bool = False
    batch_rows: int | None = None  # packed rows a forward pass holds (default: BATCH_TOKENS)


@dataclass
class Scores:
    """One model's figures on some rows."""

    loss: float | None  # None: no trained token to score
    perplexity: float | None  # None also where exp(loss) is beyond a float
    token_accuracy: float | None


@dataclass
class Scored:
    """One part of the split (a task, or the split whole: task None) and its figures."""

    task: str | None
    source: str
    examples: int
    trained_tokens: int
    expert: Scores
    base: Scores | None = None
    dropped: int | None = 0  # None: not counted for this part (a task of the validation split)
    truncated: int | None = 0
    shared_with_training: int | None = None  # the test split's: examples trained on too


@dataclass
class EvaluateResult:
    split: str
    parts: list[Scored]  # each task's; one, the split's, for an expert of one task
    total: Scored  # the split's whole
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def by_task(self) -> list[Scored]:
        """The parts shown task by task: several, or one task's (a multi_task expert that
        named one task's test data)."""
        return self.parts if len(self.parts) > 1 or self.parts[0].task else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "total": asdict(self.total),
            "tasks": [asdict(p) for p in self.by_task],
            "settings": self.settings,
            "notes": self.notes,
        }


class EvaluateView(Protocol):
    """Hears how far the scoring is: `start` with the batches to run, `advance` after each."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, done: int) -> None: ...


class Sums:
    """Summed loss, argmax hits and trained tokens of one model over some batches."""

    def __init__(self) -> None:
        self.loss, self.hits, self.tokens = 0.0, 0, 0

    def add(self, other: Sums) -> None:
        self.loss, self.hits = self.loss + other.loss, self.hits + other.hits
        self.tokens += other.tokens

    def scores(self) -> Scores:
        if not self.tokens:
            return Scores(None, None, None)
        mean = self.loss / self.tokens
        perplexity = math.exp(mean) if mean < 700 else None  # exp overflows beyond 709
        return Scores(round(mean, 6), perplexity, round(self.hits / self.tokens, 6))


def evaluate(
    opts: EvaluateOptions,
    view: EvaluateView | None = None,
    build_progress: BuildProgress | None = None,
) -> EvaluateResult:
    """Score the run's adapter (and with `compare_base` the base) on the split's rows."""
    run = load_run(opts.adapter)
    notes = run.notes + ([] if dequantized(run.notes) else base_notes(run.resolved))
    choice = SplitChoice(opts.split, progress=build_progress)
    split = split_rows(opts.adapter, run.resolved, run.tokenizer, run.data_record, choice)
    notes += split.notes + split.formatting
    base = run.model.get_base_model()
    # the loss a slice of tokens at a time where the model's logits are its head's product;
    # else its own forward, logits and all (a softcap, a bias, an adapted head)
    fused = fused_loss_unsupported(base, run.resolved.target_modules) is None
    if fused:
        install_fused_loss(base, "chunked")
    tokens = BATCH_TOKENS if fused else LOGITS_BATCH_TOKENS
    rows = opts.batch_rows or max(1, min(MAX_BATCH_ROWS, tokens // _width(split.parts)))
    collate = PackedCollator(run.tokenizer.pad_token_id or 0, loss_positions=fused)
    total_batches = sum(-(-len(p.rows) // rows) for p in split.parts)
    if view is not None:
        view.start(f"scoring the {split.name} split", total_batches * (1 + opts.compare_base))
    started = time.perf_counter()
    scored, whole = [], (Sums(), Sums())
    for part in split.parts:
        sums = _score(run.model, part, (collate, rows), opts.compare_base, view)
        whole[0].add(sums[0])
        whole[1].add(sums[1])
        scored.append(_scored(part, sums, opts.compare_base))
    settings = {
        "adapter": str(opts.adapter),
        "base_model": run.resolved.base_model,
        "device": run.device,
        "dtype": str(next(run.model.parameters()).dtype).removeprefix("torch."),
        "batch_rows": rows,
        "max_seq_length": run.resolved.max_seq_length,
        "seconds": round(time.perf_counter() - started, 3),
    }
    total = Scored(
        None,
        ", ".join(dict.fromkeys(p.source for p in split.parts)),
        sum(s.examples for s in scored),
        whole[0].tokens,
        whole[0].scores(),
        whole[1].scores() if opts.compare_base else None,
        split.dropped,
        split.truncated,
        None if None in (shared := [s.shared_with_training for s in scored]) else sum(shared),
    )
    empty = [p.task or p.source for p in scored if not p.trained_tokens]
    if empty:
        notes.append(f"no trained token to score in {', '.join(empty)}")
    return EvaluateResult(split.name, scored, total, settings, notes)


def _width(parts: list[Part]) -> int:
    """The longest packed row of the split."""
    longest = 1
    for part in parts:
        if len(part.rows):
            longest = max(longest, int(max(part.rows[LENGTH_COLUMN])))
    return longest


def _score(
    model: Any, part: Part, batching: tuple[PackedCollator, int], base: bool, view: Any
) -> tuple[Sums, Sums]:
    """The adapted model's sums over the part's rows, and the base's (left empty without
    `base`)."""
    collate, size = batching
    sums = (Sums(), Sums())
    for start in range(0, len(part.rows), size):
        batch = collate([part.rows[i] for i in range(start, min(start + size, len(part.rows)))])
        sums[0].add(_batch_sums(model, batch))
        _advanced(view)
        if base:
            with model.disable_adapter():
                sums[1].add(_batch_sums(model, batch))
            _advanced(view)
    return sums


def _advanced(view: Any) -> None:
    if view is not None:
        view.advance(1)


def _batch_sums(model: Any, batch: dict[str, Any]) -> Sums:
    """One forward pass's summed loss, hits and trained tokens."""
    device = next(model.parameters()).device
    inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    trained = int((batch["labels"][:, 1:] != IGNORE).sum())
    found = Sums()
    if not trained:
        return found
    with torch.inference_mode():  # no KV cache: with one, transformers would not build the
        out = model(**inputs, use_cache=False)  # packed rows' block-diagonal mask
    hits = out[HITS] if LOSS_POSITIONS in batch else batch_hits(out, inputs["labels"])[0]
    loss = float(out.loss)
    if not math.isfinite(loss):
        raise RunError(
            "the model's loss on the held-out rows is not finite (adapter weights that "
            "overflow, or a run that diverged); train again"
        )
    found.loss, found.hits, found.tokens = loss * trained, int(hits), trained
    return found


def _scored(part: Part, sums: tuple[Sums, Sums], base: bool) -> Scored:
    return Scored(
        part.task,
        part.source,
        part.examples,
        sums[0].tokens,
        sums[0].scores(),
        sums[1].scores() if base else None,
        part.dropped,
        part.truncated,
        part.shared,
    )
