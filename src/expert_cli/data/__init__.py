"""The data path: sources -> completion-only tokens -> packed rows -> a fingerprinted cache.

`prepare_data` is the one entry point training uses: it returns the memory-mapped train and eval
datasets of the cache for a resolved config, building the cache first when no finished cache
has the same fingerprint. Several processes (torchrun ranks) may call it at once: one builds
under a file lock, the others wait and load. The eval split is packed like the train split.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from filelock import FileLock, Timeout
from transformers import PreTrainedTokenizerFast

from expert_cli.atomic import write_json_atomic
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.build import BuildProgress, build_cache, default_num_proc
from expert_cli.data.cache import (
    LOCK_NAME,
    CachePlan,
    is_complete,
    load_cache,
    open_cache_root,
    plan_cache,
    shard_examples_default,
)
from expert_cli.data.changes import changed_inputs
from expert_cli.data.earlier import (
    FINGERPRINT_CHARS,
    Earlier,
    Hold,
    count_earlier,
    hold_shared,
    prune_earlier,
)
from expert_cli.errors import RunError, UserError

__all__ = ["TEST_CACHES", "BuildProgress", "PreparedData", "prepare_data", "prune_earlier_caches"]
log = logging.getLogger(__name__)
# what killed builds leave: `.tmp-<cache or pointer>-<pid>` (atomic.py), `.build-<fp>`, and
# the `<fp>.lock` files of earlier versions
SHOWN_CHANGES = 3  # changed inputs named in the reason (stats.json keeps them all)
TEST_CACHES = "evaluate"  # the folder of the test splits' caches in the cache root (evaluate)
STALE = re.compile(
    r"\.tmp-.+-[0-9a-f]{16}-\d+|\.tmp-.+\.latest\.json-\d+|\.build-[0-9a-f]+|[0-9a-f]+\.lock"
)


@dataclass
class PreparedData:
    """The cache's datasets (rows: input_ids, labels, position_ids, num_tokens) and stats."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    stats: dict[str, Any]
    cache_dir: Path
    built: bool
    reason: str
    status: str = "current"  # "built" | "rebuilt" | "resumed" | "current"
    changes: list[str] = field(default_factory=list)
    earlier: Earlier = Earlier()  # the expert's other finished caches beside this one
    pruned: Earlier = Earlier()  # those `prune` removed
    pruning: bool = False  # whether `prune` ran: the earlier caches left are in use
    hold: Hold | None = None  # the shared lock on the cache folder while it is read

    def largest_id(self) -> int | None:
        """The largest token id in the cache (train and eval), None for no tokens: one pass
        over the memory-mapped ids."""
        return self._largest("input_ids")

    def longest_example(self) -> int:
        """The longest example's tokens (train and eval; positions restart at 0 with each
        packed example): one pass over the memory-mapped position ids."""
        largest = self._largest("position_ids")
        return 0 if largest is None else largest + 1

    def _largest(self, column: str) -> int | None:
        """The largest value of a list column over train and eval, None for no values."""
        found = [
            pc.max(pc.list_flatten(ds.data.column(column))).as_py()
            for ds in (self.train, self.eval)
            if ds is not None
        ]
        return max((i for i in found if i is not None), default=None)

    def ids_present(self, ids: list[int]) -> set[int]:
        """Which of `ids` the cache holds (train and eval): one pass over the memory-mapped
        ids."""
        found: set[int] = set()
        for ds in (self.train, self.eval):
            if ds is None or not ids:
                continue
            flat = pc.list_flatten(ds.data.column("input_ids"))
            kept = pc.filter(flat, pc.is_in(flat, value_set=pa.array(ids, flat.type)))
            found |= set(pc.unique(kept).to_pylist())
        return found


def prepare_data(
    resolved: ResolvedConfig,
    tokenizer: PreTrainedTokenizerFast,
    *,
    num_proc: int | None = None,
    force: bool = False,
    progress: BuildProgress | None = None,
    shard_examples: int | None = None,
) -> PreparedData:
    """Load the token cache of `resolved`, building it first if needed (or if `force`).

    `num_proc`: tokenizer worker processes; None picks `build.default_num_proc()`.
    `shard_examples`: examples per resumable build shard (default $EXPERT_CLI_SHARD_EXAMPLES
    or 50,000); it is a fingerprint input, since packing is per shard.
    `progress` hears about a build as it goes (nothing is reported without one).
    """
    plan = plan_cache(resolved, tokenizer, shard_examples or shard_examples_default())
    data = _prepare(plan, resolved, tokenizer, (num_proc, shard_examples), force, progress)
    data.earlier = count_earlier(plan.final_dir, resolved.expert)
    return data


def prune_earlier_caches(data: PreparedData) -> None:
    """Remove the expert's other finished caches beside `data`'s, and its test splits' caches
    (TEST_CACHES: `evaluate` builds them again, small), each folder's lock held (no build is
    writing one); `data.pruned` says what went."""
    expert = data.stats["inputs"]["expert"]
    open_cache_root(data.cache_dir.parent)  # a folder that takes no lock: named, not a traceback
    with FileLock(str(data.cache_dir.parent / LOCK_NAME)):
        data.pruned = prune_earlier(data.cache_dir, expert)
    tests = data.cache_dir.parent / TEST_CACHES
    if tests.is_dir():
        with FileLock(str(tests / LOCK_NAME)):  # none of them is current: all but those read
            gone = prune_earlier(tests / data.cache_dir.name, expert)
            if gone.caches:  # the test builds' pointer (it names a cache gone now)
                stem = data.cache_dir.name[: -FINGERPRINT_CHARS - 1]
                (tests / f"{stem}.latest.json").unlink(missing_ok=True)
        data.pruned = Earlier(data.pruned.caches + gone.caches, data.pruned.size + gone.size)
    data.earlier, data.pruning = count_earlier(data.cache_dir, expert), True


def _prepare(
    plan: CachePlan,
    resolved: ResolvedConfig,
    tokenizer: PreTrainedTokenizerFast,
    sizes: tuple[int | None, int | None],
    force: bool,
    progress: BuildProgress | None,
) -> PreparedData:
    num_proc, shard_examples = sizes
    status, reason, changes = _why(plan, force)
    if not force and is_complete(plan.final_dir):
        try:
            return _load(plan, False, "current", reason, [])
        except (RunError, OSError):
            if is_complete(plan.final_dir):  # damaged, not pruned away meanwhile
                raise
    lock, made = _acquire(plan)
    try:
        if not force and is_complete(plan.final_dir):
            return _load(
                plan,
                False,
                "current",
                "built by another process while this one waited for the lock",
                [],
            )
        _sweep(plan)
        if force:
            _discard(plan)
        try:
            build_cache(
                plan,
                resolved,
                tokenizer,
                num_proc or default_num_proc(),
                shard_examples or shard_examples_default(),
                progress,
            )
        except UserError:  # the data must change to build: its finished shards are no use
            shutil.rmtree(plan.work_dir, ignore_errors=True)
            _remove_made(plan, made)
            raise
        except OSError as exc:
            if exc.errno == errno.ENOSPC or "No space left" in str(exc):
                raise RunError(
                    f"no space left on {plan.root} (the token cache is written there); "
                    "finished shards are kept: free space and run again"
                ) from exc
            raise
        _point_latest(plan)
        return _load(plan, True, status, reason, changes)  # held: no prune between
    finally:
        lock.release()


def _acquire(plan: CachePlan, tries: int = 5) -> tuple[FileLock, list[Path]]:
    """The cache folder's lock, held, its folder made first; and the folders this call made.
    A first build that stopped on its data removes the folder it made, lock file and all,
    while a process waits on it: that one makes the folder again (then the folders it made
    are its own to remove) and waits anew (filelock starts over on an unlinked lock)."""
    for _ in range(tries):
        made = _absent_folders(plan.root)
        open_cache_root(plan.root)
        lock = FileLock(str(plan.lock_path))
        try:
            try:
                lock.acquire(timeout=0)
            except Timeout:
                log.warning("another process is building %s; waiting for it", plan.final_dir.name)
                lock.acquire()
        except FileNotFoundError:  # the folder went while this process waited
            continue
        return lock, made
    raise RunError(f"{plan.root}: the cache folder keeps disappearing; is something removing it?")


def _absent_folders(root: Path) -> list[Path]:
    """`root` and the folders above it that do not exist yet, deepest first."""
    missing = []
    while not root.exists() and root != root.parent:
        missing.append(root)
        root = root.parent
    return missing


def _remove_made(plan: CachePlan, made: list[Path]) -> None:
    """After a build stopped on the user's data, the folders this call made (`made`, deepest
    first) when they hold nothing but the lock file: a first `train` of a manifest whose data
    is empty left `.cache/pretokenized/.lock` beside it. The lock file goes while it is held,
    so a process waiting on it starts over (it sees the inode it waited on unlinked)."""
    if not made:
        return
    try:
        if [p.name for p in plan.root.iterdir()] != [LOCK_NAME]:
            return
        plan.lock_path.unlink()
        for folder in made:
            folder.rmdir()  # a folder something else wrote into meanwhile stays (ENOTEMPTY)
    except OSError:
        return


def load_recorded(record: Any) -> PreparedData | None:
    """The finished cache a run recorded (`runtime.data` of its manifest.resolved.json: the
    folder and its stats), read without the data files (which may have changed or gone since);
    None when the record says no folder, or the cache there is gone, unfinished or another."""
    try:
        cache_dir, fingerprint = Path(record["cache_dir"]), record["stats"]["fingerprint"]
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(fingerprint, str) or not is_complete(cache_dir):
        return None
    plan = CachePlan(cache_dir.parent, fingerprint, {}, cache_dir, None)
    try:
        train, evaluation, stats = load_cache(plan)
    except RunError:
        return None
    return PreparedData(train, evaluation, stats, cache_dir, False, "the run's own cache")


def _why(plan: CachePlan, force: bool) -> tuple[str, str, list[str]]:
    """(status, reason, changed inputs) of this cache relative to the expert's latest one."""
    previous = plan.previous
    if force:
        return "rebuilt", "--force", []
    if is_complete(plan.final_dir):
        return "current", "no fingerprint input changed", []
    if previous is None:
        return "built", "no earlier cache of this expert", []
    if previous.get("fingerprint") == plan.fingerprint:
        return "built", "no finished cache with this fingerprint (removed or never finished)", []
    changes = changed_inputs(previous.get("inputs", {}), plan.inputs)
    shown = changes[:SHOWN_CHANGES] or ["(inputs differ)"]
    more = f"; and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
    return "rebuilt", "changed: " + "; ".join(shown) + more, changes


def _sweep(plan: CachePlan) -> None:
    """Leftovers of builds killed earlier (the caller holds the folder's lock, so no build is
    running): temporary folders, other fingerprints' unfinished builds, old lock files. This
    fingerprint's own unfinished build stays: the build resumes from its shards. Only names
    this module writes are removed: the cache folder may be one that holds other files."""
    for path in plan.root.iterdir():
        stale = STALE.fullmatch(path.name) is not None
        stale &= path not in (plan.work_dir, plan.lock_path)
        if stale and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif stale:
            path.unlink(missing_ok=True)


def _discard(plan: CachePlan) -> None:
    """--force: the finished shards of an earlier build go, so every shard is built again;
    the finished cache stays until the new one replaces it whole (an interrupted --force
    leaves it as it was)."""
    shutil.rmtree(plan.work_dir, ignore_errors=True)


def _point_latest(plan: CachePlan) -> None:
    write_json_atomic(
        plan.pointer,
        {"fingerprint": plan.fingerprint, "path": str(plan.final_dir), "inputs": plan.inputs},
    )


def _load(
    plan: CachePlan, built: bool, status: str, reason: str, changes: list[str]
) -> PreparedData:
    hold = hold_shared(plan.final_dir)  # before reading: a prune leaves a cache in use
    try:
        train, evaluation, stats = load_cache(plan)
    except BaseException:
        if hold is not None:
            hold.close()
        raise
    pointed = (plan.previous or {}).get("fingerprint")
    if not built and status == "current" and pointed != plan.fingerprint:
        # switched back to an older, still finished cache, or a pointer not readable
        with contextlib.suppress(OSError):  # it only explains a later rebuild
            _point_latest(plan)
    if built and stats.get("resumed_shards"):
        status = "resumed"
        reason = (
            f"{stats['resumed_shards']} of {stats['shards']} shards reused from an interrupted "
            "build"
        )
    return PreparedData(
        train=train,
        eval=evaluation,
        stats=stats,
        cache_dir=plan.final_dir,
        built=built,
        reason=reason,
        status=status,
        changes=changes,
        hold=hold,
    )
