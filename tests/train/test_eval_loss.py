"""The eval loss is summed over the split's trained tokens and divided by their number. The
Trainer weighted every evaluation batch the same, so an answer of one token counted as much
as one of twenty-nine."""

from __future__ import annotations

import types
from pathlib import Path

import datasets
import pytest
import torch
from peft import LoraConfig, get_peft_model
from train_helpers import echoing_rows, eval_args
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from expert_cli.train.trainer import build_trainer

DEMO_MODEL = Path(__file__).parents[2] / "experts" / "demo" / "model"


def _rows() -> list[dict[str, list[int]]]:
    draw = torch.Generator().manual_seed(1)
    rows = []
    for length, trained in ((30, 1), (30, 29), (12, 6), (20, 3), (25, 24)):
        ids = torch.randint(1, 4000, (length,), generator=draw).tolist()
        labels = [-100] * (length - trained) + ids[length - trained :]
        rows.append({"input_ids": ids, "labels": labels, "position_ids": list(range(length))})
    return rows


def _by_hand(model: torch.nn.Module, rows: list[dict[str, list[int]]]) -> tuple[float, float]:
    """(summed loss / trained tokens, mean of each row's mean) computed one row at a time."""
    summed, count, means = 0.0, 0, []
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0, :-1].float()
            targets = torch.tensor(row["labels"][1:])
            losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            kept = losses[targets != -100]
            summed, count = summed + kept.sum().item(), count + kept.numel()
            means.append(kept.mean().item())
    return summed / count, sum(means) / len(means)


def _evaluated(tmp_path: Path, model: torch.nn.Module, rows: list, batch: int) -> dict:
    """The metrics of one evaluation of `rows` by the Trainer expert-cli builds, `batch` rows
    an evaluation batch."""
    args = eval_args(tmp_path / "out", batch)
    data = types.SimpleNamespace(train=None, eval=datasets.Dataset.from_list(rows), stats={})
    trainer, _ = build_trainer(model, args, data, AutoTokenizer.from_pretrained(DEMO_MODEL), "sdpa")
    return trainer.evaluate()


@pytest.mark.parametrize("batch", [1, 2])
def test_eval_loss_is_per_trained_token(tmp_path: Path, batch: int) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(DEMO_MODEL), attn_implementation="sdpa"
    )
    with torch.no_grad():  # sharp logits: tokens' losses differ widely, as a trained model's do
        model.get_output_embeddings().weight.mul_(8)
    model.eval()
    rows = _rows()
    exact, mean_of_rows = _by_hand(model, rows)
    adapter = LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")  # B = 0: no change
    model = get_peft_model(model, adapter)
    got = _evaluated(tmp_path, model, rows, batch)["eval_loss"]
    assert abs(exact - mean_of_rows) > 0.01 * exact  # the two averages differ on these rows
    assert got == pytest.approx(exact, rel=1e-4)


def test_an_eval_loss_that_is_nan_stays_nan(tmp_path: Path) -> None:
    """A model whose loss is NaN (fp16 overflow, divergence) was evaluated at 0: the Trainer's
    per-batch NaN was zeroed with the 0/0 of batches that train nothing, so report called it
    the best checkpoint and `--checkpoint best` picked it."""
    import math

    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(DEMO_MODEL), attn_implementation="sdpa"
    )
    with torch.no_grad():
        model.get_output_embeddings().weight.fill_(float("nan"))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    rows = _rows()
    rows.append({**rows[0], "labels": [-100] * len(rows[0]["labels"])})  # trains nothing
    metrics = _evaluated(tmp_path, model, rows, 2)
    assert math.isnan(metrics["eval_loss"])
    assert "eval_token_accuracy" not in metrics  # NaN logits' argmax is no accuracy


@pytest.mark.parametrize("loss", ["standard", "chunked"])
@pytest.mark.parametrize("batch", [1, 2])
def test_eval_token_accuracy_is_over_every_trained_token(
    tmp_path: Path, batch: int, loss: str
) -> None:
    """TRL logs a token accuracy; expert-cli's evaluation measured the loss alone. The share of
    trained tokens the model's argmax predicts, over the whole split, from the standard loss's
    logits or counted in the fused loss's forward (which keeps no logits)."""
    from expert_cli.train.loss import install_fused_loss

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(DEMO_MODEL), attn_implementation="sdpa"
    )
    with torch.no_grad():  # the head reads back the embedding: it predicts the token it reads
        model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight * 8)
    model.eval()
    rows = echoing_rows()
    hits = trained = 0
    shares = []
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0, :-1]
            targets = torch.tensor(row["labels"][1:])
            kept = targets != -100
            right = (logits.argmax(-1) == targets)[kept]
            hits, trained = hits + int(right.sum()), trained + int(kept.sum())
            shares.append(right.float().mean().item())
    exact = hits / trained
    assert 0.2 < exact < 0.95 and abs(exact - sum(shares) / len(shares)) > 0.01
    if loss == "chunked":
        install_fused_loss(model, "chunked")
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    got = _evaluated(tmp_path, model, rows, batch)["eval_token_accuracy"]
    assert got == pytest.approx(exact, abs=1e-12)


def test_correct_tokens_counts_a_chunk_at_a_time(monkeypatch) -> None:
    from expert_cli.train import loss

    draw = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(37, 8, generator=draw), torch.randn(50, 8, generator=draw)
    targets = (hidden @ weight.t()).argmax(-1)
    targets[::3] = torch.randint(0, 50, (13,), generator=draw)  # some predicted, some not
    targets[1::5] = -100
    want = int((((hidden @ weight.t()).argmax(-1) == targets) & (targets != -100)).sum())
    monkeypatch.setattr(loss, "CHUNK_ELEMENTS", 50 * 4)  # 4 tokens a chunk
    assert int(loss.correct_tokens(hidden, weight, targets)) == want
    assert 0 < want < 37
