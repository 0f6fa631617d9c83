"""`expert-cli pretokenize` and `expert-cli find-datasets`: the data commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from expert_cli.cli.options import MANIFEST_PATH, JsonOpt, folder_named

if TYPE_CHECKING:
    from expert_cli.data import PreparedData
    from expert_cli.data.earlier import Earlier
    from expert_cli.data.pretokenize import Outcome

WIDE_DATASETS = 160  # columns the cached datasets' table needs to show a path on a line or two


def pretokenize(
    manifest: Annotated[
        list[Path] | None,
        typer.Option(
            "--manifest", "-m", help="A manifest.json; repeat for several.", parser=MANIFEST_PATH
        ),
    ] = None,
    all_dir: Annotated[
        Path | None,
        typer.Option("--all", metavar="DIR", help="Every manifest.json under this folder."),
    ] = None,
    num_proc: Annotated[
        int | None,
        typer.Option(
            "--num-proc",
            min=1,
            max=256,
            help="Tokenizer worker processes (default 1: Rust threads on every core).",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if current.")] = False,
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="Remove each expert's earlier finished caches (other data, tokenizer or "
            "settings) once its current one is ready.",
        ),
    ] = False,
) -> None:
    """Tokenize, mask, pack and cache each manifest's data; say whether it was built or current."""
    from expert_cli.atomic import sigterm_raises
    from expert_cli.cli.render import BuildBar, console, keep_going_without_output
    from expert_cli.data.pretokenize import find_manifests, pretokenize_all
    from expert_cli.errors import Interrupted, RunError, Terminated, UserError

    keep_going_without_output()  # a closed terminal or pipe stops the printing, not the build
    out = console()
    manifests = find_manifests(manifest or [], all_dir)
    several = len(manifests) > 1

    def show(outcome: Outcome) -> None:
        if outcome.data is not None:
            for line in summary_lines(outcome.data, outcome.steps):
                out.print(line, markup=False)
        elif several:  # one manifest's problems are the command's error below
            out.print(f"{outcome.expert}: {outcome.failure} ({outcome.manifest})", markup=False)
            for line in outcome.problems:
                out.print(f"  {line}", markup=False)

    try:
        with sigterm_raises():  # SIGTERM as Ctrl-C: a line saying what is kept, exit 143
            outcomes = pretokenize_all(manifests, num_proc, force, BuildBar(), show, prune)
    except (KeyboardInterrupt, Terminated) as exc:  # said once, as the other commands say it
        raise Interrupted(
            "the shards finished so far are kept; the same command resumes the build from them",
            exc.code if isinstance(exc, Terminated) else 130,
        ) from None
    if several:
        out.print(outcomes_table(outcomes))
    bad = [o for o in outcomes if o.failure == "bad input"]
    failed = [o for o in outcomes if o.failure == "failed"]
    if several and (bad or failed):
        summary = f"{len(bad) + len(failed)} of {len(outcomes)} manifests did not build (above)"
        raise UserError(summary) if bad else RunError(summary)
    if bad:
        raise UserError(bad[0].problems)
    if failed:
        raise RunError("\n".join(failed[0].problems))


def outcomes_table(outcomes: list[Outcome]) -> Any:
    """One row per manifest: expert, result, rows and tokens, the cache or the first problem."""
    from rich.table import Table

    from expert_cli.cli.render import plain

    table = Table("expert", "result", "rows", "tokens", "cache or problem", title="pretokenize")
    for o in outcomes:
        if o.data is None:
            first = o.problems[0].split(";")[0] if o.problems else ""
            first = first if len(first) <= 60 else first[:59] + "…"
            more = f" (+{len(o.problems) - 1} more)" if len(o.problems) > 1 else ""
            cells = (o.expert, o.failure or "", "-", "-", first + more)
        else:
            train = o.data.stats["train"]
            cells = (
                o.expert,
                o.data.status,
                f"{train['rows']:,}",
                f"{train['tokens']:,}",
                str(o.data.cache_dir),
            )
        table.add_row(*(plain(c) for c in cells))
    return table


def summary_lines(data: PreparedData, steps: str = "") -> list[str]:
    """What happened to one cache, with its train stats, as printable lines."""
    from expert_cli.data.splits import emptied_note, split_note
    from expert_cli.data.stats_words import count_lines
    from expert_cli.errors import escaped

    train: dict[str, Any] = data.stats["train"]
    lines = [f"{data.stats['inputs']['expert']}: {data.status} ({data.reason})"]
    read = f"{train['examples_read']:,} read"
    if train.get("examples", train["examples_read"]) != train["examples_read"]:
        read += f" ({train['examples']:,} to train on)"
    # without packing a row is one example, padded by the collator to its batch's longest
    # row: tokens over rows x max_seq_length says nothing of that padding
    packed = (data.stats.get("inputs") or {}).get("packing", True)
    efficiency = (
        f"packing efficiency {train['packing_efficiency']:.1%}" if packed else "packing off"
    )
    lines.append(
        f"  rows {train['rows']:,}, tokens {train['tokens']:,}, trained "
        f"{train['trained_tokens']:,}, {efficiency}, "
        f"examples {read} / {train['kept']:,} kept whole / "
        f"{train['truncated']:,} truncated / "
        + (f"{train['split']:,} split / " if train.get("split") else "")
        + f"{train['dropped']:,} dropped"
    )
    lines += [f"  {label}: {said}" for label, said in count_lines(data.stats)]
    lines += [f"  note: {note}" for note in data.stats.get("notes") or []]
    if data.stats.get("eval"):
        ev = data.stats["eval"]
        tasks = [t for t in ev.get("tasks") or [] if isinstance(t, dict)]  # a multi_task's
        each = ", ".join(f"{escaped(str(t.get('task')))} {t.get('rows', 0):,}" for t in tasks)
        each = f" (by task: {each})" if each else ""
        lines.append(f"  eval: rows {ev['rows']:,}{each}, tokens {ev['tokens']:,}")
        for note in filter(None, (split_note(data.stats), emptied_note(data.stats))):
            lines.append(f"  note: {note}")
    if steps:
        lines.append(f"  steps: {steps}")
    if data.built:
        speed = data.stats.get("tokens_per_second")
        rate = f"{speed:,.0f} tokens/s" if speed else "every shard reused"
        lines.append(f"  built in {data.stats['build_seconds']:.1f} s ({rate})")
    lines.append(f"  cache {escaped(str(data.cache_dir))}")
    if data.pruned.caches:
        lines.append(f"  pruned {earlier_text(data.pruned)}")
    if data.earlier.caches and data.pruning:  # what a process reads is never removed
        lines.append(
            f"  kept {earlier_text(data.earlier)}: read by another process now (a train, "
            "generate or merge), or not removable here; --prune removes them once free"
        )
    elif data.earlier.caches:
        lines.append(f"  kept {earlier_text(data.earlier)}; --prune removes them")
    return lines


def earlier_text(earlier: Earlier) -> str:
    """`3 earlier caches of this expert (1.2 GB)`."""
    from expert_cli.data.discovery import human_size

    plural = "s" if earlier.caches != 1 else ""
    return f"{earlier.caches} earlier cache{plural} of this expert ({human_size(earlier.size)})"


def find_datasets(
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="A datasets or hub cache folder (default: HF env).",
            parser=folder_named("--cache-dir"),
        ),
    ] = None,
    experts: Annotated[
        Path | None,
        typer.Option(
            help="Folder with */manifest.json to match against.",
            parser=folder_named("--experts"),
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List datasets in the Hugging Face cache, and which expert manifests use them."""
    from expert_cli.data.discovery import discover

    result = discover(cache_dir, experts)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        render_discovery(result)


def _dataset_blocks(result: dict[str, Any], console: Any) -> None:
    """The cached datasets one block each, for a terminal too narrow for their table: the
    name and its facts, then its path on a line of its own (wrapped by the terminal alone,
    so it is copied whole); the other lines as the wide layout prints them."""
    from expert_cli.cli.render import plain

    roots = result["cache_roots"]
    console.print(
        plain(f"cached datasets (datasets: {roots['datasets']}, hub: {roots['hub']})"),
        soft_wrap=True,
    )
    for e in result["datasets"]:
        used = ", ".join(Path(m).parent.name for m in e.get("used_by", [])) or "-"
        facts = (
            f"config {e['config'] or '-'}, revision {(e['revision'] or '-')[:40]}, "
            f"{e['size']}, {e['layout']}, used by {used}"
        )
        console.print(plain(f"{e['name']}  ({facts})"), soft_wrap=True)
        console.print(plain(f"    {e['path']}"), soft_wrap=True)
    if result["manifests"]:
        console.print("datasets named by manifests", markup=False)
    for m in result["manifests"]:
        for ref in m["datasets"]:
            cached = {True: "cached", False: "NOT cached", None: "-"}[ref["cached"]]
            line = f"{m['manifest']}: {ref['field']} {ref['id']} ({ref['kind']}, {cached})"
            console.print(plain(line), soft_wrap=True)
    _discovery_lines(result, console)


def render_discovery(result: dict[str, Any]) -> None:
    """Print the cached datasets, the manifests' datasets and what is missing, as tables."""
    from rich.table import Table

    from expert_cli.cli.render import SafeConsole, plain

    console = SafeConsole(highlight=False)  # tables wrap long names themselves
    roots = result["cache_roots"]
    if console.width < WIDE_DATASETS:  # seven columns fold each path over a dozen lines
        _dataset_blocks(result, console)
        return
    table = Table(
        title=f"cached datasets (datasets: {roots['datasets']}, hub: {roots['hub']})",
        title_justify="left",
    )
    for col in ("name", "config", "revision", "size", "layout", "used by", "path"):
        # names and paths are what users copy: wrap them, never cut them with an ellipsis
        table.add_column(
            col,
            justify="right" if col == "size" else "left",
            overflow="fold",
            no_wrap=col == "size",
        )
    for e in result["datasets"]:
        used = ", ".join(Path(m).parent.name for m in e.get("used_by", []))
        cells = (e["name"], e["config"] or "-", (e["revision"] or "-")[:40], e["size"])
        table.add_row(*(plain(c) for c in (*cells, e["layout"], used or "-", e["path"])))
    console.print(table)
    if result["manifests"]:
        usage = Table(title="datasets named by manifests", title_justify="left")
        for col in ("manifest", "field", "dataset", "kind", "cached"):
            usage.add_column(col, overflow="fold")  # paths are copied: never cut with "…"
        for m in result["manifests"]:
            for ref in m["datasets"]:
                cached = {True: "yes", False: "NO", None: "-"}[ref["cached"]]
                cells = (m["manifest"], ref["field"], ref["id"], ref["kind"])
                usage.add_row(*(plain(c) for c in cells), cached)
        console.print(usage)
    _discovery_lines(result, console)


def _discovery_lines(result: dict[str, Any], console: Any) -> None:
    """What is missing, absent, empty, or a problem: one line each, wrapped by the terminal
    alone (rich broke a path it held mid-name)."""
    from expert_cli.cli.render import plain

    lines = [
        f"not cached: {m['id']} (needed by {', '.join(m['needed_by'])})" for m in result["missing"]
    ]
    # a mistyped HF_HOME reads as "no datasets" otherwise
    lines += [f"not there: {path} (no dataset is cached in it)" for path in result["absent"]]
    lines += [
        f"not listed: {path} (no snapshot to read: they hold no downloaded file, or its "
        "refs/main names none of them; a download stopped early? download it again)"
        for path in result["empty"]
    ]
    lines += [f"problem: {line}" for line in result["problems"]]
    for line in lines:
        console.print(plain(line), soft_wrap=True)
