"""``python -m hami.cli``: the ``hami`` command."""

from hami.cli import app

app()
