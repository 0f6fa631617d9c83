"""Where a run's --output may not be: inside a data folder of the run, the folder that holds
the manifest, or a folder holding one of its data files (or a link to one)."""

from __future__ import annotations

from pathlib import Path

from expert_cli.config.sources import SourceRef, data_folder_holding
from expert_cli.errors import UserError
from expert_cli.paths import links_in, shown_path


def refuse_output_place(output: Path, manifest_folder: Path, sources: list[SourceRef]) -> None:
    """UserError where `output` is inside a data folder of the run or is the folder that
    holds the manifest (the run's README would become the expert's)."""
    if held := data_folder_holding(output, sources):
        raise UserError(
            f"--output {shown_path(output)}: is inside the data folder {shown_path(held)}; "
            "the run's files would be read as data by the next build: choose a folder outside it"
        )
    if output.resolve() == manifest_folder.resolve():
        raise UserError(
            f"--output {shown_path(output)}: is the folder that holds the manifest; give the run "
            "a folder of its own (the default is its output/ folder)"
        )
    linked = links_in(output)
    for ref in sources:  # a data file's own folder: the run's files among the user's data
        place = Path(ref.location)
        try:
            mine = ref.kind == "local" and place.is_file()
            folders = (place.resolve().parent, place.parent.resolve())  # a link's, its target's
            mine = mine and (output.resolve() in folders or place.resolve() in linked)
        except (OSError, RuntimeError):  # the data check names a path that cannot be read
            mine = False
        if mine:
            name = linked.get(place.resolve(), place.name)  # a link's name, where one names it
            raise UserError(
                f"--output {shown_path(output)}: holds the data file {name}; the run's "
                "files (checkpoints, weights, a README) would be written among the data: give "
                "the run a folder of its own"
            )
