"""A base model configuration no model can be built from, too big for the machine, or with
fewer embedding rows than its tokenizer has ids, is found on the architecture built without
weights, and weights cut short from their headers: `check` and `train` name the file and exit 2
before any data is tokenized (each was a traceback from inside transformers or safetensors, or
the process killed for memory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from train_helpers import run_here, run_main, write_expert

from expert_cli.config import load_manifest
from expert_cli.config.environment import Environment
from expert_cli.config.resolve import resolve
from expert_cli.train.adapter import adapter_problem


def _model_with(tmp_path: Path, tiny_model_dir: Path, config: str | None) -> Path:
    """A copy of the tiny model's config and tokenizer (no weights) with config.json
    replaced by `config` (kept when None)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(config)
    return folder


def _resolved(tmp_path: Path, model: Path):
    manifest = write_expert(tmp_path / "e", model, rows=8, base={"init": "random"})
    return resolve(load_manifest(manifest), Environment(cpu_count=2))


def _edited(tiny_model_dir: Path, **changes: object) -> str:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    return json.dumps({**config, **changes})


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"hidden_size": -1}, "config.json gives hidden_size below 1"),
        ({"num_attention_heads": 0}, "config.json gives num_attention_heads below 1"),
        ({"intermediate_size": 0}, "config.json gives intermediate_size below 1"),  # it trained
        ({"num_attention_heads": "x"}, "(StrictDataclassFieldValidationError; num_attention_heads"),
        ({"vocab_size": 1e12}, "cannot be read as a model configuration (StrictDataclassField"),
        ({"model_type": "no-such-model"}, "cannot be read as a model configuration (ValueError)"),
    ],
)
def test_a_config_no_model_can_be_built_from_is_named(
    tmp_path: Path, tiny_model_dir: Path, changes: dict, expected: str
) -> None:
    model = _model_with(tmp_path, tiny_model_dir, _edited(tiny_model_dir, **changes))
    problem = adapter_problem(_resolved(tmp_path, model), str(model))
    assert problem is not None and problem.startswith(f"base model {model}: "), problem
    assert expected in problem
    assert "1000000000000" not in problem  # the value is not quoted


@pytest.mark.parametrize("text", ["not json", "[]", ""])
def test_a_config_that_is_not_a_json_object_is_named(
    tmp_path: Path, tiny_model_dir: Path, text: str
) -> None:
    model = _model_with(tmp_path, tiny_model_dir, None)
    resolved = _resolved(tmp_path, model)
    (model / "config.json").write_text(text)
    problem = adapter_problem(resolved, str(model))
    expected = "cannot be read as a model configuration" if text == "[]" else "is not JSON"
    assert problem is not None and f"config.json {expected}" in problem
    tokenizer = run_here("pretokenize", "--manifest", str(tmp_path / "e" / "manifest.json"))
    said = " ".join(tokenizer.stderr.split())  # the tokenizer loader reads config.json too,
    assert tokenizer.returncode == 2 and f"config.json {expected}" in said  # and was blamed
    assert "tokenizer" not in said


def test_weights_that_cannot_fit_the_machine_are_refused(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = _model_with(tmp_path, tiny_model_dir, None)
    resolved = _resolved(tmp_path, model)
    assert adapter_problem(resolved, str(model)) is None  # this machine holds it
    assert adapter_problem(resolved, str(model), memory_bytes=1 << 30) is None
    problem = adapter_problem(resolved, str(model), memory_bytes=4096)
    assert problem is not None and "B parameters, at least 0 GiB of weights" in problem
    sharded = resolved.model_copy(update={"distributed": {"strategy": "fsdp"}})
    assert adapter_problem(sharded, str(model), memory_bytes=4096) is None  # no one GPU holds it
    # 64 x 4e9 embedding and head weights: 1 TiB at 2 bytes each, more than any machine here
    (model / "config.json").write_text(_edited(tiny_model_dir, vocab_size=4 * 10**9))
    problem = adapter_problem(resolved, str(model))
    assert problem is not None and "its config.json describes" in problem, problem


def test_train_and_check_refuse_it_before_reading_data(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    model = _model_with(tmp_path, tiny_model_dir, _edited(tiny_model_dir, num_attention_heads=0))
    manifest = write_expert(tmp_path / "e", model, rows=8, base={"init": "random"})
    out = tmp_path / "e" / "out"
    code, _, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out))
    assert code == 2, err
    assert f"base model {model}: config.json gives num_attention_heads below 1" in " ".join(
        err.split()
    )
    assert not out.exists()
    assert not (tmp_path / "e" / ".cache").exists()  # no token cache was built
    code, stdout, _ = run_main(capsys, monkeypatch, "check", "-m", str(manifest), "--json")
    assert code == 2
    (problem,) = json.loads(stdout)["problems"]
    assert "config.json gives num_attention_heads below 1" in problem


def test_a_tokenizer_with_more_ids_than_the_embedding_has_rows(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A tokenizer from another model, or a config.json with a smaller vocab_size: the first
    example holding a larger id stopped the run with an IndexError inside the embedding. Now
    check and train name both sizes, before any data is tokenized."""
    small = {"vocab_size": 256, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0}
    model = _model_with(tmp_path, tiny_model_dir, _edited(tiny_model_dir, **small))
    manifest = write_expert(tmp_path / "e", model, rows=8, base={"init": "random"})
    resolved = resolve(load_manifest(manifest), Environment(cpu_count=2))
    tokens = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    assert adapter_problem(resolved, str(model), tokens=256) is None  # exactly fits
    problem = adapter_problem(resolved, str(model), tokens=257)
    assert problem == (
        f"base model {model}: its tokenizer uses 257 token ids, its embedding has 256 rows "
        "(config.json vocab_size); ids from 256 up have no embedding. Use the tokenizer saved "
        "with the model, or a config.json whose vocab_size is at least 257"
    )
    out = tmp_path / "e" / "out"
    code, _, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out))
    assert code == 2 and "its embedding has 256 rows" in " ".join(err.split()), err
    assert not out.exists() and not (tmp_path / "e" / ".cache").exists()
    code, stdout, _ = run_main(capsys, monkeypatch, "check", "-m", str(manifest), "--json")
    (problem,) = json.loads(stdout)["problems"]
    assert code == 2 and problem.startswith(f"base model {model}: its tokenizer uses "), problem
    assert tokens >= 257  # the tiny tokenizer's own model has room for every id


def test_weights_cut_short_are_named_by_check_and_train(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """An interrupted download or copy: the safetensors header claims more bytes than the file
    holds. Was a SafetensorError traceback after the data was tokenized."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    manifest = write_expert(tmp_path / "e", model, rows=8)
    expected = "model.safetensors is damaged (its header does not match its size)"
    code, stdout, _ = run_main(capsys, monkeypatch, "check", "-m", str(manifest), "--json")
    said = f"base model {model}: {expected}; download or copy it again"  # check says as train
    assert code == 2 and json.loads(stdout)["problems"] == [said]
    out = tmp_path / "e" / "out"
    code, _, err = run_main(capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out))
    assert code == 2
    assert f"base model {model}: {expected}; download or copy it again" in " ".join(err.split())
    assert not out.exists() and not (tmp_path / "e" / ".cache").exists()


def test_an_added_token_past_the_embedding_is_refused_only_when_the_data_holds_it(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Some models ship a tokenizer with an added token past their embedding that text never
    produces (Gemma 3's image token): such a model trains. When the data does hold it (here
    ChatML markers, ids 4001-4002, with 4001 embedding rows), train names the id after
    tokenizing instead of an IndexError in the first step."""
    model = _model_with(tmp_path, tiny_model_dir, _edited(tiny_model_dir, vocab_size=4001))
    plain = tmp_path / "plain"
    manifest = write_expert(plain, model, rows=8, base={"init": "random"})
    (plain / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"select {i} from orders"}) + "\n" for i in range(8))
    )
    code, _, err = run_main(
        capsys,
        monkeypatch,
        "train",
        "-m",
        str(manifest),
        "--output",
        str(plain / "out"),
        "--max-steps",
        "1",
        "--set",
        "evaluation_strategy=no",
    )
    assert code == 0, err
    code, stdout, _ = run_main(capsys, monkeypatch, "check", "-m", str(manifest), "--json")
    assert code == 0 and json.loads(stdout)["problems"] == []
    chat = write_expert(tmp_path / "chat", model, rows=8, base={"init": "random"})
    out = tmp_path / "chat" / "out"
    code, _, err = run_main(capsys, monkeypatch, "train", "-m", str(chat), "--output", str(out))
    assert code == 2
    assert (
        f"base model {model}: the tokenized data holds token id 4,002, its embedding has 4,001 "
        "rows: a token the tokenizer added past the model's vocabulary appears in the data"
    ) in " ".join(err.split())
    assert not out.exists()


@pytest.mark.parametrize("kind", ["lora", "dora", "ia3", "lokr", "adalora"])
def test_every_adapter_expert_cli_trains_passes_the_configuration_check(
    tmp_path: Path, tiny_model_dir: Path, kind: str
) -> None:
    """`generate`, `merge` and `package` refuse an adapter_config.json that cannot describe
    its weights; what peft saves for each adapter type expert-cli trains must pass."""
    from peft import AdaLoraConfig, IA3Config, LoKrConfig, LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from expert_cli.train.outputs import adapter_config_problem
    from expert_cli.weights import tensor_shapes

    targets = ["q_proj", "v_proj"]
    config = {
        "lora": LoraConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"),
        "dora": LoraConfig(r=4, target_modules=targets, use_dora=True, task_type="CAUSAL_LM"),
        "ia3": IA3Config(target_modules=targets, feedforward_modules=[], task_type="CAUSAL_LM"),
        "lokr": LoKrConfig(r=4, target_modules=targets, task_type="CAUSAL_LM"),
        "adalora": AdaLoraConfig(r=4, target_modules=targets, total_step=10, task_type="CAUSAL_LM"),
    }[kind]
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    names = tensor_shapes(tmp_path / "adapter_model.safetensors")
    assert names, kind
    assert adapter_config_problem(saved, names) is None
    saved["lora_alpha" if "lora_alpha" in saved else "target_modules"] = None  # and it can fail
    assert adapter_config_problem(saved, names) is not None


def test_a_configuration_that_does_not_fit_the_weights_is_named(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """An adapter_config.json whose rank or target modules are not the weights' (a hand edit,
    a file copied from another run): peft loaded the first in a size-mismatch traceback and
    the second by dropping the weights of the layers left out. Both are named; what peft
    itself writes for a rank pattern or a regular expression passes."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from expert_cli.train.outputs import adapter_config_problem
    from expert_cli.weights import tensor_shapes

    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], rank_pattern={"v_proj": 2})
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    shapes = tensor_shapes(tmp_path / "adapter_model.safetensors")
    assert adapter_config_problem(saved, shapes) is None
    for edit, expected in [
        (
            {"r": 8},
            "r: 8 for model.layers.0.self_attn.q_proj, but its weights are of rank 4 (base_",
        ),
        ({"rank_pattern": {}}, "r: 4 for model.layers.0.self_attn.v_proj, but its weights are of"),
        # a pattern naming the wrong layer: each layer's rank is the one peft gives it
        ({"rank_pattern": {"q_proj": 2}}, "rank_pattern: 2 for model.layers.0.self_attn.q_proj,"),
        ({"rank_pattern": {"v_proj": [2]}}, "rank_pattern: a list"),  # was a TypeError
        ({"rank_pattern": {"(": 2}}, "rank_pattern: a key that is no regular expression"),
        ({"target_modules": ["q_proj"]}, "target_modules does not name model.layers.0.self_"),
        ({"target_modules": r".*\.q_proj"}, "v_proj and 1 more, which the weights beside"),
        ({"target_modules": "(["}, "target_modules: not a regular expression"),
        ({"target_modules": "a{99999999999}"}, "target_modules: not a regular expression"),
        ({"target_modules": "(.*)*x"}, "(or one too long, or with a repeated group holding a"),
    ]:
        problem = adapter_config_problem({**saved, **edit}, shapes)
        assert problem is not None and expected in problem, (edit, problem)
    for fits in (
        {"target_modules": r".*\.(q|v)_proj"},
        {"target_modules": ["v_proj", "q_proj"]},
        {"target_modules": "ALL-LINEAR"},  # peft compares it in lower case
        {"r": 2, "rank_pattern": {"q_proj": 4}},
    ):
        assert adapter_config_problem({**saved, **fits}, shapes) is None


def test_adalora_eval_loss_is_the_language_model_loss(tmp_path: Path, tiny_model_dir: Path) -> None:
    """peft adds AdaLoRA's orthogonal regulariser to every loss given labels, eval's too: its
    eval loss read ~1.9 above LoRA's on the same frozen base. With the learning rate at 0 both
    adapters are the identity: the eval losses agree, the training losses differ by the
    regulariser (part of AdaLoRA's objective, and said in a note), and the training losses
    logged agree too: each is the language-model loss alone."""
    losses = {}
    for kind in ("lora", "adalora"):
        manifest = write_expert(
            tmp_path / kind,
            tiny_model_dir,
            rows=16,
            valid_rows=4,
            config={  # the warm-up's first step has learning rate 0
                "adapter_type": kind,
                "warmup_steps": 1,
                "lr_scheduler": "linear",
                "evaluation_strategy": "steps",
                "eval_steps": 1,
            },
        )
        out = tmp_path / kind / "run"
        done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "1")
        text = done.stdout
        assert done.returncode == 0, text + done.stderr
        metrics = json.loads((out / "metrics.json").read_text())
        losses[kind] = (metrics["windows"][0]["loss"], metrics["evals"][0]["eval_loss"])
        if kind == "adalora":
            assert "adalora trains with peft's orthogonal regulariser" in text
    assert losses["adalora"][1] == pytest.approx(losses["lora"][1], abs=1e-4)
    assert losses["adalora"][0] == pytest.approx(losses["lora"][0], abs=1e-4)


def test_an_adalora_run_loads_without_peft_warnings(tmp_path: Path, tiny_model_dir: Path) -> None:
    """AdaLoRA saves its rank pattern under the adapted weights' names; peft read them as
    module names and warned of every one when generate or merge loaded the run (~40 lines)."""
    import warnings

    import torch

    from expert_cli.train.merge import load_adapted
    from expert_cli.train.outputs import adapter_base

    manifest = write_expert(
        tmp_path / "e", tiny_model_dir, rows=16, config={"adapter_type": "adalora"}
    )
    run = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(run), "--max-steps", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((run / "adapter_config.json").read_text())["rank_pattern"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_adapted(run, adapter_base(run), torch.float32)
    assert not [w for w in caught if "rank_pattern" in str(w.message)]


def _adalora_step(rows: list, batch: int, accumulation: int, tmp_path: Path):
    """One SGD step (learning rate 1) of an AdaLoRA adapter on the demo's architecture with
    the run's trainer: the change of the trainable weights, and the logged loss."""
    import types

    import datasets
    import torch
    from peft import AdaLoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    from expert_cli.train.trainer import build_trainer

    config = AutoConfig.from_pretrained(Path(__file__).parents[2] / "experts/demo/model")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    adapter = AdaLoraConfig(
        init_r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        total_step=10,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, adapter)
    args = TrainingArguments(
        output_dir=str(tmp_path / f"out-{accumulation}"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    data = types.SimpleNamespace(train=datasets.Dataset.from_list(rows), eval=None)
    tokenizer = AutoTokenizer.from_pretrained(Path(__file__).parents[2] / "experts/demo/model")
    trainer, _ = build_trainer(model, args, data, tokenizer, "sdpa")
    # the language-model loss before the step (AdaLoRA starts as the identity): each row
    # alone, weighted by the tokens it trains, with the regulariser off
    config = model.peft_config["default"]
    weight, config.orth_reg_weight = config.orth_reg_weight, 0.0
    with torch.no_grad():
        summed = trained = 0.0
        for row in rows:
            ids, labels = (torch.tensor([row[k]]) for k in ("input_ids", "labels"))
            count = int((labels[0, 1:] != -100).sum())
            summed += model(input_ids=ids, labels=labels).loss.item() * count
            trained += count
    config.orth_reg_weight = weight  # as the trainer shared it
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(model.named_parameters())
    change = torch.cat([(before[n] - after[n].detach()).flatten() for n in before])
    trainer.save_model(str(tmp_path / f"saved-{accumulation}"))  # the weight as configured
    saved = json.loads((tmp_path / f"saved-{accumulation}" / "adapter_config.json").read_text())
    assert saved["orth_reg_weight"] == 0.5
    return change, trainer.state.log_history[0]["loss"], summed / trained


def test_adaloras_regulariser_counts_once_per_optimizer_step(tmp_path: Path) -> None:
    """peft adds the regulariser to each micro-batch's loss, which the Trainer sums over the
    accumulation steps: at 4 micro-batches the logged loss read 12.06 for 9.19 and the
    gradients were 3x off. Now 1, 2 or 4 micro-batches make the same step, and the logged
    loss is the language-model loss alone (it read ~0.5 above it: the regulariser's share)."""
    import numpy as np

    draw = np.random.default_rng(0)
    rows = []
    for length, trained in ((20, 0.9), (28, 0.1), (16, 0.5), (24, 0.05)):
        ids = draw.integers(1, 4000, length).tolist()
        cut = length - max(1, int(length * trained))
        labels = [-100] * cut + ids[cut:]
        rows.append({"input_ids": ids, "labels": labels, "position_ids": list(range(length))})
    whole, loss, language = _adalora_step(rows, 4, 1, tmp_path)
    assert loss == pytest.approx(language, rel=1e-4)
    for batch, accumulation in ((2, 2), (1, 4)):
        change, logged, _ = _adalora_step(rows, batch, accumulation, tmp_path)
        assert logged == pytest.approx(language, rel=1e-4)
        assert ((change - whole).norm() / whole.norm()).item() < 1e-4


def test_an_ia3_run_on_all_linear_loads(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """peft saves all-linear as the layers' full names; the feed-forward modules stayed short
    names, so peft refused the run's own adapter_config.json: generate and merge exit 2, and
    package shipped it as sound. Such a file is now a problem by name."""
    from train_helpers import load_adapter

    from expert_cli.train.outputs import adapter_config_problem

    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8)
    out = tmp_path / "run"
    code, _, err = run_main(
        capsys, monkeypatch, "train", "-m", str(manifest), "--output", str(out),
        "--max-steps", "1", "--set", "adapter_type=ia3",
    )  # fmt: skip
    assert code == 0, err
    saved = json.loads((out / "adapter_config.json").read_text())
    assert "model.layers.1.mlp.down_proj" in saved["feedforward_modules"]
    layer = load_adapter(out).base_model.model.model.layers[1]
    assert layer.mlp.down_proj.is_feedforward and not layer.self_attn.v_proj.is_feedforward
    assert adapter_config_problem(saved, None) is None
    saved["feedforward_modules"] = ["down_proj"]  # as runs before this fix wrote it
    assert adapter_config_problem(saved, None) == (
        "peft refuses it as a configuration of type IA3 (ValueError)"
    )


def test_ia3_scales_the_feed_forward_input_by_default(tmp_path: Path) -> None:
    """IA3 with all-linear and no feedforward_modules scaled the down projection's output;
    IA3 scales a feed-forward layer's input (peft's mapping for the architecture)."""
    import transformers as T
    from peft import get_peft_model

    from expert_cli.config.environment import cpu_environment
    from expert_cli.train.adapter import adapter_config

    demo = Path(__file__).parents[2] / "experts" / "demo"
    overrides = ["adapter_type=ia3", "base_models.0.adapters.0.type=ia3"]
    resolved = resolve(load_manifest(demo / "manifest.json", overrides), cpu_environment())
    config = T.AutoConfig.from_pretrained(demo / "model")
    model = get_peft_model(
        T.AutoModelForCausalLM.from_config(config),
        adapter_config(resolved, 1, config.model_type),
    )
    layer = model.base_model.model.model.layers[0]
    assert layer.mlp.down_proj.is_feedforward
    assert tuple(layer.mlp.down_proj.ia3_l["default"].shape) == (1, config.intermediate_size)
    assert not layer.self_attn.v_proj.is_feedforward  # an attention output is scaled


def test_added_tokens_the_base_model_never_trained_get_a_note(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """A base model can ship chat markers whose embedding rows pretraining never reached (zero,
    as Llama 3's base model has them); the adapter leaves those rows frozen, so a run on chat
    data cannot teach them. It trained without a word; now a note names them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from expert_cli.train.architecture import untrained_added_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert untrained_added_tokens(trained, tokenizer) == {}
    with torch.no_grad():  # tied: the output rows are these too
        trained.get_input_embeddings().weight[4001].zero_()
    assert untrained_added_tokens(trained, tokenizer) == {4001: "<|im_start|>"}
    model = tmp_path / "model"
    trained.save_pretrained(model)
    tokenizer.save_pretrained(model)
    for folder, base in (("chat", model), ("plain", tiny_model_dir)):
        manifest = write_expert(tmp_path / folder, base, rows=8)
        out = tmp_path / folder / "out"
        code, stdout, err = run_main(
            capsys,
            monkeypatch,
            "train",
            "-m",
            str(manifest),
            "--output",
            str(out),
            "--max-steps",
            "1",
        )
        assert code == 0, err
        said = "tokens '<|im_start|>' (4,001) appear in the data, but their embedding rows" in (
            " ".join(stdout.split())
        )
        assert said == (folder == "chat"), stdout


def test_adaloras_schedule_prunes_between_a_warm_up_and_a_final_phase(tiny_model_dir: Path) -> None:
    """peft's defaults (tinit 0, tfinal 0) pruned ranks from the first step, on importance
    scores of one step, and kept pruning to the last."""
    from expert_cli.config.environment import cpu_environment
    from expert_cli.train.adapter import adapter_config

    demo = Path(__file__).parents[2] / "experts" / "demo"
    overrides = ["adapter_type=adalora", "base_models.0.adapters.0.type=adalora"]
    resolved = resolve(load_manifest(demo / "manifest.json", overrides), cpu_environment())
    config = adapter_config(resolved, 118)
    assert (config.total_step, config.tinit, config.tfinal) == (118, 11, 23)
    short = adapter_config(resolved, 3)  # too short for either phase: peft still accepts it
    assert (short.tinit, short.tfinal) == (0, 0)


def test_adaloras_regulariser_share_follows_each_windows_micro_batches(tmp_path: Path) -> None:
    """An epoch of 3 micro-batches at 2 per step ends on a window of 1: its regulariser was
    still divided by 2, half its weight for that step."""
    import types

    import datasets
    import torch
    from peft import AdaLoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    from expert_cli.train.trainer import build_trainer

    demo = Path(__file__).parents[2] / "experts" / "demo" / "model"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(demo))
    adapter = AdaLoraConfig(
        init_r=4, target_modules=["q_proj"], total_step=2, task_type="CAUSAL_LM"
    )
    model = get_peft_model(model, adapter)
    ids = list(range(1, 9))
    rows = [{"input_ids": ids, "labels": ids, "position_ids": list(range(8))}] * 3
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
        save_strategy="no",
        disable_tqdm=True,
    )
    data = types.SimpleNamespace(train=datasets.Dataset.from_list(rows), eval=None)
    trainer, _ = build_trainer(model, args, data, AutoTokenizer.from_pretrained(demo), "sdpa")
    seen = []
    forward = model.forward

    def watched(*a, **k):
        seen.append(model.peft_config["default"].orth_reg_weight)
        return forward(*a, **k)

    model.forward = watched
    trainer.train()
    assert seen == [0.25, 0.25, 0.5]


def test_a_pruned_adalora_checkpoint_is_not_resumed(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Once AdaLoRA prunes ranks its checkpoints hold the pruned shapes (and a rank_pattern):
    --resume rebuilt the adapter at its first rank and died in a size-mismatch traceback,
    after Ctrl-C had said --resume continues. It is exit 2 saying what can be done."""
    manifest = write_expert(
        tmp_path / "e",
        tiny_model_dir,
        rows=48,
        config={"adapter_type": "adalora", "save_steps": 10},
    )
    out = tmp_path / "run"
    done = run_here("train", "-m", str(manifest), "--output", str(out), "--max-steps", "20")
    assert done.returncode == 0, done.stdout + done.stderr
    saved = json.loads((out / "checkpoints" / "checkpoint-20" / "adapter_config.json").read_text())
    assert saved["rank_pattern"]  # pruned by step 20
    (out / "adapter_model.safetensors").unlink()  # killed before the final save
    again = run_here("train", "-m", str(manifest), "--output", str(out), "--resume")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert (
        "--resume: checkpoint-20 holds an AdaLoRA adapter whose ranks were pruned, which "
        "training cannot continue from"
    ) in " ".join(again.stderr.split())
    assert "package --checkpoint checkpoint-20" in " ".join(again.stderr.split())


def test_the_ia3_line_names_no_rank(tmp_path: Path, tiny_model_dir: Path) -> None:
    """IA3 scales activations; `adapter ia3 r=8 alpha=16 dropout=0` named settings it has not."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir, rows=8, config={"adapter_type": "ia3"})
    done = run_here(
        "train", "-m", str(manifest), "--output", str(tmp_path / "o"), "--max-steps", "1"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("adapter ")]
    assert line.split()[1:3] == ["ia3", "targets=all-linear:"] and "r=" not in line


def test_a_config_names_its_own_fields_and_custom_code(tmp_path: Path) -> None:
    """A GPT-2 config.json with n_layer 0 was named by transformers' alias num_hidden_layers;
    a custom-code config lost the trust_remote_code advice to "cannot be read"."""
    from transformers import GPT2Config

    from expert_cli.data.tokenizer import config_problem

    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=64).save_pretrained(tmp_path / "g")
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    (tmp_path / "g" / "config.json").write_text(json.dumps({**config, "n_layer": 0}))
    assert config_problem(str(tmp_path / "g"), False) == (
        f"base model {tmp_path / 'g'}: config.json gives n_layer below 1; a model needs at "
        "least one"
    )
    (tmp_path / "c").mkdir()
    custom = {"model_type": "mine", "auto_map": {"AutoConfig": "conf.MyConfig"}}
    (tmp_path / "c" / "config.json").write_text(json.dumps(custom))
    (tmp_path / "c" / "conf.py").write_text("raise SystemExit('never run')\n")
    assert 'is custom code; set "trust_remote_code": true' in (
        config_problem(str(tmp_path / "c"), False) or ""
    )
