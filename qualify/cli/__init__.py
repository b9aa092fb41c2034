"""The ``qualify`` command line (being split into one module per command group)."""

from qualify.cli.root import cli, main

__all__ = ["cli", "main"]
