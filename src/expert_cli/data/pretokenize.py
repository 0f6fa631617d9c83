"""`expert-cli pretokenize`: build or confirm the token cache of one manifest or many."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from expert_cli.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from expert_cli.data import PreparedData

SKIP_PARTS = {".cache", ".git", "node_modules", "checkpoints"}


def find_manifests(manifests: list[Path], all_dir: Path | None) -> list[Path]:
    """The explicit manifests, then every manifest.json under `all_dir` (sorted, unique)."""
    found = [Path(m) for m in manifests]
    if all_dir is not None:
        if not all_dir.is_dir():
            raise UserError(f"--all {all_dir}: not a folder")
        under = sorted(
            p
            for p in all_dir.rglob("manifest.json")
            if not SKIP_PARTS.intersection(p.relative_to(all_dir).parts)
        )
        if not under:
            raise UserError(f"--all {all_dir}: no manifest.json found")
        found += under
    if not found:
        raise UserError("pretokenize: give --manifest M (one or more) or --all DIR")
    unique = {p.resolve(): None for p in found}
    return list(unique)


def pretokenize_one(manifest: Path, num_proc: int | None, force: bool) -> PreparedData:
    """Build or confirm the cache of one manifest."""
    from expert_cli.config import load_manifest
    from expert_cli.data import prepare_data
    from expert_cli.data.tokenizer import load_tokenizer
    from expert_cli.environment import cpu_environment
    from expert_cli.resolve import resolve

    resolved = resolve(load_manifest(manifest), cpu_environment())
    tokenizer = load_tokenizer(resolved)
    return prepare_data(resolved, tokenizer, num_proc=num_proc, force=force)


def summary_lines(name: str, data: PreparedData) -> list[str]:
    """What happened to one cache, with its train stats, as printable lines."""
    train: dict[str, Any] = data.stats["train"]
    lines = [f"{name}: {data.status} ({data.reason})"]
    lines.append(
        f"  rows {train['rows']:,}, tokens {train['tokens']:,}, trained "
        f"{train['trained_tokens']:,}, packing efficiency {train['packing_efficiency']:.1%}, "
        f"examples {train['examples_read']:,} read / {train['kept']:,} kept / "
        f"{train['truncated']:,} truncated / {train['dropped']:,} dropped"
    )
    if data.stats.get("eval"):
        ev = data.stats["eval"]
        lines.append(f"  eval: rows {ev['rows']:,}, tokens {ev['tokens']:,}")
    speed = data.stats.get("tokens_per_second")
    lines.append(
        f"  built in {data.stats['build_seconds']:.1f} s ({speed:,.0f} tokens/s); "
        f"cache {data.cache_dir}"
    )
    return lines


def run_pretokenize(
    manifests: list[Path], all_dir: Path | None, num_proc: int | None, force: bool, console: Console
) -> None:
    """Pretokenize every manifest; print a summary each; raise UserError listing bad ones."""
    problems: list[str] = []
    for manifest in find_manifests(manifests, all_dir):
        try:
            data = pretokenize_one(manifest, num_proc, force)
        except UserError as exc:
            problems += exc.lines
            console.print(f"{manifest}: failed (bad input, see below)", markup=False)
            continue
        name = data.stats["inputs"]["expert"]
        for line in summary_lines(name, data):
            console.print(line, markup=False, highlight=False)
    if problems:
        raise UserError(problems)
