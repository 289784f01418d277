"""``python -m kernelab``: the ``kernelab`` command."""

from kernelab.runners.cli import app

app()
