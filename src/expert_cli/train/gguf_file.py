"""The GGUF adapter file of `export-gguf` on disk: each tensor stored as --outtype asks (f16's
range and precision checked), the keys llama.cpp reads, the file written under a temporary
name, read back and compared tensor by tensor, then put in place without replacing a file
another process wrote there meanwhile (unless --force asked to replace one)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from expert_cli.atomic import parents_made, place_new, signals_held, temporary_path
from expert_cli.errors import RunError, Terminated, UserError, left_by
from expert_cli.paths import shown_path

OUT_TYPES = {  # --outtype -> how each tensor is stored
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "f32": gguf.GGMLQuantizationType.F32,
}
F16_NORMAL = float(np.finfo(np.float16).tiny)  # below it f16 keeps fewer significant bits
F16_MAX = float(np.finfo(np.float16).max)
UNDER_SHARE = 0.01  # a tensor with more of its values below f16's normal range is noted


def stored_tensors(
    tensors: dict[str, np.ndarray], outtype: str
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Each tensor as the file stores it (f32, f16, or bf16 as gguf's raw 16-bit words), and
    a note where f16 rounds many of them to fewer bits; UserError where f16 cannot hold one."""
    if outtype == "bf16":
        quantize = gguf.quants.quantize
        return {n: quantize(v, OUT_TYPES["bf16"]) for n, v in tensors.items()}, []
    if outtype == "f32":
        return {n: v.astype(np.float32) for n, v in tensors.items()}, []
    over = [n for n, v in tensors.items() if v.size and float(np.abs(v).max()) > F16_MAX]
    if over:
        raise UserError(
            f"--outtype f16: {over[0]} holds values beyond f16's range ({F16_MAX:g}), which "
            f"would be stored as infinite ({len(over)} tensor(s)); use --outtype bf16 or f32"
        )
    low = []
    for name, values in tensors.items():
        nonzero = values[values != 0]
        if nonzero.size and np.mean(np.abs(nonzero) < F16_NORMAL) > UNDER_SHARE:
            low.append(name)
    notes = []
    if low:
        notes.append(
            f"--outtype f16: {len(low)} tensor(s) ({low[0]}, ...) hold many values below f16's "
            f"normal range ({F16_NORMAL:.2g}), kept with fewer significant bits; --outtype bf16 "
            "or f32 keeps them whole"
        )
    return {n: v.astype(np.float16) for n, v in tensors.items()}, notes


def write_file(
    path: Path,
    stored: dict[str, np.ndarray],
    kind: tuple[str, float, str],
    meta: dict[str, str],
    force: bool,
) -> None:
    """Write, read back, compare, then put in place; an interrupt leaves nothing (or the
    whole file, said so), a file another process put at `path` meanwhile is left as it is,
    and folders made for `path` are removed again when it fails."""
    arch, alpha, outtype = kind
    tmp = temporary_path(path)
    placed = False
    with parents_made(path, RunError):  # folders made for it go again when it fails
        try:
            writer = gguf.GGUFWriter(tmp, arch)
            writer.add_type(gguf.GGUFType.ADAPTER)
            writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
            writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
            for key, add in (("name", writer.add_name), ("version", writer.add_version)):
                if meta.get(key):
                    add(meta[key])
            if meta.get("base"):
                writer.add_base_model_count(1)
                writer.add_base_model_name(0, meta["base"])
                if meta.get("base_url"):
                    writer.add_base_model_repo_url(0, meta["base_url"])
            for name, values in stored.items():
                writer.add_tensor(name, values, raw_dtype=OUT_TYPES[outtype])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            if problems := _read_back(tmp, stored, (arch, alpha, OUT_TYPES[outtype])):
                raise RunError([f"{shown_path(path)}: {p}" for p in problems])
            with signals_held():
                _place(tmp, path, force)
                placed = True
        except OSError as exc:
            reason = exc.strerror or "the disk is full: a write was cut short"
            raise RunError(f"--output {shown_path(path)}: cannot be written ({reason})") from None
        except (KeyboardInterrupt, Terminated) as exc:
            whole = f"{shown_path(path)} was" if placed else None
            raise left_by(exc, "the GGUF file", shown_path(path), whole) from None
        finally:
            tmp.unlink(missing_ok=True)


def _place(tmp: Path, path: Path, force: bool) -> None:
    """`tmp` renamed to `path`; without `force`, never over a file that is there by now (a
    second export of the same name finished first)."""
    if force:
        os.replace(tmp, path)
        return
    try:
        place_new(tmp, path)
    except FileExistsError:
        raise UserError(
            f"--output {shown_path(path)}: was written by another process while this export "
            "ran; it is left as it is; export again with another name, or --force to replace it"
        ) from None


def _read_back(
    path: Path, stored: dict[str, np.ndarray], kind: tuple[str, float, Any]
) -> list[str]:
    """read_back; a file too short to read raises OSError: numpy's tofile lets a full disk's
    error pass without a word, and the file ends where the disk did."""
    try:
        return read_back(path, stored, kind)
    except (ValueError, IndexError):
        pass  # raised outside: the reader's frames, which map the file, are let go first
    full = shutil.disk_usage(path.parent).free < sum(v.nbytes for v in stored.values())
    raise OSError(
        errno.ENOSPC if full else errno.EIO,
        os.strerror(errno.ENOSPC) if full else "the file written reads back short",
    )


def read_back(path: Path, stored: dict[str, np.ndarray], kind: tuple[str, float, Any]) -> list[str]:
    """What differs between the file and what was meant to be written: the keys llama.cpp
    reads, each tensor's name, type and bytes ([] when nothing does)."""
    arch, alpha, qtype = kind
    reader = gguf.GGUFReader(path)
    keys = {
        "general.type": "adapter",
        "general.architecture": arch,
        "adapter.type": "lora",
        "adapter.lora.alpha": np.float32(alpha),
    }
    problems = [
        f"{key} reads back as something else"
        for key, value in keys.items()
        if key not in reader.fields or reader.fields[key].contents() != value
    ]
    found = {t.name: t for t in reader.tensors}
    if set(found) != set(stored):
        problems.append(f"holds {len(found)} tensors, not the {len(stored)} written")
    for name, values in stored.items():
        tensor = found.get(name)
        if tensor is not None and (
            tensor.tensor_type != qtype or tensor.data.tobytes() != values.tobytes()
        ):
            problems.append(f"{name} reads back as other values")
    return problems
