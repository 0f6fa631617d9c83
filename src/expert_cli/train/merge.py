"""`expert-cli merge`: fold a trained adapter into its base model, save a standalone model.

The base model is the one named in the adapter's `adapter_config.json` (for a random-init
base, the `base_model/` folder the training run wrote beside the adapter). The merged model
is saved as safetensors with the adapter's tokenizer, written to a temporary folder first.
"""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from peft.utils import get_peft_model_state_dict
from safetensors import SafetensorError
from transformers.utils import logging as hf_logging

from expert_cli.atomic import atomic_folder, parents_made, usual_mode
from expert_cli.config.resolve import ResolvedConfig
from expert_cli.data.model_files import base_file_problems
from expert_cli.data.tokenizer import config_problem
from expert_cli.errors import RunError, UserError
from expert_cli.paths import place_problem, resolved_path, shown_path
from expert_cli.train.base_load import load_pretrained
from expert_cli.train.checkpoints import complete_checkpoints, refuse_incomplete, sound_checkpoints
from expert_cli.train.lora_init import INIT_WEIGHTS, standard_folder
from expert_cli.train.memory import out_of_memory
from expert_cli.train.outputs import (
    ADAPTER_WEIGHTS,
    adapter_base,
    data_folder_problem,
    held_by_another,
    read_json_file,
    run_of,
    unfinished,
    writing_now,
)
from expert_cli.train.prompt_format import prompt_format
from expert_cli.train.ship_choice import inside_run_folders
from expert_cli.train.tokenizer_files import Stops, layout_stops, saved_tokenizer
from expert_cli.weights import tensor_shapes

# what renaming the merged model over --output answers when files were put there meanwhile
TAKEN = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR)
STORED = "its weights are stored quantized"  # said where load_adapted dequantized them
LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, SafetensorError)


def load_adapted(
    adapter: Path, base_name: str, dtype: Any, notes: list[str] | None = None
) -> PeftModel:
    """The base model with the run's adapter on it (a hub base at the revision the run pinned,
    with its remote code where the run trusted it); a base or adapter that cannot be loaded is
    a UserError naming it (and the kind of failure, never the file's bytes). A base whose
    weights are stored quantized (bitsandbytes) is dequantized first, with a note in `notes`:
    the weights the run trained against, in a form merge can save."""
    hf_logging.disable_progress_bar()  # its bars would interleave with the command's lines
    options = _base_options(adapter, base_name)
    # a config.json edited or replaced since the run (transformers' strict configs raise
    # errors of their own kind): named as check names it
    if problem := config_problem(base_name, options["trust_remote_code"]):
        raise UserError(problem)
    kind = "local" if Path(base_name).is_dir() else "hub"  # a shard missing, an LFS pointer
    if problems := base_file_problems(base_name, kind, options.get("revision")):
        raise UserError(problems)
    try:
        # weights missing from the files or of another shape than the config's: a UserError
        noted = notes if notes is not None else []  # weights the config has no place for
        base = load_pretrained(base_name, {"dtype": dtype, **options}, noted)
    except LOAD_ERRORS as exc:
        if out_of_memory(exc):  # not the user's input: the CLI says so in one line
            raise
        raise UserError(
            f"{adapter / 'adapter_config.json'}: base model {base_name} cannot be loaded "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    base = _dequantized(base, base_name, dtype, notes if notes is not None else [])
    try:
        with warnings.catch_warnings():  # AdaLoRA saves its rank pattern under the adapted
            # weights' names, which peft's check reads as module names: noise, shapes are right
            warnings.filterwarnings("ignore", "The following rank_pattern keys", RuntimeWarning)
            with standard_folder(adapter, run_of(adapter) / INIT_WEIGHTS) as readable:
                peft_model = PeftModel.from_pretrained(base, str(readable))
    except LOAD_ERRORS as exc:
        if out_of_memory(exc):
            raise
        raise UserError(
            f"--adapter {adapter}: cannot load the adapter on {base_name} ({type(exc).__name__})"
        ) from None
    if unmatched := _unmatched_weights(peft_model, adapter):
        raise UserError(
            f"{adapter / ADAPTER_WEIGHTS[0]}: {unmatched} adapter weights match no layer of base "
            f"model {shown_path(base_name)} (is it the model the run trained on? its config.json "
            "may have changed since)"
        )
    return peft_model


def _dequantized(base: Any, base_name: str, dtype: Any, notes: list[str]) -> Any:
    """`base` with weights stored quantized (a bitsandbytes 4-bit or 8-bit checkpoint) in
    `dtype` (else their compute dtype): transformers cannot save a model merged into 4-bit
    weights (a NotImplementedError traceback), and these are the weights the run trained
    against, which the adapter is then exact on."""
    if not getattr(base, "is_quantized", False):
        return base
    stored = getattr(base.config, "quantization_config", None)
    compute = getattr(stored, "bnb_4bit_compute_dtype", None)
    to = dtype if isinstance(dtype, torch.dtype) else compute
    to = to if isinstance(to, torch.dtype) else torch.bfloat16
    try:
        base = base.dequantize(dtype=to).to(to)  # its other weights (norms) in `to` too
    except (ValueError, NotImplementedError, RuntimeError) as exc:
        raise UserError(
            f"base model {shown_path(base_name)}: its weights are stored quantized and cannot "
            f"be dequantized ({type(exc).__name__}); use the model's full-precision weights"
        ) from None
    notes.append(
        f"base model {shown_path(base_name)}: {STORED}; the adapter "
        f"is on them dequantized to {str(to).removeprefix('torch.')} (the weights the run "
        "trained against)"
    )
    return base


def dequantized(notes: list[str]) -> bool:
    """Whether `load_adapted`'s notes say it dequantized a base stored quantized."""
    return any(STORED in note for note in notes)


def _unmatched_weights(peft_model: PeftModel, adapter: Path) -> int:
    """How many tensors of the adapter's safetensors file the loaded model has no place for:
    peft loads the rest and leaves those out without a word (a base with fewer layers than
    the run's answered with part of the adapter)."""
    path = adapter / ADAPTER_WEIGHTS[0]
    saved = tensor_shapes(path) if path.is_file() else None
    if not saved:
        return 0
    # embedding layers named whether the run saved them or not (only names are compared);
    # "auto" would look for the base's config.json on the hub
    with warnings.catch_warnings():  # AdaLoRA's modules pruned to rank 0: shapes (0, in)
        warnings.filterwarnings("ignore", "Adapter .* LoRA tensor")
        names = get_peft_model_state_dict(peft_model, save_embedding_layers=True)
    return len(set(saved) - set(names))


def _base_options(adapter: Path, base_name: str) -> dict[str, Any]:
    """How the run loaded its base (manifest.resolved.json): the revision of a hub base (the
    hub's main may be another model by now) and trust_remote_code."""
    data = read_json_file(run_of(adapter) / "manifest.resolved.json")
    options: dict[str, Any] = {"trust_remote_code": data.get("trust_remote_code") is True}
    revision = data.get("revision")
    on_hub = data.get("base_model_kind") == "hub" and data.get("base_model") == base_name
    if on_hub and isinstance(revision, str) and revision:
        options["revision"] = revision
    return options


def merged(peft_model: PeftModel) -> Any:
    """The adapter folded into its base. On a model whose input and output embeddings share
    one matrix, an adapter on either trained that one alone: folded into the shared matrix it
    changed both (top-token agreement with the adapted model fell to 88%), so the output
    embedding gets its own copy first (the merged model holds both matrices)."""
    base = peft_model.get_base_model()
    out, into = base.get_output_embeddings(), base.get_input_embeddings()
    adapted = hasattr(out, "base_layer") or hasattr(into, "base_layer")
    if adapted and getattr(base.config, "tie_word_embeddings", False):
        layer = getattr(out, "base_layer", out)
        layer.weight = torch.nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
        base.config.tie_word_embeddings = False
    return peft_model.merge_and_unload()


def refuse_folder_output(output: Path) -> None:
    """UserError naming --output unless it is a new or empty folder that can be written (checked
    before the model is loaded, which takes minutes)."""
    shown = shown_path(output)
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {shown}: is not a folder; give a new or empty folder")
    try:
        occupied = output.is_dir() and any(output.iterdir())
    except OSError as exc:
        raise UserError(f"--output {shown}: cannot be listed ({exc.strerror})") from None
    if occupied:
        raise UserError(f"--output {shown}: exists and is not empty; choose a new folder")
    problem = place_problem(output, "--output")
    if problem:
        raise UserError(problem)


def _run_facts(adapter: Path) -> tuple[str | None, Any]:
    """From the run's manifest.resolved.json (a checkpoint's run says): its base-weight
    quantization, and the dtype its base weights trained in, which the merged model is saved
    in (a quantized run: the precision the base is published in; nothing, and float32, where
    it cannot be read)."""
    data = read_json_file(run_of(adapter) / "manifest.resolved.json")
    quantization = data.get("quantization")
    runtime = data.get("runtime")
    model = runtime.get("model") if isinstance(runtime, dict) else None
    name = model.get("dtype") if isinstance(model, dict) else None
    quantized = quantization if quantization in ("int4", "int8") else None
    if name in ("bfloat16", "float16", "float32"):
        dtype: Any = getattr(torch, name)
    else:  # a quantized run's weights: the precision the base model is published in
        dtype = "auto" if quantized else torch.float32
    return quantized, dtype


def _stop_at_end_of_turn(model: Any, tokenizer: Any, ids: list[int]) -> list[str]:
    """The merged model's generation_config.json stops where `generate` stops (`ids`): a base
    whose config stops at <|endoftext|> alone answered a ChatML expert's turn past its
    <|im_end|> in any runtime that reads the file."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return []
    eos = config.eos_token_id
    given = [eos] if isinstance(eos, int) else list(eos or [])
    added = [i for i in ids if i not in given]
    if not added:
        return []
    config.eos_token_id = given + added if given or len(added) > 1 else added[0]
    shown = ", ".join(tokenizer.convert_ids_to_tokens(added))
    return [f"generation_config.json: the merged model stops at {shown} too, as generate does"]


def _run_stops(adapter: Path, tokenizer: Any) -> Stops:
    """Where `generate` ends this run's answers: its prompt layout's markers too (the
    tokenizer's own stops where the run's configuration cannot be read)."""
    data = read_json_file(run_of(adapter) / "manifest.resolved.json")
    runtime = data.pop("runtime", None)
    try:
        resolved = ResolvedConfig.model_validate(data)
    except ValueError:  # generate names the file; merge needs none of it
        return layout_stops(tokenizer, ())
    record = runtime.get("data") if isinstance(runtime, dict) else None
    return layout_stops(tokenizer, prompt_format(resolved, tokenizer, record)[0].stops)


def _text_stops(texts: tuple[str, ...]) -> list[str]:
    """A note where the run's answers end with a marker its tokenizer has no token for (text
    data of `<|end|>` turns on Qwen's tokenizer): generate stops at it as text, which
    generation_config.json cannot say (stop_strings there make transformers' generate ask for
    the tokenizer on every call)."""
    if not texts:
        return []
    shown = ", ".join(texts)
    listed = ", ".join(repr(t) for t in texts)
    return [
        f"the run's answers end at {shown}, which the tokenizer writes as several tokens: "
        "generation_config.json cannot stop there, so stop at it in the runtime (transformers: "
        f"generate(..., stop_strings=[{listed}], tokenizer=tokenizer); vLLM: stop=[{listed}])"
    ]


SAVED_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _refuse_overflow(model: Any, saved: str) -> None:
    """UserError where a weight cast to `saved` is no longer finite (fp16 holds at most
    65504; a bf16-trained base may hold more): nothing is written."""
    bad = sum(
        int((~p.isfinite()).sum()) for p in model.state_dict().values() if p.is_floating_point()
    )
    if bad:
        raise UserError(
            f"--dtype {saved}: {bad:,} merged weight{'' if bad == 1 else 's'} outside {saved}'s "
            "range would be saved as infinity; use --dtype bf16 or fp32 (nothing written)"
        )


def merge_adapter(adapter: Path, output: Path, saved: str | None = None) -> tuple[Path, list[str]]:
    """Load base + adapter (full precision weights, even if trained quantized), merge, save;
    the folder written and notes (a base trained quantized is merged at full precision).
    `saved` (bf16, fp16, fp32): the dtype the merged weights are saved in, merged in fp32
    first (the adapter's update is far below bf16's rounding of a weight); default: the
    dtype the base trained in."""

    adapter = resolved_path(adapter, "--adapter")
    output = resolved_path(output, "--output")
    refuse_unfinished(adapter)  # a run without its final adapter, that has checkpoints
    refuse_incomplete(adapter)  # a checkpoint written in part: before its files are judged
    base_name = adapter_base(adapter)
    refuse_folder_output(output)
    quantization, dtype = _run_facts(adapter)
    dtype = torch.float32 if saved else dtype  # merged in fp32, then cast once
    run = run_of(adapter)
    if problem := data_folder_problem(output, run, "the merged model's files") or (
        inside_run_folders(output, run)
    ):
        raise UserError(problem)
    tokenizer = saved_tokenizer(adapter, run_of(adapter))  # before the model: errors first
    notes: list[str] = []
    model = merged(load_adapted(adapter, base_name, dtype, notes))
    if quantization and not dequantized(notes):  # quantized by the run from full weights
        notes.append(
            f"quantization: the run trained against {quantization} base weights; they are "
            "merged at full precision (the adapter on the unquantized base)"
        )
    if saved:
        model = model.to(SAVED_DTYPES[saved])
        _refuse_overflow(model, saved)
    stops = _run_stops(adapter, tokenizer)
    notes += _stop_at_end_of_turn(model, tokenizer, stops.ids) + _text_stops(stops.texts)
    try:
        with (
            parents_made(output),
            atomic_folder(output) as tmp,
        ):  # an existing `output` is empty, checked above
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            usual_mode(tmp)
    except (OSError, SafetensorError) as exc:  # a full disk: not the user's input; nothing
        # half-written is kept (safetensors' writer raises its own error for it)
        if isinstance(exc, OSError) and exc.errno in TAKEN and os.path.lexists(output):
            raise UserError(
                f"--output {shown_path(output)}: something was put there while merge ran; it "
                "is left as it is and the merged model was not kept; give a new or empty folder"
            ) from None
        reason = getattr(exc, "strerror", None) or (
            "No space left on device" if "No space left" in str(exc) else None
        )
        if reason is None:  # safetensors refusing the tensors: not the disk, shown as it is
            raise
        raise RunError(f"--output {shown_path(output)}: cannot be written ({reason})") from None
    return output, notes


def refuse_unfinished(adapter: Path) -> None:
    """UserError when `adapter` is a run folder without its final adapter that holds complete
    checkpoints: a run `train` is writing now, or one stopped before its end (the latest
    checkpoint with sound weights named, and how to finish the run). Other folders without
    an adapter are left to `adapter_base`."""
    adapter = adapter.absolute()
    held = complete_checkpoints(adapter / "checkpoints")
    if not held or not adapter.is_dir() or (adapter / "adapter_config.json").exists():
        return
    shown = shown_path(adapter)
    if held_by_another(adapter):
        raise UserError(
            f"{writing_now(adapter)} (a checkpoint it wrote can be given meanwhile: "
            f"--adapter {shown_path(held[-1])})"
        )
    sound = sound_checkpoints(adapter / "checkpoints")
    finish = "finish the run: `expert-cli train` with the same --output and --resume"
    if not sound:
        raise UserError(
            f"--adapter {shown}: {unfinished(adapter)}, and none of its checkpoints holds "
            f"sound weights; {finish}"
        )
    raise UserError(
        f"--adapter {shown}: {unfinished(adapter)}; give one of "
        f"its checkpoints (--adapter {shown_path(sound[-1])}; sound: "
        f"{', '.join(p.name for p in sound[-8:])}) or {finish}"
    )
