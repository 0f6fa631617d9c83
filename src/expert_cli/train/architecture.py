"""The base model's architecture, built from its config.json on the meta device (no weights
read, no memory used), so that `check` and `train` find a configuration no model can be built
from, or one whose weights alone cannot fit this machine, before any weights load or any data
is tokenized. A malformed config used to surface as a traceback from deep inside transformers
(a negative size, zero attention heads) or as the process killed for memory."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.utils.quantization_config import QuantizationMethod

from expert_cli.data.tokenizer import read_config
from expert_cli.paths import shown_path

if TYPE_CHECKING:
    from expert_cli.config.resolve import ResolvedConfig

# bytes per weight at the least, by quantization: a lower bound, so the check never refuses
# a model that would fit
WEIGHT_BYTES = {"int4": 0.5, "int8": 1.0}
HALF_BYTES = 2.0
SHARDED = ("fsdp", "deepspeed")
SIZES = "hidden_size, intermediate_size, num_attention_heads, num_hidden_layers, vocab_size"


def meta_model(resolved: ResolvedConfig, source: str) -> tuple[Any | None, str | None]:
    """(the architecture at `source` on the meta device, None), or (None, why it cannot be
    built). (None, None) when its configuration is not here to read: a hub model not yet in
    the cache, reported by the hub checks."""
    config, problem = read_config(source, resolved.trust_remote_code)
    if config is None:
        return None, problem
    shown = f"base model {shown_path(source)}"
    if problem := no_causal_class(config, resolved.trust_remote_code, shown):
        return None, problem
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, trust_remote_code=resolved.trust_remote_code
            )
    except Exception as exc:  # noqa: BLE001 - a negative size, no heads, an unknown type...
        return None, (
            f"{shown}: no model can be built from its config.json ({type(exc).__name__}); "
            f"check its sizes ({SIZES}) and its other settings (rope_scaling, ...)"
        )
    return model, None


def model_type(model_or_config: Any) -> str:
    """' (model type X)' for an architecture transformers knows, else '' (a remote-code
    config's type is the file's text, never quoted)."""
    config = getattr(model_or_config, "config", model_or_config)
    kind = getattr(config, "model_type", None)
    return f" (model type {kind})" if isinstance(kind, str) and kind in CONFIG_MAPPING_NAMES else ""


def no_causal_class(config: Any, remote_code: bool, shown: str) -> str | None:
    """Why transformers has no causal-LM class for `config` (an encoder-decoder such as T5, a
    vision or audio model); None when it has one (or remote code may bring its own)."""
    auto_map = getattr(config, "auto_map", None) or {}
    if remote_code and "AutoModelForCausalLM" in auto_map:
        return None
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return None
    what = (
        "an encoder-decoder model"
        if getattr(config, "is_encoder_decoder", False)
        else "a model transformers cannot load as a causal language model"
    )
    return (
        f"{shown}{model_type(config)}: {what} (AutoModelForCausalLM has no class for it). "
        "expert-cli trains adapters for decoder-only language models (Qwen3, Llama, Mistral, "
        "...)"
    )


def not_causal(shown: str) -> str:
    """The refusal of an encoder given as the base model (`shown` names it)."""
    return (
        f"{shown}: every position attends to the tokens after it (an encoder such as BERT, "
        "not a causal language model), so an adapter trained on it learns to copy the next "
        "token, not to predict it. Use a decoder-only model (Qwen3, Llama, Mistral, ...)"
    )


def encoder_problem(model: Any, source: str) -> str | None:
    """Why `model` (built on the meta device) is an encoder: its config keeps transformers'
    `is_decoder` switch off and none of its attention layers is causal (BERT, RoBERTa,
    ELECTRA... built as a causal LM). None otherwise; the loaded model's probe
    (`causality.attention_isolation`) is the final word."""
    config = model.config
    if getattr(config, "is_decoder", None) is not False or getattr(
        config, "is_encoder_decoder", False
    ):
        return None
    flags = [
        m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)
    ]
    if not flags or any(flags):
        return None
    return not_causal(f"base model {shown_path(source)}{model_type(config)}")


def embedding_rows(model: Any) -> int | None:
    """Rows of the model's input embedding; None where the architecture does not say (some
    remote-code models raise NotImplementedError for get_input_embeddings)."""
    try:
        rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    except (NotImplementedError, AttributeError):
        return None
    return rows if isinstance(rows, int) else None


def vocabulary_problem(model: Any, tokens: int, source: str) -> str | None:
    """Why ids below `tokens` (those every run uses: `data.tokenizer.ids_in_use`) cannot all
    index the model's embedding (a tokenizer from another model, a config.json with another
    vocab_size): the first example holding a larger id would stop the run with an IndexError.
    None when they fit, or when the embedding's size is not known."""
    rows = embedding_rows(model)
    if rows is None or tokens <= rows:
        return None
    return (
        f"base model {shown_path(source)}: its tokenizer uses {tokens:,} token ids, its "
        f"embedding has {rows:,} rows (config.json vocab_size); ids from {rows:,} up have no "
        "embedding. Use the tokenizer saved with the model, or a config.json whose "
        f"vocab_size is at least {tokens:,}"
    )


POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")  # GPT-2, OPT, GPT-Neo...


def positions_problem(model: Any, max_seq_length: int, source: str) -> str | None:
    """Why rows of `max_seq_length` tokens cannot run on a model whose positions are a table
    of learned embeddings (GPT-2, OPT, GPT-Neo, BioGPT) shorter than the rows: a longer
    example indexes past it mid-step. Rotary and ALiBi models run past their configured
    length, so they are not judged. None when the rows fit."""
    limit = getattr(model.config, "max_position_embeddings", None)
    learned = any(
        name.rsplit(".", 1)[-1] in POSITION_TABLES and isinstance(module, torch.nn.Embedding)
        for name, module in model.named_modules()
    )
    if not learned or not isinstance(limit, int) or max_seq_length <= limit:
        return None
    return (
        f"training.config.max_seq_length: {max_seq_length:,} is over the {limit:,} positions "
        f"base model {shown_path(source)} has learned (its position table ends there: a "
        f"longer example would index past it); use {limit:,} or less"
    )


def positions_note(model: Any, longest: int, source: str) -> str | None:
    """The data's longest example past the positions the model is configured for (a rotary
    model runs there untrained; a learned table was refused before the data was read)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit < longest:
        return None
    return (
        f"base model {shown_path(source)}: the data's longest example is {longest:,} tokens, "
        f"over the {limit:,} positions it is configured for (max_position_embeddings): "
        "positions it was not pretrained on are trained, and `generate` refuses prompts "
        f"of {limit:,} tokens or more"
    )


def cache_id_problem(model: Any, largest: int | None, source: str) -> str | None:
    """Why the token cache's `largest` id has no row in the model's embedding (a token the
    tokenizer added past the model's vocabulary appears in the data); None when it has."""
    rows = embedding_rows(model)
    if rows is None or largest is None or largest < rows:
        return None
    return (
        f"base model {shown_path(source)}: the tokenized data holds token id {largest:,}, its "
        f"embedding has {rows:,} rows: a token the tokenizer added past the model's "
        "vocabulary appears in the data. Use the tokenizer saved with the model, or remove "
        "that token from the data"
    )


# An embedding row whose largest magnitude is under this share of the median row's: a row
# pretraining never reached (zero, or decayed towards it)
UNTRAINED_SHARE = 1e-3
SHOWN_TOKENS = 3


def untrained_added_tokens(model: Any, tokenizer: Any) -> dict[int, str]:
    """Tokens added past the tokenizer's base vocabulary whose input or output embedding row
    is all but zero beside the base vocabulary's rows (Llama 3's base model ships its chat
    markers so): by id, their text. The embedding's padding row is zero by design."""
    base = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=False)
    rows = embedding_rows(model) or 0
    padding = getattr(model.get_input_embeddings(), "padding_idx", None)
    added = {
        i: str(t)
        for i, t in tokenizer.added_tokens_decoder.items()
        if base <= i < rows and i != padding
    }
    if not added or base < 1:
        return {}
    untrained: set[int] = set()
    for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or weight.shape[0] != rows:
            continue  # not a plain matrix here (quantized, sharded, on the meta device)
        with torch.no_grad():
            peak = weight.detach().abs().amax(dim=1).float()
            ids = torch.tensor(sorted(added), device=peak.device)
            small = ids[peak[ids] <= UNTRAINED_SHARE * peak[:base].median()]
        untrained |= set(small.tolist())
    return {i: added[i] for i in sorted(untrained)}


def untrained_tokens_note(model: Any, tokenizer: Any, present: Any) -> str | None:
    """A note when the data holds added tokens whose embedding rows training never reached:
    an adapter leaves those rows as they are, so the run cannot teach them. `present(ids)`
    says which of `ids` the data holds."""
    untrained = untrained_added_tokens(model, tokenizer)
    held = sorted(present(list(untrained))) if untrained else []
    if not held:
        return None
    named = ", ".join(f"{untrained[i]!r} ({i:,})" for i in held[:SHOWN_TOKENS])
    more = f" and {len(held) - SHOWN_TOKENS} more" if len(held) > SHOWN_TOKENS else ""
    return (
        f"tokens {named}{more} appear in the data, but their embedding rows in the base model "
        "are all but zero (never trained), and an adapter leaves them as they are: use a base "
        "model trained with them (its instruct version) or data without them"
    )


def memory_problem(resolved: ResolvedConfig, model: Any, memory_bytes: int | None) -> str | None:
    """Why the weights alone (at their least: half precision, or the quantized size) cannot
    fit `memory_bytes`, the memory of the device that will hold them; None when they can,
    and for a strategy that shards them (FSDP, DeepSpeed)."""
    strategy = (resolved.distributed or {}).get("strategy")
    if not memory_bytes or strategy in SHARDED:
        return None  # sharded over GPUs (or offloaded): no one device holds them all
    params = sum(p.numel() for p in model.parameters())
    need = params * WEIGHT_BYTES.get(resolved.quantization, HALF_BYTES)
    if need <= memory_bytes:
        return None
    return (
        f"base model {shown_path(resolved.base_model)}: its config.json describes "
        f"{params / 1e9:,.1f} B parameters, at least {need / 2**30:,.0f} GiB of weights; this "
        f"machine's {'GPU' if torch.cuda.is_available() else 'memory'} holds "
        f"{memory_bytes / 2**30:,.0f} GiB. Check its sizes ({SIZES}), or use a smaller model"
    )


def stored_quantization_problem(resolved: ResolvedConfig, config: Any) -> str | None:
    """Why a base whose config.json says its weights are stored quantized cannot be trained
    as the manifest asks: bitsandbytes 4-bit or 8-bit weights need the manifest's
    quantization to say so (loaded as they are, the run reported full weights in another
    dtype, and skipped QLoRA's preparation); other methods (GPTQ, AWQ, FP8...) are not
    trained on. None for full weights, and for a random init (built from the sizes alone)."""
    stored = getattr(config, "quantization_config", None)
    if stored is None or resolved.init != "pretrained":
        return None
    fields = stored if isinstance(stored, dict) else getattr(stored, "__dict__", {})
    method = str(getattr(fields.get("quant_method"), "value", fields.get("quant_method")))
    if "quant_method" not in fields and ("load_in_4bit" in fields or "load_in_8bit" in fields):
        method = QuantizationMethod.BITS_AND_BYTES.value  # an older config: transformers reads
        # load_in_4bit/load_in_8bit alone as bitsandbytes
    shown = f"base model {shown_path(resolved.base_model)}"
    kind = "int4" if fields.get("load_in_4bit") else "int8" if fields.get("load_in_8bit") else ""
    if method == QuantizationMethod.BITS_AND_BYTES.value and kind:
        if resolved.quantization == kind:
            return None
        return (
            f"{shown}: its weights are stored in {kind[3:]}-bit (bitsandbytes), but "
            f'base_models[0].quantization is "{resolved.quantization}": set it to "{kind}" to '
            "train on them, or use the model's full-precision weights"
        )
    named = method if method in {m.value for m in QuantizationMethod} else "another method"
    return (
        f"{shown}: its weights are stored quantized ({named}, its config.json's "
        "quantization_config), which expert-cli does not train on: use the model's "
        'full-precision weights (with quantization "int4" for QLoRA)'
    )


def device_memory() -> int | None:
    """Bytes of memory of the device the weights will live on: the first GPU, else RAM."""
    if torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None
