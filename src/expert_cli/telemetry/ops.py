"""Counting the operations a piece of torch work dispatches, and the ones that make the host wait.

A GPU training step of a small model is partly bound by launching kernels: each aten operation
that does work launches at least one. How many a step dispatches depends on the code, not on
the device or the model's width, so it can be counted on a CPU (scripts/bench_step_ops.py).
Operations that copy a device value to the host (`.item()`, `nonzero`, ...) stall the host
until the device catches up; they are counted apart, with the Python line that asked.

What a forward pass keeps for its backward (the activations, most of a LoRA step's memory)
does not depend on the device either: `SavedForBackward` adds up the storages autograd keeps.
"""

from __future__ import annotations

import traceback
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operations that read a device value on the host (a GPU would synchronise).
SYNCS = frozenset(
    {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::is_nonzero",
        "aten::equal",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::repeat_interleave",
        "aten::bincount",
    }
)
# Operations that launch nothing: allocations without a fill, reinterpretations.
FREE = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::lift_fresh",
        "aten::_unsafe_view",
    }
)
_PACKAGES = ("expert_cli", "transformers", "peft", "accelerate", "torch")


def _where(frame: traceback.FrameSummary) -> str:
    for package in _PACKAGES:
        marker = f"/{package}/"
        if marker in frame.filename:
            return f"{package}/{frame.filename.split(marker, 1)[1]}:{frame.lineno} {frame.name}"
    return f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"


def caller() -> str:
    """The innermost Python line outside torch that is running, and the innermost line of
    expert_cli above it when that is another."""
    stack = [f for f in traceback.extract_stack()[:-1] if f.filename != __file__]
    frames = [f for f in stack if "/torch/" not in f.filename] or stack
    inner = _where(frames[-1]) if frames else "?"
    ours = next((_where(f) for f in reversed(frames) if "/expert_cli/" in f.filename), None)
    return inner if ours in (None, inner) else f"{inner} (in {ours})"


class OpCounter(TorchDispatchMode):
    """While active (`with OpCounter() as c:`, or `enter()`/`exit()` across callbacks), counts
    every dispatched aten operation that does work (`ops`, by name; views and bare
    allocations left out) and every host-syncing one (`syncs`, by "op <- caller"). Backward
    passes run inside it are counted too."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func._schema.name
        if name in SYNCS:
            self.syncs[f"{name} <- {caller()}"] += 1
        if not func.is_view and name not in FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operations counted."""
        return sum(self.ops.values())

    def syncs_from(self, package: str) -> dict[str, int]:
        """The host syncs whose innermost Python line outside torch is in `package`."""
        return {k: n for k, n in self.syncs.items() if f"<- {package}/" in k}


class SavedForBackward:
    """While active (`with SavedForBackward(model.parameters()) as s:` around one forward
    pass), records what autograd keeps for the backward; `nbytes` adds up the bytes of the
    distinct storages of what the graph still holds when it is read (read it while the
    forward's output is alive, before the backward): each storage once however many tensors
    view it, the storages of `exclude` (the model's own weights, kept anyway) left out. A
    tensor saved by a part of the graph that was let go within the forward (a detached
    branch: peft's DoRA computes its weight norm so) is not kept, and is not counted."""

    def __init__(self, exclude: Any = ()) -> None:
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self._kept: list[weakref.ref] = []
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, tensor: torch.Tensor) -> _Kept:
        kept = _Kept(tensor)
        self._kept.append(weakref.ref(kept))
        return kept

    def __enter__(self) -> SavedForBackward:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)

    @property
    def storages(self) -> dict[int, int]:
        """Bytes of each distinct storage the graph holds now, by address."""
        found: dict[int, int] = {}
        for ref in self._kept:
            kept = ref()
            if kept is None:
                continue
            storage = kept.tensor.untyped_storage()
            address = storage.data_ptr()
            if address and address not in self.exclude:
                found[address] = storage.nbytes()
        return found

    @property
    def nbytes(self) -> int:
        """Bytes kept for the backward."""
        return sum(self.storages.values())


class _Kept:
    """A tensor as the graph holds it: alive while the part of the graph that saved it is."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _unpack(kept: _Kept) -> torch.Tensor:
    return kept.tensor
