"""Whether a safetensors file is whole, from its header alone (milliseconds, whatever its size).
A leaf module: `check` looks at a base model's weights with it, resume at a checkpoint's.

A file cut short (an interrupted download or copy, a full disk) has a header that claims more
bytes than the file holds; loading it is a traceback from deep inside the loader.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError, safe_open

DAMAGED = "is damaged (its header does not match its size)"


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file at `path` cannot be loaded (`<name> is damaged ...`), or None."""
    try:
        with safe_open(str(path), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError):
        return f"{path.name} {DAMAGED}"
    return None


def damaged_weights(folder: Path) -> list[str]:
    """A line per damaged `*.safetensors` file directly in `folder` (a model's shards)."""
    return [p for f in sorted(folder.glob("*.safetensors")) if (p := safetensors_problem(f))]


def weights_error(model: str, damaged: list[str]) -> str:
    """The error for a base model whose weight files are damaged."""
    return f"base model {model}: {'; '.join(damaged)}; download or copy it again"
