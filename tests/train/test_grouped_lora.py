"""Fused LoRA layers that read one input, computed as one function (q, k, v; gate, up), give
the layer-by-layer fused outputs and gradients, fall back wherever grouping does not apply,
and dispatch fewer operations."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from train_helpers import assert_bf16_close, bf16_step_ops, lora_model

from expert_cli.train.fused_lora import fuse_lora_linears, is_fused
from expert_cli.train.grouped_lora import (
    COMPILED_UNGROUPED,
    NOTHING_GROUPED,
    GroupedLoraFunction,
    group_lora_linears,
)
from expert_cli.train.model import enable_checkpointing


def _loss_and_grads(model: torch.nn.Module, ids: torch.Tensor, seed: int = 11) -> tuple:
    model.zero_grad()
    torch.manual_seed(seed)  # the same dropout masks for both models
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads


def _groups(model: torch.nn.Module) -> list:
    return model.__dict__["_lora_groups"]


def _grouping(model: torch.nn.Module) -> bool:
    """Whether every group computes its members together (order learned, not off)."""
    return all(g.order is not None and not g.off for g in _groups(model))


def _pair(model_dir: Path, quantization: object = None, **config: object) -> tuple:
    """The tiny model's fused LoRA layers, and a copy with its siblings grouped, after the
    forward that shows the groups their call order."""
    fused = lora_model(model_dir, quantization, **config).train()  # dropout on
    assert fuse_lora_linears(fused) == 14
    grouped = copy.deepcopy(fused)
    assert group_lora_linears(grouped) == 10  # 2 layers x (q, k, v and gate, up)
    assert sum(is_fused(m) for m in grouped.modules()) == 14
    assert all(g.order is None for g in _groups(grouped))  # one by one until a forward
    with torch.no_grad():
        grouped(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert all(g.order is None for g in _groups(grouped))  # in effect from the next forward
    return fused, grouped


def _assert_same(fused: torch.nn.Module, grouped: torch.nn.Module, ids: torch.Tensor) -> None:
    want_loss, want = _loss_and_grads(fused, ids)
    got_loss, got = _loss_and_grads(grouped, ids)
    assert _grouping(grouped)
    assert [g.order for g in _groups(grouped)] == [(0, 1, 2), (0, 1)] * 2
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    assert got.keys() == want.keys() and len(got) == 28
    for name in want:
        assert got[name].dtype == want[name].dtype
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-7), name


def test_function_is_each_layers_math() -> None:
    """Three layers on one input, two scales, one with dropout: outputs and every gradient
    equal the unfused formulas given the masks the function drew."""
    torch.manual_seed(1)
    x = torch.randn(2, 5, 8, requires_grad=True)
    bases = [torch.nn.Linear(8, n).requires_grad_(False) for n in (6, 4, 4)]
    weights = []
    for base in bases:
        weights += [torch.randn(3, 8, requires_grad=True), torch.randn(base.out_features, 3)]
        weights[-1].requires_grad_()
    members = ((bases[0], (0.5, 0.0)), (bases[1], (0.25, 0.0)), (bases[2], (0.5, 0.3)))
    torch.manual_seed(7)
    ys = GroupedLoraFunction.apply(x, members, *weights)
    dys = [torch.randn_like(y) for y in ys]
    sum((y * dy).sum() for y, dy in zip(ys, dys, strict=True)).backward()
    got = [y.detach() for y in ys] + [x.grad] + [w.grad for w in weights]
    torch.manual_seed(7)  # the mask the function drew for the third layer
    mask = torch.empty(10, 8, dtype=torch.bool).bernoulli_(0.7).view(2, 5, 8)
    x2 = x.detach().clone().requires_grad_()
    ref_w = [w.detach().clone().requires_grad_() for w in weights]
    refs = []
    for i, (base, (s, p)) in enumerate(members):
        d = x2 * mask / (1 - p) if p else x2
        a, b = ref_w[2 * i], ref_w[2 * i + 1]
        refs.append(x2 @ base.weight.t() + base.bias + (d @ a.t()) @ b.t() * s)
    sum((r * dy).sum() for r, dy in zip(refs, dys, strict=True)).backward()
    want = [r.detach() for r in refs] + [x2.grad] + [w.grad for w in ref_w]
    assert len(got) == len(want) == 10
    for mine, theirs in zip(got, want, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5), (mine - theirs).abs().max()


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_grouped_model_equals_the_fused_one(tiny_model_dir: Path, dropout: float) -> None:
    """Loss and 28 adapter gradients of the fused layers, with dropout too (the group draws
    each layer's mask in the order the layers are called), and with checkpointed layers."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(3))
    fused, grouped = _pair(tiny_model_dir, lora_dropout=dropout)
    _assert_same(fused, grouped, ids)
    enable_checkpointing(fused.base_model.model, {"use_reentrant": False})
    enable_checkpointing(grouped.base_model.model, {"use_reentrant": False})
    _assert_same(fused, grouped, ids)


def test_bf16_autocast_and_the_4bit_base(tiny_model_dir: Path) -> None:
    """Under bf16 autocast the gradients stay fp32 and match the fused layers' within bf16
    rounding; on an NF4 base (fp32 compute) they are the fused layers' numbers."""
    from transformers import BitsAndBytesConfig

    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(4))
    fused, grouped = _pair(tiny_model_dir)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want_loss, want = _loss_and_grads(fused, ids)
        got_loss, got = _loss_and_grads(grouped, ids)
    assert got_loss == pytest.approx(want_loss, rel=1e-2)
    assert all(g.dtype == torch.float32 for g in got.values())
    # the same bf16 operations, the input gradient's sums in another order (1.3% at most
    # here, in the first layer): closer than the fused layers to peft's (5% allowed)
    assert_bf16_close(want, got, share=0.02)
    nf4 = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
    )
    _assert_same(*_pair(tiny_model_dir, nf4), ids)


def test_falls_back_where_grouping_does_not_apply(tiny_model_dir: Path) -> None:
    """Adapters disabled (the base alone) and inference mode run the layers one by one, as
    fused, and leave the groups grouping."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(5))
    fused, grouped = _pair(tiny_model_dir)
    with torch.no_grad():
        want = fused(input_ids=ids).logits
        assert torch.allclose(grouped(input_ids=ids).logits, want, atol=1e-5)
        with fused.disable_adapter(), grouped.disable_adapter():
            base = fused(input_ids=ids).logits
            assert torch.allclose(grouped(input_ids=ids).logits, base, atol=1e-5)
        assert not torch.allclose(base, want, atol=1e-3)
    with torch.inference_mode():
        assert torch.allclose(grouped(input_ids=ids).logits, want, atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(grouped(input_ids=ids).logits, want, atol=1e-5)
    assert _grouping(grouped)


def test_a_layer_handed_another_tensor_runs_alone_and_grouping_stops(
    tiny_model_dir: Path,
) -> None:
    """A module that hands k_proj another tensor than q_proj's (cross-attention's pattern):
    k runs alone with the fused layer's result, v is still handed the group's output, an input
    changed in place is not the group's; from the model's next forward on that group runs
    its layers one by one, drawing the fused layers' dropout masks."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(6))
    fused, grouped = _pair(tiny_model_dir, lora_dropout=0.2)
    with torch.no_grad():
        grouped(input_ids=ids)  # the order learned in _pair in effect
    assert _grouping(grouped)
    attention = grouped.base_model.model.model.layers[0].self_attn
    solo = fused.base_model.model.model.layers[0].self_attn
    attention.eval(), solo.eval()  # no dropout in these direct calls
    x, other = torch.randn(2, 3, attention.q_proj.in_features), torch.randn(2, 3, 64)
    with torch.no_grad():
        q = attention.q_proj(x)  # the group computes k and v of x as well
        assert torch.allclose(attention.k_proj(other), solo.k_proj(other), atol=1e-6)
        assert torch.allclose(attention.v_proj(x), solo.v_proj(x), atol=1e-6)
        assert torch.allclose(q, solo.q_proj(x), atol=1e-6)
        x.add_(1.0)  # changed in place: not the tensor the group computed
        attention.q_proj(x)
        x.add_(1.0)
        assert torch.allclose(attention.k_proj(x), solo.k_proj(x), atol=1e-6)
    group = attention.q_proj._lora_group
    assert group.order == (0, 1, 2) and not group.off  # until the next forward
    attention.train(), solo.train()
    want_loss, want = _loss_and_grads(fused, ids)
    got_loss, got = _loss_and_grads(grouped, ids)
    assert group.off and sum(g.off for g in _groups(grouped)) == 1
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-7), name


def test_masks_are_drawn_in_the_order_the_module_calls_its_layers(tiny_model_dir: Path) -> None:
    """An MLP that calls up_proj before gate_proj (Falcon-H1's does): the group learns that
    order and draws the dropout masks in it, so the gradients are the fused layers'."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(7))
    fused = lora_model(tiny_model_dir, lora_dropout=0.2).train()
    fuse_lora_linears(fused)
    grouped = copy.deepcopy(fused)
    group_lora_linears(grouped)
    for model in (fused, grouped):
        for layer in model.base_model.model.model.layers:
            mlp = layer.mlp

            def up_first(x: torch.Tensor, mlp: torch.nn.Module = mlp) -> torch.Tensor:
                up = mlp.up_proj(x)
                return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * up)

            mlp.forward = up_first
    with torch.no_grad():
        grouped(input_ids=ids)
    _loss_and_grads(grouped, ids)  # the order in effect
    assert [g.order for g in _groups(grouped)] == [(0, 1, 2), (1, 0)] * 2
    want_loss, want = _loss_and_grads(fused, ids)
    got_loss, got = _loss_and_grads(grouped, ids)
    assert _grouping(grouped)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-7), name


def test_ranks_and_scales_of_their_own(tiny_model_dir: Path) -> None:
    """Layers of one group with other ranks and alphas (peft's rank and alpha patterns): the
    stacked A's rows and the scales are each layer's."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(8))
    config = {"rank_pattern": {"k_proj": 2, "v_proj": 8, "up_proj": 6}}
    fused, grouped = _pair(tiny_model_dir, **config, alpha_pattern={"v_proj": 4, "gate_proj": 3})
    attention = grouped.base_model.model.model.layers[0].self_attn
    assert [attention.v_proj.r["default"], attention.v_proj.scaling["default"]] == [8, 0.5]
    _assert_same(fused, grouped, ids)


def test_checkpointed_steps_from_the_first_and_accumulated(tiny_model_dir: Path) -> None:
    """Checkpointed layers from the first forward, which runs the layers one by one and
    learns the order: its recompute in the backward computes the same (grouping starts at the
    next forward); two micro-steps accumulate the fused layers' gradients."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(9))
    fused = lora_model(tiny_model_dir, lora_dropout=0.2).train()
    fuse_lora_linears(fused)
    grouped = copy.deepcopy(fused)
    group_lora_linears(grouped)
    grads = []
    for model in (fused, grouped):
        enable_checkpointing(model.base_model.model, {"use_reentrant": False})
        model.zero_grad()
        for seed in (1, 2, 3):
            torch.manual_seed(seed)
            model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert _grouping(grouped)
    for name, want in grads[0].items():
        assert torch.allclose(grads[1][name], want, rtol=1e-4, atol=1e-7), name


def test_a_copy_of_the_model_keeps_its_own_groups(tiny_model_dir: Path) -> None:
    """A deep copy's forward begins by letting go of its own groups' held outputs, not the
    original's."""
    _, grouped = _pair(tiny_model_dir)
    copied = copy.deepcopy(grouped)
    held = torch.zeros(1)
    original, copy_group = _groups(grouped)[0], _groups(copied)[0]
    assert original is not copy_group and copy_group.members[0] is not original.members[0]
    original._waiting, copy_group._waiting = {1: held}, {1: held}
    with torch.no_grad():
        copied.base_model.model.model.embed_tokens.register_forward_hook(
            lambda *_: seen.append((dict(original._waiting), dict(copy_group._waiting)))
        )
        seen: list = []
        copied(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert seen == [({1: held}, {})]


def test_under_torch_compile_the_gradients_are_the_eager_groups(tiny_model_dir: Path) -> None:
    """Traced by torch.compile (where the members run as fused layers one by one) the
    gradients are the eager group's, and nothing is left held on the group."""
    _, grouped = _pair(tiny_model_dir)
    attention = grouped.base_model.model.model.layers[0].self_attn
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)

    def f(x: torch.Tensor) -> torch.Tensor:
        return sum(p(x).pow(2).sum() for p in projections)

    x = torch.randn(2, 5, attention.q_proj.in_features)
    grads = []
    for fn in (f, torch.compile(f, backend="aot_eager")):
        grouped.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fn(x).float().backward()
        grads.append(
            [w.grad.clone() for p in projections for w in p.parameters() if w.grad is not None]
        )
    assert len(grads[0]) == len(grads[1]) == 6
    for eager, traced in zip(*grads, strict=True):
        assert torch.allclose(eager, traced, atol=1e-2)
    assert attention.q_proj._lora_group._waiting == {}


def test_nothing_is_held_after_a_forward(tiny_model_dir: Path) -> None:
    """Every output a group computed is collected by its layer in the same forward."""
    from expert_cli.train.grouped_lora import LoraGroup

    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(6))
    _, grouped = _pair(tiny_model_dir)
    grouped(input_ids=ids, labels=ids).loss.backward()
    groups = {
        id(m._lora_group): m._lora_group for m in grouped.modules() if hasattr(m, "_lora_group")
    }
    assert len(groups) == 4 and all(isinstance(g, LoraGroup) for g in groups.values())
    assert all(g._waiting == {} and g._input is None for g in groups.values())


def test_a_forward_stopped_part_way_holds_nothing_into_the_next(tiny_model_dir: Path) -> None:
    """A forward that fails after q_proj (here: k_norm raises) leaves k and v on the group;
    the next forward of the model lets them go before it runs, and gives the fused result."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(7))
    fused, grouped = _pair(tiny_model_dir)
    attention = grouped.base_model.model.model.layers[1].self_attn

    def fail(*_: object) -> None:
        raise RuntimeError("out of memory")

    handle = attention.k_norm.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="out of memory"):
        grouped(input_ids=ids)
    group = attention.q_proj._lora_group
    assert set(group._waiting) == {2}  # v waits; k was collected before k_norm failed
    handle.remove()
    seen = []  # what the group holds when the next forward reaches the first layer
    first = grouped.base_model.model.model.layers[0]
    first.register_forward_pre_hook(lambda *_: seen.append(dict(group._waiting)))
    with torch.no_grad():
        logits = grouped(input_ids=ids).logits
        assert torch.allclose(logits, fused(input_ids=ids).logits, atol=1e-5)
    assert seen == [{}] and group._waiting == {}


def test_grouped_layers_dispatch_fewer_operations(tiny_model_dir: Path) -> None:
    """Forward and backward under bf16 autocast: per decoder layer the q, k, v adapters read
    their input in one GEMM forward and one for A's gradient (gate and up likewise), and
    the input gradients are summed by the GEMMs, not by autograd."""
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(5))
    fused, grouped = _pair(tiny_model_dir)
    counts = bf16_step_ops({"fused": fused, "grouped": grouped}, ids)
    fused_ops, grouped_ops = counts["fused"].total, counts["grouped"].total
    assert grouped_ops <= fused_ops - 20, (grouped_ops, fused_ops)
    # a decoder layer: 3 fewer A GEMMs forward (q, k, v in one, gate and up in one), 3 fewer
    # for A's gradient and 3 fewer for the adapters' part of the input gradient; the first
    # layer's q, k and v need no input gradient (frozen embeddings): 2 fewer there
    mm = ("aten::mm", "aten::addmm", "aten::addmm_")
    gemms = {k: sum(c.ops.get(op, 0) for op in mm) for k, c in counts.items()}
    assert gemms["fused"] - gemms["grouped"] == 2 * 9 - 2, gemms
    # autograd's sums of the input gradients: 2 for q, k, v and 1 for gate and up a layer
    adds = {k: c.ops.get("aten::add", 0) for k, c in counts.items()}
    assert adds["fused"] - adds["grouped"] == 2 * 3 - 2, adds


@pytest.mark.slow
def test_a_run_asked_for_grouped_layers_says_so(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`adapter_kernel: grouped` through `expert-cli train`: the console's adapter line and
    manifest.resolved.json count the fused layers and those grouped."""
    import json

    from train_helpers import run_here, write_expert

    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        rows=16,
        config={"max_steps": 2, "adapter_kernel": "grouped"},
    )
    done = run_here("train", "--manifest", str(manifest), "--output", str(tmp_path / "run"))
    said = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stderr[-2000:]
    assert "14 layers fused, 10 grouped by input" in said
    assert "grouped found no" not in said
    resolved = json.loads((tmp_path / "run" / "manifest.resolved.json").read_text())
    assert resolved["adapter_kernel"] == "grouped"
    model = resolved["runtime"]["model"]
    assert (model["fused_lora_layers"], model["grouped_lora_layers"]) == (14, 10)
    assert NOTHING_GROUPED not in model["notes"] and COMPILED_UNGROUPED not in model["notes"]


def _grouped_run(tmp_path: Path, model_dir: Path, name: str, *sets: str) -> dict:
    """What manifest.resolved.json records of the model of a 1-step grouped run, trained in
    this process (the console's lines are `decisions`' view of the same record)."""
    import json

    from train_helpers import write_expert

    from expert_cli.train.run import TrainOptions, train

    manifest = write_expert(
        tmp_path / name, model_dir, rows=8, config={"max_steps": 1, "adapter_kernel": "grouped"}
    )
    result = train(TrainOptions(manifest, tmp_path / name / "run", overrides=list(sets)))
    assert result.exit_code == 0
    resolved = json.loads((tmp_path / name / "run" / "manifest.resolved.json").read_text())
    return resolved["runtime"]["model"]


@pytest.mark.slow
def test_grouped_with_no_two_layers_of_one_input_says_why(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """No two targets that read one input: each layer runs alone, and a note says why."""
    targets = 'training.config.target_modules=["q_proj","o_proj","down_proj"]'
    model = _grouped_run(tmp_path, tiny_model_dir, "alone", targets)
    assert (model["fused_lora_layers"], model["grouped_lora_layers"]) == (6, 0)
    assert NOTHING_GROUPED in model["notes"]


@pytest.mark.slow
def test_grouped_under_torch_compile_counts_no_group(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Decoder layers traced by torch.compile run their layers one by one: none is counted
    grouped, and a note says so (the run trains: compiled layers, one step)."""
    compiled = (
        "training.config.torch_compile=true",
        "training.config.torch_compile_backend=aot_eager",
    )
    model = _grouped_run(tmp_path, tiny_model_dir, "compiled", *compiled)
    assert model["compiled_layers"] == 2
    assert (model["fused_lora_layers"], model["grouped_lora_layers"]) == (14, 0)
    assert COMPILED_UNGROUPED in model["notes"]
