"""``python -m kernelab.runners.cli``: the ``kernelab`` command (how the runner re-executes itself)."""

from kernelab.runners.cli import app

app()
