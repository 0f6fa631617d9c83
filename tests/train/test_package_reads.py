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
    write = package_module.pm.write_tar

    def cut_write(dest: Path, members: dict) -> None:
        write(dest, members)
        dest.write_bytes(dest.read_bytes()[:-100])

    monkeypatch.setattr(package_module.pm, "write_tar", cut_write)
    target = tmp_path / "dist" / "x.expert"
    with pytest.raises(UserError) as caught:
        build_package(hand_built_run(tmp_path), target)
    assert caught.value.lines == [_cut(target)]
    assert not target.parent.exists()  # neither the package, its checksum nor the folder made


def _with_text(package: Path, dest: Path, change: object, *raw: tuple[str, str]) -> Path:
    """A copy of `package` whose manifest `change(manifest)` edits, its text then given each
    `(old, new)` of `raw` (what json.dumps cannot write: -0, NaN, a key twice)."""
    members = _members(package)
    manifest = json.loads(members["manifest.json"])
    change(manifest)  # type: ignore[operator]
    text = json.dumps(manifest)
    for old, new in raw:
        assert old in text
        text = text.replace(old, new, 1)
    return write_tar_gz(dest, {**members, "manifest.json": text.encode()})


def test_what_only_a_run_bounds_is_read_in_a_package_as_hivellms_loader_reads_it(
    package: Path, tmp_path: Path
) -> None:
    """A package's manifest is HiveLLM's: its loader reads any text where a run takes a few
    names, any number where a run has bounds, and skips keys it does not know. check
    --package refused each of these (a run's rules), and HiveLLM's loader reads them all."""

    def loose(m: dict) -> None:
        m.update(name="my expert", version="1.0.0 beta", notes=0.5, _c="\ud800")
        base = m["base_models"][0]
        base.update(quantization="q4_k_m", prompt_template="mistral", dtype="bf16")
        base["adapters"][0]["init_std"] = 0.02
        m["training"]["notes"] = "A100"
        m["training"]["packaging_checkpoint"] = "best"
        m["training"]["distributed"] = {"strategy": "horovod"}
        m["training"]["config"].update(
            rank=2048, epochs=20000, learning_rate=2.0, batch_size=0, warmup_steps=200_000_000,
            lr_scheduler="reduce_lr_on_plateau", optim="adamw_hf", max_seq_length=8,
            save_strategy="STEPS", metric_for_best_model="eval_accuracy",
            greater_is_better=True, fp16=True, bf16=True, seed=-1, warmup_ratio=1.5,
            use_rslora=True, lr_scheduler_kwargs={"foo": 1},
        )  # fmt: skip
        m["training"]["decoding"] = {"stop_sequences": ["x"] * 65, "min_p": 1.5}

    twice = ('"notes": 0.5', '"notes": 1, "notes": 1e400')  # past a double: a key it skips
    copy = _with_text(package, tmp_path / "loose.expert", loose, twice)
    done = run_here("check", "--package", str(copy), "--json")
    report = json.loads(done.stdout)
    assert (done.returncode, report["problems"]) == (0, []), report["problems"]
    assert (
        "manifest.json: notes: given more than once; HiveLLM's loader uses the last"
        in (report["notes"])
    )
    assert report["name"] == "my expert"


def test_what_hivellms_loader_refuses_past_its_types_is_named(
    package: Path, tmp_path: Path
) -> None:
    """serde_json's reading, which Python's json does not share: a learning rate that is 0
    as an f32, -0 where a whole number is read, NaN, nesting past 128 levels, a lone
    surrogate, a number past a double's range, a field of its own given twice. Each was
    accepted; each is named now. Paths out of the package are refused too."""

    def deep(m: dict) -> None:
        nested: object = 1
        for _ in range(130):
            nested = [nested]
        m["training"]["dataset"] = {"tasks": {"a": nested}}

    def keep(m: dict) -> None:
        return None

    cases = {
        "tiny": (lambda m: m["training"]["config"].update(learning_rate=1e-50), ()),
        "zero": (keep, (('"warmup_steps": 0', '"warmup_steps": -0'),)),
        "nan": (keep, (('"description"', '"x": NaN, "description"'),)),
        "deep": (deep, ()),
        "surrogate": (lambda m: m.update(description="\ud800"), ()),
        "huge": (
            lambda m: m.update(routing={"keywords": ["k"], "priority": 0.5}),
            (('"priority": 0.5', '"priority": 1e400'),),
        ),
        "twice": (keep, (('"rank"', '"rank": 4, "rank"'),)),
        "outside": (lambda m: m["training"].update(decoding={"grammar_file": "../g.gbnf"}), ()),
    }
    expected = {
        "tiny": "manifest.json: training.config.learning_rate: expected a number above 0 (it "
        "is 0 as the 32-bit float the loader reads) (HiveLLM's loader refuses it)",
        "zero": "manifest.json: training.config.warmup_steps: -0, a decimal number to the "
        "loader; expected a whole number from 0 to 4,294,967,295 (HiveLLM's loader refuses it)",
        "nan": "manifest.json: holds NaN or Infinity, which is not JSON (HiveLLM's loader "
        "refuses it)",
        "deep": "manifest.json: training.dataset.tasks: nested over 128 levels deep, past what "
        "the loader reads (HiveLLM's loader refuses it)",
        "surrogate": "manifest.json: description: a string that is no Unicode text (a lone "
        "surrogate); expected a string (HiveLLM's loader refuses it)",
        "huge": "manifest.json: routing.priority: a number out of a double's range; expected a "
        "number (HiveLLM's loader refuses it)",
        "twice": "manifest.json: training.config.rank: given more than once (HiveLLM's loader "
        "refuses it)",
        "outside": "manifest.json: training.decoding.grammar_file: leads out of the package; "
        "expected a file inside it",
    }
    for name, (change, raw) in cases.items():
        copy = _with_text(package, tmp_path / f"{name}.expert", change, *raw)
        assert _checked(copy) == (2, [expected[name]]), name

    # the bytes of the whole text: each was "not a JSON object", whatever was wrong
    members = _members(package)
    text = members["manifest.json"].decode()
    cut = text.rstrip()[:-1]  # its last brace cut: the parser stops at the end of the text
    encoded = {
        "manifest.json: starts with a byte-order mark, which HiveLLM's loader refuses; save "
        "it as UTF-8 without one": b"\xef\xbb\xbf" + text.encode(),
        "manifest.json: UTF-16 text; expected UTF-8 JSON": text.encode("utf-16"),
        "manifest.json: UTF-16 text (NUL bytes); expected UTF-8 JSON": text.encode("utf-16-le"),
        "manifest.json: not UTF-8 text; expected UTF-8 JSON": text.replace(
            '"', '"\u00e9', 1
        ).encode("cp1252"),
        f"manifest.json: not valid JSON (line {cut.count(chr(10)) + 1})": cut.encode(),
    }
    for i, (said, data) in enumerate(encoded.items()):
        copy = write_tar_gz(tmp_path / f"enc{i}.expert", {**members, "manifest.json": data})
        assert _checked(copy) == (2, [said]), said


def test_check_package_of_no_file_says_so_in_one_line(tmp_path: Path) -> None:
    """A missing path or a folder printed an empty table of files, "not a file" and a
    checksum of nothing: one line now, saying what the path is."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "loop").symlink_to("loop")
    for name, what in (
        ("nope.expert", "does not exist"),
        ("folder", "is not a file"),
        ("loop", "is a link loop (a link that leads back to itself), not a file"),
    ):
        done = run_here("check", "--package", str(tmp_path / name))
        said = " ".join(done.stderr.split())
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"--package {tmp_path / name}: {what}; expected a .expert file" in said, said
        assert done.stdout == "" and "sha256" not in said
