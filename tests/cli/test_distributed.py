"""The same command under the launchers users already trust, on CPU processes (gloo): FSDP
against one process, resume from FSDP's sharded checkpoint, two "nodes" over localhost with
node-local caches, accelerate launch, and the DeepSpeed path."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from train_helpers import ROOT, launch, load_adapter, read_metrics, window_losses, write_expert

FSDP_ON_CPU = ROOT / "tests" / "fixtures" / "fsdp_on_cpu"
TORCHRUN_2 = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(out: Path, manifest: Path, *extra: str) -> list[str]:
    return ["train", "--manifest", str(manifest), "--output", str(out), *extra]


def _runtime(out: Path) -> dict:
    return json.loads((out / "manifest.resolved.json").read_text())["runtime"]


@pytest.mark.slow
def test_fsdp_two_processes_match_one_and_resume_from_sharded_checkpoints(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Same seed and global batch (1 x 4 rows against 2 x 2): the same loss curve; the FSDP
    run stops at step 2 and resumes from its sharded checkpoint to step 4."""
    from train_helpers import run_here

    fsdp = {"strategy": "fsdp", "fsdp": "full_shard auto_wrap"}
    one = write_expert(tmp_path / "one", tiny_model_dir, config={"batch_size": 4, "save_steps": 2})
    two = write_expert(tmp_path / "two", tiny_model_dir, config={"batch_size": 2, "save_steps": 2})
    data = json.loads(two.read_text())
    data["training"]["distributed"] = fsdp
    two.write_text(json.dumps(data))

    single = run_here(*_train(tmp_path / "a", one, "--max-steps", "4"))
    assert single.returncode == 0, single.stdout + single.stderr

    env = {"PYTHONPATH": str(FSDP_ON_CPU)}
    first = launch(TORCHRUN_2, *_train(tmp_path / "b", two, "--max-steps", "2"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    shards = tmp_path / "b" / "checkpoints" / "checkpoint-2"
    assert sorted(p.name for p in (shards / "optimizer_0").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]  # each rank wrote its part of the optimizer state
    second = launch(
        TORCHRUN_2, *_train(tmp_path / "b", two, "--max-steps", "4", "--resume"), env=env
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resuming from checkpoint-2 (step 2 of 4)" in second.stdout

    runtime = _runtime(tmp_path / "b")
    assert runtime["distributed"] == {
        "engine": "fsdp",
        "world_size": 2,
        "nodes": 1,
        "backend": "gloo",
    }
    expected, got = window_losses(tmp_path / "a"), window_losses(tmp_path / "b")
    assert sorted(got) == [1, 2, 3, 4]
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-4), (step, expected, got)
    gathered = load_file(tmp_path / "b" / "adapter_model.safetensors")
    alone = load_file(tmp_path / "a" / "adapter_model.safetensors")
    assert {k: v.shape for k, v in gathered.items()} == {k: v.shape for k, v in alone.items()}
    for key, tensor in alone.items():  # full tensors, not shards, and the same training
        assert (gathered[key] - tensor).abs().max() < 1e-4, key
    assert load_adapter(tmp_path / "b") is not None  # PeftModel.from_pretrained takes it


@pytest.mark.slow
def test_two_nodes_over_localhost_with_node_local_caches(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """torchrun --nnodes 2 --nproc_per_node 1 twice (node ranks 0 and 1): one adapter, rank 0
    prints, each node builds the token cache in its own root, every rank's figures recorded.
    The expert's fused loss runs the LM head on its answers' tokens alone: each rank's batches
    carry their own loss positions through DDP and accelerate's loader, and the two processes
    of 2 rows train as one process of 4 rows."""
    from train_helpers import cli_env, prompt_heavy_expert, run_here

    manifest = prompt_heavy_expert(tmp_path / "e", tiny_model_dir)
    alone = prompt_heavy_expert(tmp_path / "alone", tiny_model_dir, batch_size=4)
    # an evaluation at the end, on a quarter held out: each process evaluates its share
    evals = ("--set", "training.dataset.eval_fraction=0.25", "--set", "eval_steps=3")
    evals += ("--set", "evaluation_strategy=steps", "--set", "learning_rate=0.02")
    single = run_here(*_train(tmp_path / "a", alone, "--max-steps", "3", *evals))
    assert single.returncode == 0, single.stdout + single.stderr
    assert "the LM head on trained tokens only" in single.stdout
    out, port = tmp_path / "out", _free_port()
    nodes, logs = [], []
    try:
        for node in (0, 1):
            launcher = [
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc_per_node",
                "1",
                "--node_rank",
                str(node),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
            ]
            cache = f"pretokenized_cache={tmp_path / f'node{node}-disk' / 'cache'}"
            args = _train(out, manifest, "--max-steps", "3", "--set", cache, *evals)
            log = (tmp_path / f"node{node}.out", tmp_path / f"node{node}.err")
            logs.append(log)
            with log[0].open("w") as stdout, log[1].open("w") as stderr:  # no pipe to fill
                nodes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", *launcher, "-m", "expert_cli.cli", *args],
                        stdout=stdout,
                        stderr=stderr,
                        text=True,
                        env=cli_env(),
                        cwd=ROOT,
                        start_new_session=True,
                    )
                )
        codes = [popen.wait(timeout=240) for popen in nodes]
    finally:
        for popen in nodes:  # torchrun and its worker, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
    results = [(o.read_text(), e.read_text()) for o, e in logs]
    for code, (stdout, stderr) in zip(codes, results, strict=True):
        assert code == 0, stdout + stderr
    printed = results[0][0] + results[1][0]
    assert printed.count("completed") == 1 and printed.count("trainable of") == 1
    assert "distributed: ddp over 2 processes on 2 nodes (gloo)" in " ".join(printed.split())
    assert (out / "adapter_model.safetensors").is_file() and not list(out.glob(".final-*"))
    for node in (0, 1):  # each node-local root holds one whole cache, built there
        caches = list((tmp_path / f"node{node}-disk" / "cache").glob("expert-test-*"))
        assert len(caches) == 1, caches
    runtime = _runtime(out)
    assert runtime["distributed"] == {
        "engine": "ddp",
        "world_size": 2,
        "nodes": 2,
        "backend": "gloo",
    }
    metrics = read_metrics(out)
    summary = metrics["summary"]
    assert summary["steps"] == 3 and summary["status"] == "completed"
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sum(r["tokens"] for r in ranks) == summary["tokens"]
    assert sum(r["tokens_per_s"] for r in ranks) == pytest.approx(summary["tokens_per_s"])
    assert summary["data_wait_fraction"] >= max(r["data_wait_fraction"] for r in ranks) - 1e-9
    assert all(len(w["ranks"]) == 2 for w in metrics["windows"])
    expected, got = window_losses(tmp_path / "a"), window_losses(out)
    assert sorted(got) == [1, 2, 3]
    assert got == pytest.approx(expected, rel=1e-5)
    # the evaluation over two processes is the one process's: its loss and token accuracy
    # summed over both processes' shares (the fused loss counts the accuracy in its forward)
    (one,), (two,) = read_metrics(tmp_path / "a")["evals"], metrics["evals"]
    assert two["step"] == one["step"] == 3 and 0 < one["token_accuracy"] <= 1
    assert two["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-5)
    assert two["token_accuracy"] == pytest.approx(one["token_accuracy"], abs=1e-12)


@pytest.mark.slow
def test_accelerate_launch_with_a_config_file(tmp_path: Path, tiny_model_dir: Path) -> None:
    """docs/distributed.md's CPU config: 2 processes, one adapter, rank 0 prints; FSDP asked
    for on CPU processes (without the test's patch) is DDP, and the run says so."""
    manifest = write_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["distributed"] = {"strategy": "fsdp"}
    manifest.write_text(json.dumps(data))
    config = tmp_path / "accelerate.yaml"
    text = (ROOT / "docs" / "accelerate-cpu.yaml").read_text()
    config.write_text(text.replace("29500", str(_free_port())))
    out = tmp_path / "out"
    launcher = ["accelerate.commands.launch", "--config_file", str(config)]
    proc = launch(launcher, *_train(out, manifest, "--max-steps", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("completed") == 1
    printed = " ".join(proc.stdout.split())
    assert (  # why, from the resolution, once; then what ran
        "training.distributed.strategy: fsdp runs on GPUs only (accelerate); several processes "
        "on this machine would run DDP" in printed
    )
    assert "training.distributed.strategy fsdp was asked, this run is ddp" in printed
    assert printed.count("on GPUs only") == 1
    assert (out / "adapter_model.safetensors").is_file()
    assert _runtime(out)["distributed"]["world_size"] == 2
    assert [r["rank"] for r in read_metrics(out)["summary"]["ranks"]] == [0, 1]
    # a resume under a launcher: the FSDP test above (torchrun); the last step's checkpoint
    # saved as the final adapter: test_resume.py (one process), to keep the suite's time


def test_deepspeed_runs_where_it_can_or_says_what_is_missing(
    capsys, monkeypatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """DeepSpeed needs GPUs under accelerate (it is skipped for CPU processes), so here: the
    missing engine is exit 2 naming the extra to install, and never a traceback."""
    from train_helpers import run_main

    manifest = write_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["distributed"] = {
        "strategy": "deepspeed",
        "deepspeed": {"zero_optimization": {"stage": 2}},
    }
    manifest.write_text(json.dumps(data))
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed: accelerate runs it only on GPUs, none here")
    code, out, err = run_main(
        capsys, monkeypatch, *_train(tmp_path / "out", manifest, "--max-steps", "1")
    )
    assert code == 2, out + err
    text = " ".join(err.split())
    assert "training.distributed.strategy: deepspeed is not installed" in text
    assert "pip install 'expert-cli[deepspeed]'" in text
    assert not (tmp_path / "out").exists()
    code, out, err = run_main(capsys, monkeypatch, "check", "--manifest", str(manifest))
    said = " ".join(out.split())  # it said "manifest is usable"
    assert code == 2 and "training.distributed.strategy: deepspeed is not installed" in said


@pytest.mark.gpu
@pytest.mark.slow
def test_deepspeed_zero2_trains_on_gpus(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Where DeepSpeed can run (installed, CUDA GPUs): ZeRO-2 from the manifest's block trains
    and writes one adapter; elsewhere skipped, saying which of the two is missing."""
    import torch

    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install 'expert-cli[deepspeed]')")
    if not torch.cuda.is_available():
        pytest.skip("DeepSpeed runs under accelerate on GPUs only; this machine has none")
    manifest = write_expert(tmp_path / "e", tiny_model_dir)
    data = json.loads(manifest.read_text())
    data["training"]["distributed"] = {
        "strategy": "deepspeed",
        "deepspeed": {
            "zero_optimization": {"stage": 2},
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
        },
    }
    manifest.write_text(json.dumps(data))
    processes = str(min(2, torch.cuda.device_count()))
    launcher = ["torch.distributed.run", "--standalone", "--nproc_per_node", processes]
    out = tmp_path / "out"
    proc = launch(launcher, *_train(out, manifest, "--max-steps", "2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "adapter_model.safetensors").is_file()
    assert _runtime(out)["distributed"]["engine"] == "deepspeed"


def test_a_resume_on_another_number_of_processes_is_refused() -> None:
    """A run of 2 processes resumed as one trained at half the rows a step, its loss curve
    parting from the uninterrupted run's without a word (and 1 resumed on 2 at twice)."""
    from expert_cli.errors import UserError
    from expert_cli.train.distributed import refuse_world_change

    began_on_two = {"runtime": {"world_size": 2}}
    with pytest.raises(UserError) as err:
        refuse_world_change(began_on_two, 1, 2)
    assert err.value.lines == [
        "--resume: the run trained on 2 processes (4 rows a step), this one has 1 (2 rows a "
        "step); continue it as it began: torchrun --nproc_per_node 2 -m expert_cli.cli train "
        "... --resume"
    ]
    with pytest.raises(UserError, match="trained on 1 process .2 rows a step.*: expert-cli train"):
        refuse_world_change({"runtime": {"world_size": 1}}, 2, 2)
    refuse_world_change(began_on_two, 2, 2)  # the same: nothing to say
    two_nodes = {"runtime": {"world_size": 16, "distributed": {"nodes": 2}}}
    with pytest.raises(UserError, match="torchrun --nnodes 2 --nproc_per_node 8 -m expert_cli"):
        refuse_world_change(two_nodes, 8, 2)
    for unknown in ({}, {"runtime": {"world_size": "2"}}, {"runtime": None}):
        refuse_world_change(unknown, 1, 2)  # not recorded (an earlier version): not refused


def test_the_printed_continue_command_keeps_the_launcher(monkeypatch) -> None:
    """An interrupted torchrun run printed `expert-cli train ... --resume`, which resumed on
    one process at half the rows a step; it prints the launcher it needs."""
    from expert_cli.cli.train_view import _launcher

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _launcher() == "expert-cli"
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _launcher() == "torchrun --nproc_per_node 2 -m expert_cli.cli"


def test_a_collective_failing_for_a_lost_peer_is_named(monkeypatch) -> None:
    """Another rank killed mid-run: rank 0 printed gloo's raw traceback from inside the
    Trainer's all_gather. A collective error under a process group is one line, exit 1."""
    import torch.distributed as dist

    from expert_cli.train import distributed

    lost = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    assert not distributed.peer_lost(lost)  # no process group: not a collective's
    monkeypatch.setattr(distributed, "initialized", lambda: True)
    assert distributed.peer_lost(lost) and distributed.peer_lost(dist.DistNetworkError("x"))
    assert not distributed.peer_lost(dist.DistBackendError("unhandled cuda error"))  # its own
    assert not distributed.peer_lost(RuntimeError("shape mismatch"))
    assert not distributed.peer_lost(ValueError("Connection reset by peer"))


def test_processes_reading_other_data_are_stopped(monkeypatch) -> None:
    """Two nodes with node-local data that differ trained on other examples without a word,
    or hung at the end of the shorter epoch. The caches are compared before training (the
    gather is faked here: the two-node test above runs the real one on equal data)."""
    from types import SimpleNamespace

    from expert_cli.errors import UserError
    from expert_cli.train import distributed

    stats = {"fingerprint": "ab" * 32, "train": {"tokens": 1000, "trained_tokens": 100}}
    data = SimpleNamespace(stats=stats, train=[0] * 400, eval=None)
    monkeypatch.setattr(distributed, "initialized", lambda: True)
    other = [200.0, 0.0, 500.0, 50.0]
    monkeypatch.setattr(distributed, "gather_over_ranks", lambda mine: [mine, other])
    with pytest.raises(UserError, match="rank 1's token cache holds 200 training rows of 500 "):
        distributed.refuse_differing_data(data)
    # the same rows and tokens under another fingerprint (a large file copied to each node
    # gets another mtime, which the fingerprint takes in): the same data, not refused
    monkeypatch.setattr(distributed, "gather_over_ranks", lambda mine: [mine, list(mine)])
    distributed.refuse_differing_data(data)
    monkeypatch.setattr(distributed, "gather_over_ranks", lambda mine: [mine, list(mine)])
    distributed.refuse_differing_data(data)  # the same cache on both: nothing to say
