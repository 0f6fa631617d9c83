"""The adapter saved under FSDP: every rank takes part in gathering the adapter's full
tensors (only the trainable ones: the frozen base is never gathered) and the main process
saves them with peft, loadable by `PeftModel.from_pretrained`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def save_fsdp_adapter(trainer: Any, output: str) -> None:
    """Gather the adapter of `trainer`'s FSDP model (every rank calls) and save it, with the
    tokenizer, into `output` (the main process)."""
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    options = StateDictOptions(
        full_state_dict=True,
        cpu_offload=True,  # the full tensors land on global rank 0 only
        ignore_frozen_params=True,  # the adapter alone is saved (adapter.saved_loadable)
    )
    state = get_model_state_dict(trainer.model_wrapped, options=options)
    if trainer.args.process_index != 0:
        return
    Path(output).mkdir(parents=True, exist_ok=True)
    # clone: the gathered tensors may share storage that peft's save cannot address
    peft_model.save_pretrained(output, state_dict={k: v.clone() for k, v in state.items()})
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(output)
