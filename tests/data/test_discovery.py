"""find-datasets against a Hugging Face cache built by the test, in both layouts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from expert_cli.cli import app
from expert_cli.data.discovery import discover, parse_dataset_ref
from expert_cli.errors import UserError


def blob(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


@pytest.fixture
def hf_home(tmp_path: Path) -> Path:
    """An HF_HOME with two `datasets` cache entries and one hub dataset in two snapshots."""
    home = tmp_path / "hf"
    alpaca = home / "datasets" / "tatsu-lab___alpaca" / "default" / "0.0.0" / "abc123"
    blob(alpaca / "alpaca-train.arrow", 5000)
    (alpaca / "dataset_info.json").write_text("{}")  # 2 bytes
    blob(home / "datasets" / "squad" / "plain_text" / "1.0.0" / "def456" / "squad.arrow", 300)
    blob(home / "datasets" / "downloads" / "extracted" / "x" / "y.arrow", 99_999)  # not a dataset
    repo = home / "hub" / "datasets--HuggingFaceH4--ultrachat_200k"
    blob(repo / "blobs" / "aaa", 20_000)
    blob(repo / "blobs" / "bbb", 100)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev2\n")
    for rev, names in (("rev1", ["aaa"]), ("rev2", ["aaa", "bbb"])):
        data = repo / "snapshots" / rev / "data"
        data.mkdir(parents=True)
        for name in names:
            os.symlink(f"../../../blobs/{name}", data / f"{name}.parquet")
    return home


@pytest.fixture
def experts(tmp_path: Path) -> Path:
    root = tmp_path / "experts"
    (root / "a").mkdir(parents=True)
    (root / "a" / "manifest.json").write_text(
        json.dumps(
            {
                "name": "a",
                "training": {
                    "dataset": {
                        "path": "HuggingFaceH4/ultrachat_200k::train_sft::default",
                        "validation_path": "squad::validation",
                    }
                },
            }
        )
    )
    (root / "b" / "data").mkdir(parents=True)
    (root / "b" / "data" / "local.jsonl").write_text("{}\n")
    (root / "b" / "manifest.json").write_text(
        json.dumps(
            {
                "name": "b",
                "training": {
                    "dataset": {
                        "type": "multi_task",
                        "tasks": {
                            "x": {"train": "tatsu-lab/alpaca"},
                            "y": {"train": "data/local.jsonl"},
                            "z": {
                                "train": "openai/gsm8k::train::main",
                                "valid": "openai/gsm8k::test::main",
                            },
                        },
                    }
                },
            }
        )
    )
    return root


def test_both_layouts_sizes_and_order(hf_home: Path) -> None:
    result = discover(hf_home, None)
    rows = [
        (d["name"], d["config"], d["revision"], d["size_bytes"], d["layout"])
        for d in result["datasets"]
    ]
    assert rows == [
        ("HuggingFaceH4/ultrachat_200k", None, "rev2", 20_100, "hub"),  # blobs counted once
        ("tatsu-lab/alpaca", "default", "0.0.0/abc123", 5002, "datasets"),
        ("squad", "plain_text", "1.0.0/def456", 300, "datasets"),
    ]


def test_env_variables_choose_the_caches(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert len(discover(None, None)["datasets"]) == 3
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "elsewhere"))
    names = [d["name"] for d in discover(None, None)["datasets"]]
    assert names == ["tatsu-lab/alpaca", "squad"]
    monkeypatch.setenv("HF_DATASETS_CACHE", str(hf_home / "hub"))
    assert [d["name"] for d in discover(None, None)["datasets"]] == []
    # a variable naming a file was scanned as an empty cache, exit 0; a folder not made yet
    # is an empty cache
    (hf_home / "a-file").write_text("x")
    for name in ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE"):
        with monkeypatch.context() as env:
            env.setenv(name, str(hf_home / "a-file"))
            with pytest.raises(UserError) as err:
                discover(None, None)
        assert err.value.lines == [
            f"{name}: {hf_home / 'a-file'} is not a folder; expected the Hugging Face cache "
            f"folder (or leave {name} unset)"
        ]
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "not-yet"))
    assert [d["name"] for d in discover(None, None)["datasets"]] == []


def test_manifest_usage_and_missing(hf_home: Path, experts: Path) -> None:
    result = discover(hf_home, experts)
    by_name = {d["name"]: d for d in result["datasets"]}
    assert by_name["HuggingFaceH4/ultrachat_200k"]["used_by"] == [str(experts / "a/manifest.json")]
    assert by_name["tatsu-lab/alpaca"]["used_by"] == [str(experts / "b/manifest.json")]
    assert by_name["squad"]["used_by"] == [str(experts / "a/manifest.json")]  # validation only
    refs = {r["field"]: r for m in result["manifests"] for r in m["datasets"]}
    assert refs["training.dataset.path"]["split"] == "train_sft"
    assert refs["training.dataset.tasks.y.train"]["kind"] == "local"
    assert refs["training.dataset.tasks.y.train"]["cached"] is None
    assert refs["training.dataset.tasks.z.train"] == {
        "id": "openai/gsm8k",
        "split": "train",
        "config": "main",
        "kind": "hub",
        "cached": False,
        "field": "training.dataset.tasks.z.train",
    }
    fields = [r["field"] for r in result["manifests"][1]["datasets"]]
    assert fields == [
        "training.dataset.tasks.x.train",
        "training.dataset.tasks.y.train",
        "training.dataset.tasks.z.train",
        "training.dataset.tasks.z.valid",
    ]
    assert result["manifests"][0]["datasets"][1]["field"] == "training.dataset.validation_path"
    assert result["missing"] == [
        {"id": "openai/gsm8k", "needed_by": [str(experts / "b/manifest.json")]}
    ]


def test_dataset_refs(tmp_path: Path) -> None:
    assert parse_dataset_ref("org/name", tmp_path)["kind"] == "hub"
    assert parse_dataset_ref("gsm8k::train", tmp_path)["kind"] == "hub"
    assert parse_dataset_ref("train.jsonl", tmp_path)["kind"] == "local"
    assert parse_dataset_ref("../data/x", tmp_path)["kind"] == "local"
    (tmp_path / "corpus").mkdir()
    assert parse_dataset_ref("corpus", tmp_path)["kind"] == "local"  # exists next to manifest


def test_broken_manifest_is_reported(hf_home: Path, tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    result = discover(hf_home, tmp_path)
    assert len(result["problems"]) == 1
    assert "bad/manifest.json: cannot read manifest" in result["problems"][0]
    assert "invalid JSON" in result["problems"][0]


def test_missing_folders_name_the_option(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--cache-dir: .*nope does not exist; expected a folder"):
        discover(tmp_path / "nope", None)
    with pytest.raises(UserError, match="--experts: .*nope does not exist; expected a folder"):
        discover(tmp_path, tmp_path / "nope")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UserError, match="--cache-dir: .*a-file is not a folder; expected a folder"):
        discover(tmp_path / "a-file", None)
    # one repository's folder listed nothing, silently (its blobs/ and snapshots/ are no cache)
    repo = tmp_path / "hub" / "datasets--o--n"
    blob(repo / "snapshots" / "abc" / "t.jsonl", 10)
    with pytest.raises(UserError) as info:
        discover(repo, None)
    assert info.value.lines == [
        f"--cache-dir {repo}: one repository's folder of the hub cache; give the cache folder "
        f"that holds it ({tmp_path / 'hub'})"
    ]
    assert [e["name"] for e in discover(tmp_path / "hub", None)["datasets"]] == ["o/n"]


def test_unreadable_places_are_passed_over(tmp_path: Path) -> None:
    """/proc as a cache: entries that cannot be listed or looked at (EINVAL, EACCES) are
    passed over, and nothing there looks like a dataset."""
    result = discover(Path("/proc"), None)
    assert result["datasets"] == []
    hub = tmp_path / "hub" / "datasets--o--n"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_bytes(b"\x1b[2J" + b"x" * 10_000)  # not a ref
    (hub / "blobs").mkdir()
    (hub / "blobs" / "b").write_bytes(b"12345")
    (hub / "blobs" / "dangling").symlink_to(tmp_path / "gone")
    assert discover(tmp_path, None)["empty"] == [str(hub)]  # no snapshot: no download
    (hub / "snapshots" / "s").mkdir(parents=True)
    (hub / "snapshots" / "s" / "data.jsonl").symlink_to(hub / "blobs" / "b")
    assert discover(tmp_path, None)["empty"] == [str(hub)]  # main names no snapshot held
    (hub / "refs" / "main").write_text("s")
    (entry,) = discover(tmp_path, None)["datasets"]
    assert (entry["name"], entry["revision"], entry["size_bytes"]) == ("o/n", "s", 5)


def test_a_hub_folder_with_no_downloaded_file_is_not_listed(tmp_path: Path) -> None:
    """`datasets--weird/` with nothing in it, or a snapshot of empty files, was listed as a
    cached dataset of 0 B that `check` then called not cached: it is named apart."""
    for name in ("datasets--weird", "datasets--o--stopped/snapshots/abc"):
        (tmp_path / "hub" / name).mkdir(parents=True)
    (tmp_path / "hub" / "datasets--o--stopped" / "snapshots" / "abc" / "t.jsonl").touch()
    blob(tmp_path / "hub" / "datasets--o--kept" / "snapshots" / "abc" / "t.jsonl", 10)
    # refs/main naming no snapshot held (another, nothing, a path): check finds none to read;
    # a repository without refs/main (a pinned download) is listed by its snapshots
    for name, ref in (("elsewhere", "b" * 40), ("blank", ""), ("path", "../../etc"), ("pin", None)):
        blob(tmp_path / "hub" / f"datasets--o--{name}" / "snapshots" / "abc" / "t.jsonl", 10)
        if ref is not None:
            (tmp_path / "hub" / f"datasets--o--{name}" / "refs").mkdir()
            (tmp_path / "hub" / f"datasets--o--{name}" / "refs" / "main").write_text(ref)
    # names the hub library never makes were listed as `/x`, `a/b/c`, a name with a newline
    for name in ("datasets--", "datasets----x", "datasets--a--b--c", "datasets--u--d\nx"):
        blob(tmp_path / "hub" / name / "snapshots" / "abc" / "t.jsonl", 10)
    result = discover(tmp_path, None)
    assert [(e["name"], e["revision"]) for e in result["datasets"]] == [
        ("o/kept", "abc"),
        ("o/pin", "abc"),
    ]
    assert result["empty"] == [
        str(tmp_path / "hub" / f"datasets--{n}")
        for n in ("o--blank", "o--elsewhere", "o--path", "o--stopped", "weird")
    ]
    out = CliRunner().invoke(
        app, ["find-datasets", "--cache-dir", str(tmp_path)], env={"COLUMNS": "300"}
    )
    assert out.exit_code == 0, out.output
    assert (
        f"not listed: {tmp_path / 'hub' / 'datasets--weird'} (no snapshot to read: they hold no "
        "downloaded file, or its refs/main names none of them" in " ".join(out.output.split())
    )
    # a mistyped HF_HOME listed nothing and said nothing
    assert result["absent"] == [str(tmp_path / "datasets")]
    env = {"HF_HOME": str(tmp_path / "typo"), "COLUMNS": "300"}
    out = CliRunner().invoke(app, ["find-datasets"], env=env)
    assert (
        out.exit_code == 0 and f"not there: {tmp_path / 'typo' / 'hub'} (no dataset" in out.output
    )


def test_cli_json_and_table(hf_home: Path, experts: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(
        app, ["find-datasets", "--cache-dir", str(hf_home), "--experts", str(experts), "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [d["size_bytes"] for d in data["datasets"]] == [20_100, 5002, 300]
    assert data["missing"][0]["id"] == "openai/gsm8k"
    out = runner.invoke(
        app,
        ["find-datasets", "--cache-dir", str(hf_home), "--experts", str(experts)],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    # long names and paths wrap (never get cut) on a narrow terminal: find rows by their sizes
    order = [
        next(i for i, ln in enumerate(lines) if size in ln)
        for size in ("19.6 KB", "4.9 KB", "300 B")
    ]
    assert "squad" in out.output and "tatsu-lab" in out.output
    assert order == sorted(order)
    assert "19.6 KB" in out.output
    assert "not cached: openai/gsm8k" in out.output
    # the manifests' table on a narrow terminal: its paths fold, never end in an ellipsis
    narrow = runner.invoke(
        app,
        ["find-datasets", "--cache-dir", str(hf_home), "--experts", str(experts)],
        env={"COLUMNS": "60"},
    )
    assert narrow.exit_code == 0, narrow.output
    usage = narrow.output[narrow.output.index("datasets named by manifests") :]
    assert "\u2026" not in usage and "manifest" in usage
    # each cached dataset's path on a line of its own, whole (a 7-column table folded it
    # over a dozen lines at 80 columns)
    lines = narrow.output.splitlines()
    for entry in data["datasets"]:
        assert f"    {entry['path']}" in lines, entry["path"]
    manifest = experts / "b" / "manifest.json"
    said = f"{manifest}: training.dataset.tasks.z.train openai/gsm8k (hub, NOT cached)"
    assert said in lines and f"not cached: openai/gsm8k (needed by {manifest})" in lines


def test_an_empty_folder_option_is_refused(capsys, monkeypatch, tmp_path: Path) -> None:
    """`--cache-dir ""` searched the current folder (pathlib reads "" as "."), and listed what
    it found there as cached datasets; so did `--experts ""` for manifests."""
    from train_helpers import run_main

    monkeypatch.chdir(tmp_path)
    for option in ("--cache-dir", "--experts"):
        code, out, err = run_main(capsys, monkeypatch, "find-datasets", option, "")
        assert code == 2 and out == "", out + err
        assert f"{option}: is empty; expected a folder's path" in err
