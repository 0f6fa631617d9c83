"""HiveLLM's manifest records as its loader reads them (hivellm/expert @ 9cd24b1,
`cli/src/manifest.rs`): each object's fields it needs and those it takes when given, with
the kind of value each holds. Keys it does not name it skips unread.

serde_json reads the file: a whole number into u32 or u64 fields (`32.0` and `-0` are
floats there), f32 or f64 numbers (a value too large for a double is out of range), strings
without lone surrogates, and at most 128 levels of nested objects and lists in what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEPTH_LIMIT = 128  # serde_json's recursion limit: objects and lists open at once

TEXT, WHOLE, BIG, NUMBER, FLAG, ANY = "text", "whole", "big", "number", "flag", "any"
WHOLE_MAX, BIG_MAX = (1 << 32) - 1, (1 << 64) - 1


@dataclass(frozen=True)
class Record:
    """An object the loader reads: fields it needs, and fields it takes when given."""

    needed: dict[str, Any]
    optional: dict[str, Any] = field(default_factory=dict)
    defaulted: frozenset[str] = frozenset()  # optional, but not null (serde's `default`)


def _many(names: str, kind: Any) -> dict[str, Any]:
    return dict.fromkeys(names.split(), kind)


ADAPTER = Record(
    {"type": TEXT, "target_modules": ("list", TEXT)},
    {"r": WHOLE, "alpha": WHOLE, "scaling": TEXT, "dropout": NUMBER, "use_dora": FLAG}
    | {"size_bytes": BIG, "sha256": TEXT},
)
ROPE = (
    "either",
    TEXT,
    Record(
        _many("type", TEXT)
        | {"factor": NUMBER, "fine_grained": FLAG}
        | _many("max_position_embeddings original_max_position_embeddings", BIG)
    ),
)
BASE = {"sha256": TEXT, "quantization": TEXT, "rope_scaling": ROPE}
TRAINING_CONFIG = Record(
    _many("method adapter_type lr_scheduler", TEXT)
    | {"target_modules": ("list", TEXT), "epochs": NUMBER, "learning_rate": NUMBER}
    | _many("batch_size gradient_accumulation_steps warmup_steps", WHOLE),
    _many("rank alpha max_seq_length dataloader_num_workers dataloader_prefetch_factor", WHOLE)
    | _many("save_steps save_total_limit eval_steps logging_steps", WHOLE)
    | {"feedforward_modules": ("list", TEXT)}
    | _many(
        "use_unsloth dataloader_pin_memory dataloader_persistent_workers fp16 bf16 use_tf32 "
        "use_sdpa flash_attention_2 memory_efficient_attention packing torch_compile "
        "group_by_length load_best_model_at_end greater_is_better",
        FLAG,
    )
    | _many(
        "activation_checkpointing torch_compile_backend torch_compile_mode optim save_strategy "
        "evaluation_strategy metric_for_best_model pretokenized_cache",
        TEXT,
    ),
)
DATASET = Record(
    {},
    _many("path validation_path test_path type format", TEXT)
    | {"tasks": ANY, "streaming": FLAG, "use_pretokenized": FLAG, "max_in_memory_samples": WHOLE}
    | {"field_mapping": Record({}, _many("instruction input response text", TEXT))}
    | {
        "generation": Record(
            _many("domain task provider", TEXT) | {"count": BIG},
            _many("temperature diversity_threshold", NUMBER)
            | {"difficulty_distribution": Record(_many("easy medium hard", NUMBER))},
        )
    },
)
DECODING = Record(
    {},
    _many("grammar_type grammar_file validation validation_cmd", TEXT)
    | {"use_grammar": FLAG, "stop_sequences": ("list", TEXT), "top_k": BIG}
    | _many("temperature top_p", NUMBER),
)
MANIFEST = Record(
    _many("name version description", TEXT)
    | {"capabilities": ("list", TEXT)}
    | {
        "constraints": Record(
            {"load_order": WHOLE, "incompatible_with": ("list", TEXT), "requires": ("list", TEXT)},
            {"max_chain": WHOLE},
        )
    }
    | {
        "training": Record(
            {"dataset": DATASET, "config": TRAINING_CONFIG},
            {"decoding": DECODING, "packaging_checkpoint": TEXT}
            | {
                "metadata": Record(
                    {},
                    _many("trained_on base_model_version gpu", TEXT)
                    | {"training_time_hours": NUMBER},
                )
            },
        )
    },
    _many("schema_version author homepage license", TEXT)
    | {"tags": ("list", TEXT), "adapters": ("list", ADAPTER)}
    | {"repository": Record(_many("type url", TEXT))}
    | {"base_model": Record({"name": TEXT}, BASE)}
    | {
        "base_models": (
            "list",
            Record({"name": TEXT, "adapters": ("list", ADAPTER)}, BASE | {"prompt_template": TEXT}),
        )
    }
    | {"soft_prompts": ("list", Record(_many("name path", TEXT) | {"tokens": WHOLE}))}
    | {
        "routing": Record(
            {"keywords": ("list", TEXT)},
            {"exclude_keywords": ("list", TEXT), "router_hint": TEXT, "priority": NUMBER},
        )
    }
    | {
        "perf": Record(
            {
                "latency_ms_overhead": NUMBER,
                "vram_mb_overhead": WHOLE,
                "supported_batch_sizes": ("list", WHOLE),
            }
        )
    }
    | {
        "runtime": Record(
            {},
            _many("candle_compatible requires_kv_cache_persistence", FLAG)
            | {"attention_kernel": TEXT},
        )
    }
    | {"evaluation": Record({"test_set_size": WHOLE, "metrics": ("map", NUMBER)})}
    | {
        "integrity": Record(
            _many("publisher signature_algorithm", TEXT) | {"files": ("map", TEXT)},
            _many("created_at pubkey signature", TEXT),
        )
    },
    defaulted=frozenset({"schema_version", "soft_prompts"}),
)


def read_field(loc: tuple[Any, ...]) -> bool:
    """Whether the loader reads the field at `loc` (keys and list indexes from the root) into
    a record of its own: a key given twice there is an error to it; elsewhere (a key it
    skips, a map's or a free JSON value's) it keeps the last."""
    kind: Any = MANIFEST
    for part in loc[:-1]:
        kind = _inner(kind, part)
    record = _record(kind)
    return record is not None and bool(loc) and loc[-1] in {**record.needed, **record.optional}


def _record(kind: Any) -> Record | None:
    """The record a value of `kind` is read into, when it is an object (of a choice too)."""
    if isinstance(kind, tuple) and kind[0] == "either":
        return next((k for k in kind[1:] if isinstance(k, Record)), None)
    return kind if isinstance(kind, Record) else None


def _inner(kind: Any, part: Any) -> Any:
    """What the loader reads at `part` inside a value of `kind` (None: nothing it reads)."""
    if (record := _record(kind)) is not None:
        return {**record.needed, **record.optional}.get(part) if isinstance(part, str) else None
    if isinstance(kind, tuple) and kind[0] != "either":  # a list's items, a map's values
        return kind[1]
    return None
