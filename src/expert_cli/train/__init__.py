"""The training step's fast path: attention kernels for packed rows, the loss without
full-vocabulary logits, adapters in the compute dtype, fused layer kernels and compilation.

Each module decides from a `ResolvedConfig` and the machine; nothing here prints.
"""
