"""Files and paths a hostile or careless user hands over: devices, pipes, link loops, NUL bytes,
names thousands of characters long, JSON nested a thousand deep, text in other encodings, files
of the wrong format. Each is exit 2 with a message naming the file or field, never a traceback,
never a hang, never the file's data.

The CLI's own entry point runs in this process (an exception escaping it fails the test with
its traceback), under an alarm so that a read that never ends fails instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

from expert_cli.cli.app import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "experts" / "demo"
SECRET = "hf_SECRETtoken0123456789"
DEEP = 990


@pytest.fixture(autouse=True)
def _alarm() -> Iterator[None]:
    def _hung(signum: int, frame: Any) -> None:
        raise TimeoutError("the command did not finish in 30 s (a read that never ends?)")

    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(30)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """Run `expert-cli ARGS`; assert exit 2 and return stdout + stderr, one line."""
    monkeypatch.setattr(sys, "argv", ["expert-cli", *args])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as exited:
        main()
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert exited.value.code == 2, text
    assert "Traceback" not in text and SECRET not in text
    return text


def demo_copy(tmp_path: Path, dataset: dict[str, Any] | None = None) -> Path:
    """The demo expert's manifest in `tmp_path` (its model and data by absolute path), with
    `dataset` keys replacing those of its training.dataset block."""
    data = json.loads((DEMO / "manifest.json").read_text(encoding="utf-8"))
    data["base_models"][0]["name"] = str(DEMO / "model")
    block = data["training"]["dataset"]
    block.pop("validation_path", None)
    block.update({"path": str(DEMO / "data" / "train.jsonl"), **(dataset or {})})
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(data), encoding="utf-8")
    return manifest


def loop(tmp_path: Path, name: str) -> Path:
    a, b = tmp_path / f"{name}", tmp_path / f"{name}.other"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


# --------------------------------------------------------------------------- the manifest


def test_a_pipe_as_manifest_is_refused_without_waiting(capsys, monkeypatch, tmp_path) -> None:
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    text = run(capsys, monkeypatch, "check", "--manifest", str(fifo))
    assert f"{fifo}: not a regular file" in text


def test_a_device_as_manifest_is_refused(capsys, monkeypatch) -> None:
    text = run(capsys, monkeypatch, "check", "--manifest", "/dev/zero")
    assert "/dev/zero: not a regular file" in text


def test_a_link_loop_as_manifest(capsys, monkeypatch, tmp_path) -> None:
    manifest = loop(tmp_path, "manifest.json")
    text = run(capsys, monkeypatch, "check", "--manifest", str(manifest))
    assert f"--manifest {manifest}: a loop of symbolic links" in text


def test_a_nul_byte_and_a_huge_name_as_manifest(capsys, monkeypatch, tmp_path) -> None:
    # (a NUL cannot reach us from a shell; from another program it is exit 2 all the same)
    run(capsys, monkeypatch, "check", "--manifest", f"{tmp_path}/man\x00ifest.json")
    long = tmp_path / ("m" * 5000 + ".json")
    text = run(capsys, monkeypatch, "check", "--manifest", str(long))
    assert "m" * 5000 not in text and len(text) < 600  # the path is shortened in the message


def test_a_manifest_nested_990_deep(capsys, monkeypatch, tmp_path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"name": ' + "[" * DEEP + "]" * DEEP + "}", encoding="utf-8")
    text = run(capsys, monkeypatch, "check", "--manifest", str(manifest))
    assert str(manifest) in text and ("nested too deeply" in text or "name" in text)


# --------------------------------------------------------------------------- the data


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("device", "/dev/zero: not a regular file"),
        ("nul", "contains a NUL byte"),
        ("loop", "a loop of symbolic links"),
        ("long name", "File name too long"),
        ("nested", "nested too deeply"),
        ("utf-16", "not UTF-8"),
        ("bad byte", "byte 100000"),
        ("csv on jsonl", "csv"),
        ("empty parquet", "no examples (the file has no rows)"),
        ("parquet not utf-8", "row 3: column 'text' holds bytes that are not UTF-8 text"),
    ],
)
def test_hostile_data_files(capsys, monkeypatch, tmp_path, case: str, expected: str) -> None:
    path, fmt = _data_file(tmp_path, case)
    manifest = demo_copy(tmp_path, {"path": path, "format": fmt})
    for command in ("check", "pretokenize"):  # the two agree: same exit code, same cause
        text = run(capsys, monkeypatch, command, "--manifest", str(manifest))
        assert expected.lower() in text.lower(), (command, text)
        assert "x" * 300 not in text  # no long path or data quoted
    # a first build stopped by its data left .cache/pretokenized/.lock beside the manifest
    assert not (manifest.parent / ".cache").exists()


def _data_file(tmp_path: Path, case: str) -> tuple[str, str]:
    rows = [{"text": f"{SECRET} row {i}"} for i in range(3)]
    if case == "device":
        return "/dev/zero", "jsonl"
    if case == "nul":
        return f"{tmp_path}/tra\x00in.jsonl", "jsonl"
    if case == "loop":
        loop(tmp_path, "train.jsonl")
        return "train.jsonl", "jsonl"  # relative: resolved against the manifest's folder
    if case == "long name":
        return f"{tmp_path}/{'x' * 5000}.jsonl", "jsonl"
    target = tmp_path / "train.jsonl"
    if case == "nested":
        write_jsonl(target, rows)
        with target.open("a", encoding="utf-8") as f:
            f.write('{"text": ' + "[" * DEEP + "]" * DEEP + "}\n")
    elif case == "utf-16":
        target.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-16")
    elif case == "bad byte":
        line = json.dumps({"text": SECRET + "a" * 60}).encode() + b"\n"
        body = line * (100_000 // len(line) + 2)
        target.write_bytes(body[:100_000] + b"\xff" + body[100_001:])
        return str(target), "jsonl" if body[100_000:100_001] != b"\n" else "jsonl"
    elif case == "csv on jsonl":
        write_jsonl(target, rows)
        return str(target), "csv"
    elif case == "empty parquet":
        target = tmp_path / "train.parquet"
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), target)
        return str(target), "parquet"
    elif case == "parquet not utf-8":  # Arrow keeps a string's bytes as they were written
        target = tmp_path / "train.parquet"
        raw = [b"ok", SECRET.encode(), SECRET.encode() + b"\xff"]
        pq.write_table(pa.table({"text": pa.array(raw, pa.binary()).view(pa.string())}), target)
        return str(target), "parquet"
    return str(target), "jsonl"


def test_chat_messages_with_null_content(capsys, monkeypatch, tmp_path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]},
        {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "x"}]},
    ]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    manifest = demo_copy(tmp_path, {"path": str(path), "field_mapping": {"messages": "messages"}})
    text = run(capsys, monkeypatch, "check", "--manifest", str(manifest))
    assert f"{path}:2" in text and "content" in text


def _leftovers(folder: Path) -> list[str]:
    """What a failed build left under `folder`: unfinished builds, temporary folders."""
    return sorted(str(p) for p in folder.rglob("*") if p.name.startswith((".build-", ".tmp-")))


def _chat(answer: str) -> dict[str, Any]:
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer}]
    return {"messages": turns}


@pytest.mark.parametrize(
    ("rows", "mapping", "expected"),
    [
        (
            [{"text": "fine"}, {"text": SECRET + "\ud800 and on"}],
            {"text": "text"},
            "field 'text' (field_mapping.text) contains a lone surrogate at character "
            f"{len(SECRET)} (a \\ud800-\\udfff escape without its pair)",
        ),
        (
            [_chat("fine"), _chat("\udfff")],
            {"messages": "messages"},
            "field 'messages' (field_mapping.messages) item 1: content contains a lone surrogate",
        ),
    ],
    ids=["text", "chat content"],
)
def test_a_lone_surrogate_in_the_data(
    capsys, monkeypatch, tmp_path, rows: list, mapping: dict, expected: str
) -> None:
    """`"\\ud800"` is valid JSON but not Unicode: Arrow cannot write it as UTF-8. `check`
    said usable and the build crashed, leaving its `.build-*` folder behind."""
    path = tmp_path / "train.jsonl"  # json.dumps writes the surrogate as its \\u escape
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="ascii")
    manifest = demo_copy(tmp_path, {"path": str(path), "field_mapping": mapping})
    out = tmp_path / "run"
    for command in ("check", "pretokenize", "train"):
        extra = ("--output", str(out)) if command == "train" else ()
        text = run(capsys, monkeypatch, command, "--manifest", str(manifest), *extra)
        assert f"{path}:2: {expected}" in text, (command, text)
        assert "expected valid Unicode text" in text, (command, text)
    assert _leftovers(tmp_path) == []
    assert not (tmp_path / ".cache").exists()  # the build made it: it goes, lock file and all
    assert not out.exists()


@pytest.mark.parametrize("case", ["device", "under a file", "proc", "default under a file"])
def test_a_token_cache_folder_that_cannot_be_written(
    capsys, monkeypatch, tmp_path, case: str
) -> None:
    """`training.config.pretokenized_cache` on a device, under a regular file, in /proc, or a
    default `.cache/pretokenized` where `.cache` is a file: `check` says so, and `pretokenize`
    and `train` stop with the same message (an OSError traceback before; /proc/self made the
    build wait forever for a lock file it could not create)."""
    (tmp_path / "notes.txt").write_text("not a folder")
    cache, expected = {
        "device": ("/dev/null", "/dev/null is not a folder"),
        "under a file": (
            str(tmp_path / "notes.txt" / "cache"),
            f"{tmp_path}/notes.txt/cache is under {tmp_path}/notes.txt, which is not a folder",
        ),
        "proc": ("/proc/self", "/proc/self is not writable"),
        "default under a file": (
            None,
            f"{tmp_path}/.cache/pretokenized is under {tmp_path}/.cache, which is not a folder",
        ),
    }[case]
    manifest = demo_copy(tmp_path)
    data = json.loads(manifest.read_text(encoding="utf-8"))
    if cache is None:
        (tmp_path / ".cache").write_text("a file where the default cache folder goes")
    else:
        data["training"]["config"]["pretokenized_cache"] = cache
    manifest.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "run"
    for command in ("check", "pretokenize", "train"):
        extra = ("--output", str(out)) if command == "train" else ()
        text = run(capsys, monkeypatch, command, "--manifest", str(manifest), *extra)
        assert f"training.config.pretokenized_cache: {expected}; expected a writable folder" in (
            text
        ), (command, text)
    assert _leftovers(tmp_path) == [] and not out.exists()


def test_a_token_cache_on_a_read_only_file_system(capsys, monkeypatch, tmp_path) -> None:
    """A folder of mode 555 does not stop root (these tests' user); a read-only mount does."""
    mount = tmp_path / "ro"
    mount.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)]
    if subprocess.run(cmd, capture_output=True).returncode != 0:
        pytest.skip("a tmpfs cannot be mounted here (needs root on Linux)")
    try:
        manifest = demo_copy(tmp_path)
        data = json.loads(manifest.read_text(encoding="utf-8"))
        data["training"]["config"]["pretokenized_cache"] = str(mount / "cache")
        manifest.write_text(json.dumps(data), encoding="utf-8")
        expected = (
            f"training.config.pretokenized_cache: {mount}/cache would be created in {mount}, "
            "which is not writable; expected a writable folder"
        )
        for command in ("check", "pretokenize"):
            text = run(capsys, monkeypatch, command, "--manifest", str(manifest))
            assert expected in text, (command, text)
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


# --------------------------------------------------------------------------- outputs


def test_link_loops_as_output_folders(capsys, monkeypatch, tmp_path) -> None:
    manifest = demo_copy(tmp_path)
    out = loop(tmp_path, "out")
    text = run(capsys, monkeypatch, "train", "--manifest", str(manifest), "--output", str(out))
    assert f"--output {out}: a loop of symbolic links" in text
    text = run(capsys, monkeypatch, "merge", "--adapter", str(out), "--output", str(tmp_path))
    assert f"--adapter {out}: a loop of symbolic links" in text
