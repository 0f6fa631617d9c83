"""`check --package`: a HiveLLM `.expert` package read without extracting it (member names,
the manifest, the adapter files where it says, hashes, the `.sha256` beside it). `package`
reads each package it writes back through this before reporting it written."""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from expert_cli.config.base import FILE_NAME_PART_RULE, MAX_VALUE_ERRORS
from expert_cli.config.error_lines import loc_text
from expert_cli.config.loading import MAX_MANIFEST_BYTES, parse_json_text
from expert_cli.jsontext import NotJson, json_int, no_constant, serde_int
from expert_cli.train.adapter_entry import (
    base_note,
    config_notes,
    entry_problems,
    misapplied,
    unapplied,
)
from expert_cli.train.adapter_fit import Shapes, pairs_problem
from expert_cli.train.hive_loader import loader_problems
from expert_cli.train.hive_schema import read_field
from expert_cli.train.outputs import ADAPTER_FILES, adapter_config_problem
from expert_cli.train.package_members import (
    member_problem,
    named_file_problems,
    unexpected_members,
)
from expert_cli.train.package_stream import CHUNK, Blocks, end_problem, unreadable
from expert_cli.train.package_sum import checksum_verdict
from expert_cli.train.tokenizer_files import (
    TOKENIZER_CHECK_BYTES,
    TOKENIZER_FILES,
    missing_tokenizer_file,
    tokenizer_problem,
)
from expert_cli.weights import (
    HEAD_BYTES,
    header_problem,
    header_shapes,
    non_finite_line,
    non_finite_tensors,
    not_float_line,
    sha256_of,
)

MAX_FILE_BYTES = 20 << 30
MAX_UNPACKED_BYTES = 2 * MAX_FILE_BYTES  # in all: no package holds more than one big file
MAX_MEMBERS = 10_000
# an archive that unpacks to over 1 GiB at over 20 times its size: trained weights compress by
# a few percent, so it holds other bytes
BIG_UNPACKED, SQUEEZED = 1 << 30, 20
FINITE_CHECK_BYTES = 4 << 30  # safetensors members up to this size are checked for NaN


@dataclass
class PackageReport:
    """What a package holds and whether it is sound (`problems` empty)."""

    path: Path
    files: dict[str, int] = field(default_factory=dict)  # member -> size
    manifest: dict[str, Any] = field(default_factory=dict)  # as the loader reads it, else {}
    read: dict[str, Any] | None = None  # manifest.json's object as read, whatever it holds
    sha256: str = ""
    checksum_file: Path | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "checksum_file": str(self.checksum_file) if self.checksum_file else None,
            "files": self.files,
            "name": self.manifest.get("name"),
            "version": self.manifest.get("version"),
            "schema_version": self.manifest.get("schema_version"),
            "problems": self.problems,
            "notes": self.notes,
        }


def adapters_of(manifest: dict[str, Any]) -> tuple[list[Any], str]:
    """The adapter list the run trained (and its JSON path), in a manifest dict."""
    if manifest.get("schema_version") == "2.0":
        return manifest["base_models"][0].setdefault("adapters", []), "base_models[0].adapters"
    return manifest.setdefault("adapters", []), "adapters"


def verify_package(
    path: Path, expected: dict[str, bytes | Path] | None = None, sidecar: bool = True
) -> PackageReport:
    """Read a package without extracting it: safe member names, a manifest that validates,
    the adapter files where the manifest says, hashes that match (and, with `expected`, every
    member equal to what was meant to be written)."""
    report = PackageReport(path=path)
    if not path.is_file():
        report.problems.append(f"{path}: not a file")
        return report
    report.sha256 = sha256_of(path)
    hashes: dict[str, str] = {}
    heads: dict[str, bytes] = {}  # adapter configurations, and the weights' headers
    with gzip.GzipFile(path, mode="rb") as unzipped:
        blocks, opened = Blocks(unzipped), False
        try:
            with tarfile.open(fileobj=blocks, mode="r:") as tar:
                opened = True  # tar has read the first member's header
                _read_members(tar, blocks, report, hashes, heads)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            # said while the stream is open: whether it has ended tells a cut from damage
            report.problems.append(unreadable(path, exc, blocks, opened))
            return report
    _check_contents(report, hashes, heads)
    if sidecar:
        report.checksum_file, problems, notes = checksum_verdict(report.path, report.sha256)
        report.problems += problems
        report.notes += notes
    if expected is not None:
        for name, item in expected.items():
            want = hashlib.sha256(item).hexdigest() if isinstance(item, bytes) else sha256_of(item)
            if hashes.get(name) != want:
                report.problems.append(f"{name}: does not read back as written")
    return report


def _read_members(
    tar: tarfile.TarFile,
    blocks: Blocks,
    report: PackageReport,
    hashes: dict[str, str],
    heads: dict[str, bytes],
) -> None:
    """Each member in turn (names as unpacking reads them, at most MAX_MEMBERS), then what
    follows the archive's end."""
    seen: dict[str, tuple[str, bool]] = {}  # name as unpacked -> (first name, a folder)
    unpacked = 0
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            report.problems.append(f"more than {MAX_MEMBERS:,} files")
            return
        unpacked += member.size if member.isfile() else 0
        if unpacked > MAX_UNPACKED_BYTES:  # each file under the bound, and no end to them
            report.problems.append(
                f"{member.name}: the files up to it unpack to over {MAX_UNPACKED_BYTES >> 30} "
                "GiB in all, more than any adapter package; not read further"
            )
            return
        if problem := member_problem(member, seen):
            report.problems.append(problem)
        elif member.isfile() and member.size > MAX_FILE_BYTES:
            report.problems.append(f"{member.name}: over {MAX_FILE_BYTES >> 30} GiB")
        elif not member.isdir():  # unpacking makes a folder: harmless, not listed
            _read_member(tar, member, report, hashes, heads)
    if problem := end_problem(blocks, report.path):
        report.problems.append(problem)


def _read_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    report: PackageReport,
    hashes: dict[str, str],
    heads: dict[str, bytes],
) -> None:
    """A regular file of the package: its size and hash, and what it holds checked where the
    kind of file says how (weights, the manifest, adapter and tokenizer configurations)."""
    name = member.name = PurePosixPath(member.name).as_posix()  # ./a unpacks as a
    report.files[name] = member.size
    if name.endswith(".safetensors"):
        hashes[name], heads[name] = _check_weights(tar, member, report)
        return
    hashes[name], data = _member_hash(tar, member)
    if name == "manifest.json" and member.size > MAX_MANIFEST_BYTES:  # its bytes not kept
        report.problems.append(f"manifest.json: over {MAX_MANIFEST_BYTES >> 20} MB; not a manifest")
    elif name == "manifest.json":
        report.read = _manifest_of(data, report)
    elif name.endswith(ADAPTER_FILES[1]):
        heads[name] = data
    elif name in TOKENIZER_FILES:
        _check_tokenizer_file(name, data, member.size, report)


def _check_tokenizer_file(name: str, data: bytes, size: int, report: PackageReport) -> None:
    if size > TOKENIZER_CHECK_BYTES:
        report.problems.append(
            f"{name}: over {TOKENIZER_CHECK_BYTES >> 20} MiB, larger than any model's "
            "tokenizer file; not read, so not called sound"
        )
    elif problem := tokenizer_problem(name, data):
        report.problems.append(f"{name}: {problem}")


def _member_hash(
    tar: tarfile.TarFile, member: tarfile.TarInfo, copy_to: IO[bytes] | None = None
) -> tuple[str, bytes]:
    """sha256 of a member, and its bytes when it is small JSON worth reading (the first
    HEAD_BYTES of a safetensors file: its header); with `copy_to`, the whole member is
    written there too."""
    digest, kept = hashlib.sha256(), io.BytesIO()
    small_json = member.name.endswith(".json") and member.size <= MAX_MANIFEST_BYTES
    tokenizer = member.name in TOKENIZER_FILES and member.size <= TOKENIZER_CHECK_BYTES
    keep = HEAD_BYTES if member.name.endswith(".safetensors") else 0
    keep = member.size if small_json or tokenizer else keep
    stream = tar.extractfile(member)
    assert stream is not None  # a regular file, checked above
    while block := stream.read(CHUNK):
        digest.update(block)
        if kept.tell() < keep:
            kept.write(block[: keep - kept.tell()])
            # a safetensors header that is damaged is said from it: no copy of the whole
            # member (2 GiB of zeros packs into 2 MB, and was copied before it was said)
            if copy_to is not None and header_problem(kept.getvalue(), member.size):
                copy_to = None
        if copy_to is not None:
            copy_to.write(block)
    return digest.hexdigest(), kept.getvalue()


def _check_weights(
    tar: tarfile.TarFile, member: tarfile.TarInfo, report: PackageReport
) -> tuple[str, bytes]:
    """A safetensors member: whole by its header, and (up to FINITE_CHECK_BYTES) its numbers
    finite, read from a temporary copy one tensor at a time; its sha256."""
    why_unchecked, bad = None, None
    if member.size > FINITE_CHECK_BYTES:
        digest, head = _member_hash(tar, member)
        why_unchecked = f"over {FINITE_CHECK_BYTES >> 30} GiB"
    else:
        try:
            with tempfile.NamedTemporaryFile(suffix=".safetensors") as copy:
                digest, head = _member_hash(tar, member, copy)
                copy.flush()
                bad = non_finite_tensors(Path(copy.name))  # None when damaged: said below
                why_unchecked = "its tensors cannot be read" if bad is None else None
        except OSError:  # no room for the copy, most likely: read it again without one (an
            # archive that cannot be read fails again there, and is said to be damaged)
            digest, head = _member_hash(tar, member)
            why_unchecked = "no room for a temporary copy"
    if damaged := header_problem(head, member.size):
        report.problems.append(f"{member.name} {damaged}")
    elif bad:
        report.problems.append(f"{member.name}: {non_finite_line(bad)}")
    elif why_unchecked:
        report.notes.append(f"{member.name}: {why_unchecked}, its numbers are not checked for NaN")
    return digest, head


def _manifest_of(data: bytes, report: PackageReport) -> dict[str, Any] | None:
    """manifest.json's object as HiveLLM's loader reads the text, or None with the problem.
    A key given twice is a problem where the loader reads that field (it refuses it), a note
    where it skips the key or keeps the last (a key of its own, of a map, of free JSON)."""
    if data.startswith(b"\xef\xbb\xbf"):  # what a Windows editor writes
        report.problems.append(
            "manifest.json: starts with a byte-order mark, which HiveLLM's loader refuses; "
            "save it as UTF-8 without one"
        )
        return None
    try:
        text = data.decode("utf-8")
        manifest, repeated = parse_json_text(text, parse_int=serde_int, parse_constant=no_constant)
    except NotJson:
        report.problems.append(
            "manifest.json: holds NaN or Infinity, which is not JSON (HiveLLM's loader refuses it)"
        )
        return None
    except UnicodeDecodeError:
        utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))  # its byte-order mark
        report.problems.append(
            f"manifest.json: {'UTF-16' if utf16 else 'not UTF-8'} text; expected UTF-8 JSON"
        )
        return None
    except json.JSONDecodeError as exc:
        empty, nul = not exc.doc.strip(), exc.doc.count("\x00") * 4 >= len(exc.doc)
        report.problems.append(  # NUL bytes: UTF-16 without its byte-order mark
            "manifest.json: is empty; expected a JSON object"
            if empty
            else "manifest.json: UTF-16 text (NUL bytes); expected UTF-8 JSON"
            if nul
            else f"manifest.json: not valid JSON (line {exc.lineno})"
        )
        return None
    except (ValueError, RecursionError):
        manifest, repeated = None, []
    if not isinstance(manifest, dict):
        report.problems.append("manifest.json: not a JSON object")
        return None
    for loc in repeated[:MAX_VALUE_ERRORS]:
        if read_field(loc):
            report.problems.append(
                f"manifest.json: {loc_text(loc)}: given more than once (HiveLLM's loader "
                "refuses it)"
            )
        else:
            report.notes.append(
                f"manifest.json: {loc_text(loc)}: given more than once; HiveLLM's loader "
                "uses the last"
            )
    return manifest


def _path_like(value: str) -> bool:
    """Whether a manifest's name or version leads out of a folder made of it (a separator,
    `..`, a leading dot, a control character); other text HiveLLM's loader takes."""
    return any(c in value for c in "/\\") or value.startswith(".") or not value.isprintable()


def _check_contents(report: PackageReport, hashes: dict[str, str], heads: dict[str, bytes]) -> None:
    """What the manifest says against what HiveLLM's loader reads and the package holds."""
    if "manifest.json" not in report.files:
        report.problems.append("manifest.json: missing at the package's root")
    if missing := missing_tokenizer_file(report.files):
        report.problems.append(missing)
    if report.read is None:
        return
    report.notes += unexpected_members(list(report.files), report.read)
    unpacked, packed = sum(report.files.values()), report.path.stat().st_size
    if unpacked > BIG_UNPACKED and unpacked > SQUEEZED * packed:  # trained weights do not squeeze
        report.notes.append(
            f"the package unpacks to {unpacked / 2**30:.1f} GiB from {packed / 2**20:.1f} MiB: "
            "files of repeated bytes (zeros?), not trained weights, fill it"
        )
    if refused := loader_problems(report.read):
        report.problems += [
            f"manifest.json: {line} (HiveLLM's loader refuses it)" for line in refused
        ]
    else:  # the fields compared below hold what the loader reads
        report.manifest = report.read
        for key in ("name", "version"):  # "a/../x": the loader may make a folder of it
            if _path_like(report.manifest[key]):
                report.problems.append(
                    f"manifest.json: {key}: a path, not a name (a folder or file named by it "
                    f"would be elsewhere); expected {FILE_NAME_PART_RULE}"
                )
        problems, notes = named_file_problems(report.manifest, report.files)
        report.problems, report.notes = report.problems + problems, report.notes + notes
    for name in ADAPTER_FILES:
        if name not in report.files:
            report.problems.append(
                f"{name}: missing at the package's root (where HiveLLM's loader looks for it)"
            )
    if not refused:
        _check_entry(report, hashes, heads)


def _check_entry(report: PackageReport, hashes: dict[str, str], heads: dict[str, bytes]) -> None:
    """The manifest's adapter entry against adapter_config.json and the weights shipped."""
    adapters, where = adapters_of(copy.deepcopy(report.manifest))
    adapter = adapters[0] if adapters and isinstance(adapters[0], dict) else {}
    if (data := heads.get(ADAPTER_FILES[1])) is not None:
        shapes = header_shapes(heads.get(ADAPTER_FILES[0], b""))
        config, problem = _read_config(data, shapes)
        if problem:
            report.problems.append(f"{ADAPTER_FILES[1]}: {problem}")
        elif gap := pairs_problem(config, shapes or {}) or not_float_line(
            heads.get(ADAPTER_FILES[0], b"")
        ):
            report.problems.append(f"{ADAPTER_FILES[0]}: {gap}")
        else:
            report.problems += entry_problems(adapter, config, where)
            report.notes += config_notes(report.manifest["training"].get("config"), config)
            report.notes += base_note(report.manifest, config)
            report.problems += [  # the run packaged again by this expert-cli writes none
                f"{line}: package the run again with this expert-cli" for line in misapplied(config)
            ]
            report.notes += unapplied(config)
    weights = hashes.get(ADAPTER_FILES[0])
    if weights and adapter.get("sha256") and adapter["sha256"] != weights:
        report.problems.append(f"{where}[0].sha256: does not match {ADAPTER_FILES[0]}")
    size = report.files.get(ADAPTER_FILES[0])
    if size is not None and adapter.get("size_bytes") and adapter["size_bytes"] != size:
        report.problems.append(
            f"{where}[0].size_bytes: {adapter['size_bytes']} but the file has {size}"
        )


def _read_config(data: bytes, shapes: Shapes | None) -> tuple[dict[str, Any], str | None]:
    """The package's adapter configuration, and what `generate` and `merge` would refuse in
    it (None: nothing)."""
    try:
        config = json.loads(data.decode("utf-8"), parse_int=json_int)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}, "not readable JSON"
    if not isinstance(config, dict):
        return {}, "not a JSON object"
    return config, adapter_config_problem(config, shapes)
