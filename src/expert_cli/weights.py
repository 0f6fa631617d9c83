"""Whether a safetensors file is whole, from its header alone (milliseconds, whatever its size).
A leaf module: `check` looks at a base model's weights with it, resume at a checkpoint's,
`package` and `check --package` at the adapter's. And whether a tensor's numbers are numbers
(`tensor_is_finite`; `non_finite_tensors` reads a whole file, a tensor at a time: for adapters
and checkpoints, not base models).

A safetensors file is an 8-byte header length, a JSON header giving each tensor's byte range,
then the tensors. A file cut short (an interrupted download or copy, a full disk) has a header
whose last range ends past the file's end; loading it was a traceback from inside the loader.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

DAMAGED = "is damaged (its header does not match its size)"
HEADER_LIMIT = 100_000_000  # the loader's own bound on a header
HEAD_BYTES = 1 << 20  # what a reader of a stream keeps to judge it: any adapter's header fits


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(HEAD_BYTES):
            digest.update(block)
    return digest.hexdigest()


def header_problem(head: bytes, size: int) -> str | None:
    """DAMAGED when the header at the start of `head` (a file's first bytes) does not end its
    last tensor at the file's `size`; None when it does, or when `head` is too short to hold
    the whole header (a model with more tensors than fit HEAD_BYTES: not judged)."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if length < 0 or length > HEADER_LIMIT or 8 + length > size:
        return DAMAGED
    if len(head) < 8 + length:
        return None
    try:
        header = json.loads(head[8 : 8 + length])
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return DAMAGED
    return None if 8 + length + max(ends, default=0) == size else DAMAGED


def _head(path: Path) -> tuple[bytes, int]:
    """A safetensors file's header bytes (its first 8 alone where the length they give cannot
    be a header of this file), and the file's size; OSError as raised."""
    size = path.stat().st_size
    with path.open("rb") as f:
        start = f.read(8)
        length = int.from_bytes(start, "little") if len(start) == 8 else 0
        fits = length <= HEADER_LIMIT and 8 + length <= size  # else judged on `start`
        return start + f.read(length if fits else 0), size


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at `path` cannot be loaded (`<name> is damaged ...`), or None."""
    try:
        head, size = _head(path)
    except OSError:
        return f"{path.name} cannot be read"
    problem = header_problem(head, size)
    return f"{path.name} {problem}" if problem else None


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """Each tensor's shape by name, as a safetensors file's header lists them (None when it
    cannot be read)."""
    try:
        return header_shapes(_head(path)[0])
    except OSError:
        return None


def header_shapes(head: bytes) -> dict[str, tuple[int, ...]] | None:
    """Each tensor's shape by name, from the header at the start of `head` (a safetensors
    file's first bytes); None when `head` does not hold a whole, readable header. A shape
    that is not a list of whole numbers is given as ()."""
    header = _header(head)
    if header is None:
        return None
    return {str(k): _shape(v) for k, v in header.items() if k != "__metadata__"}


def _header(head: bytes) -> dict[str, Any] | None:
    """The JSON object at the start of `head` (a safetensors file's first bytes), or None
    where `head` does not hold a whole, readable one."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if length < 0 or len(head) < 8 + length:
        return None
    try:
        header = json.loads(head[8 : 8 + length])
    except (ValueError, RecursionError):
        return None
    return header if isinstance(header, dict) else None


FLOAT_TYPES = frozenset({"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"})
DTYPE_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,11}")  # safetensors' names: I64, U8, BOOL, F8_E4M3


def file_head(path: Path) -> bytes:
    """A safetensors file's header bytes (b"" where it cannot be read)."""
    try:
        return _head(path)[0]
    except OSError:
        return b""


def not_float_line(head: bytes) -> str | None:
    """The first tensor of an adapter's weights file (by the header at the start of `head`)
    not of a floating-point type, as a line, or None: an adapter's weights are (torch would
    copy integers into its parameters without a word)."""
    for name, entry in (_header(head) or {}).items():
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if name != "__metadata__" and isinstance(dtype, str) and dtype not in FLOAT_TYPES:
            kind = dtype if DTYPE_NAME.fullmatch(dtype) else "another"  # the file's own text
            return (
                f"holds {shown_tensor(name)} of type {kind}, not a floating-point type: "
                "not an adapter's weights as training saves them"
            )
    return None


def _shape(entry: Any) -> tuple[int, ...]:
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        return ()
    return tuple(shape)


def damaged_weights(folder: Path) -> list[str]:
    """A line per damaged `*.safetensors` file directly in `folder` (a model's shards)."""
    return [p for f in sorted(folder.glob("*.safetensors")) if (p := safetensors_problem(f))]


def weights_error(model: str, damaged: list[str]) -> str:
    """The error for a base model whose weight files are damaged."""
    return f"base model {model}: {'; '.join(damaged)}; download or copy it again"


SCAN_ELEMENTS = 1 << 24  # elements per isfinite pass: a bounded temporary, whatever the tensor
TENSOR_NAME = re.compile(r"[\w.\-/:]{1,200}", re.ASCII)


def tensor_is_finite(tensor: Any) -> bool:
    """Whether every element of a floating-point tensor is a finite number (True for other
    dtypes: a quantized weight's packed integers). A finite sum proves it (NaN and infinity
    propagate) at the speed of a read: 0.1 s per 600M fp32 weights on 2 CPU cores, 20x
    `isfinite`. Only a sum that overflows is looked at element by element, a piece at a time;
    one-byte floats (float8), which torch can neither sum nor test, are looked at in float16."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return True
    one_byte = tensor.element_size() == 1
    if not one_byte and bool(tensor.sum().isfinite()):
        return True
    flat = tensor.reshape(-1)
    for start in range(0, flat.numel(), SCAN_ELEMENTS):
        piece = flat[start : start + SCAN_ELEMENTS]
        if one_byte:  # float32 holds every 8-bit float's range (e8m0 reaches 2^127)
            try:
                piece = piece.to(torch.float32)
            except (NotImplementedError, RuntimeError):  # packed float4 pairs: not read
                return True
        if not bool(piece.isfinite().all()):
            return False
    return True


def non_finite_tensors(file: Path) -> list[str] | None:
    """Names of the tensors of a safetensors file that hold NaN or infinity ([] when none do),
    one tensor in memory at a time; None when it cannot be read as safetensors (said by
    `safetensors_problem` / `header_problem`) or holds a tensor torch cannot test."""
    try:
        with safe_open(str(file), framework="pt") as f:
            names = f.keys()  # noqa: SIM118 - safe_open is not iterable
            return sorted(n for n in names if not tensor_is_finite(f.get_tensor(n)))
    except Exception:  # noqa: BLE001 - damaged, not safetensors, or a dtype torch lacks
        return None


def shown_tensor(name: str) -> str:
    """A tensor's name as a message may show it: a file's header is the file's content, so
    only a name that looks like one (letters, digits, `._-/:`, at most 200) is shown."""
    return name if TENSOR_NAME.fullmatch(name) else f"<a {len(name)}-character name>"


def shape_text(shape: Any) -> str:
    """A tensor's shape as a message says it: `16x1024`, or `a scalar`."""
    return "x".join(str(d) for d in shape) or "a scalar"


def non_finite_line(bad: list[str], shown: int = 3) -> str:
    """`N tensor(s) ... NaN or infinity (names)` for the names `non_finite_tensors` found."""
    more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
    verb = "hold" if len(bad) > 1 else "holds"
    plural = "s" if len(bad) > 1 else ""
    names = ", ".join(shown_tensor(n) for n in bad[:shown])
    return f"{len(bad)} tensor{plural} {verb} NaN or infinity ({names}{more})"


# the tensors peft starts at zero, so that a new adapter adds nothing: LoRA's B of a linear
# layer and A of an embedding; AdaLoRA's singular values (its A and B start random)
ZERO_AT_START = {"LORA": ("lora_B", "lora_embedding_A"), "ADALORA": ("lora_E",)}


def unchanged_adapter(file: Path) -> str | None:
    """The names of the tensors that start at zero when every one of them still is, so that
    the adapter adds nothing to the base (a run whose every step had a learning rate of 0);
    None otherwise, or when the file holds none of them, holds DoRA's magnitudes (they
    change the output alone), or cannot be read."""
    try:
        with safe_open(str(file), framework="pt") as f:
            names = list(f.keys())  # noqa: SIM118 - safe_open is not iterable
            parts = {n: set(n.split(".")) for n in names}
            if any("lora_magnitude_vector" in p for p in parts.values()):
                return None
            kind = "ADALORA" if any("lora_E" in p for p in parts.values()) else "LORA"
            markers = ZERO_AT_START[kind]
            zero = [n for n in names if parts[n] & set(markers)]
            if not zero or any(bool(f.get_tensor(n).any()) for n in zero):
                return None  # one of them moved
    except Exception:  # noqa: BLE001 - damaged or not safetensors: said by the other checks
        return None
    return " and ".join(m for m in markers if any(m in parts[n] for n in zero))


def tensors_of(path: Path) -> tuple[dict[str, Any], dict[str, str] | None]:
    """Every tensor of a safetensors file, by name, and its metadata (SafetensorError or
    OSError where it cannot be read)."""
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()  # noqa: SIM118
