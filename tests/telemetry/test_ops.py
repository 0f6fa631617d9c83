"""The operation counter: work counted, views not, and each host sync traced to its line; a
training step of the fast path asks the device for no value from expert-cli's own code."""

from __future__ import annotations

from pathlib import Path

import torch

from expert_cli.telemetry.ops import OpCounter
from expert_cli.train.callbacks import CountStepOps
from expert_cli.train.run import Silent, TrainOptions, train


def test_counts_operations_that_work_and_traces_host_syncs() -> None:
    a = torch.randn(4, 4)
    with OpCounter() as counter:
        b = a @ a
        b.view(16).t()  # views launch nothing
        total = b.sum().item()
        (a + 1).mul_(2)
    assert isinstance(total, float)
    assert counter.ops == {
        "aten::mm": 1,
        "aten::sum": 1,
        "aten::_local_scalar_dense": 1,
        "aten::add": 1,
        "aten::mul_": 1,
    }
    assert counter.total == 5
    ((where, n),) = counter.syncs.items()
    assert n == 1 and where.startswith("aten::_local_scalar_dense <- test_ops.py:")
    assert "test_counts_operations_that_work" in where
    assert counter.syncs_from("expert_cli") == {}


def test_a_fast_path_step_has_no_host_sync_from_our_code(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The GPU path's levers that run on a CPU (bf16 weights and autocast, adapters in bf16,
    the fused LoRA linear, the chunked loss, fused AdamW), with the run's own callbacks and
    meters: none of it reads a device value on the host inside a step."""
    from train_helpers import write_expert

    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        rows=16,
        base={"quantization": "bf16"},
        config={
            "bf16": True,
            "adapter_kernel": "fused",
            "fused_loss": "chunked",
            "optim": "adamw_torch_fused",
            "logging_steps": 100,
        },
    )
    counter = OpCounter()
    opts = TrainOptions(manifest=manifest, output=tmp_path / "run", max_steps=2)
    result = train(opts, Silent([CountStepOps(counter, 2)]))
    assert result.status == "completed"
    assert counter.ops["aten::_fused_adamw_"] == 1  # the optimizer step was inside the window
    assert counter.ops["aten::addmm"] >= 2 * 14  # the fused adapters' weight gradients
    assert counter.syncs_from("expert_cli") == {}, counter.syncs


def test_saved_for_backward_counts_what_the_graph_still_holds() -> None:
    """A branch of the forward that is let go (detached, as peft's DoRA computes its weight
    norm) saved tensors that the backward never sees: they are not counted, and what the
    graph holds is counted once a storage."""
    from expert_cli.telemetry.ops import SavedForBackward

    w = torch.randn(64, 32, requires_grad=True)
    x = torch.randn(16, 64)
    with SavedForBackward() as saved:
        side = (torch.eye(64) @ w).sin()  # its graph saves an eye, the product and w
        norm = side.detach().norm()  # the branch is let go here
        y = (x @ w) * norm  # keeps x (for w's gradient) and the norm (the product's)
        del side
    assert saved.nbytes == x.nbytes + norm.nbytes  # not the eye's 16 kB, nor the branch's
    assert len(saved.storages) == 2
    y.sum().backward()
    del y
    assert saved.nbytes == 0  # the graph is freed with its output
