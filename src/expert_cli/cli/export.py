"""`expert-cli export-gguf`: a run's adapter as a GGUF LoRA adapter for llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from expert_cli.cli.options import AdapterOpt, JsonOpt, file_named
from expert_cli.cli.render import echo, keep_going_without_output


class OutType(str, Enum):
    """How `export-gguf` stores the adapter's tensors."""

    f16 = "f16"
    bf16 = "bf16"
    f32 = "f32"


CheckpointOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        help="Export checkpoint-N of the run, final, or best (the lowest eval loss; "
        "default: the manifest's training.packaging_checkpoint, else final).",
    ),
]


@contextmanager
def said_left(what: str, path: Path | None, written: bool = False) -> Iterator[None]:
    """Ctrl-C (SIGTERM raised as it) inside the block ends the command with a line saying what
    it left: nothing before `what` was in place at `path`, or, once `written`, `what` in full
    (an export's own write says which where the signal comes while it writes)."""
    from expert_cli.errors import Terminated, escaped, left_by

    try:
        yield
    except (KeyboardInterrupt, Terminated) as exc:
        shown = escaped(str(path)) if path is not None else None
        raise left_by(exc, what, shown, f"{shown} was" if written else None) from None


def export_gguf(
    adapter: AdapterOpt,
    output: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            parser=file_named("--output"),
            help="The file to write (default: {name}-{base}.v{version}-lora-{outtype}.gguf "
            "beside RUN_DIR).",
        ),
    ] = None,
    outtype: Annotated[
        OutType,
        typer.Option("--outtype", help="The tensors' type in the file (f16 reads everywhere)."),
    ] = OutType.f16,
    checkpoint: CheckpointOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a file of that name.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write a run's LoRA adapter as a GGUF adapter for llama.cpp (llama-cli --lora)."""
    from expert_cli.atomic import sigterm_raises
    from expert_cli.train.gguf_export import export_gguf as export

    keep_going_without_output()  # `| head -1`: the file is the product, not its lines
    with sigterm_raises(), said_left("the GGUF file", output):  # SIGTERM as Ctrl-C
        report = export(adapter, output, force, checkpoint, outtype.value)
    with sigterm_raises(), said_left("the GGUF file", report.path, written=True):
        _show_gguf(report, as_json)


def _show_gguf(report: Any, as_json: bool) -> None:
    """export-gguf's lines (or its JSON) for the file it wrote."""
    import json
    import shlex

    from expert_cli.cli.render import console, labelled
    from expert_cli.data.discovery import human_size
    from expert_cli.errors import escaped

    if as_json:
        echo(json.dumps(report.to_dict(), indent=2))
        return
    out = console()
    for note in report.notes:
        out.print(labelled("note", "yellow", note, 6))
    shown = escaped(str(report.path))
    out.print(
        f"wrote {shown} ({human_size(report.size)}): the {report.adapter} adapter, "
        f"{report.pairs} projections at r {report.rank}, lora_alpha {report.alpha:g}, "
        f"{report.outtype}, for llama.cpp's {report.architecture}",
        markup=False,
    )
    out.print(
        f"try it    llama-cli -m <a GGUF of {escaped(report.base)}> --lora "
        f"{escaped(shlex.quote(str(report.path)))}",
        markup=False,
    )


def export_hub(
    adapter: AdapterOpt,
    output: Annotated[
        Path, typer.Option(metavar="DIR", help="A new or empty folder for the files to upload.")
    ],
    checkpoint: CheckpointOpt = None,
    repo_id: Annotated[
        str | None,
        typer.Option(
            metavar="OWNER/NAME", help="The repository it goes to, named in the card's example."
        ),
    ] = None,
    gguf: Annotated[
        OutType | None,
        typer.Option(
            "--gguf", help="Put the adapter in the folder as a GGUF file of this type too."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a run's adapter, tokenizer, manifest and model card as a folder for the Hub.

    Then upload it: hf upload OWNER/NAME DIR."""
    from expert_cli.atomic import sigterm_raises
    from expert_cli.train.hub_export import export_hub as export

    keep_going_without_output()  # `| head -1`: the folder is the product, not its lines
    with sigterm_raises(), said_left("the folder", output):  # SIGTERM as Ctrl-C
        report = export(adapter, output, checkpoint, repo_id, gguf.value if gguf else None)
    with sigterm_raises(), said_left("the folder", report.path, written=True):
        _show_hub(report, repo_id, as_json)


def _show_hub(report: Any, repo_id: str | None, as_json: bool) -> None:
    """export-hub's lines (or its JSON) for the folder it wrote."""
    import json
    import shlex

    from expert_cli.cli.render import console, labelled
    from expert_cli.data.discovery import human_size
    from expert_cli.errors import escaped

    if as_json:
        echo(json.dumps(report.to_dict(), indent=2))
        return
    out = console()
    for name, size in report.files.items():
        out.print(labelled("file", "dim", f"{name} ({human_size(size)})", 6))
    for note in report.notes:
        out.print(labelled("note", "yellow", note, 6))
    shown = escaped(str(report.path))
    out.print(f"wrote {shown}", markup=False)
    place = escaped(shlex.quote(str(report.path)))
    out.print(f"upload    hf upload {repo_id or 'OWNER/NAME'} {place}", markup=False)
