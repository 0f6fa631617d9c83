"""`overlong: split`: long examples trained as pieces of max_seq_length, every token kept."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console
from test_cache import prepare
from test_formatting import _with_post_processor, run

from expert_cli.cli.data import summary_lines
from expert_cli.cli.train_view import print_data
from expert_cli.data.formatting import IGNORE, KEPT, SPLIT, Formatter
from expert_cli.data.pieces import Joined, blocks, split_rows
from expert_cli.data.stats_words import count_lines

CHAT = "<|im_start|>user\nsay it<|im_end|>\n<|im_start|>assistant\n"
ANSWER = " ".join(f"w{i}" for i in range(60)) + "<|im_end|>\n"


def test_split_keeps_the_whole_example_then_cuts_it_into_pieces(tiny_tokenizer) -> None:
    text = "a long document " * 30
    whole = run(tiny_tokenizer, "text", {"text": [text, "short"]}, max_len=4096)
    kept = run(tiny_tokenizer, "text", {"text": [text, "short"]}, max_len=16, overlong="split")
    assert [r["status"] for r in kept] == [SPLIT, KEPT]
    assert kept[0]["input_ids"] == whole[0]["input_ids"] and len(whole[0]["input_ids"]) > 32
    formatter = Formatter(tiny_tokenizer, "text", 16, "split")
    pieces = split_rows(formatter({"text": [text, "short"]}), 16).to_pylist()
    ids = whole[0]["input_ids"]
    assert [p["status"] for p in pieces] == [SPLIT] * -(-len(ids) // 16) + [KEPT]
    mine = [p for p in pieces if p["status"] == SPLIT]
    assert sum((p["input_ids"] for p in mine), []) == ids  # every token, in order
    assert all(len(p["input_ids"]) <= 16 for p in pieces)
    for k, piece in enumerate(mine):
        assert piece["labels"][0] == IGNORE  # nothing in its row predicts it
        assert piece["labels"][1:] == whole[0]["labels"][16 * k + 1 : 16 * k + len(piece["labels"])]
        assert piece["trained"] == sum(lab != IGNORE for lab in piece["labels"])
    assert pieces[-1]["input_ids"] == whole[1]["input_ids"]  # the short one untouched


def test_a_piece_with_nothing_trained_is_left_out(tiny_tokenizer) -> None:
    """A chat example whose prompt fills the first piece: that piece trains nothing."""
    prompt = "<|im_start|>user\n" + "context words " * 20 + "<|im_end|>\n<|im_start|>assistant\n"
    formatter = Formatter(tiny_tokenizer, "text", 16, "split")
    table = formatter({"text": [prompt + ANSWER]})
    assert table.column("status").to_pylist() == [SPLIT]
    pieces = split_rows(table, 16).to_pylist()
    assert all(p["trained"] > 0 for p in pieces)
    kept = sum(len(p["input_ids"]) for p in pieces)
    assert kept < len(table.column("input_ids")[0]) - 16  # the all-prompt pieces went
    answer = tiny_tokenizer.decode([i for p in pieces for i in p["labels"] if i != IGNORE])
    assert "w59<|im_end|>" in answer and "context" not in answer


def test_a_dropped_example_stays_one_empty_row(tiny_tokenizer) -> None:
    formatter = Formatter(tiny_tokenizer, "text", 16, "split")
    table = formatter({"text": ["", "one two three"]})
    pieces = split_rows(table, 16).to_pylist()
    assert [len(p["input_ids"]) for p in pieces] == [0, len(table.to_pylist()[1]["input_ids"])]


def test_blocks_break_after_a_line_end_or_before_a_space() -> None:
    text = "first line\nsecond part of it and more words"
    cuts = blocks(text, 16)
    assert "".join(text[a:b] for a, b in cuts) == text and all(b - a <= 16 for a, b in cuts)
    assert text[cuts[0][0] : cuts[0][1]] == "first line\n"
    assert text[cuts[1][1]] == " "  # the next block begins with the space BPE joins to a word
    assert blocks("x" * 40, 16) == [(0, 16), (16, 32), (32, 40)]  # nowhere to break: at 16


@pytest.mark.parametrize("special", [None, "<|im_start|> $A"])
def test_a_text_longer_than_a_block_is_tokenized_in_blocks(tiny_tokenizer, special) -> None:
    """max_seq_length 4: a block is 128 characters, the chat text several of them. Every
    character is kept, the answer alone is trained, and an added BOS comes once."""
    tok = _with_post_processor(tiny_tokenizer, special) if special else tiny_tokenizer
    text = (CHAT + ANSWER) * 4
    formatter = Formatter(tok, "text", 4, "split")
    texts, spans, _, _ = formatter.render({"text": [text]})
    encodings, _ = formatter.tokenize(texts, spans)
    assert isinstance(encodings[0], Joined)
    row = formatter({"text": [text]}).to_pylist()[0]
    assert row["status"] == SPLIT
    ids = row["input_ids"]
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(start) == 8 and ids[0] == start != ids[1]  # the text's own, no more
    assert tok.decode(ids) == text + tok.eos_token
    plain = formatter({"text": ["plain " * 40]}).to_pylist()[0]["input_ids"]
    assert plain.count(start) == (1 if special else 0)  # the added one where the text has none
    trained = tok.decode([i for i in row["labels"] if i != IGNORE])
    assert trained.startswith("w0 w1") and "say it" not in trained
    assert trained.count("w59<|im_end|>") == 4


def test_messages_past_the_truncation_limit_are_all_trained(tiny_tokenizer) -> None:
    """With split, an answer far past max_seq_length is found and trained (truncate stops
    asking the chat template past what it tokenizes)."""
    long = " ".join(f"t{i}" for i in range(400))
    messages = [
        {"role": "user", "content": long},
        {"role": "assistant", "content": long},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "the last answer"},
    ]
    row = run(tiny_tokenizer, "messages", {"messages": [messages]}, max_len=8, overlong="split")[0]
    trained = tiny_tokenizer.decode([i for i in row["labels"] if i != IGNORE])
    assert row["status"] == SPLIT and "the last answer" in trained and "again" not in trained


def test_a_corpus_of_long_documents_is_trained_whole(demo_expert_dir) -> None:
    data = demo_expert_dir / "data" / "docs.jsonl"
    docs = [" ".join(f"doc{d} word{i}" for i in range(50 * (d + 1))) for d in range(6)]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    args = ("training.dataset.path=data/docs.jsonl", "max_seq_length=64")
    cut = prepare(demo_expert_dir / "manifest.json", *args, "training.dataset.validation_path=null")
    split = prepare(
        demo_expert_dir / "manifest.json",
        *args,
        "training.dataset.validation_path=null",
        "training.dataset.overlong=split",
    )
    train = split.stats["train"]
    n = train["examples"]  # one of the six is held out for evaluation
    assert n >= 4 and train["split"] == n == cut.stats["train"]["truncated"]
    assert train["truncated"] == 0
    assert train["tokens"] > 10 * cut.stats["train"]["tokens"]
    lengths = [len(r["input_ids"]) for r in split.train]
    assert max(lengths) <= 64 and sum(lengths) == train["tokens"]
    labels = np.concatenate([r["labels"] for r in split.train])
    assert train["trained_tokens"] == int((labels != IGNORE).sum())
    lines = dict(count_lines(split.stats))
    assert lines["split"].startswith(f"{n} of {n} examples were longer than max_seq_length=64")
    assert "cut" not in lines and "overlong: split" in dict(count_lines(cut.stats))["cut"]
    console = Console(record=True, width=400)
    print_data(console, split.stats, split.status, split.reason, split.cache_dir)
    shown = console.export_text()
    assert f"train.split {n}" in shown and f"split     {n} of {n}" in shown
    assert f"/ {n} split /" in summary_lines(split)[1]
    console = Console(record=True, width=400)
    print_data(console, cut.stats, cut.status, cut.reason, cut.cache_dir)
    shown = console.export_text().replace("overlong: split", "")
    assert "split" not in shown.replace("the validation split holds", "")


def test_blocks_tokenized_a_few_at_a_time_give_the_same_tokens(tiny_tokenizer, monkeypatch) -> None:
    """Every block's encoding held at once took ~100 bytes a token (a 20 MB text, 1.2 GB)."""
    import expert_cli.data.pieces as pieces

    text = (CHAT + ANSWER) * 6
    formatter = Formatter(tiny_tokenizer, "text", 4, "split")
    together = formatter({"text": [text]}).to_pylist()[0]
    monkeypatch.setattr(pieces, "BLOCKS_AT_ONCE", 1)
    assert formatter({"text": [text]}).to_pylist()[0] == together


def test_a_split_build_bounds_its_shards_by_bytes(demo_expert_dir, monkeypatch) -> None:
    """Shards of 50,000 examples kept whole: a corpus of books went past Arrow's 32-bit
    offsets. Shards end before the rows past SPLIT_SHARD_BYTES of text, every row in one."""
    import datasets

    import expert_cli.data.build as build

    ds = datasets.Dataset.from_dict({"text": ["x" * n for n in (10, 10, 30, 5, 5, 5, 40)]})
    monkeypatch.setattr(build, "SPLIT_SHARD_BYTES", 25)
    # each row costs its bytes + 1
    assert build.shard_bounds(ds, 100, True) == [0, 2, 3, 6, 7]
    assert build.shard_bounds(ds, 2, True) == [0, 2, 3, 5, 6, 7]
    assert build.shard_bounds(ds, 3, False) == [0, 3, 6, 7]
    assert build.shard_bounds(ds.select([]), 3, True) == [0, 0]
    data = demo_expert_dir / "data" / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": "word " * 300}) + "\n" for _ in range(8)))
    args = ("training.dataset.path=data/docs.jsonl", "max_seq_length=64")
    monkeypatch.setattr(build, "SPLIT_SHARD_BYTES", 1 << 28)
    whole = prepare(demo_expert_dir / "manifest.json", *args, "training.dataset.overlong=split")
    assert whole.stats["shards"] == 2  # a training shard and an evaluation one
    monkeypatch.setattr(build, "SPLIT_SHARD_BYTES", 3000)
    sharded = prepare(
        demo_expert_dir / "manifest.json", *args, "training.dataset.overlong=split", force=True
    )
    assert sharded.stats["shards"] > whole.stats["shards"]
    assert sharded.stats["train"]["tokens"] == whole.stats["train"]["tokens"]


def test_a_block_is_never_cut_inside_a_special_token(tiny_tokenizer) -> None:
    """Text with nowhere to break (CJK prose, minified code) was cut at the block's size, in
    the middle of `<|im_end|>`: both halves were trained as plain text, never the token."""
    head = "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    text = head + "答" * (125 - len(head)) + "<|im_end|>\n" + "答" * 200
    assert text.index("<|im_end|>", len(head)) == 125  # across the first block's end, 128
    cuts = blocks(text, 128, ("<|im_end|>",))
    assert cuts[0] == (0, 125)
    row = Formatter(tiny_tokenizer, "text", 4, "split")({"text": [text]}).to_pylist()[0]
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert row["input_ids"].count(end) == 2
    assert end in [label for label in row["labels"] if label != IGNORE]  # the answer's stop


def test_without_packing_no_packing_efficiency_is_shown(demo_expert_dir) -> None:
    """A row is one example without packing, padded to its batch's longest row by the
    collator: tokens over rows x max_seq_length (3% on a chat file) read as padding that does
    not happen. Both views say `packing off`; an example cut to fit is not said "kept"."""
    packed = prepare(demo_expert_dir / "manifest.json", "training.dataset.validation_path=null")
    plain = prepare(
        demo_expert_dir / "manifest.json",
        "training.dataset.validation_path=null",
        "packing=false",
    )
    assert plain.stats["train"]["rows"] == plain.stats["train"]["examples"]
    for data, said in ((packed, "packing_efficiency 0."), (plain, "packing off")):
        console = Console(record=True, width=400)
        print_data(console, data.stats, data.status, data.reason, data.cache_dir)
        assert said in console.export_text()
    assert "packing_efficiency" not in console.export_text()
    line = summary_lines(plain)[1]
    assert "packing off" in line and "packing efficiency" not in line
    assert "packing efficiency 9" in summary_lines(packed)[1]
    truncated = plain.stats["train"]["truncated"]
    assert f"kept whole / {truncated:,} truncated" in line


def test_a_batch_of_long_documents_is_bounded_by_its_text_not_its_rows(
    tiny_tokenizer, monkeypatch
) -> None:
    """A batch's time bound (there to stop a chat template that loops) was rows x 50 ms, at
    least 10 s: 100 documents of 700 KB, split into pieces, took longer to tokenize and were
    refused as "the chat template took over 10 s". The bound grows with the batch's text."""
    import time

    from expert_cli.data import workers

    monkeypatch.setattr(workers, "TEMPLATE_SECONDS", 0.05)
    monkeypatch.setattr(workers, "ROW_SECONDS", 0.0)
    text = " ".join(f"word{i % 997}" for i in range(200_000))  # about 1.6 MB
    formatter = Formatter(tiny_tokenizer, "text", 512, "split")
    began = time.monotonic()
    table = workers.bounded_format(formatter, {"text": [text, text]})
    assert time.monotonic() - began > 0.05  # past the bound of rows alone
    assert table.num_rows == 2 and table.column("status").to_pylist() == [SPLIT, SPLIT]
    monkeypatch.setattr(workers, "CHAR_SECONDS", 0.0)  # the bound of rows alone, as it was
    with pytest.raises(workers.UserError, match="tokenizing 2 examples took over 0 s, far past"):
        workers.bounded_format(formatter, {"text": [text, text]})  # no template renders them
