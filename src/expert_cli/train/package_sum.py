"""The `.sha256` file beside a package (as `package` writes it, and `sha256sum` reads it):
whether the checksum a line gives for the package is the package's."""

from __future__ import annotations

import os
from pathlib import Path

READ_BYTES = 64 << 10  # a line names the package; a huge file is not read whole


CHECKSUM_SUFFIX = ".sha256"  # the checksum file: the package's name and this


def checksum_verdict(package: Path, sha256: str) -> tuple[Path | None, list[str], list[str]]:
    """(the checksum file when it was read, problems, notes) for `package` of `sha256`. Every
    line that names the package (or names no file) must give its checksum: a second, wrong
    line for the same file was accepted. A file of lines naming other files alone is a note,
    its first line's checksum still compared."""
    sidecar = package.with_name(package.name + CHECKSUM_SUFFIX)
    name, why = sidecar.name, "no such file" if not os.path.lexists(sidecar) else "not a file"
    try:
        if not sidecar.is_file():
            raise OSError
        with sidecar.open("rb") as sums:
            head = sums.read(READ_BYTES + 1)
    except OSError:
        why = "cannot be read" if sidecar.is_file() else why
        return None, [], [f"{name} beside the package: {why}; its checksum is not checked"]
    text = head[:READ_BYTES].decode("utf-8", errors="replace").splitlines()
    if len(head) > READ_BYTES and len(text) > 1:
        text = text[:-1]  # the line the read cut short
    lines = [line.split() for line in text if not line.lstrip().startswith("#")]
    lines = [words for words in lines if words]
    # `sha256sum -b` writes `*name`; a path before the name is the folder it was made in
    ours = [w for w in lines if len(w) == 1 or os.path.basename(w[1].lstrip("*")) == package.name]
    given = ours or lines[:1]
    if not given or any(words[0].lower() != sha256 for words in given):
        return sidecar, [f"{name}: the checksum does not match the package"], []
    notes = [] if ours else [f"{name} names another file, not {package.name}"]
    return sidecar, [], notes
