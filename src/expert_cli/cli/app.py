"""The `expert-cli` application: the commands of each group, `--verbose`, and the mapping of
errors to exit codes (2 for the user's input, 1 for failures at run time, 130 for Ctrl-C).

Every command module imports its library code inside the command's body, so that
`expert-cli --help` answers without importing torch.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Annotated

import typer

from expert_cli.cli import benchmark, check, data, train
from expert_cli.cli.render import print_error
from expert_cli.errors import RunError, UserError

app = typer.Typer(
    name="expert-cli",
    help="Train LoRA/DoRA/QLoRA expert adapters from HiveLLM manifests, and keep the GPU busy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(check.check)
app.command()(train.train)
app.command()(train.merge)
app.command()(data.pretokenize)
app.command("find-datasets")(data.find_datasets)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    benchmark.benchmark
)

_state = {"verbose": False}


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show tracebacks for failures.")
    ] = False,
) -> None:
    _state["verbose"] = verbose


# bitsandbytes' CPU backend warns on every import that it could not fetch an optional kernel
# from the hub; it falls back to its own kernel, and hub fetches cannot happen offline anyway.
QUIET_LOGGERS = ("bitsandbytes.backends.cpu.ops",)


def main() -> None:
    """Console-script entry point."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # raised inside peft/transformers for every model; nothing a user of expert-cli can act on
    warnings.filterwarnings(
        "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
    )
    try:
        app(standalone_mode=True)
    except UserError as exc:
        if _state["verbose"]:
            raise
        print_error("error", exc)
        sys.exit(2)
    except RunError as exc:
        if _state["verbose"]:
            raise
        print_error("failed", exc)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
