"""The token cache: fingerprints, reuse, atomic resumable builds, one builder, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from train_helpers import run_here

from expert_cli.config import load_manifest
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
from expert_cli.data import prepare_data, prune_earlier_caches
from expert_cli.data.cache import cache_root_problem, open_cache_root
from expert_cli.data.discovery import human_size
from expert_cli.data.source_set import load_sources
from expert_cli.data.tokenizer import load_tokenizer
from expert_cli.errors import RunError, UserError

# builds the cache in a subprocess; its progress callback sleeps DELAY seconds each time a
# shard's examples are tokenized, so the build can be killed (or raced) between shards
RUNNER = """
import json, sys, time
from expert_cli.config import load_manifest
from expert_cli.data import prepare_data
from expert_cli.data.cache import cache_root_problem, open_cache_root
from expert_cli.data.tokenizer import load_tokenizer
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve

class Slow:
    def start(self, description, total):
        pass

    def advance(self, examples):
        time.sleep(float(sys.argv[3]))

r = resolve(load_manifest(sys.argv[1]), cpu_environment())
d = prepare_data(r, load_tokenizer(r), num_proc=1, shard_examples=int(sys.argv[2]),
                 progress=Slow())
print(json.dumps({"built": d.built, "status": d.status, "dir": str(d.cache_dir),
                  "resumed": d.stats["resumed_shards"]}))
"""


def prepare(manifest: Path, *overrides: str, force: bool = False, shard: int | None = None):
    resolved = resolve(load_manifest(manifest, list(overrides)), cpu_environment())
    return prepare_data(
        resolved,
        load_tokenizer(resolved),
        num_proc=1,
        force=force,
        shard_examples=shard,
    )


class Recorder:
    """A BuildProgress that keeps what it was told."""

    def __init__(self) -> None:
        self.description, self.total, self.done = "", 0, 0

    def start(self, description: str, total: int) -> None:
        self.description, self.total = description, total

    def advance(self, examples: int) -> None:
        self.done += examples


def load_instruction_expert(folder: Path):
    """An expert on the tiny tokenizer whose data is folder/train.jsonl (instruction rows)."""
    from conftest import TINY_TOKENIZER_DIR

    manifest = {
        "name": "e",
        "schema_version": "2.0",
        "base_models": [{"name": str(TINY_TOKENIZER_DIR), "init": "random"}],
        "training": {
            "dataset": {"path": "train.jsonl", "eval_fraction": 0.0},
            "config": {"evaluation_strategy": "no", "max_seq_length": 64},
        },
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return prepare(folder / "manifest.json")


def rows(data) -> list[tuple]:
    return [
        (tuple(r["input_ids"]), tuple(r["labels"]), tuple(r["position_ids"])) for r in data.train
    ]


def spawn(manifest: Path, shard: int, delay: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(manifest), str(shard), str(delay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_unchanged_inputs_reuse_the_cache(demo_expert_dir) -> None:
    manifest = demo_expert_dir / "manifest.json"
    first = prepare(manifest)
    assert (first.built, first.status, first.reason) == (
        True,
        "built",
        "no earlier cache of this expert",
    )
    assert (first.cache_dir / "_COMPLETE").is_file()
    assert first.stats["train"]["examples_read"] == 400
    assert first.stats["train"]["tokens"] == sum(first.train["num_tokens"])
    again = prepare(manifest)
    assert (again.built, again.status, again.cache_dir) == (False, "current", first.cache_dir)
    assert again.reason == "no fingerprint input changed"
    assert rows(again) == rows(first)
    os.utime(demo_expert_dir / "data" / "train.jsonl")  # same content, new mtime
    assert prepare(manifest).built is False
    forced = prepare(manifest, force=True)
    assert (forced.built, forced.status, forced.reason) == (True, "rebuilt", "--force")
    assert rows(forced) == rows(first)


def _append_row(folder: Path) -> None:
    path = folder / "data" / "train.jsonl"
    path.write_text(path.read_text() + json.dumps({"text": "one more example"}) + "\n")


def _edit_chat_template(folder: Path) -> None:
    path = folder / "model" / "chat_template.jinja"
    path.write_text(path.read_text() + " ")


class StopAfterFirstBatch(Recorder):
    """A person pressing Ctrl-C once the build is under way."""

    def advance(self, examples: int) -> None:
        raise KeyboardInterrupt


def test_an_interrupted_force_keeps_the_finished_cache(demo_expert_dir) -> None:
    manifest = demo_expert_dir / "manifest.json"
    first = prepare(manifest)
    before = {p: p.read_bytes() for p in first.cache_dir.rglob("*") if p.is_file()}
    resolved = resolve(load_manifest(manifest), cpu_environment())
    with pytest.raises(KeyboardInterrupt):
        prepare_data(
            resolved,
            load_tokenizer(resolved),
            num_proc=1,
            force=True,
            progress=StopAfterFirstBatch(),
        )
    assert {p: p.read_bytes() for p in first.cache_dir.rglob("*") if p.is_file()} == before
    again = prepare(manifest)
    assert (again.built, again.cache_dir) == (False, first.cache_dir)
    assert rows(again) == rows(first)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (["max_seq_length=256"], "max_seq_length 512 -> 256"),
        (["packing=false"], "packing True -> False"),
        (["training.dataset.overlong=drop"], "formatting.overlong truncate -> drop"),
        (["training.dataset.response_template=SELECT"], "formatting.response_template"),
        (["seed=7"], "seed 42 -> 7"),
        (["base_models.0.prompt_template=alpaca"], "formatting.prompt_template chatml -> alpaca"),
        (_append_row, "sources.train[0].files.data/train.jsonl.size"),
        (_edit_chat_template, "tokenizer.chat_template_sha256"),
    ],
)
def test_each_fingerprint_input_gives_a_new_cache(demo_expert_dir, change, key) -> None:
    manifest = demo_expert_dir / "manifest.json"
    first = prepare(manifest)
    overrides = change if isinstance(change, list) else []
    if callable(change):
        change(demo_expert_dir)
    second = prepare(manifest, *overrides)
    assert second.built and second.status == "rebuilt"
    assert second.cache_dir != first.cache_dir
    assert second.stats["fingerprint"] != first.stats["fingerprint"]
    assert any(line.startswith(key) for line in second.changes), second.changes
    assert (first.cache_dir / "_COMPLETE").is_file()  # the old cache is left intact
    latest = json.loads(next(second.cache_dir.parent.glob("*.latest.json")).read_text())
    assert latest["fingerprint"] == second.stats["fingerprint"]


def test_incomplete_cache_is_never_read(demo_expert_dir) -> None:
    manifest = demo_expert_dir / "manifest.json"
    first = prepare(manifest)
    (first.cache_dir / "_COMPLETE").unlink()
    second = prepare(manifest)
    assert second.built is True and second.cache_dir == first.cache_dir
    assert rows(second) == rows(first)


def test_a_finished_cache_damaged_since_is_a_run_error_until_rebuilt(demo_expert_dir) -> None:
    """An Arrow file cut short or stats.json overwritten after the build finished (a disk
    error, a hand edit): exit 1 naming the folder and how to rebuild, not a traceback."""
    manifest = demo_expert_dir / "manifest.json"
    first = prepare(manifest)
    expected = rows(first)
    arrow = next((first.cache_dir / "train").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(RunError) as info:
        prepare(manifest)
    assert str(info.value) == (
        f"{first.cache_dir / 'train'}: not a readable saved dataset (an Arrow file in it is "
        f"damaged or cut short: OSError); delete {first.cache_dir} (or run pretokenize "
        "--force) to rebuild"
    )
    again = prepare(manifest, force=True)
    assert again.built is True and rows(again) == expected
    (again.cache_dir / "stats.json").write_text("{not json")
    with pytest.raises(RunError, match="stats.json is unreadable or its fingerprint"):
        prepare(manifest)


@pytest.mark.slow
def test_sigkill_mid_build_then_resume(demo_expert_dir, tmp_path) -> None:
    manifest = demo_expert_dir / "manifest.json"
    root = demo_expert_dir / ".cache" / "pretokenized"
    proc = spawn(manifest, shard=50, delay=3.0)
    deadline = time.time() + 60
    while not list(root.glob(".build-*/train/shard-00000/_COMPLETE")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = list(root.glob(".build-*/*/shard-*"))
    assert len(finished) == 1
    reused_tokens = json.loads((finished[0] / "stats.json").read_text())["tokens"]
    # the killed process's copies of the data files are the ones another process writes
    # (they were named by a per-process str hash: each retry added a full copy beside them)
    copies = next(root.glob(".build-*")) / "sources"
    before = sorted(p.name for p in copies.iterdir())
    assert len(before) == 2  # train.jsonl and valid.jsonl
    load_sources(resolve(load_manifest(manifest), cpu_environment()), copies)
    assert sorted(p.name for p in copies.iterdir()) == before
    assert not [p for p in root.iterdir() if p.name.startswith("expert-demo-")]
    resumed = prepare(manifest, shard=50)
    assert resumed.built and resumed.stats["resumed_shards"] == 1
    assert resumed.status == "resumed"
    assert resumed.reason == "1 of 9 shards reused from an interrupted build"
    assert resumed.stats["shards"] == 9  # 8 train shards of 50 + 1 eval shard
    made = resumed.stats["train"]["tokens"] + resumed.stats["eval"]["tokens"] - reused_tokens
    assert reused_tokens > 0 and made > 0
    # the speed of this build: the reused shard's tokens were not made in its seconds
    assert resumed.stats["tokens_per_second"] == pytest.approx(
        made / resumed.stats["build_seconds"], rel=0.01
    )
    assert not list(root.glob(".build-*")) and not list(root.glob(".tmp-*"))
    clean = prepare(manifest, f"pretokenized_cache={tmp_path / 'clean'}", shard=50)
    assert clean.built and clean.stats["fingerprint"] == resumed.stats["fingerprint"]
    assert rows(clean) == rows(resumed)
    assert (
        clean.eval.data.column("input_ids").to_pylist()
        == resumed.eval.data.column("input_ids").to_pylist()
    )


@pytest.mark.slow
def test_two_processes_build_once(demo_expert_dir) -> None:
    manifest = demo_expert_dir / "manifest.json"
    procs = [spawn(manifest, shard=100, delay=0.5) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["built"] for r in results) == [False, True]
    assert results[0]["dir"] == results[1]["dir"]
    assert all(r["resumed"] == 0 for r in results)


@pytest.mark.slow
def test_pretokenize_cli(demo_expert_dir) -> None:
    first = run_here(
        "pretokenize", "--manifest", "manifest.json", "--num-proc", "2", cwd=demo_expert_dir
    )
    assert first.returncode == 0, first.stderr
    assert "expert-demo: built (no earlier cache of this expert)" in first.stdout
    assert "examples 400 read" in first.stdout and "built in" in first.stdout
    again = run_here("pretokenize", "--all", str(demo_expert_dir), cwd=demo_expert_dir)
    assert again.returncode == 0, again.stderr
    assert "expert-demo: current (no fingerprint input changed)" in again.stdout
    assert "built in" not in again.stdout  # build figures only for a build
    data = demo_expert_dir / "data" / "train.jsonl"
    data.write_text(data.read_text() + "{broken\n")
    bad = run_here("pretokenize", "-m", "manifest.json", cwd=demo_expert_dir)
    assert bad.returncode == 2
    assert f"{data}:401: invalid JSON" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_prepared_rows_follow_the_training_contract(demo_expert_dir) -> None:
    data = prepare(demo_expert_dir / "manifest.json")
    assert data.train.column_names == ["input_ids", "labels", "position_ids", "num_tokens"]
    assert data.train.features["input_ids"].feature.dtype == "int32"
    # numpy rows: the collator never builds a Python int per token (the hot path)
    assert data.train.format["type"] == data.eval.format["type"] == "numpy"
    assert data.eval is not None and len(data.eval) == data.stats["eval"]["rows"] == 27
    assert len(data.train) == data.stats["train"]["rows"] == 235
    for row in data.train:
        assert len(row["input_ids"]) == row["num_tokens"] <= 512
        assert row["position_ids"][0] == 0
    restarts = sum(p == 0 for row in data.train for p in row["position_ids"])
    assert restarts == data.stats["train"]["kept"] + data.stats["train"]["truncated"] == 400


def test_custom_prompt_template_without_text_is_a_user_error(demo_expert_dir, write_jsonl) -> None:
    from expert_cli.errors import UserError

    write_jsonl(demo_expert_dir / "data" / "ins.jsonl", [{"q": "a", "a": "b"}] * 3)
    with pytest.raises(UserError, match="custom"):
        prepare(
            demo_expert_dir / "manifest.json",
            "training.dataset.path=data/ins.jsonl",
            'training.dataset.field_mapping={"instruction": "q", "response": "a"}',
            "training.dataset.validation_path=null",
            "base_models.0.prompt_template=custom",
        )


def test_every_example_dropped_is_a_user_error(demo_expert_dir) -> None:
    from expert_cli.errors import UserError

    said = "400 read, every one dropped: 400 over max_seq_length=16 with overlong: drop"
    with pytest.raises(UserError, match=said):
        prepare(
            demo_expert_dir / "manifest.json", "max_seq_length=16", "training.dataset.overlong=drop"
        )


@pytest.mark.slow
def test_worker_processes_give_the_same_rows_as_one_process(demo_expert_dir) -> None:
    data = demo_expert_dir / "data"
    (data / "big.jsonl").write_text((data / "train.jsonl").read_text() * 3)  # 1200 examples
    manifest = demo_expert_dir / "manifest.json"
    resolved = resolve(
        load_manifest(manifest, ["training.dataset.path=data/big.jsonl"]), cpu_environment()
    )
    tokenizer = load_tokenizer(resolved)
    progress = Recorder()
    two = prepare_data(resolved, tokenizer, num_proc=2, progress=progress)
    assert two.stats["num_proc"] == 2 and two.stats["train"]["examples_read"] == 1200
    # the progress heard of every example once, from the worker processes too
    examples = sum(two.stats[s]["examples_read"] for s in ("train", "eval") if two.stats[s])
    assert progress.total == progress.done == examples
    one = prepare_data(resolved, tokenizer, num_proc=1, force=True)
    assert rows(one) == rows(two)


def test_a_failed_build_leaves_only_the_folders_lock(demo_expert_dir) -> None:
    manifest = demo_expert_dir / "manifest.json"
    root = demo_expert_dir / ".cache" / "pretokenized"
    root.mkdir(parents=True)
    (root / ".tmp-expert-demo-0123456789abcdef-123").mkdir()  # leftovers of killed builds
    (root / ".tmp-expert-demo.latest.json-123").write_text("")
    (root / ".build-0123456789abcdef").mkdir()
    (root / "0123456789abcdef.lock").write_text("")
    # not the build's: the folder may be one that holds other files (a project's)
    (root / "uv.lock").write_text("")
    (root / ".tmp-notes").mkdir()
    (root / ".build-notes").mkdir()
    (root / "expert-demo.latest.json").write_text('{"cut short')  # read as no pointer
    with pytest.raises(UserError, match="no training example is left"):
        prepare(manifest, "max_seq_length=16", "training.dataset.overlong=drop")
    assert sorted(p.name for p in root.iterdir()) == [
        ".build-notes",
        ".lock",
        ".tmp-notes",
        "expert-demo.latest.json",
        "uv.lock",
    ]


def test_a_damaged_pointer_is_written_again_where_the_cache_is_current(demo_expert_dir) -> None:
    """The log said "a new pointer is written" at every run, and none was while the cache
    was current: the next change of data was explained as "no earlier cache"."""
    manifest = demo_expert_dir / "manifest.json"
    first = prepare(manifest)
    pointer = demo_expert_dir / ".cache" / "pretokenized" / "expert-demo.latest.json"
    pointer.write_text("junk")
    again = prepare(manifest)
    assert again.status == "current"
    assert json.loads(pointer.read_text())["path"] == str(first.cache_dir)


def test_where_a_token_cache_cannot_be_built(tmp_path, monkeypatch) -> None:
    """What `check` can tell without writing: not a folder, under a file, a link to nothing,
    not writable (unless it holds a finished cache of the expert, which can still be read)."""
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    expected = "; expected a writable folder (set training.config.pretokenized_cache"
    cases = {
        tmp_path / "file": f"{tmp_path}/file is not a folder",
        tmp_path / "file" / "a" / "b": f"{tmp_path}/file/a/b is under {tmp_path}/file, which",
        Path("/dev/null"): "/dev/null is not a folder",
        Path("/proc/self"): "/proc/self is not writable",
        Path("/proc/self/cache"): "/proc/self/cache would be created in /proc/self, which is not",
        tmp_path / "link" / "cache": f"{tmp_path}/link/cache: {tmp_path}/link is a symbolic link",
    }
    for root, message in cases.items():
        problem = cache_root_problem(root, "expert-demo")
        assert problem is not None and problem.startswith(
            f"training.config.pretokenized_cache: {message}"
        ), (root, problem)
        assert expected in problem
        with pytest.raises(UserError) as err:
            open_cache_root(root)
        assert err.value.lines == [problem]
    assert cache_root_problem(tmp_path / "new" / "cache", "expert-demo") is None
    # root may write to a folder of mode 555: its answer to access() stands in for a user's
    read_only = tmp_path / "shared"
    (read_only / "expert-demo-0123456789abcdef").mkdir(parents=True)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != read_only)
    assert "shared is not writable" in cache_root_problem(read_only, "expert-demo")
    (read_only / "expert-demo-0123456789abcdef" / "_COMPLETE").write_text("")
    assert cache_root_problem(read_only, "expert-demo") is None
    assert "shared is not writable" in cache_root_problem(read_only, "other-expert")


def test_a_cache_folder_that_fails_when_written_is_a_user_error(tmp_path, monkeypatch) -> None:
    """Where access() says yes and the write says no (another process's race, a file system
    that answers differently), the write's error names the field; a lock file that cannot be
    created made the build wait for the lock forever."""
    import expert_cli.data.cache as cache

    monkeypatch.setattr(cache, "cache_root_problem", lambda root: None)
    with pytest.raises(UserError, match=r"^training.config.pretokenized_cache: /proc/self "):
        open_cache_root(Path("/proc/self"))
    open_cache_root(tmp_path / "a" / "cache")
    assert [p.name for p in (tmp_path / "a" / "cache").iterdir()] == [".lock"]


def test_empty_answers_are_not_trained_on(tmp_path, write_jsonl) -> None:
    rows = [{"instruction": f"q{i}", "response": " " if i % 2 else f"a{i}"} for i in range(8)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    data = load_instruction_expert(tmp_path)
    assert data.stats["train"]["kept"] == 4
    assert data.stats["train"]["dropped_no_completion"] == 4
    write_jsonl(tmp_path / "train.jsonl", [{**r, "response": ""} for r in rows])
    with pytest.raises(UserError, match="8 with no completion tokens"):
        load_instruction_expert(tmp_path)


def test_pretokenize_counts_examples_after_task_weights(demo_expert_dir) -> None:
    """With a task weight of 2 the kept count is twice the count read; the line says what
    was trained on, so it does not read as more kept than read."""
    path = demo_expert_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["training"]["dataset"] = {
        "type": "multi_task",
        "tasks": {"sql": {"train": "data/train.jsonl", "valid": "data/valid.jsonl", "weight": 2}},
    }
    path.write_text(json.dumps(manifest))
    out = run_here("pretokenize", "-m", str(path))
    assert out.returncode == 0, out.stderr
    assert "examples 400 read (800 to train on) / 780 kept whole / 20 truncated / 0 dropped" in (
        out.stdout
    )
    # each example's two copies are in different rows (packed side by side, one step trained
    # an example twice): the rows' examples, cut at their position restarts, are all distinct
    data = prepare(path)
    for ids, positions in zip(data.train["input_ids"], data.train["position_ids"], strict=True):
        starts = [k for k, p in enumerate(positions) if p == 0] + [len(ids)]
        examples = [tuple(ids[a:b]) for a, b in zip(starts, starts[1:], strict=False)]
        assert len(examples) == len(set(examples))


@pytest.mark.parametrize(
    ("dataset", "where"),
    [
        ({"validation_path": "data/empty.jsonl"}, "training.dataset.validation_path"),
        (
            {"validation_path": None, "eval_fraction": 0.1},
            "training.dataset.eval_fraction (the held-out examples)",
        ),
    ],
)
def test_an_evaluation_split_with_no_example_left_is_a_user_error(
    demo_expert_dir, dataset: dict, where: str
) -> None:
    """Every evaluation example dropped (empty texts) was a cache marked complete whose eval
    folder no loader reads: an IndexError on every later run. Now exit 2 naming the field,
    and no cache is written."""
    data = demo_expert_dir / "data"
    (data / "empty.jsonl").write_text('{"text": ""}\n' * 2)
    if "eval_fraction" in dataset:  # 20 rows, the 2 held out (seed 42) made empty
        rows = (data / "train.jsonl").read_text().splitlines()[:20]
        for index in np.random.default_rng(42).permutation(20)[:2]:
            rows[index] = '{"text": ""}'
        (data / "train.jsonl").write_text("\n".join(rows) + "\n")
    path = demo_expert_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["training"]["dataset"].update(dataset)
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError) as err:
        prepare(path)
    assert err.value.lines == [
        f"{where}: no evaluation example is left after formatting (2 read, every one dropped: "
        "2 with no completion tokens)"
    ]
    assert not (demo_expert_dir / ".cache").exists()  # nothing, not even the lock file


def test_an_evaluation_folder_without_rows_reads_as_a_damaged_cache(demo_expert_dir) -> None:
    """A cache an earlier version finished with an empty eval split: a RunError saying how to
    rebuild, not an IndexError from the datasets library."""
    data = prepare(demo_expert_dir / "manifest.json")
    eval_dir = data.cache_dir / "eval"
    for arrow in eval_dir.glob("*.arrow"):
        arrow.unlink()
    state = json.loads((eval_dir / "state.json").read_text())
    state["_data_files"] = []
    (eval_dir / "state.json").write_text(json.dumps(state))
    with pytest.raises(
        RunError, match=r"eval: not a readable saved dataset \(IndexError\); delete"
    ):
        prepare(demo_expert_dir / "manifest.json")


def test_where_a_source_is_named_is_no_fingerprint_input(demo_expert_dir) -> None:
    """A source's manifest field (shown in messages) is not its content: moving the same
    file from `path` to a task's `train` must not be what rebuilds a cache."""
    data = prepare(demo_expert_dir / "manifest.json")
    sources = data.stats["inputs"]["sources"]
    assert [set(s) for s in sources["train"]] == [{"kind", "location", "format", "weight", "files"}]
    assert all("field" not in s for s in sources["validation"])


def test_a_rebuild_reason_names_a_few_changes_shortly(demo_expert_dir) -> None:
    """Every changed fingerprint input on one line of several hundred characters: the reason
    names three, each value cut to 40 characters, and says how many more (stats keep all)."""
    manifest = demo_expert_dir / "manifest.json"
    prepare(manifest)
    moved = demo_expert_dir / "data" / ("a_folder_with_a_long_name_" * 3) / "train.jsonl"
    moved.parent.mkdir()
    shutil.copy(demo_expert_dir / "data" / "train.jsonl", moved)
    where = str(moved.relative_to(demo_expert_dir))
    second = prepare(
        manifest,
        "max_seq_length=256",
        "packing=false",
        "seed=7",
        f"training.dataset.path={where}",
    )
    assert len(second.changes) == 8  # the location; size and hash of each file name
    assert second.reason == (
        "changed: max_seq_length 512 -> 256; packing True -> False; seed 42 -> 7; and 5 more"
    )
    location = next(c for c in second.changes if c.startswith("sources.train[0].location"))
    assert location == f"sources.train[0].location data/train.jsonl -> {where[:40]}…"


HOLD_THEN_REMOVE = """
import os, sys, time
from filelock import FileLock
root = sys.argv[1]
os.makedirs(root)
lock = FileLock(os.path.join(root, ".lock"))
lock.acquire()
print("held", flush=True)
time.sleep(1.5)
os.unlink(os.path.join(root, ".lock"))  # a first build stopped by its data tidies up
os.rmdir(root)
lock.release()
"""


def test_a_waiting_build_survives_the_first_one_removing_its_folder(tmp_path: Path) -> None:
    """A first build that stops on its data removes the cache folder it made, lock file and
    all, while it still holds the lock. A build waiting on that lock makes the folder again
    and holds a lock on the file now there (not on the unlinked one: two builders)."""
    from expert_cli.data import _acquire
    from expert_cli.data.cache import CachePlan

    root = tmp_path / ".cache" / "pretokenized"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THEN_REMOVE, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        plan = CachePlan(root, "0" * 16, {}, root / "x", None)
        lock, made = _acquire(plan)
        try:
            assert holder.wait(timeout=30) == 0
            assert made == [root]  # made again by this process: its own to remove
            assert lock.is_locked and plan.lock_path.is_file()
            # the file at the path is the one locked: a fresh lock on it cannot be taken
            from filelock import FileLock, Timeout

            with pytest.raises(Timeout):
                FileLock(str(plan.lock_path), is_singleton=False).acquire(timeout=0.2)
        finally:
            lock.release()
    finally:
        holder.kill()


def test_a_data_file_written_while_it_is_read_leaves_no_cache(demo_expert_dir, monkeypatch) -> None:
    """A data-prep script rewriting the file while a build read it: the cache was stamped
    with the fingerprint of the file as hashed before the read, holding what the read saw (a
    cut file: 300,000 of 500,000 examples), and reused once the file was back as it was."""
    import expert_cli.data.build as build

    manifest = demo_expert_dir / "manifest.json"
    real = build.load_sources

    def read_then_cut(resolved, cache_dir):
        loaded = real(resolved, cache_dir)
        path = demo_expert_dir / "data" / "train.jsonl"
        path.write_text(path.read_text().split("\n", 1)[1])  # another program's write
        return loaded

    monkeypatch.setattr(build, "load_sources", read_then_cut)
    with pytest.raises(RunError) as caught:
        prepare(manifest)
    assert "train.jsonl: written, added or removed while the token cache read" in str(caught.value)
    cache_root = demo_expert_dir / ".cache" / "pretokenized"
    assert not [p for p in cache_root.iterdir() if p.name != ".lock"]  # nothing kept
    monkeypatch.setattr(build, "load_sources", real)
    again = prepare(manifest)  # the file as it is now, whole
    assert again.built and again.stats["train"]["examples_read"] == 399


def test_earlier_caches_are_counted_and_pruned_only_when_asked(demo_expert_dir) -> None:
    """Every change of the data or settings left a finished cache beside the new one, never
    removed: a run now counts them, and `pretokenize --prune` removes them (not another
    expert's whose name begins with this one's, nor the current one)."""
    manifest = demo_expert_dir / "manifest.json"
    root = demo_expert_dir / ".cache" / "pretokenized"
    first = prepare(manifest, "max_seq_length=256")
    assert first.earlier.caches == 0
    second = prepare(manifest, "max_seq_length=384")
    assert second.earlier.caches == 1
    size = sum(f.stat().st_size for f in first.cache_dir.rglob("*") if f.is_file())
    assert second.earlier.size == size
    other = root / f"{first.cache_dir.name.rsplit('-', 1)[0]}-x-{'0' * 16}"
    shutil.copytree(first.cache_dir, other)  # expert "<name>-x": not this expert's
    # another expert whose name makes the same folder name ("expert+demo" -> "expert_demo")
    clash = root / f"{first.cache_dir.name.rsplit('-', 1)[0]}-{'1' * 16}"
    shutil.copytree(first.cache_dir, clash)
    stats = json.loads((clash / "stats.json").read_text())
    stats["inputs"]["expert"] = "expert+demo"
    (clash / "stats.json").write_text(json.dumps(stats))
    current = prepare(manifest)
    assert (current.earlier.caches, current.pruned.caches) == (2, 0)
    assert first.cache_dir.is_dir() and second.cache_dir.is_dir()  # kept unless asked

    kept = run_here("pretokenize", "-m", str(manifest))
    assert "kept 2 earlier caches of this expert" in " ".join(kept.stdout.split())
    # caches a process reads (this one holds the first two) are left by a prune
    busy = run_here("pretokenize", "-m", str(manifest), "--prune")
    said = " ".join(busy.stdout.split())  # not "--prune removes them", as it was just asked
    assert "kept 2 earlier caches of this expert (" in said
    assert (
        "): read by another process now (a train, generate or merge), or not removable here; "
        "--prune removes them once free"
    ) in said
    assert first.cache_dir.is_dir() and second.cache_dir.is_dir()
    for data in (first, second):
        data.hold.close()
    out = run_here("pretokenize", "-m", str(manifest), "--prune")
    said = " ".join(out.stdout.split())
    assert out.returncode == 0, said
    assert f"pruned 2 earlier caches of this expert ({human_size(current.earlier.size)})" in said
    assert "--prune removes them" not in said
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [".lock", current.cache_dir.name, other.name, clash.name, "expert-demo.latest.json"]
    )
    again = prepare(manifest)
    assert again.status == "current" and rows(again) == rows(current)
    assert (again.earlier.caches, again.pruned.caches) == (0, 0)


def test_prepared_data_kept_to_the_interpreters_exit_prints_nothing(demo_expert_dir) -> None:
    """docs/data.md's snippet keeps its PreparedData (and the shared lock on its cache) to the
    end of the script: the lock's `__del__` ran after `os` was torn down and printed an
    AttributeError under the snippet's output. A finalizer closes it at exit instead."""
    script = (
        "from expert_cli.config import load_manifest\n"
        "from expert_cli.data import prepare_data\n"
        "from expert_cli.data.tokenizer import load_tokenizer\n"
        "from expert_cli.config.environment import cpu_environment\n"
        "from expert_cli.config.resolve import resolve\n"
        f"resolved = resolve(load_manifest({str(demo_expert_dir / 'manifest.json')!r}), "
        "cpu_environment())\n"
        "data = prepare_data(resolved, load_tokenizer(resolved))\n"
        "print(data.status, len(data.train))\n"
    )
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "built" and int(done.stdout.split()[1]) > 0
    assert "Exception ignored" not in done.stderr and "Error" not in done.stderr, done.stderr


def test_a_prune_in_a_cache_folder_that_cannot_be_written_is_a_user_error(
    demo_expert_dir, monkeypatch
) -> None:
    """`pretokenize --prune` on a cache that may be read but not written (a read-only disk)
    ended in filelock's traceback; it is refused as `--force` is, naming the field."""
    data = prepare(demo_expert_dir / "manifest.json")
    root = data.cache_dir.parent
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != root)
    with pytest.raises(UserError) as err:
        prune_earlier_caches(data)
    assert err.value.lines[0].startswith("training.config.pretokenized_cache: ")
    assert "is not writable" in err.value.lines[0]
    assert data.cache_dir.is_dir()


def test_the_drop_reasons_printed_name_max_seq_length(demo_expert_dir) -> None:
    """`pretokenize` and `train` said `N with the answer past max_seq_length`, without the
    length the docs show (`=2048`): only the error of every example dropped passed it."""
    from rich.console import Console

    from expert_cli.cli.data import summary_lines
    from expert_cli.cli.train_view import print_data

    data = prepare(demo_expert_dir / "manifest.json", "max_seq_length=256")
    assert data.stats["max_seq_length"] == 256
    train = data.stats["train"]
    cut, truncated = train["dropped_answer_cut"], train["truncated"]
    assert cut > 0 and truncated > 0
    said = f"{cut:,} with the answer past max_seq_length=256"
    # and the examples cut to the length, said only as a count among the numbers before
    shortened = f"{truncated:,} of {train['examples']:,} examples were longer than "
    assert f"  dropped: {said}" in summary_lines(data)
    assert any(line.startswith(f"  cut: {shortened}") for line in summary_lines(data))
    console = Console(record=True, width=400)
    print_data(console, data.stats, data.status, data.reason, data.cache_dir)
    text = console.export_text()
    assert f"dropped   {said}" in text and f"cut       {shortened}" in text, text
