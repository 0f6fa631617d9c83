"""What every manifest block is built from: the strict base model and the shared field types."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

AdapterType = Literal["lora", "dora", "ia3", "lokr", "adalora"]
Quantization = Literal["int4", "int8", "fp16", "bf16", "none"]
PromptTemplate = Literal["chatml", "llama2", "alpaca", "vicuna", "custom"]
# Names used by existing manifests for a template we implement under another name.
PROMPT_TEMPLATE_ALIASES = {"qwen": "chatml", "qwen2": "chatml", "qwen3": "chatml"}
Probability = Annotated[float, Field(ge=0.0, lt=1.0)]


class Strict(BaseModel):
    """A block the trainer acts on: unknown keys are errors, numbers are numbers (not
    booleans or strings), booleans are booleans, and floats are finite."""

    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, strict=True, allow_inf_nan=False
    )
