"""Where `package` writes: an --output it cannot write refused before anything is built, and
what a package stopped by a kill left beside it (its temporary files) removed."""

from __future__ import annotations

import glob
import os
import time
from contextlib import suppress
from pathlib import Path

from expert_cli.atomic import temporary_prefix
from expert_cli.errors import UserError
from expert_cli.paths import NAME_MAX_BYTES, new_file_problem, shown_path
from expert_cli.train.outputs import PID, process_running
from expert_cli.train.package_sum import CHECKSUM_SUFFIX

STALE_SECONDS = 600  # a temporary file unwritten this long: its writer is gone (a pid of
# this machine that no longer runs may be one of another machine writing to a shared folder)


def refuse_output(
    path: Path, checksum: Path, default: str, force: bool, given: bool = True
) -> None:
    """UserError naming --output where the package and its .sha256 cannot be written."""
    if path.is_dir():
        raise UserError(
            f"--output {shown_path(path)}: is a folder; give the package's file name, "
            f"e.g. {shown_path(path / default)}"
        )
    if path.suffix != ".expert":
        raise UserError(f"--output {shown_path(path)}: a package's name ends in .expert")
    if any(ord(c) < 32 or ord(c) == 127 for c in path.name):  # `sha256sum -c` misread it
        raise UserError(
            f"--output {shown_path(path)}: a name holding a control character (a newline, a "
            "tab) cannot be given in its checksum file; choose another name"
        )
    if len(os.fsencode(checksum.name)) > NAME_MAX_BYTES:  # found after the build, it was exit 1
        most = NAME_MAX_BYTES - len(CHECKSUM_SUFFIX)
        why = f"(its checksum file adds {CHECKSUM_SUFFIX}; a file name is at most {NAME_MAX_BYTES})"
        if not given:
            raise UserError(
                f"the package's name, from the manifest's name, version and base model, is over "
                f"{most} bytes {why}; give a shorter one with --output"
            )
        raise UserError(f"--output {shown_path(path)}: a name of at most {most} bytes {why}")
    for target in (path, checksum):
        if problem := new_file_problem(target, "--output", force):
            raise UserError(problem)


def stale(path: Path) -> list[str]:
    """Remove the temporary files of the package `path` and its checksum that a process no
    longer running left (a package killed as it was written: hundreds of MB each); their
    names."""
    removed = []
    for dest in (path, path.with_name(path.name + CHECKSUM_SUFFIX)):
        prefix = temporary_prefix(dest)
        for leftover in dest.parent.glob(f"{glob.escape(prefix)}*"):
            pid = leftover.name.removeprefix(prefix)
            if not PID.fullmatch(pid) or process_running(int(pid)):
                continue
            with suppress(OSError):  # a writer on another machine of a shared folder writes on
                if leftover.is_file() and time.time() - leftover.stat().st_mtime > STALE_SECONDS:
                    leftover.unlink()
                    removed.append(leftover.name)
    return removed
