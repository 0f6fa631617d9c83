"""`training.decoding`: the inference settings `generate` samples with and HiveLLM's runtime
reads, bounded here as the format bounds them."""

from __future__ import annotations

import difflib
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from expert_cli.config.base import NAME_LIKE, has_control_character
from expert_cli.config.refs import WINDOWS_PATH

MAX_NEW_TOKENS = 32_768
MAX_TOP_K = 1_000_000
MAX_REPETITION_PENALTY = 100.0
MIN_REPETITION_PENALTY = 0.01  # its inverse scales the logits: smaller overflows them
MIN_TEMPERATURE = 0.01  # logits divided by less overflow to infinity; 0 means greedy
MAX_STOP_SEQUENCES = 64


class DecodingSpec(BaseModel):
    """`training.decoding`: inference settings. `generate` samples with temperature, top_p,
    top_k, repetition_penalty and max_new_tokens; `package` carries the grammar file; the rest
    is kept for HiveLLM's runtime. Keys the format does not name are kept (it allows them)."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description=f"Sampling temperature; 0 is greedy, else at least {MIN_TEMPERATURE}.",
    )
    top_p: float | None = Field(None, ge=0.0, le=1.0, description="Nucleus sampling threshold.")
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K, description="Top-k sampling limit.")
    min_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Minimum token probability (generate does not use it); kept.",
    )
    repetition_penalty: float | None = Field(
        None,
        ge=MIN_REPETITION_PENALTY,
        le=MAX_REPETITION_PENALTY,
        description="Extension: penalty on repeated tokens (1 is none); generate uses it.",
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=MAX_NEW_TOKENS, description="Extension: tokens to generate at most."
    )
    max_tokens: int | None = Field(
        None, ge=1, le=MAX_NEW_TOKENS, description="Extension: as max_new_tokens."
    )
    use_grammar: bool | None = Field(None, description="Grammar-constrained decoding; kept.")
    grammar_type: str | None = Field(
        None, description="Grammar kind (json, gbnf, sql, cypher, ...); kept."
    )
    grammar_file: str | None = Field(
        None,
        description="GBNF grammar file, relative to the manifest's folder (it must exist); "
        "packaged at that path.",
    )
    validation: str | None = Field(None, description="Post-generation check; kept.")
    validation_cmd: str | None = Field(None, description="Command of that check; kept.")
    stop_sequences: list[str] | None = Field(
        None,
        max_length=MAX_STOP_SEQUENCES,
        description=f"Sequences that end an answer (at most {MAX_STOP_SEQUENCES}); kept.",
    )

    @field_validator("temperature")
    @classmethod
    def _greedy_or_sampled(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(
                f"expected 0 (greedy) or from {MIN_TEMPERATURE} to 2; a smaller temperature "
                "divides the logits past what a float holds"
            )
        return value

    @field_validator("grammar_file")
    @classmethod
    def _inside_the_expert(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = PurePosixPath(value.replace("\\", "/")).parts
        if (
            not value.strip()
            or value.startswith(("/", "\\"))
            or WINDOWS_PATH.match(value)
            or ".." in parts
            or has_control_character(value)
        ):
            raise ValueError(
                "expected a relative path inside the expert's folder (not absolute, no '..', "
                "no control characters), e.g. grammar.gbnf"
            )
        return value

    def unknown_key_notes(self) -> list[str]:
        """A note for each key the format does not name (kept: HiveLLM's runtime may read
        it), with the nearest known key, since a misspelt `temprature` would otherwise be
        kept and never used. Comment keys (`_...`) are not noted."""
        known = list(type(self).model_fields)
        notes = []
        for key in self.model_extra or {}:
            if key.startswith("_"):
                continue
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]}?" if close else ""
            where = f"training.decoding.{key}" if NAME_LIKE.fullmatch(key) else "training.decoding"
            notes.append(f"{where}: not a key the format names; kept as it is{hint}")
        return notes
