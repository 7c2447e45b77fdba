"""The foundation every other package imports and that imports none of them: messages and
their kinds, tool-call pairing, message handles, timestamps, errors, the bounded cache
helper, token counting and the model registry. The layer contracts in ``pyproject.toml``
(``[tool.importlinter]``, run by CI) keep it so."""
