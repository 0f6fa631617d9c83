"""LoRA initialisations that move part of the base weight into the adapter: PiSSA (the top r
singular directions of each weight, peft's `pissa` and the randomised `pissa_niter_N`) and
OLoRA (a QR decomposition). peft starts B0 A0 from the weight W and trains on the residual
W_res = W - s B0 A0, written over the base layer's weight in place.

What peft saves applies to W_res alone: peft's own loading decomposes W again to rebuild it
(the SVD of every layer, minutes on a CPU, and another residual for pissa_niter_N, whose SVD is
random), and HiveLLM's runtime adds s B A to W, which is wrong. So a run keeps B0 and A0
(`INIT_WEIGHTS`, written before its first step) and every adapter that leaves it is the same
update as a standard LoRA of rank 2r on W itself:

    W_res + s B A = W + s (B A - B0 A0) = W + s' [B, -s/s' B0] [A; A0]

with r' = 2r and alpha' = 2 alpha (s' = alpha' / r' = alpha / r = s for standard scaling; an
rsLoRA run's s = alpha / sqrt(r) is folded into B', written `use_rslora: false`). DoRA's
magnitudes stay as they are: its norm is of the same W_res + s B A.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import save, save_file

from expert_cli.atomic import atomic_file
from expert_cli.config.adapters import decomposing
from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.outputs import read_json_file
from expert_cli.weights import sha256_of, tensors_of

INIT_WEIGHTS = "adapter_init.safetensors"  # B0 and A0 of a run that decomposed its base
INIT_DIGEST = "init_digest"  # runtime.model: INIT_WEIGHTS's sha256 as the run wrote or kept it
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
A_B = (".lora_A.", ".lora_embedding_A", ".lora_B.", ".lora_embedding_B")


def decomposes(init: Any) -> bool:
    """Whether a LoRA `init_lora_weights` (as adapter_config.json holds it) moves part of
    the base into the adapter."""
    return isinstance(init, str) and decomposing(init)


def save_initial(peft_model: Any, path: Path) -> None:
    """The adapter's A0 and B0, as peft would save them, into `path` (written whole or not)."""
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in _start(peft_model)}
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})


def _start(peft_model: Any) -> list[tuple[str, torch.Tensor]]:
    """The adapter's A and B tensors by the names peft saves them under."""
    state = get_peft_model_state_dict(peft_model)
    return [(k, v) for k, v in state.items() if any(part in k for part in A_B)]


def kept_start(path: Path, peft_model: Any) -> str:
    """What a resumed run's kept start is to this adapter's fresh one: "same" where it reads
    whole and each layer's B0 A0 is the fresh one's (an SVD's signs may differ: the residual
    does not); "other" where it holds other numbers (another run's put there, or a
    randomised SVD drawn otherwise on another device); "unusable" where it is missing, cut
    short or of other names or shapes. Only a "same" start is kept: the adapter leaves the
    run by the residual it trains on now."""
    if not path.is_file():  # a FIFO there held the resume for ever, deaf to signals
        return "unusable"
    fresh = {k: v.detach().float().cpu() for k, v in _start(peft_model)}
    try:
        kept, _ = tensors_of(path)
    except (SafetensorError, OSError):
        return "unusable"
    if {k: tuple(v.shape) for k, v in kept.items()} != {
        k: tuple(v.shape) for k, v in fresh.items()
    }:
        return "unusable"
    for name, tensor in fresh.items():
        if ".lora_A." not in name and ".lora_embedding_A" not in name:
            continue
        b = name.replace(".lora_A.", ".lora_B.").replace("_embedding_A", "_embedding_B")
        if torch.equal(kept[name], tensor) and torch.equal(kept[b], fresh[b]):
            continue  # written by this device's decomposition: no product to compare
        now = fresh[b] @ tensor
        then = kept[b].float() @ kept[name].float()
        if not torch.allclose(then, now, rtol=1e-3, atol=1e-5 * float(now.abs().max()) + 1e-7):
            return "other"
    return "same"


def start_digest(path: Path | None) -> str | None:
    """The sha256 of a run's start (`path`), None where it has none."""
    return sha256_of(path) if path is not None and path.is_file() else None


def recorded_start(run_folder: Path) -> str | None:
    """The sha256 of the start the run wrote, as its manifest.resolved.json records it."""
    runtime = read_json_file(run_folder / "manifest.resolved.json").get("runtime")
    model = runtime.get("model") if isinstance(runtime, dict) else None
    recorded = model.get(INIT_DIGEST) if isinstance(model, dict) else None
    return recorded if isinstance(recorded, str) else None


def standard_form(folder: Path, initial: Path) -> tuple[bytes, dict[str, Any]] | None:
    """The adapter in `folder` (adapter_config.json and adapter_model.safetensors) as the
    standard LoRA of rank 2r on the original base (bytes of its safetensors, its config);
    None where its config says it did not decompose the base. UserError where the run's
    `initial` B0 A0 are missing or do not fit it."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text("utf-8"))
    if config.get("peft_type") != "LORA" or not decomposes(config.get("init_lora_weights")):
        return None
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not initial.is_file():
        raise UserError(
            f"{shown_path(folder)}: its adapter was trained from a decomposed base "
            f"(init_lora_weights {config['init_lora_weights']}); the run's {INIT_WEIGHTS}, "
            "which turns it into an adapter of the base itself, is missing"
        )
    if (recorded := recorded_start(initial.parent)) is not None and recorded != sha256_of(initial):
        raise UserError(
            f"{shown_path(initial)}: is not the start the run wrote (changed since; another "
            f"run's?); it turns the adapter in {shown_path(folder)} into one of the base "
            "itself: put the run's own back, or train again"
        )
    numbers = isinstance(rank, int) and rank > 0 and isinstance(alpha, int | float) and alpha > 0
    if config.get("rank_pattern") or config.get("alpha_pattern") or not numbers:
        raise UserError(f"{shown_path(folder)}: adapter_config.json: one r and one alpha expected")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    fold = scale / (alpha / rank)  # into B': 1, or sqrt(r) for rsLoRA
    trained, metadata = tensors_of(folder / ADAPTER_WEIGHTS)
    try:
        start, _ = tensors_of(initial)
    except (SafetensorError, OSError):
        raise UserError(
            f"{shown_path(initial)}: cannot be read (damaged or cut short); it turns the "
            f"adapter in {shown_path(folder)} into one of the base itself: train again"
        ) from None
    out = {}
    for name, tensor in trained.items():
        if not any(part in name for part in A_B):
            out[name] = tensor  # DoRA's magnitudes: the norm of the same weight
            continue
        if name not in start or start[name].shape != tensor.shape:
            raise UserError(
                f"{shown_path(initial)}: does not fit the adapter in {shown_path(folder)} "
                "(another run's?)"
            )
        first = start[name].to(tensor.dtype)
        if ".lora_A." in name or ".lora_embedding_A" in name:
            out[name] = torch.cat([tensor, first], dim=0).contiguous()
        else:
            joined = torch.cat([tensor.float(), -first.float()], dim=1) * fold
            out[name] = joined.to(tensor.dtype).contiguous()
    config.update(r=2 * rank, lora_alpha=2 * alpha, use_rslora=False, init_lora_weights=True)
    return save(out, metadata=metadata), config


def standard_notes(notes: list[str], config: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
    """A package's notes on the adapter of a run that decomposed its base (`resolved`, its
    manifest.resolved.json), shipped in its standard form: its rank and alpha are twice the
    run's by design, said once, not as values the manifest gave otherwise."""
    if not decomposes(resolved.get("init_lora_weights")):
        return notes
    doubled = re.compile(r"(training\.config\.(rank|alpha)|.*adapters\[0\]\.(r|alpha)): ")
    kept = [n for n in notes if not (doubled.match(n) and "ship" in n)]
    return [
        *kept,
        f"the run decomposed its base (init_lora_weights): its adapter ships as a LoRA of the "
        f"base itself, rank {config.get('r')} and alpha {config.get('lora_alpha')}, twice the "
        "run's (the same update)",
    ]


def to_standard_form(folder: Path, initial: Path) -> bool:
    """Rewrite the adapter in `folder` in its standard form (see `standard_form`), each file
    whole or not; whether it was one to rewrite."""
    converted = standard_form(folder, initial)
    if converted is None:
        return False
    weights, config = converted
    with atomic_file(folder / ADAPTER_WEIGHTS) as tmp:
        tmp.write_bytes(weights)
    with atomic_file(folder / ADAPTER_CONFIG) as tmp:
        tmp.write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    return True


@contextmanager
def standard_folder(folder: Path, initial: Path) -> Iterator[Path]:
    """`folder`, or where its adapter was trained from a decomposed base (a checkpoint of a
    PiSSA run), a temporary folder holding its standard form, for peft to load on the base
    itself (peft would decompose the base again: slow, and another residual for
    pissa_niter_N)."""
    converted = standard_form(folder, initial)
    if converted is None:
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="expert-cli-adapter-") as tmp:
        Path(tmp, ADAPTER_WEIGHTS).write_bytes(converted[0])
        Path(tmp, ADAPTER_CONFIG).write_text(json.dumps(converted[1]), "utf-8")
        yield Path(tmp)
