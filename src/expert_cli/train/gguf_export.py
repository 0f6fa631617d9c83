"""`expert-cli export-gguf`: a run's LoRA adapter as a GGUF adapter file, which llama.cpp (and
what runs on it: `llama-cli --lora`, `llama-server`, Ollama's ADAPTER) applies to a GGUF of the
same base model (llama.cpp applies an adapter to a quantized base too).

The file holds, for each adapted projection, llama.cpp's tensor name (`blk.0.attn_q.weight`,
from the `gguf` package's name map of the architecture) with `.lora_a` (r x in) and `.lora_b`
(out x r), and the keys llama.cpp reads before it applies an adapter: `general.type` adapter,
`general.architecture`, `adapter.type` lora and `adapter.lora.alpha`. llama.cpp scales each
update by alpha / r; an rsLoRA adapter's sqrt(r) is folded into lora_B, and a PiSSA or OLoRA
run's adapter is the LoRA of rank 2r on the original base that `package` ships. Llama's q and
k rows are in llama.cpp's rotary order, as its converter lays out the base's.

DoRA, AdaLoRA and IA3 have no form llama.cpp applies: such a run is merged (`expert-cli
merge`) and the merged model converted with llama.cpp's own `convert_hf_to_gguf.py`. The file
is written under a temporary name, read back and compared tensor by tensor, then renamed into
place (gguf_file.py); an interrupt leaves nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes

from expert_cli.data.tokenizer import read_config
from expert_cli.errors import UserError
from expert_cli.paths import new_file_problem, resolved_path, shown_path
from expert_cli.train.adapter_entry import KINDS, first_base
from expert_cli.train.checkpoints import checkpoint_step
from expert_cli.train.choice import chosen_checkpoint
from expert_cli.train.gguf_file import OUT_TYPES, stored_tensors, write_file
from expert_cli.train.lora_init import INIT_WEIGHTS, decomposes, standard_form
from expert_cli.train.model_card import hub_id
from expert_cli.train.outputs import (
    ADAPTER_FILES,
    adapter_base,
    data_folder_problem,
    read_json_file,
    run_of,
)
from expert_cli.train.package import package_name
from expert_cli.train.rslora_fold import is_rslora
from expert_cli.train.run_source import run_manifest
from expert_cli.train.ship_choice import as_exported, final_problem, inside_run_folders, shipped
from expert_cli.weights import tensors_of, unchanged_adapter

# transformers' class of the base -> llama.cpp's architecture
ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
}
# those whose q and k rows llama.cpp's converter reorders for its rotary layout (Qwen's it
# does not)
ROTARY_REORDERED = {"llama"}
HALVES = ("lora_A", "lora_B")
# notes on the run's base, which export-hub's own notes say already in its words
DECOMPOSED_NOTE = (
    "the run decomposed its base (init_lora_weights): its adapter is exported as a LoRA of "
    "twice its rank and alpha on the base itself, by design"
)
RANDOM_BASE_NOTE = (
    "the base was built with random weights (init: random): the adapter means nothing on any "
    "other model; train on a pretrained base to try it in llama.cpp"
)
CONVERT = (
    "merge it (`expert-cli merge`) and convert the merged model with llama.cpp's "
    "convert_hf_to_gguf.py"
)


@dataclass
class GgufReport:
    """What `export-gguf` wrote (to_dict: its --json)."""

    path: Path
    architecture: str
    base: str
    adapter: str  # final or checkpoint-N
    pairs: int  # adapted projections, each a lora_a and a lora_b
    rank: int
    alpha: float
    outtype: str
    size: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "base_model": self.base,
            "adapter": self.adapter,
            "projections": self.pairs,
            "r": self.rank,
            "lora_alpha": self.alpha,
            "outtype": self.outtype,
            "size_bytes": self.size,
            "notes": self.notes,
        }


def export_gguf(
    run_dir: Path,
    output: Path | None = None,
    force: bool = False,
    checkpoint: str | None = None,
    outtype: str = "f16",
) -> GgufReport:
    """Write the run's adapter (`checkpoint`: checkpoint-N, final or best; else as `package`
    chooses) as a GGUF LoRA adapter; UserError for a run or adapter it cannot be made of."""
    run_dir = run_dir.absolute()
    if outtype not in OUT_TYPES:
        raise UserError(f"--outtype: expected one of {', '.join(OUT_TYPES)} (got {outtype!r})")
    problem = final_problem(run_dir)
    resolved = read_json_file(run_dir / "manifest.resolved.json")
    if problem and not resolved and not (run_dir / "manifest.resolved.json").exists():
        raise problem
    source, manifest_path = run_manifest(run_dir, resolved)
    chosen = chosen_checkpoint(run_dir, checkpoint, manifest_path, source)
    try:
        folder, said = shipped(run_dir, chosen, problem)
    except UserError as exc:
        raise UserError([as_exported(line) for line in exc.lines]) from None
    notes = [as_exported(n) for n in said]
    config, tensors = _lora_of(folder)
    base = adapter_base(folder, base_needed=False)
    arch, hparams = _architecture(base, resolved, folder)
    rank, alpha, pairs = _pairs(config, tensors, folder)
    stored, stored_notes = stored_tensors(_named(pairs, arch, hparams, folder), outtype)
    notes += stored_notes
    named = first_base(source).get("name")  # the manifest's base: the default name's
    named = named if isinstance(named, str) and named else base
    default = _default_name(source, named, outtype)
    path = resolved_path(output, "--output") if output else run_dir.parent / default
    _refuse_output(path, default, force, output is not None)
    if problem := data_folder_problem(path, run_dir, "the GGUF file") or inside_run_folders(
        path, run_dir
    ):
        raise UserError(problem)
    meta = {"name": str(source.get("name") or ""), "version": str(source.get("version") or "")}
    name = hub_id(named) if resolved.get("base_model_kind") == "hub" else None
    meta["base"] = name or Path(base).name  # a local folder's name, not where it lies
    meta["base_url"] = f"https://huggingface.co/{name}" if name else ""
    write_file(path, stored, (arch, alpha, outtype), meta, force)
    if decomposes(resolved.get("init_lora_weights")):
        notes.append(DECOMPOSED_NOTE)
    if resolved.get("init") == "random":
        notes.append(RANDOM_BASE_NOTE)
    step = checkpoint_step(folder) if chosen[0] != "final" else None
    adapter = chosen[0] if step is None else f"checkpoint-{step}"
    return GgufReport(
        path,
        arch,
        base,
        adapter,
        len(stored) // 2,
        rank,
        alpha,
        outtype,
        path.stat().st_size,
        notes,
    )


def _lora_of(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The adapter's configuration and tensors, a PiSSA or OLoRA run's as the standard LoRA of
    the base; UserError for an adapter llama.cpp cannot apply, or one that adds nothing."""
    config = read_json_file(folder / ADAPTER_FILES[1])
    kind = config.get("peft_type")
    where = f"--adapter {shown_path(folder)}"
    if kind != "LORA" or config.get("use_dora"):
        what = "DoRA" if kind == "LORA" else KINDS.get(str(kind), "of no kind peft names")
        raise UserError(
            f"{where}: the adapter is {what}, not a plain LoRA, which is all a GGUF adapter "
            f"holds and llama.cpp applies: {CONVERT}"
        )
    weights = folder / ADAPTER_FILES[0]
    if zero := unchanged_adapter(weights):
        raise UserError(
            f"{where}: every {zero} weight is still zero, so the adapter adds nothing to the "
            "base model (every step of its run had a learning rate of 0)"
        )
    try:
        if standard := standard_form(folder, run_of(folder) / INIT_WEIGHTS):
            data, config = standard
            return config, load_bytes(data)
        tensors, _ = tensors_of(weights)
    except (OSError, SafetensorError):  # removed meanwhile: a live run's rotation
        raise UserError(
            f"{where}: its weights cannot be read now (removed or replaced while export-gguf "
            "ran?); export again"
        ) from None
    return config, tensors


def _architecture(base: str, resolved: dict[str, Any], folder: Path) -> tuple[str, dict[str, int]]:
    """llama.cpp's name of the base's architecture and the sizes the names and Llama's row
    order need; UserError where its config.json is not here or not an architecture mapped."""
    config, problem = read_config(base, resolved.get("trust_remote_code") is True)
    on_hub = resolved.get("base_model_kind") == "hub" and hub_id(base) is not None
    if config is None and not on_hub:
        raise UserError(
            problem
            or f"base model {shown_path(base)}: the folder is not there (moved or removed "
            "since the run?), and the GGUF names need its config.json: put it back, then "
            "export again"
        )
    if config is None:
        raise UserError(
            problem
            or f"base model {base}: its config.json is not in the hub cache, and the GGUF "
            f"names need its architecture: download it (hf download {base} config.json), "
            "then export again"
        )
    named = getattr(config, "architectures", None) or []
    if not named:
        raise UserError(
            f"base model {shown_path(base)}: its config.json names no architecture "
            f"(`architectures`), which the GGUF names follow: one of {', '.join(ARCHITECTURES)}"
        )
    classes = [c for c in named if c in ARCHITECTURES]
    if not classes:
        known = ", ".join(ARCHITECTURES)
        raise UserError(
            f"--adapter {shown_path(folder)}: base model {shown_path(base)} is not of an "
            f"architecture export-gguf names the tensors of ({known}); {CONVERT}"
        )
    heads = int(config.num_attention_heads)
    return ARCHITECTURES[classes[0]], {
        "layers": int(config.num_hidden_layers),
        "heads": heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or heads),
    }


def _pairs(
    config: dict[str, Any], tensors: dict[str, torch.Tensor], folder: Path
) -> tuple[int, float, dict[str, dict[str, torch.Tensor]]]:
    """(r, alpha, module path -> its lora_A and lora_B in fp32, rsLoRA's sqrt(r) folded into
    B); UserError for tensors a GGUF adapter has no place for."""
    where = f"--adapter {shown_path(folder / ADAPTER_FILES[0])}"
    rank, alpha = config.get("r"), config.get("lora_alpha")
    patterned = [k for k in ("rank_pattern", "alpha_pattern") if config.get(k)]
    numbers = isinstance(rank, int) and rank > 0 and isinstance(alpha, int | float) and alpha > 0
    numbers = numbers and float(np.float32(alpha)) > 0  # stored as a 32-bit float
    if patterned or not numbers or isinstance(rank, bool):
        raise UserError(f"{where}: adapter_config.json: one r and one alpha expected")
    fold = math.sqrt(rank) if is_rslora(config) else 1.0
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, _, half = name.removeprefix("base_model.model.").rpartition(".")[0].rpartition(".")
        if half not in HALVES or not name.endswith(".weight"):
            raise UserError(
                f"{where}: holds {_shown(name)}, which is not a lora_A or lora_B of a linear "
                f"layer (a GGUF adapter has no place for it); {CONVERT}"
            )
        factor = fold if half == "lora_B" else 1.0
        pairs.setdefault(module, {})[half] = tensor.detach().to(torch.float32) * factor
    for module, halves in pairs.items():
        if len(halves) != 2 or halves["lora_A"].shape[0] != halves["lora_B"].shape[1]:
            raise UserError(f"{where}: {_shown(module)}: lora_A and lora_B do not make a pair")
    if not pairs:
        raise UserError(f"{where}: holds no lora_A or lora_B weights")
    return rank, float(alpha), pairs


def _named(
    pairs: dict[str, dict[str, torch.Tensor]], arch: str, hparams: dict[str, int], folder: Path
) -> dict[str, np.ndarray]:
    """llama.cpp's tensor name -> its fp32 values, Llama's q and k rows reordered."""
    kind = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(kind, hparams["layers"])
    written: dict[str, np.ndarray] = {}
    for module, halves in sorted(pairs.items(), key=lambda kv: _order(kv[0])):
        name = names.get_name(f"{module}.weight", try_suffixes=(".weight",))
        if name is None or not name.startswith("blk."):
            raise UserError(
                f"--adapter {shown_path(folder)}: adapts {_shown(module)}, which is not a "
                f"projection of {arch}'s decoder layers (export-gguf writes those only); "
                f"{CONVERT}"
            )
        b = halves["lora_B"]
        if arch in ROTARY_REORDERED and module.rsplit(".", 1)[-1] in ("q_proj", "k_proj"):
            heads = hparams["heads"] if module.endswith("q_proj") else hparams["kv_heads"]
            b = rotary_rows(b, heads)
        written[f"{name}.lora_a"] = halves["lora_A"].contiguous().numpy()
        written[f"{name}.lora_b"] = b.contiguous().numpy()
    return written


def rotary_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """A q or k projection's output rows in llama.cpp's rotary order: within each head, the
    two halves of the head's dimensions interleaved (as its converter reorders a Llama
    checkpoint's q_proj and k_proj; applied to lora_B, it reorders B A alike)."""
    out = rows.shape[0]
    return (
        rows.reshape(heads, 2, out // heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def _order(module: str) -> tuple[int, str]:
    """Layer by layer, then by name: the file lists a layer's tensors together."""
    parts = module.split(".")
    layer = next((int(p) for p in parts if p.isdigit()), -1)
    return layer, module


def _shown(name: str) -> str:
    """A tensor or module name as a message shows it (at most 120 characters)."""
    return name if len(name) <= 120 else name[:117] + "..."


def _default_name(source: dict[str, Any], base: str, outtype: str) -> str:
    """`{name}-{base}.v{version}-lora-{outtype}.gguf`, named as the run's package is."""
    return package_name(source, base).removesuffix(".expert") + (f"-lora-{outtype}.gguf")


def _refuse_output(path: Path, default: str, force: bool, given: bool) -> None:
    if path.is_dir():
        raise UserError(
            f"--output {shown_path(path)}: is a folder; give the file's name, e.g. "
            f"{shown_path(path / default)}"
        )
    if path.suffix != ".gguf":
        raise UserError(f"--output {shown_path(path)}: a GGUF file's name ends in .gguf")
    if problem := new_file_problem(path, "--output", force):
        if not given:  # the default name: no --output was given to choose another
            problem = problem.replace("--output ", "the default file ", 1).replace(
                "choose another name or --force", "give --output, or --force to replace it"
            )
        raise UserError(problem)
