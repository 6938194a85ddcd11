"""The ``trainyard`` Typer app; its commands register themselves from the modules beside it."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Trainyard: PyTorch training jobs on a GPU box you own.", no_args_is_help=True
)
