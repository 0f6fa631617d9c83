"""A package's archive as a stream: the unzipped bytes tarfile reads, what stopped them being
read (no gzip, a cut, damage, the disk), and what follows the archive's end."""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path

from expert_cli.paths import shown_path

TAIL_BYTES = 64 << 20  # zeros after the archive's end beyond this are not padding (GNU
# tar pads to its record size: 10 KiB by default, 2 MiB with -b 4096)
CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
CUT_SHORT = (
    "cut short (truncated): the archive stops part-way, as an interrupted download or copy, "
    "or a full disk, leaves it; copy it again"
)
NO_TAR = (
    "not a gzip-compressed tar archive (a gzip file that holds no tar: another kind of file, "
    "or a damaged copy)"
)
HEADER_BYTES = 512  # one tar header block
NAME_BYTES = 100
# a header's number fields (mode, uid, gid, size, mtime, checksum): octal digits, space or
# NUL; a first byte of 0x80 or 0xff marks GNU's base-256 form
NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156))
OCTAL = frozenset(b"01234567 \x00")
MAGIC = (257, 263)


class Blocks:
    """The unzipped archive as tarfile reads it, keeping the last piece it read: a first
    header cut short, or, once the listing has ended, the block that ended it (zeros, or
    bytes after the archive's end)."""

    def __init__(self, stream: gzip.GzipFile) -> None:
        self.stream, self.last = stream, b""

    def read(self, size: int = -1) -> bytes:
        self.last = self.stream.read(size)
        return self.last

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.stream.seek(offset, whence)

    def tell(self) -> int:
        return self.stream.tell()


def unreadable(path: Path, exc: BaseException, blocks: Blocks, opened: bool) -> str:
    """What stopped the archive being read, said of the file: no gzip at all, a gzip stream or
    the tar in it that stops part-way (`opened`: tar had read a first header; else the piece
    it read begins a header), or damage."""
    with path.open("rb") as f:
        head = f.read(len(GZIP_MAGIC))
    begun = not opened and _header_begun(blocks.last)
    if head != GZIP_MAGIC:
        what = f"{'an empty file, ' if not head else ''}not a gzip-compressed tar archive"
    elif isinstance(exc, EOFError) or (
        isinstance(exc, tarfile.TarError) and (opened or begun) and _ended(blocks)
    ):
        what = CUT_SHORT
    elif isinstance(exc, tarfile.TarError):
        what = "damaged: a header of its tar cannot be read; copy it again" if opened else NO_TAR
    elif isinstance(exc, gzip.BadGzipFile | zlib.error):
        what = "damaged: its compressed data does not unpack; copy it again"
    else:  # the disk's error, not the file's
        what = f"cannot be read ({getattr(exc, 'strerror', None) or type(exc).__name__})"
    return f"{shown_path(path)}: {what}"


def _header_begun(piece: bytes) -> bool:
    """Whether `piece`, shorter than a header, reads as the start of one: a name ended by NUL
    and padded with NUL, then number fields and the ustar magic as far as it goes."""
    name = piece[:NAME_BYTES]
    ends = name.find(b"\x00")
    if not 0 < len(piece) < HEADER_BYTES or ends <= 0 or name[ends:].strip(b"\x00"):
        return False
    for start, stop in NUMBERS:
        field = piece[start:stop]
        if field and field[0] not in (0x80, 0xFF) and not OCTAL.issuperset(field):
            return False
    magic = piece[MAGIC[0] : MAGIC[1]]
    return b"ustar\x00".startswith(magic) or b"ustar ".startswith(magic)


def _ended(blocks: Blocks) -> bool:
    """Whether the unzipped stream has nothing left (what tar read stopped part-way)."""
    try:
        return blocks.read(1) == b""
    except EOFError:  # the gzip stream stops part-way too
        return True
    except (OSError, zlib.error):
        return False


def end_problem(blocks: Blocks, path: Path) -> str | None:
    """From the block that ended the listing on: only zeros (a tar's end and padding), and
    not past TAIL_BYTES. Bytes there are not files, tar lists none, and no package has them."""
    read, data = len(blocks.last), len(blocks.last) - blocks.last.count(0)
    try:
        while read <= TAIL_BYTES and (block := blocks.read(CHUNK)):
            read, data = read + len(block), data + len(block) - block.count(0)
    except EOFError:  # the gzip stream stops before its end marker (its last 8 bytes)
        return f"{shown_path(path)}: {CUT_SHORT}"
    except (OSError, zlib.error):  # bytes after the gzip stream that are no gzip
        data = -1
    if not data and read <= TAIL_BYTES:
        return None
    what = (
        "bytes that are no gzip stream"
        if data < 0
        else f"{data:,} bytes that are not zeros"
        if data
        else f"over {TAIL_BYTES >> 20} MiB of zeros"
    )
    return (
        f"{what} after the end of the archive (two files joined, or a damaged copy): "
        "no package holds them"
    )
