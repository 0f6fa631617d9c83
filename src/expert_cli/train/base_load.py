"""A pretrained base model read from its files, its weights held against its config.json.

transformers loads a base whose files lack weights its config asks for (a config.json edited
for more layers, a head missing) by giving those weights random values, and tells it only in
a "LOAD REPORT" table on the console: training then went on on a partly random model and
exited 0. Weights of another shape than the config gives ended in a traceback from inside the
loader. Here the loader's account (`output_loading_info`) is read instead: weights missing or
of another shape are a UserError naming the base and the first such weight (names and shapes
only, from the model and the files' headers); weights in the files that the config has no
place for are a note (a checkpoint may carry a part the causal LM does not use).
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, PreTrainedModel

from expert_cli.errors import UserError
from expert_cli.paths import shown_path
from expert_cli.train.memory import out_of_memory
from expert_cli.weights import damaged_weights, shown_tensor, weights_error

NAMED = 2  # weights named in a line; the rest counted
# what transformers' loader raises on files it cannot make a model of (a .bin archive cut
# short or holding other objects, a generation_config.json out of bounds); TypeError,
# AttributeError and KeyError are left to say a bug where one is (ours, a library's, remote
# code's)
LOADER_ERRORS = (RuntimeError, ValueError, EOFError, zipfile.BadZipFile, pickle.UnpicklingError)
# what building the modules raises on config.json values no model takes (a pad_token_id past
# the vocabulary: an embedding's assertion; a head_dim of 0: a division)
BUILD_ERRORS = (AssertionError, ZeroDivisionError)


def load_pretrained(source: str, kwargs: dict[str, Any], notes: list[str]) -> PreTrainedModel:
    """`AutoModelForCausalLM.from_pretrained(source, **kwargs)` whose weights all came from
    the files at the config's shapes; a note in `notes` for weights the config has no place
    for. Files the loader refuses are a UserError naming them by the kind of error it raised
    (its message can quote a file: a pickle's globals); the files are judged before, once, by
    the caller (`base_file_problems`: train's data step, `load_adapted`), not again at each
    attention kernel tried."""
    local = Path(source).is_dir()
    try:
        with warnings.catch_warnings():  # a base stored quantized: its own quantization
            # applies, which the manifest's was checked to match (adapter.py)
            warnings.filterwarnings("ignore", "You passed `quantization_config`")
            model, info = AutoModelForCausalLM.from_pretrained(
                source, output_loading_info=True, ignore_mismatched_sizes=True, **kwargs
            )
    except (OSError, SafetensorError, ImportError, *LOADER_ERRORS, *BUILD_ERRORS) as exc:
        if (error := _load_error(source, local, exc)) is None:
            raise  # an attention kernel the model refuses (the caller tries the next), memory
        raise error from None
    if problem := weights_problem(source, info) or _unquantized_problem(model, source):
        raise UserError(problem)
    if extra := sorted(info.get("unexpected_keys") or ()):
        note = (
            f"base model {shown_path(source)}: {_named(extra)} in its weights files "
            f"{'match' if len(extra) > 1 else 'matches'} no layer of its config.json; not "
            "loaded (was config.json edited?)"
        )
        if note not in notes:  # the same files loaded again for another attention kernel
            notes.append(note)
    return model


def _load_error(source: str, local: bool, exc: BaseException) -> UserError | None:
    """The UserError naming what in the base's files the loader refused, by the kind of
    error (its message can quote a file: a pickle's globals); None for what is not the
    files: an attention kernel the model does not take, memory."""
    shown = f"base model {shown_path(source)}"
    said = str(exc).lower()
    kernel = isinstance(exc, (ValueError, ImportError)) and ("attn" in said or "attention" in said)
    if kernel or out_of_memory(exc):  # as _with_attention_fallback reads a kernel refused
        return None
    if isinstance(exc, SafetensorError):  # a weights file cut short: named from its header
        damaged = damaged_weights(Path(source)) if local else []
        return UserError(weights_error(source, damaged or ["a .safetensors file is damaged"]))
    if isinstance(exc, pickle.UnpicklingError):  # torch's weights_only refusing an object
        return UserError(
            f"{shown}: its .bin weights hold objects other than tensors, which torch does not "
            "load (weights_only); use its safetensors weights"
        )
    if isinstance(exc, BUILD_ERRORS):
        return UserError(
            f"{shown}: its config.json holds values no model can be built from "
            f"({type(exc).__name__} as its layers were made: a pad_token_id past vocab_size, "
            "a size of 0?); use the config.json its weights were saved with"
        )
    if isinstance(exc, ImportError):  # a library its configuration needs
        return UserError(f"{shown}: loading it needs a package that is not installed ({exc})")
    if isinstance(exc, OSError):  # transformers' own lines: a file it looked for, not found
        return UserError(f"base model {source}: cannot be loaded ({exc})")
    return UserError(
        f"{shown}: its files cannot be loaded ({type(exc).__name__}); download or copy the "
        "model again"
    )


def weights_problem(source: str, info: dict[str, Any]) -> str | None:
    """Why a model loaded with this loading info is not the base its files hold: weights its
    config asks for that the files lack (they would start random), or weights of another
    shape; None when neither."""
    where = f"base model {shown_path(source)}"
    if missing := sorted(info.get("missing_keys") or ()):
        return (
            f"{where}: {_named(missing)} of its config.json are not in its weights files, so "
            "they would start random. Was config.json edited (more layers, another size), or "
            "is a weights file missing (or left out of the shards' index)? Use the config.json "
            "and the files the weights were saved with"
        )
    if mismatched := sorted(info.get("mismatched_keys") or (), key=lambda m: m[0]):
        name, in_files, in_config = mismatched[0]
        count = f"{len(mismatched)} weights have" if len(mismatched) > 1 else "a weight has"
        return (
            f"{where}: {count} another shape in its weights files than its config.json gives "
            f"({name}: {_shape(in_files)} in the files, {_shape(in_config)} by the config). "
            "Was config.json edited? Use the config.json the weights were saved with"
        )
    return None


def _unquantized_problem(model: Any, source: str) -> str | None:
    """A config.json saying the weights are stored in bitsandbytes 4-bit over files of
    full-precision weights: transformers put them in its 4-bit layers unquantized, and peft
    failed on them (an AttributeError traceback)."""
    for module in model.modules():
        if type(module).__name__ == "Linear4bit":
            if getattr(module.weight, "quant_state", None) is not None:
                return None
            return (
                f"base model {shown_path(source)}: its config.json says its weights are stored "
                "in 4-bit (bitsandbytes), but its weights files hold full-precision weights: "
                "remove quantization_config from config.json (quantization int4 quantizes "
                "them as they load)"
            )
    return None


def _named(names: list[str]) -> str:
    """'3 weights (a, b, ...)': a count and the first NAMED names."""
    shown = ", ".join(shown_tensor(n) for n in names[:NAMED]) + (", ..." * (len(names) > NAMED))
    return f"{len(names)} weight{'s' if len(names) != 1 else ''} ({shown})"


def _shape(shape: Any) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def four_bit_kind(model: Any) -> str:
    """How a model's 4-bit weights are quantized, from its first 4-bit layer ("nf4 + double
    quantization"): the manifest's settings, or a base stored 4-bit's own."""
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None:
            return f"{state.quant_type}{' + double quantization' if state.nested else ''}"
    return "4-bit"


def four_bit_compute(model: Any, dtype: Any) -> None:
    """Every 4-bit layer computes in the run's `dtype`: a base stored in 4-bit brings its own
    (float16, or bitsandbytes' float32 where its config gives none), so the run said "bf16
    compute" while peft's layers computed in the stored one (and the fused kernel in bf16)."""
    for module in model.modules():
        if getattr(getattr(module, "weight", None), "quant_state", None) is not None:
            module.compute_dtype = dtype
