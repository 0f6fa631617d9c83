"""The command line, and the only layer that prints, draws progress bars or exits.

One module per command group; each command parses its options, calls one library function and
renders the typed result it returns. `app` is the Typer application, `main` its entry point.
"""

from expert_cli.cli.app import app, main

__all__ = ["app", "main"]
