"""`expert-cli train` and `expert-cli merge`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from expert_cli.cli.options import ManifestOpt


class MergeDtype(str, Enum):
    """The dtypes `merge --dtype` saves in."""

    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


def train(
    manifest: ManifestOpt,
    output: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Output folder (default: <manifest folder>/output)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in OUTPUT.")
    ] = False,
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", min=1, max=10_000_000, help="Stop after N optimizer steps."),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override a manifest field (keys: expert-cli check --list-settings).",
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace the run OUTPUT already holds (else refused)."),
    ] = False,
) -> None:
    """Train the manifest's adapter: token cache, Trainer, checkpoints, metrics.json."""
    from expert_cli.data.hub import preflight

    preflight(manifest, overrides or [])  # no network: fail before loading the trainer
    from expert_cli.cli.render import console, keep_going_without_output
    from expert_cli.cli.train_view import RichReporter, print_end
    from expert_cli.train.run import TrainOptions
    from expert_cli.train.run import train as run_training

    opts = TrainOptions(
        manifest=manifest,
        output=output,
        resume=resume,
        max_steps=max_steps,
        overrides=overrides or [],
        overwrite=overwrite,
    )
    from expert_cli.errors import Interrupted, Terminated

    keep_going_without_output()  # a closed terminal or pipe stops the printing, not the run
    out = console()
    try:
        result = run_training(opts, RichReporter(out))
    except (KeyboardInterrupt, Terminated) as exc:  # before training (it ended in silence)
        raise Interrupted(
            "before training began: nothing trained, the output folder left as it was; a "
            "token cache being built keeps its finished shards, which the same command goes "
            "on from",
            exc.code if isinstance(exc, Terminated) else 130,
        ) from None
    if result.is_main:
        print_end(out, result, opts)
    if result.exit_code:
        raise typer.Exit(code=result.exit_code)


def merge(
    adapter: Annotated[
        Path,
        typer.Option("--adapter", metavar="RUN_DIR", help="A trained run (or adapter) folder."),
    ],
    output: Annotated[
        Path, typer.Option("--output", metavar="DIR", help="Folder for the merged model.")
    ],
    dtype: Annotated[
        MergeDtype | None,
        typer.Option(
            "--dtype",
            help="Save the merged weights in bf16, fp16 or fp32 (merged in fp32 first: the "
            "base is held in fp32, 4 bytes a weight, twice a bf16 base's memory). "
            "Default: the dtype the base trained in (fp32 for a CPU run).",
        ),
    ] = None,
) -> None:
    """Merge an adapter into its base model and save a standalone safetensors model."""
    from expert_cli.atomic import sigterm_raises
    from expert_cli.cli.render import console, keep_going_without_output
    from expert_cli.errors import Terminated, escaped, left_by

    keep_going_without_output()  # `| head -1`: the model is the product, not its lines

    def holds_files() -> bool:  # one rename puts the whole merged model in place
        try:
            return output.is_dir() and any(output.iterdir())
        except OSError:
            return False

    held = holds_files()  # a folder with files in it is refused, and left as it was
    try:
        with sigterm_raises():  # SIGTERM and SIGHUP as Ctrl-C: a line saying what was left
            from expert_cli.train.merge import merge_adapter  # torch's import: seconds

            path, notes = merge_adapter(adapter, output, dtype.value if dtype else None)
    except (KeyboardInterrupt, Terminated) as exc:
        shown = escaped(str(output))
        whole = f"{shown} was" if not held and holds_files() else None
        raise left_by(exc, "the merged model", shown, whole) from None
    out = console()
    for note in notes:
        out.print(f"note      {note}", markup=False)
    out.print(f"wrote {escaped(str(path))}", markup=False)
