"""One metrics.json write at a logging window of a long run, timed on the CPU.

A run rewrites metrics.json at every logging window, with every window so far. Serialising
all of them again each time (`whole`, the code before 2026-12-05) costs in proportion to the
run's length; `MetricsFile` (train/metrics_file.py) serialises each window once and puts the
file together from those texts (`cached`: a write after the windows before it were written).
Both write the same bytes. Windows are a real run's (the demo's window record, its fields as
`train` writes them), repeated; each way's best of `--repeat` writes is kept (the machine is
shared).

    python scripts/bench_metrics_write.py        # JSON to bench_results/metrics_write.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_step_ops import provenance, write_report  # noqa: E402

from expert_cli.atomic import write_json_atomic  # noqa: E402
from expert_cli.train.metrics_file import MetricsFile  # noqa: E402

# a window as `train` records it on one GPU (the fields of ThroughputMeter.close_window)
WINDOW: dict[str, Any] = {
    "step": 0,
    "tokens_per_s": 89930.4,
    "samples_per_s": 190.12,
    "data_wait_fraction": 0.0021,
    "mfu": 0.2921,
    "peak_memory_gb": 40.512,
    "allocator_flushes": 0,
    "loss": 1.2345,
    "learning_rate": 0.000198,
    "seconds": 3.634,
    "time": 1234.567,  # seconds since the run's start
}


def best_ms(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1000 * min(times), 2)


def measure(n: int, repeat: int, folder: Path) -> dict[str, Any]:
    windows = [dict(WINDOW, step=10 * (i + 1)) for i in range(n)]
    rest = {"evals": [], "summary": {"status": "running", "steps": 10 * n}}
    whole = folder / "whole.json"
    cached = MetricsFile(folder / "cached.json")
    cached.write(windows[:-1], rest, running=False)  # the windows before this one

    def one_cached() -> None:
        cached._texts = cached._texts[: n - 1]  # this window is new at each write
        cached.write(windows, rest, running=False)

    result = {
        "windows": n,
        "whole_ms": best_ms(lambda: write_json_atomic(whole, {"windows": windows, **rest}), repeat),
        "cached_ms": best_ms(one_cached, repeat),
        "file_kb": round((folder / "cached.json").stat().st_size / 1024),
    }
    assert whole.read_bytes() == (folder / "cached.json").read_bytes()
    result["ratio"] = round(result["whole_ms"] / result["cached_ms"], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", default="100,1000,10000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--output", type=Path, default=ROOT / "bench_results" / "metrics_write.json"
    )
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.windows.split(",")):
            results.append(measure(n, args.repeat, Path(tmp)))
            print(results[-1])
    report = {
        "what": "ms of one metrics.json write at a logging window (best of rounds), CPU",
        **provenance(),
        "results": results,
    }
    write_report(args.output, report)


if __name__ == "__main__":
    main()
