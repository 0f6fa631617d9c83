"""Writing so that readers never see half of it: everything is built under a temporary name
beside its destination, then renamed into place in one step. A leaf module: the data path,
training outputs, telemetry and the benchmark all write through it.

The temporary name starts `.tmp-` and ends in the writer's pid, so leftovers of a killed
writer are easy to find. The signal handling such writes need lives here too: signals held
during renames, and SIGTERM / SIGHUP raised as Ctrl-C is, so a command's way out runs.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expert_cli.errors import Terminated, escaped

NAME_MAX = 255  # bytes in one file name on Linux and macOS file systems
HANGUP = (signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ()  # not on Windows


def temporary_path(dest: Path) -> Path:
    """Where `dest` is built before it is renamed into place: `.tmp-<name>-<pid>`, or, where
    that would pass the file system's limit on a name (a legal name of 250 bytes),
    `.tmp-<hash of the name>-<pid>`."""
    return dest.with_name(f"{temporary_prefix(dest)}{os.getpid()}")


def temporary_prefix(dest: Path) -> str:
    """The name of `dest`'s temporary file before the writer's pid (`temporary_path`)."""
    name = f".tmp-{dest.name}-"
    if len(os.fsencode(name)) + 10 > NAME_MAX:  # room for a pid
        name = f".tmp-{hashlib.sha256(os.fsencode(dest.name)).hexdigest()[:16]}-"
    return name


@contextmanager
def atomic_file(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; it becomes `dest` when the block ends, and is
    removed if the block fails."""
    tmp = temporary_path(dest)
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        with suppress(OSError):  # a read-only disk answers EROFS, not "no such file"
            tmp.unlink(missing_ok=True)


@dataclass
class Staged:
    """The temporary paths of `atomic_files`, and whether they have all been put in place."""

    paths: list[Path] = field(default_factory=list)
    in_place: bool = False


@contextmanager
def atomic_files(dests: list[Path], first_new: bool = False) -> Iterator[Staged]:
    """Temporary paths beside each of `dests` (`Staged.paths`); when the block ends they are
    renamed into place with SIGINT, SIGTERM and SIGHUP held until the last one is, so an interrupt
    never leaves one without the others (a package beside a checksum of another). A signal
    that came meanwhile is raised after, with `in_place` set. All removed if the block fails.
    With `first_new`, the first of `dests` is never put over a file there by then (another
    command's, finished meanwhile): FileExistsError, and nothing placed."""
    staged = Staged([temporary_path(dest) for dest in dests])
    try:
        yield staged
        with signals_held():
            for index, (tmp, dest) in enumerate(zip(staged.paths, dests, strict=True)):
                if first_new and index == 0:
                    place_new(tmp, dest)
                else:
                    os.replace(tmp, dest)
            staged.in_place = True
    finally:
        for tmp in staged.paths:
            with suppress(OSError):
                tmp.unlink(missing_ok=True)


# a file system without hard links (or one that refuses them here)
NO_LINK = (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EACCES)


def place_new(tmp: Path, dest: Path) -> None:
    """`tmp` put in place as `dest`, never over a file that is there by now (a second command
    of the same output finished first: FileExistsError): a hard link fails where one is; on a
    file system without links, looked at, then renamed. `tmp` is left for the caller."""
    try:
        os.link(tmp, dest)
    except OSError as exc:
        if exc.errno not in NO_LINK:
            raise
        if os.path.lexists(dest):
            raise FileExistsError(errno.EEXIST, "exists", str(dest)) from None
        os.replace(tmp, dest)


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until the block ends (renames that must not stop half way);
    one that came meanwhile is raised then, to the handlers from before. Python's handlers,
    not a signal mask: the kernel gives a process's signal to any of its threads (torch's,
    the tokenizers library's) that does not block it, and Python runs the handler in the
    main thread all the same. Outside the main thread, a plain block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {}
    for signum in heard((signal.SIGINT, signal.SIGTERM, *HANGUP)):
        previous[signum] = signal.signal(signum, lambda got, frame: came.append(got))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)


@contextmanager
def atomic_folder(dest: Path, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside `dest`; when the block ends it takes the place
    of `dest`, and it is removed if the block fails. An existing `dest` is removed first only
    when `replace` (the caller decided it may be); otherwise only an empty folder is taken
    over, and a `dest` that holds files by then (made while the block ran) is left as it is:
    OSError (ENOTEMPTY, EEXIST or ENOTDIR), the temporary folder removed."""
    tmp = temporary_path(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if replace and dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def parents_made(path: Path, error: type[Exception] | None = None) -> Iterator[None]:
    """Make the folders above `path` that are missing; if the block fails, remove those of
    them still empty (a failed export leaves no empty folders it made), deepest first. With
    `error` (a class taking one line), a folder that cannot be made raises it, naming
    --output, in place of the OSError."""
    made: list[Path] = []  # those this call made, one level at a time: not another's
    try:
        try:
            for folder in reversed(path.absolute().parents):
                if not os.path.lexists(folder):
                    with suppress(FileExistsError):  # made by another meanwhile: its own
                        os.mkdir(folder)
                        made.insert(0, folder)
        except OSError as exc:
            if error is None:
                raise
            raise error(
                f"--output {escaped(str(path))}: cannot be written ({exc.strerror})"
            ) from None
        yield
    except BaseException:
        for folder in made:  # nearest first: a parent is empty only once its child is gone
            with suppress(OSError):  # one that holds something now stays
                folder.rmdir()
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as indented JSON to `path`, all or nothing; a float that is not finite
    (a diverged loss) is written as null, as JSON has no NaN or infinity."""
    with atomic_file(path) as tmp:
        text = json.dumps(json_numbers(data), indent=2, default=str, allow_nan=False)
        tmp.write_text(text + "\n", encoding="utf-8")


def json_numbers(data: Any) -> Any:
    """`data` with every float that is not finite replaced by None, in dicts, lists, tuples."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: json_numbers(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_numbers(value) for value in data]
    return data


def heard(signals: tuple[int, ...]) -> list[int]:
    """The `signals` this process takes: not one it was started ignoring (SIGHUP under
    `nohup`: the run is meant to outlive its terminal), nor one whose handler was set
    outside Python (it could not be put back)."""
    return [s for s in signals if signal.getsignal(s) not in (signal.SIG_IGN, None)]


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise Terminated in the main thread, as SIGINT raises
    KeyboardInterrupt, so that what a command does on its way out runs (its default ends the
    process where it stands). Elsewhere than the main thread, nothing changes."""

    def stop(signum: int, frame: Any) -> None:
        raise Terminated(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, stop) for sig in heard((signal.SIGTERM, *HANGUP))}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def usual_mode(folder: Path) -> None:
    """Give the safetensors files in `folder` the mode a new file gets (0666 less the umask):
    safetensors writes a temporary file of mode 0600 and renames it, so a run's other files
    could be read by the people it is shared with, and its weights not."""
    mode = 0o666 & ~_umask()
    for path in folder.glob("*.safetensors") if folder.is_dir() else []:
        with suppress(OSError):  # a file system without modes (a mounted share) keeps its own
            if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != mode:
                path.chmod(mode)


def _umask() -> int:
    """The process's umask, read without setting it (Linux's /proc; elsewhere set and put
    back)."""
    with suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
