"""`expert-cli package` and `check --package`: a run becomes a HiveLLM .expert archive that
unpacks to the run's own files with the adapter at its root (where HiveLLM's loader looks), and a
manifest that loader reads, carries a checksum
`sha256sum -c` accepts, reads the same every time, and is checked without being unpacked."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch
from train_helpers import run_here, write_expert, write_tar_gz

from expert_cli.errors import UserError
from expert_cli.train.hive_loader import loader_problems
from expert_cli.train.package import package_name
from expert_cli.train.package_check import verify_package

ADAPTER_PATH = "weights/qwen3-tiny/adapter"
ADAPTER_FILE = "adapter_model.safetensors"


def _unpack(package: Path) -> dict[str, bytes]:
    with tarfile.open(package, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """A trained schema 2.0 expert with an adapter path, two base models, a README, a
    LICENSE, a grammar file and a soft prompt beside its manifest."""
    folder = tmp_path_factory.mktemp("v2") / "expert-tiny"
    manifest_path = write_expert(folder, tiny_model_dir)
    manifest = json.loads(manifest_path.read_text())
    manifest["base_models"][0]["adapters"][0].update(path=ADAPTER_PATH, size_bytes=0, sha256="")
    manifest["base_models"][0]["_comment"] = "kept in the package"
    manifest["base_models"].append(dict(manifest["base_models"][0], name="Qwen/Qwen3-1.7B"))
    manifest["training"]["decoding"] = {"temperature": 0.2, "grammar_file": "grammars/sql.gbnf"}
    manifest["soft_prompts"] = [{"name": "style", "path": "soft_prompts/style.bin", "tokens": 8}]
    manifest_path.write_text(json.dumps(manifest, indent=2))
    (folder / "README.md").write_text("# expert-tiny\n")
    (folder / "LICENSE").write_text("Apache-2.0\n")
    (folder / "grammars").mkdir()
    (folder / "grammars" / "sql.gbnf").write_text('root ::= "SELECT"\n')
    (folder / "soft_prompts").mkdir()
    (folder / "soft_prompts" / "style.bin").write_bytes(bytes(range(256)))
    out = folder / "out"
    done = run_here("train", "-m", str(manifest_path), "--output", str(out), "--max-steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.slow
def test_v2_package_round_trips(v2_run: Path, tiny_model_dir: Path) -> None:
    done = run_here("package", "--adapter", str(v2_run), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    base = tiny_model_dir.name.lower().replace(".", "-").replace("_", "-")
    package = v2_run.parent / f"expert-test-{base}.v0.0.1.expert"
    assert report["path"] == str(package) and report["problems"] == []
    files = _unpack(package)
    assert sorted(files) == sorted(
        [
            "manifest.json",
            "adapter_model.safetensors",  # at the root, the entry's path left out
            "adapter_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "README.md",
            "LICENSE",
            "grammars/sql.gbnf",
            "soft_prompts/style.bin",
        ]
    )
    weights = (v2_run / "adapter_model.safetensors").read_bytes()
    assert files["adapter_model.safetensors"] == weights
    assert files["tokenizer.json"] == (v2_run / "tokenizer.json").read_bytes()
    assert files["soft_prompts/style.bin"] == bytes(range(256))
    manifest = json.loads(files["manifest.json"])
    assert len(manifest["base_models"]) == 1  # the base model the adapter was trained on
    adapter = manifest["base_models"][0]["adapters"][0]
    assert "path" not in adapter and any("adapter path" in n for n in report["notes"])
    # HiveLLM's loader reads it: the modules all-linear adapted as a list, warmup_steps given
    assert loader_problems(manifest) == []
    assert (
        adapter["target_modules"]
        == sorted(json.loads(files["adapter_config.json"])["target_modules"])
        and len(adapter["target_modules"]) >= 7
    )
    assert manifest["training"]["config"]["target_modules"] == adapter["target_modules"]
    assert manifest["training"]["config"]["warmup_steps"] == 0
    # a --max-steps 2 run: the epochs it trained, not the manifest's (it said 1.0)
    ran = json.loads((v2_run / "manifest.resolved.json").read_text())
    step_rows = ran["batch_size"] * ran["gradient_accumulation_steps"]
    trained = 2 * step_rows / ran["runtime"]["data"]["stats"]["train"]["rows"]
    assert manifest["training"]["config"]["epochs"] == round(trained, 2) < 1
    assert adapter["sha256"] == hashlib.sha256(weights).hexdigest()
    assert adapter["size_bytes"] == len(weights)
    assert manifest["base_models"][0]["_comment"] == "kept in the package"
    config = json.loads(files["adapter_config.json"])
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    # HiveLLM's runtime reads lora_alpha as a whole number: 16.0 read as none, scale 1 not 2
    assert type(config["lora_alpha"]) is int and config["lora_alpha"] == 2 * config["r"]
    trained = json.loads((v2_run / "adapter_config.json").read_text())  # as the run saved it
    assert type(trained["lora_alpha"]) is int
    # the checksum file is what sha256sum writes and checks
    sidecar = package.with_name(package.name + ".sha256")
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    assert sidecar.read_text() == f"{digest}  {package.name}\n"
    if shutil.which("sha256sum"):
        ok = subprocess.run(
            ["sha256sum", "-c", sidecar.name], cwd=package.parent, capture_output=True
        )
        assert ok.returncode == 0, ok.stderr
    checked = run_here("check", "--package", str(package))
    assert checked.returncode == 0 and "package is sound" in checked.stdout, checked.stdout
    # the same run packs to the same bytes; an existing package is kept unless --force
    again = run_here("package", "--adapter", str(v2_run))
    assert again.returncode == 2 and "exists; choose another name or --force" in again.stderr
    assert package.read_bytes() and hashlib.sha256(package.read_bytes()).hexdigest() == digest
    forced = run_here("package", "--adapter", str(v2_run), "--force")
    assert forced.returncode == 0, forced.stderr
    assert hashlib.sha256(package.read_bytes()).hexdigest() == digest


@pytest.mark.slow
def test_v1_package_keeps_its_layout(v2_run: Path, tmp_path: Path) -> None:
    """The same run, as if trained from a schema 1.0 manifest (package reads the manifest the
    run kept, manifest.source.json)."""
    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    v2 = json.loads((run / "manifest.source.json").read_text())
    base = dict(v2["base_models"][0])
    adapters = [{"type": "lora", "target_modules": "all-linear"}]
    base.pop("adapters")
    v1 = {**v2, "schema_version": "1.0", "base_model": base, "adapters": adapters}
    for key in ("base_models", "soft_prompts"):
        v1.pop(key)
    (run / "manifest.source.json").write_text(json.dumps(v1))
    target = tmp_path / "dist" / "tiny.expert"
    packed = run_here("package", "--adapter", str(run), "--output", str(target))
    assert packed.returncode == 0, packed.stdout + packed.stderr
    files = _unpack(target)
    assert {"manifest.json", "adapter_model.safetensors", "adapter_config.json"} <= set(files)
    manifest = json.loads(files["manifest.json"])
    assert manifest["schema_version"] == "1.0" and "base_models" not in manifest
    assert manifest["adapters"][0]["size_bytes"] == len(files["adapter_model.safetensors"])
    assert "weights/qwen3-tiny/adapter/adapter_model.safetensors" not in files  # no path: root
    assert verify_package(target).ok


def _with_name(manifest: bytes, name: str) -> bytes:
    return json.dumps({**json.loads(manifest), "name": name}).encode()


def _repack(source: Path, dest: Path, change) -> Path:
    """A copy of a package with its members changed by `change(dict) -> dict`."""
    return write_tar_gz(dest, change(_unpack(source)))


@pytest.mark.slow
def test_check_package_finds_what_is_wrong(v2_run: Path, tmp_path: Path) -> None:
    package = tmp_path / "good.expert"
    done = run_here("package", "--adapter", str(v2_run), "--output", str(package))
    assert done.returncode == 0, done.stderr
    weights = "adapter_model.safetensors"

    def tampered(files: dict) -> dict:
        return {**files, weights: files[weights][:-1] + b"\0"}

    def holds_nan(files: dict) -> dict:
        from safetensors.torch import load, save

        tensors = load(files[weights])
        tensors[sorted(tensors)[-1]].view(-1)[1] = float("inf")
        return {**files, weights: save(tensors, metadata={"format": "pt"})}

    cases = {
        "tampered": (tampered, "base_models[0].adapters[0].sha256: does not match"),
        "nan": (holds_nan, f"{weights}: 1 tensor holds NaN or infinity (base_model.model."),
        "missing": (lambda f: {k: v for k, v in f.items() if k != weights}, f"{weights}: missing"),
        "escape": (lambda f: {**f, "../evil.sh": b"rm -rf /"}, "../evil.sh: a path outside"),
        # members tar cannot write, called sound (round 11)
        "dot": (lambda f: {**f, ".": b"x"}, ".: a member that names no file"),
        "empty": (lambda f: {**f, "": b"x"}, "<an empty name>: a member that names no file"),
        "long": (lambda f: {**f, "a" * 300 + ".txt": b"x"}, "a name over 255 bytes between"),
        "cut short": (
            lambda f: {**f, weights: f[weights][: len(f[weights]) // 2]},
            f"{weights} is damaged (its header does not match its size)",
        ),
        "repeated key": (
            lambda f: {**f, "manifest.json": b'{"version": "9.9.9", ' + f["manifest.json"][1:]},
            "manifest.json: version: given more than once",
        ),
        # called UTF-16 (round 11): no NUL in no characters; an over-16 MB one is not kept
        "empty manifest": (
            lambda f: {**f, "manifest.json": b""},
            "manifest.json: is empty; expected a JSON object",
        ),
        "huge manifest": (
            lambda f: {**f, "manifest.json": b" " * (17 << 20)},
            "manifest.json: over 16 MB; not a manifest",
        ),
        "no manifest": (
            lambda f: {k: v for k, v in f.items() if k != "manifest.json"},
            "manifest.json: missing",
        ),
        # a name a loader may make a folder of (it was called sound)
        "name of a path": (
            lambda f: {**f, "manifest.json": _with_name(f["manifest.json"], "a/../x")},
            "manifest.json: name: a path, not a name",
        ),
    }
    for name, (change, expected) in cases.items():
        report = verify_package(_repack(package, tmp_path / f"{name}.expert", change))
        assert not report.ok and any(expected in p for p in report.problems), (name, report)
    junk = tmp_path / "junk.expert"
    junk.write_bytes(b"PK\x03\x04 not a tar")
    assert "not a gzip-compressed tar archive" in verify_package(junk).problems[0]
    # through the command: a checksum file that does not match is exit 2
    (tmp_path / "good.expert.sha256").write_text("0" * 64 + "  good.expert\n")
    out = run_here("check", "--package", str(package), "--json")
    assert out.returncode == 2 and "checksum does not match" in out.stdout
    # a folder where the checksum file goes was "no good.expert.sha256 beside the package";
    # a checksum file past its first KiB is not read whole
    sums = tmp_path / "good.expert.sha256"
    sums.unlink()
    sums.mkdir()
    said = verify_package(package).notes
    assert "good.expert.sha256 beside the package: not a file; its checksum is not checked" in said
    sums.rmdir()
    sums.write_text(verify_package(package).sha256 + "  good.expert\n" + " " * (1 << 20))
    assert verify_package(package).ok
    sums.write_text(verify_package(package).sha256 + " *good.expert\n")  # `sha256sum -b`'s
    report = verify_package(package)
    assert report.ok and not [n for n in report.notes if "names another file" in n], report.notes
    assert not [n for n in report.notes if "does not write" in n]  # every member is package's
    good = verify_package(package).sha256
    for text in (  # a second, wrong line for the same file was accepted
        f"{good}  good.expert\n{'0' * 64}  good.expert\n",
        f"{'0' * 64}  other.expert\n{'1' * 64} *dist/good.expert\n",
    ):
        sums.write_text(text)
        assert verify_package(package).problems == [
            "good.expert.sha256: the checksum does not match the package"
        ], text
    sums.write_text(f"{'0' * 64}  other.expert\n{good}  good.expert\n")  # a list of several
    report = verify_package(package)
    assert report.ok and report.checksum_file == sums and not report.notes, report.notes
    # past the first KiB (a comment, 15 other files' lines first): was "does not match"
    others = "".join(f"{'0' * 64}  file{i}.expert\n" for i in range(15))
    sums.write_text(f"# {'x' * 2000}\n{others}{good}  good.expert\n")
    assert verify_package(package).ok
    # a member package never writes (a script) was installed with the package without a word
    extra = _repack(package, tmp_path / "extra.expert", lambda f: {**f, "evil.sh": b"rm -rf ~"})
    report = verify_package(extra)
    assert (
        report.ok
        and (
            "1 member(s) that package does not write and HiveLLM's loader does not read (evil.sh): "
            "installed with the package all the same"
        )
        in report.notes
    ), report.notes


@pytest.mark.slow
def test_a_package_of_many_files_lists_the_first_fifty(v2_run: Path, tmp_path: Path) -> None:
    """check --package of 20,000 members said "more than 10,000 files" after a table of
    10,000 rows."""
    package = tmp_path / "good.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(package)).returncode == 0
    extra = {f"notes/{i:03}.txt": b"x" for i in range(80)}
    many = _repack(package, tmp_path / "many.expert", lambda f: {**f, **extra})
    total = len(verify_package(many).files)
    out = run_here("check", "--package", str(many))
    assert f"and {total - 50:,} more files" in out.stdout, out.stdout
    assert "notes/079.txt" not in out.stdout and out.stdout.count("notes/") < 50


def test_no_room_to_copy_the_adapter_is_a_note_not_a_damaged_package(
    v2_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check --package copies each safetensors member to a temporary file to read its numbers;
    a temporary folder that is full said the package was not a tar archive."""
    import errno
    import tempfile

    package = tmp_path / "good.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(package)).returncode == 0

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", full)
    report = verify_package(package)
    assert report.ok, report.problems
    note = (
        "adapter_model.safetensors: no room for a temporary copy, its numbers "
        "are not checked for NaN"
    )
    assert note in report.notes


def test_package_names_follow_hivellm() -> None:
    v2 = {"name": "expert-sql", "version": "0.3.0", "schema_version": "2.0"}
    assert package_name(v2, "Qwen/Qwen3-0.6B") == "expert-sql-qwen3-0-6b.v0.3.0.expert"
    assert package_name(v2, "F:/models/Qwen3_0.6B/") == "expert-sql-qwen3-0-6b.v0.3.0.expert"
    v1 = {"name": "expert-sql", "version": "0.3.0", "schema_version": "1.0"}
    assert package_name(v1, "Qwen/Qwen3-0.6B") == "expert-sql-qwen306b.v0.3.0.expert"
    for bad in ({"name": "../etc", "version": "1"}, {"name": "x", "version": "1/2"}):
        with pytest.raises(UserError):
            package_name(bad, "m")


@pytest.mark.slow
def test_paths_that_leave_the_expert_are_refused(v2_run: Path) -> None:
    source = v2_run / "manifest.source.json"
    original = source.read_text()
    manifest = json.loads(original)
    manifest["soft_prompts"] = [{"name": "x", "path": "../../etc/passwd"}]
    source.write_text(json.dumps(manifest))
    try:
        out = run_here(
            "package", "--adapter", str(v2_run), "--output", str(v2_run.parent / "x.expert")
        )
        assert out.returncode == 2
        assert "soft_prompts[0].path: expected a relative path inside the package" in out.stderr
        assert "passwd" not in out.stderr
        assert not (v2_run.parent / "x.expert").exists()
    finally:
        source.write_text(original)


def _adapter_copy(v2_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run (without checkpoints and events) and its adapter weights file."""
    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("checkpoints", "runs"))
    return run, run / "adapter_model.safetensors"


def _refused(command: str, run: Path, tmp_path: Path) -> str:
    """`COMMAND --adapter RUN` that must exit 2 writing nothing; what it said, on one line."""
    extra = {
        "package": ("--output", str(tmp_path / "x.expert")),
        "generate": ("-p", "hi"),
        "merge": ("--output", str(tmp_path / "merged")),
    }[command]
    out = run_here(command, "--adapter", str(run), *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    assert not (tmp_path / "x.expert").exists() and not (tmp_path / "merged").exists()
    return " ".join(out.stderr.split())


@pytest.mark.slow
@pytest.mark.parametrize("command", ["package", "generate", "merge"])
def test_an_adapter_cut_short_is_named_before_anything_loads(
    v2_run: Path, tmp_path: Path, command: str
) -> None:
    """A run folder whose adapter file was cut short (a full disk, an interrupted copy):
    package used to ship it as sound; generate and merge ended in a SafetensorError."""
    run, weights = _adapter_copy(v2_run, tmp_path)
    weights.write_bytes(weights.read_bytes()[:-100])
    assert (
        f"--adapter {run}: adapter_model.safetensors is damaged (its header does not match its "
        "size); restore it from a copy, or train again"
    ) in _refused(command, run, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["package", "generate", "merge"])
def test_an_adapter_holding_nan_is_refused(v2_run: Path, tmp_path: Path, command: str) -> None:
    """An adapter a diverged run wrote (expert-cli wrote such runs as completed until it
    watched the loss; other tools still may) was packaged as sound, generated from and merged
    into the base."""
    from safetensors.torch import load_file, save_file

    run, weights = _adapter_copy(v2_run, tmp_path)
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert (
        f"--adapter {run}: adapter_model.safetensors: 1 tensor holds NaN or infinity ({name})"
    ) in _refused(command, run, tmp_path)


@pytest.mark.slow
def test_an_adapter_that_adds_nothing_is_not_shipped(v2_run: Path, tmp_path: Path) -> None:
    """A 1-step run under a warm-up trained at a rate of 0: every lora_B stayed zero, the
    adapter equal to the base, and package shipped it without a word."""
    from safetensors.torch import load_file, save_file

    run, weights = _adapter_copy(v2_run, tmp_path)
    tensors = load_file(str(weights))
    zeroed = {k: (v.zero_() if "lora_B" in k else v) for k, v in tensors.items()}
    save_file(zeroed, str(weights), metadata={"format": "pt"})
    assert (
        f"--adapter {run}: adapter_model.safetensors: every lora_B weight is still zero, so "
        "the adapter adds nothing to the base model"
    ) in _refused("package", run, tmp_path)
    tensors["base_model.model.x.lora_B.weight"] = torch.ones(1)  # one B moved: shipped
    save_file(tensors, str(weights), metadata={"format": "pt"})
    from expert_cli.weights import unchanged_adapter

    assert unchanged_adapter(weights) is None


@pytest.mark.parametrize(
    ("tensors", "said"),
    [
        ({"a.lora_A.weight": 1, "a.lora_B.weight": 0}, "lora_B"),
        # an embedding's A starts at zero (its B is random)
        ({"a.lora_B.weight": 1, "e.lora_embedding_A": 0, "e.lora_embedding_B": 1}, None),
        ({"a.lora_B.weight": 0, "e.lora_embedding_A": 0}, "lora_B and lora_embedding_A"),
        ({"a.lora_B.weight": 0, "a.lora_magnitude_vector": 1}, None),  # DoRA's magnitudes
        # AdaLoRA: its singular values start at zero, its A and B random
        ({"a.lora_A": 1, "a.lora_B": 1, "a.lora_E": 0}, "lora_E"),
        ({"a.lora_A": 1, "a.lora_B": 1, "a.lora_E": 1}, None),
        ({"a.ia3_l": 1}, None),  # IA3 starts at ones: not judged
    ],
)
def test_which_adapters_add_nothing(tmp_path: Path, tensors: dict, said: str | None) -> None:
    from safetensors.torch import save_file

    from expert_cli.weights import unchanged_adapter

    file = tmp_path / "adapter_model.safetensors"
    save_file({k: torch.full((2, 2), float(v)) for k, v in tensors.items()}, str(file))
    assert unchanged_adapter(file) == said


@pytest.mark.slow
def test_a_refused_checkpoint_is_not_offered_again(v2_run: Path, tmp_path: Path) -> None:
    """`--checkpoint checkpoint-2` of a checkpoint holding NaN said "choose another of:
    checkpoint-2", the one refused; the others are offered, or final where there are none."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs"))
    sound = run / "checkpoints" / "checkpoint-1"
    shutil.copytree(run / "checkpoints" / "checkpoint-2", sound)
    state = json.loads((sound / "trainer_state.json").read_text())
    (sound / "trainer_state.json").write_text(json.dumps({**state, "global_step": 1}))
    weights = run / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})
    package = ["package", "--adapter", str(run), "--checkpoint", "checkpoint-2"]
    out = run_here(*package, "--output", str(tmp_path / "x.expert"))
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and "holds NaN or infinity" in said
    assert said.endswith("(--checkpoint: choose another of: checkpoint-1)"), said
    shutil.rmtree(sound)
    out = run_here(*package, "--output", str(tmp_path / "x.expert"))
    said = " ".join(out.stderr.split())
    assert said.endswith("(--checkpoint: the run holds no other sound one; name final)"), said
    assert not (tmp_path / "x.expert").exists()


@pytest.mark.slow
def test_a_chosen_checkpoint_is_shipped(v2_run: Path, tmp_path: Path) -> None:
    """HiveLLM's `training.packaging_checkpoint` (read from the manifest file as it is when
    packaging: compare the checkpoints, then name the best) or `--checkpoint` ships that
    checkpoint's adapter, recorded in the packaged manifest. It used to be kept and ignored:
    the final adapter shipped whatever the manifest said."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs"))
    chosen = run / "checkpoints" / "checkpoint-2"
    assert (chosen / "_COMPLETE").is_file()
    final = run / "adapter_model.safetensors"
    tensors = {k: v * 2 for k, v in load_file(str(final)).items()}  # the final differs now
    save_file(tensors, str(final), metadata={"format": "pt"})
    manifest = json.loads((run / "manifest.source.json").read_text())
    expert = tmp_path / "expert"  # the expert's folder, where its manifest file is edited
    shutil.copytree(v2_run.parent, expert, ignore=shutil.ignore_patterns("out", ".cache"))
    manifest_path = expert / "manifest.json"
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved["manifest_path"] = str(manifest_path)
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))

    def shipped(*extra: str) -> tuple[dict[str, bytes], str]:
        package = tmp_path / "x.expert"
        out = run_here(
            "package", "--adapter", str(run), "--output", str(package), "--force", *extra
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return _unpack(package), " ".join(out.stdout.split())

    manifest["training"]["packaging_checkpoint"] = "checkpoint-2"
    manifest_path.write_text(json.dumps(manifest))
    members, said = shipped()
    weights = next(v for k, v in members.items() if k.endswith("adapter_model.safetensors"))
    assert weights == (chosen / "adapter_model.safetensors").read_bytes() != final.read_bytes()
    packaged = json.loads(members["manifest.json"])
    assert packaged["training"]["packaging_checkpoint"] == "checkpoint-2"
    assert packaged["base_models"][0]["adapters"][0]["checkpoint_step"] == 2
    assert f"shipped checkpoint-2 (training.packaging_checkpoint in {manifest_path})" in said
    members, said = shipped("--checkpoint", "final")  # the option wins
    weights = next(v for k, v in members.items() if k.endswith("adapter_model.safetensors"))
    assert weights == final.read_bytes() and "shipped" not in said
    packaged = json.loads(members["manifest.json"])  # and the package says so
    assert packaged["training"]["packaging_checkpoint"] == "final"
    assert "checkpoint_step" not in packaged["base_models"][0]["adapters"][0]
    del manifest["training"]["packaging_checkpoint"]  # taken out of the file: final again
    manifest_path.write_text(json.dumps(manifest))
    members, said = shipped()
    assert (
        "shipped" not in said
        and json.loads(members["manifest.json"])["training"]["packaging_checkpoint"] == "final"
    )
    manifest_path.write_text("{ not json")  # a file that cannot say is not guessed at
    out = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "y.expert"))
    assert out.returncode == 2 and "pass --checkpoint NAME" in " ".join(out.stderr.split())
    manifest_path.write_text(json.dumps(manifest))
    # a run that diverged wrote no adapter or tokenizer at its end; its checkpoints hold both
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json"):
        (run / name).unlink()
    (run / "tokenizer_config.json").unlink()
    out = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "y.expert"))
    assert out.returncode == 2
    assert "ship a checkpoint: --checkpoint NAME (checkpoint-2)" in " ".join(out.stderr.split())
    members, _ = shipped("--checkpoint", "checkpoint-2")
    assert members["tokenizer.json"] == (chosen / "tokenizer.json").read_bytes()
    weights = next(v for k, v in members.items() if k.endswith("adapter_model.safetensors"))
    assert weights == (chosen / "adapter_model.safetensors").read_bytes()
    checkpoint = run_here("package", "--adapter", str(chosen))  # the checkpoint itself
    assert checkpoint.returncode == 2
    assert f"--adapter {run} --checkpoint checkpoint-2" in " ".join(checkpoint.stderr.split())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # merged NaN into every adapted weight of the base, exit 0
        (
            {"lora_alpha": float("nan")},
            "lora_alpha: expected a number above 0 and at most 1,000,000 (got a decimal number)",
        ),
        # a TypeError traceback from inside peft
        ({"r": "16"}, "r: expected a whole number above 0 and at most 1,024 (got a string of 2"),
        # grew past 7 GB while generate built the layers
        ({"r": 10**6}, "r: expected a whole number above 0 and at most 1,024 (got a whole number)"),
        # applied silently: answers without the adapter, or with a wrong one
        ({"peft_type": "IA3"}, "peft_type: IA3, but the adapter weights beside it are of another"),
        ({"use_dora": True}, "use_dora is on, but the weights beside it do not hold DoRA's"),
        ({"peft_type": "FOO"}, "peft_type: expected one of LORA, ADALORA, IA3, LOKR (got a"),
        ({"task_type": "SEQ_CLS"}, "task_type: expected CAUSAL_LM (got a string of 7"),
        ({"target_modules": []}, "target_modules: expected the names of the adapted layers"),
        # a size-mismatch traceback from inside peft
        ({"r": 16}, "r: 16 for model.layers.0.mlp.down_proj, but its weights are of rank 8"),
        # loaded with the weights of every layer but q_proj dropped
        ({"target_modules": ["q_proj"]}, "target_modules does not name model.layers.0."),
        # shipped and exported as sound; peft applied layer 0 alone
        ({"layers_to_transform": [0]}, "layers_to_transform leaves out layer 1, which the"),
        ({"layers_to_transform": "0"}, "layers_to_transform: expected a layer number or a list"),
        # shipped as sound; generate said "cannot load the adapter (ValueError)"
        ({"lora_dropout": 5}, "lora_dropout: expected a number from 0 up to (not including) 1"),
    ],
)
def test_an_adapter_config_that_cannot_describe_its_weights_is_refused(
    v2_run: Path, tmp_path: Path, edit: dict, expected: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs", "checkpoints"))
    config = json.loads((run / "adapter_config.json").read_text())
    (run / "adapter_config.json").write_text(json.dumps({**config, **edit}))
    for command in (
        ("package", "--adapter", str(run), "--output", str(tmp_path / "x.expert")),
        ("merge", "--adapter", str(run), "--output", str(tmp_path / "merged")),
    ):
        out = run_here(*command)
        assert out.returncode == 2, out.stdout + out.stderr
        said = " ".join(out.stderr.split())
        assert f"{run / 'adapter_config.json'}: {expected}" in said, said
    assert not (tmp_path / "x.expert").exists() and not (tmp_path / "merged").exists()


@pytest.mark.slow
def test_an_adapter_file_lacking_half_of_a_pair_is_refused(v2_run: Path, tmp_path: Path) -> None:
    """An adapter_model.safetensors without one lora_A (a copy cut at a tensor, a hand edit)
    was shipped, checked sound, exported and merged with exit 0: peft makes the missing half
    up at each load, random for lora_A, so each merge gave another model."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs", "checkpoints"))
    tensors = load_file(str(run / ADAPTER_FILE))
    dropped = sorted(n for n in tensors if ".lora_A." in n)[0]
    module = dropped.removeprefix("base_model.model.").split(".lora_A.")[0]
    packaged = run_here("package", "--adapter", str(v2_run), "--output", str(tmp_path / "v.expert"))
    assert packaged.returncode == 0, packaged.stdout + packaged.stderr
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(run / ADAPTER_FILE))
    gap = (
        f"{ADAPTER_FILE} lacks lora_A of {module}, which peft would make up anew at each load "
        "(random values for lora_A, zeros for lora_B): the file is incomplete"
    )
    for command in (
        ("package", "--adapter", str(run), "--output", str(tmp_path / "x.expert")),
        ("merge", "--adapter", str(run), "--output", str(tmp_path / "merged")),
        ("generate", "--adapter", str(run), "-p", "hi", "--max-new-tokens", "1"),
        ("export-hub", "--adapter", str(run), "--output", str(tmp_path / "hub")),
    ):
        out = run_here(*command)
        assert out.returncode == 2, (command, out.stdout + out.stderr)
        assert gap in " ".join(out.stderr.split()), (command, out.stderr)
    assert not [p for p in tmp_path.iterdir() if p.name in ("x.expert", "merged", "hub")]
    # a package whose archive was rebuilt without it: check --package names it
    with tarfile.open(tmp_path / "v.expert") as archive:
        members = {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}
    members[ADAPTER_FILE] = (run / ADAPTER_FILE).read_bytes()
    rebuilt = tmp_path / "rebuilt.expert"
    with tarfile.open(rebuilt, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    out = run_here("check", "--package", str(rebuilt))
    assert out.returncode == 2, out.stdout + out.stderr
    assert gap.replace(f"{ADAPTER_FILE} ", f"{ADAPTER_FILE}: ") in " ".join(out.stdout.split())
    # integers where the weights are: torch copied them into the parameters without a word
    save_file({k: v.to(torch.int64) for k, v in tensors.items()}, str(run / ADAPTER_FILE))
    out = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "x.expert"))
    assert out.returncode == 2 and "of type I64, not a floating-point type" in " ".join(
        out.stderr.split()
    ), out.stderr
    # a dtype of the file's own words is not repeated (it may hold a terminal's escapes)
    from expert_cli.weights import not_float_line

    header = json.dumps({"w": {"dtype": "\x1b[2J", "shape": [1], "data_offsets": [0, 1]}})
    head = len(header).to_bytes(8, "little") + header.encode()
    assert not_float_line(head) == (
        "holds w of type another, not a floating-point type: not an adapter's weights as "
        "training saves them"
    )


@pytest.mark.slow
def test_the_checkpoint_of_lowest_eval_loss_is_named_and_shipped_as_best(
    v2_run: Path, tmp_path: Path
) -> None:
    """`package` says when the run keeps an adapter evaluated lower than the one it ships
    (final, by default: a run that overfits ends worse than it was), and `--checkpoint best`
    ships that one, recorded in the packaged manifest."""
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs"))
    assert json.loads((run / "manifest.resolved.json").read_text())["runtime"]["final_step"] == 2
    earlier = run / "checkpoints" / "checkpoint-1"  # a checkpoint of another step, other weights
    shutil.copytree(run / "checkpoints" / "checkpoint-2", earlier)
    state = json.loads((earlier / "trainer_state.json").read_text())
    (earlier / "trainer_state.json").write_text(json.dumps({**state, "global_step": 1}))
    tensors = {k: v / 2 for k, v in load_file(str(earlier / ADAPTER_FILE)).items()}
    save_file(tensors, str(earlier / ADAPTER_FILE), metadata={"format": "pt"})
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["evals"] = [{"step": 1, "eval_loss": 0.5}, {"step": 2, "eval_loss": 0.9}]
    (run / "metrics.json").write_text(json.dumps(metrics))

    def package(*extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, bytes]]:
        out = run_here(
            "package",
            "--adapter",
            str(run),
            "--output",
            str(tmp_path / "x.expert"),
            "--force",
            *extra,
        )
        members = _unpack(tmp_path / "x.expert") if out.returncode == 0 else {}
        return out, members

    out, members = package()
    assert out.returncode == 0, out.stdout + out.stderr
    assert members[ADAPTER_FILE] == (run / ADAPTER_FILE).read_bytes()
    assert (
        "checkpoint-1 has a lower eval loss (0.5 at step 1) than final (0.9): --checkpoint best "
        "ships it" in " ".join(out.stdout.split())
    )
    out, members = package("--checkpoint", "best")
    assert out.returncode == 0, out.stdout + out.stderr
    assert members[ADAPTER_FILE] == (earlier / ADAPTER_FILE).read_bytes()
    packaged = json.loads(members["manifest.json"])
    assert packaged["training"]["packaging_checkpoint"] == "checkpoint-1"
    assert packaged["base_models"][0]["adapters"][0]["checkpoint_step"] == 1
    said = " ".join(out.stdout.split())
    assert "shipped checkpoint-1 (--checkpoint best: eval loss 0.5 at step 1)" in said
    assert "lower eval loss" not in said
    # the manifest may ask for it too (it was refused there, and taken by --checkpoint)
    manifest = json.loads((run / "manifest.source.json").read_text())
    manifest["training"]["packaging_checkpoint"] = "best"
    manifest_path = tmp_path / "expert" / "manifest.json"  # the expert's folder, edited
    shutil.copytree(v2_run.parent, manifest_path.parent, ignore=shutil.ignore_patterns("out"))
    manifest_path.write_text(json.dumps(manifest))
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    (run / "manifest.resolved.json").write_text(
        json.dumps({**resolved, "manifest_path": str(manifest_path)})
    )
    out, members = package()
    assert out.returncode == 0, out.stdout + out.stderr
    assert members[ADAPTER_FILE] == (earlier / ADAPTER_FILE).read_bytes()
    assert json.loads(members["manifest.json"])["training"]["packaging_checkpoint"] == (
        "checkpoint-1"
    )  # the package names the one shipped, as HiveLLM's loader reads it
    assert (
        f"shipped checkpoint-1 (training.packaging_checkpoint best in {manifest_path}: eval "
        "loss 0.5 at step 1)"
    ) in " ".join(out.stdout.split())
    metrics["evals"] = [{"step": 1, "eval_loss": 0.9}, {"step": 2, "eval_loss": 0.5}]
    (run / "metrics.json").write_text(json.dumps(metrics))
    out, members = package("--checkpoint", "best")  # a tie goes to the final adapter
    assert members[ADAPTER_FILE] == (run / ADAPTER_FILE).read_bytes()
    assert "shipped the run's final adapter (--checkpoint best: eval loss 0.5 at step 2)" in (
        " ".join(out.stdout.split())
    )
    metrics["evals"] = []  # nothing to compare by: not guessed
    (run / "metrics.json").write_text(json.dumps(metrics))
    (tmp_path / "x.expert").unlink()
    out, _ = package("--checkpoint", "best")
    assert out.returncode == 2
    assert (
        "--checkpoint best: the run evaluated at no step it kept an adapter of (it keeps: "
        "checkpoint-1, checkpoint-2, final); name one: --checkpoint NAME"
        in " ".join(out.stderr.split())
    )
    assert not (tmp_path / "x.expert").exists()
    out, _ = package()
    assert out.returncode == 2
    assert (
        f"training.packaging_checkpoint best in {manifest_path}: the run evaluated at no step"
        in " ".join(out.stderr.split())
    )
    assert not (tmp_path / "x.expert").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ("--checkpoint", "checkpoint-9"),
            "holds no complete checkpoint-9 (it holds: checkpoint-2)",
        ),
        (
            ("--checkpoint", "latest"),
            "--checkpoint: expected checkpoint-N (e.g. checkpoint-500), final, or best (the "
            "lowest eval loss)",
        ),
    ],
)
def test_a_checkpoint_that_is_not_there_is_named(
    v2_run: Path, tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    out = run_here(
        "package", "--adapter", str(v2_run), "--output", str(tmp_path / "x.expert"), *extra
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in " ".join(out.stderr.split())
    assert not (tmp_path / "x.expert").exists()


@pytest.mark.slow
def test_generate_tries_a_checkpoint_of_the_run(v2_run: Path, tmp_path: Path) -> None:
    """To choose a checkpoint to ship, each is tried with the run's settings: `--adapter
    RUN/checkpoints/checkpoint-N` reads the run's configuration (it used to be exit 2, no
    manifest.resolved.json) and answers with that checkpoint's weights."""

    def answer(adapter: Path) -> str:
        out = run_here(
            "generate", "--adapter", str(adapter), "-p", "List orders", "--greedy",
            "--max-new-tokens", "6", "--json",
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)["generations"][0]["output"]

    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs"))
    final = run / "adapter_model.safetensors"
    tensors = {k: v * 1000 for k, v in load_file(str(final)).items()}  # the final differs now
    save_file(tensors, str(final), metadata={"format": "pt"})
    assert answer(run / "checkpoints" / "checkpoint-2") == answer(v2_run) != answer(run)


@pytest.mark.slow
def test_merge_of_a_checkpoint_keeps_the_runs_dtype(v2_run: Path, tmp_path: Path) -> None:
    """`merge --adapter RUN/checkpoints/checkpoint-N` saves in the dtype the run trained in,
    read from the run's configuration (the checkpoint has none: it saved float32 whatever the
    run was). The run here says bf16, as a GPU run would."""
    from safetensors import safe_open

    run = tmp_path / "run"
    shutil.copytree(v2_run, run, ignore=shutil.ignore_patterns("runs"))
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved.setdefault("runtime", {}).setdefault("model", {})["dtype"] = "bfloat16"
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    out = tmp_path / "merged"
    done = run_here(
        "merge", "--adapter", str(run / "checkpoints" / "checkpoint-2"), "--output", str(out)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    weights = next(out.glob("*.safetensors"))
    with safe_open(str(weights), "pt") as f:
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}, dtypes


@pytest.mark.slow
def test_check_package_judges_the_adapter_configuration(v2_run: Path, tmp_path: Path) -> None:
    """A package whose adapter_config.json holds `lora_alpha: NaN`, or a rank its weights do
    not have, was "sound"; generate and merge of such an adapter are refused, and so is the
    package now."""
    package = tmp_path / "x.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(package)).returncode == 0
    members = _unpack(package)
    name = "adapter_config.json"
    config = json.loads(members[name])
    for edit, expected in [
        ({"lora_alpha": float("nan")}, "lora_alpha: expected a number above 0 and at most 1,"),
        (
            {"r": 4},
            "r: 4 for model.layers.0.mlp.down_proj, but its weights are of",
        ),  # generate failed
    ]:
        bad = tmp_path / "bad.expert"
        with tarfile.open(bad, "w:gz") as tar:
            for member, data in {**members, name: json.dumps({**config, **edit}).encode()}.items():
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out = run_here("check", "--package", str(bad))
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{name}: {expected}" in " ".join(out.stdout.split())
    assert run_here("check", "--package", str(package)).returncode == 0  # the one written
    decimal = _repack(
        package,
        tmp_path / "decimal.expert",
        lambda m: {**m, name: json.dumps({**config, "lora_alpha": 16.0}).encode()},
    )
    out = run_here("check", "--package", str(decimal))
    # sound for peft, but HiveLLM's runtime applies it at scale 1: an earlier expert-cli's
    # package (this one writes 16) was called sound, exit 0
    assert out.returncode == 2, out.stdout
    assert (
        f"{name}: lora_alpha 16.0 is a decimal; HiveLLM's runtime reads a whole number only, and "
        "applies the adapter at scale 1 instead of alpha / r: package the run again with this "
        "expert-cli"
    ) in " ".join(out.stdout.split())
    rsloraed = _repack(  # rsLoRA unfolded: sqrt(r) times weaker there
        package,
        tmp_path / "rslora.expert",
        lambda m: {**m, name: json.dumps({**config, "use_rslora": True}).encode()},
    )
    out = run_here("check", "--package", str(rsloraed))
    assert out.returncode == 2 and "use_rslora is true" in out.stdout, out.stdout


def test_what_hivellms_runtime_would_not_apply_is_said() -> None:
    from expert_cli.train.adapter_entry import runtime_notes, whole_alpha

    lora = {"peft_type": "LORA", "r": 8, "lora_alpha": 16.0, "target_modules": ["q_proj"]}
    assert whole_alpha(lora)["lora_alpha"] == 16 and type(whole_alpha(lora)["lora_alpha"]) is int
    assert whole_alpha({**lora, "lora_alpha": 12.5})["lora_alpha"] == 12.5
    assert runtime_notes(whole_alpha(lora)) == []
    for config, held in [
        ({**lora, "lora_alpha": 16, "use_dora": True}, "DoRA's magnitude vectors"),
        ({"peft_type": "ADALORA", "lora_alpha": 16}, "AdaLoRA's singular values (lora_E)"),
        ({"peft_type": "IA3"}, "IA3's scaling vectors"),
        (
            {**lora, "lora_alpha": 16, "target_modules": ["embed_tokens"]},
            "the embedding's adapter (lora_embedding_A/B)",
        ),
    ]:
        (note,) = runtime_notes(config)
        assert f"; {held} are not applied there" in note, note


def _tar_bytes(members: list[tuple[str, bytes | None]]) -> bytes:
    """An uncompressed tar of (name, bytes) members; None: a folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.slow
def test_check_package_reads_member_names_as_unpacking_does(
    v2_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`./` names (tar -C run .) and folders unpack to the same files and are sound; a file
    given twice, a name holding control characters, and bytes after the archive's end (tar
    lists none of them) are problems, never a sound package."""
    import gzip

    good = tmp_path / "good.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(good)).returncode == 0
    members = list(_unpack(good).items())
    tar = _tar_bytes(members)

    def check(name: str, data: bytes) -> list[str]:
        (tmp_path / name).write_bytes(data)
        return verify_package(tmp_path / name, sidecar=False).problems

    dotted = [("./", None)] + [(f"./{n}", d) for n, d in members]
    (tmp_path / "dotted.expert").write_bytes(gzip.compress(_tar_bytes(dotted)))
    report = verify_package(tmp_path / "dotted.expert", sidecar=False)
    assert report.ok, report.problems
    assert sorted(report.files) == sorted(n for n, _ in members)
    manifest = dict(members)["manifest.json"]
    other = manifest.replace(b'"version": "', b'"version": "9')
    twice = gzip.compress(_tar_bytes([*members, ("./manifest.json", other)]))
    assert "manifest.json: in the package twice (unpacking keeps the last, this check the " in (
        " ".join(check("twice.expert", twice))
    )
    control = gzip.compress(_tar_bytes([*members, ("a\x1b[2Jb\udcff", b"x")]))
    assert check("control.expert", control) == [
        "a\\x1b[2Jb\\udcff: a name holding control characters or bytes that are not UTF-8"
    ]
    after = (
        "after the end of the archive (two files joined, or a damaged copy): no package holds them"
    )
    hidden = gzip.compress(tar + b"#!/bin/sh\n")
    assert check("hidden.expert", hidden) == [f"10 bytes that are not zeros {after}"]
    joined = gzip.compress(tar) + gzip.compress(b"a second archive")
    assert check("joined.expert", joined) == [f"16 bytes that are not zeros {after}"]
    junk = gzip.compress(tar) + b"junk"
    assert check("junk.expert", junk) == [f"bytes that are no gzip stream {after}"]
    padded = gzip.compress(tar + bytes(3 << 20))  # GNU tar -b 4096 pads to 2 MiB records
    assert check("zeros.expert", padded) == []
    import expert_cli.train.package_stream as package_stream

    monkeypatch.setattr(package_stream, "TAIL_BYTES", 1 << 20)  # a bomb of zeros, smaller
    assert check("zeros.expert", padded) == [f"over 1 MiB of zeros {after}"]
    monkeypatch.undo()
    assert check("padded.expert", gzip.compress(tar) + bytes(4096)) == []  # gzip's padding
    # the block that ends tar's listing is checked too: no end marker, junk in its place
    with tarfile.open(fileobj=io.BytesIO(tar)) as listed:
        last = listed.getmembers()[-1]
    unmarked = tar[: last.offset_data + -(-last.size // 512) * 512]  # to the last file's end
    assert check("unmarked.expert", gzip.compress(unmarked)) == []  # tar -A style: no end
    junk_block = gzip.compress(unmarked + b"\x01" * 512)
    assert check("junk-block.expert", junk_block) == [f"512 bytes that are not zeros {after}"]
    # names one file system keeps apart and another does not, and a file where a folder is
    nfd = "caf\u0065\u0301.md"
    for clash, said in (
        ([("Manifest.json", b"{}")], "Manifest.json: the same file as manifest.json where names"),
        ([("caf\u00e9.md", b"a"), (nfd, b"b")], f"{nfd}: the same file as caf\u00e9.md where"),
        ([("README.md/x", b"a")], "README.md/x: lies under README.md, which the package holds"),
        ([("docs/a", b"a"), ("docs", b"b")], "docs: a file where the package has a folder of"),
    ):
        problems = check("clash.expert", gzip.compress(_tar_bytes([*members, *clash])))
        assert len(problems) == 1 and problems[0].startswith(said), problems
    assert check("zeros-in.expert", gzip.compress(tar + bytes(8192))) == []  # tar's padding


def test_check_package_shows_names_that_look_like_markup(tmp_path: Path) -> None:
    """A member named `[/x]evil` (rich's closing tag) ended check --package in a MarkupError
    traceback; it is shown as it is."""
    import gzip

    link = tarfile.TarInfo("[/x]evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.addfile(link)
    package = tmp_path / "m.expert"
    package.write_bytes(gzip.compress(buffer.getvalue()))
    out = run_here("check", "--package", str(package))
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join(out.stdout.split())
    assert "problem [/x]evil: not a regular file (links, devices and sparse files do not" in text
    assert "no manifest that can be read" in text and "Traceback" not in out.stderr


def test_sparse_members_and_sizes_of_folders_in_a_package(tmp_path: Path) -> None:
    """A GNU sparse member (2 GiB from a 152-byte archive, read and hashed as a regular file)
    is refused as not a regular file; a folder's header size is no file's size (a folder said
    to be 25 GiB was "over 20 GiB")."""
    import gzip

    from expert_cli.train.package_check import verify_package

    sparse = tarfile.TarInfo("z.bin")
    sparse.type = tarfile.GNUTYPE_SPARSE
    folder = tarfile.TarInfo("docs")
    folder.type, folder.pax_headers = tarfile.DIRTYPE, {"size": str(25 << 30)}
    negative = tarfile.TarInfo("n.bin")
    negative.pax_headers = {"size": "-1024"}  # said as bytes after the archive's end
    for member, format_, said in (
        (sparse, tarfile.GNU_FORMAT, "z.bin: not a regular file (links, devices and sparse"),
        (folder, tarfile.PAX_FORMAT, None),
        (negative, tarfile.PAX_FORMAT, "n.bin: its header gives a negative size"),
    ):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=format_) as tar:
            tar.addfile(member)
        package = tmp_path / "m.expert"
        package.write_bytes(gzip.compress(buffer.getvalue()))
        problems = verify_package(package).problems
        assert not [p for p in problems if "GiB" in p], problems
        assert (said is None) or any(p.startswith(said) for p in problems), problems


@pytest.mark.slow
def test_a_damaged_tokenizer_is_named_in_package_and_check(
    v2_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer.json that no loader can read was shipped, and check --package said the
    package was sound; so was one missing tokenizer.json alone. A run that holds no tokenizer
    ships without one, saying so."""
    import tokenizers

    good = tmp_path / "good.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(good)).returncode == 0
    members = _unpack(good)
    assert "tokenizer.json" in members and verify_package(good).ok
    damaged = {
        "tokenizer.json": (
            b'{"version": "1.0"}',
            f"not a tokenizer the tokenizers library ({tokenizers.__version__}) can read",
        ),
        "tokenizer_config.json": (b"[1, 2]", "not a JSON object"),
        "special_tokens_map.json": (b"{'a': 1}", "not readable JSON"),
        "chat_template.jinja": (  # called sound: the prompts cannot be laid out from it
            b"{% for x in %}",
            "not a Jinja template transformers can compile (TemplateSyntaxError)",
        ),
    }
    damaged_template = {"chat_template.jinja": (b" \n", "empty (a chat template renders every")}
    unrendered = {  # compiled, then called sound: no prompt could be laid out from them
        b"{{ raise_exception('a system turn first') }}": "raises on a prompt of one user turn, "
        "with or without a system turn (TemplateError): no prompt is laid out by it",
        b"{{ messages[3].content }}": "raises on a prompt of one user turn, with or without a "
        "system turn (UndefinedError)",
        b"{% if false %}x{% endif %}  ": "renders nothing for a prompt of one user turn",
        b"{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x": (
            "took over 1 s to render a prompt (a loop without end?)"
        ),
    }
    monkeypatch.setattr("expert_cli.train.tokenizer_files.TEMPLATE_SECONDS", 1)
    for data, expected in unrendered.items():
        bad = _repack(
            good, tmp_path / "bad.expert", lambda f, d=data: {**f, "chat_template.jinja": d}
        )
        problems = verify_package(bad).problems
        assert problems[0].startswith(f"chat_template.jinja: {expected}"), problems
        assert "system turn first" not in problems[0]  # the template's words never quoted
    asks_a_system_turn = (  # a template may: sound
        b"{% if messages[0].role != 'system' %}{{ raise_exception('no') }}{% endif %}"
        b"{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    fine = _repack(good, tmp_path / "fine.expert",
                   lambda f: {**f, "chat_template.jinja": asks_a_system_turn})  # fmt: skip
    assert verify_package(fine).problems == []
    run, _ = _adapter_copy(v2_run, tmp_path / "raises")  # the run's own: fix it, not copy it
    (run / "chat_template.jinja").write_bytes(b"{{ messages[3].content }}")
    said = _refused("package", run, tmp_path)
    assert "no prompt is laid out by it; fix the chat template the run was given" in said, said

    def no_template(files: dict) -> dict:  # prompts laid out by a template it does not hold
        manifest = json.loads(files["manifest.json"])
        manifest["base_models"][0]["prompt_template"] = "chat_template"
        kept = {n: d for n, d in files.items() if n != "chat_template.jinja"}
        return {**kept, "manifest.json": json.dumps(manifest).encode()}

    problems = verify_package(_repack(good, tmp_path / "bad.expert", no_template)).problems
    assert problems == [
        "chat_template.jinja: missing, and base_models[0].prompt_template is chat_template: "
        "prompts are laid out by it"
    ]
    for name, (data, expected) in damaged_template.items():
        bad = _repack(good, tmp_path / "bad.expert", lambda f, n=name, d=data: {**f, n: d})
        assert verify_package(bad).problems[0].startswith(f"{name}: {expected}")
    for name, (data, expected) in damaged.items():
        bad = _repack(good, tmp_path / "bad.expert", lambda f, n=name, d=data: {**f, n: d})
        assert verify_package(bad).problems == [f"{name}: {expected}"]
        run, _ = _adapter_copy(v2_run, tmp_path / name)
        (run / name).write_bytes(data)
        said = _refused("package", run, tmp_path)
        assert f"{run / name}: {expected}; copy the run's tokenizer files back from one" in said
    # tokenizer.json alone missing: the rest was shipped and called sound; no loader reads it
    missing = "tokenizer.json: missing beside tokenizer_config.json (a loader cannot build"
    gone = lambda files: {n: d for n, d in files.items() if n != "tokenizer.json"}  # noqa: E731
    problems = verify_package(_repack(good, tmp_path / "bad.expert", gone)).problems
    assert len(problems) == 1 and problems[0].startswith(missing), problems
    run, _ = _adapter_copy(v2_run, tmp_path / "no-tokenizer-json")
    (run / "tokenizer.json").unlink()
    assert f"{run}: {missing}" in _refused("package", run, tmp_path)
    run, _ = _adapter_copy(v2_run, tmp_path / "none")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (run / name).unlink(missing_ok=True)
    out = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "n.expert"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{run} holds no tokenizer files: the package has none" in " ".join(out.stdout.split())
    assert "tokenizer.json" not in _unpack(tmp_path / "n.expert")


@pytest.mark.slow
def test_the_packaged_adapter_entry_describes_the_adapter_shipped(
    v2_run: Path, tmp_path: Path
) -> None:
    """A manifest whose adapter entry says DoRA at rank 32 while training.config trained LoRA
    at rank 8 (it wins) shipped that entry beside the rank-8 LoRA: the package now says what it
    holds and names each value it changed; check names a package whose entry disagrees."""
    run, _ = _adapter_copy(v2_run, tmp_path)
    source = json.loads((run / "manifest.source.json").read_text())
    entry = source["base_models"][0]["adapters"][0]
    entry.update(type="dora", r=32, alpha=64)
    (run / "manifest.source.json").write_text(json.dumps(source))
    package = tmp_path / "x.expert"
    done = run_here("package", "--adapter", str(run), "--output", str(package), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    notes = " ".join(json.loads(done.stdout)["notes"])
    for said in ("type: dora in the manifest, lora", ".r: 32 in the manifest, 8", "alpha: 64"):
        assert said in notes
    members = _unpack(package)
    shipped = json.loads(members["manifest.json"])["base_models"][0]["adapters"][0]
    config = json.loads(members["adapter_config.json"])
    assert (shipped["type"], shipped["r"], shipped["alpha"]) == ("lora", 8, 16)
    assert (config["r"], config["lora_alpha"], config.get("use_dora")) == (8, 16, False)
    assert run_here("check", "--package", str(package)).returncode == 0

    def edited(files: dict[str, bytes]) -> dict[str, bytes]:
        manifest = json.loads(files["manifest.json"])
        manifest["base_models"][0]["adapters"][0]["r"] = 64
        return {**files, "manifest.json": json.dumps(manifest).encode()}

    out = run_here("check", "--package", str(_repack(package, tmp_path / "bad.expert", edited)))
    assert out.returncode == 2, out.stdout + out.stderr
    line = "base_models[0].adapters[0].r: 64 in manifest.json, 8 in adapter_config"
    assert line in " ".join(out.stdout.split())
    good = json.loads(run_here("check", "--package", str(package), "--json").stdout)
    assert not [n for n in good["notes"] if n.startswith("training.config.")]

    def retold(files: dict[str, bytes]) -> dict[str, bytes]:  # how it was trained, edited
        manifest = json.loads(files["manifest.json"])
        manifest["training"]["config"].update(rank=64, adapter_type="dora")
        return {**files, "manifest.json": json.dumps(manifest).encode()}

    out = run_here("check", "--package", str(_repack(package, tmp_path / "re.expert", retold)))
    said = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stdout + out.stderr  # the loader reads the entry: a note
    for line in (
        "training.config.rank: 64 in manifest.json, 8 in adapter_config.json (the adapter "
        "shipped is the latter)",
        "training.config.adapter_type: dora in manifest.json, lora in adapter_config.json",
    ):
        assert line in said, said

    def rebased(files: dict[str, bytes]) -> dict[str, bytes]:  # made for another model
        config = json.loads(files["adapter_config.json"])
        config["base_model_name_or_path"] = "Qwen/Qwen3-8B"
        return {**files, "adapter_config.json": json.dumps(config).encode()}

    out = run_here("check", "--package", str(_repack(package, tmp_path / "rb.expert", rebased)))
    said = " ".join(out.stdout.split())
    assert (
        out.returncode == 0
        and (
            "adapter_config.json: base_model_name_or_path Qwen/Qwen3-8B is not the manifest's base "
            "model"
        )
        in said
    ), said
    assert "base_model_name_or_path" not in " ".join(good["notes"])  # as package writes it


def test_an_adapter_entry_takes_the_values_of_each_adapter_kind() -> None:
    """AdaLoRA's rank is its initial rank, LoKr's alpha its own key; an IA3 adapter has
    neither, so an entry's rank and alpha do not stay beside it."""
    from expert_cli.train.adapter_entry import described, reconciled

    adalora = {"peft_type": "ADALORA", "r": 8, "init_r": 12, "lora_alpha": 24.0}
    assert described(adalora) == {"type": "adalora", "r": 12, "alpha": 24}
    assert described({"peft_type": "LOKR", "r": 4, "alpha": 8}) == {
        "type": "lokr",
        "r": 4,
        "alpha": 8,
    }
    entry = {"type": "lora", "r": 16, "alpha": 32, "use_dora": False}
    notes = reconciled(entry, {"peft_type": "IA3", "target_modules": ["q"]}, "adapters[0]")
    assert entry == {"type": "ia3", "target_modules": ["q"]} and notes == [
        "adapters[0].type: lora in the manifest, ia3 in the adapter it ships (its "
        "adapter_config.json: training.config or --set chose it, or the file was edited): the "
        "package says the adapter's"
    ]
    same = {"type": "lora", "use_dora": True, "r": 8, "alpha": 16.0}
    assert (
        reconciled(same, {"peft_type": "LORA", "use_dora": True, "r": 8, "lora_alpha": 16}, "a")
        == []
    )


def test_an_adapter_entry_takes_the_targets_and_dropout_trained() -> None:
    """`train --set target_modules=[q_proj,v_proj] --set dropout=0.1` on a manifest whose entry
    says all-linear and 0.0 shipped that entry beside a q/v adapter: a loader applying it
    would look for layers the adapter does not hold. An all-linear run keeps all-linear (peft
    saves the layers it found), and check --package names a target list that differs."""
    from expert_cli.train.adapter_entry import disagreements, reconciled

    config = {
        "peft_type": "LORA", "use_dora": True, "r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
        "target_modules": ["v_proj", "q_proj"],
    }  # fmt: skip
    entry = {"type": "lora", "r": 16, "target_modules": "all-linear", "dropout": 0.0}
    notes = reconciled(entry, config, "a", ["q_proj", "v_proj"])
    assert entry == {
        "type": "dora", "r": 4, "target_modules": ["q_proj", "v_proj"], "dropout": 0.1,
        "alpha": 8,
    }  # fmt: skip
    assert [n.split(":")[0] for n in notes] == ["a.type", "a.r", "a.dropout", "a.target_modules"]
    assert "a.target_modules: all-linear in the manifest, q_proj, v_proj in the adapter" in notes[3]
    kept = {"type": "lora", "target_modules": "all-linear"}
    expanded = {**config, "use_dora": False, "target_modules": ["q_proj", "k_proj", "v_proj"]}
    reconciled(kept, expanded, "a", "all-linear")
    assert kept["target_modules"] == "all-linear" and kept["dropout"] == 0.1
    assert disagreements({"type": "dora", "target_modules": ["q_proj"]}, config) == [
        ("target_modules", "q_proj", "q_proj, v_proj")
    ]
    same = {"type": "dora", "target_modules": ["v_proj", "q_proj"], "dropout": 0.1}
    assert disagreements(same, config) == []


def test_manifest_edits_since_the_run_are_named(v2_run: Path, tmp_path: Path) -> None:
    """A description or decoding edited in manifest.json after training was left out of the
    package (it ships the run's manifest.source.json) without a word; then they could be
    shipped only by editing the run's copy: what describes and decodes the expert is taken
    from the file as it is now, said; an edit that changes training is still named."""
    expert = tmp_path / "expert-tiny"
    shutil.copytree(v2_run.parent, expert, ignore=shutil.ignore_patterns("out", ".cache"))
    run, _ = _adapter_copy(v2_run, tmp_path)
    resolved = json.loads((run / "manifest.resolved.json").read_text())
    resolved["manifest_path"] = str(expert / "manifest.json")
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))

    def package_notes() -> list[str]:
        out = tmp_path / "x.expert"
        done = run_here("package", "--adapter", str(run), "--output", str(out), "--json", "--force")
        assert done.returncode == 0, done.stdout + done.stderr
        return [n for n in json.loads(done.stdout)["notes"] if "edited since the run" in n]

    assert package_notes() == []
    manifest = json.loads((expert / "manifest.json").read_text())
    manifest["training"]["packaging_checkpoint"] = "final"  # given after training, as asked
    (expert / "manifest.json").write_text(json.dumps(manifest))
    assert package_notes() == []
    manifest["description"] = "A better description."
    manifest["training"]["decoding"]["temperature"] = 0.7
    manifest["tags"] = ["sql"]
    manifest["author"] = "me"
    manifest["training"]["config"]["rank"] = 2  # changes training: named, not taken
    (expert / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "x.expert"
    done = run_here("package", "--adapter", str(run), "--output", str(out), "--json", "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert f"{expert / 'manifest.json'}: edited since the run (training.config);" in " ".join(notes)
    assert (
        f"description, author, tags, training.decoding: as {expert / 'manifest.json'} holds them "
        "now (edited since the run; describing the expert, not what it trained)"
    ) in notes
    shipped = json.loads(_unpack(out)["manifest.json"])
    assert shipped["description"] == "A better description." and shipped["tags"] == ["sql"]
    assert shipped["author"] == "me" and shipped["training"]["decoding"]["temperature"] == 0.7
    assert shipped["training"]["config"]["rank"] != 2  # as trained
    tried = run_here("generate", "--adapter", str(run), "-p", "SELECT", "--max-new-tokens", "2",
                     "--json")  # fmt: skip
    assert tried.returncode == 0, tried.stdout + tried.stderr
    result = json.loads(tried.stdout)
    assert result["settings"]["temperature"] == 0.7  # generate decodes as the file says now
    assert any(
        n.startswith(f"training.decoding: as {expert / 'manifest.json'} holds it now")
        for n in result["notes"]
    )
    manifest["version"] = "0.1/2"  # not a file name part: named in the file
    (expert / "manifest.json").write_text(json.dumps(manifest))
    done = run_here("package", "--adapter", str(run), "--output", str(out), "--force")
    assert done.returncode == 2
    said = " ".join((done.stdout + done.stderr).split())
    assert f"{expert / 'manifest.json'} (its later edits): version" in said, said
    # the file now another expert's (a folder reused): it lends nothing, and says so
    manifest.update(name="expert-poetry", version="3.0.0", routing={"keywords": ["poem"]})
    manifest["training"]["packaging_checkpoint"] = "checkpoint-999"  # nor which to ship
    (expert / "manifest.json").write_text(json.dumps(manifest))
    done = run_here("package", "--adapter", str(run), "--output", str(out), "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    shipped = json.loads(_unpack(out)["manifest.json"])
    assert shipped["training"]["packaging_checkpoint"] == "final"
    assert shipped["name"] == "expert-test" and "routing" not in shipped
    assert shipped["description"] == "A test expert." and shipped.get("version") != "3.0.0"
    # the run's copy edited by hand (as an earlier version advised), the file as trained: the
    # copy wins (the file's unchanged description undid the edit, over and over)
    copy = json.loads((run / "manifest.source.json").read_text())
    (expert / "manifest.json").write_text(json.dumps(copy))
    (run / "manifest.source.json").write_text(json.dumps({**copy, "description": "By hand."}))
    done = run_here("package", "--adapter", str(run), "--output", str(out), "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(_unpack(out)["manifest.json"])["description"] == "By hand."
    said = " ".join(done.stdout.split())  # it blamed the manifest file, which was as trained
    assert "the run's manifest.source.json was edited since the run wrote it" in said, said
    # the file unreadable now: with --checkpoint (not read for packaging_checkpoint) its
    # edits were dropped without a word; the note names its problem, not its contents
    (run / "manifest.source.json").write_text(json.dumps(copy))
    (expert / "manifest.json").write_text('{"name": "expert-test", "description": "A better')
    done = run_here("package", "--adapter", str(run), "--checkpoint", "final", "--output",
                    str(out), "--force")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert f"{expert / 'manifest.json'}:1:" in said and "invalid JSON" in said, said
    assert "so its edits since the run (description, version" in said and "better" not in said
    tried = run_here("generate", "--adapter", str(run), "-p", "SELECT", "--max-new-tokens", "2",
                     "--json")  # fmt: skip
    assert tried.returncode == 0, tried.stdout + tried.stderr
    assert any("are not taken" in n for n in json.loads(tried.stdout)["notes"])


def test_a_note_of_the_package_check_is_said_once(v2_run: Path, tmp_path: Path) -> None:
    """What HiveLLM's runtime would not apply was said by package's plan and again by the
    check of the package it wrote (an AdaLoRA run's note, twice)."""
    run, _ = _adapter_copy(v2_run, tmp_path)
    config = json.loads((run / "adapter_config.json").read_text())
    targets = [*config["target_modules"], "embed_tokens"]  # read by the runtime note alone
    (run / "adapter_config.json").write_text(json.dumps({**config, "target_modules": targets}))
    out = tmp_path / "x.expert"
    done = run_here("package", "--adapter", str(run), "--output", str(out), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    notes = json.loads(done.stdout)["notes"]
    assert len([n for n in notes if "the embedding's adapter" in n]) == 1, notes


def test_a_base_named_by_a_folder_or_a_hub_id_agrees() -> None:
    from expert_cli.train.adapter_entry import base_note

    hub = {"base_models": [{"name": "Qwen/Qwen3-0.6B"}]}
    for folder in ("F:\\models\\Qwen3-0.6B", "/data/models/qwen3-0.6b/", "Qwen3-0.6B"):
        assert base_note(hub, {"base_model_name_or_path": folder}) == []
    (note,) = base_note(
        {"base_model": {"name": "models/Qwen3-0.6B"}}, {"base_model_name_or_path": "Qwen/Qwen3-8B"}
    )
    assert note.startswith("adapter_config.json: base_model_name_or_path Qwen/Qwen3-8B is not")
    assert base_note(hub, {}) == [] and base_note({}, {"base_model_name_or_path": "x"}) == []


def test_a_package_of_repeated_bytes_says_what_it_unpacks_to(
    v2_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 GiB of zeros in a 3.7 MB archive was sound without a word of its size (HiveLLM's
    install unpacks it all): the size is said where it is over 20 times the archive's (the
    1 GiB floor lowered here to 1 MiB, so the test writes megabytes, not gigabytes)."""
    from expert_cli.train import package_check

    package = tmp_path / "good.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(package)).returncode == 0
    monkeypatch.setattr(package_check, "BIG_UNPACKED", 1 << 20)
    assert not [n for n in verify_package(package).notes if "unpacks to" in n]
    zeros = _repack(package, tmp_path / "zeros.expert", lambda f: {**f, "z.bin": bytes(8 << 20)})
    report = verify_package(zeros)
    said = [n for n in report.notes if "unpacks to" in n]
    assert report.ok and len(said) == 1 and "files of repeated bytes" in said[0], report.notes
    # the whole is bounded too (each file was, at 20 GiB, and 10,000 of them): 40 GiB, lowered
    # here to the sound package's size, so it is read at the bound and refused past it
    whole = sum(len(data) for data in _unpack(package).values())
    monkeypatch.setattr(package_check, "MAX_UNPACKED_BYTES", whole)
    assert verify_package(package).ok
    monkeypatch.setattr(package_check, "MAX_UNPACKED_BYTES", whole - 1)
    (problem,) = verify_package(package).problems
    assert problem.endswith(
        ": the files up to it unpack to over 0 GiB in all, more than any adapter package; not "
        "read further"
    ), problem


def test_a_tokenizer_file_too_large_to_read_is_not_called_sound(
    v2_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer.json of 2 GiB of zeros (a 2.6 MB archive) was "over 64 MiB, not checked"
    and the package sound. Past the size no model's tokenizer reaches (256 MiB; lowered here
    to the tiny tokenizer's size, so the test reads kilobytes) it is a problem."""
    from expert_cli.train import package_check

    package = tmp_path / "good.expert"
    assert run_here("package", "--adapter", str(v2_run), "--output", str(package)).returncode == 0
    size = len(_unpack(package)["tokenizer.json"])
    monkeypatch.setattr(package_check, "TOKENIZER_CHECK_BYTES", size)
    assert verify_package(package).ok  # at the bound: read and checked
    monkeypatch.setattr(package_check, "TOKENIZER_CHECK_BYTES", size - 1)
    assert verify_package(package).problems == [
        f"tokenizer.json: over {(size - 1) >> 20} MiB, larger than any model's tokenizer file; "
        "not read, so not called sound"
    ]


def test_what_a_killed_package_left_is_removed_and_said(v2_run: Path, tmp_path: Path) -> None:
    """A package killed as it was written left `.tmp-NAME.expert-PID` (hundreds of MB for a
    real expert) beside where the package goes; the next package neither removed nor named
    it. Only temporaries of this package and its checksum, of a process no longer running,
    unwritten for ten minutes (a pid of this machine may be another's on a shared folder), go."""
    import os
    import subprocess

    done = subprocess.Popen(["true"])
    done.wait()  # its pid: a process no longer running
    left = [tmp_path / f".tmp-x.expert-{done.pid}", tmp_path / f".tmp-x.expert.sha256-{done.pid}"]
    kept = [tmp_path / f".tmp-x.expert-{os.getppid()}", tmp_path / f".tmp-y.expert-{done.pid}"]
    fresh = tmp_path / f".tmp-x.expert-{done.pid + 1}"  # written to now: a shared folder's
    for path in [*left, *kept, fresh]:
        path.write_bytes(b"half a package")
        if path != fresh:  # unwritten for an hour
            os.utime(path, (path.stat().st_atime - 3600, path.stat().st_mtime - 3600))
    out = run_here("package", "--adapter", str(v2_run), "--output", str(tmp_path / "x.expert"))
    assert out.returncode == 0, out.stdout + out.stderr
    said = " ".join(out.stdout.split())
    for path in left:
        assert not path.exists()
        assert f"removed {path.name}, left by a package that was stopped" in said
    assert all(path.exists() for path in [*kept, fresh])
    assert (tmp_path / "x.expert").is_file()


def test_package_of_a_run_stopped_before_its_end_says_so(v2_run: Path, tmp_path: Path) -> None:
    """A run stopped before its final adapter got "no adapter_config.json (expected the output
    folder of `expert-cli train`)", which it is; and with its manifest.resolved.json cut short
    too, the same words, not the damaged record."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(v2_run, run)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (run / name).unlink()
    held = sorted(p.name for p in (run / "checkpoints").iterdir())
    out = run_here("package", "--adapter", str(run), "--output", str(tmp_path / "x.expert"))
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2, said
    assert said.endswith(
        "the run stopped before writing its final adapter; finish it with `expert-cli train` "
        "with the same --output and --resume; ship a checkpoint: --checkpoint NAME "
        f"({', '.join(held)})"
    ), said
    assert "no adapter_config.json" not in said
    resolved = run / "manifest.resolved.json"
    resolved.write_text(resolved.read_text()[:300])
    out = run_here("package", "--adapter", str(run), "--checkpoint", held[-1])
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2 and "its manifest.resolved.json is missing, unreadable" in said


def test_a_runs_weights_get_the_mode_of_its_other_files(v2_run: Path) -> None:
    """safetensors writes each file 0600 (a temporary file renamed): a run shared with
    others could be read but for its weights. They now get what a new file gets."""
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    weights = [v2_run / "adapter_model.safetensors", *v2_run.glob("checkpoints/*/*.safetensors")]
    assert len(weights) >= 2
    modes = {p.name: p.stat().st_mode & 0o777 for p in weights}
    assert set(modes.values()) == {0o666 & ~mask}, modes
    assert (v2_run / "adapter_config.json").stat().st_mode & 0o777 == 0o666 & ~mask
