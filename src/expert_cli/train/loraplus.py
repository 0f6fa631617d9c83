"""LoRA+ (Hayou, Ghosh and Yu, 2024): each adapter's B trained at a higher learning rate than
its A. With B starting at zero and A random, the two play different parts in the update
s B A x; a learning rate `ratio` times A's for B (16 in the paper's experiments) learns
features faster at the same cost.

The Trainer makes its optimizer (AdamW and the others it knows, its weight-decay groups
included); `split_b_groups` then moves each B matrix (`lora_B`, `lora_embedding_B`) into a
group of its own, that group's other settings kept, at `ratio` times its learning rate. It
runs before the schedule is made, which takes each group's rate as its peak, so B's rate
rises and decays with the schedule as A's does. DoRA's magnitudes stay at A's rate (the paper
has none). A resumed run is built the same way, so its optimizer's saved groups fit.
"""

from __future__ import annotations

from typing import Any

B_NAMES = (".lora_B.", ".lora_embedding_B.")


def split_b_groups(optimizer: Any, model: Any, ratio: float) -> int:
    """Move the B matrices of `model` (trainable) out of each of `optimizer`'s parameter
    groups into one of their own at `ratio` times its learning rate; how many moved. A group
    left with no parameters is dropped."""
    b_ids = {
        id(p)
        for n, p in model.named_parameters()
        if p.requires_grad and any(b in n for b in B_NAMES)
    }
    added = []
    for group in optimizer.param_groups:
        moved = [p for p in group["params"] if id(p) in b_ids]
        if not moved:
            continue
        group["params"] = [p for p in group["params"] if id(p) not in b_ids]
        settings = {k: v for k, v in group.items() if k != "params"}
        added.append({**settings, "params": moved, "lr": group["lr"] * ratio})
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
    for group in added:
        optimizer.add_param_group(group)
    return sum(len(g["params"]) for g in added)
