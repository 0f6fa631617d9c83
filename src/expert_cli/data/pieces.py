"""`overlong: split`: an example longer than `max_seq_length` trained as consecutive pieces.

A corpus of long documents (books, papers, code files) loses most of its tokens when each is
cut to its first `max_seq_length`. With `training.dataset.overlong: split` the formatter keeps
the whole example (status SPLIT) and `split_rows` cuts it, before packing, into pieces of
`max_seq_length` tokens, the last one shorter, each packed and trained as an example of its
own. A piece's first token is not trained: in its row nothing before it belongs to the same
document. A piece with nothing to train (all prompt) is left out. Each keeps the labels of
the example's tokens, so with chat or instruction data a piece past the first trains the
answer's tokens it holds, without the prompt before it.

A text of more than one block of characters is tokenized in blocks (`tokenize_blocks`)
broken after a line end or before a space where one falls in a block's second half, a few
blocks at a time, so a document of hundreds of megabytes is never one tokenizer call and
its memory is its ids (a whole-text encoding costs ~100 bytes a token): the tokens next to a
break may differ from the whole text's, which a cut into pieces makes no matter of. A split
build's shards are bounded by their text's bytes as well as by examples (data/build.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from expert_cli.data.spans import Span, span_mask

IGNORE = -100
BLOCKS_AT_ONCE = 16  # blocks tokenized together: their encodings are all that is held at once


@dataclass(frozen=True)
class Joined:
    """A text tokenized in blocks: its ids, the tokens its spans cover, and whether its first
    and last tokens are special ones the tokenizer added (`special_tokens_mask[0]` and `[-1]`,
    all that is read of an encoding's mask)."""

    ids: np.ndarray
    mask: np.ndarray
    special_tokens_mask: tuple[int, int]


def blocks(text: str, size: int, added: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """Character ranges of at most `size` characters that tile `text`: each ends after the last
    line end in its second half, else before the last space there, else at `size`, moved back
    to the start of an `added` token (`<|im_end|>`) the cut would fall inside: its halves
    would be tokenized, and trained, as plain text."""
    out, lo = [], 0
    while len(text) - lo > size:
        hi, half = lo + size, lo + size // 2
        at = text.rfind("\n", half, hi)
        cut = at + 1 if at >= 0 else text.rfind(" ", half, hi)
        cut = _outside(text, cut if cut > lo else hi, added, lo)
        out.append((lo, cut))
        lo = cut
    out.append((lo, len(text)))
    return out


def _outside(text: str, cut: int, added: tuple[str, ...], lo: int) -> int:
    """`cut`, or the start of an added token it falls inside (where that is past `lo`)."""
    for token in added:
        start = text.find(token, max(lo, cut - len(token) + 1), cut + len(token) - 1)
        if lo < start < cut:
            return start
    return cut


def special_ends(backend: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a text (`<s>`; none for
    Qwen), found by encoding one word with and without them."""
    bare = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start : start + len(bare)] == bare:
            return full[:start], full[start + len(bare) :]
    return [], []


def tokenize_blocks(
    backend: Any, text: str, spans: list[Span], size: int, ends: tuple[list[int], list[int]]
) -> Joined:
    """`text` tokenized block by block (each without special tokens), `ends` (the special ids
    before and after, see `special_ends`) added around, and the spans' tokens marked."""
    added = tuple(t.content for t in backend.get_added_tokens_decoder().values() if t.content)
    cuts = blocks(text, size, added)
    ids = [np.asarray(ends[0], dtype=np.int32)]
    masks = [np.zeros(len(ends[0]), dtype=bool)]
    for lo in range(0, len(cuts), BLOCKS_AT_ONCE):  # an encoding costs ~100 bytes a token
        group = cuts[lo : lo + BLOCKS_AT_ONCE]
        encodings = backend.encode_batch([text[a:b] for a, b in group], add_special_tokens=False)
        for (a, b), enc in zip(group, encodings, strict=True):
            local = [(max(s, a) - a, min(e, b) - a) for s, e in spans if s < b and e > a]
            ids.append(np.asarray(enc.ids, dtype=np.int32))
            masks.append(span_mask(text[a:b], enc, len(enc.ids), local))
    ids.append(np.asarray(ends[1], dtype=np.int32))
    masks.append(np.zeros(len(ends[1]), dtype=bool))
    special = (int(bool(ends[0])), int(bool(ends[1])))
    return Joined(np.concatenate(ids), np.concatenate(masks), special)


def split_rows(table: pa.Table, max_seq_length: int) -> pa.Table:
    """`input_ids` and `labels` of rows longer than `max_seq_length` cut into pieces of it (a
    piece's first label IGNORE); pieces with no trained label left out, `trained` recounted;
    the other columns repeated for each piece of their row."""
    ids_col = table.column("input_ids").combine_chunks()
    offsets = np.asarray(ids_col.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    counts = np.maximum(1, -(-lengths // max_seq_length))
    row = np.repeat(np.arange(len(lengths)), counts)
    nth = np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)
    starts = offsets[row] + nth * max_seq_length
    stops = np.minimum(starts + max_seq_length, offsets[row + 1])
    ids = ids_col.values.to_numpy()
    lab_col = table.column("labels").combine_chunks()
    if not np.array_equal(np.asarray(lab_col.offsets, dtype=np.int64), offsets):
        raise ValueError("labels and input_ids have different lengths")
    labels = lab_col.values.to_numpy().copy()
    labels[starts[(nth > 0) & (stops > starts)]] = IGNORE
    counted = np.concatenate([[0], np.cumsum(labels != IGNORE)])
    trained = counted[stops] - counted[starts]
    keep = (trained > 0) | (stops == starts)  # a dropped example keeps its one empty row
    starts, stops, row, trained = starts[keep], stops[keep], row[keep], trained[keep]
    sizes = stops - starts
    new_offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=new_offsets[1:])
    gather = np.arange(int(new_offsets[-1])) - np.repeat(new_offsets[:-1] - starts, sizes)
    lists = pa.array(new_offsets.astype(np.int32))

    def column(values: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(lists, pa.array(values[gather].astype(np.int32)))

    rest = table.drop_columns(["input_ids", "labels", "trained"]).take(pa.array(row))
    return (
        rest.append_column("input_ids", column(ids))
        .append_column("labels", column(labels))
        .append_column("trained", pa.array(trained.astype(np.int32)))
    )
