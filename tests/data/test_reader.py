"""The one data reader of `check` and the build: any JSON layout, streamed, errors that name
the file and the place and never quote the file's data; `check` and `pretokenize` agree on
every data fault generated here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import run_main, write_expert

from expert_cli.data.file_text import shown_names
from expert_cli.data.reader import Columns, read_rows
from expert_cli.errors import UserError

SECRET = "HF_TOKEN=hf_topsecretvalue0123456789"
INSTRUCTIONS = [
    {"instruction": f"Say {i}", "input": "", "output": f"{i} is a number"} for i in range(6)
]


def rows_of(path: Path, fmt: str = "json") -> list:
    return [row for _, row in read_rows(path, fmt)]


def test_every_json_layout_gives_the_same_rows(tmp_path: Path) -> None:
    layouts = {
        "lines.jsonl": "\n".join(json.dumps(r) for r in INSTRUCTIONS) + "\n",
        "array.json": json.dumps(INSTRUCTIONS),
        "pretty.json": json.dumps(INSTRUCTIONS, indent=4),  # how instruction sets ship
        "lines.json": "\n".join(json.dumps(r) for r in INSTRUCTIONS),  # .json holding lines
        "objects.json": "\n".join(json.dumps(r, indent=2) for r in INSTRUCTIONS),
        "bom.jsonl": "\ufeff" + "\n".join(json.dumps(r) for r in INSTRUCTIONS),
    }
    columns = {k: [r[k] for r in INSTRUCTIONS] for k in INSTRUCTIONS[0]}
    layouts["columns.json"] = json.dumps(columns)  # the datasets library reads it so
    layouts["wrapped.json"] = json.dumps({"version": "1.0", "data": INSTRUCTIONS}, indent=1)
    for name, text in layouts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert rows_of(tmp_path / name) == INSTRUCTIONS, name
    where = [w for w, _ in read_rows(tmp_path / "wrapped.json", "json")]
    assert where[:2] == ["row 1 of 'data'", "row 2 of 'data'"]


def test_a_lone_object_that_is_an_example_stays_one(tmp_path: Path) -> None:
    """One example a file: a conversation, a text beside a list of objects, a mapped column
    beside one: none of them is columns or wrapped examples."""
    chat = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    capybara = {"conversation": [{"input": "q", "output": "a"}]}
    text = {"text": "a document", "refs": [{"url": "x"}]}
    for i, value in enumerate((chat, capybara, text)):
        (tmp_path / f"{i}.json").write_text(json.dumps(value))
        assert rows_of(tmp_path / f"{i}.json") == [value]
    mapped = {"body": "a document", "refs": [{"url": "x"}]}
    (tmp_path / "mapped.json").write_text(json.dumps(mapped))
    rows = read_rows(tmp_path / "mapped.json", "json", Columns(frozenset({"body"}), frozenset()))
    assert [row for _, row in rows] == [mapped]
    assert rows_of(tmp_path / "mapped.json") == [{"url": "x"}]  # no column of it read: wrapped
    (tmp_path / "one.json").write_text(json.dumps([{"data": [{"text": "a"}]}]))  # in an array
    assert rows_of(tmp_path / "one.json") == [{"data": [{"text": "a"}]}]
    turns = {"conversation": [{"human": "q", "assistant": "a"}]}  # turns of unknown keys
    (tmp_path / "turns.json").write_text(json.dumps(turns))
    assert rows_of(tmp_path / "turns.json") == [turns]


@pytest.mark.parametrize(
    "item", [{"instruction": "q", "response": "a"}, {"text": "a"}, {"messages": []}]
)
def test_examples_wrapped_in_one_key_are_read_whatever_their_columns(tmp_path: Path, item) -> None:
    """Only items holding a turn's key (`output`) were unwrapped: `{"data": [{"text": ...}]}`
    was one row of a `data` column ("cannot tell which column")."""
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"version": 2, "data": [item, item]}))
    assert rows_of(path) == [item, item]


def test_near_misses_of_the_json_layouts_are_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text('{"data": [{"text": "a"}], "data": [{"text": "b"}]}')  # the first lost
    with pytest.raises(UserError, match="the key 'data' holding the examples is given more"):
        rows_of(path)
    path.write_text(json.dumps({"version": 2, "data": []}))
    assert rows_of(path) == []  # no examples, said as such by the scan
    path.write_text(json.dumps({"version": 2, "data": [{"text": "a"}, "oops"]}))
    assert rows_of(path) == [{"text": "a"}, "oops"]  # the row check names row 2 of 'data'
    path.write_text(json.dumps({"instruction": ["a"], "output": ["b"], "source": "alpaca"}))
    with pytest.raises(UserError) as err:
        rows_of(path)
    assert str(err.value) == (
        f"{path}: an object of columns ('instruction' is a list) whose 'source' is not a list; "
        "expected a list a column, all of one length, or one object an example (JSON Lines)"
    )
    lines = tmp_path / "rows.jsonl"  # a JSON Lines line is one example, whatever it holds
    columns = {"instruction": ["a", "b"], "output": ["c", "d"]}
    lines.write_text(json.dumps(columns) + "\n")
    assert rows_of(lines, "jsonl") == rows_of(lines) == [columns]
    # the file's name decides, not the format the manifest gives (HiveLLM's say jsonl)
    path.write_text(json.dumps(columns))
    assert len(rows_of(path, "jsonl")) == 2


def test_columns_under_one_key_and_examples_by_split(tmp_path: Path) -> None:
    """`{"data": {"instruction": [...], ...}}` (datasets' field="data" of columns) and
    `{"train": [...], "test": [...]}` were "field 'instruction' missing; this row has 'data'"."""
    path = tmp_path / "rows.json"
    columns = {"instruction": ["a", "b"], "output": ["c", "d"]}
    path.write_text(json.dumps({"version": 1, "data": columns}))
    assert rows_of(path) == [
        {"instruction": "a", "output": "c"},
        {"instruction": "b", "output": "d"},
    ]
    path.write_text(json.dumps({"train": [{"text": "a"}], "test": [{"text": "b"}]}))
    with pytest.raises(UserError) as err:
        rows_of(path)
    assert str(err.value).startswith(
        f"{path}: an object whose 'test', 'train' each hold a list of examples (one a split?)"
    )
    chat = {"messages": [{"role": "user", "content": "q"}], "meta": {"id": 1}}  # one example
    path.write_text(json.dumps(chat))
    assert rows_of(path) == [chat]


def test_a_large_json_value_is_read_in_linear_time(tmp_path: Path, monkeypatch) -> None:
    """A value read 1 MB at a time was decoded again after each read: 270 MB took 99 s to
    refuse. Each read now takes as much again as is held."""
    import expert_cli.data.file_text as file_text
    import expert_cli.data.json_rows as json_rows

    calls = []
    real = file_text.Text.read

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(file_text, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(file_text.Text, "read", counted)
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"text": ["x" * 100] * 5000}))  # ~530 KB: 520 reads
    decodes = []
    real_decode = json.JSONDecoder.raw_decode

    def decode(self, s, idx=0):
        decodes.append(1)
        return real_decode(self, s, idx)

    monkeypatch.setattr(json_rows.json.JSONDecoder, "raw_decode", decode)
    assert len(rows_of(path)) == 5000
    assert len(calls) > 500 and len(decodes) < 20


def test_columns_of_different_lengths_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "columns.json"
    path.write_text(json.dumps({"instruction": ["a", "b", "c"], "output": ["x", "y"]}))
    with pytest.raises(UserError) as err:
        rows_of(path)
    assert str(err.value) == (
        f"{path}: an object of columns whose lengths differ ('instruction' has 3 items, "
        "'output' 2); expected columns of one length, or one object an example (JSON Lines)"
    )


def test_a_number_past_pythons_digit_limit_does_not_stop_the_read(tmp_path: Path) -> None:
    """A field of 5,000 digits beside the text (Python refuses to read over 4,300 into an int)
    was a ValueError traceback in check and train; it reads as infinity, the row as a row."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a", "id": ' + "9" * 5000 + '}\n{"text": "b", "id": 7}\n')
    rows = rows_of(path)
    assert [r["text"] for r in rows] == ["a", "b"]
    assert rows[0]["id"] == float("inf") and rows[1]["id"] == 7


def test_values_cut_by_the_read_buffer_are_whole(tmp_path: Path, monkeypatch) -> None:
    import expert_cli.data.file_text as reader

    monkeypatch.setattr(reader, "CHUNK_BYTES", 7)  # every value spans several reads
    rows = [{"n": 12345678901234, "text": "é" * 9}, {"n": 1.5e300, "text": "x"}, [1, 2]]
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    assert rows_of(tmp_path / "a.json") == rows
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert rows_of(tmp_path / "b.jsonl") == rows


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"text": "a"}\n{"text": "b"\n', ":2: invalid JSON"),
        ('[{"text": "a"}, {"text": "b"}', ":1: the JSON array is not closed with ]"),
        ('[{"text": "a"}] {"text": "b"}', ":1: text after the closing ] of the array"),
        ("[" * 5000 + "]" * 5000, ":1: JSON nested too deeply"),
        (  # json's words end in " at", its place cut off: "(Invalid control character at)"
            '{"text": "a"}\n{"text": "tab\there"}\n',
            ":2: invalid JSON (a control character (a tab, a line break) inside a string, where",
        ),
        ('{"text": "a"}\n{"text": "cut sh', ":2: invalid JSON (a string that is never closed)"),
        (  # `cat a.jsonl b.jsonl` of files saved with a BOM: "invalid JSON (Expecting value)"
            '{"text": "a"}\n\ufeff{"text": "b"}\n',
            ":2: a byte order mark (U+FEFF) inside the file, where a file saved with one",
        ),
    ],
)
def test_broken_json_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "d.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        rows_of(path)
    assert err.value.lines[0].startswith(f"{path}{message}")


def test_bytes_that_are_not_text_name_their_line_and_offset(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "ok"}\n' * 7000 + b'{"text": "\xff"}\n')
    with pytest.raises(UserError, match=rf"^{path}:7001: byte 105010: not UTF-8 text"):
        rows_of(path)
    path.write_text('{"text": "utf-16"}\n', encoding="utf-16")
    with pytest.raises(UserError, match=rf"^{path}:1: byte 0: not UTF-8 text .* UTF-16"):
        rows_of(path)
    # after a byte order mark, in a CSV record over two lines, a character cut by the buffer
    path.write_bytes(b'\xef\xbb\xbftext\nok\n"two\nlines"\n\xc3\xa9\xc3\n')
    import expert_cli.data.file_text as reader

    for chunk in (reader.CHUNK_BYTES, 4):
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
        with pytest.raises(UserError, match=rf"^{path}:5: byte 25: not UTF-8 text"):
            rows_of(path, "csv")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_strings_that_are_not_utf8_in_parquet_and_arrow(tmp_path: Path, fmt: str) -> None:
    """Arrow keeps a string's bytes as written: reading them was a UnicodeDecodeError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = [SECRET.encode()] * 1500 + [SECRET.encode() + b"\xff"]
    table = pa.table(
        {"id": list(range(1501)), "body": pa.array(raw, pa.binary()).view(pa.string())}
    )
    path = tmp_path / f"d.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1000)
    with pytest.raises(UserError) as err:
        rows_of(path, fmt)
    assert err.value.lines == [
        f"{path}: row 1501: column 'body' holds bytes that are not UTF-8 text; "
        "expected UTF-8 strings"
    ]


def test_a_damaged_parquet_row_group_is_named_by_its_rows(tmp_path: Path) -> None:
    """The reader reads a row group's pages ahead: damage in the third group of three was
    reported at row 1025 (the second batch). Each group is read on its own and named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"instruction": f"{SECRET} {i} " * 4, "output": f"answer {i} " * 4} for i in range(300)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=100)
    assert len(rows_of(path, "parquet")) == 300
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(0)
    data = bytearray(path.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    for at in range(start + 30, start + chunk.total_compressed_size - 30):
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    read = []
    with pytest.raises(UserError) as err:
        for _, row in read_rows(path, "parquet"):
            read.append(row)
    assert len(read) == 200 and read[-1] == rows[199]  # the sound groups, in full
    assert err.value.lines == [
        f"{path}: rows 201-300 (row group 3 of 3) cannot be read: the file is damaged or cut "
        "short; write or copy it again"
    ]


def test_csv_rows_and_ragged_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('text,note\n"a, with comma",x\n"multi\nline",\nb,y,extra\n')
    with pytest.raises(UserError, match=rf"{path}: row 3: 3 fields where the header has 2"):
        rows_of(path, "csv")
    path.write_text('text,note\n"a, with comma",x\n"multi\nline",\n')
    assert rows_of(path, "csv") == [
        {"text": "a, with comma", "note": "x"},
        {"text": "multi\nline", "note": None},
    ]


def test_a_quote_out_of_place_in_csv_is_named(tmp_path: Path) -> None:
    """A quote never closed (row 2 of 100) took every later row into one answer, exit 0 and
    the data lost; `"a"b` read as `ab`. Each is named: the line the quote opens on."""
    path = tmp_path / "d.csv"
    rows = ["instruction,output", *(f"q{i},a{i}" for i in range(100))]
    rows[2] = 'q1,"a1 with a stray quote'
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(UserError) as err:
        rows_of(path, "csv")
    assert err.value.lines == [
        f'{path}: line 3: a quoted field opens on this line and is never closed (a stray "?); '
        "every later line was read into it"
    ]
    path.write_text('instruction,output\nq0,a0\nq1,"a1"b\n')
    with pytest.raises(UserError, match=rf"{path}: line 3: not valid CSV \(',' expected after"):
        rows_of(path, "csv")
    path.write_text('instruction,output\nq0,"a ""quoted"" word"\nq1,"two\nlines"')  # no last \n
    assert [r["output"] for r in rows_of(path, "csv")] == ['a "quoted" word', "two\nlines"]


@pytest.mark.parametrize("chunk", [None, 3])
def test_csv_lines_end_only_at_cr_and_lf(tmp_path: Path, monkeypatch, chunk: int | None) -> None:
    """pandas writes a field holding a form feed, \\u2028 or \\x85 unquoted: the reader ended
    lines there too (str.splitlines), so one example became two, or the row was refused as
    ragged. \\r\\n cut by the read buffer between \\r and \\n is one line end."""
    import expert_cli.data.file_text as reader

    if chunk:
        monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
    path = tmp_path / "d.csv"
    path.write_bytes("text,note\r\npage\x0cbreak,a\r\nsep\u2028line\x85x,b\r\nc,f\rd,e\n".encode())
    assert rows_of(path, "csv") == [
        {"text": "page\x0cbreak", "note": "a"},
        {"text": "sep\u2028line\x85x", "note": "b"},
        {"text": "c", "note": "f"},
        {"text": "d", "note": "e"},
    ]


def test_column_names_from_a_file_are_shown_only_when_they_look_like_names() -> None:
    assert shown_names(["text", "my column"]) == "'text', 'my column'"
    assert shown_names([SECRET]) == f"<a {len(SECRET)}-character name>"
    assert shown_names([f"c{i}" for i in range(20)]).endswith("and 8 more")


# --------------------------------------------------------------------------- the CLI


def _expert(tmp_path: Path, model_dir: Path, data: bytes | str, name: str, **dataset) -> Path:
    manifest = write_expert(tmp_path / "e", model_dir, rows=4)
    folder = manifest.parent
    target = folder / "data" / name
    target.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    spec = json.loads(manifest.read_text())
    spec["training"]["dataset"] = {"path": f"data/{name}", **dataset}
    manifest.write_text(json.dumps(spec))
    return manifest


def _agree(capsys, monkeypatch, manifest: Path) -> tuple[int, str]:
    """`check` and `pretokenize` on the same manifest: both usable, or both exit 2 naming the
    same problem; never a traceback (an exception escaping the CLI fails the test)."""
    check = run_main(capsys, monkeypatch, "check", "--manifest", str(manifest))
    build = run_main(capsys, monkeypatch, "pretokenize", "--manifest", str(manifest))
    for code, out, err in (check, build):
        assert code in (0, 2), out + err
    assert check[0] == build[0], (check, build)
    if check[0] == 2:  # check's first problem is what pretokenize stopped on
        problems = check[1].split("problems:", 1)[1].split("\n  - ")[1:]
        first = " ".join(problems[0].split("\n")[0].split())
        assert first in " ".join((build[1] + build[2]).split()), (first, build)
    return check[0], check[1] + build[1] + build[2]


GOOD = "".join(json.dumps({"text": f"example {i}"}) + "\n" for i in range(500))
_LINES = GOOD.splitlines(keepends=True)
FAULTS = {
    "line_400": ("".join(_LINES[:399] + ['{"text": oops}\n'] + _LINES[400:]), "data.jsonl", {}),
    "pretty_array": (json.dumps(INSTRUCTIONS * 20, indent=4), "data.json", {}),
    "json_of_lines": (GOOD, "data.json", {}),
    "binary": (bytes(range(256)) * 40, "data.jsonl", {}),
    "utf16": (GOOD.encode("utf-16"), "data.jsonl", {}),
    "csv_on_jsonl": (GOOD, "data.jsonl", {"format": "csv"}),
    "null_content": (
        json.dumps({"messages": [{"role": "user", "content": None}]}) + "\n",
        "data.jsonl",
        {},
    ),
    "deep": ('{"text": ' + "[" * 990 + "]" * 990 + "}\n", "data.jsonl", {}),
    "ragged_csv": ("text,x\na,1\nb,2,3\n", "data.csv", {}),
    "environ_csv": (
        SECRET + "\x00PATH=/bin\x00",
        "environ",
        {"format": "csv"},
    ),
    "shadow_csv": ("root:$6$salt$hash:19000:0:99999:7:::\n", "shadow", {"format": "csv"}),
    "lone_surrogate": (GOOD + json.dumps({"text": SECRET + "\ud800"}) + "\n", "data.jsonl", {}),
    "all_empty": ('{"text": ""}\n{"text": "  "}\n' * 3, "data.jsonl", {}),  # check said usable
}
USABLE = {"pretty_array", "json_of_lines"}


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(FAULTS))
def test_check_and_pretokenize_agree(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path, fault: str
) -> None:
    data, name, dataset = FAULTS[fault]
    manifest = _expert(tmp_path, tiny_model_dir, data, name, **dataset)
    code, output = _agree(capsys, monkeypatch, manifest)
    assert code == (0 if fault in USABLE else 2), output
    assert "hf_topsecretvalue" not in output and "$6$salt" not in output
    if code == 2:
        assert "data/" in output  # the file is named
    if fault == "line_400":
        assert "data.jsonl:400: invalid JSON" in output, output
    if fault == "lone_surrogate":  # the build crashed writing Arrow, leaving .build-* behind
        assert "data.jsonl:501: field 'text' (field_mapping.text) contains a lone" in output
        assert not list(manifest.parent.rglob(".build-*"))
    if fault == "all_empty":
        assert "training.dataset: no training example is left after formatting (6 read, every " in (
            " ".join(output.split())
        )
    if fault == "pretty_array":  # read as instruction data: prompts are masked, not trained
        tokens, trained = (
            int(n.replace(",", ""))
            for n in re.search(r"tokens ([\d,]+), trained ([\d,]+)", output).groups()
        )
        assert 0 < trained < tokens / 2, output


@pytest.mark.slow
def test_checking_a_large_file_keeps_memory_bounded(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Peak memory of `check` over a 128 MB JSON Lines file stays below half the file's size
    (1 GB took half a minute of the suite to write and read; the bound does not depend on
    the size, and a reader that held the file would pass it)."""
    line = json.dumps({"text": "x" * 1000}) + "\n"
    manifest = _expert(tmp_path, tiny_model_dir, line, "big.jsonl")
    path = manifest.parent / "data" / "big.jsonl"
    with path.open("a") as fh:
        block = line * 1000
        for _ in range((1 << 27) // len(block) + 1):
            fh.write(block)
    assert path.stat().st_size >= 1 << 27
    code = (
        "import resource, sys; from pathlib import Path;"
        "from expert_cli.data.checks import check_manifest;"
        "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss;"
        f"m = Path({str(manifest)!r});"
        "check_manifest(m, quick=10); before = peak();"  # torch, tokenizer, all imported
        "r = check_manifest(m);"
        "print(sum(r.rows_checked.values()), r.problems, peak() - before)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows, added_kib = int(out.stdout.split()[0]), int(out.stdout.split()[-1])
    assert rows > 125_000
    assert "[]" in out.stdout  # no problems
    assert added_kib < 64 * 1024, added_kib  # reading 128 MB adds under 64 MB to its peak


def test_an_arrays_rows_are_named_by_their_number_and_line(tmp_path: Path) -> None:
    """`json.dump` writes a whole array on one line: every row's error said `file.json:1`."""
    from expert_cli.config.resolve import SourceRef
    from expert_cli.data.rows import scan_local

    rows = [{"text": "a"}, {"text": "b"}, {"text": 3}]
    for indent, line in ((None, 1), (2, 8)):
        path = tmp_path / "train.json"
        path.write_text(json.dumps(rows, indent=indent))
        scan = scan_local(SourceRef(kind="local", location=str(path), format="json"), None, None)
        with pytest.raises(UserError) as info:
            list(scan.rows)
        assert info.value.lines == [
            f"{path}: row 3, line {line}: field 'text' (field_mapping.text) is a number, "
            "expected a string"
        ]
