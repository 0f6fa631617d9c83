"""Hub references: in the local cache (with its size), downloadable, or neither, said in
seconds: offline mode is exit 2, a hub that cannot be reached is exit 1, never a minute of
retries."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from train_helpers import run_cli, run_here

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "experts" / "expert-sql" / "manifest.json"
ONLINE = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_DATASETS_OFFLINE": None}


@pytest.fixture
def blackhole() -> Iterator[str]:
    """An endpoint that accepts connections and never answers (a dropped network)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # the kernel completes handshakes; nothing ever reads or replies
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


@pytest.fixture
def hub_endpoint() -> Iterator[str]:
    """An endpoint that answers every request (the hub, reachable)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 - the standard library's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _cached_model(home: Path, repo: str = "Qwen/Qwen3-0.6B") -> Path:
    """A hub-cache entry as huggingface_hub lays it out: blobs, a snapshot, refs/main."""
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "abc123").write_bytes(b"{}" * 5000)
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(folder / "blobs" / "abc123")
    # a whole safetensors file of no tensors (10 bytes): a snapshot with weights to load
    (folder / "blobs" / "def456").write_bytes((2).to_bytes(8, "little") + b"{}")
    (snapshot / "model.safetensors").symlink_to(folder / "blobs" / "def456")
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abcd")
    return folder


def test_cached_model_and_offline_dataset(tmp_path: Path) -> None:
    folder = _cached_model(tmp_path)
    out = run_here("check", "-m", str(SQL), "--json", env={"HF_HOME": str(tmp_path)})
    assert out.returncode == 2, out.stdout + out.stderr
    report = json.loads(out.stdout)
    model, dataset = report["hub"]
    assert (model["kind"], model["repo"], model["cache_path"]) == (
        "model",
        "Qwen/Qwen3-0.6B",
        str(folder),
    )
    assert model["cached_bytes"] == 10_010  # each blob once, not again through its link
    assert dataset["kind"] == "dataset" and dataset["cache_path"] is None
    assert (
        len(report["problems"]) == 1 and "gretelai/synthetic_text_to_sql" in report["problems"][0]
    )
    text = run_here("check", "-m", str(SQL), env={"HF_HOME": str(tmp_path)})
    assert "in the local cache:" in text.stdout and "Qwen/Qwen3-0.6B (9.8 KB)" in text.stdout


@pytest.mark.parametrize("layout", ["empty", "dangling", "zero bytes"])
def test_a_snapshot_without_a_byte_is_not_cached(tmp_path: Path, layout: str) -> None:
    """A download stopped before its first byte left the snapshot folder (empty, or links to
    blobs never finished): it read as cached, then the dataset's load failed offline."""
    from expert_cli.data.hub import HubRef, cached

    folder = tmp_path / "hub" / "datasets--org--rows"
    snapshot = folder / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (folder / "blobs").mkdir()
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0123abcd")
    if layout == "dangling":
        (snapshot / "train.jsonl").symlink_to(folder / "blobs" / "abc.incomplete")
    elif layout == "zero bytes":
        (folder / "blobs" / "abc").write_bytes(b"")
        (snapshot / "train.jsonl").symlink_to(folder / "blobs" / "abc")
    roots = {"hub": tmp_path / "hub", "datasets": tmp_path / "datasets"}
    ref = HubRef("dataset", "org/rows", None, "training.dataset.path")
    assert cached(ref, roots) is None
    (folder / "blobs" / "abc").write_bytes(b'{"text": "x"}')
    (snapshot / "train.jsonl").unlink(missing_ok=True)
    (snapshot / "train.jsonl").symlink_to(folder / "blobs" / "abc")
    assert cached(ref, roots) == (folder, 13)  # blobs and snapshots counted
    (folder / "refs" / "main").write_text("fedc")  # main names a snapshot not there
    assert cached(ref, roots) is None


def test_a_reachable_hub_means_downloads(tmp_path: Path, hub_endpoint: str) -> None:
    env = {**ONLINE, "HF_HOME": str(tmp_path), "HF_ENDPOINT": hub_endpoint}
    out = run_here("check", "-m", str(SQL), "--json", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["problems"] == []
    assert [h["reachable"] for h in report["hub"]] == [True, True]
    assert report["downloads"] == [
        f"model: Qwen/Qwen3-0.6B will be downloaded from {hub_endpoint} on first use",
        f"dataset: gretelai/synthetic_text_to_sql will be downloaded from {hub_endpoint} on "
        "first use",
    ]


@pytest.mark.parametrize("command", ["train", "pretokenize"])
def test_no_network_fails_in_seconds(tmp_path: Path, blackhole: str, command: str) -> None:
    env = {**ONLINE, "HF_HOME": str(tmp_path), "HF_ENDPOINT": blackhole}
    args = ("--output", str(tmp_path / "out")) if command == "train" else ()
    # train as a user runs it (the hub libraries imported with the hub on), pretokenize in-process
    run = run_cli if command == "train" else run_here
    start = time.monotonic()
    out = run(command, "-m", str(SQL), *args, env=env)
    elapsed = time.monotonic() - start
    assert out.returncode == 1, out.stdout + out.stderr  # a run-time condition, not bad input
    text = " ".join(out.stderr.split())
    assert "model Qwen/Qwen3-0.6B (no folder of that name beside the manifest, so it is read " in (
        text
    )
    assert "is not in the local cache and the hub cannot be reached" in text
    assert "Retry" not in out.stdout + out.stderr and "Traceback" not in out.stderr
    # one 5 s probe; the hub library's own calls into a blackhole wait 10 s each, retried (the
    # margin is for a fresh interpreter's imports on a loaded 2-core machine: 15 s failed)
    assert elapsed < 40, elapsed
    assert not (tmp_path / "out").exists()  # nothing was started


def test_pretokenize_all_labels_each_expert_and_ends_with_a_table(tmp_path: Path) -> None:
    out = run_here(
        "pretokenize",
        "-m",
        str(ROOT / "experts" / "demo" / "manifest.json"),
        "-m",
        str(SQL),
        env={"HF_HOME": str(tmp_path)},
    )
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stdout
    assert "expert-sql: bad input (" in text  # offline and not cached: the user's setting
    table = text[text.index("pretokenize") :]
    assert "expert-demo" in table and "expert-sql" in table
    assert "1 of 2 manifests did not build (above)" in " ".join(out.stderr.split())


@pytest.mark.parametrize("command", ["train", "pretokenize"])
def test_every_missing_input_in_one_message(tmp_path: Path, command: str) -> None:
    """Offline, a hub model not cached and two local files not there: one try names all
    three (it named the model alone, and the files one run later)."""
    manifest = json.loads((ROOT / "experts" / "demo" / "manifest.json").read_text())
    manifest["base_models"][0]["name"] = "Qwen/Qwen3-0.6B"
    manifest["training"]["dataset"]["path"] = "data/none.jsonl"
    manifest["training"]["dataset"]["validation_path"] = "gone.jsonl"
    path = tmp_path / "expert" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(manifest))
    args = ("--output", str(tmp_path / "out")) if command == "train" else ()
    out = run_here(command, "-m", str(path), *args, env={"HF_HOME": str(tmp_path / "hf")})
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line.strip() for line in out.stderr.splitlines()[1:]]
    assert [line.split(":")[0] for line in lines] == [
        "base_models[0].name",
        str(path.parent / "data" / "none.jsonl"),
        str(path.parent / "gone.jsonl"),
    ]
    assert lines[1].endswith("not found (training.dataset.path)")
    assert lines[2].endswith("not found (training.dataset.validation_path)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expert"]  # nothing started
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.json"]


def test_random_init_of_a_hub_model(tmp_path: Path) -> None:
    """`init: random` with a hub id builds that model's architecture from its config.json in
    the hub cache (no weights needed); it was taken for a local folder beside the manifest."""
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    demo = ROOT / "experts" / "demo"
    for item in (demo / "model").iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    manifest = json.loads((demo / "manifest.json").read_text())
    manifest["base_models"][0]["name"] = "org/tiny"
    manifest["training"]["dataset"]["path"] = str(demo / "data" / "train.jsonl")
    manifest["training"]["dataset"]["validation_path"] = str(demo / "data" / "valid.jsonl")
    manifest["training"]["config"].update(max_steps=2, save_strategy="no")
    path = tmp_path / "expert" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(manifest))
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    report = json.loads(run_here("check", "-m", str(path), "--json", env=env).stdout)
    assert report["problems"] == []
    assert (report["config"]["base_model"], report["config"]["base_model_kind"]) == (
        "org/tiny",
        "hub",
    )
    assert report["hub"][0]["cache_path"] == str(snapshot.parents[1])
    # a fresh interpreter: the hub library reads HF_HOME when it is imported
    out = run_cli("train", "-m", str(path), "--output", str(tmp_path / "run"), env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    built = json.loads((tmp_path / "run" / "base_model" / "config.json").read_text())
    wanted = json.loads((snapshot / "config.json").read_text())
    assert (built["num_hidden_layers"], built["hidden_size"]) == (
        wanted["num_hidden_layers"],
        wanted["hidden_size"],
    )
    summary = json.loads((tmp_path / "run" / "metrics.json").read_text())["summary"]
    assert (summary["steps"], summary["status"]) == (2, "completed")


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_a_dataset_in_the_hub_cache_trains_without_the_hub(
    monkeypatch, tmp_path: Path, blackhole: str, hub: str
) -> None:
    """A dataset `hf download` put in the hub cache was "cached" to check, and train could not
    load it: the datasets library reads a hub id from its own Arrow cache alone when the hub
    cannot be asked (offline: ConnectionError; no network: a minute of retries, their log lines
    on the terminal). Its snapshot is read as a local folder now."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "arrow"))
    repo = tmp_path / "hf" / "hub" / "datasets--org--mini"
    (repo / "snapshots" / "abc" / "data").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    rows = [
        {"text": f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\na{i}<|im_end|>\n"}
        for i in range(30)
    ]
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    (repo / "snapshots" / "abc" / "data" / "train.jsonl").write_text(lines)
    demo = ROOT / "experts" / "demo"
    manifest = json.loads((demo / "manifest.json").read_text())
    manifest["base_models"][0]["name"] = str(demo / "model")
    manifest["training"]["dataset"] = {"path": "org/mini", "field_mapping": {"text": "text"}}
    path = tmp_path / "expert" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(manifest))
    env = {"HF_HOME": str(tmp_path / "hf")}
    env |= {"HF_HUB_OFFLINE": "1"} if hub == "offline" else {**ONLINE, "HF_ENDPOINT": blackhole}
    report = json.loads(run_here("check", "-m", str(path), "--json", env=env).stdout)
    assert report["problems"] == [] and report["hub"][0]["cache_path"] == str(repo)
    started = time.monotonic()
    done = run_here("pretokenize", "-m", str(path), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 60  # no minute of retries
    (found,) = (tmp_path / "expert" / ".cache").rglob("stats.json")
    stats = json.loads(found.read_text())
    assert stats["train"]["examples"] + stats["eval"]["examples"] == 30, stats
    # `hf download` again: a new snapshot, its file a link to its blob, and refs/main on it;
    # unpinned, the token cache of the old one was taken as current
    (repo / "blobs").mkdir()
    (repo / "blobs" / "f00d").write_text("".join(json.dumps(r) + "\n" for r in rows[:20]))
    (repo / "snapshots" / "def" / "data").mkdir(parents=True)
    (repo / "snapshots" / "def" / "data" / "train.jsonl").symlink_to(repo / "blobs" / "f00d")
    (repo / "refs" / "main").write_text("def")
    done = run_here("pretokenize", "-m", str(path), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rebuilt (changed: sources.train[0].files.data/train.jsonl" in done.stdout
    latest = max(
        (tmp_path / "expert" / ".cache").rglob("stats.json"), key=lambda p: p.stat().st_mtime
    )
    stats = json.loads(latest.read_text())
    assert stats["train"]["examples"] + stats["eval"]["examples"] == 20, stats


def test_a_hub_dataset_read_offline_is_judged_as_its_snapshot_reads(
    monkeypatch, tmp_path: Path
) -> None:
    """Read offline from its snapshot, a hub dataset with an unknown `::split` or
    `::split::config`, or whose refs/main names a snapshot not there, passed `check` and
    failed in the build in the datasets library's words, naming no field; data files of a
    format the library leaves out went unsaid; a pinned revision not cached was not named; its
    rows were never read by check (the build refused them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data.checks import check_manifest
    from expert_cli.data.source_set import load_sources
    from expert_cli.errors import UserError

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hf" / "hub" / "datasets--org--mini"
    data = repo / "snapshots" / "abc" / "data"
    data.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    lines = "".join(json.dumps({"text": f"q{i} a{i}"}) + "\n" for i in range(20))
    (data / "train.jsonl").write_text(lines)
    (data / "test.jsonl").write_text(lines)
    demo = ROOT / "experts" / "demo"
    manifest = json.loads((demo / "manifest.json").read_text())
    manifest["base_models"][0]["name"] = str(demo / "model")
    path = tmp_path / "expert" / "manifest.json"
    path.parent.mkdir()

    def judged(dataset: dict) -> tuple[list[str], list[str], list[str]]:
        """check's problems and notes, and what the build's reading of the sources says."""
        manifest["training"]["dataset"] = {"field_mapping": {"text": "text"}, **dataset}
        path.write_text(json.dumps(manifest))
        report = check_manifest(path)
        try:
            built = load_sources(resolve(load_manifest(path), cpu_environment()), tmp_path / "w")
            said = built.notes
        except UserError as exc:
            said = exc.lines
        return report.problems, report.notes, said

    where = (
        "training.dataset.path: hub dataset org/mini (read from its cached snapshot, "
        f"{data.parent})"
    )
    problems, _, said = judged({"path": "org/mini::validation"})
    expected = (
        f"{where} has no split 'validation' (its splits: 'train', 'test'); name one: "
        "org/mini::SPLIT"
    )
    assert problems == said == [expected]
    problems, _, said = judged({"path": "org/mini::train::nope"})
    expected = (
        f"{where} has no configuration 'nope' (it has: 'default'); name one: "
        "org/mini::train::CONFIG"
    )
    assert problems == said == [expected]
    for split in ("test+train[:50%]", "train[:33%](closest)"):
        problems, notes, said = judged({"path": f"org/mini::{split}"})
        assert problems == [] and not [n for n in notes + said if "datasets library" in n]
    for i in range(3):  # parquet files the library prefers: the JSON Lines ones are left out
        name = f"{'test' if i else 'train'}-{i}.parquet"
        pq.write_table(pa.table({"text": ["x y"] * 5}), data / name)
    problems, notes, said = judged({"path": "org/mini"})
    note = (
        f"{where}: holds 2 json file(s) the datasets library leaves out: it reads the parquet "
        "ones; download the repository (hf download org/mini --repo-type dataset --local-dir "
        "DIR) and name the files to train on"
    )
    assert problems == [] and note in notes and note in said
    for parquet in data.glob("*.parquet"):
        parquet.unlink()
    (data / "train.jsonl").write_text(lines + '{"text": null}\n')  # check reads its rows too
    problems, _, said = judged({"path": "org/mini"})
    assert problems == said == ["org/mini: row 21: field 'text' missing (field_mapping.text)"]
    (data / "train.jsonl").write_text(lines)
    for name in ("train-0.parquet", "test-0.parquet"):  # the format read, damaged
        (data / name).write_bytes(b"SECRET, not Parquet")
    problems, _, said = judged({"path": "org/mini"})
    assert problems == said and len(problems) == 1, problems
    assert (
        problems[0].startswith(
            "training.dataset.path: hub dataset org/mini: cannot be read from its cached "
            f"snapshot, {data.parent} (ArrowInvalid: "
        )
        and "SECRET" not in problems[0]
    ), problems
    for name in ("train-0.parquet", "test-0.parquet"):
        (data / name).unlink()
    (repo / "refs" / "main").write_text("gone")  # a ref to a snapshot not there
    problems, _, said = judged({"path": "org/mini"})
    assert (
        len(problems) == 1 and "org/mini" in problems[0] and "not in the local cache" in problems[0]
    )
    (repo / "refs" / "main").write_text("abc")
    problems, _, _ = judged({"path": "org/mini", "revision": "v2"})
    assert problems == [
        "training.dataset.path: dataset org/mini (no file or folder of that name beside the "
        "manifest, so it is read as a hub id) is not in the local cache at revision v2 "
        "(training.dataset.revision) and the hub is switched off (HF_HUB_OFFLINE); download it "
        "where there is a network (hf download org/mini --repo-type dataset --revision v2 "
        "--local-dir data/mini) and set training.dataset.path to the folder or its files"
    ]


def test_a_snapshot_missing_a_blob_or_typed_wrong_by_its_card(capfd, monkeypatch, tmp_path) -> None:
    """A hub snapshot whose second shard links to a blob never downloaded was read as its
    first shard alone, in silence; one whose card types `text` as int64 failed with the
    library's log line on stderr quoting a whole example."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from train_helpers import run_main

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    secret = "QQrowtextQQ"

    def snapshot(repo: str, card: str) -> Path:
        root = tmp_path / "hf" / "hub" / f"datasets--org--{repo}"
        data = root / "snapshots" / "abc" / "data"
        data.mkdir(parents=True)
        (root / "refs").mkdir()
        (root / "refs" / "main").write_text("abc")
        (data.parent / "README.md").write_text(card)
        table = pa.table({"text": [f"{secret} {i}" for i in range(8)]})
        pq.write_table(table, data / "train-00000-of-00002.parquet")
        return data

    missing = snapshot("cut", "# a card\n")
    (missing / "train-00001-of-00002.parquet").symlink_to(tmp_path / "blobs" / "never")
    typed = snapshot(
        "typed", "---\ndataset_info:\n  features:\n  - name: text\n    dtype: int64\n---\n"
    )
    (typed / "train-00001-of-00002.parquet").unlink(missing_ok=True)
    manifest = json.loads((ROOT / "experts" / "demo" / "manifest.json").read_text())
    manifest["base_models"][0]["name"] = str(ROOT / "experts" / "demo" / "model")
    path = tmp_path / "expert" / "manifest.json"
    path.parent.mkdir()
    said = {}
    for repo in ("cut", "typed"):
        manifest["training"]["dataset"] = {"path": f"org/{repo}", "field_mapping": {"text": "text"}}
        path.write_text(json.dumps(manifest))
        code, out, err = run_main(capfd, monkeypatch, "check", "-m", str(path))
        said[repo] = " ".join((out + err).split())
        assert code == 2 and secret not in said[repo], said[repo]
    assert (
        f"hub dataset org/cut (read from its cached snapshot, {missing.parent}) lacks 1 of its "
        "data files ('data/train-00001-of-00002.parquet': links to blobs never downloaded in "
        "full); download it again: hf download org/cut --repo-type dataset"
    ) in said["cut"]
    assert "hub dataset org/typed" in said["typed"] and "Failed to read file" not in said["typed"]
