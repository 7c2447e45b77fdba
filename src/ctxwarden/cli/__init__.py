"""CLI commands, one module each; :mod:`ctxwarden.cli.main` registers them on one Typer app.

A command only parses its arguments, calls the library and prints; anything a second
command could reuse belongs in the library, not here.
"""
