"""What a data folder's files are read as: suffixes in any case, .ndjson, the text formats
compressed with gzip, bz2 or xz, linked subfolders followed (each once); the files no format
reads are named in a note. Of a Parquet or Arrow file only the mapped columns are decoded."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl
from train_helpers import text_rows

from expert_cli.config.refs import folder_data_files, suffix_format, unread_notes
from expert_cli.config.resolve import SourceRef
from expert_cli.data.reader import Columns, read_rows
from expert_cli.data.rows import scan_local
from expert_cli.errors import UserError


def _lines(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _ref(path: Path, fmt: str | None = None) -> SourceRef:
    return SourceRef(kind="local", location=str(path), format=fmt, field="training.dataset.path")


def _texts(ref: SourceRef, mapping: dict | None = None) -> list[str]:
    return [row["text"] for row in scan_local(ref, None, mapping).rows]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("a.JSONL", "jsonl"),
        ("b.Parquet", "parquet"),
        ("c.ndjson", "jsonl"),
        ("d.jsonl.gz", "jsonl"),
        ("e.csv.bz2", "csv"),
        ("f.json.XZ", "json"),
        ("g.v2.jsonl", "jsonl"),
        ("h.parquet.gz", None),  # only the text formats are read compressed
        ("i.gz", None),
        ("j.jsonl.zst", None),
        ("k.tsv", None),
        ("jsonl", None),
    ],
)
def test_the_format_a_name_stands_for(name: str, fmt: str | None) -> None:
    assert suffix_format(name) == fmt


def test_a_folder_reads_every_data_file_and_names_those_it_does_not(tmp_path: Path) -> None:
    rows = text_rows(30)
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.JSONL").write_bytes(_lines(rows[:5]))
    (data / "b.ndjson").write_bytes(_lines(rows[5:10]))
    (data / "c.jsonl.gz").write_bytes(gzip.compress(_lines(rows[10:15])))
    (data / "d.jsonl.bz2").write_bytes(bz2.compress(_lines(rows[15:20])))
    (data / "e.jsonl.xz").write_bytes(lzma.compress(_lines(rows[20:25])))
    elsewhere = tmp_path / "elsewhere"
    write_jsonl(elsewhere / "f.jsonl", rows[25:30])
    os.symlink(elsewhere, data / "linked")
    os.symlink(elsewhere, data / "again")  # the same folder twice: read once
    os.symlink(data, elsewhere / "up")  # a loop: not followed
    os.symlink(tmp_path, data / "parent")  # a link up to a folder holding this one: not followed
    (data / "notes.tsv").write_text("a\tb\n")
    (data / "g.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd")
    (data / "README.md").write_text("about")
    (data / ".hidden.jsonl").write_bytes(_lines(rows[:1]))

    assert sorted(_texts(_ref(data))) == sorted(r["text"] for r in rows)
    assert len(folder_data_files(data)) == 6
    assert unread_notes([_ref(data)]) == [
        f"training.dataset.path: 2 file(s) in {data} are not read (g.jsonl.zst, notes.tsv): "
        "jsonl, json, csv, parquet and arrow files are, the first three also as .gz, .bz2 or .xz"
    ]
    clean = tmp_path / "clean"
    write_jsonl(clean / "train.jsonl", rows)
    (clean / "README.md").write_text("about")
    assert unread_notes([_ref(clean)]) == []


def test_damaged_and_unreadable_compressed_files_are_named(tmp_path: Path) -> None:
    whole = gzip.compress(_lines(text_rows(200)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError) as said:
        _texts(_ref(cut))
    assert str(said.value) == f"{cut}: its gzip data is damaged or cut short (EOFError)"

    packed = tmp_path / "rows.parquet.gz"
    packed.write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(UserError, match="a compressed file of no format the reader knows"):
        _texts(_ref(packed))
    with pytest.raises(UserError, match="a compressed parquet file; only jsonl, json and csv"):
        _texts(_ref(packed, "parquet"))

    zstd = tmp_path / "rows.jsonl.zst"
    zstd.write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(UserError, match="zstd-compressed; decompress it"):
        _texts(_ref(zstd, "jsonl"))

    bare = tmp_path / "rows.gz"  # no inner suffix: read once the format is given
    bare.write_bytes(gzip.compress(_lines(text_rows(3))))
    with pytest.raises(UserError, match="a compressed file of no format the reader knows"):
        _texts(_ref(bare))
    assert len(_texts(_ref(bare, "jsonl"))) == 3


def _wide(path: Path, fmt: str) -> None:
    """Three rows whose `text` is mapped and whose `blob` column holds bytes that are not
    UTF-8 (decoding it is an error): read only when the whole row is."""
    table = pa.table(
        {
            "text": ["one", "two", "three"],
            "blob": pa.array([b"\xff" * 10] * 3, pa.binary()).view(pa.string()),
        }
    )
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as out:
            out.write_table(table)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_only_the_mapped_columns_of_a_columnar_file_are_decoded(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"train.{fmt}"
    _wide(path, fmt)
    assert _texts(_ref(path), {"text": "text"}) == ["one", "two", "three"]
    assert _texts(_ref(path)) == ["one", "two", "three"]  # detected from the schema
    with pytest.raises(UserError, match="column 'blob' holds bytes that are not UTF-8"):
        list(read_rows(path, fmt))  # every column, as before
    # a mapped column missing: every column read, so the check names the row's others
    wanted = Columns(frozenset({"prompt", "text"}), frozenset({"prompt"}))
    assert wanted.of(["text", "blob"]) is None
    assert Columns(frozenset({"text", "system"}), frozenset({"text"})).of(["blob", "text"]) == [
        "text"
    ]


def test_a_folder_of_too_many_files_is_named(tmp_path: Path, monkeypatch) -> None:
    from expert_cli.config import refs

    monkeypatch.setattr(refs, "MAX_FOLDER_FILES", 3)
    for i in range(4):
        write_jsonl(tmp_path / "data" / f"{i}.jsonl", text_rows(1))
    with pytest.raises(UserError) as said:
        folder_data_files(tmp_path / "data")
    assert str(said.value) == (
        f"{tmp_path / 'data'}: holds more than 3 files (a link to a large folder?); name a "
        "folder that holds the data alone"
    )


def test_the_libraries_records_and_links_to_nothing_in_a_data_folder(tmp_path: Path) -> None:
    """`hf download --local-dir` of an older dataset holds dataset_infos.json beside its data:
    it was read as a data file (a row without `text`, or "files of several formats"); the
    datasets library passes it over, and so does the reader. A data file's link that leads
    nowhere (a download cut short) was passed over in silence, its rows missing."""
    folder = tmp_path / "ds"
    write_jsonl(folder / "data" / "train.jsonl", [{"text": f"a {i}"} for i in range(3)])
    for name in ("dataset_infos.json", "dataset_info.json", "config.json"):
        (folder / name).write_text(json.dumps({"default": {"features": {}}}))
    assert [p.name for p in folder_data_files(folder)] == ["train.jsonl"]
    assert _texts(_ref(folder)) == ["a 0", "a 1", "a 2"]
    assert unread_notes([_ref(folder)]) == []
    (folder / "data" / "part-1.jsonl").symlink_to(tmp_path / "blob-never-written")
    (folder / "notes.txt").symlink_to(tmp_path / "nothing")  # not data: passed over
    with pytest.raises(UserError) as err:
        _texts(_ref(folder))
    assert err.value.lines == [
        f"{folder / 'data' / 'part-1.jsonl'}: is a link to a path that does not exist; a data "
        f"file of the folder {folder} (download it again, or remove the link)"
    ]


def test_tab_separated_values_are_said_to_be_converted(tmp_path: Path) -> None:
    """A .tsv said "set training.dataset.format"; `format: csv` then read each line as one
    column and said it could not tell which column holds the data: a dead end either way."""
    from expert_cli.config.sources import _format_problem

    path = tmp_path / "train.tsv"
    path.write_text("instruction\toutput\nq\ta\n")
    with pytest.raises(UserError) as err:
        _texts(_ref(path))
    assert err.value.lines[0].startswith(
        f"{path}: tab-separated values are not read; convert the file to CSV or JSON Lines"
    )
    said = _format_problem(path, ("csv", "training.dataset.format"), "training.dataset.path")
    assert said == (
        f"training.dataset.format: csv reads commas, and {path} holds tab-separated values by "
        "its name; convert it to CSV or JSON Lines"
    )
