"""``python -m ctxwarden``: the ``ctxwarden`` command, for when the console script is not
on ``PATH`` (``ctxwarden wrap`` starts its background server this way, with the same
interpreter as itself)."""

from ctxwarden.cli.main import main

main()
