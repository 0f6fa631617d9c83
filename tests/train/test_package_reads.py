"""`check --package` reads what HiveLLM's own loader reads (hivellm/expert @ 9cd24b1,
cli/src/manifest.rs): a decoding `top_k` of 0 (a usize there), a dataset described by its
`tasks` alone (any JSON there); and an archive that stops part-way is said to be cut short,
naming the file, where it was called no gzip-compressed tar."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import pytest
from train_helpers import hand_built_manifest, hand_built_run, run_here, write_tar_gz

import expert_cli.train.package as package_module
from expert_cli.errors import UserError
from expert_cli.train.package import build_package

LOADER = "(HiveLLM's loader refuses it)"


def _cut(path: Path) -> str:
    return (
        f"{path}: cut short (truncated): the archive stops part-way, as an interrupted "
        "download or copy, or a full disk, leaves it; copy it again"
    )


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package `expert-cli package` wrote, of a run built by hand."""
    target = tmp_path / "x.expert"
    done = run_here("package", "--adapter", str(hand_built_run(tmp_path)), "--output", str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _members(package: Path) -> dict[str, bytes]:
    with tarfile.open(package, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def _with_training(package: Path, dest: Path, section: str, value: object) -> Path:
    """A copy of `package` whose manifest's training.SECTION is `value`."""
    members = _members(package)
    manifest = json.loads(members["manifest.json"])
    manifest["training"][section] = value
    return write_tar_gz(dest, {**members, "manifest.json": json.dumps(manifest).encode()})


def _checked(path: Path) -> tuple[int, list[str]]:
    done = run_here("check", "--package", str(path), "--json")
    return done.returncode, json.loads(done.stdout)["problems"]


def test_a_top_k_of_0_is_read_as_hivellms_loader_reads_it(package: Path, tmp_path: Path) -> None:
    decoding = {"temperature": 0.2, "top_k": 0}
    assert _checked(_with_training(package, tmp_path / "k0.expert", "decoding", decoding)) == (
        0,
        [],
    )
    above = {"temperature": 0.2, "top_k": 2_000_000}  # over a run's bound: a usize loads it
    assert _checked(_with_training(package, tmp_path / "kbig.expert", "decoding", above))[0] == 0
    hot = {"temperature": 3.0, "top_p": 1.5}  # over a run's bounds: any f64 loads
    assert _checked(_with_training(package, tmp_path / "hot.expert", "decoding", hot)) == (0, [])
    text = _with_training(package, tmp_path / "t.expert", "decoding", {"temperature": "hot"})
    assert _checked(text)[0] == 2
    negative = _with_training(package, tmp_path / "k-1.expert", "decoding", {"top_k": -1})
    assert _checked(negative) == (
        2,
        [
            "manifest.json: training.decoding.top_k: a whole number; expected a whole number "
            f"of 0 or more {LOADER}"
        ],
    )
    # a run's own manifest keeps its bound (what generate samples with): 0 is exit 2 there
    source = hand_built_manifest()
    source["training"]["decoding"]["top_k"] = 0
    (tmp_path / "k0").mkdir()
    run = hand_built_run(tmp_path / "k0", source)
    done = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "y.expert"))
    assert done.returncode == 2
    assert "manifest.source.json: training.decoding.top_k: Input should be greater than or " in (
        done.stderr
    )


def test_a_dataset_of_tasks_alone_is_read_as_hivellms_loader_reads_it(
    package: Path, tmp_path: Path
) -> None:
    for name, dataset in {
        "tasks": {"tasks": {"sql": {"train": "datasets/sql/train.jsonl", "weight": 0.4}}},
        "listed": {"type": "multi_task", "tasks": [{"name": "sql", "path": "sql.jsonl"}]},
        "nulls": {"path": None, "generation": None, "type": None, "tasks": {"a": {}}},
        "generated": {"generation": {"domain": "d", "task": "t", "count": 9, "provider": "p"}},
    }.items():
        copy = _with_training(package, tmp_path / f"{name}.expert", "dataset", dataset)
        assert _checked(copy) == (0, []), name
    nothing = _with_training(package, tmp_path / "none.expert", "dataset", {"format": "jsonl"})
    assert _checked(nothing) == (
        2,
        [f"manifest.json: training.dataset: expected a path, generation or tasks {LOADER}"],
    )


def test_an_archive_cut_short_is_said_so_naming_it(package: Path, tmp_path: Path) -> None:
    data = package.read_bytes()
    for name, cut in {"half": data[: len(data) // 2], "trailer": data[:-1]}.items():
        (short := tmp_path / f"{name}.expert").write_bytes(cut)
        assert _checked(short) == (2, [_cut(short)]), name
    tar = gzip.decompress(data)  # a whole gzip stream of a tar that stops in the manifest
    (inner := tmp_path / "inner.expert").write_bytes(gzip.compress(tar[:700]))
    assert _checked(inner) == (2, [_cut(inner)])
    for end in (20, 100, 130, 300, 511):  # a whole gzip of a tar cut inside its first header
        (first := tmp_path / f"first{end}.expert").write_bytes(gzip.compress(tar[:end]))
        assert _checked(first) == (2, [_cut(first)]), end
    not_gzip = "not a gzip-compressed tar archive"
    (zip_file := tmp_path / "zip.expert").write_bytes(b"PK\x03\x04 not a tar")
    assert _checked(zip_file) == (2, [f"{zip_file}: {not_gzip}"])
    (empty := tmp_path / "empty.expert").write_bytes(b"")
    assert _checked(empty) == (2, [f"{empty}: an empty file, {not_gzip}"])
    # short or long, text or binary: a gzip of what begins no tar header holds no tar
    for name, held in {
        "text": b"hello\n" * 200,
        "short": b"hello\n" * 50,
        "zip": b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(range(256)),
        "nothing": b"",
    }.items():
        (text := tmp_path / f"{name}.expert").write_bytes(gzip.compress(held))
        assert _checked(text) == (
            2,
            [
                f"{text}: {not_gzip} (a gzip file that holds no tar: another kind of file, or "
                "a damaged copy)"
            ],
        ), name


def test_package_says_its_own_archive_cut_short_of_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`package` reads what it wrote back: an archive cut short there is said of the package,
    not of the temporary file it was written to, and nothing is left."""
    write = package_module._write_tar

    def cut_write(dest: Path, members: dict) -> None:
        write(dest, members)
        dest.write_bytes(dest.read_bytes()[:-100])

    monkeypatch.setattr(package_module, "_write_tar", cut_write)
    target = tmp_path / "dist" / "x.expert"
    with pytest.raises(UserError) as caught:
        build_package(hand_built_run(tmp_path), target)
    assert caught.value.lines == [_cut(target)]
    assert list(target.parent.iterdir()) == []  # neither the package nor its checksum
