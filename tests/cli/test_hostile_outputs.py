"""What `check` passed and `package` or `merge` then crashed on: a manifest value no JSON
writer can write back (a lone surrogate, NaN), a name that is no file name, and `--output`
paths that cannot take what the command writes (a file among its folders, a folder, a special
file, /proc). Each is exit 2 naming the field or --output and what is expected, without a
traceback, and nothing is written or left behind.

Run folders are built by hand (an adapter the commands never load), so no test trains."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from train_helpers import hand_built_manifest as _manifest
from train_helpers import hand_built_run as _run_folder
from train_helpers import run_main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "experts" / "demo"
SECRET = "QQsecretQQ"


def _exit_2(capsys, monkeypatch, *args: str) -> str:
    code, out, err = run_main(capsys, monkeypatch, *args)
    text = " ".join((out + err).split())
    assert code == 2, text
    assert "Traceback" not in text and SECRET not in text
    return text


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


# --------------------------------------------------------------------------- check


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"training.decoding": {"temperature": float("nan")}}, "training.decoding.temperature:"),
        ({"training.decoding": {"top_p": 2, "top_k": -5}}, "training.decoding.top_k:"),
        ({"training.decoding": {"grammar_file": "gone.gbnf"}}, "training.decoding.grammar_file:"),
        ({"name": "../" + SECRET}, "name: expected 1 to 128 ASCII letters"),
        ({"description": SECRET + "\ud800"}, "description: contains a lone surrogate"),
        ({"constraints": {"load_order": float("inf")}}, "constraints.load_order: not a finite"),
    ],
)
def test_check_refuses_what_later_commands_failed_on(
    capsys, monkeypatch, tmp_path: Path, edit: dict, expected: str
) -> None:
    data = json.loads((DEMO / "manifest.json").read_text(encoding="utf-8"))
    data["base_models"][0]["name"] = str(DEMO / "model")
    data["training"]["dataset"]["path"] = str(DEMO / "data" / "train.jsonl")
    data["training"]["dataset"].pop("validation_path", None)
    for key, value in edit.items():
        if key == "training.decoding":
            data["training"]["decoding"] = value
        else:
            data[key] = value
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(data), encoding="utf-8")  # NaN and \ud800 as JSON writes them
    text = _exit_2(capsys, monkeypatch, "check", "--manifest", str(manifest))
    assert f"manifest.json: {expected}" in text and "manifest is not usable" in text


# --------------------------------------------------------------------------- package: the manifest


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            _manifest(description=SECRET + "\ud800", _comment="\udc00"),
            [
                "manifest.source.json: description: contains a lone surrogate",
                "manifest.source.json: _comment: contains a lone surrogate",
            ],
        ),
        (
            json.dumps(_manifest(constraints={"load_order": 6}, perf={"x": 1})).replace(
                '"load_order": 6', '"load_order": NaN'
            ),
            ["manifest.source.json: constraints.load_order: not a finite number"],
        ),
        (
            json.dumps(_manifest(perf={"latency_ms_overhead": 3})).replace("3}", "1e400}"),
            ["manifest.source.json: perf.latency_ms_overhead: not a finite number"],
        ),
        (_manifest(name="../../" + SECRET), ["manifest.source.json: name: expected 1 to 128"]),
        (_manifest(version="1/../2"), ["manifest.source.json: version: expected 1 to 128"]),
        (
            _manifest(training={"dataset": {"path": "d"}, "decoding": {"top_k": True}}),
            ["manifest.source.json: training.decoding.top_k: Input should be a valid integer"],
        ),
    ],
)
def test_package_refuses_a_manifest_it_cannot_write_back(
    capsys, monkeypatch, tmp_path: Path, source, expected: list[str]
) -> None:
    run = _run_folder(tmp_path, source)
    before = _tree(tmp_path)
    for output in ([], ["--output", str(tmp_path / "x.expert")]):
        text = _exit_2(capsys, monkeypatch, "package", "--adapter", str(run), *output)
        for fragment in expected:
            assert fragment in text, text
        assert _tree(tmp_path) == before  # no package, no checksum, no temporary file


# --------------------------------------------------------------------------- package --output


def test_package_output_under_a_file(capsys, monkeypatch, tmp_path: Path) -> None:
    run = _run_folder(tmp_path)
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine\n")
    for output in (blocker / "x.expert", blocker / "deeper" / "x.expert"):
        text = _exit_2(
            capsys, monkeypatch, "package", "--adapter", str(run), "--output", str(output)
        )
        assert (
            f"--output {output}: {blocker} is a file, not a folder; give a path in a folder" in text
        )
    assert blocker.read_text() == "mine\n"


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("name", ["dist", "old.expert"])
def test_package_output_at_a_folder(capsys, monkeypatch, tmp_path: Path, name, force) -> None:
    run = _run_folder(tmp_path)
    folder = tmp_path / name
    (folder / "keep").mkdir(parents=True)
    args = ("package", "--adapter", str(run), "--output", str(folder), *force)
    text = _exit_2(capsys, monkeypatch, *args)
    assert f"--output {folder}: is a folder; give the package's file name, e.g. {folder}/" in text
    assert [p.name for p in folder.iterdir()] == ["keep"]


def test_package_checksum_path_taken_by_a_folder(capsys, monkeypatch, tmp_path: Path) -> None:
    run = _run_folder(tmp_path)
    package = tmp_path / "x.expert"
    (tmp_path / "x.expert.sha256").mkdir()
    args = ("package", "--adapter", str(run), "--output", str(package), "--force")
    text = _exit_2(capsys, monkeypatch, *args)
    assert f"--output {package}.sha256: is a folder or a special file, which --force" in text
    assert not package.exists()


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("/proc/x.expert", "--output /proc/x.expert: /proc cannot be written to"),
        ("/proc/new/x.expert", "--output /proc/new/x.expert: /proc cannot be written to"),
        ("/proc/self/x.expert", "cannot be written to (No such file or directory)"),
    ],
)
def test_package_output_where_nothing_can_be_written(
    capsys, monkeypatch, tmp_path: Path, output: str, expected: str
) -> None:
    run = _run_folder(tmp_path)
    text = _exit_2(capsys, monkeypatch, "package", "--adapter", str(run), "--output", output)
    assert expected in text and "give a path in a folder you can write" in text


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # `sha256sum -c` read the checksum file's line as two
        ("x\ny.expert", "a name holding a control character (a newline, a tab) cannot be given"),
        ("a\tb.expert", "a name holding a control character"),
        # 249 bytes: its .sha256 is 256, which no file system takes (exit 1 after the build)
        ("a" * 242 + ".expert", "a name of at most 248 bytes (its checksum file adds .sha256"),
    ],
)
def test_package_output_names_its_checksum_file_cannot_hold(
    capsys, monkeypatch, tmp_path: Path, name: str, expected: str
) -> None:
    run = _run_folder(tmp_path)
    before = _tree(tmp_path)
    text = _exit_2(capsys, monkeypatch, "package", "--adapter", str(run), "--output", name)
    assert expected in text
    assert _tree(tmp_path) == before


def test_a_default_package_name_too_long_names_where_it_comes_from(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """A name and a version of 120 characters each make a default name of over 248 bytes:
    exit 2 saying it comes from the manifest (no --output was given to blame)."""
    run = _run_folder(tmp_path, _manifest(name="n" * 120, version="1." + "0" * 118))
    before = _tree(tmp_path)
    text = _exit_2(capsys, monkeypatch, "package", "--adapter", str(run))
    assert "the package's name, from the manifest's name, version and base model, is over" in text
    assert "give a shorter one with --output" in text and "--output /" not in text
    assert _tree(tmp_path) == before


def test_the_longest_package_name_is_written(capsys, monkeypatch, tmp_path: Path) -> None:
    """248 bytes, its checksum file 255: the temporary name it is built under (`.tmp-NAME-PID`,
    over 255) failed with exit 1 after the build; it is shortened."""
    run = _run_folder(tmp_path)
    name = "é" * 120 + "a.expert"  # 248 bytes in UTF-8
    assert len(name.encode()) == 248
    code, out, err = run_main(
        capsys, monkeypatch, "package", "--adapter", str(run), "--output", str(tmp_path / name)
    )
    assert code == 0, out + err
    digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    assert (tmp_path / f"{name}.sha256").read_text(encoding="utf-8") == f"{digest}  {name}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, f"{name}.sha256", "run"])


def test_package_output_in_new_folders_is_made(capsys, monkeypatch, tmp_path: Path) -> None:
    """The refusals above are not refusing everything: new folders are made, nothing is left
    but the package and its checksum, and a second run needs --force."""
    run = _run_folder(tmp_path)
    package = tmp_path / "dist" / "v1" / "x.expert"
    code, out, err = run_main(
        capsys, monkeypatch, "package", "--adapter", str(run), "--output", str(package)
    )
    assert code == 0, out + err
    assert sorted(p.name for p in package.parent.iterdir()) == ["x.expert", "x.expert.sha256"]
    text = _exit_2(capsys, monkeypatch, "package", "--adapter", str(run), "--output", str(package))
    assert f"--output {package}: exists; choose another name or --force" in text


# --------------------------------------------------------------------------- merge --output


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("file", "is not a folder; give a new or empty folder"),
        ("under a file", "is a file, not a folder; give a path in a folder"),
        ("busy folder", "exists and is not empty; choose a new folder"),
        ("/proc", "/proc cannot be written to"),
        ("/dev/null", "is not a folder; give a new or empty folder"),
    ],
)
def test_merge_output_is_refused_before_loading(
    capsys, monkeypatch, tmp_path: Path, where: str, expected: str
) -> None:
    """Refused before the base model is loaded (org/model is not in any cache: loading it
    would fail differently)."""
    run = _run_folder(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "model.safetensors").write_bytes(b"theirs")
    output = {
        "file": notes,
        "under a file": notes / "merged",
        "busy folder": busy,
        "/proc": Path("/proc/merged"),
        "/dev/null": Path("/dev/null"),
    }[where]
    text = _exit_2(capsys, monkeypatch, "merge", "--adapter", str(run), "--output", str(output))
    assert f"--output {output}: " in text and expected in text
    assert notes.read_text() == "mine\n" and (busy / "model.safetensors").read_bytes() == b"theirs"


# --------------------------------------------------------------------------- paths the OS refuses

LONG = "a" * 300  # a name over the 255 bytes file systems take


def test_paths_the_file_system_refuses_are_named_not_tracebacks(
    capsys, monkeypatch, tmp_path: Path
) -> None:
    """A name over 255 bytes or a link loop on the way: each was an OSError or RuntimeError
    traceback in some command; now exit 2 with one line, and nothing is created on the way."""
    run = _run_folder(tmp_path)
    (run / "metrics.json").write_text(json.dumps({"windows": [], "evals": [], "summary": {}}))
    (tmp_path / "loop").symlink_to("loop")
    cases = [
        (("report", str(run), "--output", str(tmp_path / f"{LONG}.png")), "is too long"),
        (("generate", "--adapter", str(run), "--prompts", str(tmp_path / LONG)), "over 255 bytes"),
        (("package", "--adapter", str(run), "--output", str(tmp_path / f"{LONG}.expert")), "255"),
        (("merge", "--adapter", str(run), "--output", str(tmp_path / "new" / LONG)), "255"),
        (("report", str(run), "--output", str(tmp_path / "loop" / "x.png")), "a link loop"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, expected in cases:
        code, out, err = run_main(capsys, monkeypatch, *args)
        assert code == 2, (args[0], out + err)
        assert expected in " ".join(err.split()), (args[0], err)
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.slow
def test_a_path_of_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """`--output $'x\\xffy'` was a UnicodeEncodeError traceback while the tokenizer was saved
    (a fresh process: the bytes reach argv as they do from a shell)."""
    import shutil

    from conftest import DEMO_EXPERT_DIR
    from train_helpers import run_cli

    expert = tmp_path / "expert"
    shutil.copytree(DEMO_EXPERT_DIR, expert, ignore=shutil.ignore_patterns(".cache", "output"))
    out = tmp_path / "runs" / "x\udcffy"
    done = run_cli("train", "-m", str(expert / "manifest.json"), "--output", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a path or text given holds bytes that are not UTF-8 text" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_model_folder_whose_path_is_not_utf8_is_named_as_the_path(tmp_path: Path) -> None:
    """An expert copied into a folder named with a byte that is not UTF-8: the tokenizers
    library cannot open the path, which `check` called damaged tokenizer files (advising a
    copy of files that were whole)."""
    import shutil

    from conftest import DEMO_EXPERT_DIR
    from train_helpers import run_here

    expert = tmp_path / "bad\udcffdir"
    shutil.copytree(DEMO_EXPERT_DIR, expert, ignore=shutil.ignore_patterns(".cache", "output"))
    done = run_here("check", "-m", str(expert / "manifest.json"), "--quick", "1")
    said = " ".join(done.stdout.split())
    assert done.returncode == 2, said + done.stderr
    assert "holds bytes that are not UTF-8, which the tokenizers library cannot open" in said
    assert "damaged" not in said


@pytest.mark.parametrize(
    ("command", "option", "name"),
    [
        ("report", "--output", "y.png"),
        ("package", "--output", "p.expert"),
        ("export-gguf", "--output", "a.gguf"),
        ("benchmark", "--plot", "b.png"),
        ("benchmark", "--output", "b.json"),
    ],
)
def test_a_file_named_with_a_trailing_slash_is_refused(
    capsys, monkeypatch, tmp_path: Path, command: str, option: str, name: str
) -> None:
    """`report --output r/y.png/` wrote the file r/y.png: pathlib drops the slash, which named
    a folder. Each option naming a file to write refuses it, in JSON too where --json follows."""
    run = _run_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    target = f"r/{name}/"
    first = {"report": [str(run)], "benchmark": ["--duration", "1"]}.get(command)
    args = [command, *(first or ["--adapter", str(run)]), option, target]
    text = _exit_2(capsys, monkeypatch, *args)
    assert f"{option} {target}: ends in a slash, which names a folder; give the file's name" in text
    assert not (tmp_path / "r").exists()
    if command == "package":  # the parser runs before --json's own callback
        code, out, _ = run_main(capsys, monkeypatch, *args, "--json")
        assert code == 2 and json.loads(out)["error"]["lines"] == [
            f"{option} {target}: ends in a slash, which names a folder; give the file's name"
        ]
