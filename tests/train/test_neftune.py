"""NEFTune on packed rows: each token's noise bound is alpha / sqrt(L d) with L its own
example's length (transformers' hook takes the row's, 3.2x too small for 200-token examples
in rows of 2,048), none outside training, and a run that asks for it trains otherwise."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from train_helpers import lora_model, run_here, write_expert

from expert_cli.train.neftune import Neftune, example_lengths


def test_each_token_gets_its_own_examples_length() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 0, 0]])
    assert example_lengths(positions).tolist() == [
        [3, 3, 3, 2, 2, 4, 4, 4, 4],
        [6, 6, 6, 6, 6, 6, 1, 1, 1],  # zeros after the example: each its own one-token piece
    ]


def test_the_noise_is_bounded_by_each_examples_length_and_only_in_training(
    tiny_model_dir: Path,
) -> None:
    model = lora_model(tiny_model_dir)
    embed = model.get_base_model().get_input_embeddings()
    d = embed.weight.shape[1]
    ids = torch.randint(0, 200, (1, 300), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(100), torch.arange(200)])[None]  # examples of 100, 200
    clean = embed(ids).detach()
    seen = {}
    neftune = Neftune(model, alpha=5.0)  # its hook first: the one below sees what it returns
    hook = embed.register_forward_hook(lambda m, i, o: seen.__setitem__("out", o.detach()))
    model.train()
    model(input_ids=ids, position_ids=positions)
    noise = (seen["out"] - clean)[0]
    for span, length in ((slice(0, 100), 100), (slice(100, 300), 200)):
        bound = 5.0 / math.sqrt(length * d)
        worst = noise[span].abs().max().item()
        assert 0.95 * bound < worst <= bound * (1 + 1e-5)  # uniform: it nears its bound
    model.eval()
    model(input_ids=ids, position_ids=positions)
    assert torch.equal(seen["out"], clean)  # evaluation and generation see none
    neftune.remove()
    model.train()
    model(input_ids=ids, position_ids=positions)
    assert torch.equal(seen["out"], clean)
    hook.remove()


def test_a_run_with_neftune_says_so_and_trains_otherwise(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    losses = {}
    for alpha in (None, 50.0):
        config = {"seed": 3} | ({"neftune_noise_alpha": alpha} if alpha else {})
        manifest = write_expert(tmp_path / str(alpha), tiny_model_dir, rows=16, config=config)
        out = tmp_path / f"out-{alpha}"
        proc = run_here("train", "--manifest", str(manifest), "--output", str(out),
                        "--max-steps", "3")  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert ("NEFTune alpha 50" in proc.stdout) == bool(alpha)
        windows = json.loads((out / "metrics.json").read_text())["windows"]
        losses[alpha] = [w["loss"] for w in windows]
    assert losses[None][0] != losses[50.0][0]  # the first step's loss: noisy embeddings
